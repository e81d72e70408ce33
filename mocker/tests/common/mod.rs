//! Starting a mock engine server for a test, calling its HTTP API and reading its metrics.
#![allow(dead_code)] // each test binary uses its own part of this

use std::path::PathBuf;

use dynamo_mocker::EngineConfig;
use dynamo_mocker::server::{ModelBehaviour, RunningServer, ServerConfig, start};
use serde_json::Value;

/// The repository root, where `make model` and `make pyenv` put their output.
pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// A server for model `qwen` on a free loopback port, KV events on a free port too.
pub async fn serve(engine: EngineConfig) -> RunningServer {
    serve_playing(engine, ModelBehaviour::default()).await
}

/// [`serve`], the engine playing a model that thinks or calls tools as `behaviour` says.
pub async fn serve_playing(engine: EngineConfig, behaviour: ModelBehaviour) -> RunningServer {
    let model_path = PathBuf::from(ROOT).join(".cache/models/qwen-mock");
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
        behaviour,
    };
    start(config, std::future::pending())
        .await
        .expect("server starts")
}

/// The sum of every sample on `server`'s `/metrics` whose line starts with `name`.
pub async fn metric(server: &RunningServer, name: &str) -> f64 {
    let text = reqwest::get(format!("http://{}/metrics", server.http_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// POSTs `body` as JSON to `path`; the status and the JSON answer.
pub async fn post(server: &RunningServer, path: &str, body: &Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("http://{}{path}", server.http_addr))
        .json(body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// A streamed answer's frames: the JSON chunks, and whether `[DONE]` came last, once.
pub async fn stream(server: &RunningServer, path: &str, body: &Value) -> Vec<Value> {
    let text = reqwest::Client::new()
        .post(format!("http://{}{path}", server.http_addr))
        .json(body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let frames: Vec<&str> = text
        .split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| f.strip_prefix("data: ").unwrap())
        .collect();
    assert_eq!(frames.last(), Some(&"[DONE]"), "{text}");
    assert_eq!(frames.iter().filter(|f| **f == "[DONE]").count(), 1);
    frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(f).unwrap())
        .collect()
}
