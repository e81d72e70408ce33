//! SGLang: `python3 -m sglang.launch_server` and Dynamo's `dynamo.sglang` wrapper.

use dynamo_crds::BackendFramework;
use dynamo_names::Role;

use super::{Engine, no_env};
use crate::argv::{self, Arity};
use crate::{Addresses, EngineService};

/// SGLang's flag for its bootstrap server's port.
const BOOTSTRAP_PORT: &str = "--disaggregation-bootstrap-port";

pub(super) const ENGINE: Engine = Engine {
    backend: BackendFramework::Sglang,
    launchers: &["dynamo.sglang", "sglang.launch_server"],
    server: &["python3", "-m", "sglang.launch_server"],
    server_model_flag: Some("--model-path"),
    model_flags: &["--model-path", "--model"],
    served_name_flag: Some("--served-model-name"),
    // sglang/srt/server_args.py: `page_size` defaults to 1.
    block_size_flag: Some("--page-size"),
    default_block_size: 1,
    // vLLM's `--kv-events-config`, which SGLang copied.
    publishes_kv_events: true,
    kv_events_connect: false,
    replays_kv_events: false,
    unfed_kv_tiers: super::no_kv_connector,
    // Its bootstrap server (`--disaggregation-bootstrap-port`, 8998,
    // python/sglang/srt/server_args.py).
    kv_side_channel_port: Some(8998),
    owned_flags: &[
        ("--host", Arity::One),
        ("--port", Arity::One),
        ("--kv-events-config", Arity::One),
        // Dynamo's SGLang worker passes it because Dynamo's frontend sends token ids;
        // our picker sends the OpenAI request itself, which the engine must tokenize.
        ("--skip-tokenizer-init", Arity::None),
    ],
    dynamo_renamed: super::PARSER_FLAGS,
    write_flags,
    env: no_env,
};

fn write_flags(engine: &EngineService, at: &Addresses, out: &mut Vec<String>) {
    out.extend([
        "--kv-events-config".into(),
        super::vllm::kv_events_config(at, false),
    ]);
    if engine.role == Role::Aggregated {
        return;
    }
    if !argv::has(out, "--disaggregation-mode") {
        out.extend(["--disaggregation-mode".into(), engine.role.as_str().into()]);
    }
    if let Some(port) = at.kv_side_channel(engine.backend)
        && !argv::has(out, BOOTSTRAP_PORT)
    {
        out.extend([BOOTSTRAP_PORT.into(), port.to_string()]);
    }
}
