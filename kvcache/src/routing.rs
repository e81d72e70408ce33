//! The routing step, once: the overlap a pick credits, the scheduler of each side, the
//! approximate index and the load accounting. The endpoint picker, the simulated-time
//! replay and the benchmarks all route through [`RoutingCore`], so a replay measures
//! exactly what the picker does.
//!
//! The exact KV index stays outside: the picker keeps it behind its own lock (events
//! apply to it without the routing state, and a lookup runs before the routing state is
//! locked), so [`RoutingCore::overlap`] asks the caller for its matches.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::approx::{ApproxConfig, ApproxIndex};
use crate::hash::SeqHash;
use crate::load::{EngineMetrics, LoadError, LoadTracker, RequestId};
use crate::overlap::OverlapScores;
use crate::scheduler::{Decision, RouterMode, ScheduleError, Scheduler, SchedulerConfig};
use crate::worker::WorkerId;

/// What a pick is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// An engine that prefills and decodes the request.
    Aggregated,
    /// The prefill engine of a disaggregated request: KV overlap and prefill load.
    Prefill,
    /// The decode engine of a disaggregated request: decode load alone (no overlap
    /// credit, no prefill work), since the prompt's KV arrives from the prefill engine
    /// whatever the decode engine holds (Dynamo's PrefillRouter).
    Decode,
}

/// Where [`RoutingCore::pick_route`] sends a request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Route {
    /// The engine that decodes it (and prefills it too, without a prefill pick).
    pub serving: Decision,
    /// Its prefill engine, in a disaggregated pool.
    pub prefill: Option<Decision>,
}

/// Schedulers, approximate index and load of one router.
#[derive(Debug)]
pub struct RoutingCore {
    mode: RouterMode,
    scheduler: Scheduler,
    /// Prefill picks have a scheduler of their own, so the round-robin positions of the
    /// two roles do not interfere.
    prefill_scheduler: Scheduler,
    approx: ApproxIndex,
    load: LoadTracker,
    rng: StdRng,
}

impl RoutingCore {
    /// `seed` drives `random` mode and softmax sampling (a temperature above 0).
    pub fn new(
        mode: RouterMode,
        scheduler: SchedulerConfig,
        approx: ApproxConfig,
        seed: u64,
    ) -> Self {
        Self {
            mode,
            scheduler: Scheduler::new(mode, scheduler),
            prefill_scheduler: Scheduler::new(mode, scheduler),
            approx: ApproxIndex::new(approx),
            load: LoadTracker::new(),
            rng: StdRng::seed_from_u64(seed),
        }
    }

    pub fn mode(&self) -> RouterMode {
        self.mode
    }

    /// The load accounting (per-worker blocks in flight, scraped gauges, saturation).
    pub fn load(&self) -> &LoadTracker {
        &self.load
    }

    /// The overlap a pick for `side` credits `prompt` with: none for a decode pick;
    /// otherwise the exact index's matches (`exact`, called in `kv` mode only), the
    /// approximate index's at `now`, or none (round-robin, random).
    pub fn overlap(
        &self,
        side: Side,
        prompt: &[SeqHash],
        now: Duration,
        exact: impl FnOnce(&[SeqHash]) -> OverlapScores,
    ) -> OverlapScores {
        if side == Side::Decode {
            return OverlapScores::default();
        }
        match self.mode {
            RouterMode::Kv => exact(prompt),
            RouterMode::Approx => self.approx.find_matches(prompt, now),
            RouterMode::RoundRobin | RouterMode::Random => OverlapScores::default(),
        }
    }

    /// Picks one of `candidates` for `side` with `scores` (from [`Self::overlap`]) and
    /// accounts `request` (unique while in flight) on it: the prompt's blocks, of which
    /// those not credited as cached are prefill work (none on a decode engine). The
    /// approximate index learns where the prompt's KV now lives.
    pub fn pick(
        &mut self,
        side: Side,
        scores: &OverlapScores,
        candidates: &[WorkerId],
        request: RequestId,
        prompt: &[SeqHash],
        now: Duration,
    ) -> Result<Decision, PickError> {
        let prompt_blocks = prompt.len() as u64;
        let loads: Vec<_> = candidates
            .iter()
            .map(|&w| {
                let mut load = self.load.potential(w, prompt);
                if side == Side::Decode {
                    // No overlap credit on a decode engine (above), shared prefix included.
                    load.shared_prefix_blocks = 0;
                }
                load
            })
            .collect();
        let scheduler = match side {
            Side::Prefill => &mut self.prefill_scheduler,
            Side::Aggregated | Side::Decode => &mut self.scheduler,
        };
        let decision = scheduler.pick(scores, &loads, prompt_blocks, &mut self.rng)?;
        // What the cost counted as cached is not prefill work (DESIGN.md, "Scheduling").
        let cached = (decision.credited_overlap.floor() as u64).min(prompt_blocks);
        let new_blocks = match side {
            Side::Decode => 0,
            Side::Aggregated | Side::Prefill => prompt_blocks - cached,
        };
        self.load
            .on_pick(request, decision.worker, prompt, new_blocks)?;
        if self.mode == RouterMode::Approx && side != Side::Decode {
            self.approx.record(decision.worker, prompt, now);
        }
        Ok(decision)
    }

    /// Picks where a request runs and accounts it, as Dynamo's PrefillRouter does. With
    /// `prefill` (the pool's prefill engines and the id of the prefill leg) there are
    /// two legs: a prefill engine by KV overlap (`scores`) and prefill load, then a
    /// decode engine among `serving` by decode load alone, since the prompt's KV arrives
    /// from the prefill engine whatever the decode engine holds. Without, one aggregated
    /// pick among `serving`, also when the prompt fills no block: there is nothing to
    /// transfer, so the serving engine prefills it. `request` is accounted on the serving
    /// engine.
    pub fn pick_route(
        &mut self,
        scores: &OverlapScores,
        serving: &[WorkerId],
        request: RequestId,
        prefill: Option<(&[WorkerId], RequestId)>,
        prompt: &[SeqHash],
        now: Duration,
    ) -> Result<Route, PickError> {
        let Some((prefill_engines, prefill_request)) = prefill.filter(|_| !prompt.is_empty())
        else {
            let serving = self.pick(Side::Aggregated, scores, serving, request, prompt, now)?;
            return Ok(Route {
                serving,
                prefill: None,
            });
        };
        let prefill = self.pick(
            Side::Prefill,
            scores,
            prefill_engines,
            prefill_request,
            prompt,
            now,
        )?;
        // A decode pick credits no overlap (`Self::overlap`).
        let none = OverlapScores::default();
        let serving = self.pick(Side::Decode, &none, serving, request, prompt, now)?;
        Ok(Route {
            serving,
            prefill: Some(prefill),
        })
    }

    /// `request` (just picked) is expected to hold `blocks` output blocks on average while
    /// it decodes ([`LoadTracker::expect_output`]).
    pub fn expect_output(&mut self, request: RequestId, blocks: u64) {
        let _ = self.load.expect_output(request, blocks);
    }

    /// `request` streamed its first token: its prefill load becomes decode load. Unknown
    /// requests (their worker was removed meanwhile) are ignored.
    pub fn first_token(&mut self, request: RequestId) {
        let _ = self.load.on_first_token(request);
    }

    /// `request` finished, failed or was refused: it no longer loads its worker.
    pub fn finished(&mut self, request: RequestId) {
        let _ = self.load.on_finish(request);
    }

    pub fn add_worker(&mut self, worker: WorkerId) {
        self.load.add_worker(worker);
    }

    /// `worker` is gone: its load and its approximate blocks go with it.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.load.remove_worker(worker);
        self.approx.remove_worker(worker);
    }

    /// A worker's scraped gauges (for saturation and KV usage).
    pub fn observe_metrics(&mut self, worker: WorkerId, metrics: EngineMetrics) {
        self.load.observe_metrics(worker, metrics);
    }
}

/// Why a pick failed.
#[derive(Debug, thiserror::Error)]
pub enum PickError {
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// The caller reused a request id still in flight.
    #[error(transparent)]
    Load(#[from] LoadError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Tier;
    use crate::overlap::TierCounts;

    fn core(mode: RouterMode) -> RoutingCore {
        let mut c = RoutingCore::new(mode, SchedulerConfig::default(), ApproxConfig::default(), 1);
        for w in 0..2 {
            c.add_worker(WorkerId(w));
        }
        c
    }

    fn prompt(n: u64) -> Vec<SeqHash> {
        (0..n).map(SeqHash).collect()
    }

    fn held(worker: u64, gpu: u32, host: u32) -> OverlapScores {
        let mut counts = TierCounts::default();
        counts.add(Tier::Gpu, gpu);
        counts.add(Tier::Host, host);
        OverlapScores::from_entries(vec![(WorkerId(worker), counts)])
    }

    #[test]
    fn a_pick_accounts_uncredited_blocks_as_prefill_work_and_decode_picks_none() {
        let mut c = core(RouterMode::Kv);
        let p = prompt(10);
        let workers = [WorkerId(0), WorkerId(1)];
        // 4 blocks on GPU (credit 1.0) and 4 on host (0.75): 7 credited, 3 to prefill.
        let scores = c.overlap(Side::Aggregated, &p, Duration::ZERO, |_| held(1, 4, 4));
        let d = c
            .pick(
                Side::Aggregated,
                &scores,
                &workers,
                RequestId(1),
                &p,
                Duration::ZERO,
            )
            .unwrap();
        assert_eq!(d.worker, WorkerId(1));
        assert_eq!(c.load().load(WorkerId(1)).prefill_blocks, 3);
        let none = c.overlap(Side::Decode, &p, Duration::ZERO, |_| panic!("not asked"));
        assert!(none.is_empty());
        let d = c
            .pick(
                Side::Decode,
                &none,
                &workers,
                RequestId(2),
                &p,
                Duration::ZERO,
            )
            .unwrap();
        assert_eq!(
            c.load().load(d.worker).prefill_blocks,
            if d.worker == WorkerId(1) { 3 } else { 0 }
        );
        c.first_token(RequestId(1));
        c.finished(RequestId(1));
        c.finished(RequestId(2));
        assert_eq!(c.load().in_flight(), 0);
        assert!(matches!(
            c.pick(
                Side::Aggregated,
                &scores,
                &[],
                RequestId(3),
                &p,
                Duration::ZERO
            ),
            Err(PickError::Schedule(ScheduleError::NoWorkers))
        ));
    }

    #[test]
    fn a_route_has_a_prefill_leg_by_overlap_and_a_decode_leg_by_load_alone() {
        let mut c = core(RouterMode::Kv);
        c.add_worker(WorkerId(2));
        let p = prompt(10);
        let t = Duration::ZERO;
        // Engine 2 holds the prompt and decodes a short request: its cache would outweigh
        // that load, but earns nothing on a decode pick.
        let none = OverlapScores::default();
        let short: Vec<SeqHash> = (100..102).map(SeqHash).collect();
        c.pick(
            Side::Aggregated,
            &none,
            &[WorkerId(2)],
            RequestId(9),
            &short,
            t,
        )
        .unwrap();
        c.first_token(RequestId(9));
        let scores = c.overlap(Side::Prefill, &p, t, |_| held(2, 10, 0));
        let (decode, prefill) = ([WorkerId(1), WorkerId(2)], [WorkerId(0)]);
        let r = c
            .pick_route(
                &scores,
                &decode,
                RequestId(1),
                Some((&prefill, RequestId(2))),
                &p,
                t,
            )
            .unwrap();
        let legs = (r.prefill.map(|d| d.worker), r.serving.worker);
        assert_eq!(legs, (Some(WorkerId(0)), WorkerId(1)));
        assert_eq!(r.serving.credited_overlap, 0.0);
        assert_eq!(c.load().load(WorkerId(0)).prefill_blocks, 10);
        assert_eq!(c.load().load(WorkerId(1)).prefill_blocks, 0);
        // Without prefill engines, one aggregated pick: the overlap counts.
        let r = c
            .pick_route(
                &scores,
                &[WorkerId(0), WorkerId(2)],
                RequestId(3),
                None,
                &p,
                t,
            )
            .unwrap();
        assert_eq!((r.prefill, r.serving.worker), (None, WorkerId(2)));
        assert_eq!(r.serving.credited_overlap, 10.0);
    }

    #[test]
    fn a_prefix_in_flight_on_a_pod_counts_as_cached_there_before_the_index_knows() {
        let mut c = core(RouterMode::Kv);
        let (w0, w1) = (WorkerId(0), WorkerId(1));
        let with_prefix = |tail: u64| [prompt(8), vec![SeqHash(tail), SeqHash(tail + 1)]].concat();
        let other = |first: u64| (first..first + 10).map(SeqHash).collect::<Vec<_>>();
        let none = OverlapScores::default();
        // Pod 0 decodes a request of the prefix and an unrelated one; pod 1 one unrelated.
        for (id, worker, p) in [
            (1, w0, with_prefix(100)),
            (2, w0, other(200)),
            (3, w1, other(300)),
        ] {
            c.pick(
                Side::Aggregated,
                &none,
                &[worker],
                RequestId(id),
                &p,
                Duration::ZERO,
            )
            .unwrap();
            c.first_token(RequestId(id));
        }
        // The index has heard nothing yet. Pod 0 shares the 8-block prefix: 2 blocks to
        // prefill, 2 more held: 2 * 2 + 22 = 26, against pod 1's 2 * 10 + 20 = 40 (it would
        // be 2 * 10 + 22 = 42 without the shared prefix).
        let d = c
            .pick(
                Side::Aggregated,
                &none,
                &[w0, w1],
                RequestId(4),
                &with_prefix(400),
                Duration::ZERO,
            )
            .unwrap();
        assert_eq!((d.worker, d.cost, d.credited_overlap), (w0, 26.0, 8.0));
        assert_eq!(c.load().load(w0).prefill_blocks, 2);
        // A decode engine gets no overlap credit, a shared prefix included.
        let d = c
            .pick(
                Side::Decode,
                &none,
                &[w0],
                RequestId(5),
                &with_prefix(500),
                Duration::ZERO,
            )
            .unwrap();
        assert_eq!(d.credited_overlap, 0.0);
    }

    #[test]
    fn the_approximate_index_learns_from_prefill_picks_only() {
        let mut c = core(RouterMode::Approx);
        let p = prompt(4);
        let now = Duration::from_secs(1);
        let d = c
            .pick(
                Side::Decode,
                &OverlapScores::default(),
                &[WorkerId(0)],
                RequestId(1),
                &p,
                now,
            )
            .unwrap();
        assert_eq!(d.worker, WorkerId(0));
        let seen = c.overlap(Side::Prefill, &p, now, |_| panic!("approx mode"));
        assert!(seen.is_empty(), "a decode engine's KV is never credited");
        c.pick(Side::Prefill, &seen, &[WorkerId(1)], RequestId(2), &p, now)
            .unwrap();
        let seen = c.overlap(Side::Prefill, &p, now, |_| panic!("approx mode"));
        assert_eq!(seen.get(WorkerId(1)).total(), 4);
        c.remove_worker(WorkerId(1));
        assert!(
            c.overlap(Side::Prefill, &p, now, |_| unreachable!())
                .is_empty()
        );
    }
}
