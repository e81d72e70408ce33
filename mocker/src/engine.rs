//! The engine: scheduler + block pool + timing model + clock, stepped by the caller.
//!
//! Time: a step starts at `clock.now_ms()`, lasts `timing.step_ms(work) / speedup`, and
//! its tokens are stamped at its end. So a lone request's TTFT is the prefill time of
//! its uncached prompt (the first token is sampled by the prefill step itself, as in
//! vLLM), and each later token arrives one decode step after the previous one.

use dynamo_kvcache::vllm_events::KvEvent;
use dynamo_kvcache::{BlockHasher, SeqHash};

use crate::block_pool::{BlockPool, OffloadBlock, PinCounters};
use crate::clock::{Clock, SimClock};
use crate::config::{ConfigError, EngineConfig};
use crate::scheduler::{
    FinishedRequest, Limits, PromptKv, Rejected, Request, RequestId, Scheduler, SchedulerCounters,
    TokenOutput,
};
use crate::timing::StepWork;

/// What one step did.
#[derive(Clone, Debug, Default)]
pub struct StepOutcome {
    pub started_ms: f64,
    /// Simulated duration (already divided by the speedup ratio); 0 when idle.
    pub duration_ms: f64,
    pub work: StepWork,
    /// Requests that got a token (index 0 is the TTFT point).
    pub outputs: Vec<TokenOutput>,
    pub finished: Vec<FinishedRequest>,
    pub preempted: Vec<RequestId>,
    /// Engine-side KV events, in order, for the ZMQ publisher.
    pub kv_events: Vec<KvEvent>,
    /// Blocks to hand to the sidecar (with `kv_blocks` configured), in order.
    pub offload: Vec<OffloadBlock>,
}

impl StepOutcome {
    pub fn ended_ms(&self) -> f64 {
        self.started_ms + self.duration_ms
    }
}

/// Gauges and counters behind vLLM's metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineMetrics {
    /// `vllm:num_requests_waiting` (preempted requests included).
    pub num_requests_waiting: usize,
    /// `vllm:num_requests_running`.
    pub num_requests_running: usize,
    /// `vllm:kv_cache_usage_perc` (a fraction, 0..=1, as vLLM exports it).
    pub kv_cache_usage: f64,
    /// `vllm:cache_config_info` labels.
    pub num_gpu_blocks: usize,
    pub block_size: usize,
    pub steps: u64,
    /// `vllm:prefix_cache_queries`, `vllm:prefix_cache_hits` (tokens),
    /// `vllm:num_preemptions`, `vllm:prompt_tokens`, `vllm:generation_tokens`, ...
    pub counters: SchedulerCounters,
    /// Blocks under a live `cache_control` pin (as of the last step).
    pub pinned_blocks: usize,
    pub pins: PinCounters,
}

#[derive(Debug)]
pub struct Engine<C: Clock = SimClock> {
    config: EngineConfig,
    scheduler: Scheduler,
    clock: C,
    steps: u64,
    /// Events raised outside a step (a prefix cache reset), sent with the next step.
    pending_events: Vec<KvEvent>,
}

impl Engine<SimClock> {
    /// An engine on simulated time starting at 0.
    pub fn simulated(config: EngineConfig) -> Result<Self, ConfigError> {
        Self::new(config, SimClock::default())
    }
}

impl<C: Clock> Engine<C> {
    pub fn new(config: EngineConfig, clock: C) -> Result<Self, ConfigError> {
        config.validate()?;
        let hasher = match &config.model_name {
            Some(model) => BlockHasher::new(config.block_size, model, None),
            None => BlockHasher::unsalted(config.block_size),
        };
        let mut pool = BlockPool::new(config.num_gpu_blocks, config.block_size);
        let tiers = config.kv_blocks.as_ref().filter(|kv| kv.uses_tiers());
        pool.set_offload(tiers.map(|kv| kv.offload));
        let limits = Limits {
            max_num_seqs: config.max_num_seqs,
            max_num_batched_tokens: config.max_num_batched_tokens,
            enable_prefix_caching: config.enable_prefix_caching,
            vocab_size: config.vocab_size,
            seed: config.seed,
        };
        Ok(Self {
            scheduler: Scheduler::new(limits, hasher, pool),
            config,
            clock,
            steps: 0,
            pending_events: Vec::new(),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    pub fn clock_mut(&mut self) -> &mut C {
        &mut self.clock
    }

    /// The hasher whose sequence hashes key this engine's cache (and its KV events).
    pub fn hasher(&self) -> &BlockHasher {
        self.scheduler.hasher()
    }

    /// Stops collecting KV events (replays that never read them run faster).
    pub fn set_emit_kv_events(&mut self, on: bool) {
        self.scheduler.pool_mut().set_emit_events(on);
    }

    /// Queues a request arriving now.
    pub fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let now = self.clock.now_ms();
        self.scheduler.add(req, now)
    }

    /// Queues a request that arrived at `arrival_ms` (replays: the trace's time).
    pub fn submit_at(&mut self, req: Request, arrival_ms: f64) -> Result<(), Rejected> {
        self.scheduler.add(req, arrival_ms)
    }

    /// Queues a request that arrived at `arrival_ms` with `onboarded` prompt KV (from the
    /// sidecar's tiers, or a prefill engine's whole prompt).
    pub fn submit_onboarded(
        &mut self,
        req: Request,
        arrival_ms: f64,
        onboarded: PromptKv,
    ) -> Result<(), Rejected> {
        self.scheduler.add_onboarded(req, arrival_ms, onboarded)
    }

    /// Cancels a request (client gone); frees its blocks at once.
    pub fn abort(&mut self, id: RequestId) -> Option<FinishedRequest> {
        let now = self.clock.now_ms();
        self.scheduler.abort(id, now)
    }

    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    /// Leading blocks of `hashes` in this engine's prefix cache (for routers and tests).
    pub fn cached_prefix_blocks(&self, hashes: &[SeqHash]) -> usize {
        self.scheduler.pool().cached_prefix_len(hashes)
    }

    /// Forgets the prefix cache when nothing runs; the `AllBlocksCleared` event comes
    /// with the next step's outcome.
    pub fn reset_prefix_cache(&mut self) -> bool {
        let pool = self.scheduler.pool_mut();
        let ok = pool.reset();
        self.pending_events.extend(pool.take_events());
        ok
    }

    /// Runs one step. With nothing to do it returns an empty outcome of 0 ms.
    pub fn step(&mut self) -> StepOutcome {
        let started_ms = self.clock.now_ms();
        // Pins live in engine time: they run out as the clock moves, idle or not.
        self.scheduler.pool_mut().set_now(started_ms);
        let mut kv_events = std::mem::take(&mut self.pending_events);
        if !self.scheduler.has_work() {
            return StepOutcome {
                started_ms,
                kv_events,
                ..StepOutcome::default()
            };
        }
        let batch = self.scheduler.schedule();
        let duration_ms = self
            .config
            .timing
            .step_ms(batch.work, self.config.speedup_ratio);
        let end = started_ms + duration_ms;
        let tokens = self.scheduler.complete(&batch, end);
        let pool = self.scheduler.pool_mut();
        kv_events.extend(pool.take_events());
        let offload = pool.take_offloads();
        self.clock.advance_to(end);
        self.steps += 1;
        StepOutcome {
            started_ms,
            duration_ms,
            work: batch.work,
            outputs: tokens.outputs,
            finished: tokens.finished,
            preempted: batch.preempted,
            kv_events,
            offload,
        }
    }

    pub fn metrics(&self) -> EngineMetrics {
        let pool = self.scheduler.pool();
        EngineMetrics {
            num_requests_waiting: self.scheduler.num_waiting(),
            num_requests_running: self.scheduler.num_running(),
            kv_cache_usage: pool.usage(),
            num_gpu_blocks: pool.num_blocks(),
            block_size: pool.block_size(),
            steps: self.steps,
            counters: self.scheduler.counters(),
            pinned_blocks: pool.num_pinned(),
            pins: pool.pin_counters(),
        }
    }
}
