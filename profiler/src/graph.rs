//! The DynamoGraphDeployment (v1alpha1) of the selected candidate: an endpoint picker,
//! the engine services with their commands, tensor parallel flags, GPUs and replicas,
//! and a planner when the request asks for one.

use dynamo_crds::{BackendFramework, DynamoGraphDeployment};
use dynamo_mocker::EngineConfig;
use serde_json::{Map, Value, json};

use crate::request::{Request, Sla};
use crate::sweep::{Candidate, Engines, Layout, default_chunk};

/// Where a generated planner reads the profile (`dynamo profile --profile-out`'s file)
/// when its engines are real ones: the key of a ConfigMap named
/// [`profile_config_map`], mounted read-only at [`PROFILE_DIR`].
pub const PROFILE_KEY: &str = "profile.json";
pub const PROFILE_DIR: &str = "/etc/dynamo/planner-profile";
const PROFILE_VOLUME: &str = "planner-profile";

/// The ConfigMap holding the planner profile of graph `dgd`.
pub fn profile_config_map(dgd: &str) -> String {
    format!("{dgd}-planner-profile")
}

/// Whether the generated graph's planner reads its profile from the ConfigMap
/// [`profile_config_map`]: a mock engine graph's planner measures its own from the
/// workers' flags (the operator's init container, `dynamo run` likewise).
pub fn planner_reads_profile(req: &Request) -> bool {
    req.planner && req.backend != BackendFramework::Mocker
}

/// The mock engine's program in a generated graph (`dynamo-wiring`'s, `wiring/`).
const MOCKER: &str = "dynamo-mocker";

/// The engine command of one of `engines` for `req`: the container's `command` (the
/// launcher) and `args` (the model and the flags: its tensor parallel size and, where
/// its step budget is not the engines' default, that budget and the sequences a step
/// holds as simulated, which an engine whose own default holds more would refuse beside
/// a small budget: vLLM's `max_num_batched_tokens >= max_num_seqs`).
pub fn engine_command(req: &Request, engines: Engines) -> (Vec<String>, Vec<String>) {
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (model, tp) = (req.served_model.as_str(), engines.tp.to_string());
    let (command, mut args, [budget_flag, seqs_flag]) = match req.backend {
        BackendFramework::Vllm => (
            words(&["vllm", "serve"]),
            words(&[model, "--tensor-parallel-size", &tp]),
            ["--max-num-batched-tokens", "--max-num-seqs"],
        ),
        BackendFramework::Sglang => (
            words(&["python3", "-m", "sglang.launch_server"]),
            words(&["--model-path", model, "--tp-size", &tp]),
            // sglang/srt/server_args.py: `chunked_prefill_size`, `max_running_requests`.
            ["--chunked-prefill-size", "--max-running-requests"],
        ),
        BackendFramework::Trtllm => (
            words(&["trtllm-serve"]),
            words(&[model, "--tp_size", &tp]),
            ["--max_num_tokens", "--max_batch_size"],
        ),
        BackendFramework::Mocker => {
            let gpu = req.gpu.name.as_str();
            let mut args = words(&["--model-name", model, "--perf-model", "hardware"]);
            args.extend(words(&["--gpu", gpu, "--tensor-parallel-size", &tp]));
            if let Some(share) = req.gpu_memory_utilization {
                args.extend(["--gpu-memory-utilization".into(), share.to_string()]);
            }
            (
                words(&[MOCKER]),
                args,
                ["--max-num-batched-tokens", "--max-num-seqs"],
            )
        }
    };
    if engines.max_num_batched_tokens != default_chunk() {
        let seqs = EngineConfig::default().max_num_seqs;
        args.extend([
            budget_flag.into(),
            engines.max_num_batched_tokens.to_string(),
        ]);
        args.extend([seqs_flag.into(), seqs.to_string()]);
    }
    (command, args)
}

fn engine_service(req: &Request, component: &str, engines: Engines) -> Value {
    let (command, args) = engine_command(req, engines);
    let mut service = json!({
        "componentType": component,
        "replicas": engines.replicas,
        "extraPodSpec": {"mainContainer": {"command": command, "args": args}},
    });
    // Mock engines run on CPUs; real ones get their GPUs.
    if req.backend != BackendFramework::Mocker {
        service["resources"] = json!({"limits": {"gpu": engines.tp.to_string()}});
    }
    service
}

/// The planner's targets: the SLA's, or an end-to-end target split between TTFT and
/// ITL in the proportion the selected candidate spends them.
fn planner_targets(sla: &Sla, selected: &Candidate) -> (f64, f64) {
    match *sla {
        Sla::TtftItl { ttft_ms, itl_ms } => (ttft_ms, itl_ms),
        Sla::E2e { e2e_ms } => {
            let scale = e2e_ms / selected.e2e_ms;
            (selected.ttft_ms * scale, selected.itl_ms * scale)
        }
    }
}

fn planner_service(name: &str, req: &Request, selected: &Candidate) -> Value {
    let (ttft, itl) = planner_targets(&req.sla, selected);
    let (prefill_tp, decode_tp) = match selected.layout {
        Layout::Aggregated { workers } => (workers.tp, workers.tp),
        Layout::Disaggregated { prefill, decode } => (prefill.tp, decode.tp),
    };
    let mut args: Vec<String> = vec![
        "--ttft-ms".into(),
        round(ttft),
        "--itl-ms".into(),
        round(itl),
        "--max-gpu-budget".into(),
        req.total_gpus.to_string(),
        "--prefill-gpus".into(),
        prefill_tp.to_string(),
        "--decode-gpus".into(),
        decode_tp.to_string(),
    ];
    let mut extra = Map::new();
    let mut main = json!({"command": ["dynamo", "planner"]});
    if planner_reads_profile(req) {
        args.extend(["--profile".into(), format!("{PROFILE_DIR}/{PROFILE_KEY}")]);
        main["volumeMounts"] =
            json!([{"name": PROFILE_VOLUME, "mountPath": PROFILE_DIR, "readOnly": true}]);
        extra.insert(
            "volumes".into(),
            json!([{"name": PROFILE_VOLUME, "configMap": {"name": profile_config_map(name)}}]),
        );
    }
    main["args"] = json!(args);
    extra.insert("mainContainer".into(), main);
    json!({"componentType": "planner", "replicas": 1, "extraPodSpec": extra})
}

/// Milliseconds as a flag value: to 0.1 ms, without a trailing `.0`.
fn round(ms: f64) -> String {
    let r = (ms * 10.0).round() / 10.0;
    if r.fract() == 0.0 {
        format!("{r:.0}")
    } else {
        format!("{r:.1}")
    }
}

/// The graph named `name` that deploys `selected` for `req`.
pub fn generate(name: &str, req: &Request, selected: &Candidate) -> DynamoGraphDeployment {
    let mut services = Map::new();
    let mut epp = json!({"componentType": "epp", "replicas": 1});
    if !req.kv_router {
        epp["envs"] = json!([{"name": "DYN_ROUTER_MODE", "value": "round-robin"}]);
    }
    services.insert("epp".into(), epp);
    match selected.layout {
        Layout::Aggregated { workers } => {
            services.insert("worker".into(), engine_service(req, "worker", workers));
        }
        Layout::Disaggregated { prefill, decode } => {
            services.insert("prefill".into(), engine_service(req, "prefill", prefill));
            services.insert("decode".into(), engine_service(req, "decode", decode));
        }
    }
    if req.planner {
        services.insert("planner".into(), planner_service(name, req, selected));
    }
    let backend = serde_json::to_value(req.backend).expect("an enum serializes");
    let dgd = json!({
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": name},
        "spec": {"backendFramework": backend, "services": services},
    });
    serde_json::from_value(dgd).expect("the generated graph has the DGD's shape")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values_are_rounded_to_a_tenth() {
        assert_eq!(round(200.0), "200");
        assert_eq!(round(12.345), "12.3");
        assert_eq!(round(0.04), "0");
    }
}
