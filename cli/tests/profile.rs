//! `dynamo profile` as a user runs it: the sample request's generated graph and tables
//! (golden), the graph reconciled by the operator as it would be on apply, and bad
//! requests refused with what is wrong.
//! Regenerate the golden files (beside the operator's, in operator/tests/golden) with
//! `UPDATE_GOLDEN=1 cargo nextest run -p dynamo-cli --test profile`.

// The operator's test fixtures, one home for both crates' tests.
#[path = "../../operator/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{cluster, observed, run};
use dynamo_crds::DynamoGraphDeployment;

fn dynamo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dynamo"))
        .args(args)
        .current_dir(common::repo_root())
        .output()
        .expect("dynamo runs")
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Compares `actual` with the golden file `name`, or rewrites it under `UPDATE_GOLDEN`.
fn golden(name: &str, actual: &str) {
    let path = common::repo_root().join("operator/tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == actual,
        "{} differs from what `dynamo profile` prints; if the change is intended, run \
         `UPDATE_GOLDEN=1 cargo nextest run -p dynamo-cli --test profile` and review the \
         diff:\n{actual}",
        path.display()
    );
}

#[test]
fn the_sample_request_profiles_into_a_graph_the_operator_deploys() {
    let profile_out = scratch("profile.json", "");
    let out = dynamo(&[
        "profile",
        "-f",
        "config/samples/dgdr.yaml",
        "--profile-out",
        profile_out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    // The wall time is the one line that differs between runs.
    let (timed, tables): (Vec<&str>, Vec<&str>) =
        stderr.lines().partition(|l| l.starts_with("profiled in "));
    assert_eq!(timed.len(), 1, "{stderr}");
    let tables = tables
        .join("\n")
        .replace(profile_out.to_str().unwrap(), "PROFILE_OUT")
        + "\n";
    golden("profile-dgdr.yaml", &stdout);
    golden("profile-dgdr.txt", &tables);

    // The printed graph is a valid manifest...
    let validated = dynamo_crds::validate_manifest(&stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(validated.graph_deployments().count(), 1);
    // ...whose planner's profile is the file written, in the planner's format.
    let json = std::fs::read_to_string(&profile_out).unwrap();
    dynamo_planner::profile::Profile::from_json(&json).unwrap();

    // The operator reconciles it with no complaint: engine pods with the flags and GPUs
    // chosen, and a planner reading the profile from its ConfigMap.
    let mut dgd: DynamoGraphDeployment = serde_saphyr::from_str(&stdout).unwrap();
    dgd.metadata.namespace = Some("inference".into());
    dgd.metadata.uid = Some("uid-profiled".into());
    dgd.metadata.generation = Some(1);
    let desired = run(&dgd, &observed(vec![], cluster()));
    let workers = dgd.spec.services["worker"].replicas.unwrap() as usize;
    let engine_pods: Vec<_> = desired
        .pods
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.contains("worker"))
        })
        .collect();
    assert_eq!(engine_pods.len(), workers);
    for pod in engine_pods {
        let main = &pod.spec.as_ref().unwrap().containers[0];
        let argv = main.command.as_ref().unwrap().join(" ");
        assert!(argv.starts_with("vllm serve Qwen/Qwen3-0.6B "), "{argv}");
        assert!(argv.contains(" --tensor-parallel-size 1 "), "{argv}");
        let gpus = main.resources.as_ref().and_then(|r| r.limits.as_ref());
        assert_eq!(gpus.unwrap()["nvidia.com/gpu"].0, "1");
    }
    let planner = desired
        .deployments
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some("qwen3-sla-planner"))
        .expect("the planner's Deployment");
    let pod = planner
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "planner-profile")
        .unwrap();
    assert_eq!(
        volume.config_map.as_ref().unwrap().name,
        "qwen3-sla-planner-profile"
    );
    let args = pod.containers[0].args.as_ref().unwrap().join(" ");
    assert!(
        args.contains("--profile /etc/dynamo/planner-profile/profile.json"),
        "{args}"
    );
    assert!(
        args.contains("--ttft-ms 200 --itl-ms 20 --max-gpu-budget 8"),
        "{args}"
    );
}

#[test]
fn bad_requests_are_refused_with_what_is_wrong() {
    let request = |spec: &str| {
        format!(
            "apiVersion: nvidia.com/v1beta1\nkind: DynamoGraphDeploymentRequest\nmetadata: \
             {{name: bad}}\nspec: {spec}\n"
        )
    };
    let cases = [
        (
            "no-gpus.yaml",
            "{model: Qwen/Qwen3-0.6B, hardware: {totalGpus: 0}, workload: {requestRate: 1}}",
            "spec.hardware.totalGpus",
        ),
        (
            "negative-ttft.yaml",
            "{model: Qwen/Qwen3-0.6B, workload: {requestRate: 1}, sla: {ttft: -5, itl: 20}}",
            "spec.sla.ttft",
        ),
        (
            "zero-itl.yaml",
            "{model: Qwen/Qwen3-0.6B, workload: {requestRate: 1}, sla: {ttft: 200, itl: 0}}",
            "latency targets must be above 0 ms",
        ),
        (
            "zero-rate.yaml",
            "{model: Qwen/Qwen3-0.6B, workload: {requestRate: 0}, sla: {ttft: 200, itl: 20}}",
            "concurrency and requestRate must be above 0",
        ),
        (
            "over-context.yaml",
            "{model: Qwen/Qwen3-0.6B, workload: {isl: 40000, osl: 1000, requestRate: 1}}",
            "workload.isl 40000 + workload.osl 1000 is 41000 tokens, more than Qwen/Qwen3-0.6B's \
             context of 40960 tokens",
        ),
        (
            "unreachable.yaml",
            "{model: Qwen/Qwen3-0.6B, hardware: {totalGpus: 1}, \
             workload: {isl: 1000, osl: 100, requestRate: 1}, sla: {ttft: 0.5, itl: 20}}",
            "the TTFT target of 0.5 ms is out of reach",
        ),
        (
            "config-ref.yaml",
            "{model: acme/tiny, modelConfigRef: {name: tiny}, workload: {requestRate: 1}}",
            "spec.modelConfigRef names key config.json of ConfigMap tiny, which the operator \
             reads: pass that file with --model-config FILE",
        ),
        (
            "calibration-ref.yaml",
            "{model: Qwen/Qwen3-0.6B, workload: {requestRate: 1}, \
             profilingConfig: {calibrationRef: {name: measured}}}",
            "spec.profilingConfig.calibrationRef names key calibration.yaml of ConfigMap \
             measured, which the operator fits: pass that file with --calibrate FILE",
        ),
    ];
    for (file, spec, expected) in cases {
        let path = scratch(file, &request(spec));
        let out = dynamo(&["profile", "-f", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file} was profiled");
        assert!(
            stderr.contains(expected),
            "{file}: {expected:?} not in:\n{stderr}"
        );
        assert!(out.stdout.is_empty(), "{file}: a graph printed");
    }
}

#[test]
fn a_model_the_catalog_lacks_profiles_from_its_config_json() {
    let request = scratch(
        "private.yaml",
        "apiVersion: nvidia.com/v1beta1\nkind: DynamoGraphDeploymentRequest\nmetadata: \
         {name: private}\nspec: {model: acme/private-0.6b, hardware: {totalGpus: 1}, \
         workload: {isl: 1000, osl: 100, requestRate: 2}, sla: {ttft: 500, itl: 30}}\n",
    );
    let file = request.to_str().unwrap();
    let out = dynamo(&["profile", "-f", file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("is not in the built-in catalog"),
        "{stderr}"
    );
    // Qwen3-0.6B's architecture under a private name.
    let config = scratch(
        "config.json",
        r#"{"num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
            "vocab_size": 151936, "torch_dtype": "bfloat16", "max_position_embeddings": 40960,
            "tie_word_embeddings": true}"#,
    );
    let out = dynamo(&[
        "profile",
        "-f",
        file,
        "--model-config",
        config.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dgd: DynamoGraphDeployment =
        serde_saphyr::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    assert_eq!(dgd.metadata.name.as_deref(), Some("private"));
    let worker = dgd.spec.services["worker"].main_command().join(" ");
    assert_eq!(
        worker,
        "vllm serve acme/private-0.6b --tensor-parallel-size 1"
    );
}
