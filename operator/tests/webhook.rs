//! The conversion webhook as the API server meets it: ConversionReviews over real HTTPS
//! (HTTP/2 and HTTP/1.1, a client that trusts only the generated CA), answered in
//! Kubernetes' response shape; and the certificate Secret and the CRD's `spec.conversion`
//! the operator keeps, against the fake API server.

mod common;

use std::sync::Arc;

use axum::body::Body;
use common::api::{FakeApi, parse_path};
use dynamo_crds::conversion::V1ALPHA1_FIELDS;
use dynamo_operator::controller::rbac;
use dynamo_operator::controller::webhook::install::{Endpoint, INJECT_CA_FROM, Installer};
use dynamo_operator::controller::webhook::tls::{self, CertSlot, ServingCert};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

const SERVICE: &str = "dynamo-operator-webhook";
const NAMESPACE: &str = "dynamo-system";

/// A webhook on a loopback port with a freshly made certificate; returns its address and
/// the CA a client must trust.
async fn webhook() -> (std::net::SocketAddr, ServingCert) {
    let cert = ServingCert::generate(&tls::dns_names(SERVICE, NAMESPACE, "cluster.local")).unwrap();
    let slot = Arc::new(CertSlot::default());
    slot.set(cert.certified_key().unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(dynamo_operator::controller::webhook::serve(
        listener,
        tls::server_config(slot),
    ));
    (addr, cert)
}

/// POSTs `body` to /convert over TLS as `{SERVICE}.{NAMESPACE}.svc` (the name the API
/// server dials), by HTTP/2 or HTTP/1.1; returns the status and the JSON answer.
async fn post(addr: std::net::SocketAddr, ca: &str, body: Vec<u8>, http2: bool) -> (u16, Value) {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![if http2 {
        b"h2".to_vec()
    } else {
        b"http/1.1".to_vec()
    }];
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(format!("{SERVICE}.{NAMESPACE}.svc")).unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("the server's certificate is trusted through the generated CA");
    assert_eq!(
        stream.get_ref().1.alpn_protocol(),
        Some(if http2 { &b"h2"[..] } else { &b"http/1.1"[..] })
    );
    let request = http::Request::post("/convert")
        .header("content-type", "application/json")
        .header("host", format!("{SERVICE}.{NAMESPACE}.svc"))
        .body(Body::from(body))
        .unwrap();
    let io = TokioIo::new(stream);
    let response = if http2 {
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
        tokio::spawn(connection);
        sender.send_request(request).await.unwrap()
    } else {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(connection);
        sender.send_request(request).await.unwrap()
    };
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(Body::new(response.into_body()), usize::MAX)
        .await
        .unwrap();
    (status, serde_json::from_slice(&bytes).unwrap())
}

fn sample(path: &str) -> Value {
    let text =
        std::fs::read_to_string(common::repo_root().join("config/samples").join(path)).unwrap();
    let mut object: Value = serde_saphyr::from_str(&text).unwrap();
    object["metadata"]["namespace"] = json!("inference");
    object
}

fn review(uid: &str, desired: &str, objects: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": uid, "desiredAPIVersion": desired, "objects": objects},
    }))
    .unwrap()
}

#[tokio::test]
async fn conversion_reviews_over_https_both_ways_and_a_bad_one() {
    let (addr, cert) = webhook().await;
    let alpha = sample("agg-vllm.yaml");
    let beta = sample("v1beta1/agg-vllm.yaml");
    let mut rich = sample("multinode-vllm.yaml");
    rich["spec"]["services"]["Frontend"]["ingress"] = json!({"enabled": true});

    for http2 in [true, false] {
        // v1alpha1 -> v1beta1, two objects in one review, in order.
        let body = review(
            "uid-1",
            "nvidia.com/v1beta1",
            vec![alpha.clone(), rich.clone()],
        );
        let (status, answer) = post(addr, &cert.ca, body, http2).await;
        assert_eq!(status, 200);
        assert_eq!(answer["apiVersion"], "apiextensions.k8s.io/v1");
        assert_eq!(answer["kind"], "ConversionReview");
        let response = &answer["response"];
        assert_eq!(response["uid"], "uid-1");
        assert_eq!(response["result"]["status"], "Success");
        let converted = response["convertedObjects"].as_array().unwrap();
        assert_eq!(converted.len(), 2);
        assert_eq!(converted[0], beta, "the v1beta1 twin");
        assert_eq!(converted[1]["apiVersion"], "nvidia.com/v1beta1");
        assert!(
            converted[1]["metadata"]["annotations"][V1ALPHA1_FIELDS].is_string(),
            "pvcs and volumeMounts are kept for the way back"
        );

        // And back: v1beta1 -> v1alpha1 gives the originals.
        let body = review("uid-2", "nvidia.com/v1alpha1", converted.clone());
        let (_, answer) = post(addr, &cert.ca, body, http2).await;
        assert_eq!(answer["response"]["uid"], "uid-2");
        assert_eq!(answer["response"]["result"]["status"], "Success");
        assert_eq!(answer["response"]["convertedObjects"], json!([alpha, rich]));
    }

    // One object that cannot be converted fails the review, naming it and its field.
    let mut twice = beta.clone();
    twice["spec"]["components"][1]["name"] = json!("Frontend");
    let body = review("uid-3", "nvidia.com/v1alpha1", vec![beta.clone(), twice]);
    let (status, answer) = post(addr, &cert.ca, body, true).await;
    assert_eq!(
        status, 200,
        "a refused conversion is still an answered review"
    );
    let response = &answer["response"];
    assert_eq!(response["uid"], "uid-3");
    assert_eq!(response["result"]["status"], "Failure");
    assert_eq!(
        response["result"]["message"],
        "inference/agg-vllm: spec.components[1].name: two components are named \"Frontend\""
    );
    assert_eq!(response["convertedObjects"], json!([]));

    // Not a ConversionReview at all.
    let (_, answer) = post(addr, &cert.ca, b"{\"kind\": 7}".to_vec(), false).await;
    assert_eq!(answer["response"]["result"]["status"], "Failure");
    let message = answer["response"]["result"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("the body is not a ConversionReview: "),
        "{message}"
    );
    // A review of another API version.
    let mut old =
        serde_json::from_slice::<Value>(&review("uid-4", "nvidia.com/v1beta1", vec![])).unwrap();
    old["apiVersion"] = json!("apiextensions.k8s.io/v1beta1");
    let (_, answer) = post(addr, &cert.ca, serde_json::to_vec(&old).unwrap(), false).await;
    assert_eq!(answer["response"]["uid"], "uid-4");
    assert_eq!(
        answer["response"]["result"]["message"],
        "expected an apiextensions.k8s.io/v1 ConversionReview, got apiextensions.k8s.io/v1beta1/ConversionReview"
    );
}

#[tokio::test]
async fn a_client_trusting_another_ca_is_refused() {
    let (addr, _) = webhook().await;
    let stranger = ServingCert::generate(&["elsewhere".into()]).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(stranger.ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(format!("{SERVICE}.{NAMESPACE}.svc")).unwrap();
    let result = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await;
    assert!(result.is_err());
}

const CRD_PATH: &str =
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/dynamographdeployments.nvidia.com";
const SECRET_PATH: &str = "/api/v1/namespaces/dynamo-system/secrets/hook-tls";

fn installer(client: kube::Client, cert_manager: bool) -> Installer {
    Installer {
        client,
        endpoint: Endpoint::Service {
            namespace: NAMESPACE.into(),
            service: "hook".into(),
            secret: "hook-tls".into(),
            cert_manager,
            cluster_domain: "cluster.local".into(),
        },
    }
}

/// The fake API server with the graph CRD as `make crds` generates it.
fn api_with_crd() -> (kube::Client, FakeApi) {
    let (client, api) = FakeApi::start();
    let crd = serde_json::to_value(dynamo_crds::manifests::graph_crd()).unwrap();
    api.put(CRD_PATH, crd);
    (client, api)
}

/// Every request is one the operator's RBAC tables allow, on the object it names.
fn assert_allowed(api: &FakeApi) {
    for r in api.requests() {
        let p = parse_path(&r.path).unwrap();
        let verb = match r.method.as_str() {
            "GET" => "get",
            "POST" => "create",
            "PATCH" => "patch",
            other => panic!("unexpected {other} {}", r.path),
        };
        let name = p.name.as_deref().filter(|_| verb != "create");
        let table = if p.namespace.is_some() {
            rbac::WEBHOOK_RULES
        } else {
            rbac::CLUSTER_RULES
        };
        assert!(
            rbac::allows_on(table, &p.group, &p.resource, name, verb),
            "RBAC tables lack {verb} {} {name:?}",
            p.resource
        );
    }
}

fn ca_bundle(api: &FakeApi) -> Option<String> {
    let crd = api.object(CRD_PATH).unwrap();
    let bundle = crd["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"].as_str()?;
    // A ByteString is base64 in JSON.
    let decoded: k8s_openapi::ByteString = serde_json::from_value(json!(bundle)).unwrap();
    Some(String::from_utf8(decoded.0).unwrap())
}

#[tokio::test]
async fn the_operator_makes_its_certificate_once_and_points_the_crd_at_it() {
    let (client, api) = api_with_crd();
    let slot = CertSlot::default();
    installer(client.clone(), false)
        .refresh(&slot)
        .await
        .unwrap();

    let secret = api.object(SECRET_PATH).expect("the Secret is created");
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(secret).unwrap();
    let cert = ServingCert::from_secret(&secret).unwrap();
    let crd = api.object(CRD_PATH).unwrap();
    let service = &crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"];
    assert_eq!(
        *service,
        json!({"name": "hook", "namespace": NAMESPACE, "path": "/convert", "port": 443})
    );
    assert_eq!(ca_bundle(&api).as_deref(), Some(cert.ca.as_str()));
    assert_eq!(
        crd["spec"]["conversion"]["webhook"]["conversionReviewVersions"],
        json!(["v1"])
    );
    assert!(crd["metadata"]["annotations"].get(INJECT_CA_FROM).is_none());
    assert_allowed(&api);

    // Another replica (or a later pass) uses the same Secret and changes nothing.
    api.take_requests();
    installer(client, false)
        .refresh(&CertSlot::default())
        .await
        .unwrap();
    let methods: Vec<String> = api.requests().iter().map(|r| r.method.clone()).collect();
    assert_eq!(
        methods,
        ["GET", "GET"],
        "read the Secret and the CRD, write nothing"
    );
    assert_eq!(ca_bundle(&api).as_deref(), Some(cert.ca.as_str()));
}

#[tokio::test]
async fn with_cert_manager_the_operator_waits_for_its_secret_and_annotates_the_crd() {
    let (client, api) = api_with_crd();
    let slot = CertSlot::default();
    let error = installer(client.clone(), true)
        .refresh(&slot)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "Secret dynamo-system/hook-tls does not exist yet: waiting for cert-manager to issue it"
    );
    assert!(api.object(SECRET_PATH).is_none(), "cert-manager's to make");

    // cert-manager issues the Secret (with ca.crt) and its CA injector fills the caBundle.
    let issued = ServingCert::generate(&["hook.dynamo-system.svc".into()]).unwrap();
    api.put(
        SECRET_PATH,
        serde_json::to_value(issued.to_secret("hook-tls", NAMESPACE)).unwrap(),
    );
    installer(client.clone(), true)
        .refresh(&slot)
        .await
        .unwrap();
    let crd = api.object(CRD_PATH).unwrap();
    assert_eq!(
        crd["metadata"]["annotations"][INJECT_CA_FROM],
        "dynamo-system/hook-tls"
    );
    assert_eq!(
        crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["name"],
        "hook"
    );
    assert_eq!(ca_bundle(&api), None, "the injector's to fill");
    api.edit(CRD_PATH, |crd| {
        crd["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"] =
            serde_json::to_value(k8s_openapi::ByteString(issued.ca.clone().into_bytes())).unwrap();
    });
    api.take_requests();
    installer(client, true).refresh(&slot).await.unwrap();
    assert!(
        api.requests().iter().all(|r| r.method == "GET"),
        "the injected CA is left alone"
    );
    assert_eq!(ca_bundle(&api), Some(issued.ca));
    assert_allowed(&api);
}

#[tokio::test]
async fn an_incomplete_secret_is_reported_not_replaced() {
    let (client, api) = api_with_crd();
    api.put(
        SECRET_PATH,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hook-tls"}, "data": {}}),
    );
    let error = installer(client, false)
        .refresh(&CertSlot::default())
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "Secret dynamo-system/hook-tls lacks tls.crt, tls.key or ca.crt; delete it to have a new one made"
    );
    assert!(api.requests().iter().all(|r| r.method == "GET"));
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

#[test]
fn the_chart_serves_the_webhook_where_the_crd_points() {
    let docs = common::rendered_chart(&[]);
    let service = find(&docs, "Service", dynamo_crds::conversion::WEBHOOK_SERVICE)
        .expect("the Service the generated CRD names");
    assert_eq!(
        service["spec"]["ports"][0]["port"],
        dynamo_crds::conversion::WEBHOOK_SERVICE_PORT
    );
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "webhook");
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let operator = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let port = operator["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "webhook")
        .unwrap();
    let args: Vec<&str> = operator["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.contains(&format!("--webhook-port={}", port["containerPort"]).as_str()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--webhook-service=dynamo-operator-webhook"),
        "{args:?}"
    );
    assert!(!args.contains(&"--webhook-cert-manager"));
    let role = find(&docs, "Role", "dynamo-dynamo-platform-webhook").expect("the webhook Role");
    assert_eq!(role["rules"][0]["resources"], json!(["secrets"]));
    assert!(docs.iter().all(|d| d["kind"] != "Certificate"));

    let docs = common::rendered_chart(&[
        "webhook.certManager.enabled=true",
        "webhook.secretName=hook-tls",
    ]);
    let certificate =
        find(&docs, "Certificate", "hook-tls").expect("a Certificate named as its Secret");
    assert_eq!(certificate["spec"]["secretName"], "hook-tls");
    assert!(
        certificate["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&json!("dynamo-operator-webhook.ns.svc")),
        "{certificate:#}"
    );
    let issuer = &certificate["spec"]["issuerRef"];
    assert!(
        find(
            &docs,
            issuer["kind"].as_str().unwrap(),
            issuer["name"].as_str().unwrap()
        )
        .is_some()
    );
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array()
            .unwrap()
            .contains(&json!("--webhook-cert-manager"))
    );
    assert!(
        args.as_array()
            .unwrap()
            .contains(&json!("--webhook-secret=hook-tls"))
    );
}
