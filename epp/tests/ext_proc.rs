//! The ext_proc server as a gateway sees it: a real tonic client streams request and
//! response phases over a real socket; pods are real KV event streams (the gateway,
//! not the picker, talks to the engines, so none is needed here).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use dynamo_epp::config::RouterConfig;
use dynamo_epp::ext_proc::{DESTINATION_KEY, SUBSET_KEY, SUBSET_NAMESPACE};
use dynamo_epp::{Epp, start};
use dynamo_kvcache::SaturationThreshold;
use dynamo_kvstream::{HubConfig, KvEventHub};
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Phase;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Reply;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyResponse, HeaderMutation, HeadersResponse, HttpBody, HttpHeaders, ImmediateResponse,
    ProcessingRequest, ProcessingResponse, body_mutation,
};
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value as PbValue, value::Kind};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A pod the gateway would send to: only its KV event stream is real.
struct Sidecarred {
    address: SocketAddr,
    hub: KvEventHub,
    _sidecar: Sidecar,
}

impl Sidecarred {
    fn start(port: u16) -> Self {
        let hub = KvEventHub::new(HubConfig::default());
        let sidecar = Sidecar::start(&hub);
        Self {
            address: SocketAddr::from(([10, 0, 0, 1], port)),
            hub,
            _sidecar: sidecar,
        }
    }

    fn entry(&self, role: &str) -> Value {
        serde_json::json!({"address": self.address.to_string(), "kv_events": self._sidecar.url, "role": role})
    }
}

async fn picker(file: &EndpointsFile, router: RouterConfig) -> Epp {
    start(config(file, router)).await.expect("picker starts")
}

/// One HTTP request's ext_proc stream, as Envoy drives it.
struct Exchange {
    tx: mpsc::Sender<ProcessingRequest>,
    rx: tonic::Streaming<ProcessingResponse>,
}

impl Exchange {
    async fn open(epp: &Epp) -> Self {
        let mut client = ExternalProcessorClient::connect(format!("http://{}", epp.ext_proc_addr))
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(16);
        let rx = client
            .process(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Self { tx, rx }
    }

    async fn send(&self, request: ProcessingRequest) {
        self.tx.send(request).await.unwrap();
    }

    async fn reply(&mut self) -> Reply {
        tokio::time::timeout(Duration::from_secs(20), self.rx.message())
            .await
            .expect("a reply in 20 s")
            .unwrap()
            .expect("the stream is open")
            .response
            .unwrap()
    }

    /// Sends a POST to `path` with `body` in two chunks; returns the first reply.
    async fn request(&mut self, path: &str, body: &str, subset: Option<Vec<&str>>) -> Reply {
        let mut headers = headers(
            &[
                (":method", "POST"),
                (":path", path),
                ("content-type", "application/json"),
            ],
            false,
        );
        if let Some(subset) = subset {
            headers.metadata_context = Some(subset_metadata(&subset));
        }
        self.send(headers).await;
        let (a, b) = body.as_bytes().split_at(body.len() / 2);
        self.send(body_phase(a, false, false)).await;
        self.send(body_phase(b, true, false)).await;
        self.reply().await
    }
}

fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> ProcessingRequest {
    let headers = HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).into(),
                raw_value: v.as_bytes().to_vec(),
                ..HeaderValue::default()
            })
            .collect(),
    };
    ProcessingRequest {
        request: Some(Phase::RequestHeaders(HttpHeaders {
            headers: Some(headers),
            end_of_stream,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

fn response_headers(pairs: &[(&str, &str)]) -> ProcessingRequest {
    let mut r = headers(pairs, false);
    if let Some(Phase::RequestHeaders(h)) = r.request.take() {
        r.request = Some(Phase::ResponseHeaders(h));
    }
    r
}

fn body_phase(bytes: &[u8], end_of_stream: bool, response: bool) -> ProcessingRequest {
    let body = HttpBody {
        body: bytes.to_vec(),
        end_of_stream,
        ..HttpBody::default()
    };
    ProcessingRequest {
        request: Some(if response {
            Phase::ResponseBody(body)
        } else {
            Phase::RequestBody(body)
        }),
        ..ProcessingRequest::default()
    }
}

fn subset_metadata(addresses: &[&str]) -> Metadata {
    let list = PbValue {
        kind: Some(Kind::ListValue(ListValue {
            values: addresses
                .iter()
                .map(|a| PbValue {
                    kind: Some(Kind::StringValue((*a).into())),
                })
                .collect(),
        })),
    };
    Metadata {
        filter_metadata: [(
            SUBSET_NAMESPACE.to_owned(),
            Struct {
                fields: [(SUBSET_KEY.to_owned(), list)].into(),
            },
        )]
        .into(),
        ..Metadata::default()
    }
}

/// The header changes of a request-headers reply.
fn mutation(reply: &Reply) -> &HeaderMutation {
    let Reply::RequestHeaders(HeadersResponse {
        response: Some(common),
    }) = reply
    else {
        panic!("expected request headers, got {reply:?}");
    };
    common.header_mutation.as_ref().unwrap()
}

/// The destination header a request-headers reply sets.
fn destination(reply: &Reply) -> String {
    header_set(mutation(reply), DESTINATION_KEY).expect("destination header")
}

/// A chat request whose client names a prefill pod itself; returns the picker's reply
/// to its headers and body.
async fn forged_prefill_request(epp: &Epp) -> Reply {
    let mut x = Exchange::open(epp).await;
    x.send(headers(
        &[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("x-prefiller-host-port", "10.6.6.6:8000"),
        ],
        false,
    ))
    .await;
    let body = chat("hi", 2, false).to_string();
    x.send(body_phase(body.as_bytes(), true, false)).await;
    x.reply().await
}

fn header_set(mutation: &HeaderMutation, key: &str) -> Option<String> {
    mutation
        .set_headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .find(|h| h.key == key)
        .map(|h| String::from_utf8(h.raw_value.clone()).unwrap())
}

fn metadata_destination(response: &ProcessingResponse) -> Option<String> {
    let lb = response.dynamic_metadata.as_ref()?.fields.get("envoy.lb")?;
    let Some(Kind::StructValue(inner)) = &lb.kind else {
        return None;
    };
    match &inner.fields.get(DESTINATION_KEY)?.kind {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

fn immediate(reply: &Reply) -> (u32, Value) {
    let Reply::ImmediateResponse(ImmediateResponse { status, body, .. }) = reply else {
        panic!("expected an immediate response, got {reply:?}");
    };
    (
        status.as_ref().unwrap().code as u32,
        serde_json::from_slice(body).unwrap(),
    )
}

fn streamed(reply: &Reply) -> (Vec<u8>, bool) {
    let (Reply::RequestBody(BodyResponse { response: Some(c) })
    | Reply::ResponseBody(BodyResponse { response: Some(c) })) = reply
    else {
        panic!("expected a body reply, got {reply:?}");
    };
    match &c.body_mutation.as_ref().unwrap().mutation {
        Some(body_mutation::Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
        other => panic!("expected a streamed body, got {other:?}"),
    }
}

async fn wait_blocks(epp: &Epp, address: SocketAddr, n: usize) {
    eventually("the announced blocks to be indexed", || async {
        epp.router
            .endpoints()
            .iter()
            .any(|e| e.spec.address == address && e.blocks == n)
    })
    .await;
}

fn load_of(epp: &Epp, address: SocketAddr) -> u64 {
    epp.router
        .endpoints()
        .iter()
        .find(|e| e.spec.address == address)
        .map_or(0, |e| e.load)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_request_is_routed_by_prefix_and_its_response_ends_its_load() {
    let pods = [Sidecarred::start(8000), Sidecarred::start(8001)];
    let file = EndpointsFile::new();
    file.write(&[pods[0].entry("worker"), pods[1].entry("worker")]);
    let epp = picker(&file, RouterConfig::default()).await;
    let body = chat(&text(200, 4), 4, true);
    let request: dynamo_llm::openai::ChatCompletionRequest =
        serde_json::from_value(body.clone()).unwrap();
    let tokens = model().prepare_chat(&request).unwrap().token_ids;
    let n = tokens.len() / BLOCK_SIZE;
    let holder = &pods[1];
    holder.hub.publish(&dynamo_kvcache::KvEvent::Stored {
        parent: None,
        blocks: dynamo_kvcache::BlockHasher::new(BLOCK_SIZE, MODEL, None)
            .seq_hashes(&tokens)
            .into_iter()
            .map(|seq_hash| dynamo_kvcache::StoredBlock {
                seq_hash,
                engine_hash: seq_hash.0,
                tier: dynamo_kvcache::Tier::Gpu,
            })
            .collect(),
    });
    wait_blocks(&epp, holder.address, n).await;

    let mut x = Exchange::open(&epp).await;
    x.send(headers(
        &[(":method", "POST"), (":path", "/v1/chat/completions")],
        false,
    ))
    .await;
    let text = body.to_string();
    let (a, b) = text.as_bytes().split_at(text.len() / 3);
    x.send(body_phase(a, false, false)).await;
    x.send(body_phase(b, true, false)).await;
    let first = x.rx.message().await.unwrap().unwrap();
    let dest = destination(first.response.as_ref().unwrap());
    assert_eq!(dest, holder.address.to_string());
    assert_eq!(
        metadata_destination(&first),
        Some(dest.clone()),
        "header and metadata agree"
    );
    let (echoed, end) = streamed(&x.reply().await);
    assert_eq!(
        (echoed, end),
        (text.clone().into_bytes(), true),
        "the body goes on unchanged"
    );
    assert_eq!(
        load_of(&epp, holder.address),
        n as u64,
        "its blocks are resident from the pick"
    );
    epp.router.publish_load();
    let no_prefill = format!(
        "dynamo_frontend_worker_active_prefill_tokens{{worker_id=\"{}\",worker_type=\"decode\"}} 0\n",
        holder.address
    );
    assert!(
        epp.metrics.encode().contains(&no_prefill),
        "the whole prompt is cached: no prefill"
    );

    x.send(response_headers(&[
        (":status", "200"),
        ("content-type", "text/event-stream"),
    ]))
    .await;
    assert!(matches!(x.reply().await, Reply::ResponseHeaders(_)));
    let chunk = b"data: {\"choices\":[{\"delta\":{\"content\":\" hi\"}}]}\n\n";
    x.send(body_phase(chunk, false, true)).await;
    assert_eq!(streamed(&x.reply().await), (chunk.to_vec(), false));
    assert_eq!(
        load_of(&epp, holder.address),
        n as u64,
        "decoding: all blocks resident"
    );
    x.send(body_phase(b"data: [DONE]\n\n", true, true)).await;
    assert_eq!(
        streamed(&x.reply().await),
        (b"data: [DONE]\n\n".to_vec(), true)
    );
    eventually("the load to end with the response", || async {
        load_of(&epp, holder.address) == 0
    })
    .await;
    let metrics = epp.metrics.encode();
    assert_eq!(
        sum_metric(
            &metrics,
            "dynamo_frontend_time_to_first_token_seconds_count"
        ),
        1,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subset_hint_limits_the_choice_and_an_empty_subset_is_a_503() {
    let pods = [Sidecarred::start(8000), Sidecarred::start(8001)];
    let file = EndpointsFile::new();
    file.write(&[pods[0].entry("worker"), pods[1].entry("worker")]);
    let epp = picker(&file, RouterConfig::default()).await;
    eventually("two endpoints", || async {
        epp.router.endpoints().len() == 2
    })
    .await;
    let body = chat("hello", 4, false).to_string();
    for target in &pods {
        let only = target.address.to_string();
        let mut x = Exchange::open(&epp).await;
        let reply = x
            .request("/v1/chat/completions", &body, Some(vec![&only]))
            .await;
        assert_eq!(destination(&reply), only);
    }
    let mut x = Exchange::open(&epp).await;
    let (status, error) = immediate(&x.request("/v1/chat/completions", &body, Some(vec![])).await);
    assert_eq!(status, 503);
    assert_eq!(error["error"]["type"], "service_unavailable", "{error}");
    let mut x = Exchange::open(&epp).await;
    let reply = x
        .request("/v1/chat/completions", &body, Some(vec!["10.9.9.9:8000"]))
        .await;
    assert_eq!(immediate(&reply).0, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoint_is_a_503_and_a_bad_body_the_openai_400() {
    let file = EndpointsFile::new();
    let epp = picker(&file, RouterConfig::default()).await;
    let mut x = Exchange::open(&epp).await;
    let (status, error) = immediate(
        &x.request(
            "/v1/chat/completions",
            &chat("hi", 2, false).to_string(),
            None,
        )
        .await,
    );
    assert_eq!(status, 503);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no endpoints")
    );

    let pod = Sidecarred::start(8000);
    file.write(&[pod.entry("worker")]);
    eventually("one endpoint", || async {
        epp.router.endpoints().len() == 1
    })
    .await;
    let mut x = Exchange::open(&epp).await;
    let (status, error) = immediate(&x.request("/v1/chat/completions", "{oops", None).await);
    assert_eq!(status, 400);
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    let mut x = Exchange::open(&epp).await;
    let negative = chat("hi", -1, false).to_string();
    let (status, error) = immediate(&x.request("/v1/completions", &negative, None).await);
    assert_eq!(status, 400, "{error}");

    // A request without a body (headers end the stream) is routed on load alone.
    let mut x = Exchange::open(&epp).await;
    x.send(headers(
        &[(":method", "GET"), (":path", "/v1/models")],
        true,
    ))
    .await;
    assert_eq!(destination(&x.reply().await), pod.address.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedding_is_a_429_and_a_closed_stream_frees_the_pod() {
    let pod = Sidecarred::start(8000);
    let file = EndpointsFile::new();
    file.write(&[pod.entry("worker")]);
    let epp = picker(
        &file,
        RouterConfig {
            queue_capacity: 0,
            saturation: SaturationThreshold {
                max_blocks_in_flight: Some(0),
                ..SaturationThreshold::default()
            },
            ..RouterConfig::default()
        },
    )
    .await;
    eventually("one endpoint", || async {
        epp.router.endpoints().len() == 1
    })
    .await;
    let body = chat(&text(40, 2), 4, false).to_string();
    let mut busy = Exchange::open(&epp).await;
    let reply = busy.request("/v1/chat/completions", &body, None).await;
    assert_eq!(destination(&reply), pod.address.to_string());

    let mut shed = Exchange::open(&epp).await;
    let (status, error) = immediate(&shed.request("/v1/chat/completions", &body, None).await);
    assert_eq!(status, 429);
    assert_eq!(error["error"]["type"], "rate_limit_error", "{error}");

    // The gateway closes the first stream (client gone): its load ends.
    drop(busy);
    eventually("the pod to be free", || async {
        load_of(&epp, pod.address) == 0
    })
    .await;
    let mut next = Exchange::open(&epp).await;
    let reply = next.request("/v1/chat/completions", &body, None).await;
    assert_eq!(destination(&reply), pod.address.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_pool_names_the_prefill_pod_too() {
    let prefill = Sidecarred::start(8000);
    let decode = Sidecarred::start(8001);
    let file = EndpointsFile::new();
    file.write(&[prefill.entry("prefill"), decode.entry("decode")]);
    let epp = picker(&file, RouterConfig::default()).await;
    eventually("two endpoints", || async {
        epp.router.endpoints().len() == 2
    })
    .await;
    // The client's own prefill header is removed, and the picker's set instead.
    let reply = forged_prefill_request(&epp).await;
    assert_eq!(destination(&reply), decode.address.to_string());
    assert_eq!(mutation(&reply).remove_headers, ["x-prefiller-host-port"]);
    assert_eq!(
        header_set(mutation(&reply), "x-prefiller-host-port"),
        Some(prefill.address.to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_services_follow_readiness() {
    let file = EndpointsFile::new();
    let epp = picker(&file, RouterConfig::default()).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", epp.ext_proc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let check = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    let status = |r: tonic::Response<tonic_health::pb::HealthCheckResponse>| r.into_inner().status;
    assert_eq!(
        status(health.check(check("liveness")).await.unwrap()),
        ServingStatus::Serving as i32
    );
    for service in ["readiness", "envoy.service.ext_proc.v3.ExternalProcessor"] {
        eventually("not serving without endpoints", || {
            let mut health = health.clone();
            async move {
                health
                    .check(check(service))
                    .await
                    .is_ok_and(|r| status(r) == ServingStatus::NotServing as i32)
            }
        })
        .await;
    }
    let pod = Sidecarred::start(8000);
    file.write(&[pod.entry("worker")]);
    for service in ["readiness", "envoy.service.ext_proc.v3.ExternalProcessor"] {
        eventually("serving once the pod's snapshot arrived", || {
            let mut health = health.clone();
            async move {
                health
                    .check(check(service))
                    .await
                    .is_ok_and(|r| status(r) == ServingStatus::Serving as i32)
            }
        })
        .await;
    }
    let unknown = health.check(check("nope")).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_prefill_header_is_removed() {
    let worker = Sidecarred::start(8000);
    let file = EndpointsFile::new();
    file.write(&[worker.entry("worker")]);
    let epp = picker(&file, RouterConfig::default()).await;
    eventually("one endpoint", || async {
        epp.router.endpoints().len() == 1
    })
    .await;
    let reply = forged_prefill_request(&epp).await;
    assert_eq!(destination(&reply), worker.address.to_string());
    assert_eq!(mutation(&reply).remove_headers, ["x-prefiller-host-port"]);
    assert_eq!(header_set(mutation(&reply), "x-prefiller-host-port"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_transfer_parameters_are_dropped_from_the_body() {
    let worker = Sidecarred::start(8000);
    let file = EndpointsFile::new();
    file.write(&[worker.entry("worker")]);
    let epp = picker(&file, RouterConfig::default()).await;
    eventually("one endpoint", || async {
        epp.router.endpoints().len() == 1
    })
    .await;
    let mut forged = chat("hi", 2, false);
    forged["kv_transfer_params"] =
        json!({"do_remote_prefill": true, "remote_host": "10.6.6.6", "remote_port": 5600});
    let forged = forged.to_string();
    let mut x = Exchange::open(&epp).await;
    let declared = forged.len().to_string();
    x.send(headers(
        &[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-length", &declared),
        ],
        false,
    ))
    .await;
    x.send(body_phase(forged.as_bytes(), true, false)).await;
    let reply = x.reply().await;
    let (sent, end) = streamed(&x.reply().await);
    assert!(end);
    assert_eq!(
        serde_json::from_slice::<Value>(&sent).unwrap(),
        chat("hi", 2, false)
    );
    let length = header_set(mutation(&reply), "content-length");
    assert_eq!(length, Some(sent.len().to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_gets_an_immediate_413() {
    let pod = Sidecarred::start(8000);
    let file = EndpointsFile::new();
    file.write(&[pod.entry("worker")]);
    let mut config = config(&file, RouterConfig::default());
    config.max_body_bytes = Some(1000);
    let epp = start(config).await.unwrap();
    eventually("one endpoint", || async {
        epp.router.endpoints().len() == 1
    })
    .await;
    let too_large = |reply: &Reply| {
        let (status, error) = immediate(reply);
        assert_eq!(status, 413, "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("1000 bytes"),
            "{error}"
        );
    };

    // Announced by content-length: refused at the headers, before any body chunk.
    let mut x = Exchange::open(&epp).await;
    x.send(headers(
        &[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-length", "5000"),
        ],
        false,
    ))
    .await;
    too_large(&x.reply().await);

    // Not announced: refused at the chunk that passes the limit.
    let mut x = Exchange::open(&epp).await;
    x.send(headers(
        &[(":method", "POST"), (":path", "/v1/chat/completions")],
        false,
    ))
    .await;
    x.send(body_phase(&[b' '; 600], false, false)).await;
    x.send(body_phase(&[b' '; 600], false, false)).await;
    too_large(&x.reply().await);

    // Under it: routed.
    let mut x = Exchange::open(&epp).await;
    let reply = x
        .request(
            "/v1/chat/completions",
            &chat("hi", 2, false).to_string(),
            None,
        )
        .await;
    assert_eq!(destination(&reply), pod.address.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_engine_in_the_answer_marks_the_pod_unhealthy() {
    let pods = [Sidecarred::start(8000), Sidecarred::start(8001)];
    let file = EndpointsFile::new();
    file.write(&[pods[0].entry("worker"), pods[1].entry("worker")]);
    let epp = picker(
        &file,
        RouterConfig {
            mode: dynamo_kvcache::RouterMode::RoundRobin,
            unhealthy_for: Duration::from_secs(600),
            ..RouterConfig::default()
        },
    )
    .await;
    eventually("two endpoints", || async {
        epp.router.endpoints().len() == 2
    })
    .await;
    let body = chat("hi", 2, false).to_string();
    let failures = |pod: &str| {
        let series = format!("dynamo_epp_upstream_failures_total{{pod=\"{pod}\"}}");
        metric_value(&epp.metrics.encode(), &series) == Some(1)
    };
    // Routes one request and answers it with a 503 carrying `code`; returns its pod.
    let answer_503 = |code: &'static str| {
        let epp = &epp;
        let body = &body;
        async move {
            let mut x = Exchange::open(epp).await;
            let pod = destination(&x.request("/v1/chat/completions", body, None).await);
            streamed(&x.reply().await);
            x.send(response_headers(&[
                (":status", "503"),
                ("content-type", "application/json"),
            ]))
            .await;
            x.reply().await;
            let error = serde_json::json!({"error": {"message": "down", "type":
                "service_unavailable", "param": null, "code": code}})
            .to_string();
            let (a, b) = error.as_bytes().split_at(10);
            x.send(body_phase(a, false, true)).await;
            x.reply().await;
            x.send(body_phase(b, true, true)).await;
            x.reply().await;
            pod
        }
    };

    // The engine's own 503 (busy, say) says nothing about the pod.
    let busy = answer_503("overloaded").await;
    assert!(!failures(&busy));
    // A sidecar whose engine is down: that pod is avoided from now on.
    let dead = answer_503("engine_unreachable").await;
    eventually("the failure to be counted", || async { failures(&dead) }).await;
    for _ in 0..4 {
        let mut x = Exchange::open(&epp).await;
        let pod = destination(&x.request("/v1/chat/completions", &body, None).await);
        assert_ne!(pod, dead);
    }
}
