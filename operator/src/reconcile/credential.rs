//! The graph's block API credential ([`dynamo_wiring::credential`]): a Secret of the
//! graph holding a token the controller draws ([`Observed::fresh_token`]: the pure
//! function reads no randomness), created once and immutable, so every pod of the graph,
//! whenever it started, holds the same token. It is mounted read-only into the sidecar
//! and the engine of every engine pod and into the picker (for the sidecars' KV event
//! streams), and nowhere else: the planner and other workloads never see it. Creating it on every pass costs one refused create (409) and
//! spares the operator any right to read Secrets.

use std::collections::BTreeMap;

use dynamo_wiring::credential::CREDENTIAL_FILE_ENV;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, Secret, SecretVolumeSource, Volume, VolumeMount,
};

use super::graph::Graph;
use super::pods::{plain_env, upsert_env};
use super::{Desired, Observed, names};

const VOLUME: &str = "dynamo-block-api";
const DIR: &str = "/var/run/dynamo/block-api";
const KEY: &str = "token";

/// Whether the graph has one: when it has engine pods, whose sidecars need it.
pub(crate) fn wanted(g: &Graph) -> bool {
    g.engine_services().next().is_some()
}

pub(crate) fn build(g: &Graph, observed: &Observed, desired: &mut Desired) {
    if !wanted(g) {
        return;
    }
    desired.secrets.push(Secret {
        metadata: g.metadata(names::block_api(g.name), g.labels()),
        string_data: Some(BTreeMap::from([(
            KEY.to_string(),
            observed.fresh_token.clone(),
        )])),
        immutable: Some(true),
        ..Secret::default()
    });
}

/// The pod's volume of the Secret.
pub(crate) fn volume(g: &Graph) -> Volume {
    Volume {
        name: VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(names::block_api(g.name)),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// Gives `container` (an engine, its sidecar, or the picker, which subscribes to the
/// sidecars' KV event streams) the token's file and the variable naming it.
pub(crate) fn hand_to(container: &mut Container) {
    upsert_env(container.env.get_or_insert_with(Vec::new), env());
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    if !mounts.iter().any(|m| m.name == VOLUME) {
        mounts.push(mount());
    }
}

fn mount() -> VolumeMount {
    VolumeMount {
        name: VOLUME.into(),
        mount_path: DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

fn env() -> EnvVar {
    plain_env(CREDENTIAL_FILE_ENV, &format!("{DIR}/{KEY}"))
}
