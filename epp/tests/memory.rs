//! The picker's memory under oversized requests, measured on the real `dynamo-epp`
//! binary as a child process (in-process, the test harness's own allocations would
//! share the RSS): bodies over the limit, bodies just under it whose prompt cannot fit,
//! and prompts long enough to need the token bound, ten in all, leave the picker within
//! twice its idle RSS, and requests that fit are served before and after.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// The picker binary, stopped when dropped.
struct Picker {
    child: Child,
    base: String,
}

impl Picker {
    fn start(file: &EndpointsFile) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_dynamo-epp"))
            .arg("--model-path")
            .arg(model_dir())
            .arg("--endpoints-file")
            .arg(&file.0)
            .args(["--host", "127.0.0.1", "--http-port", &port.to_string()])
            .args(["--ext-proc-port", "0", "--router-mode", "round-robin"])
            .args(["--block-size", &BLOCK_SIZE.to_string()])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("the picker binary starts");
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Resident memory in kB (`VmRSS` of `/proc/PID/status`).
    fn rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }
}

impl Drop for Picker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chat_body(content: &str) -> Vec<u8> {
    chat(content, 8, false).to_string().into_bytes()
}

/// Sends `body` and returns the status and OpenAI error code (if any).
async fn send(http: &reqwest::Client, picker: &Picker, body: Vec<u8>) -> (u16, Value) {
    let response = http
        .post(format!("{}/v1/chat/completions", picker.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("an answer, not a reset");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_leave_the_picker_near_its_idle_memory() {
    let pod = Pod::start().await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry()]);
    let picker = Picker::start(&file);
    let http = reqwest::Client::new();
    eventually("the picker to serve", || async {
        http.get(format!("{}/health", picker.base))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    for i in 0..5 {
        let (status, body) = send(&http, &picker, chat_body(&text(50, i))).await;
        assert_eq!(status, 200, "{body}");
    }
    let idle = picker.rss_kb();

    let model = model();
    let limit = model.max_prompt_bytes().unwrap() + (1 << 20);
    let framing = chat_body("").len();
    let cases = [
        // Over the body limit: 413 before the body is even read.
        (20_000_000, 413, None),
        (20_000_000, 413, None),
        (20_000_000, 413, None),
        // Just under it: parsed and rendered, then too long for the context by its bytes.
        (limit - framing - 64, 400, Some("context_length_exceeded")),
        (limit - framing - 64, 400, Some("context_length_exceeded")),
        (limit - framing - 64, 400, Some("context_length_exceeded")),
        // 1 MB of prose: few enough bytes per token to need the segmentation bound.
        (1_000_000, 400, Some("context_length_exceeded")),
        (1_000_000, 400, Some("context_length_exceeded")),
        (1_000_000, 400, Some("context_length_exceeded")),
        (1_000_000, 400, Some("context_length_exceeded")),
    ];
    for (i, (bytes, status, code)) in cases.into_iter().enumerate() {
        let mut content = text(bytes / 4, i as u64);
        content.truncate(bytes);
        let (got, error) = send(&http, &picker, chat_body(&content)).await;
        assert_eq!(got, status, "case {i}: {error}");
        assert_eq!(error["error"]["code"].as_str(), code, "case {i}: {error}");
        assert!(error["error"]["message"].is_string(), "case {i}: {error}");
    }
    // What the refused requests allocated is handed back once they are done.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = picker.rss_kb();
    eprintln!("picker RSS: idle {idle} kB, after 10 oversized requests {after} kB");
    assert!(after <= 2 * idle, "RSS grew from {idle} kB to {after} kB");
    let (status, body) = send(&http, &picker, chat_body("still serving?")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(pod.served().await, 6);
}
