//! vLLM: `vllm serve` and Dynamo's `dynamo.vllm` wrapper.

use dynamo_crds::BackendFramework;
use dynamo_names::Role;

use super::Engine;
use crate::argv::{self, Arity};
use crate::{Addresses, EngineService, EnvValue, LOOPBACK};

/// vLLM NixlConnector's side channel: the address it binds and hands to decode engines in
/// `kv_transfer_params` (`remote_host`, `remote_port`); its host defaults to
/// `localhost`, which no other pod reaches (vllm/envs.py,
/// docs/features/nixl_connector_usage.md).
const SIDE_CHANNEL_HOST: &str = "VLLM_NIXL_SIDE_CHANNEL_HOST";
const SIDE_CHANNEL_PORT: &str = "VLLM_NIXL_SIDE_CHANNEL_PORT";

pub(super) const ENGINE: Engine = Engine {
    backend: BackendFramework::Vllm,
    launchers: &["dynamo.vllm", "vllm", "vllm.entrypoints.openai.api_server"],
    server: &["vllm", "serve"],
    server_model_flag: None,
    model_flags: &["--model", "--model-path"],
    served_name_flag: Some("--served-model-name"),
    // vllm/config/cache.py: `block_size` defaults to 16 on CUDA.
    block_size_flag: Some("--block-size"),
    default_block_size: 16,
    publishes_kv_events: true,
    // `KVEventsConfig.replay_endpoint`.
    replays_kv_events: true,
    feeds_kv_tiers: false,
    // NixlConnector's side channel (`VLLM_NIXL_SIDE_CHANNEL_PORT`, 5600, vllm/envs.py;
    // each data-parallel rank listens on it plus its rank).
    kv_side_channel_port: Some(5600),
    owned_flags: &[
        ("--host", Arity::One),
        ("--port", Arity::One),
        ("--kv-events-config", Arity::One),
    ],
    dynamo_renamed: super::PARSER_FLAGS,
    write_flags,
    env,
};

fn write_flags(engine: &EngineService, at: &Addresses, out: &mut Vec<String>) {
    out.extend(["--kv-events-config".into(), kv_events_config(at, true)]);
    // NixlConnector moves the blocks itself; both sides are `kv_both` (vllm
    // docs/features/nixl_connector_usage.md). Its side channel is in the environment.
    if engine.role != Role::Aggregated && !argv::has(out, "--kv-transfer-config") {
        out.extend([
            "--kv-transfer-config".into(),
            r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#.into(),
        ]);
    }
}

/// vllm/config/kv_events.py `KVEventsConfig` (SGLang takes the same JSON), with the replay
/// endpoint when the engine answers replays.
pub(super) fn kv_events_config(at: &Addresses, replay: bool) -> String {
    let mut config = serde_json::json!({
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": format!("tcp://{LOOPBACK}:{}", at.kv_events),
    });
    if replay {
        config["replay_endpoint"] = format!("tcp://{LOOPBACK}:{}", at.kv_replay).into();
    }
    config.to_string()
}

/// A disaggregated vLLM's NIXL side channel, on an address decode pods reach.
fn env(engine: &EngineService, at: &Addresses) -> Vec<(&'static str, EnvValue)> {
    match at.kv_side_channel(engine.backend) {
        Some(port) if engine.role != Role::Aggregated => vec![
            (SIDE_CHANNEL_HOST, EnvValue::PodIp),
            (SIDE_CHANNEL_PORT, EnvValue::Literal(port.to_string())),
        ],
        _ => Vec::new(),
    }
}
