//! vLLM: `vllm serve` and Dynamo's `dynamo.vllm` wrapper.

use dynamo_crds::BackendFramework;
use dynamo_names::Role;

use super::Engine;
use crate::argv::{self, Arity};
use crate::{Addresses, EngineService, EnvValue, LOOPBACK, connector};

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
    // vLLM 0.33 binds only `tcp://*:PORT` (every interface); any other tcp endpoint it
    // connects to (`ZmqEventPublisher._is_bind_endpoint`, vllm/distributed/kv_events.py).
    kv_events_connect: true,
    // `KVEventsConfig.replay_endpoint`.
    replays_kv_events: true,
    // Through our KV connector (`connector`).
    unfed_kv_tiers,
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
    if argv::has(out, "--kv-transfer-config") {
        return;
    }
    // With tiers, our connector offloads to and onboards from the sidecar (beside NIXL on
    // a prefill or decode engine). Without, NixlConnector moves a disaggregated prompt's
    // blocks itself; both sides are `kv_both` (vllm docs/features/nixl_connector_usage.md),
    // its side channel is in the environment.
    if engine.kvbm.is_some() {
        out.extend([
            "--kv-transfer-config".into(),
            connector::kv_transfer_config(
                engine.role,
                at.sidecar_grpc,
                engine.served_model.as_deref(),
            ),
        ]);
    } else if engine.role != Role::Aggregated {
        out.extend([
            "--kv-transfer-config".into(),
            r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#.into(),
        ]);
    }
}

/// Our connector keeps one payload per block hash, but each rank of a tensor or pipeline
/// parallel engine holds its own shard of a block under the same hash.
fn unfed_kv_tiers(engine: &EngineService) -> Option<String> {
    let size = |long: &str, short: &str| {
        argv::value(engine.args(), long)
            .or_else(|| argv::value(engine.args(), short))
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(1)
    };
    let ranks = size("--tensor-parallel-size", "-tp") * size("--pipeline-parallel-size", "-pp");
    (ranks > 1).then(|| {
        format!(
            "its vllm engine runs {ranks} ranks (tensor or pipeline parallel), whose shards of a \
             block our KV connector does not keep apart yet"
        )
    })
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

/// A disaggregated vLLM's NIXL side channel, on an address decode pods reach; with tiers,
/// our connector's package on its `PYTHONPATH`.
fn env(engine: &EngineService, at: &Addresses) -> Vec<(&'static str, EnvValue)> {
    let mut env = match at.kv_side_channel(engine.backend) {
        Some(port) if engine.role != Role::Aggregated => vec![
            (SIDE_CHANNEL_HOST, EnvValue::PodIp),
            (SIDE_CHANNEL_PORT, EnvValue::Literal(port.to_string())),
        ],
        _ => Vec::new(),
    };
    if engine.kvbm.is_some() {
        env.push((connector::PYTHONPATH, EnvValue::ConnectorPath));
    }
    env
}
