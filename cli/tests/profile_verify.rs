//! `dynamo profile --verify` as a user runs it: the request profiled, its graph run on this
//! machine by the real binaries (`dynamo run`, the mock engines, sidecars and the endpoint
//! picker, which must be built beside `dynamo`), measured under the request's load, and
//! stopped. The request is one a mock engine on 2 cores reproduces well: steps of tens of
//! ms (Qwen3-8B on an L40S), a few requests a second.

// The operator's test fixtures, one home for both crates' tests.
#[path = "../../operator/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dynamo_crds::DynamoGraphDeployment;

/// Real engines and a planner in the request: the graph printed has both, the one
/// verified neither.
const REQUEST: &str = "apiVersion: nvidia.com/v1beta1
kind: DynamoGraphDeploymentRequest
metadata:
  name: verify-test
spec:
  model: Qwen/Qwen3-8B
  backend: vllm
  hardware:
    gpuSku: l40s
    totalGpus: 1
  workload:
    isl: 1000
    osl: 32
    requestRate: 2
  sla:
    ttft: 1000
    itl: 50
  features:
    planner: {}
";

fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("profile-verify-{}", std::process::id()));
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    path
}

fn model_dir() -> PathBuf {
    let dir = common::repo_root().join(".cache/models/qwen-mock");
    assert!(
        dir.join("tokenizer.json").exists(),
        "run `make model` first"
    );
    dir
}

fn dynamo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dynamo"))
        .args(args)
        .env_remove("DYNAMO_MODEL_PATH")
        .current_dir(common::repo_root())
        .output()
        .expect("dynamo runs")
}

/// The table row `label`: the measured mean and measured/predicted.
fn row(stderr: &str, label: &str) -> (f64, f64) {
    let line = stderr
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} row in:\n{stderr}"));
    let numbers: Vec<f64> = line[line.find(label).unwrap() + label.len()..]
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (numbers[1], *numbers.last().unwrap())
}

/// The value after `flag` in the quoted `dynamo run` command line on stderr.
fn run_arg(stderr: &str, flag: &str) -> String {
    let quoted = format!("'{flag}' '");
    let at = stderr
        .find(&quoted)
        .unwrap_or_else(|| panic!("no {flag} in:\n{stderr}"))
        + quoted.len();
    stderr[at..].split('\'').next().unwrap().to_owned()
}

#[test]
fn the_generated_graph_runs_on_mock_engines_and_measures_as_predicted() {
    let bin = Path::new(env!("CARGO_BIN_EXE_dynamo")).parent().unwrap();
    for name in ["dynamo-mocker", "dynamo-sidecar", "dynamo-epp"] {
        assert!(
            bin.join(name).exists(),
            "build the graph's binaries first (`cargo build -p dynamo-mocker -p dynamo-sidecar \
             -p dynamo-epp`): no {name} in {}",
            bin.display()
        );
    }
    let request = scratch("request.yaml", REQUEST);
    let model = model_dir();
    let out = dynamo(&[
        "profile",
        "-f",
        request.to_str().unwrap(),
        "--verify",
        "--verify-duration",
        "8",
        "--model-path",
        model.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");

    // stdout is still the graph to deploy: real engines and the planner.
    let dgd: DynamoGraphDeployment =
        serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let worker = &dgd.spec.services["worker"];
    let main = worker.extra_pod_spec.as_ref().unwrap();
    let command = main.main_container.as_ref().unwrap().command.as_deref();
    assert_eq!(command, Some(&["vllm".to_owned(), "serve".to_owned()][..]));
    assert!(dgd.spec.services.contains_key("planner"));

    // The graph run: mock engines, no planner, up, measured with no failure.
    assert!(
        stderr.contains(
            "verify: agg 1 x TP1 on mock engines (dynamo-mocker --perf-model hardware --gpu \
             L40S) on this machine, without a planner"
        ),
        "{stderr}"
    );
    assert!(stderr.contains(" up in "), "{stderr}");
    assert!(
        stderr.contains("verify: Poisson arrivals at 2 req/s, ISL 1000 OSL 32"),
        "{stderr}"
    );
    assert!(stderr.contains(" measured (0 failed)"), "{stderr}");
    // The same engine model measured as simulated: the means within a factor of 2 of the
    // predictions (the HTTP path adds some milliseconds to TTFT).
    for label in ["TTFT ms", "ITL ms", "E2E ms", "req/s"] {
        let (measured, ratio) = row(&stderr, label);
        assert!(measured > 0.0, "{label}: {stderr}");
        assert!(
            (0.5..=2.0).contains(&ratio),
            "{label} ratio {ratio}: {stderr}"
        );
    }

    // Stopped afterwards: nothing listens on its ports, and its files are gone.
    for flag in ["--port", "--admin-port"] {
        let port = run_arg(&stderr, flag);
        assert!(
            std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_err(),
            "{flag} {port} still answers"
        );
    }
    let graph_file = PathBuf::from(run_arg(&stderr, "-f"));
    assert!(!graph_file.parent().unwrap().exists(), "{graph_file:?}");
}

#[test]
fn bad_verify_flags_are_refused_with_what_to_change() {
    let request = scratch("bad-request.yaml", REQUEST);
    let request = request.to_str().unwrap();
    // A model directory whose config.json is another model than the one profiled.
    let other_model = scratch(
        "other-model/config.json",
        r#"{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "num_hidden_layers": 28,
            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 3072, "vocab_size": 151936, "max_position_embeddings": 40960,
            "torch_dtype": "bfloat16"}"#,
    );
    let other_model = other_model.parent().unwrap().to_str().unwrap();
    for (args, expected) in [
        (
            vec!["--verify"],
            "--verify runs the graph on this machine: pass --model-path DIR",
        ),
        (
            vec!["--verify", "--verify-duration", "0", "--model-path", "/m"],
            "--verify-duration must be above 0",
        ),
        (
            vec!["--verify-duration", "5"],
            "the following required arguments were not provided",
        ),
        (
            vec!["--verify", "--model-path", other_model],
            "the mock engines would model",
        ),
    ] {
        let mut argv = vec!["profile", "-f", request];
        argv.extend(&args);
        let out = dynamo(&argv);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: {expected:?} not in:\n{stderr}"
        );
    }
}
