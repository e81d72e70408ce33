//! vLLM's Prometheus metrics, so dashboards, the router and the planner read the mock
//! engine exactly as they read vLLM.
//!
//! Names, label `model_name` and histogram buckets follow vLLM v1's Prometheus logger
//! (`vllm/v1/metrics/loggers.py`); prometheus-client appends `_total` to counters as
//! Python's `prometheus_client` does, so `vllm:prefix_cache_queries` is exported as
//! `vllm:prefix_cache_queries_total` by both.
//!
//! The KV block API's and prefix pinning's metrics have no vLLM counterpart; they are
//! ours, `dynamo_mocker_*`. Disaggregated serving's are in [`disagg`].

mod disagg;

pub use disagg::DisaggMetrics;

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use dynamo_kvcache::Tier;

use crate::{EngineMetrics, FinishReason, FinishedRequest, PinCounters, SchedulerCounters};

const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

type Labels = Vec<(String, String)>;

/// The engine's metrics registry, fed by the engine task.
/// Counters of the KV block API; clones share them.
#[derive(Clone, Default)]
pub struct KvBlockMetrics {
    pub offloaded: Counter,
    pub offload_dropped: Family<Labels, Counter>,
    pub onboarded: Family<Labels, Counter>,
    pub onboarded_bytes: Counter,
    /// The model's real KV bytes of those blocks: what their transfer is charged on.
    pub onboarded_real_bytes: Counter,
    /// Held blocks left in the sidecar: computing them is cheaper than moving them.
    pub recomputed_cheaper: Counter,
    pub corrupt: Counter,
    pub missing: Counter,
    pub fallbacks: Family<Labels, Counter>,
}

impl KvBlockMetrics {
    pub fn offload_dropped(&self, reason: &'static str, blocks: u64) {
        self.offload_dropped
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc_by(blocks);
    }

    pub fn onboarded(&self, tier: Tier) -> Counter {
        self.onboarded
            .get_or_create(&vec![("tier".into(), tier.as_str().into())])
            .clone()
    }

    pub fn fallback(&self, reason: &'static str) {
        self.fallbacks
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }
}

pub struct EngineMetricsExporter {
    registry: Registry,
    running: Gauge,
    waiting: Gauge,
    kv_cache_usage: Gauge<f64, AtomicU64>,
    prefix_cache_queries: Counter,
    prefix_cache_hits: Counter,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    preemptions: Counter,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    success: Family<Labels, Counter>,
    pinned_blocks: Gauge,
    pins_set: Counter,
    pins_renewed: Counter,
    pinned_evicted_offloaded: Counter,
    pinned_evicted_dropped: Counter,
    /// Engine counters at the last update, to add only what changed since.
    seen: Mutex<(SchedulerCounters, PinCounters)>,
}

impl EngineMetricsExporter {
    pub fn new(model_name: &str, block_size: usize, num_gpu_blocks: usize) -> Self {
        let mut r = Registry::with_labels(
            [("model_name".into(), model_name.to_owned().into())].into_iter(),
        );
        let running = Gauge::default();
        let waiting = Gauge::default();
        let kv_cache_usage = Gauge::<f64, AtomicU64>::default();
        let prefix_cache_queries = Counter::default();
        let prefix_cache_hits = Counter::default();
        let prompt_tokens = Counter::default();
        let generation_tokens = Counter::default();
        let preemptions = Counter::default();
        let ttft = Histogram::new(TTFT_BUCKETS);
        let itl = Histogram::new(ITL_BUCKETS);
        let e2e = Histogram::new(E2E_BUCKETS);
        let success = Family::<Labels, Counter>::default();
        let cache_config = Family::<Labels, Gauge>::default();
        cache_config
            .get_or_create(&vec![
                ("block_size".into(), block_size.to_string()),
                ("num_gpu_blocks".into(), num_gpu_blocks.to_string()),
            ])
            .set(1);
        r.register(
            "vllm:num_requests_running",
            "Requests in the running batch",
            running.clone(),
        );
        r.register(
            "vllm:num_requests_waiting",
            "Requests waiting to be scheduled",
            waiting.clone(),
        );
        r.register(
            "vllm:kv_cache_usage_perc",
            "Fraction of KV cache blocks in use (0 to 1)",
            kv_cache_usage.clone(),
        );
        r.register(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            prefix_cache_queries.clone(),
        );
        r.register(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            prefix_cache_hits.clone(),
        );
        r.register(
            "vllm:prompt_tokens",
            "Prompt tokens prefilled",
            prompt_tokens.clone(),
        );
        r.register(
            "vllm:generation_tokens",
            "Tokens generated",
            generation_tokens.clone(),
        );
        r.register(
            "vllm:num_preemptions",
            "Requests preempted for lack of KV blocks",
            preemptions.clone(),
        );
        r.register(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            ttft.clone(),
        );
        r.register(
            "vllm:inter_token_latency_seconds",
            "Time between output tokens",
            itl.clone(),
        );
        r.register(
            "vllm:e2e_request_latency_seconds",
            "Arrival to last token",
            e2e.clone(),
        );
        r.register(
            "vllm:request_success",
            "Finished requests by reason",
            success.clone(),
        );
        r.register(
            "vllm:cache_config_info",
            "KV cache configuration",
            cache_config,
        );
        let pinned_blocks = Gauge::default();
        r.register(
            "dynamo_mocker_kv_pinned_blocks",
            "Blocks under a live nvext.cache_control pin, in use or free",
            pinned_blocks.clone(),
        );
        // Every label value from the start: each series reads 0 before its first pin.
        let pins = Family::<Labels, Counter>::default();
        let action = |a: &str| {
            pins.get_or_create(&vec![("action".into(), a.into())])
                .clone()
        };
        let (pins_set, pins_renewed) = (action("set"), action("renewed"));
        r.register(
            "dynamo_mocker_kv_pins",
            "Block pins: set (the block had none) or renewed (a hit or a new pin pushed its expiry later)",
            pins,
        );
        let evictions = Family::<Labels, Counter>::default();
        let offloaded = |o: &str| {
            evictions
                .get_or_create(&vec![("offloaded".into(), o.into())])
                .clone()
        };
        let (pinned_evicted_offloaded, pinned_evicted_dropped) =
            (offloaded("true"), offloaded("false"));
        r.register(
            "dynamo_mocker_kv_pinned_evictions",
            "Pinned blocks evicted because only pinned blocks were free, by whether they were handed to the KV tier",
            evictions,
        );
        Self {
            registry: r,
            running,
            waiting,
            kv_cache_usage,
            prefix_cache_queries,
            prefix_cache_hits,
            prompt_tokens,
            generation_tokens,
            preemptions,
            ttft,
            itl,
            e2e,
            success,
            pinned_blocks,
            pins_set,
            pins_renewed,
            pinned_evicted_offloaded,
            pinned_evicted_dropped,
            seen: Mutex::default(),
        }
    }

    /// Gauges from the engine's state, counters by what changed since the last call.
    pub fn update(&self, m: &EngineMetrics) {
        self.running.set(m.num_requests_running as i64);
        self.waiting.set(m.num_requests_waiting as i64);
        self.kv_cache_usage.set(m.kv_cache_usage);
        self.pinned_blocks.set(m.pinned_blocks as i64);
        let mut seen = self.seen.lock().expect("metrics lock");
        let (seen, seen_pins) = &mut *seen;
        let now = m.counters;
        self.prefix_cache_queries
            .inc_by(now.prefix_cache_queries - seen.prefix_cache_queries);
        self.prefix_cache_hits
            .inc_by(now.prefix_cache_hits - seen.prefix_cache_hits);
        self.prompt_tokens
            .inc_by(now.prefill_tokens - seen.prefill_tokens);
        self.generation_tokens
            .inc_by(now.generation_tokens - seen.generation_tokens);
        self.preemptions
            .inc_by(now.num_preemptions - seen.num_preemptions);
        *seen = now;
        let pins = m.pins;
        self.pins_set.inc_by(pins.set - seen_pins.set);
        self.pins_renewed.inc_by(pins.renewed - seen_pins.renewed);
        self.pinned_evicted_offloaded
            .inc_by(pins.evicted_offloaded - seen_pins.evicted_offloaded);
        self.pinned_evicted_dropped
            .inc_by(pins.evicted_dropped - seen_pins.evicted_dropped);
        *seen_pins = pins;
    }

    pub fn observe_token(&self, ttft_ms: Option<f64>, itl_ms: Option<f64>) {
        if let Some(ms) = ttft_ms {
            self.ttft.observe(ms / 1000.0);
        }
        if let Some(ms) = itl_ms {
            self.itl.observe(ms / 1000.0);
        }
    }

    pub fn observe_finished(&self, f: &FinishedRequest) {
        self.e2e.observe((f.finished_ms - f.arrival_ms) / 1000.0);
        let reason = match f.reason {
            FinishReason::Length => "length",
            FinishReason::Aborted => "abort",
        };
        self.success
            .get_or_create(&vec![("finished_reason".into(), reason.into())])
            .inc();
    }

    /// Registers the KV block API's metrics (only engines that use it export them).
    pub fn register_kv_blocks(&mut self) -> KvBlockMetrics {
        let m = KvBlockMetrics::default();
        let r = &mut self.registry;
        r.register(
            "dynamo_mocker_kv_offload_blocks",
            "Blocks offloaded to the sidecar that it holds (stored or already held)",
            m.offloaded.clone(),
        );
        r.register(
            "dynamo_mocker_kv_offload_dropped_blocks",
            "Blocks not offloaded: queue_full (the sidecar is behind), failed (error or timeout), refused (by the sidecar)",
            m.offload_dropped.clone(),
        );
        r.register(
            "dynamo_mocker_kv_onboard_blocks",
            "Verified blocks onboarded from the sidecar, by tier",
            m.onboarded.clone(),
        );
        r.register(
            "dynamo_mocker_kv_onboard_bytes",
            "Payload bytes of verified onboarded blocks",
            m.onboarded_bytes.clone(),
        );
        r.register(
            "dynamo_mocker_kv_onboard_real_bytes",
            "The model's real KV bytes of verified onboarded blocks, on which their transfer time is charged (payloads are --kv-bytes-scale of it)",
            m.onboarded_real_bytes.clone(),
        );
        r.register(
            "dynamo_mocker_kv_onboard_recomputed_blocks",
            "Blocks the sidecar held that were recomputed instead: moving them from their tier costs more than the engine's prefill of their tokens",
            m.recomputed_cheaper.clone(),
        );
        r.register(
            "dynamo_mocker_kv_onboard_corrupt_blocks",
            "Onboarded blocks whose bytes are not the block's (never used; recomputed)",
            m.corrupt.clone(),
        );
        r.register(
            "dynamo_mocker_kv_onboard_missing_blocks",
            "Blocks the lookup found that the onboard did not deliver (gone since, or failed their checksum)",
            m.missing.clone(),
        );
        r.register(
            "dynamo_mocker_kv_onboard_fallbacks",
            "Requests that recomputed instead of asking the sidecar: error, timeout, backoff (after a failure)",
            m.fallbacks.clone(),
        );
        m
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
