//! How long a routing decision takes.
//!
//! - `route/*`: `Router::route` on a 4,096-token prompt (256 blocks of 16) over a pool
//!   whose pods hold staggered prefixes of it: hashing, index lookup, cost, pick, load
//!   accounting and the release when the assignment drops. No queueing.
//! - `prepare/chat_5k`: chat template and tokenization of a ~5.4k-token request, the
//!   other half of a decision the HTTP frontend and ext_proc make.
//! - `ext_proc/round_trip_1k`: the gateway's view over loopback gRPC: request headers
//!   and a ~1.4k-token body in, the destination header out.
//! - `http/*`: one whole non-streamed request (1 output token) to a mock engine running
//!   10,000x faster than the modelled GPU, straight and through the HTTP frontend; the
//!   difference is what the frontend adds (parse, tokenize, pick, proxy).
//!
//! `cargo bench -p dynamo-epp --bench pick` (needs `make model` for the last two).

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use dynamo_epp::config::RouterConfig;
use dynamo_epp::discovery::EndpointSpec;
use dynamo_epp::metrics::Metrics;
use dynamo_epp::router::{RouteRequest, Router};
use dynamo_kvcache::{KvEvent, RouterMode, StoredBlock, Tier, WorkerId};
use dynamo_kvstream::{HubConfig, KvEventHub, PodUpdate};
use dynamo_llm::openai::ChatCompletionRequest;
use dynamo_names::Role;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Phase;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, ProcessingRequest};
use tokio_stream::wrappers::ReceiverStream;

const PROMPT_BLOCKS: usize = 256;

fn router(pods: u64, mode: RouterMode) -> (Arc<Router>, Vec<u32>) {
    let r = Arc::new(Router::new(
        RouterConfig {
            mode,
            block_size: 16,
            ..RouterConfig::default()
        },
        common::MODEL,
        Arc::new(Metrics::new()),
    ));
    let prompt: Vec<u32> = (0..(PROMPT_BLOCKS * 16) as u32)
        .map(|t| t * 31 % 150_000)
        .collect();
    let hashes = r.hasher().seq_hashes(&prompt);
    for p in 1..=pods {
        let address = SocketAddr::from(([10, 0, (p / 256) as u8, (p % 256) as u8], 8000));
        r.add_endpoint(
            WorkerId(p),
            EndpointSpec::new(address, 9100, Role::Aggregated),
        );
        // Pod p holds the first p/pods of the prompt.
        let held = PROMPT_BLOCKS * p as usize / pods as usize;
        let blocks = hashes[..held]
            .iter()
            .map(|&seq_hash| StoredBlock {
                seq_hash,
                engine_hash: seq_hash.0,
                tier: Tier::Gpu,
            })
            .collect();
        let chain = KvEvent::Stored {
            parent: None,
            blocks,
        };
        r.apply_update(WorkerId(p), PodUpdate::Snapshot(vec![chain]));
    }
    (r, prompt)
}

fn route(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("route");
    for (name, pods, mode) in [
        ("kv_16_pods", 16, RouterMode::Kv),
        ("kv_64_pods", 64, RouterMode::Kv),
        ("kv_256_pods", 256, RouterMode::Kv),
        ("approx_64_pods", 64, RouterMode::Approx),
        ("round_robin_64_pods", 64, RouterMode::RoundRobin),
    ] {
        let (router, prompt) = router(pods, mode);
        let request = RouteRequest {
            tokens: prompt,
            max_tokens: 128,
            ..RouteRequest::default()
        };
        group.bench_function(name, |b| {
            b.iter(|| rt.block_on(router.route(request.clone())).unwrap())
        });
    }
    group.finish();
}

fn long_chat(words: usize) -> serde_json::Value {
    common::chat(&common::text(words, 1), 16, false)
}

fn prepare(c: &mut Criterion) {
    let model = common::model();
    let request: ChatCompletionRequest = serde_json::from_value(long_chat(1400)).unwrap();
    let tokens = model.prepare_chat(&request).unwrap().token_ids.len();
    eprintln!("prepare/chat_5k: {tokens} prompt tokens");
    c.bench_function("prepare/chat_5k", |b| {
        b.iter(|| model.prepare_chat(&request).unwrap())
    });
}

fn ext_proc(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let hubs: Vec<KvEventHub> = (0..8)
        .map(|_| KvEventHub::new(HubConfig::default()))
        .collect();
    let sidecars: Vec<common::Sidecar> = hubs.iter().map(common::Sidecar::start).collect();
    let file = common::EndpointsFile::new();
    let entries: Vec<_> = sidecars
        .iter()
        .enumerate()
        .map(
            |(i, s)| serde_json::json!({"address": format!("10.0.0.{i}:8000"), "kv_events": s.url}),
        )
        .collect();
    file.write(&entries);
    let body = long_chat(350).to_string();
    let (epp, mut client) = rt.block_on(async {
        let epp = dynamo_epp::start(common::config(&file, RouterConfig::default()))
            .await
            .unwrap();
        let router = epp.router.clone();
        common::eventually("8 endpoints", || {
            let router = router.clone();
            async move { router.readiness().is_ok() && router.endpoints().len() == 8 }
        })
        .await;
        let client = ExternalProcessorClient::connect(format!("http://{}", epp.ext_proc_addr))
            .await
            .unwrap();
        (epp, client)
    });
    let header = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..HeaderValue::default()
    };
    let phases = vec![
        ProcessingRequest {
            request: Some(Phase::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap {
                    headers: vec![
                        header(":method", "POST"),
                        header(":path", "/v1/chat/completions"),
                    ],
                }),
                ..HttpHeaders::default()
            })),
            ..ProcessingRequest::default()
        },
        ProcessingRequest {
            request: Some(Phase::RequestBody(HttpBody {
                body: body.into_bytes(),
                end_of_stream: true,
                ..HttpBody::default()
            })),
            ..ProcessingRequest::default()
        },
    ];
    c.bench_function("ext_proc/round_trip_1k", |b| {
        b.iter(|| {
            rt.block_on(async {
                let (tx, rx) = tokio::sync::mpsc::channel(4);
                for p in &phases {
                    tx.send(p.clone()).await.unwrap();
                }
                let mut replies = client
                    .process(ReceiverStream::new(rx))
                    .await
                    .unwrap()
                    .into_inner();
                replies.message().await.unwrap().unwrap()
            })
        })
    });
    drop(epp);
}

fn http(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let file = common::EndpointsFile::new();
    let (pod, epp) = rt.block_on(async {
        let pod = common::Pod::start_with_speedup(10_000.0).await;
        file.write(&[pod.entry()]);
        let epp = dynamo_epp::start(common::config(&file, RouterConfig::default()))
            .await
            .unwrap();
        let router = epp.router.clone();
        common::eventually("the pod's snapshot", || {
            let router = router.clone();
            async move { router.readiness().is_ok() }
        })
        .await;
        (pod, epp)
    });
    let client = reqwest::Client::new();
    let body = common::chat("Say hi", 1, false).to_string();
    let mut group = c.benchmark_group("http");
    for (name, base) in [
        ("direct_engine", pod.address),
        ("via_frontend", epp.http_addr),
    ] {
        let url = format!("http://{base}/v1/chat/completions");
        group.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let response = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), 200);
                    response.bytes().await.unwrap()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, route, prepare, ext_proc, http);
criterion_main!(benches);
