//! Blocks in flight per pod: the load half of the scheduler's cost.
//!
//! The tracker counts what this router sent: a request's uncached prompt blocks are
//! *prefill* load from the pick until its first token, and all its blocks are *decode*
//! (active) load from the pick until it finishes, since the engine holds them from
//! admission, prefilling or decoding (Dynamo's router adds a request's blocks to its
//! worker's active blocks when it routes it). Counting them only from the first token
//! made a pod busy prefilling look free: in a closed loop of 16 clients (workload B's
//! shape, `dynamo-e2e replay --concurrency 16`) TTFT p50 was 65 ms against 50 with them.
//! Decode load counts blocks as the engine holds them: a prefix shared by several
//! requests on a pod is one set of blocks there, so it counts once (as Dynamo's router
//! counts each worker's active blocks by their sequence hashes, `lib/kv-router`);
//! counting it per request would make a pod that serves many requests of one prefix look
//! loaded, and push the next one away from the pod that caches it. Engine metrics,
//! scraped elsewhere and passed in as numbers, correct that view: EPP replicas are
//! active-active, so each sees only its own share of a pod's traffic. When metrics
//! arrive, the engine's resident blocks beyond those of this router's own requests at
//! that moment (all their blocks, prefilling or decoding: the engine holds them from
//! admission) are taken as *untracked* load (other replicas' requests) and added to the
//! decode load until the next scrape. Only the excess is kept, not the total: a scrape
//! taken while this router's own request ran would otherwise keep charging the pod for
//! that request after it finished, until the next scrape, and steer the next request
//! sharing its prefix away from the pod that caches it.

use serde::{Deserialize, Serialize};

use crate::WorkerId;
use crate::fast_map::FastMap;
use crate::hash::SeqHash;

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
    /// Blocks held by requests in flight (prefilling or decoding), each once.
    pub decode_blocks: u64,
    /// Leading blocks of the prompt being placed that this router's requests in flight on
    /// the pod hold (set by [`LoadTracker::potential`], else 0). The engine shares them
    /// rather than computing them again, even those it has only scheduled: vLLM caches a
    /// block when it allocates it, before the step computes it (`allocate_slots`).
    pub shared_prefix_blocks: u64,
}

impl WorkerLoad {
    pub fn idle(worker: WorkerId) -> Self {
        Self {
            worker,
            prefill_blocks: 0,
            decode_blocks: 0,
            shared_prefix_blocks: 0,
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

#[derive(Debug, Default)]
struct PodLoad {
    prefill: u64,
    /// Distinct blocks of this router's requests in flight on the pod, prefilling or not,
    /// each with how many of them hold it.
    held: BlockCounts,
    /// Resident blocks the last scrape showed beyond `held`.
    untracked: u64,
    /// Expected output blocks of the decoding requests that said their output length.
    output: u64,
    metrics: Option<EngineMetrics>,
}

/// Blocks by how many requests hold each.
#[derive(Debug, Default)]
struct BlockCounts(FastMap<SeqHash, u32>);

impl BlockCounts {
    fn add(&mut self, blocks: &[SeqHash]) {
        for &b in blocks {
            *self.0.entry(b).or_insert(0) += 1;
        }
    }

    fn remove(&mut self, blocks: &[SeqHash]) {
        for b in blocks {
            if let Some(n) = self.0.get_mut(b) {
                *n -= 1;
                if *n == 0 {
                    self.0.remove(b);
                }
            }
        }
    }

    fn distinct(&self) -> u64 {
        self.0.len() as u64
    }
}

#[derive(Clone, Debug)]
struct InFlight {
    worker: WorkerId,
    new_blocks: u64,
    blocks: Vec<SeqHash>,
    /// Output blocks it is expected to hold on average while it decodes.
    output_blocks: u64,
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
    /// prefill load, and the `prompt`'s blocks (cached ones included) decode load.
    pub fn on_pick(
        &mut self,
        request: RequestId,
        worker: WorkerId,
        prompt: &[SeqHash],
        new_blocks: u64,
    ) -> Result<(), LoadError> {
        if self.requests.contains_key(&request) {
            return Err(LoadError::DuplicateRequest(request));
        }
        let pod = self.pods.entry(worker).or_default();
        pod.prefill += new_blocks;
        pod.held.add(prompt);
        self.requests.insert(
            request,
            InFlight {
                worker,
                new_blocks,
                blocks: prompt.to_vec(),
                output_blocks: 0,
                decoding: false,
            },
        );
        Ok(())
    }

    /// `request`, not yet decoding, is expected to hold `blocks` output blocks on average
    /// while it decodes (from its client's output-length hint): they are decode load
    /// from its first token to its end, as its own output, never shared.
    pub fn expect_output(&mut self, request: RequestId, blocks: u64) -> Result<(), LoadError> {
        let r = self
            .requests
            .get_mut(&request)
            .ok_or(LoadError::UnknownRequest(request))?;
        if !r.decoding {
            r.output_blocks = blocks;
        }
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
                pod.output += r.output_blocks;
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
            pod.held.remove(&r.blocks);
            if r.decoding {
                pod.output = pod.output.saturating_sub(r.output_blocks);
            } else {
                pod.prefill = pod.prefill.saturating_sub(r.new_blocks);
            }
        }
        Ok(())
    }

    /// Latest metrics of `worker`'s engine; they replace the previous ones.
    pub fn observe_metrics(&mut self, worker: WorkerId, metrics: EngineMetrics) {
        let pod = self.pods.entry(worker).or_default();
        let resident = metrics
            .num_gpu_blocks
            .map(|n| (n as f64 * metrics.kv_cache_usage_perc.clamp(0.0, 1.0)).round() as u64);
        pod.untracked = resident.map_or(0, |r| r.saturating_sub(pod.held.distinct()));
        pod.metrics = Some(metrics);
    }

    /// `worker`'s load: tracked prefill, and tracked decode plus the resident blocks of
    /// other routers' requests as of the last scrape.
    pub fn load(&self, worker: WorkerId) -> WorkerLoad {
        let Some(pod) = self.pods.get(&worker) else {
            return WorkerLoad::idle(worker);
        };
        WorkerLoad {
            worker,
            prefill_blocks: pod.prefill,
            decode_blocks: pod.held.distinct() + pod.untracked + pod.output,
            shared_prefix_blocks: 0,
        }
    }

    /// `worker`'s load were `prompt` sent to it: its decode load grows by the prompt's
    /// blocks that its requests in flight do not hold already (Dynamo's "potential active
    /// blocks"), so a pod already serving the prefix costs less than one that would hold
    /// a second copy of it; and those held blocks are the prompt's shared prefix there.
    pub fn potential(&self, worker: WorkerId, prompt: &[SeqHash]) -> WorkerLoad {
        let mut load = self.load(worker);
        let held = self.pods.get(&worker).map_or(0, |p| {
            // Sequence hashes chain: a request holding a prompt's block holds every
            // block before it, so the held blocks are a prefix of the prompt.
            prompt.partition_point(|b| p.held.0.contains_key(b))
        });
        load.decode_blocks += (prompt.len() - held) as u64;
        load.shared_prefix_blocks = held as u64;
        load
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

    /// `n` distinct blocks, numbered from `first`.
    fn blocks(first: u64, n: u64) -> Vec<SeqHash> {
        (first..first + n).map(SeqHash).collect()
    }

    #[test]
    fn a_request_moves_from_prefill_to_decode_then_leaves() {
        let mut t = LoadTracker::new();
        t.on_pick(RequestId(1), W, &blocks(1000, 10), 4).unwrap();
        // The engine holds all its blocks from admission; 4 of them it computes.
        assert_eq!((t.load(W).prefill_blocks, t.load(W).decode_blocks), (4, 10));
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
    fn expected_output_is_decode_load_of_its_own_while_the_request_decodes() {
        let mut t = LoadTracker::new();
        let shared = blocks(0, 8);
        t.on_pick(RequestId(1), W, &shared, 8).unwrap();
        t.on_pick(RequestId(2), W, &shared, 0).unwrap();
        t.expect_output(RequestId(1), 5).unwrap();
        t.expect_output(RequestId(2), 3).unwrap();
        assert_eq!(
            t.load(W).decode_blocks,
            8,
            "no output before the first token"
        );
        t.on_first_token(RequestId(1)).unwrap();
        t.on_first_token(RequestId(2)).unwrap();
        // The shared prompt once, each request's output on its own.
        assert_eq!(t.load(W).decode_blocks, 8 + 5 + 3);
        // Once decoding, the estimate stands.
        t.expect_output(RequestId(1), 50).unwrap();
        assert_eq!(t.load(W).decode_blocks, 8 + 5 + 3);
        t.on_finish(RequestId(1)).unwrap();
        assert_eq!(t.load(W).decode_blocks, 8 + 3);
        t.on_finish(RequestId(2)).unwrap();
        assert_eq!(t.load(W).total(), 0);
        assert_eq!(
            t.expect_output(RequestId(2), 1),
            Err(LoadError::UnknownRequest(RequestId(2)))
        );
    }

    #[test]
    fn a_prefix_shared_by_requests_on_a_pod_is_decode_load_once() {
        let mut t = LoadTracker::new();
        let shared = blocks(0, 8);
        let with = |tail: u64| [shared.clone(), blocks(tail, 2)].concat();
        t.on_pick(RequestId(1), W, &with(100), 10).unwrap();
        t.on_pick(RequestId(2), W, &with(200), 2).unwrap();
        t.on_first_token(RequestId(1)).unwrap();
        t.on_first_token(RequestId(2)).unwrap();
        assert_eq!(t.load(W).decode_blocks, 8 + 2 + 2);
        // The prefix stays while one request still holds it.
        t.on_finish(RequestId(1)).unwrap();
        assert_eq!(t.load(W).decode_blocks, 8 + 2);
        t.on_finish(RequestId(2)).unwrap();
        assert_eq!(t.load(W).total(), 0);
    }

    #[test]
    fn a_prompt_costs_a_pod_the_blocks_its_requests_do_not_hold_yet() {
        let mut t = LoadTracker::new();
        let prefix = blocks(0, 8);
        t.on_pick(
            RequestId(1),
            W,
            &[prefix.clone(), blocks(100, 2)].concat(),
            10,
        )
        .unwrap();
        let next = [prefix, blocks(200, 4)].concat();
        // The pod holds the request's 10 blocks; the prefix is not counted twice.
        assert_eq!(t.potential(W, &next).decode_blocks, 10 + 4);
        assert_eq!(t.potential(WorkerId(9), &next).decode_blocks, 12);
        // The engine shares the held prefix with the next request.
        assert_eq!(t.potential(W, &next).shared_prefix_blocks, 8);
        assert_eq!(t.potential(WorkerId(9), &next).shared_prefix_blocks, 0);
        t.on_first_token(RequestId(1)).unwrap();
        assert_eq!(t.potential(W, &next).decode_blocks, 10 + 4);
        t.on_finish(RequestId(1)).unwrap();
        assert_eq!(t.potential(W, &next).shared_prefix_blocks, 0);
    }

    #[test]
    fn a_request_that_fails_before_its_first_token_releases_its_prefill() {
        let mut t = LoadTracker::new();
        t.on_pick(RequestId(1), W, &blocks(1000, 10), 4).unwrap();
        t.on_pick(RequestId(2), W, &blocks(2000, 6), 6).unwrap();
        assert_eq!(
            t.on_pick(RequestId(2), W, &blocks(2000, 1), 1),
            Err(LoadError::DuplicateRequest(RequestId(2)))
        );
        t.on_finish(RequestId(1)).unwrap();
        assert_eq!(t.load(W).prefill_blocks, 6);
    }

    #[test]
    fn engine_kv_usage_adds_the_load_this_router_does_not_track() {
        let usage = |kv_cache_usage_perc| EngineMetrics {
            num_requests_waiting: 0,
            kv_cache_usage_perc,
            num_gpu_blocks: Some(100),
        };
        let mut t = LoadTracker::new();
        t.on_pick(RequestId(1), W, &blocks(1000, 10), 10).unwrap();
        t.on_first_token(RequestId(1)).unwrap();
        // Another replica's traffic fills 40 of the 50 resident blocks; we know of 10.
        t.observe_metrics(W, usage(0.5));
        assert_eq!(t.load(W).decode_blocks, 50);
        // Our request ends: only the other replica's 40 remain until the next scrape.
        t.on_finish(RequestId(1)).unwrap();
        assert_eq!(t.load(W).decode_blocks, 40);
        // A scrape showing less than we track adds nothing.
        t.on_pick(RequestId(2), W, &blocks(2000, 10), 10).unwrap();
        t.on_first_token(RequestId(2)).unwrap();
        t.observe_metrics(W, usage(0.01));
        assert_eq!(t.load(W).decode_blocks, 10);
        // A scrape during our own prefill: the engine already holds the request's blocks,
        // cached ones included, which are not someone else's load.
        t.on_finish(RequestId(2)).unwrap();
        t.on_pick(RequestId(3), W, &blocks(3000, 10), 2).unwrap();
        t.observe_metrics(W, usage(0.1));
        assert_eq!(
            t.load(W),
            WorkerLoad {
                worker: W,
                prefill_blocks: 2,
                decode_blocks: 10,
                shared_prefix_blocks: 0,
            }
        );
        t.on_finish(RequestId(3)).unwrap();
        assert_eq!(t.load(W).total(), 0, "nothing left once it is done");
        t.on_pick(RequestId(2), W, &blocks(2000, 10), 10).unwrap();
        t.on_first_token(RequestId(2)).unwrap();
        // Without the cache size, usage cannot be turned into blocks.
        t.observe_metrics(
            W,
            EngineMetrics {
                num_gpu_blocks: None,
                ..usage(0.9)
            },
        );
        assert_eq!(t.load(W).decode_blocks, 10);
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
        t.on_pick(RequestId(1), WorkerId(1), &blocks(1000, 30), 30)
            .unwrap();
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
