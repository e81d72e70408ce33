//! The `dynamo-e2e` binary as a user runs it: tables on stdout, JSON and Markdown files,
//! clear refusals of bad flags.

use std::path::PathBuf;
use std::process::{Command, Output};

use dynamo_mocker::EngineConfig;
use dynamo_mocker::server::{ServerConfig, start};
use serde_json::Value;

fn dynamo_e2e<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dynamo-e2e"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("dynamo-e2e-cli-{}-{name}", std::process::id()))
}

const SMALL: [&str; 12] = [
    "--prefixes",
    "8",
    "--suffixes",
    "4",
    "--prefix-tokens",
    "128",
    "--unique-tokens",
    "16",
    "--output-tokens",
    "4",
    "--request-rate",
    "20",
];

#[test]
fn replay_compares_modes_and_writes_json_and_markdown() {
    let (json, md) = (scratch("replay.json"), scratch("replay.md"));
    let mut args = vec!["replay", "--num-gpu-blocks", "64", "--block-size", "16"];
    args.extend(SMALL);
    args.extend([
        "--out",
        json.to_str().unwrap(),
        "--markdown",
        md.to_str().unwrap(),
    ]);
    let out = dynamo_e2e(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    for row in [
        "| kv | 32 | 0 |",
        "| approx | 32 | 0 |",
        "| round-robin | 32 | 0 |",
    ] {
        assert!(stdout.contains(row), "{stdout}");
    }
    assert!(stdout.contains("| kv vs round-robin |"), "{stdout}");
    assert_eq!(std::fs::read_to_string(&md).unwrap(), stdout);

    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["kind"], "replay");
    let labels: Vec<&str> = doc["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["kv", "approx", "round-robin"]);
    assert_eq!(doc["runs"][0]["completed"], 32);
    assert!(doc["runs"][0]["ttft_ms"]["p90"].as_f64().unwrap() > 0.0);
    assert_eq!(doc["ratios"].as_array().unwrap().len(), 2);
    assert_eq!(doc["config"]["engine"]["num_gpu_blocks"], 64);
    let _ = std::fs::remove_file(json);
    let _ = std::fs::remove_file(md);
}

#[test]
fn bad_flags_are_refused_with_a_reason() {
    let out = dynamo_e2e(&["replay", "--prefixes", "2"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--request-rate"), "{stderr}");

    let out = dynamo_e2e(&["replay", "--request-rate", "1", "--modes", "kv,fastest"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown router mode \"fastest\""),
        "{stderr}"
    );

    let out = dynamo_e2e(&["replay", "--trace", "/nonexistent/trace.jsonl"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/trace.jsonl"));
}

#[tokio::test]
async fn bench_finds_the_model_and_reports_a_live_run() {
    let model_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/qwen-mock");
    assert!(
        model_path.join("tokenizer.json").exists(),
        "run `make model` first"
    );
    let server = start(
        ServerConfig {
            model_path,
            model_name: Some("qwen".into()),
            listen: "127.0.0.1:0".parse().unwrap(),
            kv_events_endpoint: None,
            engine: EngineConfig {
                speedup_ratio: 10.0,
                ..EngineConfig::default()
            },
            server: Default::default(),
        },
        std::future::pending(),
    )
    .await
    .unwrap();
    let url = format!("http://{}", server.http_addr);
    let json = scratch("bench.json");
    let mut args = vec!["bench", "--url", &url, "--out", json.to_str().unwrap()];
    args.extend(&SMALL[..10]);
    args.extend(["--concurrency", "4"]);
    // The server runs on this test's runtime, so the binary runs off it.
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || dynamo_e2e(&args))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let run = &doc["runs"][0];
    assert_eq!(
        (run["completed"].as_u64(), run["errors"].as_u64()),
        (Some(32), Some(0))
    );
    assert_eq!(run["output_tokens"], 32 * 4);
    assert!(run["kv_hit_rate"].as_f64().unwrap() > 0.0, "{run}");
    assert!(
        doc["title"]
            .as_str()
            .unwrap()
            .contains("4 requests in flight")
    );
    let _ = std::fs::remove_file(json);
}
