//! A workload through simulated mock engines (`dynamo_mocker::replay`) routed by the
//! router's real scheduler (`dynamo_kvcache`), in simulated time: no sockets, the same
//! figures for the same seed, router modes compared in seconds.
//!
//! [`KvRouter`] routes through the endpoint picker's own routing step
//! ([`RoutingCore`]: overlap from the exact index, `kv`, fed by the engines' KV events, or
//! the approximate one, `approx`, fed by its own picks; loads in flight floored by each
//! engine's KV usage as the picker reads it from `/metrics`; the scheduler's pick). It
//! sees events and metrics at once, where the picker sees them a little late.
//!
//! A conversation replay can also give each engine the sidecar's KV block tiers
//! ([`TierSetup`]): the tier policy itself (`dynamo_kvblocks::placement`) fed with the
//! blocks each step evicts, and each turn onboarding what the tiers hold of its prompt
//! before it may be scheduled, in simulated time.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::{Duration, Instant};

use dynamo_kvblocks::placement::{Action, Offered, Placement, PlacementConfig};
use dynamo_loadgen::report::{Report, TierStats, TurnSample, turn_stats};
use dynamo_loadgen::workload::{Sessions, Workload};

pub use dynamo_kvcache::Side;
use dynamo_kvcache::vllm_events::KvEvent as EngineEvent;
use dynamo_kvcache::{
    ApproxConfig, BlockHasher, Decision, EngineMetrics, KvEvent, KvIndex, OverlapScores,
    RemovedBlock, RequestId, RouterMode, RoutingCore, SchedulerConfig, SeqHash, StoredBlock, Tier,
    WorkerId,
};
use dynamo_mocker::replay::{
    Collector, ReplayRequest, RouteQuery, Router, replay_requests, simulated_engines,
};
use dynamo_mocker::{
    Driver, Engine, EngineConfig, KvBlocksConfig, OffloadBlock, OffloadMode, PromptKv, Request,
    SimCluster, StepOutcome,
};

/// How the simulated router is set up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouterSetup {
    pub mode: RouterMode,
    pub scheduler: SchedulerConfig,
    pub approx: ApproxConfig,
    /// Seeds the `random` mode and softmax sampling.
    pub seed: u64,
}

impl RouterSetup {
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        let t = self.scheduler.temperature;
        anyhow::ensure!(
            t.is_finite() && t >= 0.0,
            "the temperature must be finite and >= 0"
        );
        Ok(())
    }
}

/// Refuses arrival times that are not one per request, or that are negative or out of
/// order.
pub(crate) fn check_arrivals(workload: &Workload, arrivals_ms: &[f64]) -> anyhow::Result<()> {
    anyhow::ensure!(
        arrivals_ms.len() == workload.len(),
        "{} arrival times for {} requests",
        arrivals_ms.len(),
        workload.len()
    );
    anyhow::ensure!(
        arrivals_ms.windows(2).all(|w| w[0] <= w[1]) && arrivals_ms.iter().all(|t| *t >= 0.0),
        "arrival times must be >= 0 and not decrease"
    );
    Ok(())
}

/// The endpoint picker's routing, over simulated engines.
pub struct KvRouter {
    core: RoutingCore,
    index: KvIndex,
}

impl KvRouter {
    /// `capacity_blocks`: KV blocks of all engines together, the exact index's bound.
    pub fn new(setup: RouterSetup, capacity_blocks: usize) -> Self {
        Self {
            core: RoutingCore::new(setup.mode, setup.scheduler, setup.approx, setup.seed),
            index: KvIndex::new(capacity_blocks),
        }
    }

    /// Reads each engine's gauges, as the picker scrapes `/metrics`; `engines` yields
    /// (engine number, engine).
    pub fn observe_metrics<'a>(&mut self, engines: impl IntoIterator<Item = (usize, &'a Engine)>) {
        for (k, e) in engines {
            let m = e.metrics();
            self.core.observe_metrics(
                worker(k),
                EngineMetrics {
                    num_requests_waiting: m.num_requests_waiting as u64,
                    kv_cache_usage_perc: m.kv_cache_usage,
                    num_gpu_blocks: Some(m.num_gpu_blocks as u64),
                },
            );
        }
    }

    /// The prompt's overlap with every engine, as an aggregated pick credits it.
    pub fn scores(&self, block_hashes: &[SeqHash], arrival_ms: f64) -> OverlapScores {
        self.core.overlap(
            Side::Aggregated,
            block_hashes,
            simulated(arrival_ms),
            |hashes| self.index.find_matches(hashes),
        )
    }

    /// Picks where a request runs among engine numbers and accounts its load, as the
    /// endpoint picker does ([`RoutingCore::pick_route`]): with `prefill` (the prefill
    /// engines and the prefill leg's id), a prefill engine and a decode engine among
    /// `serving`; else one aggregated engine. `request` is unique while in flight.
    /// Returns the prefill engine, if any, and the serving one.
    pub fn pick(
        &mut self,
        serving: &[usize],
        request: RequestId,
        prefill: Option<(&[usize], RequestId)>,
        block_hashes: &[SeqHash],
        arrival_ms: f64,
    ) -> (Option<usize>, usize) {
        let now = simulated(arrival_ms);
        let scores = self.scores(block_hashes, arrival_ms);
        let workers =
            |engines: &[usize]| -> Vec<WorkerId> { engines.iter().map(|&k| worker(k)).collect() };
        let prefill_workers = prefill.map(|(engines, id)| (workers(engines), id));
        let route = self
            .core
            .pick_route(
                &scores,
                &workers(serving),
                request,
                prefill_workers.as_ref().map(|(w, id)| (&w[..], *id)),
                block_hashes,
                now,
            )
            .expect("candidates are given, the temperature was checked and ids are unique");
        let engine = |d: Decision| d.worker.0 as usize;
        (route.prefill.map(engine), engine(route.serving))
    }

    /// Engine `engine`'s KV events, as the picker reads them from its event stream.
    pub fn observe_kv_events(&mut self, engine: usize, events: &[EngineEvent]) {
        for e in events {
            // A full index under-reports overlap until evictions make room; that is
            // the index's documented behaviour, not an error of the replay.
            let _ = self.index.apply(worker(engine), &router_event(e));
        }
    }

    /// `request` streamed its first token: its prefill load becomes decode load.
    pub fn first_token(&mut self, request: RequestId) {
        self.core.first_token(request);
    }

    /// `request` finished, failed or was refused: it no longer loads its engine.
    pub fn finished(&mut self, request: RequestId) {
        self.core.finished(request);
    }

    /// Whether the router reads KV events (the `kv` mode).
    pub fn reads_kv_events(&self) -> bool {
        self.core.mode() == RouterMode::Kv
    }

    /// Engine `engine` is gone (scaled down and drained): its blocks leave the indexes and
    /// its load the tracker, as when the picker drops a pod from its pool.
    pub fn remove_engine(&mut self, engine: usize) {
        self.index.remove_worker(worker(engine));
        self.core.remove_worker(worker(engine));
    }
}

/// Simulated milliseconds as the approximate index's clock.
fn simulated(ms: f64) -> Duration {
    Duration::from_secs_f64(ms.max(0.0) / 1000.0)
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

impl KvRouter {
    /// What an engine's sidecar published about its tiers, as the picker reads it from
    /// the pod's KV event stream.
    fn observe_tiers(&mut self, engine: usize, events: &[KvEvent]) {
        for e in events {
            let _ = self.index.apply(worker(engine), e);
        }
    }
}

impl Router for KvRouter {
    fn route(&mut self, q: &RouteQuery<'_>, engines: &[Engine]) -> usize {
        self.observe_metrics(engines.iter().enumerate());
        let all: Vec<usize> = (0..engines.len()).collect();
        let request = RequestId(q.index as u64);
        self.pick(&all, request, None, q.block_hashes, q.arrival_ms)
            .1
    }

    fn observe(&mut self, engine: usize, o: &StepOutcome) {
        self.observe_kv_events(engine, &o.kv_events);
        for t in o.outputs.iter().filter(|t| t.index == 0) {
            self.first_token(RequestId(t.id));
        }
        for f in &o.finished {
            self.finished(RequestId(f.id));
        }
    }

    fn rejected(&mut self, _engine: usize, index: usize) {
        self.finished(RequestId(index as u64));
    }

    fn wants_kv_events(&self) -> bool {
        self.reads_kv_events()
    }
}

/// Replays `workload`, request `i` arriving at `arrivals_ms[i]`, over `workers` engines
/// built from `engine`, routed as `setup` says. For a conversation workload
/// `arrivals_ms` are the sessions' starts (see [`run_sessions`]).
pub fn run(
    workload: &Workload,
    arrivals_ms: &[f64],
    engine: &EngineConfig,
    workers: usize,
    setup: RouterSetup,
) -> anyhow::Result<Report> {
    run_with_tiers(workload, arrivals_ms, engine, workers, setup, None)
}

/// As [`run`], each engine with the sidecar's KV block tiers `tiers` (conversation
/// workloads only; see [`run_sessions_with_tiers`]).
pub fn run_with_tiers(
    workload: &Workload,
    arrivals_ms: &[f64],
    engine: &EngineConfig,
    workers: usize,
    setup: RouterSetup,
    tiers: Option<&TierSetup>,
) -> anyhow::Result<Report> {
    if let Some(&spec) = workload.conversations() {
        return run_sessions_with_tiers(workload, spec, arrivals_ms, engine, workers, setup, tiers);
    }
    anyhow::ensure!(
        tiers.is_none(),
        "KV block tiers are simulated for conversation workloads (--sessions) only"
    );
    check_arrivals(workload, arrivals_ms)?;
    setup.validate()?;
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

/// The sidecar's KV block tiers in a conversation replay: each engine has its own store
/// (`dynamo_kvblocks::placement`, as the sidecar runs it, with every write and move
/// done at once), fed with the blocks each step evicts from the engine's GPU pool.
#[derive(Clone, Debug, PartialEq)]
pub struct TierSetup {
    /// Each engine's tiers: sizes in real bytes, reuse filters.
    pub placement: PlacementConfig,
    /// Real KV bytes of one block (`KvGeometry::block_bytes` of the model): what a block
    /// takes in a tier and what onboarding it moves.
    pub block_bytes: u64,
    /// Onboarding bandwidth per tier (defaults: the mocker's, host 200 GB/s, disk 7 GB/s,
    /// object 1.25 GB/s); offload is `evicted`.
    pub kv: KvBlocksConfig,
}

impl TierSetup {
    /// `placement` with the mocker's default bandwidths.
    pub fn new(placement: PlacementConfig, block_bytes: u64) -> Self {
        Self {
            placement,
            block_bytes,
            kv: KvBlocksConfig::default(),
        }
    }

    /// Blocks one engine's tiers can hold in all.
    fn capacity_blocks(&self) -> usize {
        let p = &self.placement;
        [p.host, p.disk, p.object]
            .iter()
            .flatten()
            .map(|l| (l.capacity_bytes / self.block_bytes.max(1)) as usize)
            .sum()
    }
}

/// The engines' stores, and what went through them.
struct Tiers<'a> {
    setup: &'a TierSetup,
    stores: Vec<Placement>,
    stats: TierStats,
    /// Whether the router reads the stores' KV events.
    publish: bool,
}

impl<'a> Tiers<'a> {
    fn new(setup: &'a TierSetup, workers: usize, publish: bool) -> Self {
        Self {
            setup,
            stores: (0..workers)
                .map(|_| Placement::new(setup.placement))
                .collect(),
            stats: TierStats {
                block_bytes: setup.block_bytes,
                ..TierStats::default()
            },
            publish,
        }
    }

    /// Engine `k` evicted `blocks`: its sidecar offers each to its store.
    fn offload(&mut self, k: usize, blocks: &[OffloadBlock]) -> Vec<KvEvent> {
        let mut events = Vec::new();
        for b in blocks {
            let (offered, actions) =
                self.stores[k].offload(b.hash, b.parent, self.setup.block_bytes);
            match offered {
                Offered::Stored => self.stats.offloaded_blocks += 1,
                Offered::Duplicate => self.stats.duplicate_blocks += 1,
                Offered::Refused => self.stats.refused_blocks += 1,
            }
            self.apply(k, actions, &mut events);
        }
        events
    }

    /// A request of `prompt_len` tokens (full-block hashes `hashes`) arrives at engine
    /// `k`: the blocks its store holds of the prompt beyond the GPU's cached prefix, as
    /// the mocker's sidecar client asks for them (the last prompt token is always
    /// computed), and the simulated milliseconds loading them takes.
    fn onboard(
        &mut self,
        k: usize,
        engine: &Engine,
        hashes: &[SeqHash],
        prompt_len: usize,
        events: &mut Vec<KvEvent>,
    ) -> (Range<usize>, f64) {
        let max_blocks =
            (prompt_len.saturating_sub(1) / engine.config().block_size).min(hashes.len());
        let wanted = &hashes[..max_blocks];
        let on_gpu = engine.cached_prefix_blocks(wanted);
        let held = self.stores[k].lookup(&wanted[on_gpu..]);
        if held.is_empty() {
            return (0..0, 0.0);
        }
        let mut ms = 0.0;
        for &(hash, tier) in &held {
            ms += self.setup.kv.transfer_ms(self.setup.block_bytes, tier);
            self.stats.onboarded_blocks.add(tier);
            let actions = self.stores[k].onboarded(hash, tier);
            self.apply(k, actions, events);
        }
        self.stats.onboarded_requests += 1;
        (
            on_gpu..on_gpu + held.len(),
            ms / engine.config().speedup_ratio,
        )
    }

    /// Carries out a store's actions at once, with the KV events the sidecar publishes.
    fn apply(&mut self, k: usize, actions: Vec<Action>, events: &mut Vec<KvEvent>) {
        let store = &mut self.stores[k];
        for a in actions {
            match a {
                Action::Write { hash, tier } => {
                    store.written(hash, tier);
                    if self.publish {
                        events.push(tier_stored(store, hash, tier));
                    }
                }
                Action::Move { hash, from, to } => {
                    store.written(hash, to);
                    if self.publish {
                        events.push(tier_removed(hash, from));
                        events.push(tier_stored(store, hash, to));
                    }
                }
                Action::Delete { hash, tier } => {
                    if self.publish {
                        events.push(tier_removed(hash, tier));
                    }
                }
            }
        }
    }
}

fn tier_stored(store: &Placement, hash: SeqHash, tier: Tier) -> KvEvent {
    KvEvent::Stored {
        parent: store.parent(hash),
        blocks: vec![StoredBlock {
            seq_hash: hash,
            engine_hash: hash.0,
            tier,
        }],
    }
}

fn tier_removed(hash: SeqHash, tier: Tier) -> KvEvent {
    KvEvent::Removed {
        blocks: vec![RemovedBlock {
            seq_hash: hash,
            engine_hash: hash.0,
        }],
        tier,
    }
}

/// A turn waiting for its onboarded blocks before it is queued.
struct Onboarding {
    engine: usize,
    request: Request,
    arrival_ms: f64,
    blocks: Range<usize>,
}

/// Routes request `i` of `workload`, arriving at `at`, as the picker does: the engine
/// chosen, the request to submit to it, and its prompt's block hashes.
fn route(
    workload: &Workload,
    i: usize,
    at: f64,
    hasher: &BlockHasher,
    router: &mut KvRouter,
    engines: &[Engine],
) -> (usize, Request, Vec<SeqHash>) {
    let item = workload.request(i);
    let hashes = hasher.seq_hashes(&item.token_ids);
    let query = RouteQuery {
        index: i,
        arrival_ms: at,
        token_ids: &item.token_ids,
        block_hashes: &hashes,
    };
    let k = router.route(&query, engines);
    (k, item.into_request(i), hashes)
}

/// [`run_sessions_with_tiers`] as a driver of the simulated cluster: the events are
/// turns arriving and onboarded turns being queued. A step shows the router the
/// engine's outcome and what its sidecar published of the blocks it evicted.
struct Conversations<'a> {
    cluster: SimCluster<(StepOutcome, Vec<KvEvent>)>,
    workload: &'a Workload,
    spec: Sessions,
    hasher: BlockHasher,
    router: KvRouter,
    stores: Option<Tiers<'a>>,
    /// Known arrivals: (time bits, session).
    ready: BTreeSet<(u64, usize)>,
    /// Turns loading their blocks, by (time they are loaded, request index).
    onboarding: BTreeMap<(u64, usize), Onboarding>,
    next_turn: Vec<usize>,
    samples: Vec<TurnSample>,
    collector: Collector,
    rejected: usize,
}

impl Conversations<'_> {
    /// The next turn of `session`, `at` ms.
    fn follow(&mut self, session: usize, at: f64) {
        if self.next_turn[session] < self.spec.turns {
            let next = at + self.spec.think_time_ms;
            self.ready.insert((next.to_bits(), session));
        }
    }

    /// Whether the next event is a turn whose blocks are loaded (before an arrival at
    /// the same time).
    fn loaded_first(&self) -> bool {
        match (self.onboarding.first_key_value(), self.ready.first()) {
            (Some((&(t, _), _)), Some(&(a, _))) => f64::from_bits(t) <= f64::from_bits(a),
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

impl Driver for Conversations<'_> {
    type Shown = (StepOutcome, Vec<KvEvent>);
    type Error = anyhow::Error;

    fn cluster(&mut self) -> &mut SimCluster<Self::Shown> {
        &mut self.cluster
    }

    fn next_event_ms(&self) -> Option<f64> {
        let arrival = self
            .ready
            .first()
            .map_or(f64::INFINITY, |&(t, _)| f64::from_bits(t));
        let loaded = self
            .onboarding
            .first_key_value()
            .map_or(f64::INFINITY, |(&(t, _), _)| f64::from_bits(t));
        Some(arrival.min(loaded))
    }

    fn stepped(&mut self, k: usize, o: StepOutcome) -> anyhow::Result<Self::Shown> {
        self.collector.take(&o);
        // What the sidecar stored of the step's evictions shows with the step, after the
        // engine's own events (the index learns of a block leaving the GPU, then of it
        // landing in a tier).
        let offloaded = self
            .stores
            .as_mut()
            .map_or_else(Vec::new, |stores| stores.offload(k, &o.offload));
        for f in &o.finished {
            let i = f.id as usize;
            self.samples.push(TurnSample {
                turn: i % self.spec.turns,
                ok: true,
                ttft_ms: f.first_token_ms.map(|t| t - f.arrival_ms),
                prompt_tokens: Some(f.prompt_tokens as u64),
                cached_tokens: Some(f.cached_prompt_tokens as u64),
            });
            self.follow(i / self.spec.turns, f.finished_ms);
        }
        Ok((o, offloaded))
    }

    fn event(&mut self, at: f64) -> anyhow::Result<()> {
        // A turn whose blocks are loaded is queued; else the next turn arrives.
        let (k, request, arrival_ms, blocks) = if self.loaded_first() {
            let (_, o) = self.onboarding.pop_first().expect("loaded first");
            (o.engine, o.request, o.arrival_ms, o.blocks)
        } else {
            let (_, session) = self.ready.pop_first().expect("an event is due");
            let turn = self.next_turn[session];
            self.next_turn[session] += 1;
            let i = session * self.spec.turns + turn;
            let router = &mut self.router;
            self.cluster.release(at, |k, (o, offloaded)| {
                router.observe(k, &o);
                router.observe_tiers(k, &offloaded);
            });
            let engines = self.cluster.engines();
            let (k, request, hashes) = route(self.workload, i, at, &self.hasher, router, engines);
            let (blocks, ms) = match &mut self.stores {
                Some(stores) => {
                    let mut events = Vec::new();
                    let len = request.token_ids.len();
                    let found = stores.onboard(k, &engines[k], &hashes, len, &mut events);
                    router.observe_tiers(k, &events);
                    found
                }
                None => (0..0, 0.0),
            };
            if !blocks.is_empty() {
                let o = Onboarding {
                    engine: k,
                    request,
                    arrival_ms: at,
                    blocks,
                };
                self.onboarding.insert(((at + ms).to_bits(), i), o);
                return Ok(());
            }
            (k, request, at, blocks)
        };
        let i = request.id as usize;
        let engine = self.cluster.engine_mut(k);
        if engine
            .submit_onboarded(request, arrival_ms, PromptKv::from_tiers(blocks))
            .is_err()
        {
            self.rejected += 1;
            self.router.rejected(k, i);
            self.samples.push(TurnSample {
                turn: i % self.spec.turns,
                ..TurnSample::default()
            });
            // The conversation goes on, as it does live after a failed request.
            self.follow(i / self.spec.turns, arrival_ms);
        }
        Ok(())
    }
}

/// A conversation workload in simulated time: session `s` sends its first turn at
/// `starts_ms[s]`, and each next turn when the previous one has finished (its last
/// token, or its rejection) plus the think time.
///
/// The mocker's `replay_requests` needs every arrival time before it runs the engines
/// up to it, and here a turn's arrival depends on when its predecessor finishes, so
/// this drives the simulated cluster with its own events: the busy engine furthest
/// behind steps until every engine with work has reached the next known arrival, so
/// that a turn finishing earlier puts its successor ahead in line. Figures are computed as the
/// mocker's replay computes them, plus the per-turn ones from each request's
/// `FinishedRequest`.
pub fn run_sessions(
    workload: &Workload,
    spec: Sessions,
    starts_ms: &[f64],
    config: &EngineConfig,
    workers: usize,
    setup: RouterSetup,
) -> anyhow::Result<Report> {
    run_sessions_with_tiers(workload, spec, starts_ms, config, workers, setup, None)
}

/// As [`run_sessions`], each engine with the sidecar's tiers when `tiers` is given and
/// has one on. A turn then looks up the blocks of its prompt beyond the engine's cached
/// GPU prefix in the engine's store, and if the store holds some, it is queued only
/// after loading them (their real bytes at each tier's bandwidth, on the simulated
/// clock; its TTFT counts from its arrival), with those blocks counted as cached
/// (`Engine::submit_onboarded`). With `kv` routing the router also reads the stores'
/// KV events (each block's tier), as the endpoint picker does. The report's hit rates
/// are then GPU + onboarded tokens over prompt tokens; [`TierStats`] has the rest.
#[allow(clippy::too_many_arguments)]
pub fn run_sessions_with_tiers(
    workload: &Workload,
    spec: Sessions,
    starts_ms: &[f64],
    config: &EngineConfig,
    workers: usize,
    setup: RouterSetup,
    tiers: Option<&TierSetup>,
) -> anyhow::Result<Report> {
    anyhow::ensure!(
        starts_ms.len() == spec.sessions,
        "{} start times for {} sessions",
        starts_ms.len(),
        spec.sessions
    );
    anyhow::ensure!(
        starts_ms.iter().all(|t| t.is_finite() && *t >= 0.0),
        "session start times must be finite and >= 0"
    );
    anyhow::ensure!(workers > 0, "a replay needs at least one engine");
    setup.validate()?;
    let tiers = tiers.filter(|t| t.placement.any());
    let mut config = config.clone();
    if let Some(t) = tiers {
        anyhow::ensure!(t.block_bytes > 0, "a KV block has at least one byte");
        config.kv_blocks = Some(KvBlocksConfig {
            offload: OffloadMode::Evicted,
            ..t.kv.clone()
        });
    }
    let started = Instant::now();
    let tier_blocks = tiers.map_or(0, TierSetup::capacity_blocks);
    let router = KvRouter::new(setup, workers * (config.num_gpu_blocks + tier_blocks));
    let engines = simulated_engines(&config, workers, router.wants_kv_events())?;
    let mut sim = Conversations {
        workload,
        spec,
        hasher: engines[0].hasher().clone(),
        cluster: SimCluster::new(engines),
        stores: tiers.map(|t| Tiers::new(t, workers, router.wants_kv_events())),
        router,
        // Known arrivals: (time, session); a non-negative f64's bits sort as the f64 does.
        ready: starts_ms
            .iter()
            .enumerate()
            .map(|(s, t)| ((t + 0.0).to_bits(), s))
            .collect(),
        onboarding: BTreeMap::new(),
        next_turn: vec![0; spec.sessions],
        samples: Vec::with_capacity(workload.len()),
        collector: Collector::default(),
        rejected: 0,
    };
    sim.run()?;
    let Conversations {
        cluster,
        stores,
        samples,
        collector: c,
        rejected,
        ..
    } = sim;
    let first_ms = starts_ms.iter().copied().fold(f64::INFINITY, f64::min);
    let report = c.report(cluster.engines(), workload.len(), rejected, first_ms);
    let gpu_hit_rate = report.prefix_cache_hit_rate;
    let mut report = Report::from_replay(
        setup.mode.as_str(),
        &report,
        started.elapsed().as_secs_f64(),
    );
    report.turns = turn_stats(&samples);
    if let Some(stores) = stores {
        // Prompt tokens not computed: from the GPU's prefix cache or onboarded.
        let (cached, prompt) = samples
            .iter()
            .filter_map(|s| Some((s.cached_tokens?, s.prompt_tokens?)))
            .fold((0u64, 0u64), |(c, p), (sc, sp)| (c + sc, p + sp));
        report.kv_hit_rate = (prompt > 0).then(|| cached as f64 / prompt as f64);
        report.tiers = Some(TierStats {
            gpu_hit_rate,
            ..stores.stats
        });
    }
    Ok(report)
}

/// A request workload sent by `concurrency` clients in a closed loop, as aiperf's
/// `--concurrency` sends it live (workload B): each client sends the workload's next
/// request as soon as its previous one ends (its last token, or its rejection), so
/// arrivals follow the engines' pace instead of a rate. Like [`run_sessions`], this
/// drives the simulated cluster with its own events, since an arrival depends on an
/// earlier request's end.
pub fn run_closed_loop(
    workload: &Workload,
    concurrency: usize,
    config: &EngineConfig,
    workers: usize,
    setup: RouterSetup,
) -> anyhow::Result<Report> {
    anyhow::ensure!(concurrency > 0, "a closed loop needs at least one client");
    anyhow::ensure!(workers > 0, "a replay needs at least one engine");
    anyhow::ensure!(
        workload.conversations().is_none(),
        "conversations have their own clients (--sessions): no closed loop"
    );
    setup.validate()?;
    let started = Instant::now();
    let router = KvRouter::new(setup, workers * config.num_gpu_blocks);
    let engines = simulated_engines(config, workers, router.wants_kv_events())?;
    let mut sim = ClosedLoop {
        workload,
        concurrency,
        hasher: engines[0].hasher().clone(),
        cluster: SimCluster::new(engines),
        router,
        free: (0..concurrency.min(workload.len()))
            .map(|client| (0.0_f64.to_bits(), client))
            .collect(),
        next: 0,
        collector: Collector::default(),
        rejected: 0,
    };
    sim.run()?;
    let report = sim
        .collector
        .report(sim.cluster.engines(), workload.len(), sim.rejected, 0.0);
    Ok(Report::from_replay(
        setup.mode.as_str(),
        &report,
        started.elapsed().as_secs_f64(),
    ))
}

/// [`run_closed_loop`] as a driver of the simulated cluster: the events are clients
/// becoming free to send.
struct ClosedLoop<'a> {
    cluster: SimCluster,
    workload: &'a Workload,
    concurrency: usize,
    hasher: BlockHasher,
    router: KvRouter,
    /// When a client is free to send: (time bits, key), the key its start number or,
    /// past `concurrency`, the request that just ended; a non-negative f64's bits sort
    /// as the f64 does.
    free: BTreeSet<(u64, usize)>,
    /// The workload's next request.
    next: usize,
    collector: Collector,
    rejected: usize,
}

impl Driver for ClosedLoop<'_> {
    type Shown = StepOutcome;
    type Error = anyhow::Error;

    fn cluster(&mut self) -> &mut SimCluster {
        &mut self.cluster
    }

    fn next_event_ms(&self) -> Option<f64> {
        let next = self.free.first();
        Some(next.map_or(f64::INFINITY, |&(t, _)| f64::from_bits(t)))
    }

    fn stepped(&mut self, _: usize, o: StepOutcome) -> anyhow::Result<StepOutcome> {
        self.collector.take(&o);
        // An end frees its client.
        for f in &o.finished {
            let key = self.concurrency + f.id as usize;
            self.free.insert((f.finished_ms.to_bits(), key));
        }
        Ok(o)
    }

    fn event(&mut self, at: f64) -> anyhow::Result<()> {
        let (bits, _) = self.free.pop_first().expect("an event is due");
        if self.next == self.workload.len() {
            return Ok(());
        }
        let i = self.next;
        self.next += 1;
        let router = &mut self.router;
        self.cluster.release(at, |k, o| router.observe(k, &o));
        let engines = self.cluster.engines();
        let (k, request, _) = route(self.workload, i, at, &self.hasher, router, engines);
        if self.cluster.engine_mut(k).submit_at(request, at).is_err() {
            self.rejected += 1;
            self.router.rejected(k, i);
            // The client goes on to its next request, as it does live after an error.
            self.free.insert((bits, self.concurrency + i));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use dynamo_kvblocks::placement::TierLimits;
    use dynamo_loadgen::arrivals;
    use dynamo_loadgen::workload::SharedPrefix;

    /// 4 engines too small to hold every prefix: 16 prefixes of 8 blocks (128 blocks in
    /// all), 64 blocks per engine.
    pub(crate) fn small_pressure() -> (Workload, Vec<f64>, EngineConfig) {
        small_pressure_seeded(1)
    }

    /// 128 short prompts of 16 prefixes at 40 req/s over pools of 64 blocks; `seed` draws
    /// the prompts, `seed + 1` the arrivals.
    fn small_pressure_seeded(seed: u64) -> (Workload, Vec<f64>, EngineConfig) {
        let w = Workload::shared_prefix(SharedPrefix {
            prefixes: 16,
            suffixes: 8,
            prefix_tokens: 128,
            unique_tokens: 16,
            output_tokens: 8,
            seed,
        })
        .unwrap();
        let at = arrivals::poisson(w.len(), 40.0, seed + 1);
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
    fn a_closed_loop_keeps_as_many_requests_in_flight_as_it_has_clients() {
        let (w, _, engine) = small_pressure();
        for clients in [1, 6] {
            let r = run_closed_loop(&w, clients, &engine, 2, setup(RouterMode::Kv)).unwrap();
            assert_eq!((r.completed, r.errors), (w.len(), 0));
            // Little's law: requests in flight on average = throughput x mean latency.
            // Every client has one in flight from the start until the last ones drain.
            let in_flight = r.requests_per_s * r.e2e_ms.mean / 1000.0;
            let c = clients as f64;
            assert!(
                in_flight <= c + 1e-9 && in_flight > 0.9 * c,
                "{clients} clients kept {in_flight:.2} requests in flight"
            );
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
        // Over several draws of prompts and arrivals: one run of 128 requests puts a
        // p50 within a few ms either way.
        let (mut kv_hits, mut rr_hits, mut kv_p50, mut rr_p50) = (0.0, 0.0, 0.0, 0.0);
        for seed in (1..=15).step_by(2) {
            let (w, at, engine) = small_pressure_seeded(seed);
            let kv = run(&w, &at, &engine, 4, setup(RouterMode::Kv)).unwrap();
            let rr = run(&w, &at, &engine, 4, setup(RouterMode::RoundRobin)).unwrap();
            kv_hits += kv.kv_hit_rate.unwrap();
            rr_hits += rr.kv_hit_rate.unwrap();
            kv_p50 += kv.ttft_ms.p50;
            rr_p50 += rr.ttft_ms.p50;
        }
        assert!(
            kv_hits > 1.4 * rr_hits,
            "hits: kv {kv_hits} vs round-robin {rr_hits}"
        );
        assert!(
            kv_p50 < rr_p50,
            "TTFT p50 sums: kv {kv_p50} vs round-robin {rr_p50}"
        );
    }

    fn conversations(sessions: usize, think_time_ms: f64) -> Workload {
        Workload::sessions(Sessions {
            sessions,
            turns: 4,
            system_tokens: 32,
            session_prefix_tokens: 100,
            turn_tokens: 40,
            output_tokens: 8,
            think_time_ms,
            seed: 7,
        })
        .unwrap()
    }

    #[test]
    fn conversation_turns_reuse_the_previous_prompt_in_simulated_time() {
        let w = conversations(6, 0.0);
        let engine = EngineConfig {
            block_size: 16,
            ..EngineConfig::default()
        };
        for mode in [RouterMode::Kv, RouterMode::RoundRobin] {
            let r = run(&w, &[0.0; 6], &engine, 1, setup(mode)).unwrap();
            assert_eq!((r.requests, r.completed, r.errors), (24, 24, 0), "{mode}");
            assert_eq!(r.output_tokens, 24 * 8);
            let counts: Vec<usize> = r.turns.iter().map(|t| t.requests).collect();
            assert_eq!(counts, [6, 6, 6, 6, 18]);
            assert!(r.turns.iter().all(|t| t.errors == 0));
            // One engine with room for everything: the 6 first turns (132 tokens) are
            // prefilled in the same step, where the 5 scheduled after the first share
            // its 2 blocks of system prompt; turn k+1 finds every full block of turn k's
            // prompt (132, 180, 228 tokens) and no more.
            let hit = |t: usize| r.turns[t].kv_hit_rate.unwrap();
            assert_eq!(hit(0), 5.0 * 32.0 / (6.0 * 132.0));
            assert_eq!(hit(1), 128.0 / 180.0);
            assert_eq!(hit(2), 176.0 / 228.0);
            assert_eq!(hit(3), 224.0 / 276.0);
            assert!(r.later_turns().unwrap().ttft_ms.p50 <= r.first_turn().unwrap().ttft_ms.p50);
        }
        // Four engines: kv routing keeps each conversation where its prefix is.
        let kv = run(&w, &[0.0; 6], &engine, 4, setup(RouterMode::Kv)).unwrap();
        let rr = run(&w, &[0.0; 6], &engine, 4, setup(RouterMode::RoundRobin)).unwrap();
        let later = |r: &Report| r.later_turns().unwrap().kv_hit_rate.unwrap();
        assert!(
            later(&kv) > 0.7 && later(&kv) > 1.5 * later(&rr),
            "{kv:?}\n{rr:?}"
        );
        let again = run(&w, &[0.0; 6], &engine, 4, setup(RouterMode::Kv)).unwrap();
        assert_eq!(
            (kv.turns, kv.ttft_ms, kv.duration_s),
            (again.turns, again.ttft_ms, again.duration_s)
        );
        assert!(run(&w, &[0.0; 5], &engine, 4, setup(RouterMode::Kv)).is_err());
    }

    #[test]
    fn think_time_separates_turns_and_sessions_start_when_told() {
        let engine = EngineConfig {
            block_size: 16,
            ..EngineConfig::default()
        };
        // One session, 4 turns, 1 s of thinking between them: 3 s plus 4 answers.
        let r = run(
            &conversations(1, 1000.0),
            &[0.0],
            &engine,
            1,
            setup(RouterMode::Kv),
        )
        .unwrap();
        assert_eq!(r.completed, 4);
        let answers = r.e2e_ms.mean * 4.0;
        assert!(answers < 1000.0, "{r:?}");
        assert!(
            (r.duration_s * 1000.0 - (3000.0 + answers)).abs() < 1e-6,
            "{} vs {}",
            r.duration_s,
            answers
        );
        // Two sessions, the second starting 10 s later: it ends 13 s and its 4 answers
        // (well under 1 s) after the first started.
        let r = run(
            &conversations(2, 1000.0),
            &[0.0, 10_000.0],
            &engine,
            1,
            setup(RouterMode::Kv),
        )
        .unwrap();
        assert_eq!((r.completed, r.ttft_ms.count), (8, 8));
        assert!((13.0..14.0).contains(&r.duration_s), "{r:?}");
    }

    /// Qwen2.5-0.5B's KV of a 16-token block.
    const BLOCK_BYTES: u64 = 2 * 24 * 2 * 64 * 2 * 16;

    fn tiers(host: Option<u64>, disk: Option<u64>) -> TierSetup {
        let limits = |b: Option<u64>, min_reuse| {
            b.map(|capacity_bytes| TierLimits {
                capacity_bytes,
                min_reuse,
            })
        };
        TierSetup::new(
            PlacementConfig {
                host: limits(host, 1),
                disk: limits(disk, 1),
                object: None,
            },
            BLOCK_BYTES,
        )
    }

    /// 6 conversations of 3 turns (2,048-token first prompts, 162 blocks by turn 3: 972
    /// in all) started 100 ms apart, with 500 ms of thinking, on one engine of 400
    /// blocks: a conversation's blocks are mostly evicted by the others before its
    /// next turn.
    fn tight() -> (Workload, Vec<f64>, EngineConfig) {
        let w = Workload::sessions(Sessions {
            sessions: 6,
            turns: 3,
            system_tokens: 0,
            session_prefix_tokens: 2048,
            turn_tokens: 256,
            output_tokens: 4,
            think_time_ms: 500.0,
            seed: 5,
        })
        .unwrap();
        let starts: Vec<f64> = (0..6).map(|s| f64::from(s) * 100.0).collect();
        let engine = EngineConfig {
            num_gpu_blocks: 400,
            block_size: 16,
            ..EngineConfig::default()
        };
        (w, starts, engine)
    }

    fn tiered(tiers: Option<&TierSetup>) -> Report {
        let (w, starts, engine) = tight();
        let mut r = run_with_tiers(&w, &starts, &engine, 1, setup(RouterMode::Kv), tiers).unwrap();
        r.replay.as_mut().unwrap().wall_s = 0.0;
        r
    }

    #[test]
    fn a_host_tier_serves_later_turns_the_gpu_pool_lost() {
        let off = tiered(None);
        let host = tiered(Some(&tiers(Some(256 << 20), None)));
        assert_eq!((off.completed, host.completed), (18, 18));
        assert!(off.tiers.is_none());
        let t = host.tiers.unwrap();
        assert!(t.onboarded_blocks.host > 50, "{t:?}");
        assert_eq!((t.onboarded_blocks.disk, t.onboarded_blocks.object), (0, 0));
        assert!(t.offloaded_blocks > 0 && t.refused_blocks == 0, "{t:?}");
        // Onboarded tokens count as cached: far more of the later prompts than the GPU
        // alone kept.
        let later = |r: &Report| r.later_turns().unwrap().clone();
        let (l_off, l_host) = (later(&off), later(&host));
        assert!(
            l_host.kv_hit_rate.unwrap() > 0.7 && l_off.kv_hit_rate.unwrap() < 0.5,
            "{l_off:?}\n{l_host:?}"
        );
        assert!(t.gpu_hit_rate < host.kv_hit_rate.unwrap());
        assert!(
            l_host.ttft_ms.p50 < 0.8 * l_off.ttft_ms.p50,
            "{l_off:?}\n{l_host:?}"
        );
        // Turn 1 finds nothing anywhere either way.
        assert_eq!(host.turns[0], off.turns[0]);
    }

    #[test]
    fn blocks_come_back_from_disk_slower_than_from_host_memory() {
        // One tier, the same size, either host memory or disk: the same blocks are held
        // and served, a 192 KiB block taking 28 us from disk (7 GB/s), 1 us from host
        // memory (200 GB/s).
        let host = tiered(Some(&tiers(Some(256 << 20), None)));
        let disk = tiered(Some(&tiers(None, Some(256 << 20))));
        let (h, d) = (host.tiers.unwrap(), disk.tiers.unwrap());
        assert!(
            d.onboarded_blocks.disk > 50 && d.onboarded_blocks.host == 0,
            "{d:?}"
        );
        assert!(disk.ttft_ms.mean > host.ttft_ms.mean, "{host:?}\n{disk:?}");
        assert!(h.onboarded_blocks.host > 0);
        // Loading is on the simulated clock: at 10 MB/s a block takes 19.7 ms, and a
        // second turn that finds its first turn's 128 blocks on disk only (the engine,
        // idle meanwhile, keeps more on the GPU: fewer turns load) is queued 2.5 s after
        // it arrived.
        let mut slow = tiers(None, Some(256 << 20));
        slow.kv.disk_bandwidth_gbps = 0.01;
        let slow = tiered(Some(&slow));
        assert!(slow.tiers.unwrap().onboarded_requests > 0);
        let worst = slow.turns[1].ttft_ms.p99;
        assert!(
            (2516.0..2516.0 + 100.0).contains(&worst),
            "{:?}",
            slow.turns[1]
        );
        // A host tier of about half the working set demotes what it evicts to disk
        // (min reuse 1 here), and later turns are served from both.
        let both = tiered(Some(&tiers(Some(500 * BLOCK_BYTES), Some(256 << 20))));
        let b = both.tiers.unwrap();
        assert!(
            b.onboarded_blocks.host > 0 && b.onboarded_blocks.disk > 0,
            "{b:?}"
        );
    }

    #[test]
    fn a_tier_too_small_for_a_block_changes_nothing() {
        let off = tiered(None);
        let tiny = tiered(Some(&tiers(Some(BLOCK_BYTES - 1), None)));
        let t = tiny.tiers.unwrap();
        assert_eq!((t.onboarded_blocks.total(), t.offloaded_blocks), (0, 0));
        assert!(t.refused_blocks > 0, "{t:?}");
        assert_eq!(
            Report {
                tiers: None,
                ..tiny
            },
            off
        );
        // And a config with every tier off is no tiers at all.
        let none = tiered(Some(&tiers(None, None)));
        assert_eq!(none, off);
    }

    #[test]
    fn tiered_replays_are_deterministic() {
        let two_tiers = tiers(Some(500 * BLOCK_BYTES), Some(256 << 20));
        let (w, starts, engine) = tight();
        assert_eq!(tiered(Some(&two_tiers)), tiered(Some(&two_tiers)));
        // Four engines with kv routing reading the tiers' events, and round-robin; each
        // GPU pool holds one conversation (about 180 blocks), so two on one engine evict.
        let small = EngineConfig {
            num_gpu_blocks: 200,
            ..engine
        };
        for mode in [RouterMode::Kv, RouterMode::RoundRobin] {
            let four = || {
                let mut r =
                    run_with_tiers(&w, &starts, &small, 4, setup(mode), Some(&two_tiers)).unwrap();
                r.replay.as_mut().unwrap().wall_s = 0.0;
                r
            };
            let r = four();
            assert!(r.tiers.unwrap().onboarded_blocks.total() > 0, "{mode}");
            assert_eq!(r, four(), "{mode}");
        }
        // Tiers are for conversations only.
        let (plain, at, engine) = small_pressure();
        let kv = setup(RouterMode::Kv);
        assert!(run_with_tiers(&plain, &at, &engine, 1, kv, Some(&two_tiers)).is_err());
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
