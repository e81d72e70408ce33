//! Whether bringing held KV blocks back from the sidecar's tiers beats computing them
//! again: the blocks' real bytes over each tier's bandwidth against the engine's own
//! modelled prefill time for their tokens. A slow tier (the object store over a thin
//! link) can cost more than a fast GPU's prefill; a host tier almost never does.

use dynamo_kvcache::Tier;

use crate::kv_blocks::KvBlocksConfig;
use crate::timing::TimingModel;

/// What one held prefix costs, both ways.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnboardPlan {
    /// Leading held blocks to onboard; the rest of the held prefix is recomputed.
    pub blocks: usize,
    /// Modelled ms to move those blocks (before the speedup ratio).
    pub transfer_ms: f64,
}

/// How many leading blocks of a held prefix (`tiers`, the tier of each, in chain order)
/// to onboard: the count whose transfer plus the prefill of everything after it is
/// least. `tokens_after` are the prompt tokens past the held prefix, computed either
/// way, so only the marginal prefill of the held blocks' tokens is weighed (a step's
/// fixed cost is paid anyway). Ties onboard (it spares the GPU the work).
pub fn plan_onboard(
    tiers: &[Tier],
    block_tokens: usize,
    real_block_bytes: u64,
    tokens_after: usize,
    config: &KvBlocksConfig,
    timing: &TimingModel,
) -> OnboardPlan {
    let recompute = |blocks: usize| timing.prefill_ms(blocks * block_tokens + tokens_after);
    let mut best = OnboardPlan {
        blocks: 0,
        transfer_ms: 0.0,
    };
    let mut best_cost = recompute(tiers.len());
    let mut transfer_ms = 0.0;
    for (i, &tier) in tiers.iter().enumerate() {
        transfer_ms += config.transfer_ms(real_block_bytes, tier);
        let onboarded = i + 1;
        let cost = transfer_ms + recompute(tiers.len() - onboarded);
        if cost <= best_cost {
            best_cost = cost;
            best = OnboardPlan {
                blocks: onboarded,
                transfer_ms,
            };
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// qwen-mock's 64-token block: 786,432 bytes.
    const BLOCK: u64 = 2 * 24 * 2 * 64 * 2 * 64;

    fn plan(tiers: &[Tier], config: &KvBlocksConfig) -> OnboardPlan {
        plan_onboard(tiers, 64, BLOCK, 40, config, &TimingModel::Polynomial)
    }

    #[test]
    fn host_and_disk_blocks_are_onboarded_at_the_datasheet_bandwidths() {
        // 0.79 MB: 4 us from host memory, 112 us from one NVMe drive, against ~1 ms of
        // prefill per 64 tokens on the polynomial model.
        let config = KvBlocksConfig::default();
        let held = [Tier::Host, Tier::Host, Tier::Disk, Tier::Disk];
        let p = plan(&held, &config);
        assert_eq!(p.blocks, 4);
        let expected = 2.0 * BLOCK as f64 / 200e6 + 2.0 * BLOCK as f64 / 7e6;
        assert!((p.transfer_ms - expected).abs() < 1e-9);
    }

    #[test]
    fn a_tier_slower_than_prefill_is_recomputed_from_where_it_starts() {
        // The object store over a 10 Mb/s link: 0.63 s a block, far past its prefill.
        let config = KvBlocksConfig {
            object_bandwidth_gbps: 0.00125,
            ..KvBlocksConfig::default()
        };
        let held = [Tier::Host, Tier::Host, Tier::Object, Tier::Object];
        assert_eq!(plan(&held, &config).blocks, 2);
        assert_eq!(plan(&[Tier::Object; 3], &config).blocks, 0);
        assert_eq!(plan(&[], &config).blocks, 0);
    }
}
