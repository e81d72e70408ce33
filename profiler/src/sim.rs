//! One engine of a candidate graph, run on the simulated clock (`dynamo_mocker::Engine`,
//! the mock engine's own scheduler and KV pool on the hardware timing model, driven as a
//! simulated cluster of one, `dynamo_mocker::cluster`) under its share of the request's
//! workload.
//!
//! - The engine's share: an open loop takes every `engines`-th request of one seeded
//!   Poisson stream at the graph's rate (round-robin over `engines` like engines); a
//!   closed loop keeps `in_flight` requests on it, each replaced when it ends.
//! - Its stage: an aggregated engine prefills and decodes each request; a prefill engine
//!   computes the prompt and samples one token (the prefill leg); a decode engine gets
//!   the prompt's KV from a prefill engine (`Engine::submit_onboarded` with
//!   `PromptKv::from_prefill`, as a disaggregated decode does after the transfer),
//!   computes its last token as a decode token, then decodes.
//! - Warm-up: the requests in flight when the first one ends may have seen an emptier
//!   engine; the measured requests are the next ones to arrive after all of those have
//!   ended, so every one of them meets the steady state.
//! - Measured: a fixed number of requests (fewer for long outputs, to bound the steps
//!   simulated); their mean TTFT (arrival to first token), mean ITL (every gap between
//!   their tokens) and mean end-to-end time. An open loop that keeps up serves its
//!   share as offered; a closed loop completes `in_flight` requests per mean end-to-end
//!   time (Little's law). Closed-loop clients start spread over one request's estimated
//!   time, as independent clients are, not in lock step.
//! - An open loop that piles up more than [`MAX_WAITING`] requests is overloaded: the
//!   queue, hence the TTFT, grows without bound, so the run stops there. (The sweep
//!   does not even start one offered more than its engine's saturated throughput, which
//!   a closed loop of [`full_batch`] requests measures.)
//!
//! Deterministic: the same inputs and seed give the same run.

use std::ops::Range;

use dynamo_mocker::profile::prompt;
use dynamo_mocker::{
    Clock, ConfigError, Driver, Engine, EngineConfig, FinishedRequest, PromptKv, Rejected, Request,
    SimCluster, StepOutcome, StepWork, Stuck,
};
use dynamo_perfmodel::attention_pairs;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Requests waiting on one engine past which an open loop is overloaded.
pub const MAX_WAITING: usize = 512;
/// Output tokens the measured requests make together, which sets how many are measured.
const MEASURED_TOKENS: usize = 24_000;
const MIN_MEASURED: usize = 24;
const MAX_MEASURED: usize = 160;

/// Why an engine cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The engine refuses the request's shape (its KV pool cannot hold one).
    #[error("the simulated engine refuses the request: {0}")]
    Refused(#[from] Rejected),
    #[error(transparent)]
    Stuck(#[from] Stuck),
}

/// What an engine does with each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Aggregated,
    Prefill,
    Decode,
}

/// How requests reach the engine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Drive {
    /// Every `engines`-th request of a Poisson stream of `rate_per_s` requests per second.
    Open { rate_per_s: f64, engines: u32 },
    /// `in_flight` requests at once, each replaced as it ends.
    Closed { in_flight: u32 },
}

/// An engine's steady state, as its measured requests saw it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineRun {
    pub ttft_ms: f64,
    pub itl_ms: f64,
    pub e2e_ms: f64,
    /// Requests this engine completes per second.
    pub requests_per_s: f64,
    /// The queue grew past [`MAX_WAITING`]: it cannot keep up (the figures are those of
    /// what was measured before it stopped, if anything).
    pub overloaded: bool,
}

/// Arrival times of one engine's share of a Poisson stream: each gap is the sum of
/// `engines` exponential gaps of the whole stream, drawn by inversion.
struct Arrivals {
    rng: StdRng,
    /// Mean gap of the whole stream, ms.
    mean_gap_ms: f64,
    engines: u32,
    next_ms: f64,
}

impl Arrivals {
    fn new(rate_per_s: f64, engines: u32, seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            mean_gap_ms: 1000.0 / rate_per_s,
            engines: engines.max(1),
            next_ms: 0.0,
        }
    }

    /// The next arrival's time, then moves past it.
    fn take(&mut self) -> f64 {
        let at = self.next_ms;
        for _ in 0..self.engines {
            // 1 - u lies in (0, 1], so the logarithm is finite.
            let u: f64 = self.rng.random();
            self.next_ms += -(1.0 - u).ln() * self.mean_gap_ms;
        }
        at
    }
}

/// Which requests are measured, and what they saw.
struct Tracker {
    measured: u64,
    next_id: u64,
    /// Set at the first completion: requests below it may have seen a warming engine.
    warm_ids: Option<u64>,
    warm_finished: u64,
    /// The first measured request.
    first: Option<u64>,
    finished: u64,
    ttft_ms: f64,
    itl_ms: f64,
    gaps: f64,
    e2e_ms: f64,
    /// Requests ended, measured or not.
    completed: u64,
}

impl Tracker {
    fn new(measured: usize) -> Self {
        Self {
            measured: measured as u64,
            next_id: 0,
            warm_ids: None,
            warm_finished: 0,
            first: None,
            finished: 0,
            ttft_ms: 0.0,
            itl_ms: 0.0,
            gaps: 0.0,
            e2e_ms: 0.0,
            completed: 0,
        }
    }

    /// A new request's id.
    fn arrive(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        if self.first.is_none() && self.warm_ids.is_some_and(|w| self.warm_finished == w) {
            self.first = Some(id);
        }
        id
    }

    fn is_measured(&self, id: u64) -> bool {
        self.first
            .is_some_and(|first| id >= first && id < first + self.measured)
    }

    fn finish(&mut self, f: &FinishedRequest) {
        let warm = *self.warm_ids.get_or_insert(self.next_id);
        if f.id < warm {
            self.warm_finished += 1;
        }
        self.completed += 1;
        if !self.is_measured(f.id) {
            return;
        }
        let first = f.first_token_ms.unwrap_or(f.finished_ms);
        self.finished += 1;
        self.ttft_ms += first - f.arrival_ms;
        self.e2e_ms += f.finished_ms - f.arrival_ms;
        if f.output_tokens > 1 {
            self.itl_ms += f.finished_ms - first;
            self.gaps += (f.output_tokens - 1) as f64;
        }
    }

    fn done(&self) -> bool {
        self.finished == self.measured
    }

    /// The figures, at `requests_per_s`.
    fn run(&self, requests_per_s: f64, overloaded: bool) -> EngineRun {
        let n = self.finished.max(1) as f64;
        let mean = |sum: f64| {
            if self.finished == 0 {
                f64::INFINITY
            } else {
                sum / n
            }
        };
        EngineRun {
            ttft_ms: mean(self.ttft_ms),
            itl_ms: if self.gaps > 0.0 {
                self.itl_ms / self.gaps
            } else {
                0.0
            },
            e2e_ms: mean(self.e2e_ms),
            requests_per_s,
            overloaded,
        }
    }
}

/// Requests an engine built from `config` runs at once as `stage` at most: its
/// `max_num_seqs`, or as many as its KV pool holds at their full length, whichever is
/// fewer (at least one). A closed loop of that many measures its saturated throughput.
pub fn full_batch(config: &EngineConfig, stage: Stage, isl: usize, osl: usize) -> u32 {
    let tokens = isl + if stage == Stage::Prefill { 1 } else { osl };
    let fit = config.num_gpu_blocks / tokens.div_ceil(config.block_size).max(1);
    fit.min(config.max_num_seqs).max(1) as u32
}

/// Runs one engine built from `config` as `stage` under `drive`, each request `isl`
/// prompt tokens and `osl` output tokens (see the module doc).
pub fn simulate(
    config: &EngineConfig,
    stage: Stage,
    drive: Drive,
    isl: usize,
    osl: usize,
    seed: u64,
) -> Result<EngineRun, SimError> {
    let mut engine = Engine::simulated(config.clone())?;
    engine.set_emit_kv_events(false);
    let max_tokens = if stage == Stage::Prefill { 1 } else { osl };
    let clients = match drive {
        Drive::Closed { in_flight } => {
            // Clients that started together would stay in lock step (every request the
            // same length); spread over one request's estimated time, they keep the
            // engine's mix of prefills and decodes steady, as independent clients do.
            let n = in_flight.max(1) as usize;
            let work = |work: StepWork| config.timing.step_ms(work, config.speedup_ratio);
            let prefill = work(StepWork {
                prefill_tokens: isl,
                prefill_seqs: 1,
                prefill_attention_pairs: attention_pairs(isl as u64, 0),
                ..StepWork::default()
            });
            let decode = work(StepWork {
                decode_seqs: n,
                decode_context_tokens: n * (isl + max_tokens / 2),
                ..StepWork::default()
            });
            let spread_ms = prefill + (max_tokens - 1) as f64 * decode;
            Clients::Closed {
                n,
                spread_ms,
                started: 0,
            }
        }
        Drive::Open {
            rate_per_s,
            engines,
        } => {
            let mut arrivals = Arrivals::new(rate_per_s, engines, seed);
            Clients::Open {
                next_ms: arrivals.take(),
                arrivals: Box::new(arrivals),
                offered_per_s: rate_per_s / f64::from(engines.max(1)),
                served: None,
            }
        }
    };
    let mut run = Run {
        cluster: SimCluster::new(vec![engine]),
        tracker: Tracker::new((MEASURED_TOKENS / max_tokens).clamp(MIN_MEASURED, MAX_MEASURED)),
        isl,
        max_tokens,
        vocab: config.vocab_size,
        // A decode engine receives the prompt's full blocks short of the last token, as
        // a prefill lends them.
        remote_prefill: (stage == Stage::Decode)
            .then(|| 0..isl.saturating_sub(1) / config.block_size),
        clients,
    };
    run.run()?;
    let t = &run.tracker;
    Ok(match run.clients {
        Clients::Closed { n, .. } => {
            // Little's law: each of the `n` clients completes one request per mean
            // end-to-end time.
            let e2e_ms = t.run(0.0, false).e2e_ms;
            t.run(n as f64 * 1000.0 / e2e_ms, false)
        }
        Clients::Open {
            served: Some(served),
            ..
        } => t.run(served, true),
        // Kept up with: served as offered.
        Clients::Open { offered_per_s, .. } => t.run(offered_per_s, false),
    })
}

/// Where the engine's requests come from.
enum Clients {
    /// `n` clients, client `k` starting at `spread_ms * k / n`, each sending its next
    /// request when its last ends.
    Closed {
        n: usize,
        spread_ms: f64,
        started: usize,
    },
    /// Arrivals at `next_ms` and on, `offered_per_s` requests/s; `served` (requests/s)
    /// once overloaded.
    Open {
        /// Boxed: a random generator's state, far larger than the closed loop's.
        arrivals: Box<Arrivals>,
        next_ms: f64,
        offered_per_s: f64,
        served: Option<f64>,
    },
}

/// [`simulate`] as a driver of a cluster of one engine: the events are client starts
/// (closed) or arrivals (open).
struct Run {
    cluster: SimCluster<()>,
    tracker: Tracker,
    isl: usize,
    max_tokens: usize,
    vocab: u32,
    /// A decode engine's requests: their prompt's full blocks, lent by a prefill engine.
    remote_prefill: Option<Range<usize>>,
    clients: Clients,
}

impl Run {
    /// A new request arriving at `at_ms`. Every request has the same shape: one refused,
    /// all would be.
    fn submit(&mut self, at_ms: f64) -> Result<(), SimError> {
        let id = self.tracker.arrive();
        let request = Request {
            id,
            token_ids: prompt(id as usize, self.isl, self.vocab),
            max_tokens: self.max_tokens,
            seed: None,
            pin_ttl: None,
        };
        let engine = self.cluster.engine_mut(0);
        match &self.remote_prefill {
            Some(blocks) => {
                engine.submit_onboarded(request, at_ms, PromptKv::from_prefill(blocks.clone()))?
            }
            None => engine.submit_at(request, at_ms)?,
        }
        Ok(())
    }
}

impl Driver for Run {
    type Shown = ();
    type Error = SimError;

    fn cluster(&mut self) -> &mut SimCluster<()> {
        &mut self.cluster
    }

    fn next_event_ms(&self) -> Option<f64> {
        let done = self.tracker.done();
        match self.clients {
            Clients::Closed {
                n,
                spread_ms,
                started,
            } => {
                if started < n {
                    Some(spread_ms * started as f64 / n as f64)
                } else {
                    (!done).then_some(f64::INFINITY)
                }
            }
            Clients::Open {
                next_ms, served, ..
            } => (!done && served.is_none()).then_some(next_ms),
        }
    }

    fn stepped(&mut self, _: usize, o: StepOutcome) -> Result<(), SimError> {
        for f in &o.finished {
            self.tracker.finish(f);
            if matches!(self.clients, Clients::Closed { .. }) {
                self.submit(f.finished_ms)?;
            }
        }
        Ok(())
    }

    fn event(&mut self, now_ms: f64) -> Result<(), SimError> {
        self.submit(now_ms)?;
        match &mut self.clients {
            Clients::Closed { started, .. } => *started += 1,
            Clients::Open {
                arrivals,
                next_ms,
                served,
                ..
            } => {
                *next_ms = arrivals.take();
                let engine = &self.cluster.engines()[0];
                if engine.metrics().num_requests_waiting > MAX_WAITING {
                    let elapsed_ms = engine.clock().now_ms();
                    *served = Some(self.tracker.completed as f64 * 1000.0 / elapsed_ms);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_mocker::TimingModel;
    use dynamo_perfmodel::{Estimator, GpuSku, ModelArch};

    fn engine() -> EngineConfig {
        let model = ModelArch::by_name("Qwen/Qwen3-0.6B").unwrap();
        let e = Estimator::new(GpuSku::H100Sxm.spec(), model, 1).unwrap();
        EngineConfig::default().on_hardware(e, None).unwrap().0
    }

    fn estimator(config: &EngineConfig) -> &Estimator {
        match &config.timing {
            TimingModel::Hardware(e) => e,
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_lone_request_sees_the_bare_prefill_and_decode_steps() {
        let config = engine();
        let e = estimator(&config);
        let run = simulate(
            &config,
            Stage::Aggregated,
            Drive::Closed { in_flight: 1 },
            1000,
            50,
            1,
        )
        .unwrap();
        assert!(!run.overloaded);
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-9;
        assert!(close(run.ttft_ms, e.prefill_ms(1000, 0)), "{run:?}");
        // Each decode step of the one sequence reads its whole context: between the
        // step at 1,001 tokens and the one at 1,049.
        let (lo, hi) = (e.decode_step_ms(1, 1001.0), e.decode_step_ms(1, 1049.0));
        assert!(
            run.itl_ms > lo && run.itl_ms < hi,
            "{lo} < {} < {hi}",
            run.itl_ms
        );
        assert!((run.e2e_ms - (run.ttft_ms + 49.0 * run.itl_ms)).abs() < 1e-6);
        // One request at a time, back to back.
        assert!((run.requests_per_s * run.e2e_ms / 1000.0 - 1.0).abs() < 0.05);
    }

    #[test]
    fn more_load_queues_longer_and_an_engine_that_cannot_keep_up_is_overloaded() {
        let config = engine();
        let run = |rate_per_s: f64| {
            let drive = Drive::Open {
                rate_per_s,
                engines: 1,
            };
            simulate(&config, Stage::Aggregated, drive, 3000, 200, 7).unwrap()
        };
        let (light, busy) = (run(2.0), run(20.0));
        assert!(!light.overloaded && !busy.overloaded);
        assert!(busy.ttft_ms > light.ttft_ms && busy.itl_ms > light.itl_ms);
        // Served as offered, within the sampling noise of a short run.
        assert!((busy.requests_per_s / 20.0 - 1.0).abs() < 0.2, "{busy:?}");
        assert!(run(5000.0).overloaded);
        // The same seed, the same run.
        assert_eq!(run(20.0), busy);
    }

    #[test]
    fn round_robin_shares_split_the_load() {
        let config = engine();
        let run = |engines: u32| {
            let drive = Drive::Open {
                rate_per_s: 24.0,
                engines,
            };
            simulate(&config, Stage::Aggregated, drive, 3000, 200, 7).unwrap()
        };
        let (one, four) = (run(1), run(4));
        assert!(!one.overloaded);
        assert!(four.ttft_ms < one.ttft_ms && four.itl_ms < one.itl_ms);
        assert!((four.requests_per_s / 6.0 - 1.0).abs() < 0.2, "{four:?}");
    }

    #[test]
    fn stages_split_a_request_between_prefill_and_decode() {
        let config = engine();
        let e = estimator(&config);
        let one = Drive::Closed { in_flight: 1 };
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-9;
        let prefill = simulate(&config, Stage::Prefill, one, 1000, 50, 1).unwrap();
        assert!(close(prefill.ttft_ms, e.prefill_ms(1000, 0)));
        assert_eq!((prefill.itl_ms, prefill.e2e_ms), (0.0, prefill.ttft_ms));
        // A decode engine has the prompt's KV but the last token's, which it computes as
        // one decode token over the other 999, then decodes as an aggregated engine does.
        let decode = simulate(&config, Stage::Decode, one, 1000, 50, 1).unwrap();
        assert!(close(decode.ttft_ms, e.decode_step_ms(1, 1000.0)));
        let agg = simulate(&config, Stage::Aggregated, one, 1000, 50, 1).unwrap();
        assert!((decode.itl_ms / agg.itl_ms - 1.0).abs() < 1e-9);
    }
}
