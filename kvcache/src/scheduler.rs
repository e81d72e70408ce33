//! Picks a pod for a request: a pure function of overlap, load, config and a random source.
//!
//! cost(pod) = prefill_load_scale * max(prefill blocks in flight + prompt blocks
//!             - credited overlap, 0) + decode blocks in flight,
//! credited overlap = sum over tiers of matched blocks * tier credit
//! (`DESIGN.md`, "Scheduling (EPP)"). The first term is the prefill work the pod would
//! have queued if it took the request, the second the memory pressure it is under.
//!
//! Temperature 0 takes the cheapest pod; ties go to the lower load (prefill + decode
//! blocks in flight), then to a pod drawn uniformly from those still tied (as Dynamo's
//! KV router does): a fixed order would pile every cold prompt of an idle pool onto one
//! pod, while a draw spreads them; a seeded random source makes it repeatable. Above 0, costs are normalised to [0, 1] (0 = cheapest) and a pod is drawn with
//! probability proportional to exp(-normalised cost / temperature).

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::{OverlapScores, TierCounts, TierCredits, WorkerId, WorkerLoad};

/// How the router chooses a pod (the EPP's `--router-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouterMode {
    /// Cost with overlap from the exact, event-fed index.
    #[default]
    Kv,
    /// Cost with overlap from the approximate index of past decisions.
    Approx,
    /// Each pod in turn, by worker id, ignoring overlap and load.
    RoundRobin,
    /// A uniformly random pod.
    Random,
}

impl RouterMode {
    pub const ALL: [RouterMode; 4] = [Self::Kv, Self::Approx, Self::RoundRobin, Self::Random];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Kv => "kv",
            Self::Approx => "approx",
            Self::RoundRobin => "round-robin",
            Self::Random => "random",
        }
    }
}

impl fmt::Display for RouterMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A router mode name that is none of `kv`, `approx`, `round-robin`, `random`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown router mode {0:?}: expected kv, approx, round-robin or random")]
pub struct UnknownRouterMode(pub String);

impl FromStr for RouterMode {
    type Err = UnknownRouterMode;

    /// Case-insensitive; `round_robin` and `roundrobin` are accepted too.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let normal = s.to_ascii_lowercase().replace('_', "-");
        match normal.as_str() {
            "roundrobin" => Ok(Self::RoundRobin),
            other => Self::ALL
                .into_iter()
                .find(|m| m.as_str() == other)
                .ok_or_else(|| UnknownRouterMode(s.to_owned())),
        }
    }
}

/// The default weight of prefill work against decode load (the picker's
/// `--overlap-score-weight`, the replay's `--prefill-load-scale`). Dynamo's default is 1;
/// at 1 a pod caching a request's prefix loses it to a colder pod that runs one request
/// fewer, as the prefix's credit (32 blocks of workload B's 36) is smaller than that
/// request's blocks. At 2, workload B live gave 71.5% hits against Dynamo's 61.2% and TTFT
/// p50 0.75x (58.6% and 0.85x at 1); the replays gain hits and TTFT p90 in the closed
/// loop, the open loop at 4-16 req/s and Mooncake at 1x and 4x
/// (`docs/performance-routing.md`, "The prefill weight"). 3 gains more hits but costs TTFT
/// p50 at light load.
pub const DEFAULT_PREFILL_LOAD_SCALE: f64 = 2.0;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchedulerConfig {
    /// Weight of prefill work against decode load (1.0: a block is a block).
    pub prefill_load_scale: f64,
    /// 0: always the cheapest pod; higher: more spread.
    pub temperature: f64,
    pub tier_credits: TierCredits,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            prefill_load_scale: DEFAULT_PREFILL_LOAD_SCALE,
            temperature: 0.0,
            tier_credits: TierCredits::default(),
        }
    }
}

/// The chosen pod and the numbers behind the choice, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub worker: WorkerId,
    /// The pod's matched prefix of the prompt, per tier.
    pub overlap: TierCounts,
    pub credited_overlap: f64,
    pub cost: f64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    #[error("no worker to choose from")]
    NoWorkers,
    #[error("temperature must be finite and >= 0, got {0}")]
    InvalidTemperature(f64),
}

/// Credited overlap and cost of sending a `prompt_blocks`-block prompt to a pod.
pub fn cost(
    load: &WorkerLoad,
    overlap: TierCounts,
    prompt_blocks: u64,
    config: &SchedulerConfig,
) -> (f64, f64) {
    // A prefix that requests in flight on the pod hold is shared there like a cached one
    // (on the GPU, full credit), whether or not the index has heard of it yet. The overlap
    // comes from this very prompt, so it cannot exceed it.
    let credited = overlap
        .credited(&config.tier_credits)
        .max(load.shared_prefix_blocks as f64)
        .min(prompt_blocks as f64);
    let prefill = (load.prefill_blocks as f64 + prompt_blocks as f64 - credited).max(0.0);
    (
        credited,
        config.prefill_load_scale * prefill + load.decode_blocks as f64,
    )
}

fn decision(
    load: &WorkerLoad,
    scores: &OverlapScores,
    prompt_blocks: u64,
    config: &SchedulerConfig,
) -> Decision {
    let overlap = scores.get(load.worker);
    let (credited_overlap, cost) = cost(load, overlap, prompt_blocks, config);
    Decision {
        worker: load.worker,
        overlap,
        credited_overlap,
        cost,
    }
}

/// Chooses among `candidates` by cost (modes `kv` and `approx`).
pub fn pick_by_cost<R: Rng + ?Sized>(
    scores: &OverlapScores,
    candidates: &[WorkerLoad],
    prompt_blocks: u64,
    config: &SchedulerConfig,
    rng: &mut R,
) -> Result<Decision, ScheduleError> {
    let t = config.temperature;
    if !t.is_finite() || t < 0.0 {
        return Err(ScheduleError::InvalidTemperature(t));
    }
    let mut options: Vec<(Decision, u64)> = candidates
        .iter()
        .map(|l| (decision(l, scores, prompt_blocks, config), l.total()))
        .collect();
    // Worker order, not the caller's, decides sampling, so a seed replays the same pick.
    options.sort_by_key(|(d, _)| d.worker);
    options.dedup_by_key(|(d, _)| d.worker);
    let best = options
        .iter()
        .min_by(|(a, la), (b, lb)| a.cost.total_cmp(&b.cost).then(la.cmp(lb)))
        .map(|(d, load)| (d.cost, *load))
        .ok_or(ScheduleError::NoWorkers)?;
    if t == 0.0 {
        let tied: Vec<Decision> = options
            .iter()
            .filter(|(d, load)| d.cost == best.0 && *load == best.1)
            .map(|(d, _)| *d)
            .collect();
        return Ok(tied[rng.random_range(0..tied.len())]);
    }
    let cheapest = best.0;
    let max = options.iter().map(|(d, _)| d.cost).fold(f64::MIN, f64::max);
    let span = max - cheapest;
    if span <= 0.0 {
        let i = rng.random_range(0..options.len());
        return Ok(options[i].0);
    }
    let weights: Vec<f64> = options
        .iter()
        .map(|(d, _)| (-((d.cost - cheapest) / span) / t).exp())
        .collect();
    let mut draw = rng.random::<f64>() * weights.iter().sum::<f64>();
    for ((d, _), w) in options.iter().zip(&weights) {
        if draw < *w {
            return Ok(*d);
        }
        draw -= w;
    }
    // Rounding left the draw past the last weight.
    Ok(options.last().expect("non-empty").0)
}

/// A [`RouterMode`] with its config and the round-robin position.
#[derive(Clone, Debug)]
pub struct Scheduler {
    mode: RouterMode,
    config: SchedulerConfig,
    next: usize,
}

impl Scheduler {
    pub fn new(mode: RouterMode, config: SchedulerConfig) -> Self {
        Self {
            mode,
            config,
            next: 0,
        }
    }

    pub fn mode(&self) -> RouterMode {
        self.mode
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Picks a pod among `candidates` for a `prompt_blocks`-block prompt. `scores` come
    /// from the index that matches the mode (they may be empty for round-robin and
    /// random, which report the chosen pod's cost all the same).
    pub fn pick<R: Rng + ?Sized>(
        &mut self,
        scores: &OverlapScores,
        candidates: &[WorkerLoad],
        prompt_blocks: u64,
        rng: &mut R,
    ) -> Result<Decision, ScheduleError> {
        if candidates.is_empty() {
            return Err(ScheduleError::NoWorkers);
        }
        let by_worker = || {
            let mut sorted = candidates.to_vec();
            sorted.sort_by_key(|l| l.worker);
            sorted.dedup_by_key(|l| l.worker);
            sorted
        };
        match self.mode {
            RouterMode::Kv | RouterMode::Approx => {
                pick_by_cost(scores, candidates, prompt_blocks, &self.config, rng)
            }
            RouterMode::RoundRobin => {
                let sorted = by_worker();
                let load = sorted[self.next % sorted.len()];
                self.next = self.next.wrapping_add(1);
                Ok(decision(&load, scores, prompt_blocks, &self.config))
            }
            RouterMode::Random => {
                let sorted = by_worker();
                let load = sorted[rng.random_range(0..sorted.len())];
                Ok(decision(&load, scores, prompt_blocks, &self.config))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tier;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn load(id: u64, prefill: u64, decode: u64) -> WorkerLoad {
        WorkerLoad {
            worker: WorkerId(id),
            prefill_blocks: prefill,
            decode_blocks: decode,
            shared_prefix_blocks: 0,
        }
    }

    fn counts(gpu: u32, host: u32, disk: u32) -> TierCounts {
        TierCounts([gpu, host, disk, 0])
    }

    /// The default config with prefill weighted `scale` (1: a block is a block, which
    /// keeps the sums below easy to follow).
    fn at_scale(scale: f64) -> SchedulerConfig {
        SchedulerConfig {
            prefill_load_scale: scale,
            ..SchedulerConfig::default()
        }
    }

    /// Ten-block prompt, three pods, scale 1:
    /// - A: overlap 8 GPU, prefill 4, decode 20: credited 8;   cost = (4 + 10 - 8) + 20 = 26
    /// - B: overlap 4 GPU + 4 host, prefill 0, decode 10:
    ///   credited 4 + 4*0.75 = 7; cost = (0 + 10 - 7) + 10 = 13
    /// - C: no overlap, prefill 0, decode 2: credited 0;        cost = (0 + 10 - 0) + 2 = 12
    ///
    /// C wins despite B's cache; with B's host blocks on GPU instead, B would cost
    /// (10 - 8) + 10 = 12 and tie with C.
    fn three_pods() -> (OverlapScores, Vec<WorkerLoad>) {
        let scores = OverlapScores::from_entries(vec![
            (WorkerId(1), counts(8, 0, 0)),
            (WorkerId(2), counts(4, 4, 0)),
        ]);
        (scores, vec![load(1, 4, 20), load(2, 0, 10), load(3, 0, 2)])
    }

    #[test]
    fn cost_follows_the_formula_by_hand() {
        let (scores, loads) = three_pods();
        let cfg = at_scale(1.0);
        let costs: Vec<_> = loads
            .iter()
            .map(|l| cost(l, scores.get(l.worker), 10, &cfg))
            .collect();
        assert_eq!(costs, [(8.0, 26.0), (7.0, 13.0), (0.0, 12.0)]);
        let d = pick_by_cost(&scores, &loads, 10, &cfg, &mut StdRng::seed_from_u64(0)).unwrap();
        assert_eq!(
            (d.worker, d.cost, d.credited_overlap),
            (WorkerId(3), 12.0, 0.0)
        );
    }

    #[test]
    fn prefill_scale_makes_cache_hits_matter_more() {
        // Scale 2: A = 2*6 + 20 = 32, B = 2*3 + 10 = 16, C = 2*10 + 2 = 22: B wins.
        let (scores, loads) = three_pods();
        let cfg = at_scale(2.0);
        let d = pick_by_cost(&scores, &loads, 10, &cfg, &mut StdRng::seed_from_u64(0)).unwrap();
        assert_eq!((d.worker, d.cost), (WorkerId(2), 16.0));
        assert_eq!(d.overlap.get(Tier::Host), 4);
    }

    #[test]
    fn ties_go_to_the_lower_load_then_to_a_seeded_draw() {
        // Ten blocks. Pod 5: overlap 10, prefill 0, decode 12 -> (0+10-10)+12 = 12, load 12.
        // Pod 4: no overlap, prefill 0, decode 2 -> 10 + 2 = 12, load 2.
        // Pod 3: same as pod 4. Pods 4 and 3 tie on cost and load; pod 5 never wins.
        let scores = OverlapScores::from_entries(vec![(WorkerId(5), counts(10, 0, 0))]);
        let loads = [load(5, 0, 12), load(4, 0, 2), load(3, 0, 2)];
        let cfg = at_scale(1.0);
        let pick = |seed| {
            pick_by_cost(&scores, &loads, 10, &cfg, &mut StdRng::seed_from_u64(seed))
                .unwrap()
                .worker
        };
        let winners: std::collections::BTreeSet<_> = (0..64).map(pick).collect();
        assert_eq!(
            winners.into_iter().collect::<Vec<_>>(),
            [WorkerId(3), WorkerId(4)]
        );
        assert_eq!(pick(7), pick(7), "a seed replays the same draw");
    }

    #[test]
    fn prefill_term_never_goes_negative() {
        // Overlap credited beyond the prompt is clamped: (0 + 2 - 2) + 1 = 1.
        let (credited, c) = cost(&load(1, 0, 1), counts(5, 0, 0), 2, &at_scale(1.0));
        assert_eq!((credited, c), (2.0, 1.0));
    }

    #[test]
    fn temperature_sampling_favours_the_cheapest() {
        let (scores, loads) = three_pods(); // costs 26, 13, 12
        let cfg = SchedulerConfig {
            temperature: 0.5,
            ..at_scale(1.0)
        };
        let mut rng = StdRng::seed_from_u64(42);
        let mut wins = [0u32; 3];
        for _ in 0..3000 {
            let d = pick_by_cost(&scores, &loads, 10, &cfg, &mut rng).unwrap();
            wins[d.worker.0 as usize - 1] += 1;
        }
        // Normalised costs 1, 1/14, 0: weights e^-2 = 0.135, e^-0.143 = 0.867, 1.
        // Expected shares 6.7%, 43.2%, 50.0%.
        assert!(wins[2] > wins[1] && wins[1] > wins[0], "{wins:?}");
        assert!(wins[0] > 100 && wins[0] < 300, "{wins:?}");
    }

    #[test]
    fn bad_temperature_and_no_workers_are_errors() {
        let cfg = SchedulerConfig {
            temperature: -1.0,
            ..SchedulerConfig::default()
        };
        let mut rng = StdRng::seed_from_u64(0);
        let scores = OverlapScores::default();
        assert_eq!(
            pick_by_cost(&scores, &[load(1, 0, 0)], 1, &cfg, &mut rng),
            Err(ScheduleError::InvalidTemperature(-1.0))
        );
        let mut s = Scheduler::new(RouterMode::Kv, SchedulerConfig::default());
        assert_eq!(
            s.pick(&scores, &[], 1, &mut rng),
            Err(ScheduleError::NoWorkers)
        );
    }

    #[test]
    fn round_robin_cycles_by_worker_id_and_random_is_seeded() {
        let loads = [load(9, 0, 0), load(2, 0, 0), load(5, 0, 0)];
        let scores = OverlapScores::default();
        let mut rng = StdRng::seed_from_u64(7);
        let mut rr = Scheduler::new(RouterMode::RoundRobin, SchedulerConfig::default());
        let order: Vec<u64> = (0..4)
            .map(|_| rr.pick(&scores, &loads, 3, &mut rng).unwrap().worker.0)
            .collect();
        assert_eq!(order, [2, 5, 9, 2]);
        let draw = |seed| {
            let mut s = Scheduler::new(RouterMode::Random, SchedulerConfig::default());
            let mut rng = StdRng::seed_from_u64(seed);
            (0..8)
                .map(|_| s.pick(&scores, &loads, 3, &mut rng).unwrap().worker.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
    }

    #[test]
    fn modes_parse_from_cli_spellings() {
        for m in RouterMode::ALL {
            assert_eq!(m.to_string().parse::<RouterMode>().unwrap(), m);
        }
        assert_eq!(
            "Round_Robin".parse::<RouterMode>().unwrap(),
            RouterMode::RoundRobin
        );
        assert_eq!(
            "roundrobin".parse::<RouterMode>().unwrap(),
            RouterMode::RoundRobin
        );
        assert!("best".parse::<RouterMode>().is_err());
    }
}
