//! The official `openai` Python package (installed by `make pyenv`) as the client.

use std::path::PathBuf;
use std::process::Command;

mod common;

use common::{ROOT, serve};
use dynamo_mocker::EngineConfig;

#[tokio::test(flavor = "multi_thread")]
async fn the_official_openai_client_chats_whole_and_streamed() {
    let python = PathBuf::from(ROOT).join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "run `make pyenv` first (installs the openai client)"
    );
    let server = serve(EngineConfig::default()).await;
    let base_url = format!("http://{}/v1", server.http_addr);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(PathBuf::from(ROOT).join("scripts/openai_checks.py"))
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
    assert!(String::from_utf8_lossy(&out.stdout).contains("openai checks: ok"));
}
