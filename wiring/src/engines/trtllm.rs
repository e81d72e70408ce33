//! TensorRT-LLM: `trtllm-serve` and Dynamo's `dynamo.trtllm` wrapper.

use dynamo_crds::BackendFramework;

use super::{Engine, no_env};
use crate::argv::Arity;
use crate::{Addresses, EngineService};

pub(super) const ENGINE: Engine = Engine {
    backend: BackendFramework::Trtllm,
    launchers: &["dynamo.trtllm", "trtllm-serve"],
    server: &["trtllm-serve"],
    server_model_flag: None,
    model_flags: &["--model", "--model-path"],
    // `trtllm-serve` has none: it serves the model it was given.
    served_name_flag: None,
    // tensorrt_llm/llmapi/llm_args.py: `KvCacheConfig.tokens_per_block` defaults to 32,
    // set through the extra LLM API options file rather than a flag.
    block_size_flag: None,
    default_block_size: 32,
    // No KV event publisher: its pods are routed on load and approximate overlap only.
    publishes_kv_events: false,
    kv_events_connect: false,
    replays_kv_events: false,
    unfed_kv_tiers: super::no_kv_connector,
    kv_side_channel_port: None,
    owned_flags: &[("--host", Arity::One), ("--port", Arity::One)],
    // Dynamo's TensorRT-LLM worker (`components/src/dynamo/trtllm/args.py`) spells these
    // as vLLM does; `trtllm-serve` takes them with underscores.
    dynamo_renamed: &[
        ("--tensor-parallel-size", "--tp_size"),
        ("--pipeline-parallel-size", "--pp_size"),
        ("--expert-parallel-size", "--ep_size"),
        ("--extra-engine-args", "--extra_llm_api_options"),
    ],
    write_flags,
    env: no_env,
};

fn write_flags(_: &EngineService, _: &Addresses, _: &mut Vec<String>) {}
