//! Metric family names, as registered (prometheus-client adds `_total` to a counter and
//! `_bucket`, `_sum`, `_count` to a histogram). Only names that cross a crate are here:
//! what the picker exports and the planner queries, and what the dashboards and alert
//! rules in `charts/dynamo-platform/files/monitoring/` read (checked by
//! `e2e/tests/monitoring_config.rs`).

/// The picker's, in Dynamo's frontend names where Dynamo has one (`epp/src/metrics.rs`).
pub mod frontend {
    /// Counter: requests by model, route and status.
    pub const REQUESTS: &str = "dynamo_frontend_requests";
    /// Gauge: requests being served.
    pub const INFLIGHT_REQUESTS: &str = "dynamo_frontend_inflight_requests";
    /// Gauge: requests waiting for a pod.
    pub const QUEUED_REQUESTS: &str = "dynamo_frontend_queued_requests";
    /// Histogram.
    pub const TIME_TO_FIRST_TOKEN: &str = "dynamo_frontend_time_to_first_token_seconds";
    /// Histogram.
    pub const INTER_TOKEN_LATENCY: &str = "dynamo_frontend_inter_token_latency_seconds";
    /// Histogram: prompt tokens per request.
    pub const INPUT_SEQUENCE_TOKENS: &str = "dynamo_frontend_input_sequence_tokens";
    /// Histogram: generated tokens per request.
    pub const OUTPUT_SEQUENCE_TOKENS: &str = "dynamo_frontend_output_sequence_tokens";
    /// Histogram.
    pub const REQUEST_DURATION: &str = "dynamo_frontend_request_duration_seconds";
    /// Gauge by `worker_id`, `worker_type`.
    pub const WORKER_ACTIVE_PREFILL_TOKENS: &str = "dynamo_frontend_worker_active_prefill_tokens";
    /// Gauge by `worker_id`, `worker_type`.
    pub const WORKER_ACTIVE_DECODE_BLOCKS: &str = "dynamo_frontend_worker_active_decode_blocks";
    /// Gauge by `model`.
    pub const MODEL_KV_CACHE_BLOCK_SIZE: &str = "dynamo_frontend_model_kv_cache_block_size";
    /// Counter.
    pub const PROMPT_BLOCKS: &str = "dynamo_epp_prompt_blocks";
    /// Counter.
    pub const MATCHED_BLOCKS: &str = "dynamo_epp_matched_blocks";
    /// Histogram.
    pub const KV_HIT_RATIO: &str = "dynamo_epp_kv_hit_ratio";
    /// Gauge by `pod`.
    pub const ENGINE_KV_USAGE: &str = "dynamo_epp_engine_kv_usage";
    /// Gauge by `pod`.
    pub const ENGINE_KV_BLOCKS: &str = "dynamo_epp_engine_kv_blocks";
    /// Gauge by `role` and `state`: the pods the picker lists.
    pub const ENDPOINTS: &str = "dynamo_epp_endpoints";
    /// Gauge by `name` (the InferencePool): the Inference Extension's mean of its pods'
    /// waiting requests.
    pub const POOL_AVERAGE_QUEUE_SIZE: &str = "inference_pool_average_queue_size";
    /// Gauge by `name`: the Inference Extension's ready pods of the pool.
    pub const POOL_READY_PODS: &str = "inference_pool_ready_pods";
}

/// The planner's own (`planner-service/src/metrics.rs`).
pub mod planner {
    /// Gauges, constant over a run.
    pub const TARGET_TTFT: &str = "dynamo_planner_target_ttft_seconds";
    pub const TARGET_ITL: &str = "dynamo_planner_target_itl_seconds";
    pub const INTERVAL: &str = "dynamo_planner_interval_seconds";
    /// 1 when the planner only advises.
    pub const ADVISORY: &str = "dynamo_planner_advisory";
    /// Gauge by `service`, `role`.
    pub const REPLICAS: &str = "dynamo_planner_replicas";
    /// Gauge by `service`, `role`.
    pub const DESIRED_REPLICAS: &str = "dynamo_planner_desired_replicas";
    /// Counter by `reason`.
    pub const DECISIONS: &str = "dynamo_planner_decisions";
    /// Counter by `result`.
    pub const SCALE_WRITES: &str = "dynamo_planner_scale_writes";
    /// Gauge.
    pub const CAPPED: &str = "dynamo_planner_capped";
    /// Gauges.
    pub const PREDICTED_REQUESTS: &str = "dynamo_planner_predicted_requests";
    pub const PREDICTED_ISL: &str = "dynamo_planner_predicted_isl_tokens";
    pub const PREDICTED_OSL: &str = "dynamo_planner_predicted_osl_tokens";
    pub const OBSERVED_TTFT: &str = "dynamo_planner_observed_ttft_seconds";
    pub const OBSERVED_ITL: &str = "dynamo_planner_observed_itl_seconds";
}
