//! A workload through simulated mock engines (`dynamo_mocker::replay`) routed by the
//! router's real scheduler (`dynamo_kvcache`), in simulated time: no sockets, the same
//! figures for the same seed, router modes compared in seconds.
//!
//! [`KvRouter`] does what the endpoint picker does per request: overlap from the exact
//! index (`kv`, fed by the engines' KV events) or the approximate one (`approx`, fed by
//! its own picks), loads from its [`LoadTracker`] (prefill until the first token, decode
//! until the end, floored by each engine's KV usage as the picker reads it from
//! `/metrics`), then [`Scheduler::pick`]. It sees everything at once, where the picker
//! sees events and metrics a little late.

use std::time::{Duration, Instant};

use dynamo_kvcache::vllm_events::KvEvent as EngineEvent;
use dynamo_kvcache::{
    ApproxConfig, ApproxIndex, EngineMetrics, KvEvent, KvIndex, LoadTracker, OverlapScores,
    RemovedBlock, RequestId, RouterMode, Scheduler, SchedulerConfig, SeqHash, StoredBlock, Tier,
    WorkerId,
};
use dynamo_mocker::replay::{ReplayRequest, RouteQuery, Router, replay_requests};
use dynamo_mocker::{Engine, EngineConfig, StepOutcome};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::report::Report;
use crate::workload::Workload;

/// How the simulated router is set up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouterSetup {
    pub mode: RouterMode,
    pub scheduler: SchedulerConfig,
    pub approx: ApproxConfig,
    /// Seeds the `random` mode and softmax sampling.
    pub seed: u64,
}

/// The endpoint picker's routing, over simulated engines.
pub struct KvRouter {
    setup: RouterSetup,
    scheduler: Scheduler,
    index: KvIndex,
    approx: ApproxIndex,
    loads: LoadTracker,
    rng: StdRng,
}

impl KvRouter {
    /// `capacity_blocks`: KV blocks of all engines together, the exact index's bound.
    pub fn new(setup: RouterSetup, capacity_blocks: usize) -> Self {
        Self {
            scheduler: Scheduler::new(setup.mode, setup.scheduler),
            index: KvIndex::new(capacity_blocks),
            approx: ApproxIndex::new(setup.approx),
            loads: LoadTracker::new(),
            rng: StdRng::seed_from_u64(setup.seed),
            setup,
        }
    }
}

fn worker(engine: usize) -> WorkerId {
    WorkerId(engine as u64)
}

/// The router's form of an engine event. The mocker's engine hashes are the router's
/// sequence hashes of the same tokens (`docs/mocker.md`, "KV event wire format"), so
/// no token needs rehashing here.
fn router_event(event: &EngineEvent) -> KvEvent {
    match event {
        EngineEvent::BlockStored {
            block_hashes,
            parent_hash,
            ..
        } => KvEvent::Stored {
            parent: parent_hash.map(SeqHash),
            blocks: block_hashes
                .iter()
                .map(|&h| StoredBlock {
                    seq_hash: SeqHash(h),
                    engine_hash: h,
                    tier: Tier::Gpu,
                })
                .collect(),
        },
        EngineEvent::BlockRemoved { block_hashes, .. } => KvEvent::Removed {
            blocks: block_hashes
                .iter()
                .map(|&h| RemovedBlock {
                    seq_hash: SeqHash(h),
                    engine_hash: h,
                })
                .collect(),
            tier: Tier::Gpu,
        },
        EngineEvent::AllBlocksCleared => KvEvent::Cleared,
    }
}

impl Router for KvRouter {
    fn route(&mut self, q: &RouteQuery<'_>, engines: &[Engine]) -> usize {
        for (k, e) in engines.iter().enumerate() {
            let m = e.metrics();
            self.loads.observe_metrics(
                worker(k),
                EngineMetrics {
                    num_requests_waiting: m.num_requests_waiting as u64,
                    kv_cache_usage_perc: m.kv_cache_usage,
                    num_gpu_blocks: Some(m.num_gpu_blocks as u64),
                },
            );
        }
        let now = Duration::from_secs_f64(q.arrival_ms.max(0.0) / 1000.0);
        let scores = match self.setup.mode {
            RouterMode::Kv => self.index.find_matches(q.block_hashes),
            RouterMode::Approx => self.approx.find_matches(q.block_hashes, now),
            RouterMode::RoundRobin | RouterMode::Random => OverlapScores::default(),
        };
        let blocks = q.block_hashes.len() as u64;
        let d = self
            .scheduler
            .pick(&scores, &self.loads.loads(), blocks, &mut self.rng)
            .expect("every engine is a candidate and the temperature was checked");
        let new_blocks = blocks.saturating_sub(u64::from(d.overlap.total()));
        self.loads
            .on_pick(RequestId(q.index as u64), d.worker, blocks, new_blocks)
            .expect("request indexes are unique");
        if self.setup.mode == RouterMode::Approx {
            self.approx.record(d.worker, q.block_hashes, now);
        }
        d.worker.0 as usize
    }

    fn observe(&mut self, engine: usize, o: &StepOutcome) {
        for e in &o.kv_events {
            // A full index under-reports overlap until evictions make room; that is
            // the index's documented behaviour, not an error of the replay.
            let _ = self.index.apply(worker(engine), &router_event(e));
        }
        for t in o.outputs.iter().filter(|t| t.index == 0) {
            let _ = self.loads.on_first_token(RequestId(t.id));
        }
        for f in &o.finished {
            let _ = self.loads.on_finish(RequestId(f.id));
        }
    }

    fn rejected(&mut self, _engine: usize, index: usize) {
        let _ = self.loads.on_finish(RequestId(index as u64));
    }

    fn wants_kv_events(&self) -> bool {
        self.setup.mode == RouterMode::Kv
    }
}

/// Replays `workload`, request `i` arriving at `arrivals_ms[i]`, over `workers` engines
/// built from `engine`, routed as `setup` says.
pub fn run(
    workload: &Workload,
    arrivals_ms: &[f64],
    engine: &EngineConfig,
    workers: usize,
    setup: RouterSetup,
) -> anyhow::Result<Report> {
    anyhow::ensure!(
        arrivals_ms.len() == workload.len(),
        "{} arrival times for {} requests",
        arrivals_ms.len(),
        workload.len()
    );
    anyhow::ensure!(
        setup.scheduler.temperature.is_finite() && setup.scheduler.temperature >= 0.0,
        "the temperature must be finite and >= 0"
    );
    let mut router = KvRouter::new(setup, workers * engine.num_gpu_blocks);
    let requests = arrivals_ms.iter().enumerate().map(|(i, &at)| {
        let item = workload.request(i);
        ReplayRequest {
            arrival_ms: at,
            token_ids: item.token_ids,
            max_tokens: item.max_tokens,
        }
    });
    let started = Instant::now();
    let report = replay_requests(requests, engine, workers, &mut router)?;
    Ok(Report::from_replay(
        setup.mode.as_str(),
        &report,
        started.elapsed().as_secs_f64(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arrivals;
    use crate::workload::SharedPrefix;

    /// 4 engines too small to hold every prefix: 16 prefixes of 8 blocks (128 blocks in
    /// all), 64 blocks per engine.
    fn small_pressure() -> (Workload, Vec<f64>, EngineConfig) {
        let w = Workload::shared_prefix(SharedPrefix {
            prefixes: 16,
            suffixes: 8,
            prefix_tokens: 128,
            unique_tokens: 16,
            output_tokens: 8,
            seed: 1,
        })
        .unwrap();
        let at = arrivals::poisson(w.len(), 40.0, 2);
        let engine = EngineConfig {
            num_gpu_blocks: 64,
            block_size: 16,
            ..EngineConfig::default()
        };
        (w, at, engine)
    }

    fn setup(mode: RouterMode) -> RouterSetup {
        RouterSetup {
            mode,
            scheduler: SchedulerConfig::default(),
            approx: ApproxConfig::default(),
            seed: 3,
        }
    }

    #[test]
    fn replays_are_deterministic() {
        let (w, at, engine) = small_pressure();
        for mode in RouterMode::ALL {
            let mut a = run(&w, &at, &engine, 4, setup(mode)).unwrap();
            let mut b = run(&w, &at, &engine, 4, setup(mode)).unwrap();
            a.replay.as_mut().unwrap().wall_s = 0.0;
            b.replay.as_mut().unwrap().wall_s = 0.0;
            assert_eq!(a, b, "{mode}");
            assert_eq!((a.completed, a.errors), (128, 0), "{mode}");
            assert_eq!(a.output_tokens, 128 * 8);
        }
    }

    #[test]
    fn kv_routing_beats_round_robin_under_cache_pressure() {
        let (w, at, engine) = small_pressure();
        let kv = run(&w, &at, &engine, 4, setup(RouterMode::Kv)).unwrap();
        let rr = run(&w, &at, &engine, 4, setup(RouterMode::RoundRobin)).unwrap();
        let (kv_hit, rr_hit) = (kv.kv_hit_rate.unwrap(), rr.kv_hit_rate.unwrap());
        assert!(kv_hit > 1.4 * rr_hit, "kv {kv_hit} vs round-robin {rr_hit}");
        assert!(kv.ttft_ms.p50 < rr.ttft_ms.p50, "{kv:?}\n{rr:?}");
    }

    #[test]
    fn engine_events_become_router_events() {
        let stored = EngineEvent::BlockStored {
            block_hashes: vec![7, 8],
            parent_hash: Some(6),
            token_ids: vec![0; 32],
            block_size: 16,
            lora_id: None,
            medium: Some("GPU".into()),
            lora_name: None,
        };
        let mut index = KvIndex::default();
        index.apply(WorkerId(0), &router_event(&stored)).unwrap();
        index
            .apply(
                WorkerId(0),
                &router_event(&EngineEvent::BlockRemoved {
                    block_hashes: vec![8],
                    medium: None,
                }),
            )
            .unwrap();
        assert_eq!(index.tiers_of(WorkerId(0), SeqHash(7)), [Tier::Gpu]);
        assert!(index.tiers_of(WorkerId(0), SeqHash(8)).is_empty());
        assert_eq!(
            router_event(&EngineEvent::AllBlocksCleared),
            KvEvent::Cleared
        );
    }
}
