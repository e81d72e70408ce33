//! The mock engine (`dynamo-mocker`, and Dynamo's `dynamo.mocker`).

use dynamo_crds::BackendFramework;
use dynamo_names::Role;

use super::{Engine, no_env};
use crate::argv::{self, Arity};
use crate::{Addresses, EngineService, LOOPBACK, MOCKER_BINARY};

pub(super) const ENGINE: Engine = Engine {
    backend: BackendFramework::Mocker,
    launchers: &["dynamo.mocker", MOCKER_BINARY],
    server: &[MOCKER_BINARY],
    server_model_flag: Some("--model-path"),
    model_flags: &["--model-path", "--model"],
    served_name_flag: Some("--model-name"),
    // The mock engine's own default (mocker/src/args.rs).
    block_size_flag: Some("--block-size"),
    default_block_size: 64,
    publishes_kv_events: true,
    kv_events_connect: false,
    replays_kv_events: false,
    unfed_kv_tiers: |_| None,
    // Its blocks move through the sidecars' block API.
    kv_side_channel_port: None,
    owned_flags: &[
        ("--host", Arity::One),
        ("--port", Arity::One),
        ("--kv-events-endpoint", Arity::One),
        // Its sidecar's gRPC address, set when the service has KV block tiers.
        ("--kv-blocks-url", Arity::One),
    ],
    dynamo_renamed: super::PARSER_FLAGS,
    write_flags,
    env: no_env,
};

fn write_flags(engine: &EngineService, at: &Addresses, out: &mut Vec<String>) {
    out.extend([
        "--kv-events-endpoint".into(),
        format!("tcp://{LOOPBACK}:{}", at.kv_events),
    ]);
    // It offloads evicted blocks to its sidecar's tiers and onboards them back;
    // disaggregated, it lends its prompt blocks to its sidecar and takes fetched ones from
    // it (leases). Real engines would need a connector to the block API (vLLM's
    // `kv_connector`), which does not exist yet: their sidecars hold only what a client
    // offloads through the API.
    if engine.kvbm.is_some() || engine.role != Role::Aggregated {
        out.extend([
            "--kv-blocks-url".into(),
            format!("http://{LOOPBACK}:{}", at.sidecar_grpc),
        ]);
    }
    // Disaggregated without tiers its sidecar only holds the leases: nothing to offload to.
    if engine.role != Role::Aggregated && engine.kvbm.is_none() && !argv::has(out, "--kv-offload") {
        out.extend(["--kv-offload".into(), "none".into()]);
    }
}
