//! One planning interval, without I/O: what was read (the graph, Prometheus' numbers or why
//! they could not be read) in, a [`Decision`] out. The service around it reads and writes;
//! everything it decides is tested here with plain numbers.

use dynamo_names::Role;
use dynamo_planner::decide::{
    Decision, EngineLoad, Forecast, Limits, LoadInputs, LoadTarget, Observed, PerRole, Reason,
    Replicas, ScaleDownWindow, SlaTargets, ThroughputConfig, ThroughputInputs, decide_load,
    floor_by_throughput, throughput_floor,
};
use dynamo_planner::knobs::HeadroomKnobs;
use dynamo_planner::predict::{LoadPredictor, Predictor, PredictorConfig};
use dynamo_planner::profile::Profile;

use super::target::{GraphView, ShapeError};

/// The frontend's traffic over the last interval. `None`: the series is absent; NaN: it
/// is there but had no samples (a mean over no requests).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    pub requests: Option<f64>,
    pub isl: Option<f64>,
    pub osl: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub itl_ms: Option<f64>,
    /// Mean request duration, for the decode concurrency (Little's law).
    pub duration_s: Option<f64>,
    /// Requests waiting now, in the picker's queue or an engine's.
    pub backlog: f64,
}

/// Which side of the graph a worker serves, as the picker labels it (`worker_type`): an
/// aggregated worker reports as decode, as Dynamo's do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerKind {
    Prefill,
    Decode,
}

/// One engine's load now.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineReading {
    pub worker_id: String,
    pub kind: WorkerKind,
    pub prefill_tokens: f64,
    /// KV tokens held by decoding sequences; `None` when the picker has no block size.
    pub decode_kv_tokens: Option<f64>,
    /// The engine's KV pool in tokens; `None` until its engine reported its block count.
    pub max_kv_tokens: Option<f64>,
}

/// What a load decision reads: each engine's load now, and the prompt tokens of the
/// requests the picker holds because every engine was saturated, which whichever
/// engines take prompts will serve.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadReading {
    pub engines: Vec<EngineReading>,
    pub picker_queued_tokens: f64,
}

/// What Prometheus gave this interval, or why it gave nothing.
pub type Reading<T> = Result<T, String>;

/// Throughput mode's own settings: the engines' profiles.
#[derive(Debug)]
pub struct ThroughputMode {
    pub prefill_profile: Profile,
    pub decode_profile: Profile,
    pub correction: bool,
}

/// Load mode's own settings.
#[derive(Clone, Copy, Debug)]
pub struct LoadMode {
    pub target: LoadTarget,
    /// The model's context length: the prefill queue is measured in full contexts.
    pub context_length: f64,
}

#[derive(Debug)]
pub enum Mode {
    Throughput(ThroughputMode),
    Load(LoadMode),
    /// Throughput decisions every interval, load decisions every `load_interval_s`
    /// between them, which scale down no further than the last throughput decision.
    ThroughputLoad {
        throughput: ThroughputMode,
        load: LoadMode,
        load_interval_s: f64,
    },
}

/// Which kind of decision an interval takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tick {
    Throughput,
    Load,
}

#[derive(Debug)]
pub struct Settings {
    pub mode: Mode,
    pub targets: SlaTargets,
    pub limits: Limits,
    /// GPUs per engine: prefill's and decode's (an aggregated worker uses decode's).
    pub prefill_gpus: u32,
    pub decode_gpus: u32,
    /// Seconds between throughput decisions (load decisions in load mode).
    pub interval_s: f64,
    /// Throughput mode's target utilization and scale-down window.
    pub headroom: HeadroomKnobs,
}

impl Settings {
    /// The decision loops the service runs: each kind of decision and the seconds
    /// between two of them.
    pub fn loops(&self) -> Vec<(Tick, f64)> {
        match self.mode {
            Mode::Throughput(_) => vec![(Tick::Throughput, self.interval_s)],
            Mode::Load(_) => vec![(Tick::Load, self.interval_s)],
            Mode::ThroughputLoad {
                load_interval_s, ..
            } => vec![
                (Tick::Throughput, self.interval_s),
                (Tick::Load, load_interval_s),
            ],
        }
    }
}

/// The planner's state across intervals: its predictors and its recent decisions.
pub struct Planner {
    settings: Settings,
    requests: LoadPredictor,
    isl: LoadPredictor,
    osl: LoadPredictor,
    scale_down: ScaleDownWindow,
    /// Throughput+load: what the last throughput look asked for, rolling out or not.
    floor: Option<Replicas>,
}

/// One interval's outcome.
pub struct Outcome {
    pub decision: Decision,
    /// Throughput mode's forecast, once the graph could be read.
    pub forecast: Option<Forecast>,
}

impl Planner {
    pub fn new(settings: Settings, predictor: &PredictorConfig) -> Result<Self, String> {
        let build = || predictor.build().map_err(|e| e.to_string());
        Ok(Self {
            scale_down: ScaleDownWindow::new(settings.headroom.scale_down_window.as_secs_f64()),
            settings,
            requests: build()?,
            isl: build()?,
            osl: build()?,
            floor: None,
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn gpus(&self, current: Replicas) -> PerRole<u32> {
        match current {
            PerRole::Disaggregated { .. } => PerRole::Disaggregated {
                prefill: self.settings.prefill_gpus,
                decode: self.settings.decode_gpus,
            },
            PerRole::Aggregated { .. } => PerRole::Aggregated {
                worker: self.settings.decode_gpus,
            },
        }
    }

    /// The throughput decision at `now_s` (seconds on any clock that only goes forward)
    /// for the graph as read, from this interval's traffic; it goes through the
    /// scale-down window. Nothing here scales on missing data: an unreadable Prometheus
    /// (or a mode without profiles) holds the current replicas, and says why.
    pub fn plan_throughput(
        &mut self,
        now_s: f64,
        view: &GraphView,
        traffic: &Reading<Traffic>,
    ) -> Result<Outcome, ShapeError> {
        let current = view.replicas()?;
        let (Mode::Throughput(mode)
        | Mode::ThroughputLoad {
            throughput: mode, ..
        }) = &self.settings.mode
        else {
            return Ok(missing(current, "throughput profile (load mode)"));
        };
        let Ok(traffic) = traffic else {
            return Ok(missing(current, "frontend metrics from Prometheus"));
        };
        let Some(requests) = traffic.requests else {
            return Ok(missing(current, "request count series"));
        };
        // Invalid values (NaN means no requests) are dropped by the predictors.
        self.requests.observe(requests);
        if let Some(v) = traffic.isl {
            self.isl.observe(v);
        }
        if let Some(v) = traffic.osl {
            self.osl.observe(v);
        }
        let mut forecast = Forecast {
            requests: self.requests.predict(),
            isl: self.isl.predict(),
            osl: self.osl.predict(),
        };
        // No requests ahead means no tokens ahead, whatever their length would be.
        if forecast.requests == Some(0.0) {
            forecast.isl = forecast.isl.or(Some(0.0));
            forecast.osl = forecast.osl.or(Some(0.0));
        }
        let interval = self.settings.interval_s;
        let decode_replicas = match current {
            PerRole::Disaggregated { decode, .. } => decode,
            PerRole::Aggregated { worker } => worker,
        };
        // Little's law: sequences in flight = arrival rate x time in the system.
        let decode_concurrency = match (traffic.requests, traffic.duration_s) {
            (Some(n), Some(d)) if decode_replicas > 0 => {
                Some(n / interval * d / f64::from(decode_replicas))
            }
            _ => None,
        };
        let config = ThroughputConfig {
            targets: self.settings.targets,
            prefill_profile: &mode.prefill_profile,
            decode_profile: &mode.decode_profile,
            gpus: self.gpus(current),
            correction: mode.correction,
            target_utilization: self.settings.headroom.target_utilization,
            limits: self.settings.limits,
        };
        let inputs = ThroughputInputs {
            forecast,
            observed: Observed {
                ttft_ms: traffic.ttft_ms,
                itl_ms: traffic.itl_ms,
                isl: traffic.isl,
                osl: traffic.osl,
                decode_concurrency,
            },
            interval_s: interval,
            current,
            rolling_out: view.rolling_out(),
            backlog: traffic.backlog,
        };
        self.floor = throughput_floor(&config, &inputs).or(self.floor);
        Ok(Outcome {
            decision: self.scale_down.decide_throughput(now_s, &config, &inputs),
            forecast: Some(forecast),
        })
    }

    /// The load decision for the graph as read, from each engine's load now (the
    /// picker's queue shared evenly by the engines that take prompts: prefill engines,
    /// or aggregated workers); in throughput+load it scales down no further than the
    /// last throughput decision asked.
    pub fn plan_load(
        &mut self,
        view: &GraphView,
        reading: &Reading<LoadReading>,
    ) -> Result<Outcome, ShapeError> {
        let current = view.replicas()?;
        let (Mode::Load(mode) | Mode::ThroughputLoad { load: mode, .. }) = &self.settings.mode
        else {
            return Ok(missing(current, "load thresholds (throughput mode)"));
        };
        let Ok(reading) = reading else {
            return Ok(missing(current, "engine load metrics from Prometheus"));
        };
        let prompts_kind = match current {
            PerRole::Disaggregated { .. } => WorkerKind::Prefill,
            PerRole::Aggregated { .. } => WorkerKind::Decode,
        };
        let takers = reading.engines.iter().filter(|r| r.kind == prompts_kind);
        let picker_share = reading.picker_queued_tokens / takers.count().max(1) as f64;
        let load = |kind: WorkerKind| -> Vec<EngineLoad> {
            let share = if kind == prompts_kind {
                picker_share
            } else {
                0.0
            };
            reading
                .engines
                .iter()
                .filter(|r| r.kind == kind)
                .map(|r| EngineLoad {
                    queued_prefill_tokens: r.prefill_tokens + share,
                    context_length: mode.context_length,
                    scheduled_decode_kv: r.decode_kv_tokens.unwrap_or(f64::NAN),
                    queued_decode_kv: 0.0,
                    max_kv_tokens: r.max_kv_tokens.unwrap_or(f64::NAN),
                })
                .collect()
        };
        let (prefill, decode) = (load(WorkerKind::Prefill), load(WorkerKind::Decode));
        let engines = match current {
            PerRole::Disaggregated { .. } => PerRole::Disaggregated {
                prefill: prefill.as_slice(),
                decode: decode.as_slice(),
            },
            PerRole::Aggregated { .. } => PerRole::Aggregated {
                worker: decode.as_slice(),
            },
        };
        let inputs = LoadInputs {
            engines,
            current,
            rolling_out: view.rolling_out(),
        };
        let mut decision = decide_load(
            &inputs,
            mode.target,
            self.gpus(current),
            &self.settings.limits,
        );
        if let Some(floor) = self.floor {
            decision = floor_by_throughput(decision, floor);
        }
        Ok(Outcome {
            decision,
            forecast: None,
        })
    }
}

fn missing(current: Replicas, input: &'static str) -> Outcome {
    Outcome {
        decision: Decision::hold(current, Reason::MissingInput { input }),
        forecast: None,
    }
}

/// The role whose service a decision changes, with the new count, in write order:
/// scale-ups before scale-downs, so capacity is added before any is taken away.
pub fn writes(view: &GraphView, decision: &Decision) -> Vec<(String, u32)> {
    let mut changes: Vec<(Role, u32, u32)> = decision
        .replicas
        .iter()
        .filter_map(|(role, n)| {
            let service = view.service(role)?;
            (service.replicas != n).then_some((role, service.replicas, n))
        })
        .collect();
    changes.sort_by_key(|&(_, from, to)| to < from);
    changes
        .into_iter()
        .filter_map(|(role, _, n)| Some((view.service(role)?.name.clone(), n)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dynamo_planner::predict::PredictorKind;

    use super::*;
    use crate::target::ServiceView;

    /// One engine prefills 10,000 tokens/s and decodes 1,000 tokens/s within any ITL.
    fn profile() -> Profile {
        Profile::from_json(
            r#"{"gpus_per_engine": 1,
                "prefill": [{"isl": 100, "ttft_ms": 10.0, "throughput_per_gpu": 10000.0},
                            {"isl": 4000, "ttft_ms": 400.0, "throughput_per_gpu": 10000.0}],
                "decode": [{"context_length": 100, "concurrency": 1, "itl_ms": 10.0, "throughput_per_gpu": 1000.0},
                           {"context_length": 4000, "concurrency": 1, "itl_ms": 10.0, "throughput_per_gpu": 1000.0}]}"#,
        )
        .unwrap()
    }

    fn planner(mode: Mode) -> Planner {
        let settings = Settings {
            mode,
            targets: SlaTargets {
                ttft_ms: 500.0,
                itl_ms: 50.0,
            },
            limits: Limits::default(),
            prefill_gpus: 1,
            decode_gpus: 1,
            interval_s: 10.0,
            headroom: HeadroomKnobs {
                target_utilization: 1.0,
                scale_down_window: Duration::ZERO,
            },
        };
        Planner::new(settings, &PredictorConfig::new(PredictorKind::Constant)).unwrap()
    }

    fn throughput_mode() -> ThroughputMode {
        ThroughputMode {
            prefill_profile: profile(),
            decode_profile: profile(),
            correction: false,
        }
    }

    fn throughput() -> Planner {
        planner(Mode::Throughput(throughput_mode()))
    }

    fn workers(replicas: u32) -> GraphView {
        GraphView {
            services: vec![ServiceView {
                name: "worker".into(),
                role: Role::Aggregated,
                replicas,
                rolling_out: false,
            }],
        }
    }

    fn traffic(requests: f64) -> Reading<Traffic> {
        Ok(Traffic {
            requests: Some(requests),
            isl: Some(1000.0),
            osl: Some(100.0),
            ttft_ms: Some(100.0),
            itl_ms: Some(10.0),
            duration_s: Some(1.0),
            backlog: 0.0,
        })
    }

    #[test]
    fn throughput_mode_sizes_workers_from_the_traffic() {
        let mut p = throughput();
        // 200 requests in 10 s: 20,000 prompt tokens/s (2 engines) + 2,000 output tokens/s
        // (2 engines) = 4 workers.
        let out = p
            .plan_throughput(0.0, &workers(1), &traffic(200.0))
            .unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 4 });
        assert_eq!(
            writes(&workers(1), &out.decision),
            [("worker".to_string(), 4)]
        );
        // The load falls to a quarter: one worker, never zero when it stops.
        let out = p.plan_throughput(0.0, &workers(4), &traffic(50.0)).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 1 });
        let out = p.plan_throughput(0.0, &workers(1), &traffic(0.0)).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 1 });
    }

    #[test]
    fn the_backlog_and_the_headroom_add_workers_and_a_dip_waits_out_the_window() {
        let mut p = throughput();
        p.settings.headroom.target_utilization = 0.8;
        p.scale_down = ScaleDownWindow::new(30.0);
        // 100 requests forecast and 100 waiting: as 200 in the interval (4 engines' worth),
        // at 0.8 utilization ceil(4 / 0.8) = 5 workers.
        let waiting = Ok(Traffic {
            backlog: 100.0,
            ..traffic(100.0).unwrap()
        });
        let out = p.plan_throughput(0.0, &workers(1), &waiting).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 5 });
        // The backlog is served: the forecast's 2 engines' worth is 3 workers, at once
        // (the window records asks without the backlog).
        let out = p
            .plan_throughput(20.0, &workers(5), &traffic(100.0))
            .unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 3 });
        // A dip to 1 engine's worth (2 workers) waits until the ask for 3 is 30 s old.
        let out = p
            .plan_throughput(40.0, &workers(3), &traffic(50.0))
            .unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 3 });
        assert!(
            out.decision.reasons.contains(&Reason::ScaleDownWindow {
                role: Role::Aggregated,
                wanted: 2
            }),
            "{}",
            out.decision
        );
        let out = p
            .plan_throughput(60.0, &workers(3), &traffic(50.0))
            .unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 2 });
    }

    #[test]
    fn no_prometheus_or_no_series_holds_the_replicas() {
        let mut p = throughput();
        for reading in [
            Err("connection refused".to_string()),
            Ok(Traffic::default()),
        ] {
            let out = p.plan_throughput(0.0, &workers(3), &reading).unwrap();
            assert!(out.decision.is_hold(), "{}", out.decision);
            assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 3 });
            assert!(writes(&workers(3), &out.decision).is_empty());
        }
    }

    #[test]
    fn nan_means_are_not_predicted_from() {
        let mut p = throughput();
        p.plan_throughput(0.0, &workers(1), &traffic(200.0))
            .unwrap();
        // An interval whose means are NaN (no samples) keeps the last valid lengths.
        let idle = Ok(Traffic {
            requests: Some(200.0),
            isl: Some(f64::NAN),
            osl: Some(f64::NAN),
            ..Traffic::default()
        });
        let out = p.plan_throughput(0.0, &workers(4), &idle).unwrap();
        assert_eq!(out.forecast.unwrap().isl, Some(1000.0));
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 4 });
    }

    #[test]
    fn a_rollout_in_progress_holds_all_but_a_scale_up() {
        let mut p = throughput();
        let mut view = workers(5);
        view.services[0].rolling_out = true;
        let out = p.plan_throughput(0.0, &view, &traffic(50.0)).unwrap();
        assert_eq!(out.decision.reasons, [Reason::RollingOut]);
        let mut view = workers(1);
        view.services[0].rolling_out = true;
        let out = p.plan_throughput(0.0, &view, &traffic(200.0)).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 4 });
    }

    const LOAD: LoadMode = LoadMode {
        target: LoadTarget::Throughput,
        context_length: 1000.0,
    };

    /// Throughput+load, a load decision every 2 s.
    fn both() -> Planner {
        planner(Mode::ThroughputLoad {
            throughput: throughput_mode(),
            load: LOAD,
            load_interval_s: 2.0,
        })
    }

    fn engine(prefill_tokens: f64) -> EngineReading {
        EngineReading {
            worker_id: "a".into(),
            kind: WorkerKind::Decode,
            prefill_tokens,
            decode_kv_tokens: Some(100.0),
            max_kv_tokens: Some(10_000.0),
        }
    }

    fn reading(engines: Vec<EngineReading>) -> Reading<LoadReading> {
        Ok(LoadReading {
            engines,
            picker_queued_tokens: 0.0,
        })
    }

    #[test]
    fn the_pickers_queue_is_shared_by_the_engines_that_take_prompts() {
        let mut p = planner(Mode::Load(LOAD));
        let idle = |picker_queued_tokens| {
            Ok(LoadReading {
                engines: (0..2).map(|_| engine(0.0)).collect(),
                picker_queued_tokens,
            })
        };
        // Every engine saturated, requests wait in the picker: its queue is theirs, half
        // each, against a scale-up threshold of a context (1000 tokens) per engine.
        let out = p.plan_load(&workers(2), &idle(2500.0)).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 3 });
        let out = p.plan_load(&workers(2), &idle(1500.0)).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 2 });
        let out = p.plan_load(&workers(2), &idle(0.0)).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 1 });
    }

    #[test]
    fn load_mode_steps_on_the_engines_queues() {
        let mut p = planner(Mode::Load(LOAD));
        let busy = reading(vec![engine(5000.0)]);
        let out = p.plan_load(&workers(1), &busy).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 2 });
        // Two workers reported as one: the counts disagree, so it holds.
        let out = p.plan_load(&workers(2), &busy).unwrap();
        assert!(out.decision.is_hold(), "{}", out.decision);
        // An engine without its KV capacity is not read as idle.
        let unknown = reading(vec![EngineReading {
            max_kv_tokens: None,
            ..engine(0.0)
        }]);
        let out = p.plan_load(&workers(1), &unknown).unwrap();
        assert!(out.decision.is_hold(), "{}", out.decision);
    }

    #[test]
    fn each_mode_runs_its_loops_and_refuses_the_other_kind_of_decision() {
        let mut p = both();
        assert_eq!(
            p.settings().loops(),
            [(Tick::Throughput, 10.0), (Tick::Load, 2.0)]
        );
        let idle = reading(vec![engine(0.0)]);
        assert!(!p.plan_load(&workers(1), &idle).unwrap().decision.is_hold());
        let mut p = planner(Mode::Load(LOAD));
        assert_eq!(p.settings().loops(), [(Tick::Load, 10.0)]);
        let out = p
            .plan_throughput(0.0, &workers(1), &traffic(200.0))
            .unwrap();
        assert!(out.decision.is_hold(), "{}", out.decision);
        let mut p = throughput();
        assert_eq!(p.settings().loops(), [(Tick::Throughput, 10.0)]);
        let out = p.plan_load(&workers(1), &idle).unwrap();
        assert!(out.decision.is_hold(), "{}", out.decision);
    }

    #[test]
    fn throughput_load_scales_up_on_a_queue_and_down_no_further_than_throughput_asked() {
        let mut p = both();
        // Throughput sizes 4 workers for 200 requests (as in throughput mode's test).
        let out = p
            .plan_throughput(0.0, &workers(1), &traffic(200.0))
            .unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 4 });
        // Between throughput decisions, a queue on one worker adds one at once.
        let queued = reading(
            (0..4)
                .map(|i| engine(if i == 0 { 5000.0 } else { 0.0 }))
                .collect(),
        );
        let out = p.plan_load(&workers(4), &queued).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 5 });
        // Every worker idle: load mode steps down, but not below throughput's 4.
        let idle = |n| reading((0..n).map(|_| engine(0.0)).collect());
        let out = p.plan_load(&workers(5), &idle(5)).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 4 });
        let out = p.plan_load(&workers(4), &idle(4)).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 4 });
        assert!(
            out.decision.reasons.contains(&Reason::ThroughputFloor {
                role: Role::Aggregated,
                floor: 4
            }),
            "{}",
            out.decision
        );
        // Once throughput asks for one worker, load mode may go down to it.
        p.plan_throughput(10.0, &workers(4), &traffic(50.0))
            .unwrap();
        let out = p.plan_load(&workers(4), &idle(4)).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 3 });
    }

    #[test]
    fn throughput_loads_floor_is_the_forecasts_need_not_the_windows() {
        let mut p = both();
        p.scale_down = ScaleDownWindow::new(30.0);
        p.plan_throughput(0.0, &workers(1), &traffic(200.0))
            .unwrap();
        // The forecast falls to one worker's worth: throughput keeps 4 for its window,
        // while load mode, seeing every worker idle, steps down one.
        let out = p
            .plan_throughput(10.0, &workers(4), &traffic(50.0))
            .unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 4 });
        let idle = reading((0..4).map(|_| engine(0.0)).collect());
        let out = p.plan_load(&workers(4), &idle).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 3 });
        // While a scale-up rolls out, the floor is what the forecast needs, not a hold.
        let mut view = workers(1);
        view.services[0].rolling_out = true;
        p.plan_throughput(20.0, &view, &traffic(200.0)).unwrap();
        let out = p.plan_load(&workers(4), &idle).unwrap();
        assert_eq!(out.decision.replicas, PerRole::Aggregated { worker: 4 });
    }

    #[test]
    fn scale_ups_are_written_before_scale_downs() {
        let view = GraphView {
            services: vec![
                ServiceView {
                    name: "p".into(),
                    role: Role::Prefill,
                    replicas: 3,
                    rolling_out: false,
                },
                ServiceView {
                    name: "d".into(),
                    role: Role::Decode,
                    replicas: 1,
                    rolling_out: false,
                },
            ],
        };
        let decision = Decision {
            current: PerRole::Disaggregated {
                prefill: 3,
                decode: 1,
            },
            replicas: PerRole::Disaggregated {
                prefill: 2,
                decode: 2,
            },
            reasons: Vec::new(),
            capped: false,
            wanted: PerRole::Disaggregated {
                prefill: 2,
                decode: 2,
            },
        };
        assert_eq!(
            writes(&view, &decision),
            [("d".to_string(), 2), ("p".to_string(), 2)]
        );
    }
}
