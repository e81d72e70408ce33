//! Every binary's logs as JSON lines (`--log-format json`, `DYNAMO_LOG_FORMAT`, or Dynamo's
//! `DYN_LOGGING_JSONL`): each line one object with the time, level, target and the
//! message among its fields; and Dynamo's variable names reaching the picker
//! (docs/dynamo-compatibility.md). Each binary runs until its first "serving" line.

#[allow(dead_code)] // the fixture serves several test binaries, each using a part
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use support::{bin_dir, free_port, model_dir};

/// Generous: the machine running the tests may be loaded.
const WAIT: Duration = Duration::from_secs(60);

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `binary` (from this workspace's target folder) and returns its log lines, up to
/// the first that contains `until`; then kills it.
fn log_lines(binary: &str, args: &[&str], env: &[(&str, &str)], until: &str) -> Vec<String> {
    let mut command = Command::new(bin_dir().join(binary));
    // Only what the test sets: none of the switches from the caller's environment.
    for var in [
        "DYNAMO_LOG_FORMAT",
        "DYN_LOGGING_JSONL",
        "DYNAMO_EPP_BLOCK_SIZE",
    ] {
        command.env_remove(var);
    }
    let mut child = command
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{binary} starts (build it first: cargo build): {e}"));
    let logs = child.stderr.take().unwrap();
    let _child = Killed(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(logs).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    loop {
        let line = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|e| panic!("{binary}: no line with {until:?} ({e}): {lines:#?}"));
        let done = line.contains(until);
        lines.push(line);
        if done {
            return lines;
        }
    }
}

/// Each line parsed as one JSON object with the keys every log line has.
fn json_lines(binary: &str, lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .map(|line| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{binary}: a line that is not JSON ({e}): {line}"));
            for key in ["timestamp", "level", "target"] {
                assert!(value[key].is_string(), "{binary}: no {key}: {line}");
            }
            assert!(
                value["fields"]["message"].is_string(),
                "{binary}: no message: {line}"
            );
            value
        })
        .collect()
}

fn picker_args(model: &str) -> Vec<String> {
    [
        "--model-path",
        model,
        "--endpoints",
        "127.0.0.1:9",
        "--host",
        "127.0.0.1",
        "--http-port",
        "0",
        "--ext-proc-port",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn every_binary_writes_json_lines_when_asked() {
    let model = model_dir();
    let model = model.to_str().unwrap();
    let mut picker = picker_args(model);
    picker.extend(["--log-format".into(), "json".into()]);
    let picker: Vec<&str> = picker.iter().map(String::as_str).collect();
    let mocker_port = free_port().to_string();
    let planner = PLANNER;
    let check = |binary: &str, args: &[&str], env: &[(&str, &str)], until: &str| {
        let lines = log_lines(binary, args, env, until);
        let last = json_lines(binary, &lines).pop().unwrap();
        assert_eq!(last["level"], "INFO", "{binary}: {last}");
    };
    check("dynamo-epp", &picker, &[], "dynamo-epp serving");
    let sidecar = [
        "--listen",
        "127.0.0.1:0",
        "--host",
        "127.0.0.1",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        "--model-name",
        "m",
    ];
    let json_env = [("DYNAMO_LOG_FORMAT", "json")];
    check(
        "dynamo-sidecar",
        &sidecar,
        &json_env,
        "dynamo-sidecar serving",
    );
    let mocker = [
        "--model-path",
        model,
        "--port",
        &mocker_port,
        "--kv-events-endpoint",
        "none",
    ];
    let dynamo_env = [("DYN_LOGGING_JSONL", "1")];
    check(
        "dynamo-mocker",
        &mocker,
        &dynamo_env,
        "dynamo-mocker serving",
    );
    // The flag after the subcommand, and before it; and Dynamo's switch.
    let started = "planner started";
    let after = [&planner[..], &["--log-format", "json"]].concat();
    check("dynamo", &after, &[], started);
    let before = [&["--log-format", "json"], &planner[..]].concat();
    check("dynamo", &before, &[], started);
    check(
        "dynamo",
        &planner,
        &[("DYN_LOGGING_JSONL", "true")],
        started,
    );
}

/// `dynamo planner`: it starts without a model, so at once.
const PLANNER: [&str; 11] = [
    "planner",
    "--mode",
    "load",
    "--admin-url",
    "http://127.0.0.1:9",
    "--prometheus",
    "http://127.0.0.1:9",
    "--metrics-addr",
    "127.0.0.1:0",
    "--startup-delay",
    "60m",
];

#[test]
fn text_stays_the_default_and_the_flag_beats_dynamos_switch() {
    let until = "planner started";
    for env in [vec![], vec![("DYN_LOGGING_JSONL", "0")]] {
        let lines = log_lines("dynamo", &PLANNER, &env, until);
        let last = lines.last().unwrap();
        assert!(
            serde_json::from_str::<Value>(last).is_err(),
            "{env:?}: {last}"
        );
        assert!(last.contains("INFO"), "{last}");
    }
    let text = [&PLANNER[..], &["--log-format", "text"]].concat();
    let lines = log_lines("dynamo", &text, &[("DYN_LOGGING_JSONL", "1")], until);
    assert!(serde_json::from_str::<Value>(lines.last().unwrap()).is_err());
    let lines = log_lines(
        "dynamo",
        &PLANNER,
        &[("DYNAMO_LOG_FORMAT", "text"), ("DYN_LOGGING_JSONL", "1")],
        until,
    );
    assert!(serde_json::from_str::<Value>(lines.last().unwrap()).is_err());
}

/// Dynamo's variables set the picker's knobs; ours wins when both are set.
#[test]
fn dynamos_variables_reach_the_picker() {
    let model = model_dir();
    let args = picker_args(model.to_str().unwrap());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let serving = |env: &[(&str, &str)]| {
        let lines = log_lines("dynamo-epp", &args, env, "dynamo-epp serving");
        json_lines("dynamo-epp", &lines).pop().unwrap()["fields"].clone()
    };
    let dynamo = [
        ("DYN_LOGGING_JSONL", "1"),
        ("DYN_KV_CACHE_BLOCK_SIZE", "32"),
        ("DYN_ROUTER_MODE", "round-robin"),
        ("DYN_MODEL_NAME", "served-name"),
    ];
    let fields = serving(&dynamo);
    assert_eq!(fields["block_size"], 32, "{fields}");
    assert_eq!(fields["mode"], "round-robin", "{fields}");
    assert_eq!(fields["model"], "served-name", "{fields}");
    let both = [&dynamo[..], &[("DYNAMO_EPP_BLOCK_SIZE", "8")]].concat();
    assert_eq!(serving(&both)["block_size"], 8);
}

/// A fatal error is a JSON line too (so a log pipeline parses every line), and the exit
/// code still says it failed.
#[test]
fn a_fatal_error_is_the_last_json_line() {
    let runs: [(&str, &[&str]); 2] = [
        (
            "dynamo-epp",
            &["--model-path", "/nonexistent", "--endpoints", "127.0.0.1:9"],
        ),
        (
            "dynamo",
            &[
                "planner",
                "--admin-url",
                "http://127.0.0.1:9",
                "--profile",
                "/nonexistent",
            ],
        ),
    ];
    for (binary, args) in runs {
        let out = Command::new(bin_dir().join(binary))
            .args(args)
            .args(["--log-format", "json"])
            .env_remove("DYN_LOGGING_JSONL")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{binary}: {out:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        let lines: Vec<String> = stderr.lines().map(String::from).collect();
        let last = json_lines(binary, &lines).pop().expect("a line");
        assert_eq!(last["level"], "ERROR", "{binary}: {last}");
        assert!(
            last["fields"]["message"]
                .as_str()
                .unwrap()
                .contains("/nonexistent"),
            "{binary}: {last}"
        );
        assert!(
            out.stdout.is_empty(),
            "{binary}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
