//! Load mode: replicas from the engines' queues and KV usage now.

use super::*;

/// One engine's load, as load mode reads it (Dynamo's ForwardPassMetrics / router gauges).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineLoad {
    /// Prompt tokens waiting to be prefilled.
    pub queued_prefill_tokens: f64,
    /// The model's context length (the prefill queue is measured in full-context prompts).
    pub context_length: f64,
    /// KV tokens of sequences scheduled to decode.
    pub scheduled_decode_kv: f64,
    /// KV tokens of sequences waiting to decode.
    pub queued_decode_kv: f64,
    /// The engine's KV capacity, tokens.
    pub max_kv_tokens: f64,
}

/// What load mode optimises for (Dynamo's `optimization_target`), which sets thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LoadTarget {
    #[default]
    Throughput,
    Latency,
}

/// Scale-up and scale-down thresholds of one metric (`load_scaling.py`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// Scale up when some engine's metric is at or past this (see `up_inclusive`).
    pub up: f64,
    /// `>=` (prefill queue) rather than `>` (decode KV) at `up`.
    pub up_inclusive: bool,
    /// Scale down when every engine's metric is under this, or `<= 0` when it is 0.
    pub down: f64,
}

impl Thresholds {
    fn over(&self, x: f64) -> bool {
        if self.up_inclusive {
            x >= self.up
        } else {
            x > self.up
        }
    }

    fn under(&self, x: f64) -> bool {
        if self.down == 0.0 {
            x <= 0.0
        } else {
            x < self.down
        }
    }
}

impl LoadTarget {
    /// Prefill queue ratio `queued_prefill_tokens / context_length`: throughput up >= 1.0,
    /// down < 0.1; latency up >= 0.1, down == 0.
    pub fn prefill(self) -> Thresholds {
        match self {
            LoadTarget::Throughput => Thresholds {
                up: 1.0,
                up_inclusive: true,
                down: 0.1,
            },
            LoadTarget::Latency => Thresholds {
                up: 0.1,
                up_inclusive: true,
                down: 0.0,
            },
        }
    }

    /// Decode KV use `(scheduled + queued decode KV) / max_kv_tokens`: throughput up > 1.0,
    /// down < 0.6; latency up > 0.4, down < 0.1.
    pub fn decode(self) -> Thresholds {
        match self {
            LoadTarget::Throughput => Thresholds {
                up: 1.0,
                up_inclusive: false,
                down: 0.6,
            },
            LoadTarget::Latency => Thresholds {
                up: 0.4,
                up_inclusive: false,
                down: 0.1,
            },
        }
    }
}

impl EngineLoad {
    fn check(&self) -> Result<(), Reason> {
        for (input, v) in [
            ("queued prefill tokens", self.queued_prefill_tokens),
            ("scheduled decode kv", self.scheduled_decode_kv),
            ("queued decode kv", self.queued_decode_kv),
        ] {
            required(input, Some(v))?;
        }
        for (input, v) in [
            ("context length", self.context_length),
            ("max kv tokens", self.max_kv_tokens),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(Reason::InvalidInput { input, value: v });
            }
        }
        Ok(())
    }

    /// `queued_prefill_tokens / context_length`.
    pub fn prefill_ratio(&self) -> f64 {
        self.queued_prefill_tokens / self.context_length
    }

    /// `(scheduled + queued decode KV) / max_kv_tokens`; an aggregated worker also counts
    /// its queued prefill tokens, which will occupy KV once prefilled (as Dynamo's agg).
    pub fn decode_usage(&self, aggregated: bool) -> f64 {
        let extra = if aggregated {
            self.queued_prefill_tokens
        } else {
            0.0
        };
        (self.scheduled_decode_kv + self.queued_decode_kv + extra) / self.max_kv_tokens
    }
}

/// Load mode's inputs: the engines of each role that reported this interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadInputs<'a> {
    pub engines: PerRole<&'a [EngineLoad]>,
    pub current: Replicas,
    pub rolling_out: bool,
}

/// The direction load mode takes for one role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Up,
    Down,
    Stay,
}

/// One role's load step over its engines' metrics (one `Vec` per metric the role is judged
/// on, with that metric's thresholds): up if ANY engine crosses ANY up threshold; down only
/// if ALL engines are under EVERY down threshold, the role is above the minimum, and the
/// consolidation check passes: each metric's mean over the `n` engines, re-spread over
/// `n - 1` (`mean * n / (n - 1)`), must stay clear of its up threshold, or the next
/// interval would scale straight back up (the 2<->1 oscillation, Dynamo PR #9294).
fn load_step(metrics: &[(Vec<f64>, Thresholds)], replicas: u32, min: u32) -> (Step, bool) {
    if metrics.iter().any(|(xs, t)| xs.iter().any(|&x| t.over(x))) {
        return (Step::Up, false);
    }
    let all_under = metrics.iter().all(|(xs, t)| xs.iter().all(|&x| t.under(x)));
    if !all_under || replicas <= min {
        return (Step::Stay, false);
    }
    let n = f64::from(replicas);
    let fits = metrics.iter().all(|(xs, t)| {
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        !t.over(mean * n / (n - 1.0))
    });
    if fits {
        (Step::Down, false)
    } else {
        (Step::Stay, true)
    }
}

/// Load mode: +1 / -1 / 0 replicas per role from the engines' queue and KV metrics
/// (thresholds in [`LoadTarget`]), then the safeguards. Disaggregated: prefill engines are
/// judged on the prefill queue ratio, decode engines on decode KV usage. Aggregated:
/// workers on both (KV usage counting queued prefill tokens). Held when a previous change
/// is rolling out, when a role has no reports, when the number of reports differs from its
/// replicas (a pod starting or gone: the metrics would be misread), or on a bad value.
pub fn decide_load(
    inputs: &LoadInputs<'_>,
    target: LoadTarget,
    gpus: PerRole<u32>,
    limits: &Limits,
) -> Decision {
    let current = inputs.current;
    if inputs.rolling_out {
        return Decision::hold(current, Reason::RollingOut);
    }
    let Some(paired) = current.zip(&inputs.engines, |role, n, e| (role, n, e)) else {
        return Decision::hold(current, Reason::ShapeMismatch);
    };
    if current.zip(&gpus, |_, _, _| ()).is_none() {
        return Decision::hold(current, Reason::ShapeMismatch);
    }
    for (_, (role, n, engines)) in paired.iter() {
        if engines.is_empty() {
            return Decision::hold(
                current,
                Reason::MissingInput {
                    input: "engine load metrics",
                },
            );
        }
        if engines.len() != n as usize {
            return Decision::hold(
                current,
                Reason::WorkerCountMismatch {
                    role,
                    engines: engines.len(),
                    replicas: n,
                },
            );
        }
        if let Some(reason) = engines.iter().find_map(|e| e.check().err()) {
            return Decision::hold(current, reason);
        }
    }
    let min = limits.min_endpoint.max(1);
    let mut reasons = Vec::new();
    let proposed = paired.map(|_, (role, n, engines)| {
        let metrics = match role {
            Role::Prefill => vec![(
                engines.iter().map(EngineLoad::prefill_ratio).collect(),
                target.prefill(),
            )],
            Role::Decode => vec![(
                engines.iter().map(|e| e.decode_usage(false)).collect(),
                target.decode(),
            )],
            Role::Aggregated => vec![
                (
                    engines.iter().map(EngineLoad::prefill_ratio).collect(),
                    target.prefill(),
                ),
                (
                    engines.iter().map(|e| e.decode_usage(true)).collect(),
                    target.decode(),
                ),
            ],
        };
        let (step, blocked) = load_step(&metrics, n, min);
        if blocked {
            reasons.push(Reason::ConsolidationBlocked { role });
        }
        match step {
            Step::Up => {
                reasons.push(Reason::LoadUp { role });
                n.saturating_add(1)
            }
            Step::Down => {
                reasons.push(Reason::LoadDown { role });
                n - 1
            }
            Step::Stay => {
                reasons.push(Reason::LoadSteady { role });
                n
            }
        }
    });
    limits.apply(current, proposed, gpus, reasons)
}

/// Throughput+load's floor for [`floor_by_throughput`]: what throughput mode would set
/// now, rolling out or not, and without the scale-down window (load mode steps down one
/// replica at a time, on the queues now, which the window's dips do not show); `None`
/// when the decision holds.
pub fn throughput_floor(
    config: &ThroughputConfig<'_>,
    inputs: &ThroughputInputs,
) -> Option<Replicas> {
    let unheld = ThroughputInputs {
        rolling_out: false,
        ..*inputs
    };
    let d = decide_throughput(config, &unheld);
    (!d.is_hold()).then_some(d.replicas)
}

/// Throughput+load, as Dynamo runs both together (`scale_down_capped_by_throughput`): a
/// load decision takes a role down no further than `floor`, what the last throughput
/// decision asked for, or the current count if that is lower. Scale-ups and holds pass
/// as they are, and so does a decision whose shape is not the floor's.
pub fn floor_by_throughput(mut decision: Decision, floor: Replicas) -> Decision {
    if decision.is_hold() {
        return decision;
    }
    let current = decision.current;
    let Some(floored) = decision.replicas.zip(&floor, |role, n, floor| {
        (role, n.max(floor.min(current.get(role).unwrap_or(n))))
    }) else {
        return decision;
    };
    for (_, (role, n)) in floored.iter() {
        if decision.replicas.get(role) != Some(n) {
            decision
                .reasons
                .push(Reason::ThroughputFloor { role, floor: n });
        }
    }
    decision.replicas = floored.map(|_, (_, n)| n);
    decision
}
