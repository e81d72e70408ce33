//! What the plan knows of each engine: how to start its OpenAI server, which of its flags
//! name the model, the served name and the KV block size, and how Dynamo's worker
//! wrappers (`python3 -m dynamo.vllm`, ...) map onto the engine's own server.

use dynamo_crds::{BackendFramework, EngineRole};

use super::argv::{self, Arity};

/// Flags that name the model an engine loads, first found wins.
pub(super) fn model_flags(backend: BackendFramework) -> &'static [&'static str] {
    match backend {
        BackendFramework::Vllm | BackendFramework::Trtllm => &["--model", "--model-path"],
        BackendFramework::Sglang => &["--model-path", "--model"],
        BackendFramework::Mocker => &["--model-path", "--model"],
    }
}

/// The flag of the name clients send; without it engines serve the model's own name
/// (`trtllm-serve` has none: it serves the model it was given).
pub(super) fn served_name_flag(backend: BackendFramework) -> Option<&'static str> {
    match backend {
        BackendFramework::Mocker => Some("--model-name"),
        BackendFramework::Vllm | BackendFramework::Sglang => Some("--served-model-name"),
        BackendFramework::Trtllm => None,
    }
}

/// The KV block size flag, and the engine's default block size in tokens.
pub(super) fn block_size(backend: BackendFramework) -> (Option<&'static str>, u32) {
    match backend {
        // vllm/config/cache.py: `block_size` defaults to 16 on CUDA.
        BackendFramework::Vllm => (Some("--block-size"), 16),
        // sglang/srt/server_args.py: `page_size` defaults to 1.
        BackendFramework::Sglang => (Some("--page-size"), 1),
        // tensorrt_llm/llmapi/llm_args.py: `KvCacheConfig.tokens_per_block` defaults to 32,
        // set through the extra LLM API options file rather than a flag.
        BackendFramework::Trtllm => (None, 32),
        // The mock engine's own default (mocker/src/main.rs).
        BackendFramework::Mocker => (Some("--block-size"), 64),
    }
}

/// Whether the engine publishes KV events on a ZMQ socket the sidecar relays (vLLM's
/// `--kv-events-config`, which SGLang copied; the mock engine's own publisher). TensorRT-LLM
/// has no such publisher: its pods are routed on load and approximate overlap only.
pub(super) fn publishes_kv_events(backend: BackendFramework) -> bool {
    !matches!(backend, BackendFramework::Trtllm)
}

/// Whether the engine answers vLLM's KV event replay requests (vLLM's
/// `KVEventsConfig.replay_endpoint`), so the sidecar can repair gaps instead of resetting.
pub(super) fn replays_kv_events(backend: BackendFramework) -> bool {
    matches!(backend, BackendFramework::Vllm)
}

/// The port where a disaggregated engine's peers first reach it to set up a KV transfer,
/// by default: vLLM NixlConnector's side channel (`VLLM_NIXL_SIDE_CHANNEL_PORT`, 5600,
/// vllm/envs.py; each data-parallel rank listens on it plus its rank), SGLang's
/// bootstrap server (`--disaggregation-bootstrap-port`, 8998,
/// python/sglang/srt/server_args.py). The mock engine has none: its blocks move through
/// the sidecars' block API.
pub(super) fn kv_side_channel_port(backend: BackendFramework) -> Option<u16> {
    match backend {
        BackendFramework::Vllm => Some(5600),
        BackendFramework::Sglang => Some(8998),
        BackendFramework::Trtllm | BackendFramework::Mocker => None,
    }
}

/// vLLM NixlConnector's side channel: the address it binds and hands to decode engines in
/// `kv_transfer_params` (`remote_host`, `remote_port`); its host defaults to
/// `localhost`, which no other pod reaches (vllm/envs.py,
/// docs/features/nixl_connector_usage.md).
pub(super) const VLLM_SIDE_CHANNEL_HOST: &str = "VLLM_NIXL_SIDE_CHANNEL_HOST";
pub(super) const VLLM_SIDE_CHANNEL_PORT: &str = "VLLM_NIXL_SIDE_CHANNEL_PORT";
/// SGLang's flag for its bootstrap server's port.
pub(super) const SGLANG_BOOTSTRAP_PORT: &str = "--disaggregation-bootstrap-port";

/// Flags the plan sets itself, so the user's are dropped: the engine's address and its KV
/// event publisher are the pod's contract with the sidecar (`DESIGN.md`, "Pod anatomy").
pub(super) fn owned_flags(backend: BackendFramework) -> &'static [(&'static str, Arity)] {
    match backend {
        BackendFramework::Vllm => &[
            ("--host", Arity::One),
            ("--port", Arity::One),
            ("--kv-events-config", Arity::One),
        ],
        BackendFramework::Sglang => &[
            ("--host", Arity::One),
            ("--port", Arity::One),
            ("--kv-events-config", Arity::One),
            // Dynamo's SGLang worker passes it because Dynamo's frontend sends token ids;
            // our picker sends the OpenAI request itself, which the engine must tokenize.
            ("--skip-tokenizer-init", Arity::None),
        ],
        BackendFramework::Trtllm => &[("--host", Arity::One), ("--port", Arity::One)],
        BackendFramework::Mocker => &[
            ("--host", Arity::One),
            ("--port", Arity::One),
            ("--kv-events-endpoint", Arity::One),
            // Its sidecar's gRPC address, set when the service has KV block tiers.
            ("--kv-blocks-url", Arity::One),
        ],
    }
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

/// Dynamo's flags that have an engine twin: (Dynamo's, the engine's).
fn dynamo_renamed(backend: BackendFramework) -> &'static [(&'static str, &'static str)] {
    match backend {
        BackendFramework::Vllm | BackendFramework::Sglang | BackendFramework::Mocker => &[
            ("--dyn-tool-call-parser", "--tool-call-parser"),
            ("--dyn-reasoning-parser", "--reasoning-parser"),
            ("--custom-jinja-template", "--chat-template"),
        ],
        // Dynamo's TensorRT-LLM worker (`components/src/dynamo/trtllm/args.py`) spells
        // these as vLLM does; `trtllm-serve` takes them with underscores.
        BackendFramework::Trtllm => &[
            ("--tensor-parallel-size", "--tp_size"),
            ("--pipeline-parallel-size", "--pp_size"),
            ("--expert-parallel-size", "--ep_size"),
            ("--extra-engine-args", "--extra_llm_api_options"),
        ],
    }
}

/// The worker's role as Dynamo's vLLM wrapper flags say it, if they do.
pub(super) fn dynamo_role(args: &[String]) -> Option<EngineRole> {
    if argv::has(args, "--is-prefill-worker") {
        Some(EngineRole::Prefill)
    } else if argv::has(args, "--is-decode-worker") {
        Some(EngineRole::Decode)
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
    for &(dynamo, engine) in dynamo_renamed(backend) {
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
        assert_eq!(dynamo_role(&args), Some(EngineRole::Prefill));
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
}
