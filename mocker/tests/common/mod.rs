//! Starting a mock engine server for a test, and reading its metrics.
#![allow(dead_code)] // each test binary uses its own part of this

use std::path::PathBuf;

use dynamo_mocker::EngineConfig;
use dynamo_mocker::server::{ModelBehaviour, RunningServer, ServerConfig, start};

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
