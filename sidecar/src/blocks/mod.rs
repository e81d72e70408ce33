//! The KV block store (`DESIGN.md`, "KV blocks in the sidecar"): the tiers the engine
//! offloads its KV blocks to and onboards them back from, served as the block API.
//!
//! - [`admission`]: what a block must be to be stored or served (checksum, layout, MAC);
//! - [`store`]: carries out `dynamo_kvblocks::placement`'s decisions and publishes what
//!   each tier holds into the pod's KV event stream;
//! - [`disk`] and [`object`]: the G3 and G4 tiers (host memory lives in the store);
//! - [`lease`]: blocks held for a remote decode (disaggregated serving), within the
//!   lease [`budget`]; a lease's payloads [`exposure`] for a peer's NIXL read;
//! - [`service`]: the gRPC block API, behind its [`guard`]; an onboard's [`answer`]
//!   is charged to the lease budget until taken;
//! - [`metrics`]: `kvbm_*` and `dynamo_sidecar_kv_*`.

pub mod admission;
pub mod answer;
pub mod budget;
pub mod disk;
pub mod exposure;
pub mod guard;
pub mod lease;
pub mod metrics;
pub mod object;
pub mod service;
pub mod store;

pub use store::BlockStore;

use std::sync::Arc;

use anyhow::Context;
use dynamo_kvblocks::placement::{PlacementConfig, TierLimits};
use dynamo_kvstream::KvEventHub;

use crate::config::KvTierFlags;
use admission::Admission;
use disk::DiskTier;
use metrics::BlockMetrics;
use object::ObjectTier;

/// Largest record a tier reads back: a block as large as the block API carries, and its
/// header.
const MAX_RECORD_BYTES: u64 = dynamo_kvblocks::MAX_MESSAGE_BYTES as u64 + 4096;

/// The store the flags ask for; `None` when every tier is off.
pub fn open(
    flags: &KvTierFlags,
    hub: KvEventHub,
    metrics: Arc<BlockMetrics>,
    admission: Arc<Admission>,
) -> anyhow::Result<Option<BlockStore>> {
    let limits = |bytes: Option<u64>, min_reuse| {
        bytes.filter(|&b| b > 0).map(|capacity_bytes| TierLimits {
            capacity_bytes,
            min_reuse,
        })
    };
    let placement = PlacementConfig {
        host: limits(flags.kv_host_bytes, 1),
        disk: limits(flags.kv_disk_bytes, flags.kv_disk_min_reuse),
        object: limits(flags.kv_object_bytes, flags.kv_object_min_reuse),
    };
    if !placement.any() {
        return Ok(None);
    }
    let disk = match (&flags.kv_disk_dir, placement.disk) {
        (Some(dir), Some(_)) => Some(
            DiskTier::open(dir, MAX_RECORD_BYTES)
                .with_context(|| format!("--kv-disk-dir {}", dir.display()))?,
        ),
        _ => None,
    };
    let object = match (&flags.kv_object_url, placement.object) {
        (Some(url), Some(_)) => Some(
            ObjectTier::from_url(url, MAX_RECORD_BYTES)
                .with_context(|| format!("--kv-object-url {url}"))?,
        ),
        _ => None,
    };
    let buffer = flags.kv_write_buffer_bytes;
    Ok(Some(BlockStore::open(
        placement, disk, object, buffer, hub, metrics, admission,
    )))
}

/// A small block for the tiers' unit tests.
#[cfg(test)]
fn test_block(hash: u64, parent: Option<u64>, payload: &'static [u8]) -> dynamo_kvblocks::Block {
    let layout = dynamo_kvblocks::Layout {
        block_bytes: payload.len() as u64,
        block_size: 4,
        layers: 1,
        dtype: "bfloat16".into(),
    };
    dynamo_kvblocks::Block::new(
        dynamo_kvcache::SeqHash(hash),
        parent.map(dynamo_kvcache::SeqHash),
        4,
        layout,
        bytes::Bytes::from_static(payload),
    )
}
