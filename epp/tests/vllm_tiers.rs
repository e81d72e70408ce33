//! Blocks a vLLM engine keeps in its own CPU tier draw requests to its pod as blocks in
//! GPU memory do: the engine's KV events (vLLM's wire format, `medium` CPU, and the
//! hash-only form vLLM 0.33's offloading connector writes) go through a real sidecar's
//! relay to the picker over real sockets. (`connectors/python/tests/test_events.py`
//! checks the relay against vLLM's own publisher.)

mod common;

use bytes::Bytes;
use clap::Parser;
use common::*;
use dynamo_kvcache::BlockHasher;
use dynamo_kvcache::vllm_events::{KvEvent as EngineEvent, KvEventBatch, encode_message};
use dynamo_llm::openai::ChatCompletionRequest;
use dynamo_zmtp::{Options, Pub};
use serde_json::json;

fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>, medium: &str) -> EngineEvent {
    EngineEvent::BlockStored {
        block_hashes: hashes.to_vec(),
        parent_hash: parent,
        block_size: if tokens.is_empty() {
            0
        } else {
            BLOCK_SIZE as u32
        },
        token_ids: tokens,
        lora_id: None,
        medium: Some(medium.into()),
        lora_name: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_in_a_vllm_engines_cpu_tier_routes_to_its_pod() {
    let pods = [Pod::start().await, Pod::start().await];
    // Pod 1's engine publishes its KV events to a real sidecar.
    let engine = Pub::bind(&"tcp://127.0.0.1:0".parse().unwrap(), Options::default())
        .await
        .unwrap();
    let engine_url = format!("http://{}", pods[1].address);
    let endpoint = engine.endpoint().to_string();
    let sidecar_config = dynamo_sidecar::Config::parse_from([
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
        &engine_url,
        "--engine-kv-events",
        &endpoint,
        "--model-name",
        MODEL,
        "--block-size",
        "16",
    ]);
    let sidecar = dynamo_sidecar::Sidecar::start(&sidecar_config)
        .await
        .unwrap();
    engine.wait_subscribers(1).await;
    let file = EndpointsFile::new();
    let holder = json!({"address": pods[1].address.to_string(), "kv_events": format!("http://{}", sidecar.grpc_addr)});
    file.write(&[pods[0].entry(), holder]);
    let epp = dynamo_epp::start(config(&file, Default::default()))
        .await
        .unwrap();
    eventually("2 endpoints", || async {
        epp.router.endpoints().len() == 2
    })
    .await;

    let preamble = text(300, 5);
    let earlier = chat(&format!("{preamble} first question"), 2, false);
    let request: ChatCompletionRequest = serde_json::from_value(earlier).unwrap();
    let tokens = model().prepare_chat(&request).unwrap().token_ids;
    let blocks = tokens.len() / BLOCK_SIZE;
    // vLLM's own block hashes, opaque to us.
    let theirs: Vec<u64> = (0..blocks as u64).map(|i| 0x5000 + i).collect();
    let mut events = vec![stored(
        &theirs,
        None,
        tokens[..blocks * BLOCK_SIZE].to_vec(),
        "GPU",
    )];
    // Offloaded to vLLM's CPU tier, the first half with tokens, the rest by hash alone,
    // then evicted from GPU memory.
    let half = blocks / 2;
    events.push(stored(
        &theirs[..half],
        None,
        tokens[..half * BLOCK_SIZE].to_vec(),
        "CPU",
    ));
    for &h in &theirs[half..] {
        events.push(stored(&[h], None, Vec::new(), "CPU"));
    }
    events.push(EngineEvent::BlockRemoved {
        block_hashes: theirs.clone(),
        medium: Some("GPU".into()),
    });
    let batch = KvEventBatch {
        ts: 0.0,
        events,
        dp_rank: None,
    };
    let frames = encode_message(b"", 0, &batch).map(Bytes::from);
    engine.send(&frames);

    let ours = BlockHasher::new(BLOCK_SIZE, MODEL, None).seq_hashes(&tokens);
    eventually("the picker to index pod 1's host-tier blocks", || async {
        epp.router
            .endpoints()
            .iter()
            .any(|e| e.spec.address == pods[1].address && e.blocks == ours.len())
    })
    .await;

    let http = reqwest::Client::new();
    for question in ["second question", "a third one"] {
        let before = pods[1].served().await;
        let answer = http
            .post(format!("http://{}/v1/chat/completions", epp.http_addr))
            .json(&chat(&format!("{preamble} {question}"), 2, false))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(
            pods[1].served().await,
            before + 1,
            "{question} went to pod 1"
        );
    }
    let metrics = http
        .get(format!("http://{}/metrics", epp.http_addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let matched = sum_metric(&metrics, "dynamo_epp_matched_blocks_total");
    let prompt = sum_metric(&metrics, "dynamo_epp_prompt_blocks_total");
    assert!(
        matched * 10 >= prompt * 8,
        "most blocks hit, in the host tier: {matched} of {prompt}"
    );
}
