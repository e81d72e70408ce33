//! Replica decisions: from a forecast and a profile (throughput mode), or from per-engine
//! queues and KV usage (load mode), then through the safeguards. Pure functions: the
//! planner service gathers the numbers, calls one of [`decide_throughput`] /
//! [`decide_load`], and writes (or, in advisory mode, only logs) the [`Decision`].
//!
//! Formulas, thresholds and defaults follow Dynamo's planner (`planner_design.md`,
//! `planner_config.py`/`defaults.py`, `core/load_scaling.py`; summarised in
//! `../shared/research/pillars.md` section 4). Where we differ, the item says so.
//!
//! Safeguards ([`Limits::apply`]):
//! 1. a decision is *held* (replicas unchanged, with the reason) while a previous change is
//!    rolling out, when an input is missing or not a finite non-negative number, or when
//!    the engines reporting do not match the replicas (Dynamo's `worker_count_mismatch`);
//!    so missing data never scales anything, least of all to zero;
//! 2. no role goes below `min_endpoint` (default 1; 0 is read as 1: never scale to zero);
//! 3. a role moves at most `max_step` replicas per decision (Dynamo's
//!    `max_throughput_scaling_replicas`, default 8), toward the budgeted proposal;
//! 4. the total stays within `max_gpu_budget` (default 8); if the roles want more, the
//!    budget is split in proportion to the GPUs each wants and the decision says
//!    `capped` with what was wanted. The budget is split on the whole proposal before
//!    the step cap, and checked again after it; the minimum wins over the budget (a
//!    budget below the minimums is a configuration error, reported as capped).
//!
//! Throughput mode sizes for a target utilization below 1 and for the backlog as well as
//! the forecast ([`demand`]); the planner service and the replay take its decisions
//! through a [`ScaleDownWindow`], so replicas go down only once no decision within it
//! asked for them.
//!
//! Scale-down is consolidation-aware (Dynamo PR #9294, after 2<->1 oscillation under
//! constant load): going from N to fewer replicas is taken only if the load re-spread
//! over the fewer replicas still meets the targets. In throughput mode that re-prediction
//! *is* the formula (`ceil(demand / capacity)` is the fewest replicas whose share is
//! within capacity), so a constant forecast gives one answer whatever the current count;
//! load mode checks it explicitly ([`decide_load`]).

use std::fmt;

use dynamo_names::Role;

use crate::profile::Profile;

mod load;
mod throughput;
mod window;

pub use load::*;
pub use throughput::*;
pub use window::ScaleDownWindow;

/// One value per role of a disaggregated or an aggregated graph (replicas, GPUs per engine,
/// engine observations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerRole<T> {
    Disaggregated { prefill: T, decode: T },
    Aggregated { worker: T },
}

/// Replicas per role.
pub type Replicas = PerRole<u32>;

impl<T: Copy> PerRole<T> {
    /// `(role, value)` pairs in a fixed order (prefill before decode).
    pub fn iter(&self) -> impl Iterator<Item = (Role, T)> {
        let v: Vec<(Role, T)> = match *self {
            PerRole::Disaggregated { prefill, decode } => {
                vec![(Role::Prefill, prefill), (Role::Decode, decode)]
            }
            PerRole::Aggregated { worker } => vec![(Role::Aggregated, worker)],
        };
        v.into_iter()
    }

    /// Applies `f` to every role's value, keeping the shape.
    pub fn map<U>(&self, mut f: impl FnMut(Role, T) -> U) -> PerRole<U> {
        match *self {
            PerRole::Disaggregated { prefill, decode } => PerRole::Disaggregated {
                prefill: f(Role::Prefill, prefill),
                decode: f(Role::Decode, decode),
            },
            PerRole::Aggregated { worker } => PerRole::Aggregated {
                worker: f(Role::Aggregated, worker),
            },
        }
    }

    /// Combines two values of the same shape; `None` when one is disaggregated and the
    /// other aggregated.
    pub fn zip<U: Copy, V>(
        &self,
        other: &PerRole<U>,
        mut f: impl FnMut(Role, T, U) -> V,
    ) -> Option<PerRole<V>> {
        match (*self, *other) {
            (
                PerRole::Disaggregated { prefill, decode },
                PerRole::Disaggregated {
                    prefill: p2,
                    decode: d2,
                },
            ) => Some(PerRole::Disaggregated {
                prefill: f(Role::Prefill, prefill, p2),
                decode: f(Role::Decode, decode, d2),
            }),
            (PerRole::Aggregated { worker }, PerRole::Aggregated { worker: w2 }) => {
                Some(PerRole::Aggregated {
                    worker: f(Role::Aggregated, worker, w2),
                })
            }
            _ => None,
        }
    }

    pub fn get(&self, role: Role) -> Option<T> {
        self.iter().find(|(r, _)| *r == role).map(|(_, v)| v)
    }
}

impl fmt::Display for Replicas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (role, n) in self.iter() {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "{role}={n}")?;
        }
        Ok(())
    }
}

/// Latency targets. Defaults are Dynamo's `SLAPlannerDefaults`: TTFT 500 ms, ITL 50 ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlaTargets {
    pub ttft_ms: f64,
    pub itl_ms: f64,
}

impl Default for SlaTargets {
    fn default() -> Self {
        Self {
            ttft_ms: 500.0,
            itl_ms: 50.0,
        }
    }
}

/// The safeguards' knobs. Defaults are Dynamo's: `min_endpoint` 1, `max_gpu_budget` 8,
/// `max_throughput_scaling_replicas` 8.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Fewest replicas per role; 0 is read as 1 (never scale to zero).
    pub min_endpoint: u32,
    /// Most GPUs all roles together may use.
    pub max_gpu_budget: u32,
    /// Most replicas one role may move per decision; 0 is read as 1 (freezing is what
    /// advisory mode is for).
    pub max_step: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            min_endpoint: 1,
            max_gpu_budget: 8,
            max_step: 8,
        }
    }
}

/// Why a decision is what it is. [`Reason::label`] is a fixed, low-cardinality string for a
/// metric label; `Display` carries the details for logs.
#[derive(Clone, Debug, PartialEq)]
pub enum Reason {
    /// Throughput mode sized `role` at `wanted` replicas from the forecast and profile.
    Throughput { role: Role, wanted: u32 },
    /// Load mode: an engine of `role` crossed its scale-up threshold.
    LoadUp { role: Role },
    /// Load mode: every engine of `role` is under its scale-down threshold.
    LoadDown { role: Role },
    /// Load mode: `role` is between thresholds, or at its minimum.
    LoadSteady { role: Role },
    /// A scale-down of `role` refused: the load spread over one replica fewer would cross
    /// the scale-up threshold (the 2<->1 oscillation guard).
    ConsolidationBlocked { role: Role },
    /// Held: a previous change is still rolling out.
    RollingOut,
    /// Held: an input the decision needs is absent.
    MissingInput { input: &'static str },
    /// Held: an input is NaN, infinite or negative.
    InvalidInput { input: &'static str, value: f64 },
    /// Held: `engines` engines of `role` reported but `replicas` are configured.
    WorkerCountMismatch {
        role: Role,
        engines: usize,
        replicas: u32,
    },
    /// Held: the current replicas, GPUs per engine or engine reports are not all for the
    /// same graph shape (disaggregated vs aggregated).
    ShapeMismatch,
    /// Correction factors were not applied (disabled, or the observation was missing).
    NoCorrection { which: &'static str },
    /// The ITL target is below every measured ITL: decode sized at the lightest point.
    ItlUnreachable,
    /// `role` raised to the minimum endpoint count.
    MinEndpoint { role: Role },
    /// `role` wanted `wanted` but moved only `max_step`.
    StepCapped { role: Role, wanted: u32 },
    /// The roles wanted `wanted_gpus` GPUs, more than the budget.
    GpuBudget { wanted_gpus: u64, budget: u32 },
    /// `role` asked for `wanted`, fewer than it has, but a decision within the scale-down
    /// window asked for more ([`ScaleDownWindow`]).
    ScaleDownWindow { role: Role, wanted: u32 },
    /// Throughput+load: load mode's scale-down of `role` stopped at `floor`, what the last
    /// throughput decision asked for ([`floor_by_throughput`]).
    ThroughputFloor { role: Role, floor: u32 },
}

impl Reason {
    /// The metric label value.
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Throughput { .. } => "throughput",
            Reason::LoadUp { .. } => "load_up",
            Reason::LoadDown { .. } => "load_down",
            Reason::LoadSteady { .. } => "load_steady",
            Reason::ConsolidationBlocked { .. } => "consolidation_blocked",
            Reason::RollingOut => "rolling_out",
            Reason::MissingInput { .. } => "missing_input",
            Reason::InvalidInput { .. } => "invalid_input",
            Reason::WorkerCountMismatch { .. } => "worker_count_mismatch",
            Reason::ShapeMismatch => "shape_mismatch",
            Reason::NoCorrection { .. } => "no_correction",
            Reason::ItlUnreachable => "itl_unreachable",
            Reason::MinEndpoint { .. } => "min_endpoint",
            Reason::StepCapped { .. } => "step_capped",
            Reason::GpuBudget { .. } => "gpu_budget",
            Reason::ScaleDownWindow { .. } => "scale_down_window",
            Reason::ThroughputFloor { .. } => "throughput_floor",
        }
    }

    /// Whether this reason makes the decision a hold (nothing computed, nothing changed).
    pub fn is_hold(&self) -> bool {
        matches!(
            self,
            Reason::RollingOut
                | Reason::MissingInput { .. }
                | Reason::InvalidInput { .. }
                | Reason::WorkerCountMismatch { .. }
                | Reason::ShapeMismatch
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Throughput { role, wanted } => {
                write!(f, "throughput: {role} needs {wanted}")
            }
            Reason::LoadUp { role } => write!(f, "load: a {role} engine is over its threshold"),
            Reason::LoadDown { role } => {
                write!(f, "load: every {role} engine is under its threshold")
            }
            Reason::LoadSteady { role } => write!(f, "load: {role} steady"),
            Reason::ConsolidationBlocked { role } => write!(
                f,
                "{role} scale-down refused: one replica fewer would cross the scale-up threshold"
            ),
            Reason::RollingOut => f.write_str("hold: previous change still rolling out"),
            Reason::MissingInput { input } => write!(f, "hold: no {input}"),
            Reason::InvalidInput { input, value } => write!(f, "hold: {input} is {value}"),
            Reason::WorkerCountMismatch {
                role,
                engines,
                replicas,
            } => write!(
                f,
                "hold: {engines} {role} engines reported, {replicas} replicas configured"
            ),
            Reason::ShapeMismatch => f.write_str("hold: inputs disagree on the graph's roles"),
            Reason::NoCorrection { which } => write!(f, "{which} correction not applied"),
            Reason::ItlUnreachable => {
                f.write_str("ITL target below every profiled ITL: sized at the lightest load")
            }
            Reason::MinEndpoint { role } => write!(f, "{role} raised to the minimum"),
            Reason::StepCapped { role, wanted } => {
                write!(f, "{role} step capped (wanted {wanted})")
            }
            Reason::GpuBudget {
                wanted_gpus,
                budget,
            } => write!(
                f,
                "capped by the GPU budget: wanted {wanted_gpus} GPUs of {budget}"
            ),
            Reason::ScaleDownWindow { role, wanted } => write!(
                f,
                "{role} kept: asked {wanted}, but more within the scale-down window"
            ),
            Reason::ThroughputFloor { role, floor } => write!(
                f,
                "{role} scale-down stopped at {floor}: the last throughput decision's count"
            ),
        }
    }
}

/// What the planner will do (or, in advisory mode, would do).
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Replicas before this decision.
    pub current: Replicas,
    /// Replicas to set (equal to `current` on a hold).
    pub replicas: Replicas,
    /// Why, in the order the steps ran.
    pub reasons: Vec<Reason>,
    /// True when the GPU budget cut the proposal; `wanted` is then what was wanted.
    pub capped: bool,
    /// The proposal before the GPU budget and the step cap (after the minimum).
    pub wanted: Replicas,
}

impl Decision {
    /// Keeps the current replicas, for `reason`.
    pub fn hold(current: Replicas, reason: Reason) -> Self {
        Self {
            current,
            replicas: current,
            reasons: vec![reason],
            capped: false,
            wanted: current,
        }
    }

    /// True when the decision was held rather than computed.
    pub fn is_hold(&self) -> bool {
        self.reasons.iter().any(Reason::is_hold)
    }

    /// True when some role's replicas change.
    pub fn changes(&self) -> bool {
        self.replicas != self.current
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = if self.is_hold() {
            "hold"
        } else if self.changes() {
            "scale"
        } else {
            "keep"
        };
        write!(f, "{verb} {} -> {}", self.current, self.replicas)?;
        if self.capped {
            write!(f, " (capped, wanted {})", self.wanted)?;
        }
        let mut sep = ": ";
        for r in &self.reasons {
            write!(f, "{sep}{r}")?;
            sep = "; ";
        }
        Ok(())
    }
}

impl Limits {
    /// Applies the minimum, the GPU budget and the step cap to `proposed` (see the module
    /// doc). The budget is split on the whole proposal, before the step cap, so the target
    /// the steps walk toward depends only on demand: under constant demand the walk ends
    /// at a fixed point. `reasons` already holds the mode's own reasons; this appends.
    pub fn apply(
        &self,
        current: Replicas,
        proposed: Replicas,
        gpus: PerRole<u32>,
        mut reasons: Vec<Reason>,
    ) -> Decision {
        let floored = at_least_min(proposed, self.min_endpoint, &mut reasons);
        let Some((budgeted, mut capped)) = fit_budget(floored, gpus, self, &mut reasons) else {
            return Decision::hold(current, Reason::ShapeMismatch);
        };
        let Some(stepped) = cap_step(current, budgeted, self.max_step, &mut reasons) else {
            return Decision::hold(current, Reason::ShapeMismatch);
        };
        // A step from below the minimum may stop short of it; the minimum wins.
        let stepped = at_least_min(stepped, self.min_endpoint, &mut reasons);
        // A step can still exceed the budget when the current replicas already do, or when
        // one role's engines have more GPUs than the other's: the budget wins.
        let Some((replicas, again)) = fit_budget(stepped, gpus, self, &mut reasons) else {
            return Decision::hold(current, Reason::ShapeMismatch);
        };
        capped |= again;
        Decision {
            current,
            replicas,
            reasons,
            capped,
            wanted: floored,
        }
    }
}

/// Appends `reason` unless an equal one is already there (a step may run twice).
fn note(reasons: &mut Vec<Reason>, reason: Reason) {
    if !reasons.contains(&reason) {
        reasons.push(reason);
    }
}

/// Moves each role at most `max_step` (0 read as 1) from `current` toward `proposed`.
pub fn cap_step(
    current: Replicas,
    proposed: Replicas,
    max_step: u32,
    reasons: &mut Vec<Reason>,
) -> Option<Replicas> {
    let step = max_step.max(1);
    current.zip(&proposed, |role, cur, want| {
        let capped = want.clamp(cur.saturating_sub(step), cur.saturating_add(step));
        if capped != want {
            reasons.push(Reason::StepCapped { role, wanted: want });
        }
        capped
    })
}

/// Raises each role to `min_endpoint` (0 read as 1: never zero replicas).
pub fn at_least_min(proposed: Replicas, min_endpoint: u32, reasons: &mut Vec<Reason>) -> Replicas {
    let min = min_endpoint.max(1);
    proposed.map(|role, n| {
        if n < min {
            note(reasons, Reason::MinEndpoint { role });
            min
        } else {
            n
        }
    })
}

/// Fits `wanted` into `limits.max_gpu_budget`. When over, each role's share of the budget
/// is proportional to the GPUs it wants; a role gets `floor(share / gpus_per_engine)`
/// replicas (at least the minimum), then whole GPUs left over go one replica at a time to
/// the role furthest below what it wanted (relative), if its engine fits. Returns the
/// replicas and whether they were capped; `None` on a shape mismatch.
pub fn fit_budget(
    wanted: Replicas,
    gpus: PerRole<u32>,
    limits: &Limits,
    reasons: &mut Vec<Reason>,
) -> Option<(Replicas, bool)> {
    let per = wanted.zip(&gpus, |_, n, g| (n, g.max(1)))?;
    let total: u64 = per
        .iter()
        .map(|(_, (n, g))| u64::from(n) * u64::from(g))
        .sum();
    let budget = u64::from(limits.max_gpu_budget);
    if total <= budget {
        return Some((wanted, false));
    }
    note(
        reasons,
        Reason::GpuBudget {
            wanted_gpus: total,
            budget: limits.max_gpu_budget,
        },
    );
    let min = limits.min_endpoint.max(1);
    let mut got = per.map(|_, (n, g)| {
        let share = budget as f64 * (f64::from(n) * f64::from(g)) / total as f64;
        ((share / f64::from(g)).floor() as u32).clamp(min.min(n), n)
    });
    loop {
        let used: u64 = got
            .zip(&per, |_, k, (_, g)| u64::from(k) * u64::from(g))?
            .iter()
            .map(|(_, x)| x)
            .sum();
        let left = budget.saturating_sub(used);
        // The role furthest below its want, relative to it, whose engine fits in `left`.
        let next = got
            .zip(&per, |role, k, (n, g)| (role, k, n, g))?
            .iter()
            .filter(|(_, (_, k, n, g))| k < n && u64::from(*g) <= left)
            .map(|(_, (role, k, n, _))| (role, f64::from(n - k) / f64::from(n)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((role, _)) = next else { break };
        got = got.map(|r, k| if r == role { k + 1 } else { k });
    }
    Some((got, true))
}

/// A number that must be present, finite and `>= 0`, or the reason to hold.
fn required(input: &'static str, v: Option<f64>) -> Result<f64, Reason> {
    match v {
        None => Err(Reason::MissingInput { input }),
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Some(x) => Err(Reason::InvalidInput { input, value: x }),
    }
}

#[cfg(test)]
mod tests;
