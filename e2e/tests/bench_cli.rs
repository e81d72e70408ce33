//! The `dynamo-e2e` binary as a user runs it: tables on stdout, JSON and Markdown files,
//! clear refusals of bad flags.

use std::path::PathBuf;
use std::process::{Command, Output};

use dynamo_mocker::EngineConfig;
use dynamo_mocker::server::{ServerConfig, start};
use serde_json::{Value, json};

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
fn replay_reports_conversations_per_turn() {
    let out = dynamo_e2e(&[
        "replay",
        "--sessions",
        "6",
        "--turns",
        "3",
        "--session-prefix-tokens",
        "100",
        "--turn-tokens",
        "40",
        "--output-tokens",
        "4",
        "--think-time-s",
        "0.5",
        "--block-size",
        "16",
        "--modes",
        "kv,round-robin",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    for row in [
        "conversations: 6 sessions x 3 turns",
        "all sessions at once",
        "| kv | 18 | 0 |",
        "| kv | 1 | 6 | 0 |",
        "| round-robin | 2-3 | 12 | 0 |",
        "| kv vs round-robin | ",
        "baseline later-turn TTFT p50 / run's",
    ] {
        assert!(stdout.contains(row), "{row}: {stdout}");
    }
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
            behaviour: Default::default(),
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

#[tokio::test]
async fn a_live_rate_sweep_sends_each_rate_its_own_prompts() {
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
            behaviour: Default::default(),
        },
        std::future::pending(),
    )
    .await
    .unwrap();
    let url = format!("http://{}", server.http_addr);
    let json = scratch("sweep.json");
    let records = scratch("sweep.jsonl");
    let mut args = vec!["bench", "--url", &url, "--out", json.to_str().unwrap()];
    args.extend(&SMALL[..10]);
    args.extend([
        "--request-rate",
        "40,80",
        "--records",
        records.to_str().unwrap(),
    ]);
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || dynamo_e2e(&args))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("#### 40 req/s") && stdout.contains("#### 80 req/s"),
        "{stdout}"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (run, rate) in runs.iter().zip([40.0, 80.0]) {
        assert_eq!(run["request_rate"], rate);
        assert_eq!(
            (run["completed"].as_u64(), run["errors"].as_u64()),
            (Some(32), Some(0))
        );
        // 8 prefixes of 128 tokens, 4 requests each, 144-token prompts: at most 3 of 4
        // requests per prefix find its 128 tokens cached (2/3 of all prompt tokens) when
        // the prompts are new to the engine; the first rate's prompts again would hit
        // 8/9 of them.
        let hit = run["kv_hit_rate"].as_f64().unwrap();
        assert!(hit <= 0.67, "{run}");
    }
    // One line per request, each rate's in turn, timed as the run's tables are.
    let lines: Vec<Value> = std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 64);
    for (k, line) in lines.iter().enumerate() {
        let rate = if k < 32 { 40.0 } else { 80.0 };
        assert_eq!(
            (&line["run"], &line["request_rate"]),
            (&json!(url), &json!(rate))
        );
        assert_eq!(
            (&line["output_tokens"], &line["error"]),
            (&json!(4), &Value::Null)
        );
        let (ttft, e2e) = (
            line["ttft_ms"].as_f64().unwrap(),
            line["e2e_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < ttft && ttft <= e2e, "{line}");
        assert!(line["mean_itl_ms"].as_f64().unwrap() > 0.0, "{line}");
    }
    let sent = |k: usize| lines[k]["sent_ms"].as_f64().unwrap();
    assert!(
        sent(31) > sent(0) && sent(63) > sent(32),
        "each run's own clock"
    );
    let _ = std::fs::remove_file(json);
    let _ = std::fs::remove_file(records);
}

// KV block tiers in the replay (`--tiers`).

/// 6 conversations of 3 turns (2,048-token first prompts) on one engine of 400 blocks
/// of 16 tokens: the GPU loses each conversation before its next turn.
const CONVERSATIONS: [&str; 22] = [
    "replay",
    "--sessions",
    "6",
    "--turns",
    "3",
    "--session-prefix-tokens",
    "2048",
    "--turn-tokens",
    "256",
    "--output-tokens",
    "4",
    "--think-time-s",
    "0.5",
    "--request-rate",
    "10",
    "--arrival",
    "fixed",
    "--workers",
    "1",
    "--num-gpu-blocks",
    "400",
    "--block-size=16",
];

#[test]
fn tier_configs_are_compared_with_blocks_sized_from_the_models_config() {
    // Qwen2.5-0.5B's KV geometry: 24 layers x 2 KV heads x 64 x bfloat16, K and V:
    // 12,288 bytes a token, 196,608 a block of 16.
    let model = scratch("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(
        model.join("config.json"),
        r#"{"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "torch_dtype": "bfloat16"}"#,
    )
    .unwrap();
    let json = scratch("tiers.json");
    let mut args = CONVERSATIONS.to_vec();
    let (model_arg, json_arg) = (model.display().to_string(), json.display().to_string());
    args.extend([
        "--modes",
        "kv",
        "--tiers",
        "off,host=256MiB,host=100KB,host=64MiB+disk=1GB",
        "--model-path",
        &model_arg,
        "--out",
        &json_arg,
    ]);
    let out = dynamo_e2e(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    for row in [
        "KV tiers per engine, blocks of 196608 bytes",
        "| run | TTFT p50 | TTFT p90 | turns 2+ TTFT p50 |",
        "| off | 18 | 0 |",
        "| host=256MiB | 18 | 0 |",
        "| host=256MiB vs off | ",
        "| host=64MiB+disk=1GB | 2-3 | 12 | 0 |",
    ] {
        assert!(stdout.contains(row), "{row}: {stdout}");
    }
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["config"]["tiers"]["block_bytes"], 196_608);
    assert_eq!(doc["config"]["tiers"]["kv_disk_min_reuse"], 2);
    let runs = doc["runs"].as_array().unwrap();
    let labels: Vec<&str> = runs.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        ["off", "host=256MiB", "host=100KB", "host=64MiB+disk=1GB"]
    );
    let later_p50 = |r: &Value| {
        let later = r["turns"].as_array().unwrap().last().unwrap();
        assert_eq!(later["first_turn"], 2);
        later["ttft_ms"]["p50"].as_f64().unwrap()
    };
    // Off: no tier figures. Host memory: later turns onboard and start sooner.
    assert!(runs[0].get("tiers").is_none());
    let host = &runs[1]["tiers"];
    assert!(
        host["onboarded_blocks"]["host"].as_u64().unwrap() > 0,
        "{host}"
    );
    assert!(later_p50(&runs[1]) < 0.8 * later_p50(&runs[0]));
    assert!(runs[1]["kv_hit_rate"].as_f64() > runs[0]["kv_hit_rate"].as_f64());
    // 100 KB holds no block of 196,608 bytes: the same figures as off.
    let tiny = &runs[2];
    assert_eq!(tiny["tiers"]["onboarded_blocks"]["host"], 0);
    for key in ["ttft_ms", "turns", "kv_hit_rate", "duration_s"] {
        assert_eq!(tiny[key], runs[0][key], "{key}");
    }
    // The ratios are against the first config.
    let ratios = doc["ratios"].as_array().unwrap();
    assert!(ratios.iter().all(|r| r["baseline"] == "off"));
    std::fs::remove_dir_all(&model).ok();
    std::fs::remove_file(&json).ok();
}

#[test]
fn tier_flags_are_checked() {
    let refused = |extra: &[&str], why: &str| {
        let mut args = CONVERSATIONS.to_vec();
        args.extend(extra);
        let out = dynamo_e2e(&args);
        assert!(!out.status.success(), "{extra:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(why), "{extra:?}: {stderr}");
    };
    refused(&["--tiers", "gpu=1GB"], "tiers are host, disk and object");
    refused(&["--tiers", "host"], "a tier is host=SIZE");
    refused(&["--tiers", "host=1GB+host=2GB"], "names host twice");
    refused(&["--tiers", "host=1XB"], "unknown unit");
    refused(
        &["--tiers", "host=1GB", "--model-path", "/nonexistent/model"],
        "/nonexistent/model/config.json",
    );
    refused(
        &["--tiers", "host=1GB", "--kv-block-bytes", "0"],
        "--kv-block-bytes must be positive",
    );
    // Tiers are simulated for conversations only.
    let out = dynamo_e2e(&["replay", "--request-rate", "5", "--tiers", "off,host=1GB"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --sessions"));
    // Plain bytes and a block size given outright, several router modes: labelled
    // by both.
    let mut args = CONVERSATIONS.to_vec();
    args.extend([
        "--tiers",
        "off,host=2000000000",
        "--kv-block-bytes",
        "192KiB",
        "--modes",
        "kv,round-robin",
    ]);
    let out = dynamo_e2e(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    for row in [
        "blocks of 196608 bytes",
        "| kv off | 18 |",
        "| round-robin host=2000000000 | 18 |",
        "| round-robin host=2000000000 vs kv off |",
    ] {
        assert!(stdout.contains(row), "{row}: {stdout}");
    }
}

// Aggregated and disaggregated graphs in the replay (`--topology`).

/// 24 prompts of 1,000 tokens that share nothing, 8 tokens out, blocks of 16 tokens.
const PREFILL_HEAVY: [&str; 15] = [
    "replay",
    "--prefixes",
    "24",
    "--suffixes",
    "1",
    "--prefix-tokens",
    "0",
    "--unique-tokens",
    "1000",
    "--output-tokens",
    "8",
    "--block-size",
    "16",
    "--modes",
    "kv",
];

#[test]
fn topologies_are_compared_across_a_rate_sweep() {
    // Qwen2.5-0.5B's KV: 12,288 bytes a token, 196,608 a block of 16.
    let model = scratch("disagg-model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(
        model.join("config.json"),
        r#"{"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "torch_dtype": "bfloat16"}"#,
    )
    .unwrap();
    let (json, md) = (scratch("disagg.json"), scratch("disagg.md"));
    let mut args = PREFILL_HEAVY.to_vec();
    let (model_arg, json_arg, md_arg) = (
        model.display().to_string(),
        json.display().to_string(),
        md.display().to_string(),
    );
    args.extend([
        "--topology",
        "agg:2,1p1d",
        "--request-rate",
        "5,20",
        "--kv-link-bandwidth-gbps",
        "10",
        "--model-path",
        &model_arg,
        "--out",
        &json_arg,
        "--markdown",
        &md_arg,
    ]);
    let out = dynamo_e2e(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    for row in [
        "poisson arrivals at 5, 20 req/s",
        "graphs agg:2, 1p1d, engines of 16384 blocks of 16 tokens",
        "disaggregated KV over 10 GB/s links, blocks of 196608 bytes",
        "#### 5 req/s",
        "#### 20 req/s",
        "| agg:2 | 24 | 0 |",
        "| 1p1d | 24 | 0 |",
        "| 1p1d vs agg:2 |",
        "| 5 | agg:2 | 2 agg |",
        "| 20 | 1p1d | 1P + 1D |",
        "highest req/s with TTFT p99 <= 500 ms and ITL p99 <= 50 ms",
    ] {
        assert!(stdout.contains(row), "{row}: {stdout}");
    }
    assert_eq!(std::fs::read_to_string(&md).unwrap(), stdout);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["config"]["topologies"]["block_bytes"], 196_608);
    assert_eq!(
        doc["config"]["request_rates"],
        serde_json::json!([5.0, 20.0])
    );
    let runs = doc["runs"].as_array().unwrap();
    let shape: Vec<(&str, f64)> = runs
        .iter()
        .map(|r| {
            (
                r["label"].as_str().unwrap(),
                r["request_rate"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("agg:2", 5.0),
            ("1p1d", 5.0),
            ("agg:2", 20.0),
            ("1p1d", 20.0)
        ]
    );
    for r in runs {
        assert_eq!(
            (r["completed"].as_u64(), r["errors"].as_u64()),
            (Some(24), Some(0))
        );
        let d = &r["disagg"];
        assert_eq!(d["engines"], 2);
        assert_eq!(d["gpus"], 2);
        let per_gpu = d["output_tokens_per_s_per_gpu"].as_f64().unwrap();
        assert!((per_gpu * 2.0 - r["output_tokens_per_s"].as_f64().unwrap()).abs() < 1e-6);
    }
    // Every prompt's 62 full blocks cross a 10 GB/s link: 1.2 ms each, or longer when
    // a link is busy.
    let dis = &runs[1]["disagg"];
    assert_eq!(dis["kv_bytes_moved"], 24 * 62 * 196_608);
    assert_eq!(dis["link_bandwidth_gbps"], 10.0);
    assert_eq!(dis["transfer_ms"]["count"], 24);
    let wire = 62.0 * 196_608.0 / 1e7;
    assert!(
        (dis["transfer_ms"]["p50"].as_f64().unwrap() - wire).abs() < 1e-6,
        "{dis}"
    );
    assert!(runs[0]["disagg"].get("link_bandwidth_gbps").is_none());
    // Ratios are per rate, against the first graph.
    let ratios = doc["ratios"].as_array().unwrap();
    assert_eq!(ratios.len(), 2);
    assert!(
        ratios
            .iter()
            .all(|r| r["baseline"] == "agg:2" && r["label"] == "1p1d")
    );
    assert_eq!(ratios[1]["request_rate"], 20.0);
    std::fs::remove_dir_all(&model).ok();
    std::fs::remove_file(&json).ok();
    std::fs::remove_file(&md).ok();
}

#[test]
fn topology_flags_are_checked() {
    let refused = |extra: &[&str], why: &str| {
        let mut args = PREFILL_HEAVY.to_vec();
        args.extend(["--request-rate", "5"]);
        args.extend(extra);
        let out = dynamo_e2e(&args);
        assert!(!out.status.success(), "{extra:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(why), "{extra:?}: {stderr}");
    };
    refused(&["--topology", "2x2"], "a topology is agg:N");
    refused(&["--topology", "agg:0"], "at least 1");
    refused(
        &["--topology", "1p1d", "--kv-link-bandwidth-gbps", "0"],
        "--kv-link-bandwidth-gbps must be positive",
    );
    // A decode engine's GPUs are the hardware model's.
    refused(
        &["--topology", "1p1d", "--decode-tensor-parallel-size", "2"],
        "--decode-tensor-parallel-size sizes the decode engines of a --topology on --perf-model hardware",
    );
    // A disaggregated graph sizes the KV it moves from the model; aggregated ones
    // move none.
    refused(
        &["--topology", "1p1d", "--model-path", "/nonexistent/model"],
        "/nonexistent/model/config.json",
    );
    let mut args = PREFILL_HEAVY.to_vec();
    args.extend([
        "--request-rate",
        "5",
        "--topology",
        "agg:2",
        "--model-path",
        "/nonexistent/model",
    ]);
    let out = dynamo_e2e(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Conversations are replayed by their own driver.
    let out = dynamo_e2e(&["replay", "--sessions", "2", "--topology", "1p1d"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not with --sessions"));
}

#[test]
fn decode_engines_take_their_own_tensor_parallel_size() {
    let json = scratch("decode-tp.json");
    let json_arg = json.display().to_string();
    let hardware = "--perf-model hardware --gpu H100_SXM --model meta-llama/Llama-3.1-8B-Instruct";
    let mut args = PREFILL_HEAVY.to_vec();
    args.extend(["--request-rate", "5", "--topology", "agg:2,2p1d"]);
    args.extend(["--decode-tensor-parallel-size", "4", "--out", &json_arg]);
    args.extend(hardware.split(' '));
    let out = dynamo_e2e(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let gpus: Vec<u64> = report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["disagg"]["gpus"].as_u64().unwrap())
        .collect();
    // Two TP1 engines; two TP1 prefill engines and a TP4 decode engine.
    assert_eq!(gpus, [2, 6]);
    assert_eq!(report["config"]["decode_engine"]["timing"]["tp"], 4);
    std::fs::remove_file(&json).ok();
}
