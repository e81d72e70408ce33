//! The prefill hop between two real sidecars over loopback: a decode pod's sidecar sends
//! the prefill leg to a prefill pod's sidecar, brings the blocks over when they wait
//! there, and hands the engine the original request; every failure degrades to local
//! prefill or a clear error. The engines are small HTTP servers that answer as vLLM's
//! NixlConnector does (pillars.md 1.1) and record what they were sent; the block-API
//! engine lends and fetches blocks through the real block client.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use common::*;
use dynamo_kvblocks::{Block, BlockClient, Layout};
use dynamo_kvcache::SeqHash;
use dynamo_llm::disagg::{KVBLOCKS_TRANSPORT, KvTransferParams, PREFILLER_HEADER};
use dynamo_sidecar::Sidecar;
use serde_json::{Value, json};
use tokio_util::task::AbortOnDropHandle;

/// What an engine stand-in does with a request.
#[derive(Clone)]
enum Answer {
    /// This status and JSON body.
    Json(StatusCode, Value),
    /// Sleeps, then answers.
    Late(Duration, Value),
    /// Lends `blocks` blocks to its sidecar (at the gRPC address) under the request's
    /// `x-request-id`, waits `delay`, then answers the block-API engine's parameters
    /// (none if the sidecar refused the lease).
    Lend {
        sidecar: SocketAddr,
        blocks: u64,
        delay: Duration,
    },
    /// Takes the blocks its parameters name from its sidecar, and answers what it got.
    Fetch { sidecar: SocketAddr },
    /// Never answers.
    Hang,
}

type Seen = Arc<Mutex<Vec<(HeaderMap, Value)>>>;

struct Engine {
    url: String,
    seen: Seen,
    answer: Arc<Mutex<Answer>>,
    _server: AbortOnDropHandle<()>,
}

impl Engine {
    async fn start(answer: Answer) -> Self {
        let seen = Seen::default();
        let answer = Arc::new(Mutex::new(answer));
        let (s, a) = (seen.clone(), answer.clone());
        let app = axum::Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
            let (seen, answer) = (s.clone(), a.clone());
            async move {
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                seen.lock().unwrap().push((headers.clone(), body.clone()));
                let answer = answer.lock().unwrap().clone();
                respond(answer, &headers, &body).await
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            url,
            seen,
            answer,
            _server: AbortOnDropHandle::new(server),
        }
    }

    fn requests(&self) -> Vec<(HeaderMap, Value)> {
        self.seen.lock().unwrap().clone()
    }
}

fn layout() -> Layout {
    Layout {
        block_bytes: 4096,
        block_size: 16,
        layers: 2,
        dtype: "bfloat16".into(),
    }
}

/// A chain of `n` blocks with distinct payloads.
fn chain(n: u64) -> Vec<Block> {
    (0..n)
        .map(|i| {
            let payload = Bytes::from(vec![i as u8 + 1; 4096]);
            let parent = i.checked_sub(1).map(|p| SeqHash(1000 + p));
            Block::new(SeqHash(1000 + i), parent, 16, layout(), payload)
        })
        .collect()
}

async fn respond(answer: Answer, headers: &HeaderMap, body: &Value) -> Response {
    match answer {
        Answer::Json(status, value) => (status, Json(value)).into_response(),
        Answer::Late(delay, value) => {
            tokio::time::sleep(delay).await;
            Json(value).into_response()
        }
        Answer::Hang => std::future::pending().await,
        Answer::Lend {
            sidecar,
            blocks,
            delay,
        } => {
            let lease = headers["x-request-id"].to_str().unwrap().to_owned();
            let mut client = BlockClient::new(&format!("http://{sidecar}")).unwrap();
            let reply = client.lend(&lease, chain(blocks)).await.unwrap();
            if reply.refused.is_some() {
                // As the mock engine: no lease, no transfer parameters.
                return Json(json!({"kv_transfer_params": null})).into_response();
            }
            assert_eq!(reply.lent, blocks);
            tokio::time::sleep(delay).await;
            Json(json!({
                "id": "cmpl-p", "object": "text_completion",
                "kv_transfer_params": {
                    "do_remote_prefill": true, "do_remote_decode": false,
                    "remote_block_ids": (0..blocks).map(|i| 1000 + i).collect::<Vec<_>>(),
                    "remote_engine_id": "prefill-engine", "remote_request_id": lease,
                    "remote_host": "127.0.0.1", "remote_port": sidecar.port(), "tp_size": 1,
                    "remote_transport": KVBLOCKS_TRANSPORT,
                },
            }))
            .into_response()
        }
        Answer::Fetch { sidecar } => {
            let Some(params) = KvTransferParams::of(body.as_object().unwrap()) else {
                return Json(json!({"fetched": 0})).into_response();
            };
            let hashes: Vec<SeqHash> = params
                .remote_block_ids
                .unwrap()
                .into_iter()
                .map(SeqHash)
                .collect();
            let mut client = BlockClient::new(&format!("http://{sidecar}")).unwrap();
            let lease = params.remote_request_id.unwrap();
            let blocks = client.fetch_lease(&lease, &hashes).await.unwrap();
            let same = blocks == chain(blocks.len() as u64);
            Json(json!({"fetched": blocks.len(), "same": same})).into_response()
        }
    }
}

/// A prefill pod (sidecar + engine) and a decode pod whose sidecar may send it prefills.
struct Pods {
    prefill_engine: Engine,
    prefill: Sidecar,
    decode_engine: Engine,
    decode: Sidecar,
}

impl Pods {
    /// `prefill_flags` and `decode_flags` go to the sidecars; the decode sidecar knows
    /// the prefill sidecar's gRPC port as its block API port, unless its flags say.
    async fn start(prefill_answer: Answer, prefill_flags: &[&str], decode_flags: &[&str]) -> Self {
        let prefill_engine = Engine::start(prefill_answer).await;
        let prefill = sidecar_with(&prefill_engine.url, None, None, prefill_flags).await;
        let decode_engine = Engine::start(Answer::Json(StatusCode::OK, json!({"ok": 1}))).await;
        let peers = format!("{}", prefill.proxy_addr);
        let block_port = prefill.grpc_addr.port().to_string();
        let mut flags = vec!["--prefill-peers", &peers];
        if !decode_flags.contains(&"--prefill-peer-grpc-port") {
            flags.extend(["--prefill-peer-grpc-port", &block_port]);
        }
        flags.extend(decode_flags);
        let decode = sidecar_with(&decode_engine.url, None, None, &flags).await;
        Self {
            prefill_engine,
            prefill,
            decode_engine,
            decode,
        }
    }

    /// Makes the prefill engine lend `blocks` blocks of each prompt through its sidecar,
    /// `delay` before it answers (its answer names its sidecar: set once that runs).
    fn lend(&self, blocks: u64, delay: Duration) {
        *self.prefill_engine.answer.lock().unwrap() = Answer::Lend {
            sidecar: self.prefill.grpc_addr,
            blocks,
            delay,
        };
    }

    /// Lets the prefill engine lend through its sidecar and the decode engine fetch
    /// through its own.
    fn block_api(&self) {
        *self.decode_engine.answer.lock().unwrap() = Answer::Fetch {
            sidecar: self.decode.grpc_addr,
        };
    }

    async fn send(&self, prefill: &str, body: Value) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("http://{}/v1/completions", self.decode.proxy_addr))
            .header(PREFILLER_HEADER, prefill)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn hops(&self, outcome: &str) -> f64 {
        let label = format!("outcome=\"{outcome}\"");
        metric(&self.decode, "dynamo_sidecar_prefill_hops_total", &label).await
    }
}

fn request() -> Value {
    json!({"model": "m", "prompt": "a long prompt", "max_tokens": 40, "stream": true,
           "stream_options": {"include_usage": true}, "min_tokens": 2, "seed": 3})
}

fn hop_outcome(response: &reqwest::Response) -> &str {
    response.headers()["x-dynamo-prefill-hop"].to_str().unwrap()
}

#[tokio::test]
async fn vllm_transfer_parameters_reach_the_decode_engine_untouched() {
    let params = json!({
        "do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [7, 8],
        "remote_engine_id": "e1", "remote_request_id": "r1", "remote_host": "10.1.2.3",
        "remote_port": 5600, "tp_size": 1, "remote_num_tokens": 40,
    });
    let answer = Answer::Json(StatusCode::OK, json!({"kv_transfer_params": params}));
    let pods = Pods::start(answer, &[], &[]).await;
    let response = pods
        .send(&pods.prefill.proxy_addr.to_string(), request())
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(hop_outcome(&response), "passthrough");

    let [(prefill_headers, prefill_body)] = &pods.prefill_engine.requests()[..] else {
        panic!("one prefill leg");
    };
    assert_eq!(
        *prefill_body,
        json!({"model": "m", "prompt": "a long prompt", "max_tokens": 1, "stream": false,
               "seed": 3, "kv_transfer_params": {"do_remote_decode": true,
               "do_remote_prefill": false, "remote_block_ids": null, "remote_engine_id": null,
               "remote_host": null, "remote_port": null}})
    );
    let [(decode_headers, decode_body)] = &pods.decode_engine.requests()[..] else {
        panic!("one decode request");
    };
    let mut expected = request();
    expected["kv_transfer_params"] = params;
    assert_eq!(*decode_body, expected);
    assert_eq!(
        prefill_headers["x-request-id"], decode_headers["x-request-id"],
        "one request id on both legs"
    );
    assert!(!decode_headers.contains_key(PREFILLER_HEADER));
    assert_eq!(pods.hops("passthrough").await, 1.0);
}

#[tokio::test]
async fn a_header_naming_a_pod_outside_the_pool_is_refused_without_connecting() {
    let answer = Answer::Json(StatusCode::OK, json!({}));
    let pods = Pods::start(answer, &[], &[]).await;
    // The prefill sidecar's gRPC port: same IP, not a member's port.
    for named in [pods.prefill.grpc_addr.to_string(), "not-an-address".into()] {
        let response = pods.send(&named, request()).await;
        assert_eq!(response.status(), 403, "{named}");
        assert_eq!(hop_outcome(&response), "refused");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], "prefill_pod_refused");
    }
    assert!(pods.prefill_engine.requests().is_empty());
    assert!(pods.decode_engine.requests().is_empty());
    assert_eq!(pods.hops("refused").await, 2.0);
}

#[tokio::test]
async fn a_4xx_too_long_to_pass_on_whole_reaches_the_client_as_an_error_of_its_own() {
    let long = "x".repeat(20 << 20);
    let error = json!({"error": {"message": long, "type": "invalid_request_error"}});
    let pods = Pods::start(Answer::Json(StatusCode::BAD_REQUEST, error), &[], &[]).await;
    let prefill = pods.prefill.proxy_addr.to_string();
    let response = pods.send(&prefill, request()).await;
    assert_eq!(response.status(), 400);
    assert_eq!(hop_outcome(&response), "client_error");
    let answer: Value = response.json().await.expect("whole JSON, not a cut one");
    assert_eq!(answer["error"]["code"], "prefill_answer_too_large");
    assert!(pods.decode_engine.requests().is_empty());
}

#[tokio::test]
async fn a_4xx_from_prefill_goes_to_the_client_and_a_5xx_falls_back() {
    let error = json!({"error": {"message": "prompt too long", "type": "invalid_request_error"}});
    let pods = Pods::start(
        Answer::Json(StatusCode::BAD_REQUEST, error.clone()),
        &[],
        &[],
    )
    .await;
    let prefill = pods.prefill.proxy_addr.to_string();
    let response = pods.send(&prefill, request()).await;
    assert_eq!(response.status(), 400);
    assert_eq!(hop_outcome(&response), "client_error");
    assert_eq!(response.json::<Value>().await.unwrap(), error);
    assert!(pods.decode_engine.requests().is_empty());

    for answer in [
        Answer::Json(StatusCode::INTERNAL_SERVER_ERROR, json!({"error": "boom"})),
        Answer::Json(StatusCode::TOO_MANY_REQUESTS, json!({"error": "busy"})),
        // A prefill that did not keep its blocks (vLLM answers null on abort).
        Answer::Json(StatusCode::OK, json!({"kv_transfer_params": null})),
    ] {
        *pods.prefill_engine.answer.lock().unwrap() = answer;
        let response = pods.send(&prefill, request()).await;
        assert_eq!(response.status(), 200);
        assert_eq!(hop_outcome(&response), "fallback_prefill_failed");
    }
    // Each fallback sent the client's own body, without transfer parameters.
    let decoded = pods.decode_engine.requests();
    assert_eq!(decoded.len(), 3);
    assert!(decoded.iter().all(|(_, body)| *body == request()));
    assert_eq!(pods.hops("fallback_prefill_failed").await, 3.0);
}

#[tokio::test]
async fn a_slow_or_dead_prefill_pod_falls_back_to_local_prefill() {
    let late = Answer::Late(Duration::from_secs(5), json!({}));
    let pods = Pods::start(late, &[], &["--prefill-timeout", "200ms"]).await;
    let response = pods
        .send(&pods.prefill.proxy_addr.to_string(), request())
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(hop_outcome(&response), "fallback_timeout");

    // A member whose sidecar is gone: nothing listens there any more.
    let gone = pods.prefill.proxy_addr;
    let Pods {
        prefill,
        decode,
        decode_engine,
        ..
    } = pods;
    drop(prefill);
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", decode.proxy_addr))
        .header(PREFILLER_HEADER, gone.to_string())
        .json(&request())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(hop_outcome(&response), "fallback_prefill_failed");
    assert!(
        decode_engine
            .requests()
            .iter()
            .all(|(_, b)| *b == request())
    );
}

#[tokio::test]
async fn blocks_move_between_the_sidecars_and_no_lease_is_left() {
    // The prefill engine's answer needs its sidecar's address: start it first.
    let pods = Pods::start(Answer::Hang, &[], &[]).await;
    pods.lend(8, Duration::ZERO);
    pods.block_api();
    let response = pods
        .send(&pods.prefill.proxy_addr.to_string(), request())
        .await;
    assert_eq!(hop_outcome(&response), "remote");
    let transfer_ms: f64 = response.headers()["x-dynamo-kv-transfer-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(transfer_ms > 0.0);
    assert_eq!(
        response.json::<Value>().await.unwrap(),
        json!({"fetched": 8, "same": true}),
        "the decode engine took every block, byte for byte, from its own sidecar"
    );
    let [(_, decoded)] = &pods.decode_engine.requests()[..] else {
        panic!("one decode request");
    };
    let params = KvTransferParams::of(decoded.as_object().unwrap()).unwrap();
    assert_eq!(params.remote_port, Some(pods.decode.grpc_addr.port()));
    assert_eq!(params.remote_engine_id.as_deref(), Some("prefill-engine"));
    assert_eq!(decoded["stream"], true, "the client's own options");
    assert_eq!(pods.prefill.leases.held(), (0, 0));
    assert_eq!(pods.decode.leases.held(), (0, 0));
    let bytes = metric(&pods.decode, "dynamo_sidecar_kv_transfer_bytes_total", "").await;
    assert_eq!(bytes, 8.0 * 4096.0);
    let fetched = "how=\"fetched\"";
    assert_eq!(
        metric(
            &pods.prefill,
            "dynamo_sidecar_kv_leases_ended_total",
            fetched
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(
            &pods.decode,
            "dynamo_sidecar_kv_leases_ended_total",
            fetched
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn blocks_fetched_after_the_lease_expired_are_gone_and_the_decode_prefills() {
    let pods = Pods::start(Answer::Hang, &["--kv-lease-duration", "100ms"], &[]).await;
    pods.lend(4, Duration::from_millis(300));
    let response = pods
        .send(&pods.prefill.proxy_addr.to_string(), request())
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(hop_outcome(&response), "fallback_transfer_failed");
    let [(_, decoded)] = &pods.decode_engine.requests()[..] else {
        panic!("one decode request");
    };
    assert_eq!(*decoded, request(), "the client's body, to prefill here");
    assert_eq!(pods.prefill.leases.held(), (0, 0));
    let expired = "how=\"expired\"";
    assert_eq!(
        metric(
            &pods.prefill,
            "dynamo_sidecar_kv_leases_ended_total",
            expired
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn a_client_that_leaves_releases_the_blocks_its_engine_did_not_take() {
    let pods = Pods::start(Answer::Hang, &[], &[]).await;
    pods.lend(4, Duration::ZERO);
    // The decode engine never takes its blocks nor answers.
    *pods.decode_engine.answer.lock().unwrap() = Answer::Hang;
    let prefill = pods.prefill.proxy_addr.to_string();
    let sent = tokio::spawn({
        let url = format!("http://{}/v1/completions", pods.decode.proxy_addr);
        async move {
            let _ = reqwest::Client::new()
                .post(url)
                .header(PREFILLER_HEADER, prefill)
                .json(&request())
                .send()
                .await;
        }
    });
    eventually("the decode engine has the request", || async {
        !pods.decode_engine.requests().is_empty()
    })
    .await;
    assert_eq!(pods.decode.leases.held().0, 1, "held for the engine");
    sent.abort();
    eventually("the lease is released", || async {
        pods.decode.leases.held() == (0, 0)
    })
    .await;
    let released = "how=\"released\"";
    assert_eq!(
        metric(
            &pods.decode,
            "dynamo_sidecar_kv_leases_ended_total",
            released
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn a_clients_own_transfer_parameters_never_reach_the_engine_through_the_hop() {
    let pods = Pods::start(
        Answer::Json(StatusCode::INTERNAL_SERVER_ERROR, json!({})),
        &[],
        &[],
    )
    .await;
    let mut forged = request();
    forged["kv_transfer_params"] = json!({"do_remote_prefill": true, "remote_host": "10.9.9.9",
        "remote_port": 22, "remote_request_id": "someone-elses",
        "remote_transport": KVBLOCKS_TRANSPORT, "remote_block_ids": [1]});
    let prefill = pods.prefill.proxy_addr.to_string();
    let response = pods.send(&prefill, forged).await;
    assert_eq!(hop_outcome(&response), "fallback_prefill_failed");
    // A prompt shorter than a block: the prefill lends nothing and nothing moves.
    let short = json!({"kv_transfer_params": {"do_remote_prefill": true,
        "remote_block_ids": [], "remote_request_id": "r", "remote_port": 1,
        "remote_transport": KVBLOCKS_TRANSPORT}});
    *pods.prefill_engine.answer.lock().unwrap() = Answer::Json(StatusCode::OK, short);
    let response = pods.send(&prefill, request()).await;
    assert_eq!(hop_outcome(&response), "remote");
    let decoded = pods.decode_engine.requests();
    assert_eq!(decoded.len(), 2);
    assert!(
        decoded.iter().all(|(_, body)| *body == request()),
        "{decoded:?}"
    );
}

#[tokio::test]
async fn a_transfer_that_does_not_finish_in_time_falls_back_to_local_prefill() {
    // A "prefill sidecar" that accepts connections and never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let _held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let params = json!({"kv_transfer_params": {"do_remote_prefill": true,
        "remote_block_ids": [1000, 1001], "remote_request_id": "r", "remote_port": port,
        "remote_transport": KVBLOCKS_TRANSPORT}});
    let answer = Answer::Json(StatusCode::OK, params);
    let port = port.to_string();
    let decode_flags = [
        "--kv-transfer-timeout",
        "300ms",
        "--prefill-peer-grpc-port",
        &port,
    ];
    let pods = Pods::start(answer, &[], &decode_flags).await;
    let response = pods
        .send(&pods.prefill.proxy_addr.to_string(), request())
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(hop_outcome(&response), "fallback_transfer_failed");
    let [(_, decoded)] = &pods.decode_engine.requests()[..] else {
        panic!("one decode request");
    };
    assert_eq!(*decoded, request());
    assert_eq!(pods.decode.leases.held(), (0, 0));
    let refused = "dynamo_sidecar_kv_transfer_unannounced_port_total";
    assert_eq!(metric(&pods.decode, refused, "").await, 0.0, "a timeout");
}

#[tokio::test]
async fn junk_leases_from_one_peer_leave_room_for_the_others_leases() {
    // Room for four leases of 16 KiB; a peer's share (a quarter by default) is one.
    let budget = ["--kv-lease-bytes", "64KiB"];
    let pods = Pods::start(Answer::Hang, &budget, &[]).await;
    pods.lend(4, Duration::ZERO);
    pods.block_api();
    // A stranger on another address sends prefill legs straight to the prefill pod,
    // and never fetches what they leave there.
    let stranger = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    for i in 0..4 {
        let leg = json!({"model": "m", "prompt": "junk", "max_tokens": 1,
                         "kv_transfer_params": {"do_remote_decode": true}});
        let answer = stranger
            .post(format!("http://{}/v1/completions", pods.prefill.proxy_addr))
            .header("x-request-id", format!("junk-{i}"))
            .json(&leg)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
    }
    assert_eq!(
        pods.prefill.leases.held(),
        (1, 16 << 10),
        "the stranger's share"
    );
    let refused = "reason=\"peer_over_budget\"";
    assert_eq!(
        metric(
            &pods.prefill,
            "dynamo_sidecar_kv_leases_refused_total",
            refused
        )
        .await,
        3.0
    );

    // A real disaggregated request still finds room for its lease.
    let response = pods
        .send(&pods.prefill.proxy_addr.to_string(), request())
        .await;
    assert_eq!(hop_outcome(&response), "remote");
    assert_eq!(
        response.json::<Value>().await.unwrap(),
        json!({"fetched": 4, "same": true})
    );
}

#[tokio::test]
async fn blocks_are_fetched_only_from_the_prefill_peers_announced_block_api_port() {
    // Another server on the prefill pod's IP, which its answer names as `remote_port`.
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = other.local_addr().unwrap().port();
    let reached = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let _other = AbortOnDropHandle::new(tokio::spawn({
        let reached = reached.clone();
        async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = other.accept().await {
                reached.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                open.push(socket);
            }
        }
    }));
    let params = json!({"kv_transfer_params": {"do_remote_prefill": true,
        "remote_block_ids": [1000, 1001], "remote_request_id": "r", "remote_port": port,
        "remote_transport": KVBLOCKS_TRANSPORT}});
    let answer = Answer::Json(StatusCode::OK, params);
    let pods = Pods::start(answer, &[], &["--kv-transfer-timeout", "300ms"]).await;
    let response = pods
        .send(&pods.prefill.proxy_addr.to_string(), request())
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(hop_outcome(&response), "fallback_transfer_failed");
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the decode sidecar connected to the port the answer named"
    );
    let refused = "dynamo_sidecar_kv_transfer_unannounced_port_total";
    assert_eq!(metric(&pods.decode, refused, "").await, 1.0);
    let [(_, decoded)] = &pods.decode_engine.requests()[..] else {
        panic!("one decode request");
    };
    assert_eq!(*decoded, request(), "prefilled here");
}

/// A lent prompt moved by `Pods` whose sidecars take `prefill_nixl` and `decode_nixl` as
/// `--nixl-lib-dir`: the decode engine's answer, and the decode sidecar's transfers
/// counted by transport.
async fn transfer_with(prefill_nixl: &str, decode_nixl: &str) -> (Pods, Value, f64, f64) {
    let prefill_flags = ["--nixl-lib-dir", prefill_nixl];
    let decode_flags = ["--nixl-lib-dir", decode_nixl];
    let pods = Pods::start(Answer::Hang, &prefill_flags, &decode_flags).await;
    pods.lend(8, Duration::ZERO);
    pods.block_api();
    let response = pods
        .send(&pods.prefill.proxy_addr.to_string(), request())
        .await;
    assert_eq!(hop_outcome(&response), "remote");
    let answer = response.json::<Value>().await.unwrap();
    let by = |transport: &str| format!("transport=\"{transport}\"");
    let transfers = "dynamo_sidecar_kv_transfers_total";
    let nixl = metric(&pods.decode, transfers, &by("nixl")).await;
    let grpc = metric(&pods.decode, transfers, &by("grpc")).await;
    (pods, answer, nixl, grpc)
}

#[tokio::test]
async fn blocks_move_over_nixl_when_both_sidecars_have_an_agent() {
    let Some(dir) = nixl_lib_dir("blocks_move_over_nixl_when_both_sidecars_have_an_agent") else {
        return;
    };
    let (pods, answer, nixl, grpc) = transfer_with(&dir, &dir).await;
    assert_eq!((nixl, grpc), (1.0, 0.0), "read over NIXL");
    assert_eq!(
        answer,
        json!({"fetched": 8, "same": true}),
        "every block, byte for byte, checked on the way"
    );
    let bytes = metric(&pods.decode, "dynamo_sidecar_kv_transfer_bytes_total", "").await;
    assert_eq!(bytes, 8.0 * 4096.0);
    let fetched = "how=\"fetched\"";
    let ended = "dynamo_sidecar_kv_leases_ended_total";
    assert_eq!(
        metric(&pods.prefill, ended, fetched).await,
        1.0,
        "the read ended the lease"
    );
    assert_eq!(
        pods.prefill.leases.held(),
        (0, 0),
        "its exposed copy is uncharged"
    );
}

#[tokio::test]
async fn a_prefill_peer_without_an_agent_gives_its_blocks_over_grpc() {
    let Some(dir) = nixl_lib_dir("a_prefill_peer_without_an_agent_gives_its_blocks_over_grpc")
    else {
        return;
    };
    let (pods, answer, nixl, grpc) = transfer_with("none", &dir).await;
    assert_eq!((nixl, grpc), (0.0, 1.0));
    assert_eq!(answer, json!({"fetched": 8, "same": true}));
    assert_eq!(pods.prefill.leases.held(), (0, 0));
}
