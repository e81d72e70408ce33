//! The official `openai` Python package (installed by `make pyenv`) as the client.

use std::path::PathBuf;
use std::process::Command;

use dynamo_mocker::EngineConfig;
use dynamo_mocker::server::{ServerConfig, start};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

#[tokio::test(flavor = "multi_thread")]
async fn the_official_openai_client_chats_whole_and_streamed() {
    let python = PathBuf::from(ROOT).join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "run `make pyenv` first (installs the openai client)"
    );
    let server = start(
        ServerConfig {
            model_path: PathBuf::from(ROOT).join(".cache/models/qwen-mock"),
            model_name: Some("qwen".into()),
            listen: "127.0.0.1:0".parse().unwrap(),
            kv_events_endpoint: None,
            engine: EngineConfig::default(),
        },
        std::future::pending(),
    )
    .await
    .expect("server starts");
    let base_url = format!("http://{}/v1", server.http_addr);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/openai_client.py"
            ))
            .args([base_url.as_str(), "qwen"])
            .output()
            .expect("python runs")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("openai client: ok"));
}
