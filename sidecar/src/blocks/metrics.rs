//! Metrics of the KV block store: Dynamo KVBM's `kvbm_*` names where KVBM has the
//! measure (pillars.md 3.1, from `lib/runtime/src/metrics/prometheus_names.rs`), and
//! `dynamo_sidecar_kv_*` for the rest. Directions are named as KVBM names them from the
//! GPU's side: `d2h` engine -> host, `h2d` host -> disk (offload) or host -> engine
//! (onboard), `d2d` engine <-> disk, `d2o` / `o2d` to and from the object store.

use dynamo_kvcache::Tier;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::metrics::{Label, Metrics};

type Ratio = Gauge<f64, AtomicU64>;

#[derive(Debug, Default)]
pub struct BlockMetrics {
    pub offload_d2h: Counter,
    pub offload_d2d: Counter,
    pub offload_h2d: Counter,
    pub offload_d2o: Counter,
    pub onboard_h2d: Counter,
    pub onboard_d2d: Counter,
    pub onboard_o2d: Counter,
    pub offload_bytes_object: Counter,
    pub onboard_bytes_object: Counter,
    pub object_read_failures: Counter,
    pub object_write_failures: Counter,
    pub matched_tokens: Counter,
    /// Per tier (host, disk, object): share of the blocks asked for in lookups that the
    /// tier answered.
    hit_rate: [Ratio; 3],
    asked: AtomicU64,
    hits: [AtomicU64; 3],
    /// Offered blocks by `outcome`: `stored`, `duplicate`, `dropped`, `corrupt`.
    pub offered: Family<Label, Counter>,
    /// Blocks that did not reach a tier, by `reason`.
    pub dropped: Family<Label, Counter>,
    /// Blocks that failed their checksum (or could not be decoded) on a read, by `tier`.
    pub corrupt: Family<Label, Counter>,
    /// Bytes moved, by `direction` (`offload`, `onboard`).
    pub bytes: Family<Label, Counter>,
    /// Bytes and blocks each tier holds or is writing, by `tier`.
    pub tier_bytes: Family<Label, Gauge>,
    pub tier_blocks: Family<Label, Gauge>,
}

impl BlockMetrics {
    /// The metrics, registered with the sidecar's.
    pub fn register(metrics: &mut Metrics) -> Self {
        let m = Self::default();
        let kvbm = metrics.unprefixed().sub_registry_with_prefix("kvbm");
        let counters: [(&str, &str, &Counter); 12] = [
            (
                "offload_blocks_d2h",
                "Blocks offloaded from the engine to host memory",
                &m.offload_d2h,
            ),
            (
                "offload_blocks_d2d",
                "Blocks offloaded from the engine straight to disk",
                &m.offload_d2d,
            ),
            (
                "offload_blocks_h2d",
                "Blocks moved from host memory to disk",
                &m.offload_h2d,
            ),
            (
                "offload_blocks_d2o",
                "Blocks moved to the object store",
                &m.offload_d2o,
            ),
            (
                "onboard_blocks_h2d",
                "Blocks onboarded to the engine from host memory",
                &m.onboard_h2d,
            ),
            (
                "onboard_blocks_d2d",
                "Blocks onboarded to the engine from disk",
                &m.onboard_d2d,
            ),
            (
                "onboard_blocks_o2d",
                "Blocks onboarded to the engine from the object store",
                &m.onboard_o2d,
            ),
            (
                "offload_bytes_object",
                "Bytes written to the object store",
                &m.offload_bytes_object,
            ),
            (
                "onboard_bytes_object",
                "Bytes read from the object store",
                &m.onboard_bytes_object,
            ),
            (
                "object_read_failures",
                "Failed reads from the object store",
                &m.object_read_failures,
            ),
            (
                "object_write_failures",
                "Failed writes to the object store",
                &m.object_write_failures,
            ),
            (
                "matched_tokens",
                "Tokens of looked-up prefixes that a tier holds",
                &m.matched_tokens,
            ),
        ];
        for (name, help, counter) in counters {
            kvbm.register(name, help, counter.clone());
        }
        for (tier, gauge) in ["host", "disk", "object"].into_iter().zip(&m.hit_rate) {
            kvbm.register(
                format!("{tier}_cache_hit_rate"),
                format!("Share of looked-up blocks found in the {tier} tier"),
                gauge.clone(),
            );
        }
        let ours: &mut Registry = metrics.registry();
        ours.register(
            "kv_offered_blocks",
            "Blocks the engine offloaded, by outcome",
            m.offered.clone(),
        );
        ours.register(
            "kv_dropped_blocks",
            "Blocks that did not reach a tier, by reason",
            m.dropped.clone(),
        );
        ours.register(
            "kv_corrupt_blocks",
            "Blocks that failed their checksum when read, by tier",
            m.corrupt.clone(),
        );
        ours.register(
            "kv_block_bytes",
            "Block bytes moved between the engine and the tiers, by direction",
            m.bytes.clone(),
        );
        ours.register(
            "kv_tier_bytes",
            "Bytes each tier holds or is writing",
            m.tier_bytes.clone(),
        );
        ours.register(
            "kv_tier_blocks",
            "Blocks each tier holds or is writing",
            m.tier_blocks.clone(),
        );
        m
    }

    /// Counts a lookup of `asked` blocks that found `found`, each in its best tier.
    pub fn lookup(&self, asked: usize, found: impl Iterator<Item = Tier>) {
        use std::sync::atomic::Ordering::Relaxed;
        let asked = self.asked.fetch_add(asked as u64, Relaxed) + asked as u64;
        for tier in found {
            self.hits[tier.index() - 1].fetch_add(1, Relaxed);
        }
        if asked > 0 {
            for (hits, rate) in self.hits.iter().zip(&self.hit_rate) {
                rate.set(hits.load(Relaxed) as f64 / asked as f64);
            }
        }
    }
}
