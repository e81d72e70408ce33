//! What the plan knows of each engine backend, one entry per backend ([`ENGINES`], each
//! in its own file): the programs that start it, how to start its OpenAI server, which of
//! its flags name the model, the served name and the KV block size, the flags it writes
//! for the KV event publisher and disaggregation, and how Dynamo's worker wrappers
//! (`python3 -m dynamo.vllm`, ...) map onto the engine's own server. Adding a backend is
//! one file here, its entry in [`ENGINES`] and its `BackendFramework` variant in the CRD.

mod mocker;
mod sglang;
mod trtllm;
mod vllm;

use dynamo_crds::{BackendFramework, ComponentSpec, DynamoGraphDeploymentSpec, ServiceRole};
use dynamo_names::Role;

use super::argv::{self, Arity};
use super::{Addresses, EngineService, EnvValue};

/// One engine backend.
pub(super) struct Engine {
    pub backend: BackendFramework,
    /// Programs and Python modules that start it: Dynamo's worker wrapper and the
    /// engine's own servers (what role inference reads off a command).
    pub launchers: &'static [&'static str],
    /// The command that starts its OpenAI server, before the model.
    pub server: &'static [&'static str],
    /// The flag before the model on that command; `None`: the model is positional.
    pub server_model_flag: Option<&'static str>,
    /// Flags that name the model it loads, first found wins.
    pub model_flags: &'static [&'static str],
    /// The flag of the name clients send; without it the engine serves the model's own
    /// name.
    pub served_name_flag: Option<&'static str>,
    /// The KV block size flag, and the engine's default block size in tokens.
    pub block_size_flag: Option<&'static str>,
    pub default_block_size: u32,
    /// Whether it publishes KV events on a ZMQ socket the sidecar relays.
    pub publishes_kv_events: bool,
    /// Whether its publisher connects to the loopback endpoint it is given rather than
    /// binding it, so the sidecar listens there (`--engine-kv-events-listen`).
    pub kv_events_connect: bool,
    /// Whether it answers vLLM's KV event replay requests, so the sidecar can repair gaps
    /// instead of resetting.
    pub replays_kv_events: bool,
    /// Why it cannot offload to and onboard from its sidecar's KV block tiers, if it
    /// cannot (it has no connector to the block API, or not for this engine's flags).
    /// Tiers set on such a service hold nothing, and the graph says so.
    pub unfed_kv_tiers: fn(&EngineService) -> Option<String>,
    /// The port where a disaggregated engine's peers first reach it to set up a KV
    /// transfer, by default.
    pub kv_side_channel_port: Option<u16>,
    /// Flags the plan sets itself, so the user's are dropped: the engine's address and its
    /// KV event publisher are the pod's contract with the sidecar (`DESIGN.md`, "Pod
    /// anatomy").
    pub owned_flags: &'static [(&'static str, Arity)],
    /// Dynamo's wrapper flags that have an engine twin: (Dynamo's, the engine's).
    pub dynamo_renamed: &'static [(&'static str, &'static str)],
    /// Writes the flags of its KV event publisher, its sidecar's block API and, for a
    /// prefill or decode worker, disaggregation (each unless the user set it), after the
    /// address flags.
    pub write_flags: fn(&EngineService, &Addresses, &mut Vec<String>),
    /// Variables it needs in its environment (each unless the user set it).
    pub env: fn(&EngineService, &Addresses) -> Vec<(&'static str, EnvValue)>,
}

/// Dynamo's parser and template flags, which vLLM, SGLang and the mock engine spell without
/// the `dyn-`: (Dynamo's, the engine's).
const PARSER_FLAGS: &[(&str, &str)] = &[
    ("--dyn-tool-call-parser", "--tool-call-parser"),
    ("--dyn-reasoning-parser", "--reasoning-parser"),
    ("--custom-jinja-template", "--chat-template"),
];

/// Every backend the plan knows.
pub(super) const ENGINES: [&Engine; 4] = [
    &vllm::ENGINE,
    &sglang::ENGINE,
    &trtllm::ENGINE,
    &mocker::ENGINE,
];

/// The entry of `backend`.
pub(super) fn engine(backend: BackendFramework) -> &'static Engine {
    ENGINES
        .iter()
        .find(|e| e.backend == backend)
        .expect("every backend has an entry")
}

/// For a backend that needs no variables.
fn no_env(_: &EngineService, _: &Addresses) -> Vec<(&'static str, EnvValue)> {
    Vec::new()
}

/// For a backend without a connector to the block API.
fn no_kv_connector(engine: &EngineService) -> Option<String> {
    Some(format!(
        "its {} engine has no connector to the sidecar's block API",
        // The CRD's spelling (`sglang`, `trtllm`).
        format!("{:?}", engine.backend).to_lowercase()
    ))
}

/// The launchers role inference knows, for error messages.
pub(super) fn launcher_names() -> String {
    ENGINES
        .iter()
        .flat_map(|e| e.launchers)
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

/// The engine a service's main container starts, when its command names one.
pub fn launched_backend(spec: &ComponentSpec) -> Option<BackendFramework> {
    let program = spec.launched_program()?;
    ENGINES
        .iter()
        .find(|e| e.launchers.contains(&program))
        .map(|e| e.backend)
}

/// The engine a graph's workers run: `backendFramework`, else the one the engine
/// services' commands start (Dynamo infers it the same way), else `None`.
pub fn graph_backend(spec: &DynamoGraphDeploymentSpec) -> Option<BackendFramework> {
    spec.backend_framework.or_else(|| {
        spec.services
            .values()
            .filter(|s| matches!(s.role(), ServiceRole::Engine(_)))
            .find_map(launched_backend)
    })
}

/// The model a command names positionally after its server (`vllm serve MODEL`,
/// `trtllm-serve MODEL`).
pub(super) fn positional_model(command: &[String]) -> Option<&String> {
    let program = command.first()?.rsplit('/').next()?;
    let server = ENGINES
        .iter()
        .filter(|e| e.server_model_flag.is_none())
        .map(|e| e.server)
        .find(|server| {
            server[0] == program
                && command
                    .get(1..server.len())
                    .is_some_and(|rest| rest.iter().zip(&server[1..]).all(|(a, b)| a == b))
        })?;
    command.get(server.len()).filter(|w| !w.starts_with('-'))
}

/// The mock engine's flags that a worker command written for another engine may carry
/// over when the graph's `backendFramework` is `mocker` (the same spelling as vLLM's).
const MOCKER_CARRIED: [&str; 3] = ["--block-size", "--max-num-seqs", "--max-num-batched-tokens"];

/// Flags of Dynamo's worker wrappers that belong to Dynamo's runtime, not to the engine:
/// dropped (dynamo `components/src/dynamo/common/configuration/groups/runtime_args.py`,
/// `components/src/dynamo/vllm/backend_args.py`). Negatable switches come with `--no-`.
const DYNAMO_ONLY: [(&str, Arity); 24] = [
    ("--namespace", Arity::One),
    ("--endpoint", Arity::One),
    ("--kv-state-endpoint", Arity::One),
    ("--discovery-backend", Arity::One),
    ("--request-plane", Arity::One),
    ("--response-plane", Arity::One),
    ("--event-plane", Arity::One),
    ("--connector", Arity::Many),
    ("--endpoint-types", Arity::One),
    ("--dump-config-to", Arity::One),
    ("--migration-limit", Arity::One),
    ("--dyn-default-thinking-mode", Arity::One),
    ("--dyn-structural-tag", Arity::Optional),
    ("--dyn-structural-tag-scope", Arity::One),
    ("--dyn-structural-tag-schema", Arity::One),
    ("--sleep-mode-level", Arity::One),
    ("--engine-request-limit", Arity::One),
    ("--health-check-payload", Arity::One),
    ("--output-modalities", Arity::Many),
    ("--is-prefill-worker", Arity::None),
    ("--is-decode-worker", Arity::None),
    ("--use-vllm-tokenizer", Arity::None),
    ("--fpm-trace", Arity::None),
    ("--exclude-tools-when-tool-choice-none", Arity::None),
];

/// The worker's role as Dynamo's vLLM wrapper flags say it, if they do.
pub(super) fn dynamo_role(args: &[String]) -> Option<Role> {
    if argv::has(args, "--is-prefill-worker") {
        Some(Role::Prefill)
    } else if argv::has(args, "--is-decode-worker") {
        Some(Role::Decode)
    } else {
        None
    }
}

/// A Dynamo worker wrapper's arguments as the engine's own server takes them.
pub(super) fn from_dynamo(backend: BackendFramework, args: &[String]) -> Vec<String> {
    let mut out = args.to_vec();
    for (flag, arity) in DYNAMO_ONLY {
        out = argv::remove(&out, flag, arity);
        if arity == Arity::None {
            out = argv::remove(&out, &flag.replacen("--", "--no-", 1), arity);
        }
    }
    for &(dynamo, engine) in engine(backend).dynamo_renamed {
        if let Some(value) = argv::value(&out, dynamo) {
            out = argv::remove(&out, dynamo, Arity::One);
            out = argv::set(&out, engine, &value);
            // vLLM parses tool calls only when told to choose tools automatically.
            if engine == "--tool-call-parser" && backend == BackendFramework::Vllm {
                out.push("--enable-auto-tool-choice".into());
            }
        }
    }
    out
}

/// The user's flags that the mock engine understands, when it stands in for another engine.
pub(super) fn for_mocker(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for flag in MOCKER_CARRIED {
        if let Some(value) = argv::value(args, flag) {
            out.extend([flag.to_owned(), value]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn dynamo_wrapper_flags_are_dropped_or_renamed() {
        let args = words(
            "--model Qwen/Qwen3-0.6B --is-prefill-worker --connector nixl lmcache \
             --migration-limit 3 --no-fpm-trace --dyn-tool-call-parser hermes \
             --gpu-memory-utilization 0.85 --dyn-structural-tag --enforce-eager",
        );
        assert_eq!(dynamo_role(&args), Some(Role::Prefill));
        assert_eq!(
            from_dynamo(BackendFramework::Vllm, &args),
            words(
                "--model Qwen/Qwen3-0.6B --gpu-memory-utilization 0.85 --enforce-eager \
                 --tool-call-parser hermes --enable-auto-tool-choice"
            )
        );
        assert_eq!(
            from_dynamo(
                BackendFramework::Sglang,
                &words("--dyn-reasoning-parser qwen3")
            ),
            words("--reasoning-parser qwen3")
        );
    }

    #[test]
    fn the_mocker_keeps_only_what_it_understands() {
        let args = words("--model m --block-size 32 --max-num-seqs 8 --enforce-eager");
        assert_eq!(for_mocker(&args), words("--block-size 32 --max-num-seqs 8"));
    }

    #[test]
    fn the_backend_is_the_field_else_what_the_workers_run() {
        let graph =
            |yaml: &str| -> DynamoGraphDeploymentSpec { serde_saphyr::from_str(yaml).unwrap() };
        let dynamo = graph(
            "{services: {
               Frontend: {componentType: frontend, extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.frontend]}}},
               worker: {componentType: worker, extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.sglang]}}}}}",
        );
        assert_eq!(graph_backend(&dynamo), Some(BackendFramework::Sglang));
        let own = graph(
            "{services: {w: {extraPodSpec: {mainContainer: {command: [/usr/local/bin/vllm], args: [serve, m]}}}}}",
        );
        assert_eq!(graph_backend(&own), Some(BackendFramework::Vllm));
        let explicit = graph(
            "{backendFramework: mocker,
              services: {w: {extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.vllm]}}}}}",
        );
        assert_eq!(graph_backend(&explicit), Some(BackendFramework::Mocker));
        let unknown =
            graph("{services: {w: {extraPodSpec: {mainContainer: {command: [my-engine]}}}}}");
        assert_eq!(graph_backend(&unknown), None);
    }
}
