//! The planner in the loop of a simulated aggregated graph (`DESIGN.md`, "Planner"):
//! mock engines in simulated time, routed by the endpoint picker's scheduler
//! ([`KvRouter`]), under a load that follows a [`RateSchedule`], with the planner's
//! pure core (`dynamo_planner`) deciding the replicas. The same traffic through a fixed
//! number of engines (`static:N`) is the comparison.
//!
//! What the planner sees is what Prometheus would show it:
//! - throughput mode, every `interval_s`: the requests that arrived in the interval
//!   (the frontend counts a request, and observes its ISL, when it comes in), the mean
//!   TTFT of the first tokens in it (and the mean ISL of those requests), the mean ITL of
//!   the token gaps in it, and the mean OSL and decode time of the requests that finished
//!   in it (decode concurrency per engine by Little's law:
//!   `finished / interval * mean decode time / serving engines`). One predictor per
//!   quantity (requests, ISL, OSL) forecasts the next interval; `decide_throughput`
//!   sizes it from the profile;
//! - load mode, every `load_interval_s`: each serving engine's queued prompt tokens
//!   (its requests without a first token, times the share of them its
//!   `num_requests_waiting` says are still waiting, plus an even share of the picker's
//!   queue), its KV in use and its KV capacity; `decide_load` moves one replica at a
//!   time;
//! - `throughput+load`: both, load mode never scaling below what the last throughput
//!   tick asked for (Dynamo's throughput lower bound; computed even while a change rolls
//!   out and that tick itself holds).
//!
//! Routing: each request goes, on arrival, to the picker's choice among the serving
//! engines (the EPP's default). With a saturation threshold
//! ([`PlannerSetup::max_waiting_requests`]) a request that finds every serving engine
//! saturated waits in the picker's queue, FCFS, and goes to the first engine that is
//! not (one that finishes a step, or one that starts serving); without one, a backlog
//! stays on the engines that took it, even once new engines serve.
//!
//! Scaling: a scale-up creates engines at once (they cost GPU time from then on) that
//! become routable `startup_s` later, standing for a pod's start (scheduling, container
//! start, model load; 30 s by default). A scale-down stops routing to the serving engines
//! with the fewest requests in flight, which finish what they hold and are removed when
//! empty. Until every started engine serves and every drained one is gone the planner is
//! told `rolling_out`, so it holds (one of its safeguards). Engines are never reused: a
//! new engine starts with an empty cache.
//!
//! Figures: a request is within the TTFT target when its first token came within it
//! (picker queueing included), and within the ITL target when its mean gap
//! (`(last token - first token) / (tokens - 1)`) is; a request with one output token has
//! no gap and meets the ITL target; a refused request meets neither. An SLA breach is a
//! request outside either target. GPU-seconds are the engines' lifetimes (created to
//! removed, or to the end of the run: the later of the schedule's end and the last
//! token) times the GPUs per engine, starting and draining engines included.
//!
//! A driver of the simulated cluster (`dynamo_mocker::cluster`), as every replay is:
//! the busy engine furthest behind steps until every busy engine has passed the next
//! event (an arrival, a planner tick,
//! an engine becoming ready); an engine may overshoot an event by part of one step, and a
//! tick then sees that step's tokens in the next interval, not this one.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::time::Instant;

use dynamo_kvcache::{BlockHasher, RequestId};
use dynamo_loadgen::arrivals::RateSchedule;
use dynamo_loadgen::report::Attainment;
use dynamo_loadgen::workload::{WorkItem, Workload};
use dynamo_mocker::replay::{Collector, Percentiles, Router};
use dynamo_mocker::{Clock, Driver, Engine, EngineConfig, SimClock, SimCluster, StepOutcome};
use dynamo_planner::decide::{
    Decision, EngineLoad, Forecast, Limits, LoadInputs, LoadTarget, Observed, PerRole,
    ScaleDownWindow, SlaTargets, ThroughputConfig, ThroughputInputs, decide_load,
    decide_throughput, floor_by_throughput, throughput_floor,
};
use dynamo_planner::knobs::HeadroomKnobs;
use dynamo_planner::predict::{LoadPredictor, Predictor, PredictorConfig};
use dynamo_planner::profile::Profile;
use serde::Serialize;

use crate::replay::{KvRouter, RouterSetup, check_arrivals};

/// Who sets the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum PlannerMode {
    /// `decide_throughput` every `interval_s`, from forecasts and the profile.
    Throughput,
    /// `decide_load` every `load_interval_s`, from the engines' queues and KV.
    Load,
    /// Both, as Dynamo runs them together (`optimization_target: sla`): throughput mode
    /// sets the replicas every `interval_s`, load mode adjusts them every
    /// `load_interval_s` in between, never below what the last throughput tick asked for
    /// (Dynamo's throughput lower bound on load-based scale-down).
    ThroughputLoad,
    /// No planner: this many engines throughout, serving from the start.
    Static(u32),
    /// No planner but a timetable that knows the rate schedule, as a scheduled scaler
    /// (KEDA's cron scaler) for a known pattern: at each step, the replicas the profile
    /// gives its rate, added `lead_s` seconds before it (`lead_s` after it when negative:
    /// a reaction that late). What reacting perfectly, or that late, would get.
    Scheduled { lead_s: i32 },
}

impl PlannerMode {
    /// `throughput`, `load`, `throughput+load`, `static:N` (N at least 1), or
    /// `scheduled[:LEAD]` (whole seconds, negative for late; 0 when left out).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "throughput" => Ok(Self::Throughput),
            "load" => Ok(Self::Load),
            "throughput+load" | "load+throughput" => Ok(Self::ThroughputLoad),
            "scheduled" => Ok(Self::Scheduled { lead_s: 0 }),
            other if other.starts_with("scheduled:") => other["scheduled:".len()..]
                .parse::<i32>()
                .map(|lead_s| Self::Scheduled { lead_s })
                .map_err(|_| {
                    format!("{s:?}: scheduled:LEAD takes whole seconds, e.g. scheduled:4 or scheduled:-2")
                }),
            other => {
                let n = other.strip_prefix("static:").ok_or_else(|| {
                    format!(
                        "{s:?}: a planner mode is throughput, load, throughput+load, static:N or scheduled[:LEAD]"
                    )
                })?;
                match n.parse::<u32>() {
                    Ok(n) if n > 0 => Ok(Self::Static(n)),
                    _ => Err(format!(
                        "{s:?}: static:N takes a whole number of engines >= 1"
                    )),
                }
            }
        }
    }

    pub fn is_static(&self) -> bool {
        matches!(self, Self::Static(_))
    }
}

impl fmt::Display for PlannerMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Throughput => f.write_str("throughput"),
            Self::Load => f.write_str("load"),
            Self::ThroughputLoad => f.write_str("throughput+load"),
            Self::Static(n) => write!(f, "static:{n}"),
            Self::Scheduled { lead_s: 0 } => f.write_str("scheduled"),
            Self::Scheduled { lead_s } => write!(f, "scheduled:{lead_s}"),
        }
    }
}

/// The graph, the planner's configuration and the simulation's knobs.
#[derive(Clone, Debug)]
pub struct PlannerSetup {
    /// Every engine's configuration.
    pub engine: EngineConfig,
    pub router: RouterSetup,
    /// The engines' profile (throughput mode), e.g. from
    /// `dynamo_mocker::profile::planner_profile` of `engine`.
    pub profile: Profile,
    pub targets: SlaTargets,
    pub limits: Limits,
    /// The predictor of each of requests, ISL and OSL.
    pub predictor: PredictorConfig,
    /// Throughput mode's correction factors (observed / expected TTFT and ITL).
    pub correction: bool,
    /// Throughput mode's adjustment interval, s.
    pub interval_s: f64,
    /// Load mode's adjustment interval, s.
    pub load_interval_s: f64,
    pub load_target: LoadTarget,
    /// The model's context length: load mode measures the prefill queue in full
    /// contexts.
    pub context_length: f64,
    /// Seconds from a scale-up to the new engine taking requests (a pod's start).
    pub startup_s: f64,
    /// Replicas a planner starts with (serving from time 0).
    pub initial_replicas: u32,
    /// The picker's saturation threshold (`--max-waiting-requests` of the EPP): an
    /// engine with more requests than this waiting in it is saturated, and a request that
    /// finds every serving engine saturated waits in the picker's queue (FCFS) until one
    /// is not. `None` (the EPP's default) routes every request on arrival.
    pub max_waiting_requests: Option<u64>,
    /// Throughput mode's target utilization and the scale-down window.
    pub headroom: HeadroomKnobs,
}

impl PlannerSetup {
    /// GPUs per engine, as the profile was measured.
    pub fn gpus_per_engine(&self) -> u32 {
        self.profile.gpus_per_engine().max(1)
    }

    fn throughput_config(&self) -> ThroughputConfig<'_> {
        ThroughputConfig {
            targets: self.targets,
            prefill_profile: &self.profile,
            decode_profile: &self.profile,
            gpus: PerRole::Aggregated {
                worker: self.gpus_per_engine(),
            },
            correction: self.correction,
            target_utilization: self.headroom.target_utilization,
            limits: self.limits,
        }
    }

    /// The replicas the profile gives a constant `rate` (req/s) of `isl`/`osl` requests:
    /// throughput mode's formula over one interval, without correction, budget or step
    /// cap (at least 1). The static count a deployment sized for that rate would use.
    pub fn replicas_for(&self, rate: f64, isl: f64, osl: f64) -> u32 {
        let config = ThroughputConfig {
            correction: false,
            limits: Limits {
                min_endpoint: 1,
                max_gpu_budget: u32::MAX,
                max_step: u32::MAX,
            },
            ..self.throughput_config()
        };
        let inputs = ThroughputInputs {
            forecast: Forecast {
                requests: Some(rate * self.interval_s),
                isl: Some(isl),
                osl: Some(osl),
            },
            observed: Observed::default(),
            interval_s: self.interval_s,
            current: PerRole::Aggregated { worker: 1 },
            rolling_out: false,
            backlog: 0.0,
        };
        match decide_throughput(&config, &inputs).replicas {
            PerRole::Aggregated { worker } => worker.max(1),
            PerRole::Disaggregated { .. } => 1,
        }
    }
}

/// The replicas at a moment: `replicas` is what the planner set (serving + starting);
/// draining engines still hold GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TimelinePoint {
    pub t_s: f64,
    pub replicas: u32,
    pub serving: u32,
    pub starting: u32,
    pub draining: u32,
}

/// A planner decision that changed the replicas.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScaleRecord {
    pub t_s: f64,
    pub from: u32,
    pub to: u32,
    /// Throughput mode: the request rate the decision was sized for (req/s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast_rate: Option<f64>,
    /// The decision as the planner logs it.
    pub decision: String,
}

/// What one run (a planner mode or a static count) gave.
#[derive(Clone, Debug, Serialize)]
pub struct PlannerRun {
    /// `throughput`, `load` or `static:N`.
    pub label: String,
    pub requests: usize,
    pub completed: usize,
    pub rejected: usize,
    pub attainment: Attainment,
    /// The same per step of the schedule, by the request's arrival.
    pub per_step: Vec<Attainment>,
    pub gpu_seconds: f64,
    /// From 0 to the later of the schedule's end and the last token, simulated s.
    pub duration_s: f64,
    pub ttft_ms: Percentiles,
    /// Every token gap.
    pub itl_ms: Percentiles,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Decisions that changed the replicas.
    pub scalings: Vec<ScaleRecord>,
    /// Decisions taken (holds included).
    pub decisions: usize,
    pub timeline: Vec<TimelinePoint>,
    /// Host seconds the simulation took.
    pub wall_s: f64,
}

impl PlannerRun {
    /// Requests outside either target.
    pub fn breaches(&self) -> usize {
        self.attainment.breaches()
    }

    /// How many times the replicas the planner set changed.
    pub fn replica_changes(&self) -> usize {
        self.scalings.len()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum SlotState {
    Starting { ready_ms: f64 },
    Serving,
    Draining,
    Gone,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    state: SlotState,
    created_ms: f64,
    gone_ms: Option<f64>,
}

/// What the timeline is rebuilt from, in time order.
#[derive(Clone, Copy, Debug)]
enum Change {
    Target(u32),
    Created,
    Ready,
    Drained,
    Gone,
}

/// One planner interval's observations (events at `[k * interval, (k + 1) * interval)`).
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    arrivals: usize,
    isl_sum: f64,
    first_tokens: usize,
    ttft_sum: f64,
    ttft_isl_sum: f64,
    gaps: usize,
    itl_sum: f64,
    finished: usize,
    osl_sum: f64,
    decode_ms_sum: f64,
}

/// A request's outcome: TTFT and mean ITL, ms (`None` ITL with one output token).
#[derive(Clone, Copy, Debug)]
struct Outcome {
    ttft_ms: f64,
    itl_ms: Option<f64>,
}

struct Sim<'a> {
    setup: &'a PlannerSetup,
    mode: PlannerMode,
    workload: &'a Workload,
    arrivals_ms: &'a [f64],
    hasher: BlockHasher,
    /// The engines, created and never reused; their steps shown to the router once each
    /// has ended.
    cluster: SimCluster,
    slots: Vec<Slot>,
    router: KvRouter,
    collector: Collector,
    /// Requests routed to an engine and without a first token: (engine, prompt tokens).
    awaiting: HashMap<u64, (usize, usize)>,
    /// Per engine: prompt tokens and count of its requests without a first token.
    awaiting_tokens: Vec<f64>,
    awaiting_count: Vec<usize>,
    /// The picker's queue (every serving engine saturated): request indices, with their
    /// prompt tokens.
    picker_queue: VecDeque<(usize, WorkItem)>,
    picker_queued_tokens: f64,
    windows: BTreeMap<u64, Window>,
    window_ms: f64,
    outcomes: Vec<Option<Outcome>>,
    rejected: usize,
    changes: Vec<(f64, Change)>,
    scalings: Vec<ScaleRecord>,
    decisions: usize,
    target: u32,
    /// What the last throughput tick would have set, had nothing been rolling out: load
    /// mode's floor in the combined mode.
    floor: u32,
    last_token_ms: f64,
    predictors: [LoadPredictor; 3],
    scale_down: ScaleDownWindow,
    schedule_end_ms: f64,
    /// Load ticks per throughput tick, in the combined mode.
    per: u64,
    next_tick: u64,
    next_arrival: usize,
    /// `Scheduled`'s timetable, (ms, replicas) in time order, and its next entry.
    timetable: Vec<(f64, u32)>,
    next_entry: usize,
}

impl Sim<'_> {
    fn add_engine(&mut self, now_ms: f64, ready_ms: f64) -> anyhow::Result<()> {
        let mut e = Engine::new(self.setup.engine.clone(), SimClock::new(now_ms))?;
        e.set_emit_kv_events(self.router.reads_kv_events());
        self.cluster.add(e);
        self.awaiting_tokens.push(0.0);
        self.awaiting_count.push(0);
        let state = if ready_ms <= now_ms {
            SlotState::Serving
        } else {
            SlotState::Starting { ready_ms }
        };
        self.slots.push(Slot {
            state,
            created_ms: now_ms,
            gone_ms: None,
        });
        self.changes.push((now_ms, Change::Created));
        if state == SlotState::Serving {
            self.changes.push((now_ms, Change::Ready));
        }
        Ok(())
    }

    fn serving(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&k| self.slots[k].state == SlotState::Serving)
            .collect()
    }

    /// Whether the picker counts engine `k` as saturated (`max_waiting_requests`).
    fn saturated(&self, k: usize) -> bool {
        self.setup.max_waiting_requests.is_some_and(|max| {
            self.cluster.engines()[k].metrics().num_requests_waiting as u64 > max
        })
    }

    fn rolling_out(&self) -> bool {
        self.slots
            .iter()
            .any(|s| matches!(s.state, SlotState::Starting { .. } | SlotState::Draining))
    }

    fn next_ready_ms(&self) -> f64 {
        self.slots
            .iter()
            .filter_map(|s| match s.state {
                SlotState::Starting { ready_ms } => Some(ready_ms),
                _ => None,
            })
            .fold(f64::INFINITY, f64::min)
    }

    fn window(&mut self, t_ms: f64) -> &mut Window {
        let k = (t_ms.max(0.0) / self.window_ms).floor() as u64;
        self.windows.entry(k).or_default()
    }

    fn gone(&mut self, k: usize, at_ms: f64) {
        self.slots[k].state = SlotState::Gone;
        self.slots[k].gone_ms = Some(at_ms);
        self.router.remove_engine(k);
        self.changes.push((at_ms, Change::Gone));
    }

    /// Request `i` arrives at `now_ms`: to the picker's pick among the serving engines
    /// that are not saturated, or into its queue when every one is.
    fn arrive(&mut self, i: usize, now_ms: f64) -> anyhow::Result<()> {
        let item = self.workload.request(i);
        let w = self.window(now_ms);
        w.arrivals += 1;
        w.isl_sum += item.token_ids.len() as f64;
        let serving = self.serving();
        anyhow::ensure!(!serving.is_empty(), "no engine serves at {now_ms} ms");
        let open: Vec<usize> = serving
            .into_iter()
            .filter(|&k| !self.saturated(k))
            .collect();
        if open.is_empty() {
            self.picker_queued_tokens += item.token_ids.len() as f64;
            self.picker_queue.push_back((i, item));
        } else {
            self.send(i, item, &open, now_ms);
        }
        Ok(())
    }

    /// Routes request `i` to one of `candidates` at `now_ms`.
    fn send(&mut self, i: usize, item: WorkItem, candidates: &[usize], now_ms: f64) {
        let len = item.token_ids.len();
        let hashes = self.hasher.seq_hashes(&item.token_ids);
        let router = &mut self.router;
        self.cluster.release(now_ms, |k, o| router.observe(k, &o));
        let engines = self.cluster.engines();
        self.router
            .observe_metrics(candidates.iter().map(|&k| (k, &engines[k])));
        let id = RequestId(i as u64);
        let (_, k) = self.router.pick(candidates, id, None, &hashes, now_ms);
        // The engine counts its TTFT from the arrival, the picker's wait included.
        if self
            .cluster
            .engine_mut(k)
            .submit_at(item.into_request(i), self.arrivals_ms[i])
            .is_err()
        {
            self.rejected += 1;
            self.router.finished(id);
        } else {
            self.awaiting.insert(i as u64, (k, len));
            self.awaiting_tokens[k] += len as f64;
            self.awaiting_count[k] += 1;
        }
    }

    /// Hands engine `k` (serving, its clock now) the picker's queued requests while it is
    /// not saturated.
    fn drain_picker_queue(&mut self, k: usize) {
        while !self.picker_queue.is_empty()
            && self.slots[k].state == SlotState::Serving
            && !self.saturated(k)
        {
            let (i, item) = self.picker_queue.pop_front().expect("checked");
            self.picker_queued_tokens -= item.token_ids.len() as f64;
            let now = self.cluster.engines()[k].clock().now_ms();
            self.send(i, item, &[k], now);
        }
    }

    /// Takes in what engine `k`'s step `o` did.
    fn take_step(&mut self, k: usize, o: &StepOutcome) {
        self.collector.take(o);
        let end = o.ended_ms();
        if !o.outputs.is_empty() {
            self.last_token_ms = self.last_token_ms.max(end);
        }
        for t in &o.outputs {
            if let Some(ttft) = t.ttft_ms {
                let isl = match self.awaiting.remove(&t.id) {
                    Some((e, len)) => {
                        self.awaiting_tokens[e] -= len as f64;
                        self.awaiting_count[e] -= 1;
                        len as f64
                    }
                    None => 0.0,
                };
                let w = self.window(end);
                w.first_tokens += 1;
                w.ttft_sum += ttft;
                w.ttft_isl_sum += isl;
            }
            if let Some(itl) = t.itl_ms {
                let w = self.window(end);
                w.gaps += 1;
                w.itl_sum += itl;
            }
        }
        for f in &o.finished {
            let i = f.id as usize;
            let first = f.first_token_ms.unwrap_or(f.finished_ms);
            let itl_ms = (f.output_tokens > 1)
                .then(|| (f.finished_ms - first) / (f.output_tokens - 1) as f64);
            self.outcomes[i] = Some(Outcome {
                ttft_ms: first - self.arrivals_ms[i],
                itl_ms,
            });
            let w = self.window(f.finished_ms);
            w.finished += 1;
            w.osl_sum += f.output_tokens as f64;
            w.decode_ms_sum += f.finished_ms - first;
        }
        if self.slots[k].state == SlotState::Draining && !self.cluster.engines()[k].has_work() {
            self.gone(k, end);
        }
    }

    /// Sets the replicas to `n` at `now_ms` (see the module doc).
    fn scale_to(&mut self, n: u32, now_ms: f64) -> anyhow::Result<()> {
        if n > self.target {
            let ready = now_ms + self.setup.startup_s * 1000.0;
            for _ in self.target..n {
                self.add_engine(now_ms, ready)?;
            }
        } else if n < self.target {
            let mut serving = self.serving();
            let in_flight = |e: &Engine| {
                let m = e.metrics();
                m.num_requests_running + m.num_requests_waiting
            };
            let engines = self.cluster.engines();
            serving.sort_by_key(|&k| (in_flight(&engines[k]), std::cmp::Reverse(k)));
            let drop = (self.target - n) as usize;
            anyhow::ensure!(
                serving.len() > drop,
                "scaling {} -> {n} would leave no engine serving",
                self.target
            );
            for &k in &serving[..drop] {
                self.slots[k].state = SlotState::Draining;
                self.changes.push((now_ms, Change::Drained));
                if !self.cluster.engines()[k].has_work() {
                    self.gone(k, now_ms);
                }
            }
        }
        if n != self.target {
            self.target = n;
            self.changes.push((now_ms, Change::Target(n)));
        }
        Ok(())
    }

    /// Requests waiting now: in the picker's queue, or in a serving engine's queue with
    /// no first token (Prometheus shows the picker's queue and each engine's
    /// `num_requests_waiting`).
    fn backlog(&self) -> usize {
        let engines = self.cluster.engines();
        let waiting: usize = self
            .serving()
            .into_iter()
            .map(|k| {
                engines[k]
                    .metrics()
                    .num_requests_waiting
                    .min(self.awaiting_count[k])
            })
            .sum();
        self.picker_queue.len() + waiting
    }

    /// One throughput-mode decision at `now_ms`, the end of interval `k - 1`.
    fn throughput_tick(&mut self, k: u64, now_ms: f64) -> anyhow::Result<()> {
        let w = self.windows.remove(&(k - 1)).unwrap_or_default();
        self.windows.retain(|&i, _| i >= k);
        let interval_s = self.setup.interval_s;
        let mean = |sum: f64, n: usize| (n > 0).then(|| sum / n as f64);
        let serving = self.serving().len().max(1) as f64;
        let rolling_out = self.rolling_out();
        let [requests, isl, osl] = &mut self.predictors;
        requests.observe(w.arrivals as f64);
        if let Some(x) = mean(w.isl_sum, w.arrivals) {
            isl.observe(x);
        }
        if let Some(x) = mean(w.osl_sum, w.finished) {
            osl.observe(x);
        }
        let observed = Observed {
            ttft_ms: mean(w.ttft_sum, w.first_tokens),
            itl_ms: mean(w.itl_sum, w.gaps),
            isl: mean(w.ttft_isl_sum, w.first_tokens),
            osl: mean(w.osl_sum, w.finished),
            decode_concurrency: mean(w.decode_ms_sum, w.finished)
                .map(|d| w.finished as f64 / interval_s * (d / 1000.0) / serving),
        };
        let inputs = ThroughputInputs {
            forecast: Forecast {
                requests: requests.predict(),
                isl: isl.predict(),
                osl: osl.predict(),
            },
            observed,
            interval_s,
            current: PerRole::Aggregated {
                worker: self.target,
            },
            rolling_out,
            backlog: self.backlog() as f64,
        };
        let config = self.setup.throughput_config();
        let d = self
            .scale_down
            .decide_throughput(now_ms / 1000.0, &config, &inputs);
        let rate = inputs.forecast.requests.map(|r| r / interval_s);
        if let Some(PerRole::Aggregated { worker }) = throughput_floor(&config, &inputs) {
            self.floor = worker;
        }
        self.apply(d, now_ms, rate)
    }

    /// One load-mode decision at `now_ms`. An engine's queued prefill tokens are those of
    /// its waiting requests (its requests without a first token, times the share of them
    /// still waiting), plus an even share of the picker's queue, which the serving
    /// engines will take.
    fn load_tick(&mut self, now_ms: f64) -> anyhow::Result<()> {
        let config = &self.setup.engine;
        let max_kv = (config.num_gpu_blocks * config.block_size) as f64;
        let serving = self.serving();
        let picker_share = self.picker_queued_tokens.max(0.0) / serving.len().max(1) as f64;
        let loads: Vec<EngineLoad> = serving
            .into_iter()
            .map(|k| {
                let m = self.cluster.engines()[k].metrics();
                let waiting = m.num_requests_waiting.min(self.awaiting_count[k]);
                let queued = if self.awaiting_count[k] > 0 {
                    self.awaiting_tokens[k].max(0.0) * waiting as f64
                        / self.awaiting_count[k] as f64
                } else {
                    0.0
                };
                EngineLoad {
                    queued_prefill_tokens: queued + picker_share,
                    context_length: self.setup.context_length,
                    scheduled_decode_kv: m.kv_cache_usage * max_kv,
                    queued_decode_kv: 0.0,
                    max_kv_tokens: max_kv,
                }
            })
            .collect();
        let inputs = LoadInputs {
            engines: PerRole::Aggregated { worker: &loads },
            current: PerRole::Aggregated {
                worker: self.target,
            },
            rolling_out: self.rolling_out(),
        };
        let gpus = PerRole::Aggregated {
            worker: self.setup.gpus_per_engine(),
        };
        let mut d = decide_load(&inputs, self.setup.load_target, gpus, &self.setup.limits);
        if self.mode == PlannerMode::ThroughputLoad {
            d = floor_by_throughput(d, PerRole::Aggregated { worker: self.floor });
        }
        self.apply(d, now_ms, None)
    }

    /// Takes decision `d` at `now_ms`; `rate` is the forecast it was sized for (req/s).
    fn apply(&mut self, d: Decision, now_ms: f64, rate: Option<f64>) -> anyhow::Result<()> {
        self.decisions += 1;
        let PerRole::Aggregated { worker: n } = d.replicas else {
            anyhow::bail!("an aggregated graph got a disaggregated decision: {d}");
        };
        self.scale_logged(n, now_ms, rate, || match rate {
            Some(r) => format!("{d} (forecast {r:.1} req/s)"),
            None => d.to_string(),
        })
    }

    /// Scales to `n` at `now_ms`, logged as a scaling (`decision` says why) when it
    /// changes the count; `rate` is the forecast it was sized for (req/s).
    fn scale_logged(
        &mut self,
        n: u32,
        now_ms: f64,
        rate: Option<f64>,
        decision: impl FnOnce() -> String,
    ) -> anyhow::Result<()> {
        if n != self.target {
            self.scalings.push(ScaleRecord {
                t_s: now_ms / 1000.0,
                from: self.target,
                to: n,
                forecast_rate: rate,
                decision: decision(),
            });
            self.scale_to(n, now_ms)?;
        }
        Ok(())
    }

    fn next_arrival_ms(&self) -> f64 {
        let arrival = self.arrivals_ms.get(self.next_arrival);
        arrival.copied().unwrap_or(f64::INFINITY)
    }

    /// The planner's next tick: none for a static run, and none once the schedule is
    /// over and nothing is left to do.
    fn next_tick_ms(&self) -> f64 {
        let busy =
            !self.picker_queue.is_empty() || self.cluster.engines().iter().any(Engine::has_work);
        match self.tick_ms() {
            Some(ms) => {
                let t = self.next_tick as f64 * ms;
                if t <= self.schedule_end_ms || self.next_arrival_ms().is_finite() || busy {
                    t
                } else {
                    f64::INFINITY
                }
            }
            None => f64::INFINITY,
        }
    }

    fn tick_ms(&self) -> Option<f64> {
        match self.mode {
            PlannerMode::Throughput => Some(self.setup.interval_s * 1000.0),
            PlannerMode::Load | PlannerMode::ThroughputLoad => {
                Some(self.setup.load_interval_s * 1000.0)
            }
            PlannerMode::Static(_) | PlannerMode::Scheduled { .. } => None,
        }
    }

    fn next_entry_ms(&self) -> f64 {
        self.timetable
            .get(self.next_entry)
            .map_or(f64::INFINITY, |&(ms, _)| ms)
    }

    /// The timetable's entry at `now_ms`.
    fn scheduled(&mut self, now_ms: f64) -> anyhow::Result<()> {
        let (_, n) = self.timetable[self.next_entry];
        self.next_entry += 1;
        let from = self.target;
        self.scale_logged(n, now_ms, None, || format!("scheduled: {from} -> {n}"))
    }
}

/// The events: arrivals, planner ticks, engines becoming ready.
impl Driver for Sim<'_> {
    type Shown = StepOutcome;
    type Error = anyhow::Error;

    fn cluster(&mut self) -> &mut SimCluster {
        &mut self.cluster
    }

    fn next_event_ms(&self) -> Option<f64> {
        let arrival = self.next_arrival_ms();
        Some(
            arrival
                .min(self.next_tick_ms())
                .min(self.next_ready_ms())
                .min(self.next_entry_ms()),
        )
    }

    fn stepped(&mut self, k: usize, o: StepOutcome) -> anyhow::Result<StepOutcome> {
        self.take_step(k, &o);
        Ok(o)
    }

    fn after_step(&mut self, k: usize) -> anyhow::Result<()> {
        self.drain_picker_queue(k);
        Ok(())
    }

    /// At equal times: an engine becoming ready, then the planner, then an arrival.
    fn event(&mut self, now_ms: f64) -> anyhow::Result<()> {
        if self.next_ready_ms() == now_ms {
            for k in 0..self.slots.len() {
                if self.slots[k].state == (SlotState::Starting { ready_ms: now_ms }) {
                    self.slots[k].state = SlotState::Serving;
                    self.changes.push((now_ms, Change::Ready));
                    self.drain_picker_queue(k);
                }
            }
            return Ok(());
        }
        if self.next_entry_ms() == now_ms {
            return self.scheduled(now_ms);
        }
        if self.next_tick_ms() == now_ms {
            let next_tick = self.next_tick;
            match self.mode {
                PlannerMode::Throughput => self.throughput_tick(next_tick, now_ms)?,
                PlannerMode::Load => self.load_tick(now_ms)?,
                PlannerMode::ThroughputLoad => {
                    // Every `per`-th load tick is also a throughput tick, taken first.
                    if next_tick.is_multiple_of(self.per) {
                        self.throughput_tick(next_tick / self.per, now_ms)?;
                    }
                    self.load_tick(now_ms)?;
                }
                PlannerMode::Static(_) | PlannerMode::Scheduled { .. } => {}
            }
            self.next_tick += 1;
            return Ok(());
        }
        self.next_arrival += 1;
        self.arrive(self.next_arrival - 1, now_ms)
    }
}

/// `Scheduled`'s timetable: for each step of `schedule` (but a pause), the replicas
/// [`PlannerSetup::replicas_for`] gives its rate at the workload's mean ISL and OSL,
/// within the GPU budget, due `lead_s` before the step starts, or at its start when the
/// lead is positive and the step needs fewer than the one before; the first step's from
/// the start. The replicas to start with (the last entry due at 0 or before; 1 if none)
/// and the later entries, (ms, replicas) in time order.
fn timetable(
    workload: &Workload,
    schedule: &RateSchedule,
    setup: &PlannerSetup,
    lead_s: i32,
) -> (u32, Vec<(f64, u32)>) {
    let n = workload.len().max(1) as f64;
    let (isl, osl) =
        (0..workload.len())
            .map(|i| workload.request(i))
            .fold((0.0, 0.0), |(i, o), w| {
                (
                    i + w.token_ids.len() as f64 / n,
                    o + w.max_tokens as f64 / n,
                )
            });
    let most = (setup.limits.max_gpu_budget / setup.gpus_per_engine()).max(1);
    let mut start_ms = 0.0;
    let mut last = None;
    let mut out = Vec::new();
    for step in schedule.steps() {
        if step.rate > 0.0 {
            let n = setup.replicas_for(step.rate, isl, osl).min(most);
            // The graph starts sized for the schedule's start. Early only to add:
            // replicas removed before their step would serve the end of the busier
            // one with fewer.
            let at_start = start_ms == 0.0;
            let early = lead_s > 0 && last.is_some_and(|m| n < m);
            let shift_s = if at_start || early { 0 } else { lead_s };
            out.push((start_ms - f64::from(shift_s) * 1000.0, n));
            last = Some(n);
        }
        start_ms += step.duration_s * 1000.0;
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    let due = out.partition_point(|&(ms, _)| ms <= 0.0);
    let initial = due.checked_sub(1).map_or(1, |i| out[i].1);
    (initial, out.split_off(due))
}

/// Runs `workload` (request `i` arriving at `arrivals_ms[i]`, which follow `schedule`)
/// through an aggregated graph of engines whose replicas `mode` sets (module doc).
pub fn simulate(
    workload: &Workload,
    arrivals_ms: &[f64],
    schedule: &RateSchedule,
    setup: &PlannerSetup,
    mode: PlannerMode,
) -> anyhow::Result<PlannerRun> {
    anyhow::ensure!(
        workload.conversations().is_none(),
        "the planner replay sends requests, not conversations"
    );
    check_arrivals(workload, arrivals_ms)?;
    for (name, v, min) in [
        ("interval", setup.interval_s, f64::MIN_POSITIVE),
        ("load interval", setup.load_interval_s, f64::MIN_POSITIVE),
        ("startup time", setup.startup_s, 0.0),
        ("context length", setup.context_length, f64::MIN_POSITIVE),
    ] {
        anyhow::ensure!(
            v.is_finite() && v >= min,
            "the {name} must be a finite number >= {min}"
        );
    }
    setup.router.validate()?;
    setup.engine.validate()?;
    let started = Instant::now();
    let (initial, timetable) = match mode {
        PlannerMode::Static(n) => (n, Vec::new()),
        PlannerMode::Scheduled { lead_s } => timetable(workload, schedule, setup, lead_s),
        _ => (
            setup.initial_replicas.max(setup.limits.min_endpoint).max(1),
            Vec::new(),
        ),
    };
    // The KV index's bound: every engine that may exist at once.
    let most = u64::from(initial)
        .max(u64::from(setup.limits.max_gpu_budget) / u64::from(setup.gpus_per_engine()));
    let capacity = (most as usize).max(1) * setup.engine.num_gpu_blocks;
    let predictor = || setup.predictor.build();
    let hasher = Engine::simulated(setup.engine.clone())?.hasher().clone();
    let mut sim = Sim {
        setup,
        mode,
        workload,
        arrivals_ms,
        hasher,
        cluster: SimCluster::new(Vec::new()),
        slots: Vec::new(),
        router: KvRouter::new(setup.router, capacity),
        collector: Collector::default(),
        awaiting: HashMap::new(),
        awaiting_tokens: Vec::new(),
        awaiting_count: Vec::new(),
        picker_queue: VecDeque::new(),
        picker_queued_tokens: 0.0,
        windows: BTreeMap::new(),
        window_ms: setup.interval_s * 1000.0,
        outcomes: vec![None; workload.len()],
        rejected: 0,
        changes: Vec::new(),
        scalings: Vec::new(),
        decisions: 0,
        target: initial,
        // Until the first throughput decision, the replicas it started with.
        floor: initial,
        last_token_ms: 0.0,
        predictors: [predictor()?, predictor()?, predictor()?],
        scale_down: ScaleDownWindow::new(setup.headroom.scale_down_window.as_secs_f64()),
        schedule_end_ms: schedule.duration_s() * 1000.0,
        per: (setup.interval_s / setup.load_interval_s).round().max(1.0) as u64,
        next_tick: 1,
        next_arrival: 0,
        timetable,
        next_entry: 0,
    };
    sim.changes.push((0.0, Change::Target(initial)));
    for _ in 0..initial {
        sim.add_engine(0.0, 0.0)?;
    }
    anyhow::ensure!(
        mode != PlannerMode::ThroughputLoad
            || (sim.per as f64 * setup.load_interval_s - setup.interval_s).abs() < 1e-9,
        "throughput+load needs the interval ({} s) to be a whole number of load intervals ({} s)",
        setup.interval_s,
        setup.load_interval_s
    );
    sim.run()?;
    anyhow::ensure!(
        sim.picker_queue.is_empty(),
        "{} requests left in the picker's queue",
        sim.picker_queue.len()
    );
    let schedule_end_ms = sim.schedule_end_ms;
    let end_ms = schedule_end_ms.max(sim.last_token_ms);
    let gpus = f64::from(setup.gpus_per_engine());
    let gpu_seconds = sim
        .slots
        .iter()
        .map(|s| (s.gone_ms.unwrap_or(end_ms) - s.created_ms) / 1000.0 * gpus)
        .sum();
    // Attainment, overall and per step of the schedule (by arrival).
    let mut bounds = Vec::new();
    let mut t = 0.0;
    for s in schedule.steps() {
        t += s.duration_s * 1000.0;
        bounds.push(t);
    }
    let mut attainment = Attainment::default();
    let mut per_step = vec![Attainment::default(); bounds.len()];
    let targets = setup.targets;
    for (i, o) in sim.outcomes.iter().enumerate() {
        let step = bounds
            .partition_point(|&b| b <= arrivals_ms[i])
            .min(bounds.len().saturating_sub(1));
        let (ttft_ok, itl_ok) = match o {
            Some(o) => (
                o.ttft_ms <= targets.ttft_ms,
                o.itl_ms.is_none_or(|x| x <= targets.itl_ms),
            ),
            None => (false, false),
        };
        attainment.count(ttft_ok, itl_ok);
        per_step[step].count(ttft_ok, itl_ok);
    }
    let completed = sim.outcomes.iter().filter(|o| o.is_some()).count();
    let report = std::mem::take(&mut sim.collector).report(
        sim.cluster.engines(),
        workload.len(),
        sim.rejected,
        0.0,
    );
    let timeline = timeline(&mut sim.changes);
    let min_replicas = timeline.iter().map(|p| p.replicas).min().unwrap_or(initial);
    let max_replicas = timeline.iter().map(|p| p.replicas).max().unwrap_or(initial);
    Ok(PlannerRun {
        label: mode.to_string(),
        requests: workload.len(),
        completed,
        rejected: sim.rejected,
        attainment,
        per_step,
        gpu_seconds,
        duration_s: end_ms / 1000.0,
        ttft_ms: report.ttft_ms,
        itl_ms: report.itl_ms,
        min_replicas,
        max_replicas,
        scalings: sim.scalings,
        decisions: sim.decisions,
        timeline,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// The replica counts after each moment something changed, in time order.
fn timeline(changes: &mut [(f64, Change)]) -> Vec<TimelinePoint> {
    changes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut points: Vec<TimelinePoint> = Vec::new();
    let mut p = TimelinePoint {
        t_s: 0.0,
        replicas: 0,
        serving: 0,
        starting: 0,
        draining: 0,
    };
    for &(t_ms, change) in changes.iter() {
        match change {
            Change::Target(n) => p.replicas = n,
            Change::Created => p.starting += 1,
            Change::Ready => {
                p.starting -= 1;
                p.serving += 1;
            }
            Change::Drained => {
                p.serving -= 1;
                p.draining += 1;
            }
            Change::Gone => p.draining -= 1,
        }
        p.t_s = t_ms / 1000.0;
        match points.last_mut() {
            Some(last) if last.t_s == p.t_s => *last = p,
            _ => points.push(p),
        }
    }
    points
}

/// A planner run against one static count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Versus {
    /// The planner's run (`throughput`, `load`).
    pub planner: String,
    /// Which static count: `best static`, `same cost`, `equal cost` or `peak` (see
    /// [`compare`]).
    pub against: &'static str,
    /// Replicas of the static count; fractional for `equal cost`, between two counts.
    pub static_replicas: f64,
    pub planner_breaches: usize,
    pub static_breaches: usize,
    /// `(static - planner) / static` breaches, %: how many fewer the planner had
    /// (negative: more); `None` when the static count had none.
    pub fewer_breaches_pct: Option<f64>,
    pub planner_gpu_seconds: f64,
    pub static_gpu_seconds: f64,
    /// The planner's GPU-seconds / the static count's: below 1 the planner is cheaper.
    pub gpu_seconds_ratio: f64,
}

/// Each planner run of `runs` against the static runs among them:
/// - `best static`: the cheapest static count whose attainment of both targets is at
///   least the planner's; if none reaches it, the one with the best attainment (the
///   cheaper on a tie);
/// - `same cost`: the cheapest static count that costs at least the planner's
///   GPU-seconds (what the planner's budget buys statically, rounded up);
/// - `equal cost`: the static counts on either side of the planner's GPU-seconds,
///   interpolated linearly to exactly its cost (replicas and breaches); absent when no
///   two counts run bracket it;
/// - `peak`: `static:peak`, the count sized for the schedule's peak
///   ([`PlannerSetup::replicas_for`] at the peak rate), when it ran.
pub fn compare(runs: &[PlannerRun], peak: u32) -> Vec<Versus> {
    let mut statics: Vec<(u32, &PlannerRun)> = runs
        .iter()
        .filter_map(|r| match PlannerMode::parse(&r.label) {
            Ok(PlannerMode::Static(n)) => Some((n, r)),
            _ => None,
        })
        .collect();
    statics.sort_by_key(|(n, _)| *n);
    let mut out = Vec::new();
    for p in runs.iter().filter(|r| !r.label.starts_with("static")) {
        let both = p.attainment.both_pct();
        let cheapest = |ok: &dyn Fn(&PlannerRun) -> bool| {
            statics
                .iter()
                .filter(|(_, r)| ok(r))
                .min_by_key(|(n, _)| *n)
                .copied()
        };
        let best = cheapest(&|r| r.attainment.both_pct() >= both).or_else(|| {
            statics.iter().copied().max_by(|a, b| {
                a.1.attainment
                    .both_pct()
                    .total_cmp(&b.1.attainment.both_pct())
                    .then(b.0.cmp(&a.0))
            })
        });
        let same_cost = cheapest(&|r| r.gpu_seconds >= p.gpu_seconds);
        let peak_run = statics.iter().find(|(n, _)| *n == peak).copied();
        let versus = |against, n: f64, sb: f64, gpu_seconds: f64| {
            let pb = p.breaches();
            Versus {
                planner: p.label.clone(),
                against,
                static_replicas: n,
                planner_breaches: pb,
                static_breaches: sb.round() as usize,
                fewer_breaches_pct: (sb > 0.0).then(|| (sb - pb as f64) * 100.0 / sb),
                planner_gpu_seconds: p.gpu_seconds,
                static_gpu_seconds: gpu_seconds,
                gpu_seconds_ratio: p.gpu_seconds / gpu_seconds.max(f64::MIN_POSITIVE),
            }
        };
        for (against, s) in [
            ("best static", best),
            ("same cost", same_cost),
            ("peak", peak_run),
        ] {
            let Some((n, s)) = s else { continue };
            out.push(versus(
                against,
                f64::from(n),
                s.breaches() as f64,
                s.gpu_seconds,
            ));
        }
        let bracket = statics
            .windows(2)
            .find(|w| w[0].1.gpu_seconds <= p.gpu_seconds && p.gpu_seconds <= w[1].1.gpu_seconds);
        if let Some([(na, a), (nb, b)]) = bracket {
            let span = b.gpu_seconds - a.gpu_seconds;
            let f = if span > 0.0 {
                (p.gpu_seconds - a.gpu_seconds) / span
            } else {
                0.0
            };
            let lerp = |x: f64, y: f64| x + f * (y - x);
            out.push(versus(
                "equal cost",
                lerp(f64::from(*na), f64::from(*nb)),
                lerp(a.breaches() as f64, b.breaches() as f64),
                p.gpu_seconds,
            ));
        }
    }
    out
}

/// The runs' table: replicas, GPU-seconds, attainment, breaches, latencies.
pub fn runs_table(runs: &[PlannerRun]) -> String {
    let mut md = String::from(
        "| run | replicas min-max | changes | GPU-s | TTFT attainment | ITL attainment | both | SLA breaches | TTFT p50 / p99 ms | ITL p50 / p99 ms |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let a = &r.attainment;
        md.push_str(&format!(
            "| {} | {}-{} | {} | {:.0} | {:.1}% | {:.1}% | {:.1}% | {} of {} | {:.0} / {:.0} | {:.1} / {:.1} |\n",
            r.label,
            r.min_replicas,
            r.max_replicas,
            r.replica_changes(),
            r.gpu_seconds,
            a.ttft_pct(),
            a.itl_pct(),
            a.both_pct(),
            a.breaches(),
            a.requests,
            r.ttft_ms.p50,
            r.ttft_ms.p99,
            r.itl_ms.p50,
            r.itl_ms.p99,
        ));
    }
    md
}

/// The comparison table ([`compare`]).
pub fn versus_table(versus: &[Versus]) -> String {
    let mut md = String::from(
        "| planner | against | static replicas | SLA breaches planner / static | fewer breaches | GPU-s planner / static |\n|---|---|---|---|---|---|\n",
    );
    for v in versus {
        let fewer = match v.fewer_breaches_pct {
            Some(p) => format!("{p:.0}%"),
            None => "n/a (static had none)".to_owned(),
        };
        md.push_str(&format!(
            "| {} | {} | {} | {} / {} | {} | {:.0} / {:.0} = {:.2} |\n",
            v.planner,
            v.against,
            if v.static_replicas.fract() == 0.0 {
                format!("{:.0}", v.static_replicas)
            } else {
                format!("{:.2}", v.static_replicas)
            },
            v.planner_breaches,
            v.static_breaches,
            fewer,
            v.planner_gpu_seconds,
            v.static_gpu_seconds,
            v.gpu_seconds_ratio,
        ));
    }
    md
}

/// Attainment of both targets per step of `schedule` (by arrival), one row per run.
pub fn steps_table(runs: &[PlannerRun], schedule: &RateSchedule) -> String {
    let steps = schedule.steps();
    let mut md = String::from("| run |");
    for (i, s) in steps.iter().enumerate() {
        md.push_str(&format!(
            " step {} ({} req/s x {} s) |",
            i + 1,
            s.rate,
            s.duration_s
        ));
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(steps.len()));
    md.push('\n');
    for r in runs {
        md.push_str(&format!("| {} |", r.label));
        for a in &r.per_step {
            let n = a.breaches();
            let noun = if n == 1 { "breach" } else { "breaches" };
            md.push_str(&format!(" {:.1}% ({n} {noun}) |", a.both_pct()));
        }
        md.push('\n');
    }
    md
}

/// A run's replica timeline: the moments the set replicas or the serving engines
/// changed.
pub fn timeline_table(run: &PlannerRun) -> String {
    let mut md = String::from(
        "| t (s) | replicas set | serving | starting | draining |\n|---|---|---|---|---|\n",
    );
    for p in &run.timeline {
        md.push_str(&format!(
            "| {:.1} | {} | {} | {} | {} |\n",
            p.t_s, p.replicas, p.serving, p.starting, p.draining
        ));
    }
    md
}

/// Every run's timeline as CSV: `run,t_s,replicas,serving,starting,draining`.
pub fn timeline_csv(runs: &[PlannerRun]) -> String {
    let mut csv = String::from("run,t_s,replicas,serving,starting,draining\n");
    for r in runs {
        for p in &r.timeline {
            csv.push_str(&format!(
                "{},{:.3},{},{},{},{}\n",
                r.label, p.t_s, p.replicas, p.serving, p.starting, p.draining
            ));
        }
    }
    csv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for (text, mode) in [
            ("throughput", PlannerMode::Throughput),
            (" LOAD ", PlannerMode::Load),
            ("throughput+load", PlannerMode::ThroughputLoad),
            ("load+throughput", PlannerMode::ThroughputLoad),
            ("static:3", PlannerMode::Static(3)),
            ("scheduled", PlannerMode::Scheduled { lead_s: 0 }),
            ("scheduled:4", PlannerMode::Scheduled { lead_s: 4 }),
            ("scheduled:-2", PlannerMode::Scheduled { lead_s: -2 }),
        ] {
            assert_eq!(PlannerMode::parse(text), Ok(mode), "{text}");
            assert_eq!(PlannerMode::parse(&mode.to_string()), Ok(mode));
        }
        for bad in ["", "static", "static:0", "static:-1", "static:x", "sla"] {
            let err = PlannerMode::parse(bad).unwrap_err();
            assert!(
                err.contains("throughput, load") || err.contains("static:N takes"),
                "{bad}: {err}"
            );
        }
        for bad in ["scheduled:", "scheduled:1.5", "scheduled:x"] {
            let err = PlannerMode::parse(bad).unwrap_err();
            assert!(
                err.contains("scheduled:LEAD takes whole seconds"),
                "{bad}: {err}"
            );
        }
        assert!(PlannerMode::Static(1).is_static() && !PlannerMode::Load.is_static());
    }

    #[test]
    fn the_timeline_replays_changes_in_time_order() {
        // Two engines serve; a scale-up to 3 at 10 s (ready at 40 s); a scale-down to 1
        // at 100 s whose two engines drain at 103 and 101 s (recorded out of order).
        let mut changes = vec![
            (0.0, Change::Target(2)),
            (0.0, Change::Created),
            (0.0, Change::Ready),
            (0.0, Change::Created),
            (0.0, Change::Ready),
            (10_000.0, Change::Created),
            (10_000.0, Change::Target(3)),
            (40_000.0, Change::Ready),
            (100_000.0, Change::Drained),
            (100_000.0, Change::Drained),
            (100_000.0, Change::Target(1)),
            (103_000.0, Change::Gone),
            (101_000.0, Change::Gone),
        ];
        let t = timeline(&mut changes);
        let at = |t_s, replicas, serving, starting, draining| TimelinePoint {
            t_s,
            replicas,
            serving,
            starting,
            draining,
        };
        assert_eq!(
            t,
            [
                at(0.0, 2, 2, 0, 0),
                at(10.0, 3, 2, 1, 0),
                at(40.0, 3, 3, 0, 0),
                at(100.0, 1, 1, 0, 2),
                at(101.0, 1, 1, 0, 1),
                at(103.0, 1, 1, 0, 0),
            ]
        );
    }

    fn fake(label: &str, both_ok: usize, gpu_seconds: f64) -> PlannerRun {
        PlannerRun {
            label: label.into(),
            requests: 100,
            completed: 100,
            rejected: 0,
            attainment: Attainment {
                requests: 100,
                ttft_ok: both_ok,
                itl_ok: 100,
                both_ok,
            },
            per_step: Vec::new(),
            gpu_seconds,
            duration_s: 100.0,
            ttft_ms: Percentiles::default(),
            itl_ms: Percentiles::default(),
            min_replicas: 1,
            max_replicas: 1,
            scalings: Vec::new(),
            decisions: 0,
            timeline: Vec::new(),
            wall_s: 0.0,
        }
    }

    #[test]
    fn the_planner_is_compared_with_the_best_the_same_cost_and_the_peak_static() {
        let runs = [
            fake("throughput", 90, 250.0),
            fake("static:1", 40, 100.0),
            fake("static:2", 80, 200.0),
            fake("static:3", 95, 300.0),
            fake("static:4", 100, 400.0),
        ];
        let v = compare(&runs, 4);
        let by = |against: &str| v.iter().find(|x| x.against == against).unwrap();
        // Best: the cheapest reaching 90%: static:3 (5 breaches to the planner's 10).
        let best = by("best static");
        assert_eq!(
            (
                best.static_replicas,
                best.planner_breaches,
                best.static_breaches
            ),
            (3.0, 10, 5)
        );
        assert_eq!(best.fewer_breaches_pct, Some(-100.0));
        // Same cost: the cheapest at 250 GPU-s or more, static:3 again.
        assert_eq!(by("same cost").static_replicas, 3.0);
        // Equal cost: halfway between static:2 (20 breaches) and static:3 (5), 12.5.
        let equal = by("equal cost");
        assert_eq!(
            (equal.static_replicas, equal.static_gpu_seconds),
            (2.5, 250.0)
        );
        assert_eq!(equal.fewer_breaches_pct, Some(20.0));
        // Peak: static:4, with no breaches: no ratio.
        let peak = by("peak");
        assert_eq!((peak.static_replicas, peak.fewer_breaches_pct), (4.0, None));
        assert!((peak.gpu_seconds_ratio - 0.625).abs() < 1e-12);
        // Against static:2 the planner had 10 breaches to 20: 50% fewer.
        let v = compare(&runs[..3], 2);
        let peak = v.iter().find(|x| x.against == "peak").unwrap();
        assert_eq!(peak.fewer_breaches_pct, Some(50.0));
        // No static reaches the planner: the best attainment stands in.
        assert_eq!(
            v.iter()
                .find(|x| x.against == "best static")
                .unwrap()
                .static_replicas,
            2.0
        );
        assert!(
            v.iter()
                .all(|x| x.against != "same cost" && x.against != "equal cost")
        );
        let md = versus_table(&v);
        assert!(
            md.contains("| throughput | peak | 2 | 10 / 20 | 50% | 250 / 200 = 1.25 |"),
            "{md}"
        );
    }
}
