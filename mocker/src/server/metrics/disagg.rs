//! Metrics of disaggregated serving. The transfer's are vLLM's NixlConnector names and
//! buckets (`nixl_connector.py`, `NixlPromMetrics`), so a P/D dashboard reads the mock
//! engine as it reads vLLM; lends and fallbacks have no vLLM counterpart and are ours.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use super::{EngineMetricsExporter, Labels};

/// vLLM's `vllm:nixl_xfer_time_seconds` buckets (its list without the leading 1 ms).
const XFER_TIME_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0,
];

/// vLLM's `vllm:nixl_bytes_transferred` buckets: `2 ** (10 + i)` for odd `i` in 1..25,
/// 2 KiB to 8 GiB by factors of 4.
fn bytes_buckets() -> impl Iterator<Item = f64> {
    (1..25).step_by(2).map(|i| 2f64.powi(10 + i))
}

/// Counters and histograms of both roles; clones share them.
#[derive(Clone)]
pub struct DisaggMetrics {
    /// Decode: seconds from asking for a lease to its blocks being usable.
    pub xfer_time: Histogram,
    /// Decode: real KV bytes moved per transfer.
    pub bytes_transferred: Histogram,
    pub failed_transfers: Counter,
    /// Decode: verified blocks taken from leases.
    pub lease_blocks: Counter,
    lends: Family<Labels, Counter>,
    fallbacks: Family<Labels, Counter>,
}

impl DisaggMetrics {
    /// Counts a prefill's lend by its `outcome`.
    pub fn lend(&self, outcome: &'static str) {
        self.lends
            .get_or_create(&vec![("outcome".into(), outcome.into())])
            .inc();
    }

    /// Counts a decode that recomputed (some of) a remote prefill, by `reason`.
    pub fn fallback(&self, reason: &'static str) {
        self.fallbacks
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }
}

impl EngineMetricsExporter {
    /// Registers the metrics of disaggregated serving (every engine can be asked to
    /// play either role, with or without a sidecar).
    pub fn register_disagg(&mut self) -> DisaggMetrics {
        let m = DisaggMetrics {
            xfer_time: Histogram::new(XFER_TIME_BUCKETS),
            bytes_transferred: Histogram::new(bytes_buckets()),
            failed_transfers: Counter::default(),
            lease_blocks: Counter::default(),
            lends: Family::default(),
            fallbacks: Family::default(),
        };
        let r = &mut self.registry;
        r.register(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for KV cache transfers from a remote prefill",
            m.xfer_time.clone(),
        );
        r.register(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per KV cache transfer from a remote prefill",
            m.bytes_transferred.clone(),
        );
        r.register(
            "vllm:nixl_num_failed_transfers",
            "Number of failed KV cache transfers from a remote prefill",
            m.failed_transfers.clone(),
        );
        r.register(
            "dynamo_mocker_kv_lease_blocks",
            "Verified blocks a decode took from a remote prefill's lease",
            m.lease_blocks.clone(),
        );
        r.register(
            "dynamo_mocker_kv_lends",
            "Prefills for a remote decode, by outcome: lent, refused (by the sidecar), failed (error or timeout), empty (no full block), no_sidecar",
            m.lends.clone(),
        );
        r.register(
            "dynamo_mocker_kv_remote_prefill_fallbacks",
            "Decodes that recomputed what a remote prefill computed, by reason: no_sidecar, foreign_transport, invalid, gone, error, timeout, mismatch",
            m.fallbacks.clone(),
        );
        m
    }
}
