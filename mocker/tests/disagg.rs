//! Disaggregated prefill/decode between mock engines over a real sidecar's leases
//! (`docs/mocker.md`, "Disaggregated serving"), over real sockets: the prefill engine
//! lends its prompt's blocks and answers vLLM's `kv_transfer_params`; the decode engine
//! takes them and answers exactly as an aggregated engine would, and recomputes
//! whatever it cannot take.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use common::{metric, serve};
use dynamo_kvblocks::{BlockClient, Layout};
use dynamo_kvcache::{BlockHasher, SeqHash};
use dynamo_llm::disagg::{PREFILLER_HEADER, prefill_body};
use dynamo_mocker::kv_blocks::payload;
use dynamo_mocker::server::{RunningServer, ServerConfig, start};
use dynamo_mocker::{EngineConfig, KvBlocksConfig, OffloadMode};
use dynamo_sidecar::{Config, Sidecar};
use serde_json::{Value, json};

mod common;

/// Payload bytes of one qwen-mock block at block size 16 and `SCALE`: 2 (K, V) x 24
/// layers x 2 KV heads x 64 (896 / 14) x 2 bytes x 16 tokens x SCALE, rounded.
const SCALE: f64 = 0.001;
const REAL_BLOCK_BYTES: u64 = 2 * 24 * 2 * 64 * 2 * 16;
const BLOCK_BYTES: u64 = 197;
/// A slow link, so the modelled transfer shows: 6 blocks take 6 x 196608 B / 10 MB/s
/// = 118 ms, 11.8 ms at speedup 10.
const LINK_GBPS: f64 = 0.01;

/// A sidecar on free loopback ports (its proxy in front of `engine_url`).
async fn sidecar(engine_url: &str, extra: &[&str]) -> Sidecar {
    let mut args = vec![
        "dynamo-sidecar",
        "--listen",
        "127.0.0.1:0",
        "--host",
        "127.0.0.1",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        "--engine-url",
        engine_url,
        "--engine-kv-events",
        "none",
        "--engine-kv-replay",
        "none",
        "--model-name",
        "qwen",
    ];
    args.extend(extra);
    Sidecar::start(&Config::parse_from(args)).await.unwrap()
}

/// An engine of 64 blocks of 16 tokens; with `kv`, on that sidecar's leases only.
async fn engine(kv: Option<KvBlocksConfig>) -> RunningServer {
    serve(config(kv)).await
}

fn config(kv: Option<KvBlocksConfig>) -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: 64,
        block_size: 16,
        speedup_ratio: 10.0,
        kv_blocks: kv.map(|kv| KvBlocksConfig {
            bytes_scale: SCALE,
            offload: OffloadMode::None,
            link_bandwidth_gbps: LINK_GBPS,
            ..kv
        }),
        ..EngineConfig::default()
    }
}

fn on(sidecar: &Sidecar, engine_id: &str) -> Option<KvBlocksConfig> {
    Some(KvBlocksConfig {
        url: format!("http://{}", sidecar.grpc_addr),
        engine_id: Some(engine_id.into()),
        ..KvBlocksConfig::default()
    })
}

/// A prefill and a decode engine on one sidecar (the decode pod's sidecar hands its
/// engine the lease under the prefill's name here), and an aggregated engine.
struct Pods {
    sidecar: Sidecar,
    prefill: RunningServer,
    decode: RunningServer,
    aggregated: RunningServer,
}

impl Pods {
    async fn start(sidecar_flags: &[&str]) -> Self {
        let sidecar = sidecar("http://127.0.0.1:9", sidecar_flags).await;
        Self {
            prefill: engine(on(&sidecar, "prefill-0")).await,
            decode: engine(on(&sidecar, "decode-0")).await,
            aggregated: engine(None).await,
            sidecar,
        }
    }

    fn blocks(&self) -> BlockClient {
        BlockClient::new(&format!("http://{}", self.sidecar.grpc_addr)).unwrap()
    }
}

/// 100 tokens: 6 full blocks and 4 more.
fn prompt(start: u32) -> Vec<u32> {
    (start..start + 100).collect()
}

fn hashes(tokens: &[u32]) -> Vec<SeqHash> {
    BlockHasher::new(16, "qwen", None).seq_hashes(&tokens[..(tokens.len() - 1) / 16 * 16])
}

fn ids(chain: &[SeqHash]) -> Value {
    json!(chain.iter().map(|h| h.0).collect::<Vec<_>>())
}

/// The client's request: 8 tokens of seed 5.
fn request(tokens: &[u32]) -> Value {
    json!({"model": "qwen", "prompt": tokens, "max_tokens": 8, "seed": 5})
}

async fn post(server: &RunningServer, path: &str, body: &Value, request_id: Option<&str>) -> Value {
    let mut post = reqwest::Client::new()
        .post(format!("http://{}{path}", server.http_addr))
        .json(body);
    if let Some(id) = request_id {
        post = post.header("x-request-id", id);
    }
    let response = post.send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// The prefill leg of `tokens`' request (as the decode pod's sidecar sends it).
async fn prefill(server: &RunningServer, tokens: &[u32], request_id: Option<&str>) -> Value {
    let body = prefill_body(request(tokens).as_object().unwrap());
    post(server, "/v1/completions", &body.into(), request_id).await
}

/// `tokens`' request with `params` as its `kv_transfer_params`.
async fn decode(server: &RunningServer, tokens: &[u32], params: &Value) -> Value {
    let mut body = request(tokens);
    body["kv_transfer_params"] = params.clone();
    post(server, "/v1/completions", &body, None).await
}

/// `tokens`' answer from the aggregated engine: what every decode must answer.
async fn reference(pods: &Pods, tokens: &[u32]) -> Value {
    post(&pods.aggregated, "/v1/completions", &request(tokens), None).await["choices"][0]["text"]
        .clone()
}

async fn labelled(server: &RunningServer, name: &str, label: &str, value: &str) -> f64 {
    metric(
        server,
        &format!("{name}{{model_name=\"qwen\",{label}=\"{value}\"}}"),
    )
    .await
}

async fn fallbacks(server: &RunningServer, reason: &str) -> f64 {
    labelled(
        server,
        "dynamo_mocker_kv_remote_prefill_fallbacks_total",
        "reason",
        reason,
    )
    .await
}

async fn lends(server: &RunningServer, outcome: &str) -> f64 {
    labelled(server, "dynamo_mocker_kv_lends_total", "outcome", outcome).await
}

#[tokio::test]
async fn a_prefill_lends_its_prompt_blocks_and_answers_with_their_lease() {
    let pods = Pods::start(&[]).await;
    let tokens = prompt(1);
    let chain = hashes(&tokens);
    assert_eq!(chain.len(), 6);
    let answer = prefill(&pods.prefill, &tokens, Some("req-1")).await;
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    assert_eq!(answer["usage"]["completion_tokens"], 1);
    assert_eq!(
        answer["kv_transfer_params"],
        json!({
            "do_remote_prefill": true, "do_remote_decode": false,
            "remote_block_ids": ids(&chain), "remote_engine_id": "prefill-0",
            "remote_request_id": "req-1", "remote_host": "127.0.0.1",
            "remote_port": pods.sidecar.grpc_addr.port(), "tp_size": 1,
            "remote_transport": "dynamo-kvblocks",
        })
    );
    assert_eq!(lends(&pods.prefill, "lent").await, 1.0);

    // The lease holds the prompt's blocks as the engine computes them; a fetch ends it.
    let mut client = pods.blocks();
    let blocks = client.fetch_lease("req-1", &chain).await.unwrap();
    assert_eq!(blocks.len(), 6);
    for (i, block) in blocks.iter().enumerate() {
        assert_eq!(block.hash, chain[i]);
        assert_eq!(block.parent, i.checked_sub(1).map(|p| chain[p]));
        assert_eq!(block.tokens, 16);
        assert_eq!(
            block.layout,
            Layout {
                block_bytes: BLOCK_BYTES,
                block_size: 16,
                layers: 24,
                dtype: "bfloat16".into()
            }
        );
        assert_eq!(block.payload, payload(chain[i], BLOCK_BYTES as usize));
    }
    let gone = client.fetch_lease("req-1", &chain).await.unwrap_err();
    assert!(gone.is_gone(), "{gone}");

    // Chat, without a request id: each prefill lends under a lease of its own.
    let chat = prefill_body(
        json!({"model": "qwen", "max_tokens": 8, "messages": [
            {"role": "user", "content": "tell me a long story about ".repeat(20)}]})
        .as_object()
        .unwrap(),
    );
    let mut leases = Vec::new();
    for _ in 0..2 {
        let answer = post(
            &pods.prefill,
            "/v1/chat/completions",
            &chat.clone().into(),
            None,
        )
        .await;
        let params = &answer["kv_transfer_params"];
        let full = (answer["usage"]["prompt_tokens"].as_u64().unwrap() - 1) / 16;
        assert_eq!(
            params["remote_block_ids"].as_array().unwrap().len() as u64,
            full
        );
        let lease = params["remote_request_id"].as_str().unwrap().to_owned();
        assert!(lease.starts_with("prefill-0-"), "{lease}");
        leases.push(lease);
    }
    assert_ne!(leases[0], leases[1]);
    assert_eq!(lends(&pods.prefill, "lent").await, 3.0);
}

#[tokio::test]
async fn a_decode_takes_the_lent_blocks_and_answers_as_an_aggregated_engine() {
    let pods = Pods::start(&[]).await;
    let tokens = prompt(1);
    let params = prefill(&pods.prefill, &tokens, Some("req-2")).await["kv_transfer_params"].clone();
    let answer = decode(&pods.decode, &tokens, &params).await;
    assert_eq!(
        answer["choices"][0]["text"],
        reference(&pods, &tokens).await
    );
    assert_eq!(answer["usage"]["completion_tokens"], 8);
    assert_eq!(
        answer["usage"]["prompt_tokens_details"]["cached_tokens"], 99,
        "every prompt token but the last came from the prefill, as vLLM counts them"
    );
    assert!(
        answer.get("kv_transfer_params").is_none(),
        "a decode lends nothing"
    );

    let d = &pods.decode;
    assert_eq!(metric(d, "dynamo_mocker_kv_lease_blocks_total").await, 6.0);
    assert_eq!(
        metric(d, "vllm:prompt_tokens_total").await,
        0.0,
        "nothing is prefilled here: the last prompt token is computed as a decode token"
    );
    assert_eq!(
        metric(d, "vllm:nixl_bytes_transferred_sum").await,
        6.0 * REAL_BLOCK_BYTES as f64
    );
    assert_eq!(metric(d, "vllm:nixl_xfer_time_seconds_count").await, 1.0);
    let modelled = 6.0 * REAL_BLOCK_BYTES as f64 / (LINK_GBPS * 1e9) / 10.0;
    let took = metric(d, "vllm:nixl_xfer_time_seconds_sum").await;
    assert!(
        took >= modelled,
        "{took} s covers the modelled {modelled} s"
    );
    let ttft = metric(d, "vllm:time_to_first_token_seconds_sum").await;
    assert!(ttft >= modelled, "TTFT {ttft} s includes the transfer");
    assert_eq!(metric(d, "vllm:nixl_num_failed_transfers_total").await, 0.0);
    assert_eq!(
        metric(d, "dynamo_mocker_kv_remote_prefill_fallbacks_total").await,
        0.0
    );

    // The decode's fetch ended the lease: the same parameters again find it gone (the
    // prompt is on the decode's GPU now, so nothing is recomputed but the tail).
    let again = decode(&pods.decode, &tokens, &params).await;
    assert_eq!(again["choices"][0]["text"], answer["choices"][0]["text"]);
    assert_eq!(fallbacks(d, "gone").await, 1.0);
    assert_eq!(metric(d, "vllm:nixl_num_failed_transfers_total").await, 1.0);
}

#[tokio::test]
async fn forged_mismatched_or_foreign_parameters_recompute_with_the_right_answer() {
    let pods = Pods::start(&[]).await;
    let d = &pods.decode;
    let recomputes = async |tokens: &[u32], params: &Value| {
        let answer = decode(d, tokens, params).await;
        assert_eq!(answer["choices"][0]["text"], reference(&pods, tokens).await);
        assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    };
    let x = prompt(1);
    let params = prefill(&pods.prefill, &x, Some("x")).await["kv_transfer_params"].clone();

    // A lease that was never lent.
    let mut forged = params.clone();
    forged["remote_request_id"] = json!("forged");
    recomputes(&prompt(2000), &forged).await;
    assert_eq!(fallbacks(d, "gone").await, 1.0);

    // Another prompt's lease: none of its blocks is this prompt's. The fetch still
    // ends the lease.
    recomputes(&prompt(3000), &params).await;
    assert_eq!(fallbacks(d, "mismatch").await, 1.0);
    let left = pods.blocks().fetch_lease("x", &hashes(&x)).await;
    assert!(left.unwrap_err().is_gone());

    // vLLM's NIXL parameters: the engines were to move the blocks themselves.
    let mut nixl = params.clone();
    nixl.as_object_mut().unwrap().remove("remote_transport");
    recomputes(&prompt(4000), &nixl).await;
    assert_eq!(fallbacks(d, "foreign_transport").await, 1.0);

    // No lease name.
    let mut nameless = params.clone();
    nameless
        .as_object_mut()
        .unwrap()
        .remove("remote_request_id");
    recomputes(&prompt(5000), &nameless).await;
    assert_eq!(fallbacks(d, "invalid").await, 1.0);

    assert_eq!(metric(d, "vllm:nixl_num_failed_transfers_total").await, 2.0);
    assert_eq!(metric(d, "dynamo_mocker_kv_lease_blocks_total").await, 0.0);

    // An engine without a sidecar.
    let y = prompt(6000);
    let params = prefill(&pods.prefill, &y, Some("y")).await["kv_transfer_params"].clone();
    let answer = decode(&pods.aggregated, &y, &params).await;
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(fallbacks(&pods.aggregated, "no_sidecar").await, 1.0);
}

#[tokio::test]
async fn an_expired_lease_recomputes() {
    let pods = Pods::start(&["--kv-lease-duration", "100ms"]).await;
    let tokens = prompt(1);
    let params = prefill(&pods.prefill, &tokens, Some("late")).await["kv_transfer_params"].clone();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = decode(&pods.decode, &tokens, &params).await;
    assert_eq!(
        answer["choices"][0]["text"],
        reference(&pods, &tokens).await
    );
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(fallbacks(&pods.decode, "gone").await, 1.0);
}

#[tokio::test]
async fn a_prefill_that_lends_nothing_answers_null_parameters() {
    // A lease budget smaller than one prompt's blocks (6 x 197 bytes).
    let pods = Pods::start(&["--kv-lease-bytes", "1000"]).await;
    let cases = [
        (&pods.prefill, prompt(1), "refused"),
        (&pods.prefill, (1..10).collect(), "empty"),
        (&pods.aggregated, prompt(1), "no_sidecar"),
    ];
    for (engine, tokens, outcome) in cases {
        let answer = prefill(engine, &tokens, None).await;
        assert_eq!(answer["choices"][0]["finish_reason"], "length", "{outcome}");
        assert_eq!(
            answer.get("kv_transfer_params"),
            Some(&Value::Null),
            "{outcome}: vLLM's answer after an abort"
        );
        assert_eq!(lends(engine, outcome).await, 1.0, "{outcome}");
    }
}

/// A port free now, for a server that must be named before it starts.
fn free_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], dynamo_server::free_port().unwrap()))
}

/// A pod: a mock engine behind its sidecar, each knowing the other's address, both
/// holding the graph's block API credential (the file `token`).
async fn pod(
    engine_id: &str,
    sidecar_flags: &[&str],
    token: &std::path::Path,
) -> (Sidecar, RunningServer) {
    let engine_addr = free_port();
    let mut flags = vec!["--block-api-token-file", token.to_str().unwrap()];
    flags.extend(sidecar_flags);
    let sidecar = sidecar(&format!("http://{engine_addr}"), &flags).await;
    let on = KvBlocksConfig {
        token_file: Some(token.into()),
        ..on(&sidecar, engine_id).unwrap()
    };
    let config = ServerConfig {
        model_path: format!("{}/.cache/models/qwen-mock", common::ROOT).into(),
        model_name: Some("qwen".into()),
        listen: engine_addr,
        kv_events_endpoint: None,
        engine: config(Some(on)),
        server: Default::default(),
        behaviour: Default::default(),
    };
    let engine = start(config, std::future::pending()).await.unwrap();
    (sidecar, engine)
}

/// Every block API call on the way (the prefill engine's lend, the decode sidecar's
/// fetch, the decode engine's) carries the graph's credential.
#[tokio::test]
async fn a_disaggregated_request_through_both_pods_sidecars() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("block-api-token");
    std::fs::write(&token, "graph-secret").unwrap();
    let (prefill_sidecar, prefill_engine) = pod("prefill-0", &[], &token).await;
    let peer = prefill_sidecar.proxy_addr.to_string();
    let block_port = prefill_sidecar.grpc_addr.port().to_string();
    let decode_flags = [
        "--prefill-peers",
        &peer,
        "--prefill-peer-grpc-port",
        &block_port,
    ];
    let (decode_sidecar, decode_engine) = pod("decode-0", &decode_flags, &token).await;
    let tokens = prompt(1);
    let response = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/completions",
            decode_sidecar.proxy_addr
        ))
        .header(PREFILLER_HEADER, &peer)
        .json(&request(&tokens))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-dynamo-prefill-hop"], "remote");
    let answer: Value = response.json().await.unwrap();
    let aggregated = engine(None).await;
    let expected = post(&aggregated, "/v1/completions", &request(&tokens), None).await;
    assert_eq!(answer["choices"][0]["text"], expected["choices"][0]["text"]);
    assert_eq!(
        answer["usage"]["prompt_tokens_details"]["cached_tokens"], 99,
        "every prompt token but the last came from the prefill, as vLLM counts them"
    );
    assert_eq!(lends(&prefill_engine, "lent").await, 1.0);
    assert_eq!(
        metric(&decode_engine, "dynamo_mocker_kv_lease_blocks_total").await,
        6.0
    );
    assert_eq!(
        metric(&decode_engine, "vllm:prompt_tokens_total").await,
        0.0,
        "the decode prefills nothing: the last prompt token is computed as a decode token"
    );
}
