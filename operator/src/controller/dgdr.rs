//! The DynamoGraphDeploymentRequest controller: drives a request through the steps of
//! [`crate::dgdr`] until one waits (on the generated graph, or on a spec change), writing
//! the status after each step so `kubectl get dgdr` shows every phase, and reporting the
//! steps' Events. Profiling runs on a blocking thread: it is seconds of CPU.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dynamo_crds::DynamoGraphDeployment;
use dynamo_crds::dgdr::DynamoGraphDeploymentRequest;
use dynamo_perfmodel::{Estimator, ModelArch};
use dynamo_profiler::calibrate;
use dynamo_profiler::graph::{PROFILE_KEY, planner_reads_profile, profile_config_map};
use dynamo_profiler::{ProfileError, Profiled};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::apply::{status_code, write_status};
use super::context::Context;
use super::error::Error;
use crate::dgdr::{self, Outcome, Step};
use crate::reconcile::FIELD_MANAGER;

/// Label value of this controller in the metrics.
pub const CONTROLLER: &str = "dgdr";

/// When a request looks at its graph again after applying it.
const FOLLOW_AFTER_APPLY: Duration = Duration::from_secs(2);
/// Retry period of a request whose model or calibration ConfigMap is missing or unusable
/// (nothing watches ConfigMaps).
const CONFIG_MAP_RETRY: Duration = Duration::from_secs(30);

pub async fn reconcile(
    dgdr: Arc<DynamoGraphDeploymentRequest>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let start = Instant::now();
    let result = reconcile_request(&dgdr, &ctx).await;
    let error = result.as_ref().err().map(Error::metric_label);
    ctx.metrics.observe(CONTROLLER, start.elapsed(), error);
    if result.is_ok() {
        ctx.succeeded(&retry_key(&dgdr));
    }
    result
}

/// Retries a failed request with exponential back-off.
pub fn error_policy(
    dgdr: Arc<DynamoGraphDeploymentRequest>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let delay = ctx.next_retry(&retry_key(&dgdr));
    tracing::warn!(request = %dgdr.name_any(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn retry_key(dgdr: &DynamoGraphDeploymentRequest) -> String {
    format!(
        "dgdr/{}/{}",
        dgdr.namespace().unwrap_or_default(),
        dgdr.name_any()
    )
}

#[tracing::instrument(skip_all, fields(request = %dgdr.name_any()))]
async fn reconcile_request(
    dgdr: &DynamoGraphDeploymentRequest,
    ctx: &Context,
) -> Result<Action, Error> {
    ctx.stores.ready().await?;
    if dgdr.metadata.deletion_timestamp.is_some() {
        // What it generated is owned by it: the garbage collector removes it.
        return Ok(Action::await_change());
    }
    let mut current = dgdr.clone();
    // The ConfigMaps, read once per pass: validating and profiling both need them.
    let mut read: Option<Inputs> = None;
    loop {
        let now = Time(Timestamp::now());
        let step = dgdr::step(&current);
        let inputs = match step {
            Step::Validate | Step::Profile => match &read {
                Some(inputs) => inputs.clone(),
                None => match inputs(ctx, &current).await? {
                    Ok(inputs) => read.insert(inputs).clone(),
                    Err((reason, message)) => {
                        let waiting = dgdr::config_map_unusable(&current, reason, message, &now);
                        record(ctx, &mut current, waiting).await?;
                        return Ok(Action::requeue(CONFIG_MAP_RETRY));
                    }
                },
            },
            Step::Deploy | Step::Follow | Step::Wait => Inputs::default(),
        };
        let outcome = match step {
            Step::Validate => {
                let checked =
                    dynamo_profiler::request::resolve(&current.spec, inputs.model).map(drop);
                dgdr::validated(&current, checked, &now)
            }
            Step::Profile => {
                let started = dgdr::profiling(&current, &now);
                record(ctx, &mut current, started).await?;
                let result = profile(&current, inputs).await;
                if let Ok(profiled) = &result {
                    apply_planner_profile(ctx, &current, profiled).await?;
                }
                dgdr::profiled(&current, result.as_ref(), &Time(Timestamp::now()))
            }
            Step::Deploy => {
                let outcome = deploy(ctx, &current, &now).await?;
                record(ctx, &mut current, outcome).await?;
                // The graph's watch event brings the next step; the requeue covers an
                // apply that changed nothing, which raises none.
                return Ok(Action::requeue(FOLLOW_AFTER_APPLY));
            }
            Step::Follow => {
                let dgd = generated_graph(ctx, &current);
                let outcome = dgdr::follow(&current, dgd.as_ref(), &now);
                record(ctx, &mut current, outcome).await?;
                return Ok(Action::await_change());
            }
            Step::Wait => return Ok(Action::await_change()),
        };
        record(ctx, &mut current, outcome).await?;
    }
}

/// Writes a step's status and Events, and carries the status into the next step.
async fn record(
    ctx: &Context,
    current: &mut DynamoGraphDeploymentRequest,
    outcome: Outcome,
) -> Result<(), Error> {
    let reference = current.object_ref(&());
    let events: Vec<_> = outcome.events.iter().collect();
    ctx.publish(&reference, &events).await;
    write_status(
        &ctx.client,
        &*current,
        current.status.as_ref(),
        &outcome.status,
    )
    .await?;
    current.status = Some(outcome.status);
    Ok(())
}

/// What the request's ConfigMaps give the profiler (each `None` where it names none).
#[derive(Clone, Default)]
struct Inputs {
    /// The model's architecture (`spec.modelConfigRef`); the built-in catalog's otherwise.
    model: Option<ModelArch>,
    /// The estimator on the calibrated factors (`spec.profilingConfig.calibrationRef`).
    calibrated: Option<Estimator>,
}

/// Reads the request's ConfigMaps; `Ok(Err)` is the condition reason and message of the
/// one missing or unusable. The calibration is read only for a spec that passes: its fit
/// costs seconds of CPU, and a spec's refusal says more than the calibration's.
async fn inputs(
    ctx: &Context,
    dgdr: &DynamoGraphDeploymentRequest,
) -> Result<Result<Inputs, (&'static str, String)>, Error> {
    let model = match model_config(ctx, dgdr).await? {
        Ok(model) => model,
        Err(message) => return Ok(Err((dgdr::MODEL_CONFIG_NOT_FOUND, message))),
    };
    if dynamo_profiler::request::resolve(&dgdr.spec, model.clone()).is_err() {
        return Ok(Ok(Inputs {
            model,
            calibrated: None,
        }));
    }
    let calibrated = match calibration(ctx, dgdr).await? {
        Ok(calibrated) => calibrated,
        Err(message) => return Ok(Err((dgdr::CALIBRATION_UNUSABLE, message))),
    };
    Ok(Ok(Inputs { model, calibrated }))
}

/// The data of ConfigMap `name` in the request's namespace; `Ok(Err)` says it is missing
/// (`field`: the spec field naming it).
async fn config_map_data(
    ctx: &Context,
    dgdr: &DynamoGraphDeploymentRequest,
    name: &str,
    field: &str,
) -> Result<Result<BTreeMap<String, String>, String>, Error> {
    let namespace = dgdr.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    match api.get(name).await {
        Ok(map) => Ok(Ok(map.data.unwrap_or_default())),
        Err(e) if status_code(&e) == Some(404) => Ok(Err(format!(
            "ConfigMap {name} ({field}) not found in {namespace}"
        ))),
        Err(source) => Err(Error::Read {
            kind: "ConfigMap",
            name: name.to_owned(),
            source,
        }),
    }
}

/// The request's model architecture from the ConfigMap it names (`Ok(None)`: it names
/// none, the built-in catalog serves it); `Ok(Err)` says what is missing.
async fn model_config(
    ctx: &Context,
    dgdr: &DynamoGraphDeploymentRequest,
) -> Result<Result<Option<ModelArch>, String>, Error> {
    let Some(reference) = &dgdr.spec.model_config_ref else {
        return Ok(Ok(None));
    };
    let data = match config_map_data(ctx, dgdr, &reference.name, "spec.modelConfigRef").await? {
        Ok(data) => data,
        Err(message) => return Ok(Err(message)),
    };
    let Some(json) = data.get(&reference.key) else {
        return Ok(Err(format!(
            "ConfigMap {} has no key {} (spec.modelConfigRef.key)",
            reference.name, reference.key
        )));
    };
    Ok(ModelArch::from_config_json(&dgdr.spec.model, json)
        .map(Some)
        .map_err(|e| format!("ConfigMap {} key {}: {e}", reference.name, reference.key)))
}

/// The estimator the request's calibration gives (`Ok(None)`: it names none): its points
/// fitted (seconds of CPU, on a blocking thread), or its factors as given; `Ok(Err)` says
/// what is missing or wrong, naming the field.
async fn calibration(
    ctx: &Context,
    dgdr: &DynamoGraphDeploymentRequest,
) -> Result<Result<Option<Estimator>, String>, Error> {
    let Some(reference) = dgdr
        .spec
        .profiling_config
        .as_ref()
        .and_then(|p| p.calibration_ref.as_ref())
    else {
        return Ok(Ok(None));
    };
    const FIELD: &str = "spec.profilingConfig.calibrationRef";
    let data = match config_map_data(ctx, dgdr, &reference.name, FIELD).await? {
        Ok(data) => data,
        Err(message) => return Ok(Err(message)),
    };
    let (name, key) = (reference.name.clone(), reference.key.clone());
    let fitted = tokio::task::spawn_blocking(move || {
        let c = calibrate::from_map(&data, &key).map_err(|e| e.to_string())?;
        calibrate::calibrated(&c)
            .map(|(estimator, _)| estimator)
            .map_err(|e| e.to_string())
    })
    .await
    .expect("the fit does not panic");
    Ok(fitted
        .map(Some)
        .map_err(|e| format!("ConfigMap {name} ({FIELD}): {e}")))
}

/// Profiles the request into a graph named after it.
async fn profile(
    dgdr: &DynamoGraphDeploymentRequest,
    inputs: Inputs,
) -> Result<Profiled, ProfileError> {
    let (name, spec) = (dgdr.name_any(), dgdr.spec.clone());
    tokio::task::spawn_blocking(move || {
        dynamo_profiler::profile_calibrated(&name, &spec, inputs.model, inputs.calibrated.as_ref())
    })
    .await
    .expect("the profiler does not panic")
    .map(|mut profiled| {
        profiled.dgd.metadata.namespace = dgdr.namespace();
        profiled
    })
}

/// The ConfigMap the generated planner of real engines reads its profile from, owned by
/// the request (it serves the graph whether the request or its user applies it).
async fn apply_planner_profile(
    ctx: &Context,
    dgdr: &DynamoGraphDeploymentRequest,
    profiled: &Profiled,
) -> Result<(), Error> {
    if !planner_reads_profile(&profiled.request) {
        return Ok(());
    }
    let name = profile_config_map(&dgdr.name_any());
    let json =
        serde_json::to_string_pretty(&profiled.planner_profile).expect("a profile serializes");
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: dgdr.namespace(),
            labels: Some([(dgdr::REQUEST_LABEL.to_string(), dgdr.name_any())].into()),
            owner_references: dgdr::owner_reference(dgdr).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        data: Some([(PROFILE_KEY.to_string(), json)].into()),
        ..ConfigMap::default()
    };
    apply(ctx, &map, "ConfigMap").await
}

/// Applies the generated graph, unless another owner holds its name.
async fn deploy(
    ctx: &Context,
    dgdr: &DynamoGraphDeploymentRequest,
    now: &Time,
) -> Result<Outcome, Error> {
    let Some(dgd) = dgdr::graph_to_apply(dgdr) else {
        // A Ready status always carries the graph; one written by hand may not: back to
        // Pending, which profiles again.
        return Ok(dgdr::validated(dgdr, Ok(()), now));
    };
    let existing = ctx.stores.graphs.get(&ObjectRef::from_obj(&dgd));
    if existing
        .as_deref()
        .is_some_and(|g| !dgdr::controls(dgdr, g))
    {
        return Ok(dgdr::name_taken(dgdr, now));
    }
    apply(ctx, &dgd, "DynamoGraphDeployment").await?;
    Ok(dgdr::deploying(dgdr, existing.is_none(), now))
}

/// The request's graph in the cache, if this request controls it.
fn generated_graph(
    ctx: &Context,
    dgdr: &DynamoGraphDeploymentRequest,
) -> Option<DynamoGraphDeployment> {
    let name = dgdr.status.as_ref()?.dgd_name.as_deref()?;
    let key = ObjectRef::new(name).within(&dgdr.namespace().unwrap_or_default());
    let dgd = ctx.stores.graphs.get(&key)?;
    dgdr::controls(dgdr, &dgd).then(|| (*dgd).clone())
}

/// Server-side apply of a generated object, forced: the request is its only author.
async fn apply<K>(ctx: &Context, object: &K, kind: &'static str) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let namespace = object.meta().namespace.clone().unwrap_or_default();
    Api::<K>::namespaced(ctx.client.clone(), &namespace)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(object),
        )
        .await
        .map(drop)
        .map_err(|source| Error::Apply { kind, name, source })
}
