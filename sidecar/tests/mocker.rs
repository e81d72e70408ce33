//! The sidecar beside the real mock engine (`dynamo-mocker`), which serves vLLM's HTTP
//! API and publishes vLLM's ZMQ KV events: the proxy carries its SSE streams, and the
//! relay's hashes equal the engine's own, which the mocker computes with the same
//! `BlockHasher` salted by its served model name.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use dynamo_kvcache::KvEvent;
use dynamo_kvstream::PodUpdate;
use dynamo_mocker::EngineConfig;
use dynamo_mocker::server::{RunningServer, ServerConfig, start};
use serde_json::json;

async fn mocker() -> RunningServer {
    mocker_with(EngineConfig {
        block_size: 16,
        speedup_ratio: 100.0,
        ..EngineConfig::default()
    })
    .await
}

async fn mocker_with(engine: EngineConfig) -> RunningServer {
    let model_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/qwen-mock");
    assert!(
        model_path.join("tokenizer.json").exists(),
        "run `make model` first"
    );
    let config = ServerConfig {
        model_path,
        model_name: Some("qwen".into()),
        listen: "127.0.0.1:0".parse().unwrap(),
        kv_events_endpoint: Some("tcp://127.0.0.1:0".into()),
        engine,
        server: Default::default(),
        behaviour: Default::default(),
    };
    start(config, std::future::pending()).await.unwrap()
}

#[tokio::test]
async fn relayed_mocker_events_carry_the_engines_own_hashes() {
    let engine = mocker().await;
    let engine_url = format!("http://{}", engine.http_addr);
    // No --model-name: the sidecar asks the engine for its served model name.
    let sidecar = sidecar_with(
        &engine_url,
        engine.kv_events_endpoint.as_deref(),
        None,
        &["--model-name", ""],
    )
    .await;
    eventually("the sidecar is ready", || async {
        reqwest::get(format!("http://{}/ready", sidecar.metrics_addr))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    let mut follower = Follower::start(sidecar.grpc_addr);
    assert_eq!(follower.snapshot().await, vec![]);

    // A subscription is live a moment after it connects, so a first batch may be lost
    // (and reported as a gap): ask until one arrives.
    let client = reqwest::Client::new();
    let mut stored = None;
    for attempt in 0..20 {
        let prompt = (0..80)
            .map(|i| format!("w{attempt}x{i}"))
            .collect::<Vec<_>>();
        let body = json!({
            "model": "qwen",
            "stream": true,
            "max_tokens": 3,
            "messages": [{"role": "user", "content": prompt.join(" ")}],
        });
        let mut response = client
            .post(format!("http://{}/v1/chat/completions", sidecar.proxy_addr))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut sse = String::new();
        read_until(&mut response, &mut sse, "data: [DONE]").await;
        if let Ok(update) = tokio::time::timeout(Duration::from_secs(2), follower.next()).await {
            stored = Some(update);
            break;
        }
    }
    let Some(PodUpdate::Event(KvEvent::Stored { blocks, .. }, _)) = stored else {
        panic!("expected a stored event, got {stored:?}");
    };
    assert!(
        blocks.len() >= 2,
        "an 80-word prompt fills several 16-token blocks"
    );
    for block in &blocks {
        assert_eq!(block.seq_hash.0, block.engine_hash, "{blocks:?}");
    }

    // The engine's own metrics through the proxy port.
    let metrics = reqwest::get(format!("http://{}/metrics", sidecar.proxy_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("vllm:num_requests_running"), "{metrics}");
}

#[tokio::test]
async fn the_model_card_serves_the_engines_files_name_and_block_size() {
    let engine = mocker().await;
    let model_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/qwen-mock");
    let source = model_dir.to_str().unwrap();
    // No --model-name and a block size flag the engine contradicts: the engine's own
    // /v1/models and metrics win.
    let sidecar = sidecar_with(
        &format!("http://{}", engine.http_addr),
        None,
        None,
        &[
            "--model-name",
            "",
            "--model-source",
            source,
            "--block-size",
            "64",
        ],
    )
    .await;
    let base = format!("http://{}/model_card", sidecar.metrics_addr);
    let card: dynamo_llm::model_card::ModelCard =
        reqwest::get(&base).await.unwrap().json().await.unwrap();
    assert_eq!(card.name, "qwen");
    assert_eq!(card.block_size, Some(16));
    assert_eq!(
        card,
        dynamo_llm::model_card::ModelCard::read(&model_dir, "qwen", Some(16)).unwrap()
    );

    let tokenizer = reqwest::get(format!("{base}/files/tokenizer.json"))
        .await
        .unwrap();
    assert_eq!(tokenizer.status(), 200);
    assert_eq!(
        tokenizer.bytes().await.unwrap(),
        std::fs::read(model_dir.join("tokenizer.json")).unwrap()
    );
    for refused in ["..%2Fconfig.json", "weights.safetensors"] {
        let response = reqwest::get(format!("{base}/files/{refused}"))
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{refused}");
    }

    // A Hugging Face id the engine has not downloaded: not yet.
    let waiting = sidecar_with(
        &format!("http://{}", engine.http_addr),
        None,
        None,
        &[
            "--model-source",
            "Qwen/Qwen3-0.6B",
            "--hf-home",
            "/nonexistent",
        ],
    )
    .await;
    let response = reqwest::get(format!("http://{}/model_card", waiting.metrics_addr))
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
}

/// The mocker offloads what it evicts from its small GPU pool into the sidecar's host
/// tier and onboards it back when the prompt returns; the pod's event stream shows the
/// blocks in host memory, so a picker credits them.
#[tokio::test]
async fn evicted_blocks_come_back_from_the_sidecars_host_tier() {
    let grpc_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let engine = mocker_with(EngineConfig {
        block_size: 16,
        num_gpu_blocks: 48,
        speedup_ratio: 100.0,
        kv_blocks: Some(dynamo_mocker::kv_blocks::KvBlocksConfig {
            url: format!("http://127.0.0.1:{grpc_port}"),
            bytes_scale: 0.001,
            ..Default::default()
        }),
        ..EngineConfig::default()
    })
    .await;
    let grpc_port = grpc_port.to_string();
    let sidecar = sidecar_with(
        &format!("http://{}", engine.http_addr),
        engine.kv_events_endpoint.as_deref(),
        None,
        &[
            "--model-name",
            "qwen",
            "--grpc-port",
            &grpc_port,
            "--kv-host-bytes",
            "64MiB",
        ],
    )
    .await;
    let mut follower = Follower::start(sidecar.grpc_addr);
    let mut view = View::new();
    view.apply(&follower.next().await);

    let client = reqwest::Client::new();
    let complete = |words: String| {
        let client = client.clone();
        let url = format!("http://{}/v1/completions", sidecar.proxy_addr);
        async move {
            let body = json!({"model": "qwen", "prompt": words, "max_tokens": 1});
            let reply: serde_json::Value = client
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert!(reply["error"].is_null(), "{reply}");
            reply["usage"].clone()
        }
    };
    let prompt = |tag: &str| {
        (0..100)
            .map(|i| format!("{tag}{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    complete(prompt("a")).await;
    // Two other prompts (about 22 blocks each) push the first one's out of the GPU pool.
    complete(prompt("b")).await;
    complete(prompt("c")).await;
    eventually("the first prompt's blocks reach the host tier", || async {
        metric(&sidecar, "kvbm_offload_blocks_d2h_total", "").await >= 8.0
    })
    .await;
    let usage = complete(prompt("a")).await;
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 8 * 16, "onboarded instead of recomputed: {usage}");
    assert!(metric(&sidecar, "kvbm_onboard_blocks_h2d_total", "").await >= 8.0);

    eventually("the picker sees blocks in host memory", || {
        while let Some(update) = follower.try_next() {
            view.apply(&update);
        }
        let in_host = view
            .chains()
            .iter()
            .flat_map(|e| match e {
                KvEvent::Stored { blocks, .. } => blocks.clone(),
                _ => vec![],
            })
            .any(|b| b.tier == dynamo_kvcache::Tier::Host);
        async move { in_host }
    })
    .await;
}
