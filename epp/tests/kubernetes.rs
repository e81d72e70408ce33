//! Kubernetes discovery against kube-rs's `tower-test` mocked API server: the
//! InferencePool gives the selector and port, only Ready pods that are not terminating
//! become endpoints, watch events add and remove them, and role selectors mark prefill
//! pods.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use dynamo_epp::config::KubernetesConfig;
use dynamo_epp::discovery::{EndpointSet, kubernetes};
use dynamo_names::Role;
use http::{Request, Response};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

type Events = mpsc::Sender<Result<Bytes, Infallible>>;

fn pod(name: &str, ip: &str, ready: bool, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "labels": labels, "resourceVersion": "1"},
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
        }
    })
}

fn pool(app: &str, port: u16) -> Value {
    json!({
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "pool", "namespace": "ns", "resourceVersion": "1"},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "targetPorts": [{"number": port}],
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}
        }
    })
}

fn list(kind: &str, api_version: &str, items: Vec<Value>) -> Body {
    Body::from(
        json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": "5"}, "items": items})
            .to_string(),
    )
}

async fn event(events: &Events, kind: &str, object: Value) {
    let line = format!("{}\n", json!({"type": kind, "object": object}));
    events.send(Ok(Bytes::from(line))).await.unwrap();
}

/// The fake API server: answers LISTs with `pods` / the pool, and keeps each WATCH
/// open, fed by the returned senders. Records the pods' label selectors.
fn api_server(
    pods: Vec<Value>,
    pools: Vec<Value>,
) -> (kube::Client, Events, Events, watch::Receiver<Vec<String>>) {
    let (service, mut handle) =
        tower_test::mock::pair::<Request<kube::client::Body>, Response<Body>>();
    let (pod_tx, pod_rx) = mpsc::channel(16);
    let (pool_tx, pool_rx) = mpsc::channel(16);
    let (selectors_tx, selectors) = watch::channel(Vec::new());
    tokio::spawn(async move {
        let mut pod_rx = Some(pod_rx);
        let mut pool_rx = Some(pool_rx);
        while let Some((request, send)) = handle.next_request().await {
            let uri = request.uri().to_string();
            let watching = uri.contains("watch=true");
            let stream = |rx: &mut Option<mpsc::Receiver<_>>| match rx.take() {
                Some(rx) => Body::from_stream(ReceiverStream::new(rx)),
                // A second watch of the same kind stays silent.
                None => Body::from_stream(futures::stream::pending::<Result<Bytes, Infallible>>()),
            };
            let body = if uri.contains("/inferencepools") {
                assert!(uri.contains("fieldSelector=metadata.name%3Dpool"), "{uri}");
                if watching {
                    stream(&mut pool_rx)
                } else {
                    list(
                        "InferencePoolList",
                        "inference.networking.k8s.io/v1",
                        pools.clone(),
                    )
                }
            } else if uri.contains("/api/v1/namespaces/ns/pods") {
                let selector = uri
                    .split(['?', '&'])
                    .find_map(|p| p.strip_prefix("labelSelector="))
                    .unwrap_or_default()
                    .replace("%3D", "=")
                    .replace("%2C", ",");
                selectors_tx.send_modify(|s| s.push(selector));
                if watching {
                    stream(&mut pod_rx)
                } else {
                    list("PodList", "v1", pods.clone())
                }
            } else {
                panic!("unexpected request {uri}");
            };
            send.send_response(Response::new(body));
        }
    });
    (kube::Client::new(service, "ns"), pod_tx, pool_tx, selectors)
}

async fn wait_for(rx: &mut watch::Receiver<EndpointSet>, want: &[(&str, Role)]) {
    let want: Vec<(String, Role)> = want.iter().map(|(a, r)| ((*a).to_owned(), *r)).collect();
    let reached = tokio::time::timeout(
        Duration::from_secs(20),
        rx.wait_for(|set| {
            set.iter()
                .map(|e| (e.address.to_string(), e.role))
                .collect::<Vec<_>>()
                == want
        }),
    )
    .await
    .is_ok();
    assert!(reached, "wanted {want:?}, have {:?}", *rx.borrow());
}

#[tokio::test]
async fn the_pools_ready_pods_are_endpoints_and_watch_events_update_them() {
    let mut terminating = pod("p4", "10.0.0.4", true, json!({"app": "llm"}));
    terminating["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
    let pods = vec![
        pod("p1", "10.0.0.1", true, json!({"app": "llm"})),
        pod("p2", "10.0.0.2", false, json!({"app": "llm"})),
        pod(
            "p3",
            "10.0.0.3",
            true,
            json!({"app": "llm", "role": "prefill"}),
        ),
        terminating,
    ];
    let (client, pod_events, _pool_events, selectors) = api_server(pods, vec![pool("llm", 8000)]);
    let (tx, mut rx) = watch::channel(EndpointSet::new());
    let config = KubernetesConfig {
        pool_name: Some("pool".into()),
        namespace: Some("ns".into()),
        prefill_selector: Some("role=prefill".into()),
        target_port: 1,
        ..KubernetesConfig::default()
    };
    tokio::spawn(kubernetes::watch(client, config, 9100, tx));

    wait_for(
        &mut rx,
        &[
            ("10.0.0.1:8000", Role::Aggregated),
            ("10.0.0.3:8000", Role::Prefill),
        ],
    )
    .await;
    assert_eq!(rx.borrow()[0].kv_events, "http://10.0.0.1:9100");
    assert_eq!(
        selectors.borrow()[0],
        "app=llm",
        "the pool's selector is sent"
    );

    event(
        &pod_events,
        "MODIFIED",
        pod("p2", "10.0.0.2", true, json!({"app": "llm"})),
    )
    .await;
    wait_for(
        &mut rx,
        &[
            ("10.0.0.1:8000", Role::Aggregated),
            ("10.0.0.2:8000", Role::Aggregated),
            ("10.0.0.3:8000", Role::Prefill),
        ],
    )
    .await;
    event(
        &pod_events,
        "DELETED",
        pod("p1", "10.0.0.1", true, json!({"app": "llm"})),
    )
    .await;
    let mut unready = pod(
        "p3",
        "10.0.0.3",
        false,
        json!({"app": "llm", "role": "prefill"}),
    );
    unready["metadata"]["resourceVersion"] = json!("7");
    event(&pod_events, "MODIFIED", unready).await;
    wait_for(&mut rx, &[("10.0.0.2:8000", Role::Aggregated)]).await;
}

#[tokio::test]
async fn a_deleted_pool_empties_the_set() {
    let pods = vec![pod("p1", "10.0.0.1", true, json!({"app": "llm"}))];
    let (client, _pod_events, pool_events, _) = api_server(pods, vec![pool("llm", 8080)]);
    let (tx, mut rx) = watch::channel(EndpointSet::new());
    let config = KubernetesConfig {
        pool_name: Some("pool".into()),
        namespace: Some("ns".into()),
        ..KubernetesConfig::default()
    };
    tokio::spawn(kubernetes::watch(client, config, 9100, tx));
    wait_for(&mut rx, &[("10.0.0.1:8080", Role::Aggregated)]).await;
    event(&pool_events, "DELETED", pool("llm", 8080)).await;
    wait_for(&mut rx, &[]).await;
}

#[tokio::test]
async fn a_label_selector_without_a_pool_uses_the_target_port() {
    let pods = vec![
        pod("p1", "10.0.0.1", true, json!({"app": "llm", "tier": "a"})),
        pod(
            "p2",
            "10.0.0.2",
            true,
            json!({"app": "llm", "tier": "a", "r": "d"}),
        ),
    ];
    let (client, _pod_events, _pool_events, selectors) = api_server(pods, Vec::new());
    let (tx, mut rx) = watch::channel(EndpointSet::new());
    let config = KubernetesConfig {
        namespace: Some("ns".into()),
        selector: Some("app=llm,tier=a".into()),
        decode_selector: Some("r=d".into()),
        target_port: 8123,
        ..KubernetesConfig::default()
    };
    tokio::spawn(kubernetes::watch(client, config, 9100, tx));
    wait_for(
        &mut rx,
        &[
            ("10.0.0.1:8123", Role::Aggregated),
            ("10.0.0.2:8123", Role::Decode),
        ],
    )
    .await;
    assert_eq!(selectors.borrow()[0], "app=llm,tier=a");
}

/// The TLS trap of DEPENDENCIES.md: with no or two rustls crypto providers, building an
/// HTTPS client panics. The picker's dependency set must build one.
#[tokio::test]
async fn an_https_cluster_client_builds() {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(
        r#"
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u, namespace: ns}
current-context: x
"#,
    )
    .unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    assert_eq!(client.default_namespace(), "ns");
}
