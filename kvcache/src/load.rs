//! Blocks in flight per pod: the load half of the scheduler's cost.
//!
//! The tracker counts what this router sent: a request's uncached prompt blocks are
//! *prefill* load from the pick until its first token, then all its blocks are *decode*
//! load (their KV stays resident) until it finishes. Engine metrics, scraped elsewhere
//! and passed in as numbers, correct that view: EPP replicas are active-active, so each
//! sees only its own share of a pod's traffic, and the engine's own KV usage is a floor
//! under the decode load this replica believes in.

use serde::{Deserialize, Serialize};

use crate::WorkerId;
use crate::fast_map::FastMap;

/// The router's id for one request, unique while it is in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestId(pub u64);

/// One pod's load, in KV blocks, as the scheduler's cost function reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerLoad {
    pub worker: WorkerId,
    /// Uncached prompt blocks of requests not yet past their first token.
    pub prefill_blocks: u64,
    /// Blocks held by requests that are decoding.
    pub decode_blocks: u64,
}

impl WorkerLoad {
    pub fn idle(worker: WorkerId) -> Self {
        Self {
            worker,
            prefill_blocks: 0,
            decode_blocks: 0,
        }
    }

    pub fn total(&self) -> u64 {
        self.prefill_blocks + self.decode_blocks
    }
}

/// The engine's own view, from its Prometheus metrics (`vllm:num_requests_waiting`,
/// `vllm:kv_cache_usage_perc`, `vllm:cache_config_info{num_gpu_blocks}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineMetrics {
    pub num_requests_waiting: u64,
    /// Fraction of GPU KV blocks in use, 0.0 to 1.0 (vLLM reports a fraction despite the
    /// metric's name).
    pub kv_cache_usage_perc: f64,
    /// Size of the GPU KV cache in blocks, when known; needed to turn usage into blocks.
    pub num_gpu_blocks: Option<u64>,
}

/// When a pod counts as saturated; every limit is optional and any one reached is enough.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SaturationThreshold {
    /// More requests than this waiting inside the engine.
    pub max_waiting_requests: Option<u64>,
    /// KV cache usage above this fraction.
    pub max_kv_usage: Option<f64>,
    /// More prefill plus decode blocks in flight than this.
    pub max_blocks_in_flight: Option<u64>,
}

/// A request id that the tracker does not, or already, knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("request {0:?} is already in flight")]
    DuplicateRequest(RequestId),
    #[error("request {0:?} is not in flight")]
    UnknownRequest(RequestId),
}

#[derive(Clone, Copy, Debug, Default)]
struct PodLoad {
    prefill: u64,
    decode: u64,
    metrics: Option<EngineMetrics>,
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    worker: WorkerId,
    new_blocks: u64,
    total_blocks: u64,
    decoding: bool,
}

/// Per-pod load from this router's picks, corrected by engine metrics.
#[derive(Debug, Default)]
pub struct LoadTracker {
    pods: FastMap<WorkerId, PodLoad>,
    requests: FastMap<RequestId, InFlight>,
}

impl LoadTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `worker` a candidate with no load (no-op when it is one already).
    pub fn add_worker(&mut self, worker: WorkerId) {
        self.pods.entry(worker).or_default();
    }

    /// Forgets `worker` and the requests in flight on it.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.pods.remove(&worker);
        self.requests.retain(|_, r| r.worker != worker);
    }

    /// `request` was sent to `worker`: its `new_blocks` uncached prompt blocks become
    /// prefill load; `total_blocks` (cached ones included) will be decode load.
    pub fn on_pick(
        &mut self,
        request: RequestId,
        worker: WorkerId,
        total_blocks: u64,
        new_blocks: u64,
    ) -> Result<(), LoadError> {
        if self.requests.contains_key(&request) {
            return Err(LoadError::DuplicateRequest(request));
        }
        self.pods.entry(worker).or_default().prefill += new_blocks;
        self.requests.insert(
            request,
            InFlight {
                worker,
                new_blocks,
                total_blocks,
                decoding: false,
            },
        );
        Ok(())
    }

    /// The first token of `request` arrived: prefill is over. A second call is a no-op.
    pub fn on_first_token(&mut self, request: RequestId) -> Result<(), LoadError> {
        let r = self
            .requests
            .get_mut(&request)
            .ok_or(LoadError::UnknownRequest(request))?;
        if !r.decoding {
            r.decoding = true;
            if let Some(pod) = self.pods.get_mut(&r.worker) {
                pod.prefill = pod.prefill.saturating_sub(r.new_blocks);
                pod.decode += r.total_blocks;
            }
        }
        Ok(())
    }

    /// `request` finished, failed or was cancelled: it no longer loads its pod.
    pub fn on_finish(&mut self, request: RequestId) -> Result<(), LoadError> {
        let r = self
            .requests
            .remove(&request)
            .ok_or(LoadError::UnknownRequest(request))?;
        if let Some(pod) = self.pods.get_mut(&r.worker) {
            if r.decoding {
                pod.decode = pod.decode.saturating_sub(r.total_blocks);
            } else {
                pod.prefill = pod.prefill.saturating_sub(r.new_blocks);
            }
        }
        Ok(())
    }

    /// Latest metrics of `worker`'s engine; they replace the previous ones.
    pub fn observe_metrics(&mut self, worker: WorkerId, metrics: EngineMetrics) {
        self.pods.entry(worker).or_default().metrics = Some(metrics);
    }

    /// `worker`'s load: tracked prefill, and tracked decode raised to what the engine's
    /// KV usage says is resident (other routers' requests included).
    pub fn load(&self, worker: WorkerId) -> WorkerLoad {
        let Some(pod) = self.pods.get(&worker) else {
            return WorkerLoad::idle(worker);
        };
        let resident = pod
            .metrics
            .and_then(|m| {
                let blocks = m.num_gpu_blocks? as f64 * m.kv_cache_usage_perc.clamp(0.0, 1.0);
                Some(blocks.round() as u64)
            })
            .unwrap_or(0);
        WorkerLoad {
            worker,
            prefill_blocks: pod.prefill,
            decode_blocks: pod.decode.max(resident),
        }
    }

    /// Every known pod's load, by increasing worker id.
    pub fn loads(&self) -> Vec<WorkerLoad> {
        let mut loads: Vec<WorkerLoad> = self.pods.keys().map(|&w| self.load(w)).collect();
        loads.sort_by_key(|l| l.worker);
        loads
    }

    /// Whether `worker` is over any limit of `threshold`.
    pub fn is_saturated(&self, worker: WorkerId, threshold: &SaturationThreshold) -> bool {
        let load = self.load(worker);
        let metrics = self.pods.get(&worker).and_then(|p| p.metrics);
        let over_blocks = threshold
            .max_blocks_in_flight
            .is_some_and(|max| load.total() > max);
        let over_waiting = matches!(
            (threshold.max_waiting_requests, metrics),
            (Some(max), Some(m)) if m.num_requests_waiting > max
        );
        let over_kv = matches!(
            (threshold.max_kv_usage, metrics),
            (Some(max), Some(m)) if m.kv_cache_usage_perc > max
        );
        over_blocks || over_waiting || over_kv
    }

    /// Whether every known pod is saturated, i.e. a new request should wait in the queue.
    /// False when there are no pods: that is "no endpoint" (503), not "busy".
    pub fn all_saturated(&self, threshold: &SaturationThreshold) -> bool {
        !self.pods.is_empty() && self.pods.keys().all(|&w| self.is_saturated(w, threshold))
    }

    /// Requests in flight on any pod.
    pub fn in_flight(&self) -> usize {
        self.requests.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: WorkerId = WorkerId(1);

    #[test]
    fn a_request_moves_from_prefill_to_decode_then_leaves() {
        let mut t = LoadTracker::new();
        t.on_pick(RequestId(1), W, 10, 4).unwrap();
        assert_eq!((t.load(W).prefill_blocks, t.load(W).decode_blocks), (4, 0));
        t.on_first_token(RequestId(1)).unwrap();
        t.on_first_token(RequestId(1)).unwrap(); // idempotent
        assert_eq!((t.load(W).prefill_blocks, t.load(W).decode_blocks), (0, 10));
        t.on_finish(RequestId(1)).unwrap();
        assert_eq!(t.load(W).total(), 0);
        assert_eq!(
            t.on_finish(RequestId(1)),
            Err(LoadError::UnknownRequest(RequestId(1)))
        );
    }

    #[test]
    fn a_request_that_fails_before_its_first_token_releases_its_prefill() {
        let mut t = LoadTracker::new();
        t.on_pick(RequestId(1), W, 10, 4).unwrap();
        t.on_pick(RequestId(2), W, 6, 6).unwrap();
        assert_eq!(
            t.on_pick(RequestId(2), W, 1, 1),
            Err(LoadError::DuplicateRequest(RequestId(2)))
        );
        t.on_finish(RequestId(1)).unwrap();
        assert_eq!(t.load(W).prefill_blocks, 6);
    }

    #[test]
    fn engine_kv_usage_is_a_floor_under_decode_load() {
        let mut t = LoadTracker::new();
        t.on_pick(RequestId(1), W, 10, 10).unwrap();
        t.on_first_token(RequestId(1)).unwrap();
        t.observe_metrics(
            W,
            EngineMetrics {
                num_requests_waiting: 0,
                kv_cache_usage_perc: 0.5,
                num_gpu_blocks: Some(100),
            },
        );
        // Another replica's traffic fills 50 of 100 blocks; we only know of 10.
        assert_eq!(t.load(W).decode_blocks, 50);
        t.observe_metrics(
            W,
            EngineMetrics {
                kv_cache_usage_perc: 0.01,
                ..EngineMetrics::default()
            },
        );
        assert_eq!(t.load(W).decode_blocks, 10, "tracked load wins when higher");
    }

    #[test]
    fn saturation_needs_every_pod_over_a_limit() {
        let mut t = LoadTracker::new();
        let limit = SaturationThreshold {
            max_waiting_requests: Some(4),
            max_blocks_in_flight: Some(20),
            ..SaturationThreshold::default()
        };
        assert!(!t.all_saturated(&limit), "no pods is not busy");
        t.on_pick(RequestId(1), WorkerId(1), 30, 30).unwrap();
        t.add_worker(WorkerId(2));
        assert!(t.is_saturated(WorkerId(1), &limit));
        assert!(!t.all_saturated(&limit));
        t.observe_metrics(
            WorkerId(2),
            EngineMetrics {
                num_requests_waiting: 5,
                ..EngineMetrics::default()
            },
        );
        assert!(t.all_saturated(&limit));
        t.remove_worker(WorkerId(1));
        assert_eq!(t.in_flight(), 0);
        assert_eq!(t.loads().len(), 1);
    }
}
