//! `dynamo-e2e overhead` for real: it starts the mock engine, its sidecar and the picker
//! (this build's binaries), loads them briefly, streamed and not, and reports each
//! process's CPU per request. The figures depend on the machine; what is checked is
//! that every window measured answered requests and every process.

#[allow(dead_code)] // the fixture serves several test binaries, each using a part
mod support;

use std::process::Command;

use serde_json::Value;
use support::{ROOT, bin_dir, model_dir};

#[test]
fn the_overhead_probe_measures_every_process_for_both_deliveries() {
    let bin = bin_dir();
    for name in ["dynamo-mocker", "dynamo-sidecar", "dynamo-epp"] {
        assert!(
            bin.join(name).exists(),
            "build the workspace binaries first ({name} in {bin:?})"
        );
    }
    let scratch = |ext: &str| {
        std::env::temp_dir().join(format!("dynamo-e2e-overhead-{}.{ext}", std::process::id()))
    };
    let (json, md) = (scratch("json"), scratch("md"));
    let run = Command::new(env!("CARGO_BIN_EXE_dynamo-e2e"))
        .current_dir(ROOT)
        .arg("overhead")
        .arg("--bin-dir")
        .arg(&bin)
        .arg("--model-path")
        .arg(model_dir())
        .args(["--concurrency", "8", "--warmup-s", "1", "--duration-s", "2"])
        // A debug mock engine loading its tokenizer on a loaded 2-core machine took
        // over the default minute to answer its health check (CI, beside a build).
        .args(["--health-timeout-s", "180"])
        .arg("--out")
        .arg(&json)
        .arg("--markdown")
        .arg(&md)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["kind"], "overhead");
    assert_eq!(report["setup"]["concurrency"], 8);
    let runs = report["runs"].as_array().unwrap();
    let deliveries: Vec<&str> = runs
        .iter()
        .map(|r| r["delivery"].as_str().unwrap())
        .collect();
    assert_eq!(deliveries, ["streamed", "whole"]);
    for run in runs {
        let delivery = &run["delivery"];
        assert!(run["requests"].as_u64().unwrap() > 0, "{delivery}: {run}");
        assert_eq!(run["errors"], 0, "{delivery}: {run}");
        assert!(run["requests_per_s"].as_f64().unwrap() > 0.0, "{run}");
        assert!(run["e2e_ms"]["p50"].as_f64().unwrap() > 0.0, "{run}");
        let processes = run["processes"].as_array().unwrap();
        let roles: Vec<&str> = processes
            .iter()
            .map(|p| p["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["picker", "sidecar", "engine", "load generator"]);
        for p in processes {
            let (cpu_s, per_request) = (
                p["cpu_s"].as_f64().unwrap(),
                p["ms_per_request"].as_f64().unwrap(),
            );
            assert!(cpu_s > 0.0, "{delivery}: {p}");
            assert!(
                per_request.is_finite() && per_request > 0.0,
                "{delivery}: {p}"
            );
        }
    }
    // The same figures as a table, on stdout and in the file.
    let table = std::fs::read_to_string(&md).unwrap();
    assert_eq!(stdout, table);
    assert!(table.contains("| picker CPU ms/req |"), "{table}");
    for delivery in ["| streamed |", "| whole |"] {
        assert!(table.contains(delivery), "{table}");
    }
    let _ = std::fs::remove_file(json);
    let _ = std::fs::remove_file(md);
}
