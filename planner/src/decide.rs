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
//! Scale-down is consolidation-aware (Dynamo PR #9294, after 2<->1 oscillation under
//! constant load): going from N to fewer replicas is taken only if the load re-spread
//! over the fewer replicas still meets the targets. In throughput mode that re-prediction
//! *is* the formula (`ceil(demand / capacity)` is the fewest replicas whose share is
//! within capacity), so a constant forecast gives one answer whatever the current count;
//! load mode checks it explicitly ([`decide_load`]).

use std::fmt;

use dynamo_names::Role;

use crate::profile::Profile;

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

/// Next-interval traffic, from the predictors. `None` is "no prediction yet".
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Forecast {
    /// Requests expected over the next interval.
    pub requests: Option<f64>,
    /// Mean input sequence length, tokens.
    pub isl: Option<f64>,
    /// Mean output sequence length, tokens.
    pub osl: Option<f64>,
}

/// What the last interval measured, for the correction factors. Each factor is applied only
/// when its inputs are all present, finite and positive; otherwise it is 1 and the decision
/// says so ([`Reason::NoCorrection`]). Missing latencies never hold a decision: an idle
/// interval has no TTFT samples, and scaling down an idle graph is right.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Observed {
    /// Mean TTFT, ms.
    pub ttft_ms: Option<f64>,
    /// Mean ITL, ms.
    pub itl_ms: Option<f64>,
    /// Mean ISL the TTFT was measured at (the expected TTFT's abscissa).
    pub isl: Option<f64>,
    /// Mean OSL, for the context length the ITL was measured at (`isl + osl / 2`).
    pub osl: Option<f64>,
    /// Mean sequences in flight per decode engine (e.g. Little's law:
    /// `requests / interval * request_duration / decode_replicas`).
    pub decode_concurrency: Option<f64>,
}

/// Throughput mode's configuration.
#[derive(Clone, Copy, Debug)]
pub struct ThroughputConfig<'a> {
    pub targets: SlaTargets,
    /// The profile of the prefill engine (its prefill points are used) and of the decode
    /// engine (its decode points). An aggregated graph passes its worker's profile as both.
    pub prefill_profile: &'a Profile,
    pub decode_profile: &'a Profile,
    /// GPUs per engine, per role.
    pub gpus: PerRole<u32>,
    /// Apply correction factors (Dynamo's `--no-correction` turns them off).
    pub correction: bool,
    pub limits: Limits,
}

/// Throughput mode's inputs for one decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThroughputInputs {
    pub forecast: Forecast,
    pub observed: Observed,
    /// The adjustment interval, seconds (Dynamo default 180).
    pub interval_s: f64,
    pub current: Replicas,
    /// A previous change is still rolling out (replicas not all updated and ready).
    pub rolling_out: bool,
}

/// Engine demand computed by throughput mode, before rounding: engines' worth of work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Demand {
    /// `predicted_load / throughput_per_gpu / gpus_per_engine` for prefill.
    pub prefill_engines: f64,
    /// The same for decode.
    pub decode_engines: f64,
}

/// A number that must be present, finite and `>= 0`, or the reason to hold.
fn required(input: &'static str, v: Option<f64>) -> Result<f64, Reason> {
    match v {
        None => Err(Reason::MissingInput { input }),
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Some(x) => Err(Reason::InvalidInput { input, value: x }),
    }
}

/// A correction input, usable only when finite and `> 0`.
fn usable(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x > 0.0)
}

/// Dynamo's throughput formulas (`planner_design.md`), with `gpus` the GPUs per engine:
///
/// ```text
/// prefill_correction = actual_ttft / expected_ttft(observed isl)
/// decode_correction  = actual_itl / expected_itl(observed context, observed concurrency)
/// predicted_load     = requests * isl / interval * min(1, prefill_correction)
/// prefill_engines    = predicted_load / prefill_throughput_per_gpu(isl) / gpus
/// corrected_itl      = target_itl / decode_correction
/// decode_engines     = requests * osl / interval
///                      / find_best_throughput_per_gpu(corrected_itl, isl + osl / 2) / gpus
/// ```
///
/// The prefill correction only ever lowers the load (`min(1, ..)`, as Dynamo): a TTFT
/// below the profile's (prefix-cache hits) means less prefill work; one above it is mostly
/// queueing, which the replicas computed from the uncorrected load already remove. Errors
/// are the reasons to hold.
pub fn demand(
    config: &ThroughputConfig<'_>,
    inputs: &ThroughputInputs,
    notes: &mut Vec<Reason>,
) -> Result<Demand, Reason> {
    let requests = required("predicted requests", inputs.forecast.requests)?;
    let isl = required("predicted isl", inputs.forecast.isl)?;
    let osl = required("predicted osl", inputs.forecast.osl)?;
    let interval = required("interval", Some(inputs.interval_s))?;
    if interval <= 0.0 {
        return Err(Reason::InvalidInput {
            input: "interval",
            value: interval,
        });
    }
    for (input, v) in [
        ("ttft target", config.targets.ttft_ms),
        ("itl target", config.targets.itl_ms),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(Reason::InvalidInput { input, value: v });
        }
    }
    let (gp, gd) = match config.gpus {
        PerRole::Disaggregated { prefill, decode } => (prefill, decode),
        PerRole::Aggregated { worker } => (worker, worker),
    };
    let (gp, gd) = (f64::from(gp.max(1)), f64::from(gd.max(1)));
    let obs = &inputs.observed;

    let mut prefill_correction = 1.0;
    let mut decode_correction = 1.0;
    if config.correction {
        match (usable(obs.ttft_ms), usable(obs.isl)) {
            (Some(ttft), Some(obs_isl)) => {
                prefill_correction = ttft / config.prefill_profile.expected_ttft_ms(obs_isl);
            }
            _ => notes.push(Reason::NoCorrection { which: "prefill" }),
        }
        match (
            usable(obs.itl_ms),
            usable(obs.isl),
            usable(obs.osl),
            usable(obs.decode_concurrency),
        ) {
            (Some(itl), Some(obs_isl), Some(obs_osl), Some(conc)) => {
                let ctx = obs_isl + obs_osl / 2.0;
                decode_correction = itl / config.decode_profile.expected_itl_ms(ctx, conc);
            }
            _ => notes.push(Reason::NoCorrection { which: "decode" }),
        }
    } else {
        notes.push(Reason::NoCorrection { which: "prefill" });
        notes.push(Reason::NoCorrection { which: "decode" });
    }

    let predicted_load = requests * isl / interval * prefill_correction.min(1.0);
    let prefill_engines =
        predicted_load / config.prefill_profile.prefill_throughput_per_gpu(isl) / gp;

    let corrected_itl = config.targets.itl_ms / decode_correction;
    let best = config
        .decode_profile
        .best_decode(corrected_itl, isl + osl / 2.0);
    if !best.meets_target {
        notes.push(Reason::ItlUnreachable);
    }
    let decode_engines = requests * osl / interval / best.throughput_per_gpu / gd;
    Ok(Demand {
        prefill_engines,
        decode_engines,
    })
}

/// Rounds engines' worth of work up to replicas, forgiving float noise (`2.0000000001`
/// is 2, not 3) so a load that exactly fills N engines asks for N.
fn engines_to_replicas(engines: f64) -> u32 {
    let r = (engines - 1e-9).ceil();
    if r <= 0.0 {
        0
    } else if r >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        r as u32
    }
}

/// Throughput mode: replicas from the forecast and the profiles, then the safeguards.
///
/// Disaggregated: prefill and decode replicas from [`demand`], each `ceil`ed. Aggregated:
/// a worker spends its GPU time on both phases, so it needs
/// `ceil(prefill_engines + decode_engines)` (the sum, not the max: two phases each at 90%
/// of an engine do not fit in one engine). Under a constant forecast the answer does not
/// depend on the current replicas, so repeated decisions converge (through the step cap)
/// and stay put.
pub fn decide_throughput(config: &ThroughputConfig<'_>, inputs: &ThroughputInputs) -> Decision {
    let current = inputs.current;
    if inputs.rolling_out {
        return Decision::hold(current, Reason::RollingOut);
    }
    if current.zip(&config.gpus, |_, _, _| ()).is_none() {
        return Decision::hold(current, Reason::ShapeMismatch);
    }
    let mut notes = Vec::new();
    let d = match demand(config, inputs, &mut notes) {
        Ok(d) => d,
        Err(reason) => return Decision::hold(current, reason),
    };
    let proposed = match current {
        PerRole::Disaggregated { .. } => PerRole::Disaggregated {
            prefill: engines_to_replicas(d.prefill_engines),
            decode: engines_to_replicas(d.decode_engines),
        },
        PerRole::Aggregated { .. } => PerRole::Aggregated {
            worker: engines_to_replicas(d.prefill_engines + d.decode_engines),
        },
    };
    let mut reasons: Vec<Reason> = proposed
        .iter()
        .map(|(role, wanted)| Reason::Throughput { role, wanted })
        .collect();
    reasons.extend(notes);
    config.limits.apply(current, proposed, config.gpus, reasons)
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::tests::sample;
    use proptest::prelude::*;

    fn disagg(prefill: u32, decode: u32) -> Replicas {
        PerRole::Disaggregated { prefill, decode }
    }

    const ONE_GPU: PerRole<u32> = PerRole::Disaggregated {
        prefill: 1,
        decode: 1,
    };

    fn big() -> Limits {
        Limits {
            max_gpu_budget: 1000,
            ..Limits::default()
        }
    }

    fn config(profile: &Profile, limits: Limits) -> ThroughputConfig<'_> {
        ThroughputConfig {
            targets: SlaTargets::default(),
            prefill_profile: profile,
            decode_profile: profile,
            gpus: ONE_GPU,
            correction: true,
            limits,
        }
    }

    /// `requests` per 180 s interval at ISL 3000, OSL 2000: decode context is
    /// 3000 + 2000 / 2 = 4000, a profiled context length, so the arithmetic stays exact.
    fn inputs(requests: f64, current: Replicas) -> ThroughputInputs {
        ThroughputInputs {
            forecast: Forecast {
                requests: Some(requests),
                isl: Some(3000.0),
                osl: Some(2000.0),
            },
            observed: Observed::default(),
            interval_s: 180.0,
            current,
            rolling_out: false,
        }
    }

    /// Observed latencies at the forecast's own ISL/OSL and concurrency 16 per decode
    /// engine, where the profile expects TTFT 400 ms and ITL 30 ms.
    fn observed(ttft_ms: f64, itl_ms: f64) -> Observed {
        Observed {
            ttft_ms: Some(ttft_ms),
            itl_ms: Some(itl_ms),
            isl: Some(3000.0),
            osl: Some(2000.0),
            decode_concurrency: Some(16.0),
        }
    }

    #[test]
    fn disaggregated_formula_by_hand() {
        let p = sample();
        // Prefill: 900 req * 3000 tok / 180 s = 15000 tok/s; 7500 tok/s/GPU at ISL 3000
        //   -> 15000 / 7500 / 1 = 2.0 -> 2.
        // Decode: 900 * 2000 / 180 = 10000 tok/s; best at ITL 50, ctx 4000 = 5400
        //   -> 10000 / 5400 = 1.85 -> 2.
        let d = decide_throughput(&config(&p, big()), &inputs(900.0, disagg(1, 1)));
        assert_eq!(d.replicas, disagg(2, 2));
        assert!(!d.capped && !d.is_hold() && d.changes());
        assert!(d.reasons.contains(&Reason::Throughput {
            role: Role::Prefill,
            wanted: 2
        }));
        // Twice the traffic: prefill 30000 / 7500 = 4; decode 20000 / 5400 = 3.7 -> 4.
        let d = decide_throughput(&config(&p, big()), &inputs(1800.0, disagg(1, 1)));
        assert_eq!(d.replicas, disagg(4, 4));
    }

    #[test]
    fn gpus_per_engine_divide_the_demand() {
        let p = sample();
        let mut c = config(&p, big());
        c.gpus = disagg(2, 2);
        // 1800 requests: prefill 4 engines' worth / 2 GPUs = 2; decode 3.7 / 2 = 1.85 -> 2.
        let d = decide_throughput(&c, &inputs(1800.0, disagg(1, 1)));
        assert_eq!(d.replicas, disagg(2, 2));
    }

    #[test]
    fn aggregated_sums_both_phases() {
        let p = sample();
        let mut c = config(&p, big());
        c.gpus = PerRole::Aggregated { worker: 1 };
        // 900 requests: prefill 2.0 + decode 1.85 = 3.85 engines -> 4 workers (max would
        // have said 2 and overloaded both phases).
        let d = decide_throughput(&c, &inputs(900.0, PerRole::Aggregated { worker: 1 }));
        assert_eq!(d.replicas, PerRole::Aggregated { worker: 4 });
    }

    #[test]
    fn decode_correction_raises_and_lowers_decode() {
        let p = sample();
        // 540 requests: decode 540 * 2000 / 180 = 6000 tok/s. Uncorrected: 6000 / 5400 =
        // 1.11 -> 2. Prefill 540 * 3000 / 180 = 9000 / 7500 = 1.2 -> 2 throughout.
        let base = decide_throughput(&config(&p, big()), &inputs(540.0, disagg(2, 2)));
        assert_eq!(base.replicas, disagg(2, 2));
        assert!(
            base.reasons
                .contains(&Reason::NoCorrection { which: "decode" })
        );

        // ITL 60 observed where the profile expects 30: correction 2, corrected ITL 25.
        // At ctx 4000: between (12 ms, 800) and (30 ms, 5000): t = 13/18 -> 3833.3.
        // 6000 / 3833.3 = 1.57 -> 2; with 900 requests 10000 / 3833.3 = 2.6 -> 3 (was 2).
        let mut i = inputs(900.0, disagg(2, 2));
        i.observed = observed(400.0, 60.0);
        let up = decide_throughput(&config(&p, big()), &i);
        assert_eq!(up.replicas, disagg(2, 3));

        // ITL 15 where 30 expected: correction 0.5, corrected ITL 100 -> best 6400.
        // 6000 / 6400 = 0.94 -> 1 (was 2).
        let mut i = inputs(540.0, disagg(2, 2));
        i.observed = observed(400.0, 15.0);
        let down = decide_throughput(&config(&p, big()), &i);
        assert_eq!(down.replicas, disagg(2, 1));

        // With correction off, the same observation changes nothing.
        let mut c = config(&p, big());
        c.correction = false;
        assert_eq!(decide_throughput(&c, &i).replicas, disagg(2, 2));
    }

    #[test]
    fn prefill_correction_only_lowers() {
        let p = sample();
        // 900 requests: 15000 tok/s -> 2 replicas uncorrected.
        // TTFT 200 where 400 expected: 0.5 -> 7500 / 7500 = 1 replica.
        let mut i = inputs(900.0, disagg(2, 2));
        i.observed = observed(200.0, 30.0);
        assert_eq!(
            decide_throughput(&config(&p, big()), &i).replicas,
            disagg(1, 2)
        );
        // TTFT 800: correction 2, but min(1, 2) = 1 -> still 2.
        i.observed = observed(800.0, 30.0);
        assert_eq!(
            decide_throughput(&config(&p, big()), &i).replicas,
            disagg(2, 2)
        );
    }

    #[test]
    fn unreachable_itl_is_reported() {
        let p = sample();
        let mut c = config(&p, big());
        c.targets.itl_ms = 5.0;
        // Sized at the lightest point, 800 tok/s: 10000 / 800 = 12.5 -> 13, step cap 8
        // from 1 -> 9.
        let d = decide_throughput(&c, &inputs(900.0, disagg(1, 1)));
        assert!(d.reasons.contains(&Reason::ItlUnreachable));
        assert_eq!(d.replicas, disagg(2, 9));
        assert!(d.reasons.contains(&Reason::StepCapped {
            role: Role::Decode,
            wanted: 13
        }));
    }

    #[test]
    fn budget_splits_proportionally_and_reports_capped() {
        let p = sample();
        // 2700 requests: prefill 45000 / 7500 = 6; decode 30000 / 5400 = 5.56 -> 6.
        // 12 GPUs wanted, budget 8: 8 * 6/12 = 4 each.
        let d = decide_throughput(
            &config(&p, Limits::default()),
            &inputs(2700.0, disagg(1, 1)),
        );
        assert_eq!(d.replicas, disagg(4, 4));
        assert!(d.capped);
        assert_eq!(d.wanted, disagg(6, 6));
        assert!(d.reasons.contains(&Reason::GpuBudget {
            wanted_gpus: 12,
            budget: 8
        }));
        assert!(d.to_string().contains("capped"), "{d}");

        // Uneven: wanted 6 + 3 = 9 GPUs: shares 5.33 and 2.67 -> floors 5 and 2; the one
        // GPU left goes to decode (1/3 short of its want vs prefill's 1/6) -> 5 + 3 = 8.
        let mut r = Vec::new();
        let (got, capped) = fit_budget(disagg(6, 3), ONE_GPU, &Limits::default(), &mut r).unwrap();
        assert_eq!((got, capped), (disagg(5, 3), true));

        // Two GPUs per decode engine: wanted 4*1 + 4*2 = 12; shares 8*4/12 = 2.67 -> 2
        // prefill, 8*8/12 = 5.33 GPUs -> 2 decode engines (4 GPUs); 2 GPUs left: prefill is
        // 2/4 short, decode 2/4 short; either way the total ends at 8 GPUs.
        let (got, _) = fit_budget(disagg(4, 4), disagg(1, 2), &Limits::default(), &mut r).unwrap();
        let PerRole::Disaggregated { prefill, decode } = got else {
            unreachable!()
        };
        assert_eq!(prefill + 2 * decode, 8, "{got}");

        // Within budget: untouched.
        let (got, capped) = fit_budget(disagg(3, 5), ONE_GPU, &Limits::default(), &mut r).unwrap();
        assert_eq!((got, capped), (disagg(3, 5), false));
    }

    #[test]
    fn min_endpoints_never_scale_to_zero() {
        let p = sample();
        // No traffic: 0 engines' worth -> raised to 1 each.
        let d = decide_throughput(&config(&p, big()), &inputs(0.0, disagg(3, 3)));
        assert_eq!(d.replicas, disagg(1, 1));
        assert!(d.reasons.contains(&Reason::MinEndpoint {
            role: Role::Prefill
        }));
        // min_endpoint 0 is read as 1; min 2 holds 2.
        let zero = Limits {
            min_endpoint: 0,
            ..big()
        };
        assert_eq!(
            decide_throughput(&config(&p, zero), &inputs(0.0, disagg(3, 3))).replicas,
            disagg(1, 1)
        );
        let two = Limits {
            min_endpoint: 2,
            ..big()
        };
        assert_eq!(
            decide_throughput(&config(&p, two), &inputs(0.0, disagg(3, 3))).replicas,
            disagg(2, 2)
        );
        // Minimums beat a budget too small for them: reported as capped.
        let tight = Limits {
            min_endpoint: 3,
            max_gpu_budget: 4,
            max_step: 8,
        };
        let d = decide_throughput(&config(&p, tight), &inputs(0.0, disagg(3, 3)));
        assert_eq!(d.replicas, disagg(3, 3));
        assert!(d.capped);
    }

    #[test]
    fn step_cap_limits_each_role() {
        let p = sample();
        let step2 = Limits {
            max_step: 2,
            ..big()
        };
        // Wants 4 / 4 from 1 / 1: moves 2 per decision: 3 / 3, then 4 / 4.
        let d = decide_throughput(&config(&p, step2), &inputs(1800.0, disagg(1, 1)));
        assert_eq!(d.replicas, disagg(3, 3));
        assert!(d.reasons.contains(&Reason::StepCapped {
            role: Role::Prefill,
            wanted: 4
        }));
        let d = decide_throughput(&config(&p, step2), &inputs(1800.0, d.replicas));
        assert_eq!(d.replicas, disagg(4, 4));
        // Down too: from 10 / 10 toward 1 / 1.
        let d = decide_throughput(&config(&p, step2), &inputs(0.0, disagg(10, 10)));
        assert_eq!(d.replicas, disagg(8, 8));
    }

    #[test]
    fn holds_while_rolling_out_and_on_missing_or_bad_data() {
        let p = sample();
        let c = config(&p, big());
        let mut i = inputs(1800.0, disagg(2, 2));
        i.rolling_out = true;
        let d = decide_throughput(&c, &i);
        assert_eq!(d.replicas, disagg(2, 2));
        assert_eq!(d.reasons, vec![Reason::RollingOut]);
        assert!(d.is_hold() && d.to_string().starts_with("hold"), "{d}");

        let mut i = inputs(1800.0, disagg(2, 2));
        i.forecast.requests = None;
        let d = decide_throughput(&c, &i);
        assert_eq!(d.replicas, disagg(2, 2));
        assert_eq!(
            d.reasons,
            vec![Reason::MissingInput {
                input: "predicted requests"
            }]
        );
        assert_eq!(d.reasons[0].label(), "missing_input");

        let mut i = inputs(1800.0, disagg(2, 2));
        i.forecast.isl = Some(f64::NAN);
        let d = decide_throughput(&c, &i);
        assert_eq!(d.replicas, disagg(2, 2));
        assert!(matches!(
            d.reasons[..],
            [Reason::InvalidInput {
                input: "predicted isl",
                ..
            }]
        ));

        let mut i = inputs(0.0, disagg(2, 2));
        i.forecast.osl = Some(-1.0);
        assert!(decide_throughput(&c, &i).is_hold());
        let mut i = inputs(0.0, disagg(2, 2));
        i.interval_s = 0.0;
        assert!(decide_throughput(&c, &i).is_hold());

        // A NaN latency (0/0 over an idle interval) only skips the correction.
        let mut i = inputs(900.0, disagg(1, 1));
        i.observed = observed(f64::NAN, f64::NAN);
        let d = decide_throughput(&c, &i);
        assert!(!d.is_hold());
        assert_eq!(d.replicas, disagg(2, 2));

        // Replicas and GPUs of different shapes.
        let mut i = inputs(900.0, PerRole::Aggregated { worker: 1 });
        i.current = PerRole::Aggregated { worker: 1 };
        assert_eq!(
            decide_throughput(&c, &i).reasons,
            vec![Reason::ShapeMismatch]
        );
    }

    fn engine(prefill_ratio: f64, kv_usage: f64) -> EngineLoad {
        EngineLoad {
            queued_prefill_tokens: prefill_ratio * 8192.0,
            context_length: 8192.0,
            scheduled_decode_kv: kv_usage * 100_000.0,
            queued_decode_kv: 0.0,
            max_kv_tokens: 100_000.0,
        }
    }

    fn load(
        prefill: &[EngineLoad],
        decode: &[EngineLoad],
        target: LoadTarget,
        limits: &Limits,
    ) -> Decision {
        let inputs = LoadInputs {
            engines: PerRole::Disaggregated { prefill, decode },
            current: disagg(prefill.len() as u32, decode.len() as u32),
            rolling_out: false,
        };
        decide_load(&inputs, target, ONE_GPU, limits)
    }

    #[test]
    fn load_mode_up_on_any_engine() {
        let l = big();
        // One of three decode engines past 1.0 KV use: +1 decode; prefill queue 1.0 (>= 1.0)
        // on one engine: +1 prefill.
        let d = load(
            &[engine(0.5, 0.0), engine(1.0, 0.0)],
            &[engine(0.0, 0.3), engine(0.0, 1.05), engine(0.0, 0.3)],
            LoadTarget::Throughput,
            &l,
        );
        assert_eq!(d.replicas, disagg(3, 4));
        assert!(d.reasons.contains(&Reason::LoadUp { role: Role::Decode }));
        // Exactly 1.0 KV use is not past the (strict) decode threshold.
        let d = load(
            &[engine(0.5, 0.0)],
            &[engine(0.0, 1.0)],
            LoadTarget::Throughput,
            &l,
        );
        assert_eq!(d.replicas, disagg(1, 1));
        // Latency target: 0.45 KV use is past 0.4; 0.1 prefill queue reaches 0.1.
        let d = load(
            &[engine(0.1, 0.0)],
            &[engine(0.0, 0.45)],
            LoadTarget::Latency,
            &l,
        );
        assert_eq!(d.replicas, disagg(2, 2));
    }

    #[test]
    fn load_mode_down_only_when_all_are_under() {
        let l = big();
        // Decode: all three under 0.6 and the mean 0.2 * 3/2 = 0.3 fits: -1.
        // Prefill: one of two engines at 0.5 (not < 0.1): stays.
        let d = load(
            &[engine(0.0, 0.0), engine(0.5, 0.0)],
            &[engine(0.0, 0.2), engine(0.0, 0.2), engine(0.0, 0.2)],
            LoadTarget::Throughput,
            &l,
        );
        assert_eq!(d.replicas, disagg(2, 2));
        assert!(d.reasons.contains(&Reason::LoadDown { role: Role::Decode }));
        assert!(d.reasons.contains(&Reason::LoadSteady {
            role: Role::Prefill
        }));
        // One decode engine at 0.7 (not < 0.6): no scale-down.
        let d = load(
            &[engine(0.0, 0.0)],
            &[engine(0.0, 0.2), engine(0.0, 0.7)],
            LoadTarget::Throughput,
            &l,
        );
        assert_eq!(d.replicas, disagg(1, 2));
        // Latency prefill down needs an empty queue.
        let d = load(
            &[engine(0.0, 0.0), engine(0.01, 0.0)],
            &[engine(0.0, 0.0)],
            LoadTarget::Latency,
            &l,
        );
        assert_eq!(d.replicas, disagg(2, 1));
        // At the minimum: stays.
        let d = load(
            &[engine(0.0, 0.0)],
            &[engine(0.0, 0.0)],
            LoadTarget::Throughput,
            &l,
        );
        assert_eq!(d.replicas, disagg(1, 1));
    }

    #[test]
    fn load_mode_consolidation_blocks_the_two_one_flip() {
        // Two decode engines at 0.55 KV: both under 0.6, but on one engine it would be
        // 0.55 * 2 / 1 = 1.1 > 1.0 and the next interval would scale back up: refused.
        let d = load(
            &[engine(0.0, 0.0)],
            &[engine(0.0, 0.55), engine(0.0, 0.55)],
            LoadTarget::Throughput,
            &big(),
        );
        assert_eq!(d.replicas, disagg(1, 2));
        assert!(
            d.reasons
                .contains(&Reason::ConsolidationBlocked { role: Role::Decode })
        );
        assert_eq!(
            Reason::ConsolidationBlocked { role: Role::Decode }.label(),
            "consolidation_blocked"
        );
        // At 0.45 each, 0.9 on one engine fits: -1.
        let d = load(
            &[engine(0.0, 0.0)],
            &[engine(0.0, 0.45), engine(0.0, 0.45)],
            LoadTarget::Throughput,
            &big(),
        );
        assert_eq!(d.replicas, disagg(1, 1));
    }

    #[test]
    fn load_mode_aggregated_judges_both_metrics() {
        let engines = [engine(0.0, 0.5), engine(1.2, 0.0)];
        let inputs = LoadInputs {
            engines: PerRole::Aggregated { worker: &engines },
            current: PerRole::Aggregated { worker: 2 },
            rolling_out: false,
        };
        let gpus = PerRole::Aggregated { worker: 1 };
        // The second worker's prefill queue (1.2 >= 1.0) scales up.
        let d = decide_load(&inputs, LoadTarget::Throughput, gpus, &big());
        assert_eq!(d.replicas, PerRole::Aggregated { worker: 3 });
    }

    #[test]
    fn load_mode_holds() {
        let l = big();
        let p = [engine(0.0, 0.0)];
        let dd = [engine(0.0, 2.0)];
        // Rolling out.
        let mut inputs = LoadInputs {
            engines: PerRole::Disaggregated {
                prefill: &p,
                decode: &dd,
            },
            current: disagg(1, 1),
            rolling_out: true,
        };
        assert_eq!(
            decide_load(&inputs, LoadTarget::Throughput, ONE_GPU, &l).reasons,
            vec![Reason::RollingOut]
        );
        // Two replicas configured, one reported.
        inputs.rolling_out = false;
        inputs.current = disagg(1, 2);
        let d = decide_load(&inputs, LoadTarget::Throughput, ONE_GPU, &l);
        assert_eq!(d.replicas, disagg(1, 2));
        assert_eq!(d.reasons[0].label(), "worker_count_mismatch");
        // No reports at all: hold, never down to the minimum.
        let d = load(&[], &dd, LoadTarget::Throughput, &l);
        assert!(d.is_hold());
        assert_eq!(d.replicas, disagg(0, 1));
        // NaN KV usage.
        let mut bad = engine(0.0, 0.0);
        bad.scheduled_decode_kv = f64::NAN;
        let d = load(&p, &[bad], LoadTarget::Throughput, &l);
        assert_eq!(d.replicas, disagg(1, 1));
        assert!(matches!(
            d.reasons[..],
            [Reason::InvalidInput {
                input: "scheduled decode kv",
                ..
            }]
        ));
        // Zero KV capacity cannot be divided by.
        let mut bad = engine(0.0, 0.0);
        bad.max_kv_tokens = 0.0;
        assert!(load(&p, &[bad], LoadTarget::Throughput, &l).is_hold());
    }

    #[test]
    fn decision_prints_for_logs() {
        let p = sample();
        let d = decide_throughput(&config(&p, big()), &inputs(900.0, disagg(1, 1)));
        let s = d.to_string();
        assert!(
            s.starts_with(
                "scale prefill=1 decode=1 -> prefill=2 decode=2: throughput: prefill needs 2"
            ),
            "{s}"
        );
    }

    /// Fixed point and no 2-cycle: repeated decisions under constant load.
    fn assert_settles(history: &[Replicas]) -> Result<(), TestCaseError> {
        let last = history[history.len() - 1];
        prop_assert_eq!(
            history[history.len() - 2],
            last,
            "no fixed point: {:?}",
            history
        );
        for w in history.windows(3) {
            prop_assert!(!(w[0] == w[2] && w[0] != w[1]), "alternates: {:?}", history);
        }
        Ok(())
    }

    proptest! {
        /// Throughput mode, with the engines `slowdown` times slower than profiled (so the
        /// decode correction is active): observed ITL is the profile's at the concurrency
        /// the current decode replicas give (Little's law), times `slowdown`; the
        /// correction cancels the concurrency, so the answer settles.
        #[test]
        fn throughput_mode_settles(
            requests in 0.0f64..4000.0,
            slowdown in 0.5f64..2.0,
            start_p in 1u32..12,
            start_d in 1u32..12,
            step in 1u32..9,
            budget in 2u32..40,
            gpus_p in 1u32..4,
            gpus_d in 1u32..4,
        ) {
            let p = sample();
            let limits = Limits { min_endpoint: 1, max_gpu_budget: budget, max_step: step };
            let mut c = config(&p, limits);
            c.gpus = disagg(gpus_p, gpus_d);
            let mut current = disagg(start_p, start_d);
            let mut history = vec![current];
            for _ in 0..40 {
                let PerRole::Disaggregated { decode, .. } = current else { unreachable!() };
                // Little's law: requests/s * ~osl * itl seconds per request, per replica.
                let conc = (requests / 180.0 * 2000.0 * 0.03 / f64::from(decode.max(1))).max(1.0);
                let mut i = inputs(requests, current);
                i.observed = Observed {
                    ttft_ms: Some(400.0 * slowdown),
                    itl_ms: Some(p.expected_itl_ms(4000.0, conc) * slowdown),
                    isl: Some(3000.0),
                    osl: Some(2000.0),
                    decode_concurrency: Some(conc),
                };
                current = decide_throughput(&c, &i).replicas;
                history.push(current);
            }
            assert_settles(&history)?;
        }

        /// Load mode: a constant total load spread evenly over however many engines there
        /// are; the consolidation check keeps it from flipping between N and N-1.
        #[test]
        fn load_mode_settles(
            prefill_total in 0.0f64..4.0,
            decode_total in 0.0f64..6.0,
            latency in any::<bool>(),
            start_p in 1u32..8,
            start_d in 1u32..8,
        ) {
            let target = if latency { LoadTarget::Latency } else { LoadTarget::Throughput };
            let limits = Limits { max_gpu_budget: 1000, ..Limits::default() };
            let mut current = disagg(start_p, start_d);
            let mut history = vec![current];
            for _ in 0..100 {
                let PerRole::Disaggregated { prefill, decode } = current else { unreachable!() };
                let pe = vec![engine(prefill_total / f64::from(prefill), 0.0); prefill as usize];
                let de = vec![engine(0.0, decode_total / f64::from(decode)); decode as usize];
                current = load(&pe, &de, target, &limits).replicas;
                history.push(current);
            }
            assert_settles(&history)?;
        }
    }
}
