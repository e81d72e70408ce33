//! The DGDR profiler: from a DynamoGraphDeploymentRequest's model, backend, hardware,
//! workload and SLA to the graph that serves it, in seconds and without GPUs.
//!
//! 1. [`request::resolve`]: the spec with its defaults, checked.
//! 2. [`sweep`]: the tensor parallel sizes that fit, every aggregated and disaggregated
//!    layout within the GPU budget at each step budget of the engines that prefill, each
//!    role's engine simulated under its share of the workload ([`sim`]: the mock engine
//!    on the hardware performance model), and the choice by the SLA and
//!    `optimizationType`.
//! 3. [`graph::generate`]: the DynamoGraphDeployment of the choice, and the planner's
//!    profile of its engines (`dynamo_mocker::profile::planner_profile`).
//!
//! How it decides, the CLI (`dynamo profile`) and what is not done yet: `docs/dgdr.md`.

pub mod calibrate;
pub mod graph;
pub mod request;
pub mod sim;
pub mod sweep;

use std::fmt::Write;

use dynamo_crds::DynamoGraphDeployment;
use dynamo_crds::dgdr::DynamoGraphDeploymentRequestSpec;
use dynamo_mocker::EngineConfig;
use dynamo_mocker::profile::{PlannerProfileError, ProfileSweep, planner_profile};
use dynamo_perfmodel::{
    DoesNotFit, Estimator, InvalidParallelism, ModelArch, Uncertainty, UnknownGpu,
};
use dynamo_planner::profile::{Profile, ProfileError as InvalidProfile};
use thiserror::Error;

pub use request::{Load, Request, Sla};
pub use sweep::{Candidate, Engines, Layout};

use sweep::{Sweep, SweepError};

/// What profiling a request gives.
#[derive(Clone, Debug)]
pub struct Profiled {
    /// The request as profiled, defaults filled in.
    pub request: Request,
    /// The load the predictions are for: the request's, or (when it names none) the most
    /// requests in flight the selected layout serves within the SLA.
    pub load: Load,
    /// Every layout predicted, in sweep order.
    pub candidates: Vec<Candidate>,
    /// The layouts no other beats on throughput per GPU and latency.
    pub pareto: Vec<Candidate>,
    pub selected: Candidate,
    /// The graph that deploys `selected`.
    pub dgd: DynamoGraphDeployment,
    /// The planner's profile of the selected engines (prefill points of its prefill
    /// engine, decode points of its decode engine; throughputs per GPU).
    pub planner_profile: Profile,
    /// Engine simulations run for the sweep.
    pub simulations: usize,
}

/// Why a request cannot be profiled; each says what to change.
#[derive(Debug, Error)]
pub enum ProfileError {
    #[error(
        "model {model:?} is not in the built-in catalog and no config.json was given: give the \
         model's config.json, or name one of {known}"
    )]
    UnknownModel { model: String, known: String },
    #[error("hardware.gpuSku: {0}")]
    UnknownGpu(#[from] UnknownGpu),
    #[error("{field} is {value}: a deployment needs at least 1 GPU")]
    NoGpus { field: &'static str, value: i32 },
    #[error("hardware.numGpusPerNode {per_node} is more than hardware.totalGpus {total}")]
    NodeOverTotal { per_node: u32, total: u32 },
    #[error("hardware.vramMb {vram_mb} is more than the {datasheet_mb} MiB of one {gpu}")]
    VramOverDatasheet {
        vram_mb: f64,
        gpu: String,
        datasheet_mb: u64,
    },
    #[error("{field} is {value}: it must be a number above 0")]
    NotPositive { field: &'static str, value: f64 },
    #[error("workload sets both requestRate and concurrency: set one of them")]
    ContradictoryWorkload,
    #[error("set exactly one SLA mode: sla.ttft and sla.itl together, or sla.e2eLatency")]
    ContradictorySla,
    #[error(
        "workload.isl {isl} + workload.osl {osl} is {} tokens, more than {model}'s context of \
         {max_context} tokens", u64::from(*isl) + u64::from(*osl)
    )]
    OverContext {
        isl: u32,
        osl: u32,
        model: String,
        max_context: u64,
    },
    #[error("no tensor parallel size within a node fits the model and one request: {0}")]
    DoesNotFit(DoesNotFit),
    #[error("no tensor parallel size within a node suits the model: {0}")]
    Parallelism(InvalidParallelism),
    /// No layout meets the SLA: which target is out of reach, and what the best reaches.
    #[error("{reason}")]
    Unreachable {
        reason: String,
        best: Box<Candidate>,
    },
    #[error("the simulated engine: {0}")]
    Engine(#[from] sim::SimError),
    #[error(
        "the calibration is of {calibrated}, the request of {requested}: calibrate on the \
         request's GPU and model architecture"
    )]
    CalibrationMismatch {
        calibrated: String,
        requested: String,
    },
    #[error("the planner profile of the selected engines: {0}")]
    PlannerProfile(#[from] PlannerProfileError),
    #[error("the planner profile of the selected engines: {0}")]
    InvalidProfile(#[from] InvalidProfile),
}

impl From<SweepError> for ProfileError {
    fn from(e: SweepError) -> Self {
        match e {
            SweepError::NoFit(no_fit) => Self::DoesNotFit(no_fit),
            SweepError::NoParallelism(invalid) => Self::Parallelism(invalid),
            SweepError::Engine(e) => Self::Engine(e),
        }
    }
}

/// `n` GPUs of `kind` ("" for any), in words: "1 H100_SXM GPU", "8 GPUs".
fn gpus(n: u32, kind: &str) -> String {
    let kind = if kind.is_empty() {
        String::new()
    } else {
        format!(" {kind}")
    };
    format!("{n}{kind} GPU{}", if n == 1 { "" } else { "s" })
}

/// The generated graph's name when the request has none of its own: the model's last
/// path segment, lowercased, other characters as `-` (a DNS-1123 label).
pub fn default_name(model: &str) -> String {
    let last = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    let name: String = last
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let name = name.trim_matches('-');
    let name = &name[..name.len().min(63)];
    if name.is_empty() {
        "model".into()
    } else {
        name.trim_end_matches('-').into()
    }
}

/// Profiles `spec` and names the graph after its model ([`default_name`]).
pub fn profile(
    spec: &DynamoGraphDeploymentRequestSpec,
    model_config: Option<ModelArch>,
) -> Result<Profiled, ProfileError> {
    profile_named(&default_name(&spec.model), spec, model_config)
}

/// Profiles `spec` into a graph named `name` (the DGDR's own name, say). `model_config`,
/// a `config.json` the caller read, serves a model the built-in catalog lacks.
pub fn profile_named(
    name: &str,
    spec: &DynamoGraphDeploymentRequestSpec,
    model_config: Option<ModelArch>,
) -> Result<Profiled, ProfileError> {
    profile_calibrated(name, spec, model_config, None)
}

/// [`profile_named`] on the efficiency factors of `calibrated` (a calibration's
/// estimator, [`calibrate`]), which must be of the request's GPU and model architecture
/// (any TP and dtype: the factors are the hardware's).
pub fn profile_calibrated(
    name: &str,
    spec: &DynamoGraphDeploymentRequestSpec,
    model_config: Option<ModelArch>,
    calibrated: Option<&Estimator>,
) -> Result<Profiled, ProfileError> {
    let mut req = request::resolve(spec, model_config)?;
    if let Some(c) = calibrated {
        let same_model = |a: &ModelArch, b: &ModelArch| {
            a.params() == b.params() && (a.layers, a.kv_heads) == (b.layers, b.kv_heads)
        };
        if c.gpu.name != req.gpu.name || !same_model(&c.model, &req.model) {
            return Err(ProfileError::CalibrationMismatch {
                calibrated: format!("{} on {}", c.model.name, c.gpu.name),
                requested: format!("{} on {}", req.model.name, req.gpu.name),
            });
        }
        req.efficiency = c.efficiency.clone();
        req.uncertainty = Uncertainty::NONE;
    }
    let configs = sweep::engine_configs(&req)?;
    let mut sweep = Sweep::new(&req, &configs);
    let mut candidates = Vec::new();
    let mut loads = Vec::new();
    for layout in sweep.layouts(req.load) {
        let mut variants = Vec::new();
        for variant in sweep.chunk_variants(layout) {
            variants.push(match req.load {
                Some(load) => (sweep.evaluate(variant, load)?, load),
                None => sweep.most_within_sla(variant)?,
            });
        }
        let (candidate, load) =
            sweep::tuned(&variants, req.optimization(), &req.sla, &req.uncertainty);
        candidates.push(candidate);
        loads.push(load);
    }
    let simulations = sweep.simulations();
    let Some(selected) = sweep::select(&candidates, req.optimization()) else {
        return Err(unreachable(&req, &candidates));
    };
    let load = loads[candidates
        .iter()
        .position(|c| c.layout == selected.layout)
        .expect("the selected is a candidate")];
    let pareto = sweep::pareto(&candidates, &req.sla);
    let planner_profile = planner_profile_of(&req, &configs, &selected)?;
    let dgd = graph::generate(name, &req, &selected);
    Ok(Profiled {
        request: req,
        load,
        candidates,
        pareto,
        selected,
        dgd,
        planner_profile,
        simulations,
    })
}

/// The planner's profile of `selected`'s engines: its prefill engine's prefill points
/// and its decode engine's decode points (one engine both, aggregated), over the mock
/// engine's default sweep cut at the model's context.
fn planner_profile_of(
    req: &Request,
    configs: &std::collections::BTreeMap<sweep::Shape, EngineConfig>,
    selected: &Candidate,
) -> Result<Profile, ProfileError> {
    let within = |lengths: Vec<usize>| -> Vec<usize> {
        let max = req.model.max_context as usize;
        lengths.into_iter().filter(|&l| l <= max).collect()
    };
    let measure = |engines: Engines| {
        let default = ProfileSweep::default();
        let sweep = ProfileSweep {
            isls: within(default.isls),
            context_lengths: within(default.context_lengths),
            gpus_per_engine: engines.tp,
            ..default
        };
        planner_profile(&configs[&engines.shape()], &sweep)
    };
    match selected.layout {
        Layout::Aggregated { workers } => Ok(measure(workers)?),
        Layout::Disaggregated { prefill, decode } if prefill.shape() == decode.shape() => {
            Ok(measure(decode)?)
        }
        Layout::Disaggregated { prefill, decode } => {
            let (p, d) = (measure(prefill)?, measure(decode)?);
            Ok(Profile::new(
                decode.tp,
                p.prefill_points().to_vec(),
                d.decode_points().to_vec(),
            )?)
        }
    }
}

/// The error of a request no layout meets: the targets out of reach of every layout (or
/// that none are met together), and the layout closest to the SLA.
fn unreachable(req: &Request, candidates: &[Candidate]) -> ProfileError {
    let best = *candidates
        .iter()
        .min_by(|a, b| {
            a.shortfall(&req.sla, &req.uncertainty)
                .total_cmp(&b.shortfall(&req.sla, &req.uncertainty))
                .then(b.requests_per_s.total_cmp(&a.requests_per_s))
        })
        .expect("TP 1 always gives a layout");
    let budget = gpus(req.total_gpus, &req.gpu.name);
    let stable: Vec<&Candidate> = candidates.iter().filter(|c| !c.overloaded).collect();
    let mut reason = String::new();
    if stable.is_empty() {
        let _ = write!(
            reason,
            "no configuration of at most {budget} keeps up with {}: the best, {} ({}), serves \
             {:.1} req/s",
            any_load(req.load),
            best.layout,
            gpus(best.gpus, ""),
            best.requests_per_s
        );
        return ProfileError::Unreachable {
            reason,
            best: Box::new(best),
        };
    }
    let u = &req.uncertainty;
    let lowest = |f: Metric| {
        stable
            .iter()
            .map(|c| f(c, u))
            .min_by(f64::total_cmp)
            .unwrap_or(f64::INFINITY)
    };
    let mut missed = Vec::new();
    type Metric = fn(&Candidate, &Uncertainty) -> f64;
    let targets: Vec<(&str, f64, Metric)> = match req.sla {
        Sla::TtftItl { ttft_ms, itl_ms } => vec![
            ("TTFT", ttft_ms, Candidate::bound_ttft_ms),
            ("ITL", itl_ms, Candidate::bound_itl_ms),
        ],
        Sla::E2e { e2e_ms } => vec![("end-to-end", e2e_ms, Candidate::bound_e2e_ms)],
    };
    let headroom = if u.is_none() {
        ""
    } else {
        " with the uncalibrated model's headroom"
    };
    for (what, target, f) in &targets {
        let low = lowest(*f);
        if low > *target {
            missed.push(format!(
                "the {what} target of {target} ms is out of reach (the lowest any reaches is \
                 {low:.1} ms{headroom})"
            ));
        }
    }
    let _ = write!(
        reason,
        "no configuration of at most {budget} meets the SLA ({}) at {}: ",
        req.sla,
        any_load(req.load)
    );
    if missed.is_empty() {
        let _ = write!(reason, "each target is reached, but not together");
    } else {
        reason.push_str(&missed.join("; "));
    }
    let _ = write!(
        reason,
        "; the best, {} ({}), reaches TTFT {:.1} ms, ITL {:.1} ms, end-to-end {:.0} ms",
        best.layout,
        gpus(best.gpus, ""),
        best.ttft_ms,
        best.itl_ms,
        best.e2e_ms
    );
    if !u.is_none() {
        let _ = write!(reason, "; {}", uncalibrated_note(u));
    }
    ProfileError::Unreachable {
        reason,
        best: Box::new(best),
    }
}

/// What the headroom of an uncalibrated prediction is, and how to do without it.
fn uncalibrated_note(u: &Uncertainty) -> String {
    format!(
        "the SLA is checked with headroom for an uncalibrated model (real engines' TTFT up to \
         {}x the predicted plus {} predicted ITLs, ITL up to {}x: docs/perfmodel.md, \
         \"Uncertainty\"); a calibration on measurements of this GPU and model (dynamo profile \
         --calibrate, spec.profilingConfig.calibrationRef) checks it without",
        u.prefill, u.admission_steps, u.itl
    )
}

/// A request's load in words; a request without one that misses the SLA misses it with
/// one request in flight, so at any load.
fn any_load(load: Option<Load>) -> String {
    load.map_or_else(|| "any load".into(), |l| l.to_string())
}

impl Profiled {
    /// The predictions and the Pareto table, for people (`dynamo profile` prints it on
    /// stderr).
    pub fn summary(&self) -> String {
        let r = &self.request;
        let s = &self.selected;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "model {} on up to {} ({} per node), backend {}",
            r.model.name,
            gpus(r.total_gpus, &r.gpu.name),
            r.gpus_per_node,
            serde_json::to_value(r.backend).expect("an enum serializes")
        );
        let _ = writeln!(
            out,
            "workload ISL {} OSL {}{}; SLA {}; optimizing {}",
            r.isl,
            r.osl,
            r.load
                .map_or(", no load given".into(), |l| format!(" at {l}")),
            r.sla,
            match r.optimization() {
                None => "for the fewest GPUs",
                Some(dynamo_crds::dgdr::OptimizationType::Throughput) => "throughput per GPU",
                Some(dynamo_crds::dgdr::OptimizationType::Latency) => "latency",
            }
        );
        let _ = writeln!(
            out,
            "{} layouts predicted from {} engine simulations",
            self.candidates.len(),
            self.simulations
        );
        if r.load.is_none() {
            let _ = writeln!(
                out,
                "sized without a load: one engine of each role, each layout at the most \
                 requests in flight it serves within the SLA ({} for the selected); add \
                 replicas, or features.planner, for more",
                self.load
            );
        }
        let _ = writeln!(
            out,
            "selected: {} ({}): TTFT {:.1} ms, ITL {:.2} ms, end-to-end {:.0} ms, {:.2} req/s, \
             {:.0} output tok/s/GPU",
            s.layout,
            gpus(s.gpus, ""),
            s.ttft_ms,
            s.itl_ms,
            s.e2e_ms,
            s.requests_per_s,
            s.throughput_per_gpu
        );
        if !r.uncertainty.is_none() {
            let u = &r.uncertainty;
            let _ = writeln!(
                out,
                "  a real engine within: TTFT {:.1} ms, ITL {:.2} ms, end-to-end {:.0} ms\n  {}",
                s.bound_ttft_ms(u),
                s.bound_itl_ms(u),
                s.bound_e2e_ms(u),
                uncalibrated_note(u)
            );
        }
        let _ = writeln!(out, "Pareto set:");
        let names: Vec<String> = self.pareto.iter().map(|c| c.layout.to_string()).collect();
        let width = names.iter().map(String::len).max().unwrap_or(0).max(42);
        let _ = writeln!(
            out,
            "  {:<width$} {:>4} {:>10} {:>8} {:>9} {:>11}  SLA",
            "layout", "GPUs", "TTFT ms", "ITL ms", "E2E ms", "tok/s/GPU"
        );
        for (c, name) in self.pareto.iter().zip(&names) {
            let mark = if c.layout == s.layout { "*" } else { " " };
            let _ = writeln!(
                out,
                "{mark} {name:<width$} {:>4} {:>10.1} {:>8.2} {:>9.0} {:>11.0}  {}",
                c.gpus,
                c.ttft_ms,
                c.itl_ms,
                c.e2e_ms,
                c.throughput_per_gpu,
                if c.meets_sla { "met" } else { "missed" }
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_are_dns_labels() {
        assert_eq!(default_name("Qwen/Qwen3-0.6B"), "qwen3-0-6b");
        assert_eq!(
            default_name("meta-llama/Llama-3.1-8B-Instruct"),
            "llama-3-1-8b-instruct"
        );
        assert_eq!(default_name("__"), "model");
    }
}
