//! Metrics of the prefill hop and the KV transfer (`dynamo_sidecar_prefill_*`,
//! `dynamo_sidecar_kv_transfer_*`).

use dynamo_llm::disagg::HopOutcome;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use super::transfer::Transport;
use crate::metrics::{Label, Metrics};

#[derive(Clone)]
pub struct HopMetrics {
    /// Prefill hops by `outcome` (`dynamo_llm::disagg::HopOutcome`).
    hops: Family<Label, Counter>,
    /// Seconds from sending the prefill leg to its answer.
    pub prefill_seconds: Histogram,
    /// Seconds to fetch a prompt's blocks from the prefill pod's sidecar.
    pub transfer_seconds: Histogram,
    pub transfer_bytes: Counter,
    pub transfer_blocks: Counter,
    /// Transfers not made: the prefill's answer named a port other than its sidecar's
    /// announced block API port.
    pub transfer_unannounced_port: Counter,
    /// Transfers made, by `transport` (`nixl`, `grpc`).
    transfers: Family<Label, Counter>,
}

impl HopMetrics {
    pub fn register(metrics: &mut Metrics) -> Self {
        let m = Self {
            hops: Family::default(),
            // 1 ms to 65 s.
            prefill_seconds: Histogram::new(exponential_buckets(1e-3, 2.0, 17)),
            // 100 µs to 6.5 s.
            transfer_seconds: Histogram::new(exponential_buckets(1e-4, 2.0, 17)),
            transfer_bytes: Counter::default(),
            transfer_blocks: Counter::default(),
            transfer_unannounced_port: Counter::default(),
            transfers: Family::default(),
        };
        let r = metrics.registry();
        r.register(
            "prefill_hops",
            "Prefill hops of disaggregated requests, by outcome",
            m.hops.clone(),
        );
        r.register(
            "prefill_seconds",
            "Seconds the prefill pod took to answer the prefill leg",
            m.prefill_seconds.clone(),
        );
        r.register(
            "kv_transfer_seconds",
            "Seconds to fetch a prompt's KV blocks from the prefill pod's sidecar",
            m.transfer_seconds.clone(),
        );
        r.register(
            "kv_transfer_bytes",
            "KV block bytes fetched from prefill pods",
            m.transfer_bytes.clone(),
        );
        r.register(
            "kv_transfer_blocks",
            "KV blocks fetched from prefill pods",
            m.transfer_blocks.clone(),
        );
        r.register(
            "kv_transfer_unannounced_port",
            "KV transfers not made: the prefill's answer named a port other than its sidecar's block API",
            m.transfer_unannounced_port.clone(),
        );
        r.register(
            "kv_transfers",
            "KV transfers from prefill pods, by transport (nixl, grpc)",
            m.transfers.clone(),
        );
        m
    }

    /// Counts a transfer made over `transport`.
    pub fn transfer(&self, transport: Transport) {
        self.transfers
            .get_or_create(&[("transport", transport.as_str())])
            .inc();
    }

    pub fn hop(&self, outcome: HopOutcome) {
        self.hops
            .get_or_create(&[("outcome", outcome.as_str())])
            .inc();
    }

    /// Hops counted under `outcome`.
    pub fn hops(&self, outcome: HopOutcome) -> u64 {
        self.hops
            .get_or_create(&[("outcome", outcome.as_str())])
            .get()
    }
}
