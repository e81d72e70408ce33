//! The official `openai` Python package (installed by `make pyenv`) as the client.

use std::path::PathBuf;
use std::process::Command;

mod common;

use common::{ROOT, serve};
use dynamo_mocker::EngineConfig;

/// Runs `script` with the venv's Python against a fresh mock engine serving `qwen`;
/// the script prints `ok_line` when every check passed.
async fn run_checks(script: PathBuf, ok_line: &str) {
    let python = PathBuf::from(ROOT).join(".cache/venv/bin/python");
    assert!(
        python.exists(),
        "run `make pyenv` first (installs the openai client)"
    );
    let server = serve(EngineConfig::default()).await;
    let base_url = format!("http://{}/v1", server.http_addr);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
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
    assert!(String::from_utf8_lossy(&out.stdout).contains(ok_line));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_official_openai_client_chats_whole_and_streamed() {
    run_checks(
        PathBuf::from(ROOT).join("scripts/openai_checks.py"),
        "openai checks: ok",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_official_openai_client_reads_stops_logprobs_and_n_answers() {
    run_checks(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_sampling_checks.py"),
        "openai sampling checks: ok",
    )
    .await;
}
