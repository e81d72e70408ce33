//! Throughput mode: replicas from the forecast traffic and the profile's capacity.

use super::*;

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
    /// The share of an engine's profiled capacity the formula fills, in (0, 1]: replicas
    /// are sized for `demand / target_utilization`. The profile's capacity is what an
    /// engine holds at the targets with nothing to spare, so a forecast below the
    /// interval's real peak, a burst within it, or the queueing a fully loaded engine
    /// builds would breach them; 1 is Dynamo's formula
    /// ([`DEFAULT_TARGET_UTILIZATION`]).
    pub target_utilization: f64,
    pub limits: Limits,
}

/// The default [`ThroughputConfig::target_utilization`]: measured on the planner replay
/// (docs/performance-planner.md, "Headroom").
pub const DEFAULT_TARGET_UTILIZATION: f64 = 0.8;

/// Whether `u` is a target utilization throughput mode can size for: in (0, 1].
pub fn valid_target_utilization(u: f64) -> bool {
    u > 0.0 && u <= 1.0
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
    /// Requests that arrived and are still waiting, in the picker's queue or an engine's
    /// (none of their prompt computed). The forecast counts only what will arrive; these
    /// are work of the next interval on top of it, so they are sized to be served within
    /// it, by replicas the picker hands its queue to as they come up.
    pub backlog: f64,
}

/// Engine demand computed by throughput mode, before rounding: engines' worth of work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Demand {
    /// `predicted_load / throughput_per_gpu / gpus_per_engine` for prefill.
    pub prefill_engines: f64,
    /// The same for decode.
    pub decode_engines: f64,
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
/// requests           = forecast requests + backlog
/// predicted_load     = requests * isl / interval * min(1, prefill_correction)
/// prefill_engines    = predicted_load / prefill_throughput_per_gpu(isl) / gpus / u
/// corrected_itl      = target_itl / decode_correction
/// decode_engines     = requests * osl / interval
///                      / find_best_throughput_per_gpu(corrected_itl, isl + osl / 2) / gpus / u
/// ```
///
/// with `u` the target utilization. Dynamo's formula is this one with no backlog and
/// `u = 1`.
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
    let backlog = required("backlog", Some(inputs.backlog))?;
    let requests = required("predicted requests", inputs.forecast.requests)? + backlog;
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
    let u = config.target_utilization;
    if !valid_target_utilization(u) {
        return Err(Reason::InvalidInput {
            input: "target utilization",
            value: u,
        });
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
        predicted_load / config.prefill_profile.prefill_throughput_per_gpu(isl) / gp / u;

    let corrected_itl = config.targets.itl_ms / decode_correction;
    let best = config
        .decode_profile
        .best_decode(corrected_itl, isl + osl / 2.0);
    if !best.meets_target {
        notes.push(Reason::ItlUnreachable);
    }
    let decode_engines = requests * osl / interval / best.throughput_per_gpu / gd / u;
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
/// While a previous change rolls out, only a scale-up is taken (no role down); anything
/// else holds.
///
/// Disaggregated: prefill and decode replicas from [`demand`], each `ceil`ed. Aggregated:
/// a worker spends its GPU time on both phases, so it needs
/// `ceil(prefill_engines + decode_engines)` (the sum, not the max: two phases each at 90%
/// of an engine do not fit in one engine). Under a constant forecast the answer does not
/// depend on the current replicas, so repeated decisions converge (through the step cap)
/// and stay put.
pub fn decide_throughput(config: &ThroughputConfig<'_>, inputs: &ThroughputInputs) -> Decision {
    let current = inputs.current;
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
    let d = config.limits.apply(current, proposed, config.gpus, reasons);
    // While a change rolls out only a scale-up goes on: the formula sizes the whole graph,
    // not a step from the current replicas, so the engines still starting are not asked
    // for twice, and a backlog that grows while they start is not left for an interval.
    // Anything else waits until the graph has settled.
    let grows = d
        .current
        .zip(&d.replicas, |_, now, then| then >= now)
        .is_some_and(|r| r.iter().all(|(_, up)| up));
    if inputs.rolling_out && !(grows && d.changes()) {
        return Decision::hold(current, Reason::RollingOut);
    }
    d
}
