//! The picker's Prometheus metrics, served on `/metrics`.
//!
//! `dynamo_frontend_*` describe requests as a client sees them (both through the HTTP
//! frontend and through the gateway's ext_proc stream); the names are those of Dynamo's
//! frontend, which the planner reads (request rate, ISL, OSL, TTFT, ITL).
//! `dynamo_epp_*` describe the routing itself. `inference_objective_*` and
//! `inference_pool_*` are the Gateway API Inference Extension's EPP metrics, which its
//! dashboards read: names, labels, meanings and buckets from its
//! `pkg/epp/metrics/metrics.go` (kubernetes-sigs/gateway-api-inference-extension) and
//! `site-src/guides/metrics.md`. prometheus-client appends `_total` to counters.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, OnceLock, PoisonError};

use dynamo_kvcache::EngineMetrics;
use dynamo_llm::agent_hints::AgentHints;
use dynamo_llm::disagg::{HopOutcome, KV_TRANSFER_MS_HEADER, PREFILL_HOP_HEADER};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use dynamo_names::Role;
use dynamo_names::metrics::frontend;

type Labels = Vec<(&'static str, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;
type Ratios = Family<Labels, Gauge<f64, AtomicU64>>;

/// The Inference Extension's buckets (`metrics.go`): request latency, 5 ms to 1 h.
const OBJECTIVE_LATENCY_BUCKETS: [f64; 35] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0,
    1200.0, 1800.0, 2700.0, 3600.0,
];
/// Prompt tokens, 1 to 1 M (32778, not 32768, is the source's).
const OBJECTIVE_INPUT_BUCKETS: [f64; 19] = [
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
    32778.0, 65536.0, 131072.0, 262144.0, 524288.0, 1048576.0,
];
/// Output tokens, 1 to 8 k.
const OBJECTIVE_OUTPUT_BUCKETS: [f64; 12] = [
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];
/// Seconds per output token, 1 ms to 10 s.
const OBJECTIVE_NTPOT_BUCKETS: [f64; 13] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// Seconds, 1 ms to 4 min: TTFT and request duration.
const LATENCY_BUCKETS: [f64; 20] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
    20.0, 40.0, 80.0, 160.0, 240.0,
];
/// Seconds, 0.5 ms to 2 s: gaps between tokens.
const ITL_BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0,
];
/// Tokens, 16 to 128 k (powers of two).
const TOKEN_BUCKETS: [f64; 14] = [
    16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
    65536.0, 131072.0,
];
/// Seconds, 1 µs to 100 ms: the pick itself.
const PICK_BUCKETS: [f64; 16] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
    5e-2, 1e-1,
];
/// Seconds, 10 µs to 10 s: stages of a request in the picker (a few µs of work, or a long
/// wait in the queue).
const STAGE_BUCKETS: [f64; 19] = [
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];
/// Fraction of the prompt's blocks the chosen pod holds.
const RATIO_BUCKETS: [f64; 10] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9];

fn latency() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}
fn stage() -> Histogram {
    Histogram::new(STAGE_BUCKETS)
}
fn itl() -> Histogram {
    Histogram::new(ITL_BUCKETS)
}
fn tokens() -> Histogram {
    Histogram::new(TOKEN_BUCKETS)
}
fn objective_latency() -> Histogram {
    Histogram::new(OBJECTIVE_LATENCY_BUCKETS)
}
fn objective_input() -> Histogram {
    Histogram::new(OBJECTIVE_INPUT_BUCKETS)
}
fn objective_output() -> Histogram {
    Histogram::new(OBJECTIVE_OUTPUT_BUCKETS)
}
fn objective_ntpot() -> Histogram {
    Histogram::new(OBJECTIVE_NTPOT_BUCKETS)
}

/// The Inference Extension's `model_name` and `target_model_name`: the picker serves one
/// model and rewrites none, so both are its name.
fn objective(model: &str) -> Labels {
    vec![
        ("model_name", model.to_owned()),
        ("target_model_name", model.to_owned()),
    ]
}

/// The Inference Extension's `error_code` (its `errutil` codes) for a refused HTTP
/// status: 429 is its `InferencePoolResourceExhausted`.
fn error_code(status: u16) -> &'static str {
    match status {
        429 => "InferencePoolResourceExhausted",
        503 => "ServiceUnavailable",
        400..=499 => "BadRequest",
        _ => "Internal",
    }
}

/// A request waiting for a pod, until dropped.
pub struct Queued(Gauge);

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Every metric of the process, cheap to clone into tasks.
pub struct Metrics {
    registry: Registry,
    // Frontend, per model.
    pub requests: Family<Labels, Counter>,
    pub inflight: Family<Labels, Gauge>,
    /// Requests accepted and waiting for a pod (the router's queue when every pod is
    /// saturated), per model.
    pub queued: Family<Labels, Gauge>,
    pub ttft: Histograms,
    pub itl: Histograms,
    pub isl: Histograms,
    pub osl: Histograms,
    pub duration: Histograms,
    /// Where a request's time before its first token goes, as Dynamo's frontend splits it:
    /// seconds per `stage` ([`PREPROCESS`], [`ROUTE`]), and from sending to a pod to its
    /// first token (the pod's sidecar, the engine's intake and its prefill).
    pub stage_seconds: Histograms,
    pub roundtrip_ttft: Histograms,
    // Routing.
    pub picks: Family<Labels, Counter>,
    pub prompt_blocks: Counter,
    pub matched_blocks: Counter,
    pub hit_ratio: Histogram,
    pub pick_seconds: Histogram,
    pub queue_wait_seconds: Histogram,
    pub queue_depth: Gauge,
    pub upstream_failures: Family<Labels, Counter>,
    /// Requests sent to another pod after theirs failed, by `model` and `migration_type`
    /// ([`NEW_REQUEST`], [`ONGOING_REQUEST`]), as Dynamo's frontend counts them.
    pub migrations: Family<Labels, Counter>,
    /// Streamed answers that migrated: from breaking off to their continuation's first
    /// chunk reaching the client (the gap a migration adds).
    pub migration_resume_seconds: Histogram,
    /// Requests carrying each agent hint, by `model` and `hint`.
    pub agent_hints: Family<Labels, Counter>,
    /// Next-turn prefills sent for `speculative_prefill`, by `model` and `outcome`.
    pub speculative_prefills: Family<Labels, Counter>,
    /// Disaggregated requests by how their decode pod's prefill hop ended (`outcome`,
    /// from the sidecar's `x-dynamo-prefill-hop`), and the KV transfers' seconds.
    pub prefill_hops: Family<Labels, Counter>,
    pub kv_transfer_seconds: Histogram,
    /// 1 for a pod whose model card does not fit the picker's model (not routed to).
    pub model_card_mismatch: Family<Labels, Gauge>,
    // Pods and their event streams.
    pub endpoints: Family<Labels, Gauge>,
    pub index_blocks: Gauge,
    pub kv_updates: Family<Labels, Counter>,
    pub kv_index_full: Counter,
    pub kv_sync_seconds: Histogram,
    pub kv_event_lag_seconds: Histogram,
    pub engine_polls: Family<Labels, Counter>,
    pub engine_kv_usage: Family<Labels, Gauge<f64, AtomicU64>>,
    /// The engine's KV cache size in blocks (`vllm:cache_config_info{num_gpu_blocks}`).
    pub engine_kv_blocks: Family<Labels, Gauge>,
    // Per pod, as Dynamo's frontend names them (`worker_id`, `worker_type`), refreshed on
    // each scrape by [`crate::Router::publish_load`]: prefill is this replica's share
    // (sum the replicas), decode is its engine-corrected view of the pod (take the max).
    pub worker_prefill_tokens: Family<Labels, Gauge>,
    pub worker_decode_blocks: Family<Labels, Gauge>,
    // The model, as Dynamo's frontend names it.
    pub model_block_size: Family<Labels, Gauge>,
    pub model_context_length: Family<Labels, Gauge>,
    // The Inference Extension's, per model (`model_name`, `target_model_name`).
    pub objective_requests: Family<Labels, Counter>,
    pub objective_errors: Family<Labels, Counter>,
    pub objective_duration: Histograms,
    pub objective_input_tokens: Histograms,
    pub objective_output_tokens: Histograms,
    pub objective_ntpot: Histograms,
    /// By `model_name` alone, as the source labels it.
    pub objective_running: Family<Labels, Gauge>,
    // The Inference Extension's, per pool (`name`), computed on each scrape.
    pub pool_kv_usage: Ratios,
    pub pool_queue: Ratios,
    pub pool_ready: Family<Labels, Gauge>,
    /// The pool the `inference_pool_*` gauges name; they are absent until it is set.
    pool_name: OnceLock<String>,
    /// Each pod's last engine report, the pool averages' input.
    engine_reports: Mutex<BTreeMap<String, EngineMetrics>>,
}

/// `migration_type` of [`Metrics::migrations`]: the pod failed before answering, or
/// mid-answer (Dynamo's label values).
pub const NEW_REQUEST: &str = "new_request";
pub const ONGOING_REQUEST: &str = "ongoing_request";

/// `stage` of [`Metrics::stage_seconds`]: parsing, chat template and tokenization; then
/// the wait for a pod and the pick (Dynamo's label values).
pub const PREPROCESS: &str = "preprocess";
pub const ROUTE: &str = "route";

/// `worker_type` of Dynamo's per-worker gauges: `prefill`, or `decode` for pods that
/// decode (aggregated pods included).
pub const PREFILL_WORKER: &str = "prefill";
pub const DECODE_WORKER: &str = "decode";
const WORKER_TYPES: [&str; 2] = [PREFILL_WORKER, DECODE_WORKER];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The prefill hop outcome the picker counts itself: no hop, as the prompt fills no KV
/// block (the others are the decode pods' reports, `HopOutcome`).
pub const SHORT_PROMPT_OUTCOME: &str = "local_short_prompt";

impl Metrics {
    /// Counts a disaggregated request sent without a prefill hop, as its prompt fills no
    /// KV block (nothing to transfer): its decode pod prefills it.
    pub fn prefill_hop_skipped(&self) {
        self.prefill_hops
            .get_or_create(&vec![("outcome", SHORT_PROMPT_OUTCOME.to_owned())])
            .inc();
    }

    /// Counts a decode pod's report of its prefill hop: `header` reads a response header.
    pub fn prefill_hop(&self, header: impl Fn(&str) -> Option<String>) {
        let Some(outcome) = header(PREFILL_HOP_HEADER).and_then(|v| HopOutcome::parse(&v)) else {
            return;
        };
        self.prefill_hops
            .get_or_create(&vec![("outcome", outcome.as_str().to_owned())])
            .inc();
        if let Some(ms) = header(KV_TRANSFER_MS_HEADER).and_then(|v| v.parse::<f64>().ok()) {
            self.kv_transfer_seconds.observe(ms / 1000.0);
        }
    }

    /// Counts one migration of a request of `model`; `kind` is [`NEW_REQUEST`] or
    /// [`ONGOING_REQUEST`].
    pub fn migration(&self, model: &str, kind: &str) {
        self.migrations
            .get_or_create(&vec![
                ("model", model.to_owned()),
                ("migration_type", kind.to_owned()),
            ])
            .inc();
    }

    /// Counts the agent hints a request of `model` carries.
    pub fn hints(&self, model: &str, hints: &AgentHints) {
        let used = [
            ("priority", hints.priority != 0),
            ("osl", hints.osl.is_some()),
            ("speculative_prefill", hints.speculative_prefill),
            ("cache_control", hints.pin_ttl.is_some()),
        ];
        for (hint, _) in used.into_iter().filter(|(_, on)| *on) {
            self.agent_hints
                .get_or_create(&vec![
                    ("model", model.to_owned()),
                    ("hint", hint.to_owned()),
                ])
                .inc();
        }
    }

    /// Counts a speculative prefill of `model` that ended with `outcome`.
    pub fn speculative_prefill(&self, model: &str, outcome: &str) {
        self.speculative_prefills
            .get_or_create(&vec![
                ("model", model.to_owned()),
                ("outcome", outcome.to_owned()),
            ])
            .inc();
    }

    /// Records that a request spent `seconds` in `stage` ([`PREPROCESS`], [`ROUTE`]).
    pub fn stage(&self, stage: &str, seconds: f64) {
        self.stage_seconds
            .get_or_create(&vec![("stage", stage.to_owned())])
            .observe(seconds);
    }

    /// Counts a request of `model` as queued until the returned guard is dropped.
    pub fn queued(&self, model: &str) -> Queued {
        let gauge = self
            .queued
            .get_or_create(&vec![("model", model.to_owned())])
            .clone();
        gauge.inc();
        Queued(gauge)
    }

    pub fn new() -> Self {
        let mut r = Registry::default();
        let m = Self {
            requests: Family::default(),
            inflight: Family::default(),
            queued: Family::default(),
            ttft: Family::new_with_constructor(latency),
            itl: Family::new_with_constructor(itl),
            isl: Family::new_with_constructor(tokens),
            osl: Family::new_with_constructor(tokens),
            duration: Family::new_with_constructor(latency),
            stage_seconds: Family::new_with_constructor(stage),
            roundtrip_ttft: Family::new_with_constructor(latency),
            picks: Family::default(),
            prompt_blocks: Counter::default(),
            matched_blocks: Counter::default(),
            hit_ratio: Histogram::new(RATIO_BUCKETS),
            pick_seconds: Histogram::new(PICK_BUCKETS),
            queue_wait_seconds: latency(),
            queue_depth: Gauge::default(),
            upstream_failures: Family::default(),
            migrations: Family::default(),
            migration_resume_seconds: latency(),
            agent_hints: Family::default(),
            speculative_prefills: Family::default(),
            prefill_hops: Family::default(),
            kv_transfer_seconds: Histogram::new(ITL_BUCKETS),
            model_card_mismatch: Family::default(),
            endpoints: Family::default(),
            index_blocks: Gauge::default(),
            kv_updates: Family::default(),
            kv_index_full: Counter::default(),
            kv_sync_seconds: latency(),
            // Sub-millisecond on one node; seconds mean a stalled relay or skewed clocks.
            kv_event_lag_seconds: Histogram::new(ITL_BUCKETS),
            engine_polls: Family::default(),
            engine_kv_usage: Family::default(),
            engine_kv_blocks: Family::default(),
            worker_prefill_tokens: Family::default(),
            worker_decode_blocks: Family::default(),
            model_block_size: Family::default(),
            model_context_length: Family::default(),
            objective_requests: Family::default(),
            objective_errors: Family::default(),
            objective_duration: Family::new_with_constructor(objective_latency),
            objective_input_tokens: Family::new_with_constructor(objective_input),
            objective_output_tokens: Family::new_with_constructor(objective_output),
            objective_ntpot: Family::new_with_constructor(objective_ntpot),
            objective_running: Family::default(),
            pool_kv_usage: Family::default(),
            pool_queue: Family::default(),
            pool_ready: Family::default(),
            pool_name: OnceLock::new(),
            engine_reports: Mutex::default(),
            registry: Registry::default(),
        };
        r.register(
            frontend::REQUESTS,
            "Requests by model, route and HTTP status",
            m.requests.clone(),
        );
        r.register(
            frontend::INFLIGHT_REQUESTS,
            "Requests being served",
            m.inflight.clone(),
        );
        r.register(
            frontend::QUEUED_REQUESTS,
            "Requests accepted and waiting for a pod",
            m.queued.clone(),
        );
        r.register(
            frontend::TIME_TO_FIRST_TOKEN,
            "From request arrival to the first response byte of the engine",
            m.ttft.clone(),
        );
        r.register(
            frontend::INTER_TOKEN_LATENCY,
            "Gaps between streamed tokens",
            m.itl.clone(),
        );
        r.register(
            frontend::INPUT_SEQUENCE_TOKENS,
            "Prompt tokens per request",
            m.isl.clone(),
        );
        r.register(
            frontend::OUTPUT_SEQUENCE_TOKENS,
            "Generated tokens per request",
            m.osl.clone(),
        );
        r.register(
            frontend::REQUEST_DURATION,
            "From request arrival to the end of the response",
            m.duration.clone(),
        );
        r.register(
            "dynamo_frontend_stage_duration_seconds",
            "Seconds per stage of a request in the frontend (preprocess, route)",
            m.stage_seconds.clone(),
        );
        r.register(
            "dynamo_request_plane_roundtrip_ttft_seconds",
            "From sending a request to a pod to its first token",
            m.roundtrip_ttft.clone(),
        );
        r.register(
            "dynamo_frontend_agent_hints",
            "Requests carrying each agent hint (priority, osl, speculative_prefill, cache_control)",
            m.agent_hints.clone(),
        );
        r.register(
            "dynamo_frontend_speculative_prefills",
            "Next-turn prefills of speculative_prefill, by outcome (sent, failed)",
            m.speculative_prefills.clone(),
        );
        r.register(
            "dynamo_epp_prefill_hops",
            "Disaggregated requests by how the prefill hop ended (remote, fallback_*, ...), \
             or local_short_prompt: none was made, the prompt filling no KV block",
            m.prefill_hops.clone(),
        );
        r.register(
            "dynamo_epp_kv_transfer_seconds",
            "Seconds the KV blocks of a disaggregated request took between the sidecars",
            m.kv_transfer_seconds.clone(),
        );
        r.register(
            "dynamo_epp_picks",
            "Requests routed, by pod and role",
            m.picks.clone(),
        );
        r.register(
            frontend::PROMPT_BLOCKS,
            "Full prompt blocks of routed requests",
            m.prompt_blocks.clone(),
        );
        r.register(
            frontend::MATCHED_BLOCKS,
            "Prompt blocks the chosen pod already held (any tier); matched / prompt = KV hit ratio",
            m.matched_blocks.clone(),
        );
        r.register(
            frontend::KV_HIT_RATIO,
            "Per request, the fraction of prompt blocks the chosen pod held",
            m.hit_ratio.clone(),
        );
        r.register(
            "dynamo_epp_pick_duration_seconds",
            "Time to choose a pod (index lookup, cost, accounting), queueing excluded",
            m.pick_seconds.clone(),
        );
        r.register(
            "dynamo_epp_queue_wait_seconds",
            "Time requests waited while every pod was saturated",
            m.queue_wait_seconds.clone(),
        );
        r.register(
            "dynamo_epp_queue_depth",
            "Requests waiting for a pod",
            m.queue_depth.clone(),
        );
        r.register(
            "dynamo_epp_upstream_failures",
            "Requests a pod refused before answering, by pod",
            m.upstream_failures.clone(),
        );
        r.register(
            "dynamo_frontend_model_migration",
            "Requests sent to another pod after theirs failed, by migration_type: \
             new_request (before answering), ongoing_request (mid-answer)",
            m.migrations.clone(),
        );
        r.register(
            "dynamo_epp_migration_resume_seconds",
            "Streamed answers that migrated: from breaking off to the continuation's first chunk",
            m.migration_resume_seconds.clone(),
        );
        r.register(
            "dynamo_epp_model_card_mismatch",
            "1 for a pod whose model card names another model or block size (not routed to), by pod",
            m.model_card_mismatch.clone(),
        );
        r.register(
            frontend::ENDPOINTS,
            "Known pods, by role and state (ready: KV snapshot received or warm-up over)",
            m.endpoints.clone(),
        );
        r.register(
            "dynamo_epp_index_blocks",
            "Distinct blocks in the exact KV index",
            m.index_blocks.clone(),
        );
        r.register(
            "dynamo_epp_kv_updates",
            "KV stream updates applied, by pod and kind (snapshot, event, lost)",
            m.kv_updates.clone(),
        );
        r.register(
            "dynamo_epp_kv_index_full",
            "Stored events the index could not hold in full (bound reached)",
            m.kv_index_full.clone(),
        );
        r.register(
            "dynamo_epp_kv_sync_seconds",
            "From a pod's discovery to its first KV snapshot",
            m.kv_sync_seconds.clone(),
        );
        r.register(
            "dynamo_epp_kv_event_lag_seconds",
            "From a sidecar publishing a KV event to its application to the index (across nodes, includes clock skew)",
            m.kv_event_lag_seconds.clone(),
        );
        r.register(
            "dynamo_epp_engine_metric_polls",
            "Reads of the pods' /metrics, by result",
            m.engine_polls.clone(),
        );
        r.register(
            frontend::ENGINE_KV_USAGE,
            "KV cache usage (0 to 1) each pod's engine reported last",
            m.engine_kv_usage.clone(),
        );
        r.register(
            frontend::ENGINE_KV_BLOCKS,
            "KV cache size in blocks each pod's engine reported last (num_gpu_blocks)",
            m.engine_kv_blocks.clone(),
        );
        r.register(
            frontend::WORKER_ACTIVE_PREFILL_TOKENS,
            "Uncached prompt tokens (full blocks) of this picker's requests not yet past their first token, by pod",
            m.worker_prefill_tokens.clone(),
        );
        r.register(
            frontend::WORKER_ACTIVE_DECODE_BLOCKS,
            "KV blocks held by requests in flight (prefilling or decoding), each once, by pod: this picker's, plus the blocks its engine last reported beyond this picker's requests",
            m.worker_decode_blocks.clone(),
        );
        r.register(
            frontend::MODEL_KV_CACHE_BLOCK_SIZE,
            "Tokens per KV block the picker routes with",
            m.model_block_size.clone(),
        );
        r.register(
            "dynamo_frontend_model_context_length",
            "Prompt plus output tokens the model accepts (once the picker has loaded it)",
            m.model_context_length.clone(),
        );
        r.register(
            "inference_objective_request",
            "Counter of inference objective requests broken out for each model and target model",
            m.objective_requests.clone(),
        );
        r.register(
            "inference_objective_request_error",
            "Counter of inference objective requests errors broken out for each model and target model",
            m.objective_errors.clone(),
        );
        r.register(
            "inference_objective_request_duration_seconds",
            "Inference objective response latency distribution in seconds for each model and target model",
            m.objective_duration.clone(),
        );
        r.register(
            "inference_objective_input_tokens",
            "Inference objective input token count distribution for requests in each model",
            m.objective_input_tokens.clone(),
        );
        r.register(
            "inference_objective_output_tokens",
            "Inference objective output token count distribution for requests in each model",
            m.objective_output_tokens.clone(),
        );
        r.register(
            "inference_objective_normalized_time_per_output_token_seconds",
            "Inference objective latency divided by number of output tokens in seconds for each model and target model",
            m.objective_ntpot.clone(),
        );
        r.register(
            "inference_objective_running_requests",
            "Inference objective number of running requests in each model",
            m.objective_running.clone(),
        );
        r.register(
            "inference_pool_average_kv_cache_utilization",
            "The average kv cache utilization for an inference server pool",
            m.pool_kv_usage.clone(),
        );
        r.register(
            frontend::POOL_AVERAGE_QUEUE_SIZE,
            "The average number of requests pending in the model server queue",
            m.pool_queue.clone(),
        );
        r.register(
            frontend::POOL_READY_PODS,
            "The number of ready pods in the inference server pool",
            m.pool_ready.clone(),
        );
        Self { registry: r, ..m }
    }

    /// Names the pool of the `inference_pool_*` gauges (the first name set stays).
    pub fn set_pool_name(&self, name: &str) {
        let _ = self.pool_name.set(name.to_owned());
    }

    /// Counts a request of `model` on `route` that was answered with HTTP `status`
    /// (Dynamo's count, and the Inference Extension's with its errors).
    pub fn request(&self, model: &str, route: &str, status: &str) {
        self.requests
            .get_or_create(&vec![
                ("model", model.to_owned()),
                ("route", route.to_owned()),
                ("status", status.to_owned()),
            ])
            .inc();
        let labels = objective(model);
        self.objective_requests.get_or_create(&labels).inc();
        let code = status.parse::<u16>().unwrap_or(500);
        if code >= 400 {
            let mut labels = labels;
            labels.push(("error_code", error_code(code).to_owned()));
            self.objective_errors.get_or_create(&labels).inc();
        }
    }

    /// A request of `model` with `prompt_tokens` went to a pod and is running until
    /// [`Metrics::objective_ended`].
    pub fn objective_started(&self, model: &str, prompt_tokens: usize) {
        self.objective_input_tokens
            .get_or_create(&objective(model))
            .observe(prompt_tokens as f64);
        self.objective_running
            .get_or_create(&vec![("model_name", model.to_owned())])
            .inc();
    }

    /// A request of `model` answered in full: `seconds` from arrival, `output_tokens`.
    pub fn objective_finished(&self, model: &str, seconds: f64, output_tokens: u64) {
        let labels = objective(model);
        self.objective_duration
            .get_or_create(&labels)
            .observe(seconds);
        self.objective_output_tokens
            .get_or_create(&labels)
            .observe(output_tokens as f64);
        if output_tokens > 0 {
            self.objective_ntpot
                .get_or_create(&labels)
                .observe(seconds / output_tokens as f64);
        }
    }

    /// A request of `model` is no longer running (answered, failed or abandoned).
    pub fn objective_ended(&self, model: &str) {
        self.objective_running
            .get_or_create(&vec![("model_name", model.to_owned())])
            .dec();
    }

    /// Sets the `inference_pool_*` gauges: ready pods from [`Metrics::endpoints`], the
    /// averages over the pods whose engine has reported.
    fn publish_pool(&self) {
        let Some(name) = self.pool_name.get() else {
            return;
        };
        let labels = vec![("name", name.clone())];
        let ready: i64 = Role::ALL
            .iter()
            .filter_map(|role| {
                self.endpoints
                    .get(&vec![
                        ("role", role.as_str().to_owned()),
                        ("state", "ready".to_owned()),
                    ])
                    .map(|g| g.get())
            })
            .sum();
        self.pool_ready.get_or_create(&labels).set(ready);
        let reports = self
            .engine_reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let n = reports.len().max(1) as f64;
        let usage: f64 = reports.values().map(|m| m.kv_cache_usage_perc).sum();
        let queue: f64 = reports
            .values()
            .map(|m| m.num_requests_waiting as f64)
            .sum();
        self.pool_kv_usage.get_or_create(&labels).set(usage / n);
        self.pool_queue.get_or_create(&labels).set(queue / n);
    }

    /// Sets `pod`'s engine gauges from its latest report; the KV cache size is absent
    /// while the engine does not say it.
    pub fn engine(&self, pod: &str, report: &EngineMetrics) {
        let labels = vec![("pod", pod.to_owned())];
        self.engine_kv_usage
            .get_or_create(&labels)
            .set(report.kv_cache_usage_perc);
        self.engine_reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(pod.to_owned(), *report);
        match report.num_gpu_blocks {
            Some(n) => {
                self.engine_kv_blocks
                    .get_or_create(&labels)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            None => {
                self.engine_kv_blocks.remove(&labels);
            }
        }
    }

    /// Sets `pod`'s per-worker load gauges; `worker_type` is [`PREFILL_WORKER`] or [`DECODE_WORKER`].
    pub fn worker_load(
        &self,
        pod: &str,
        worker_type: &str,
        prefill_tokens: u64,
        decode_blocks: u64,
    ) {
        let labels = vec![
            ("worker_id", pod.to_owned()),
            ("worker_type", worker_type.to_owned()),
        ];
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.worker_prefill_tokens
            .get_or_create(&labels)
            .set(gauge(prefill_tokens));
        self.worker_decode_blocks
            .get_or_create(&labels)
            .set(gauge(decode_blocks));
    }

    /// Drops every series of a pod that left.
    pub fn remove_pod(&self, pod: &str) {
        let labels = vec![("pod", pod.to_owned())];
        self.engine_reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(pod);
        self.engine_kv_usage.remove(&labels);
        self.engine_kv_blocks.remove(&labels);
        self.model_card_mismatch.remove(&labels);
        for worker_type in WORKER_TYPES {
            let labels = vec![
                ("worker_id", pod.to_owned()),
                ("worker_type", worker_type.to_owned()),
            ];
            self.worker_prefill_tokens.remove(&labels);
            self.worker_decode_blocks.remove(&labels);
        }
    }

    /// Sets the model's gauges; the context length once the model is loaded.
    pub fn model(&self, name: &str, block_size: usize, context_length: Option<usize>) {
        let labels = vec![("model", name.to_owned())];
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.model_block_size
            .get_or_create(&labels)
            .set(gauge(block_size));
        if let Some(n) = context_length {
            self.model_context_length
                .get_or_create(&labels)
                .set(gauge(n));
        }
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        self.publish_pool();
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_queued_until_its_guard_drops() {
        let m = Metrics::new();
        let line = |n: u32| format!("dynamo_frontend_queued_requests{{model=\"m\"}} {n}");
        let (a, b) = (m.queued("m"), m.queued("m"));
        assert!(m.encode().contains(&line(2)));
        drop(a);
        drop(b);
        assert!(m.encode().contains(&line(0)));
    }

    #[test]
    fn engine_and_model_gauges_are_absent_until_known_and_leave_with_the_pod() {
        let m = Metrics::new();
        let report = |usage, blocks| EngineMetrics {
            num_requests_waiting: 0,
            kv_cache_usage_perc: usage,
            num_gpu_blocks: blocks,
        };
        m.engine("10.0.0.1:8000", &report(0.25, None));
        m.model("m", 16, None);
        let text = m.encode();
        assert!(text.contains(r#"dynamo_epp_engine_kv_usage{pod="10.0.0.1:8000"} 0.25"#));
        assert!(!text.contains("dynamo_epp_engine_kv_blocks{"), "{text}");
        assert!(text.contains(r#"dynamo_frontend_model_kv_cache_block_size{model="m"} 16"#));
        assert!(
            !text.contains("dynamo_frontend_model_context_length{"),
            "{text}"
        );
        m.engine("10.0.0.1:8000", &report(0.5, Some(1024)));
        m.model("m", 16, Some(32768));
        m.worker_load("10.0.0.1:8000", "decode", 64, 7);
        let text = m.encode();
        for line in [
            r#"dynamo_epp_engine_kv_blocks{pod="10.0.0.1:8000"} 1024"#,
            r#"dynamo_frontend_model_context_length{model="m"} 32768"#,
            r#"dynamo_frontend_worker_active_prefill_tokens{worker_id="10.0.0.1:8000",worker_type="decode"} 64"#,
            r#"dynamo_frontend_worker_active_decode_blocks{worker_id="10.0.0.1:8000",worker_type="decode"} 7"#,
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        m.remove_pod("10.0.0.1:8000");
        assert!(!m.encode().contains("10.0.0.1:8000"));
    }

    #[test]
    fn pool_gauges_average_the_engines_reports_and_count_ready_pods() {
        let m = Metrics::new();
        let report = |waiting, usage| EngineMetrics {
            num_requests_waiting: waiting,
            kv_cache_usage_perc: usage,
            num_gpu_blocks: None,
        };
        m.engine("a", &report(3, 0.25));
        assert!(!m.encode().contains("inference_pool_ready_pods{"));
        m.set_pool_name("pool");
        for (role, n) in [("aggregated", 2), ("decode", 1)] {
            let labels = vec![("role", role.to_owned()), ("state", "ready".to_owned())];
            m.endpoints.get_or_create(&labels).set(n);
        }
        m.engine("b", &report(1, 0.75));
        let text = m.encode();
        for line in [
            r#"inference_pool_ready_pods{name="pool"} 3"#,
            r#"inference_pool_average_queue_size{name="pool"} 2.0"#,
            r#"inference_pool_average_kv_cache_utilization{name="pool"} 0.5"#,
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        m.remove_pod("b");
        let text = m.encode();
        assert!(text.contains(r#"inference_pool_average_queue_size{name="pool"} 3.0"#));
        assert!(text.contains(r#"inference_pool_average_kv_cache_utilization{name="pool"} 0.25"#));
    }

    #[test]
    fn refused_requests_count_as_the_inference_extensions_errors() {
        let m = Metrics::new();
        for status in ["200", "429", "503", "404", "502"] {
            m.request("m", "/v1/chat/completions", status);
        }
        let text = m.encode();
        let objective = r#"model_name="m",target_model_name="m""#;
        assert!(text.contains(&format!(
            "inference_objective_request_total{{{objective}}} 5"
        )));
        for code in [
            "InferencePoolResourceExhausted",
            "ServiceUnavailable",
            "BadRequest",
            "Internal",
        ] {
            let line = format!(
                r#"inference_objective_request_error_total{{{objective},error_code="{code}"}} 1"#
            );
            assert!(text.contains(&line), "{line} missing:\n{text}");
        }
    }

    #[test]
    fn a_decode_pods_hop_report_is_counted_and_others_are_not() {
        let m = Metrics::new();
        let headers = |outcome: &'static str, ms: Option<&'static str>| {
            move |name: &str| match name {
                PREFILL_HOP_HEADER => Some(outcome.to_owned()),
                KV_TRANSFER_MS_HEADER => ms.map(str::to_owned),
                _ => None,
            }
        };
        m.prefill_hop(headers("remote", Some("12.5")));
        m.prefill_hop(headers("fallback_timeout", None));
        m.prefill_hop(headers("made-up", Some("1")));
        m.prefill_hop(|_| None);
        let text = m.encode();
        assert!(
            text.contains(r#"dynamo_epp_prefill_hops_total{outcome="remote"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"dynamo_epp_prefill_hops_total{outcome="fallback_timeout"} 1"#));
        assert!(!text.contains("made-up"));
        assert!(
            text.contains("dynamo_epp_kv_transfer_seconds_sum 0.0125"),
            "{text}"
        );
        assert!(text.contains("dynamo_epp_kv_transfer_seconds_count 1"));
    }
}
