//! The DynamoGraphDeploymentRequest lifecycle as pure functions: which [`Step`] a request
//! is at, and the status (with the Events to report) each step's outcome leads to. The
//! controller (`controller/dgdr.rs`) does the I/O between them: reading the model's
//! ConfigMap, running the profiler, applying the generated graph.
//!
//! Phases, as Dynamo's v1beta1 names them: Pending (validated) -> Profiling -> Ready (the
//! graph is in `status.profilingResults.selectedConfig`) -> Deploying (applied) ->
//! Deployed (ready at its generation), or Failed with a condition that says why. Without
//! `autoApply` a request stays Ready.
//!
//! A spec change profiles again and, with `autoApply`, updates the graph in place (Dynamo
//! refuses such changes with `SpecChangeRejected`; profiling here takes seconds, so
//! following the new spec is the cheaper answer for the user). A generated graph deleted
//! by hand is not recreated: the request goes back to Ready and says so, until its spec
//! changes.

use dynamo_crds::dgdr::{
    DynamoGraphDeploymentRequest, DynamoGraphDeploymentRequestStatus, ParetoConfig, ProfilingPhase,
    ProfilingResults, RequestPhase,
};
use dynamo_crds::{DynamoGraphDeployment, GraphState};
use dynamo_profiler::{Candidate, ProfileError, Profiled};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use crate::reconcile::{Decision, Severity};

/// Condition types (Dynamo's): the aggregate, then one per stage.
pub const SUCCEEDED: &str = "Succeeded";
pub const VALIDATION: &str = "Validation";
pub const PROFILING: &str = "Profiling";
pub const SPEC_GENERATED: &str = "SpecGenerated";
pub const DEPLOYMENT_READY: &str = "DeploymentReady";

/// Reason of [`DEPLOYMENT_READY`] once the generated graph was deleted by hand.
const DEPLOYMENT_DELETED: &str = "DeploymentDeleted";
/// Reasons of [`VALIDATION`] while a ConfigMap the spec names is missing or unusable
/// (retried): the model's (`modelConfigRef`), the calibration's
/// (`profilingConfig.calibrationRef`).
pub const MODEL_CONFIG_NOT_FOUND: &str = "ModelConfigNotFound";
pub const CALIBRATION_UNUSABLE: &str = "CalibrationUnusable";

/// What the controller does next for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Check this generation's spec (and read its model's ConfigMap).
    Validate,
    /// Run the profiler.
    Profile,
    /// Apply the generated graph.
    Deploy,
    /// Report the generated graph's state.
    Follow,
    /// Nothing until the spec changes.
    Wait,
}

/// The step `dgdr` is at.
pub fn step(dgdr: &DynamoGraphDeploymentRequest) -> Step {
    let Some(status) = dgdr.status.as_ref() else {
        return Step::Validate;
    };
    if status.observed_generation != dgdr.metadata.generation {
        return Step::Validate;
    }
    match status.phase {
        None => Step::Validate,
        Some(RequestPhase::Pending) if condition_is(status, VALIDATION, "True") => Step::Profile,
        Some(RequestPhase::Pending) => Step::Validate,
        // An operator that stopped mid-profile starts it again.
        Some(RequestPhase::Profiling) => Step::Profile,
        Some(RequestPhase::Ready) if dgdr.spec.auto_apply && !deployment_deleted(status) => {
            Step::Deploy
        }
        Some(RequestPhase::Ready | RequestPhase::Failed) => Step::Wait,
        Some(RequestPhase::Deploying | RequestPhase::Deployed) => Step::Follow,
    }
}

/// One step's outcome: the status to write and the Events to report.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub status: DynamoGraphDeploymentRequestStatus,
    pub events: Vec<Decision>,
}

/// Starts a step's outcome from the request's status: the generation it describes is the
/// spec's, and a new generation says the spec changed.
fn begin(dgdr: &DynamoGraphDeploymentRequest) -> Outcome {
    let mut status = dgdr.status.clone().unwrap_or_default();
    let mut events = Vec::new();
    let generation = dgdr.metadata.generation;
    if status.observed_generation.is_some() && status.observed_generation != generation {
        events.push(normal(
            "SpecChanged",
            format!(
                "the spec changed (generation {}): profiling again{}",
                generation.unwrap_or_default(),
                match (&status.dgd_name, dgdr.spec.auto_apply) {
                    (Some(dgd), true) => format!("; graph {dgd} follows the new result"),
                    _ => String::new(),
                }
            ),
        ));
        // Results of the old spec no longer describe this one.
        status.profiling_results = None;
        status.profiling_phase = None;
    }
    status.observed_generation = generation;
    Outcome { status, events }
}

/// The spec was checked: `Err` holds what is wrong with it.
pub fn validated(
    dgdr: &DynamoGraphDeploymentRequest,
    checked: Result<(), ProfileError>,
    now: &Time,
) -> Outcome {
    let mut out = begin(dgdr);
    let at = At::new(dgdr, now);
    let s = &mut out.status;
    match checked {
        Ok(()) => {
            s.phase = Some(RequestPhase::Pending);
            at.set(s, VALIDATION, "True", "Validated", "the spec is valid");
            at.set(s, SUCCEEDED, "False", "Pending", "waiting to profile");
            out.events
                .push(normal("Initialized", "the spec is valid; profiling".into()));
        }
        Err(e) => {
            let message = e.to_string();
            s.phase = Some(RequestPhase::Failed);
            at.not_done(s, VALIDATION, "ValidationFailed", &message);
            out.events.push(warning("ValidationFailed", message));
        }
    }
    out
}

/// A ConfigMap the spec names is missing or unusable (`reason`, one of
/// [`MODEL_CONFIG_NOT_FOUND`] and [`CALIBRATION_UNUSABLE`]): the request waits (Pending)
/// and is checked again.
pub fn config_map_unusable(
    dgdr: &DynamoGraphDeploymentRequest,
    reason: &'static str,
    message: String,
    now: &Time,
) -> Outcome {
    let mut out = begin(dgdr);
    let at = At::new(dgdr, now);
    let s = &mut out.status;
    s.phase = Some(RequestPhase::Pending);
    at.not_done(s, VALIDATION, reason, &message);
    out.events.push(warning(reason, message));
    out
}

/// Profiling begins.
pub fn profiling(dgdr: &DynamoGraphDeploymentRequest, now: &Time) -> Outcome {
    let mut out = begin(dgdr);
    let at = At::new(dgdr, now);
    let s = &mut out.status;
    s.phase = Some(RequestPhase::Profiling);
    s.profiling_phase = Some(ProfilingPhase::Initializing);
    let message = "sweeping layouts on the performance model";
    at.set(s, PROFILING, "Unknown", "Initializing", message);
    at.set(s, SUCCEEDED, "False", "Profiling", message);
    out
}

/// Profiling ended: the graph it generated (to be named `dgd_name`), or why there is none.
pub fn profiled(
    dgdr: &DynamoGraphDeploymentRequest,
    result: Result<&Profiled, &ProfileError>,
    now: &Time,
) -> Outcome {
    let mut out = begin(dgdr);
    let at = At::new(dgdr, now);
    let s = &mut out.status;
    s.profiling_phase = Some(ProfilingPhase::Done);
    let profiled = match result {
        Ok(p) => p,
        Err(e) => {
            let reason = match e {
                ProfileError::Unreachable { .. } => "SLAUnreachable",
                _ => "ProfilingFailed",
            };
            let message = e.to_string();
            s.phase = Some(RequestPhase::Failed);
            at.not_done(s, PROFILING, reason, &message);
            out.events.push(warning(reason, message));
            return out;
        }
    };
    let selected = &profiled.selected;
    let mut message = format!(
        "{} ({} GPUs): predicted TTFT {:.1} ms, ITL {:.2} ms, end-to-end {:.0} ms, {:.2} req/s",
        selected.layout,
        selected.gpus,
        selected.ttft_ms,
        selected.itl_ms,
        selected.e2e_ms,
        selected.requests_per_s
    );
    let u = &profiled.request.uncertainty;
    if !u.is_none() {
        message += &format!(
            "; within TTFT {:.1} ms, ITL {:.2} ms with the uncalibrated model's headroom \
             (docs/perfmodel.md, \"Uncertainty\")",
            selected.bound_ttft_ms(u),
            selected.bound_itl_ms(u)
        );
    }
    s.phase = Some(RequestPhase::Ready);
    let dgd_name = profiled.dgd.metadata.name.clone();
    at.set(s, PROFILING, "True", "Completed", &message);
    let generated = format!(
        "graph {} is in status.profilingResults.selectedConfig",
        dgd_name.as_deref().unwrap_or_default()
    );
    at.set(s, SPEC_GENERATED, "True", "SpecGenerated", &generated);
    if dgdr.spec.auto_apply {
        at.set(s, SUCCEEDED, "False", "Deploying", &message);
    } else {
        // Without autoApply the request's work ends with the generated graph.
        at.set(s, SUCCEEDED, "True", "SpecGenerated", &message);
    }
    s.profiling_results = Some(ProfilingResults {
        pareto: Some(
            profiled
                .pareto
                .iter()
                .map(|c| ParetoConfig {
                    config: Some(candidate(c, c.layout == selected.layout)),
                })
                .collect(),
        ),
        selected_config: Some(serde_json::to_value(&profiled.dgd).expect("a graph serializes")),
        ..ProfilingResults::default()
    });
    s.dgd_name = dgd_name;
    out.events.push(normal("SpecGenerated", message));
    out
}

/// A Pareto entry of the status.
fn candidate(c: &Candidate, selected: bool) -> Value {
    json!({
        "layout": c.layout.to_string(),
        "gpus": c.gpus,
        "ttftMs": round(c.ttft_ms),
        "itlMs": round(c.itl_ms),
        "e2eMs": round(c.e2e_ms),
        "requestsPerSecond": round(c.requests_per_s),
        "tokensPerSecondPerGpu": round(c.throughput_per_gpu),
        "meetsSla": c.meets_sla,
        "selected": selected,
    })
}

/// To 0.01: the status is for people, and equal inputs must give equal statuses.
fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The generated graph of the status, as the controller applies it: in the request's
/// namespace, controlled by the request, labelled with its name. `None` when the status
/// holds none (or not a graph).
pub fn graph_to_apply(dgdr: &DynamoGraphDeploymentRequest) -> Option<DynamoGraphDeployment> {
    let config = dgdr
        .status
        .as_ref()?
        .profiling_results
        .as_ref()?
        .selected_config
        .clone()?;
    let mut dgd: DynamoGraphDeployment = serde_json::from_value(config).ok()?;
    dgd.metadata.namespace = dgdr.metadata.namespace.clone();
    dgd.metadata.owner_references = Some(vec![owner_reference(dgdr)?]);
    dgd.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(REQUEST_LABEL.into(), dgdr.metadata.name.clone()?);
    Some(dgd)
}

/// Label on what a request generated: the request's name (Dynamo's key).
pub const REQUEST_LABEL: &str = "dgdr.nvidia.com/name";

/// The reference that makes `dgdr` the controller of an object it generated.
pub fn owner_reference(
    dgdr: &DynamoGraphDeploymentRequest,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    use kube::Resource;
    dgdr.controller_owner_ref(&())
}

/// Whether `dgd` is controlled by `dgdr`.
pub fn controls(dgdr: &DynamoGraphDeploymentRequest, dgd: &DynamoGraphDeployment) -> bool {
    let uid = dgdr.metadata.uid.as_deref();
    dgd.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

/// The generated graph was applied (`created`: it did not exist before).
pub fn deploying(dgdr: &DynamoGraphDeploymentRequest, created: bool, now: &Time) -> Outcome {
    let mut out = begin(dgdr);
    let at = At::new(dgdr, now);
    let s = &mut out.status;
    let dgd = s.dgd_name.clone().unwrap_or_default();
    s.phase = Some(RequestPhase::Deploying);
    let message = format!("graph {dgd} applied; waiting for it to be ready");
    at.not_done(s, DEPLOYMENT_READY, "Deploying", &message);
    let (reason, verb) = if created {
        ("DeploymentCreated", "created")
    } else {
        ("DeploymentUpdated", "updated")
    };
    out.events
        .push(normal(reason, format!("graph {dgd} {verb}")));
    out
}

/// A graph of the same name exists and this request does not control it.
pub fn name_taken(dgdr: &DynamoGraphDeploymentRequest, now: &Time) -> Outcome {
    let mut out = begin(dgdr);
    let at = At::new(dgdr, now);
    let s = &mut out.status;
    let dgd = s.dgd_name.clone().unwrap_or_default();
    let message = format!(
        "a DynamoGraphDeployment named {dgd} exists and was not generated by this request; \
         delete it, or give the request another name"
    );
    s.phase = Some(RequestPhase::Failed);
    at.not_done(s, DEPLOYMENT_READY, "NameTaken", &message);
    out.events.push(warning("NameTaken", message));
    out
}

/// The generated graph as the cluster shows it (`None`: it is gone).
pub fn follow(
    dgdr: &DynamoGraphDeploymentRequest,
    dgd: Option<&DynamoGraphDeployment>,
    now: &Time,
) -> Outcome {
    let mut out = begin(dgdr);
    let at = At::new(dgdr, now);
    let was = out.status.phase;
    let s = &mut out.status;
    let name = s.dgd_name.clone().unwrap_or_default();
    let Some(dgd) = dgd else {
        let message = format!(
            "graph {name} was deleted; it is not recreated until the spec changes (its \
             manifest stays in status.profilingResults.selectedConfig)"
        );
        s.phase = Some(RequestPhase::Ready);
        at.not_done(s, DEPLOYMENT_READY, DEPLOYMENT_DELETED, &message);
        out.events.push(warning(DEPLOYMENT_DELETED, message));
        return out;
    };
    let graph_status = dgd.status.as_ref();
    let current = graph_status.and_then(|g| g.observed_generation) == dgd.metadata.generation;
    let state = graph_status.and_then(|g| g.state);
    if current && state == Some(GraphState::Ready) {
        let message = format!("graph {name} is ready");
        s.phase = Some(RequestPhase::Deployed);
        at.set(s, DEPLOYMENT_READY, "True", "DeploymentReady", &message);
        at.set(s, SUCCEEDED, "True", "Deployed", &message);
        if was != Some(RequestPhase::Deployed) {
            out.events.push(normal("DeploymentReady", message));
        }
        return out;
    }
    let state = state.map_or("pending".to_string(), |s| {
        serde_json::to_value(s)
            .expect("an enum serializes")
            .as_str()
            .unwrap_or_default()
            .into()
    });
    let message = format!("graph {name} is {state}");
    s.phase = Some(RequestPhase::Deploying);
    at.not_done(s, DEPLOYMENT_READY, "Deploying", &message);
    if was == Some(RequestPhase::Deployed) {
        out.events.push(warning("DeploymentDegraded", message));
    }
    out
}

fn deployment_deleted(status: &DynamoGraphDeploymentRequestStatus) -> bool {
    find(status, DEPLOYMENT_READY).is_some_and(|c| c.reason == DEPLOYMENT_DELETED)
}

fn condition_is(status: &DynamoGraphDeploymentRequestStatus, type_: &str, value: &str) -> bool {
    find(status, type_).is_some_and(|c| c.status == value)
}

fn find<'s>(status: &'s DynamoGraphDeploymentRequestStatus, type_: &str) -> Option<&'s Condition> {
    status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The generation and time a step's conditions are written at.
struct At<'t> {
    generation: Option<i64>,
    now: &'t Time,
}

impl<'t> At<'t> {
    fn new(dgdr: &DynamoGraphDeploymentRequest, now: &'t Time) -> Self {
        Self {
            generation: dgdr.metadata.generation,
            now,
        }
    }

    fn set(&self, status: &mut Status, type_: &str, value: &str, reason: &str, message: &str) {
        set(
            status,
            type_,
            value,
            reason,
            message,
            self.generation,
            self.now,
        );
    }

    /// Condition `type_` False for `reason`, and the request not done (`Succeeded`
    /// False) for the same reason.
    fn not_done(&self, status: &mut Status, type_: &str, reason: &str, message: &str) {
        self.set(status, type_, "False", reason, message);
        self.set(status, SUCCEEDED, "False", reason, message);
    }
}

type Status = DynamoGraphDeploymentRequestStatus;

/// Sets condition `type_`; its transition time moves only when its status does.
fn set(
    status: &mut DynamoGraphDeploymentRequestStatus,
    type_: &str,
    value: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let previous = conditions.iter().position(|c| c.type_ == type_);
    let last_transition_time = previous
        .map(|i| &conditions[i])
        .filter(|c| c.status == value)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    let condition = Condition {
        type_: type_.into(),
        status: value.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time,
    };
    match previous {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
}

fn normal(reason: &str, message: String) -> Decision {
    Decision {
        severity: Severity::Normal,
        reason: reason.into(),
        message,
    }
}

fn warning(reason: &str, message: String) -> Decision {
    Decision {
        severity: Severity::Warning,
        reason: reason.into(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use dynamo_crds::dgdr::DynamoGraphDeploymentRequestSpec;

    use super::*;

    fn request(generation: i64, auto_apply: bool) -> DynamoGraphDeploymentRequest {
        let spec: DynamoGraphDeploymentRequestSpec =
            serde_json::from_value(json!({"model": "Qwen/Qwen3-0.6B", "autoApply": auto_apply}))
                .unwrap();
        let mut r = DynamoGraphDeploymentRequest::new("r", spec);
        r.metadata.generation = Some(generation);
        r
    }

    fn at(
        mut r: DynamoGraphDeploymentRequest,
        phase: RequestPhase,
        observed: i64,
        condition: Option<(&str, &str, &str)>,
    ) -> DynamoGraphDeploymentRequest {
        let mut status = DynamoGraphDeploymentRequestStatus {
            phase: Some(phase),
            observed_generation: Some(observed),
            ..Default::default()
        };
        if let Some((type_, value, reason)) = condition {
            let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
            set(&mut status, type_, value, reason, "", Some(observed), &now);
        }
        r.status = Some(status);
        r
    }

    #[test]
    fn each_phase_leads_to_its_step_and_a_new_generation_starts_over() {
        use RequestPhase::*;
        let validated = Some((VALIDATION, "True", "Validated"));
        let waiting = Some((VALIDATION, "False", MODEL_CONFIG_NOT_FOUND));
        let deleted = Some((DEPLOYMENT_READY, "False", DEPLOYMENT_DELETED));
        let cases = [
            (request(1, true), Step::Validate),
            (at(request(1, true), Pending, 1, validated), Step::Profile),
            (at(request(1, true), Pending, 1, waiting), Step::Validate),
            (at(request(1, true), Profiling, 1, None), Step::Profile),
            (at(request(1, true), Ready, 1, None), Step::Deploy),
            (at(request(1, false), Ready, 1, None), Step::Wait),
            (at(request(1, true), Ready, 1, deleted), Step::Wait),
            (at(request(1, true), Deploying, 1, None), Step::Follow),
            (at(request(1, true), Deployed, 1, None), Step::Follow),
            (at(request(1, true), Failed, 1, None), Step::Wait),
            (at(request(2, true), Failed, 1, None), Step::Validate),
            (at(request(2, true), Deployed, 1, None), Step::Validate),
        ];
        for (r, expected) in cases {
            assert_eq!(step(&r), expected, "{:?}", r.status);
        }
    }

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let t = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        let mut status = DynamoGraphDeploymentRequestStatus::default();
        set(
            &mut status,
            PROFILING,
            "Unknown",
            "Initializing",
            "",
            None,
            &t(1),
        );
        set(
            &mut status,
            PROFILING,
            "Unknown",
            "Initializing",
            "again",
            None,
            &t(2),
        );
        assert_eq!(find(&status, PROFILING).unwrap().last_transition_time, t(1));
        set(&mut status, PROFILING, "True", "Completed", "", None, &t(3));
        let c = find(&status, PROFILING).unwrap();
        assert_eq!(
            (c.last_transition_time.clone(), c.reason.as_str()),
            (t(3), "Completed")
        );
    }
}
