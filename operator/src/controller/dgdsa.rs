//! The DynamoGraphDeploymentScalingAdapter controller: copies an adapter's `spec.replicas`
//! into its graph service's `replicas` (it is the only writer of that field) and reports
//! the service's current replicas and pod selector in the adapter's status, which is what
//! the scale subresource serves to `kubectl scale`, the HPA and KEDA.

use std::sync::Arc;
use std::time::Instant;

use dynamo_crds::{DynamoGraphDeployment, DynamoGraphDeploymentScalingAdapter};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::apply::write_status;
use super::context::Context;
use super::error::Error;
use crate::reconcile::{FIELD_MANAGER, adapter_enabled, labels, pod_selector};

/// Label value of this controller in the metrics.
pub const CONTROLLER: &str = "dgdsa";

pub async fn reconcile(
    adapter: Arc<DynamoGraphDeploymentScalingAdapter>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let start = Instant::now();
    let result = reconcile_adapter(&adapter, &ctx).await;
    let error = result.as_ref().err().map(Error::metric_label);
    ctx.metrics.observe(CONTROLLER, start.elapsed(), error);
    if result.is_ok() {
        ctx.succeeded(&retry_key(&adapter));
    }
    result
}

pub fn error_policy(
    adapter: Arc<DynamoGraphDeploymentScalingAdapter>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let delay = ctx.next_retry(&retry_key(&adapter));
    tracing::warn!(adapter = %adapter.name_any(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn retry_key(adapter: &DynamoGraphDeploymentScalingAdapter) -> String {
    format!(
        "dgdsa/{}/{}",
        adapter.namespace().unwrap_or_default(),
        adapter.name_any()
    )
}

async fn reconcile_adapter(
    adapter: &DynamoGraphDeploymentScalingAdapter,
    ctx: &Context,
) -> Result<Action, Error> {
    ctx.stores.ready().await?;
    let namespace = adapter.namespace().unwrap_or_default();
    let target = &adapter.spec.dgd_ref;
    let graph_ref = ObjectRef::<DynamoGraphDeployment>::new(&target.name).within(&namespace);
    // Waiting here is enough: a change of the graph triggers its adapters again.
    let Some(dgd) = ctx.stores.graphs.get(&graph_ref) else {
        let note = format!("graph {} not found in {namespace}", target.name);
        warn(ctx, adapter, "GraphNotFound", note).await;
        return Ok(Action::await_change());
    };
    let Some(spec) = dgd.spec.services.get(&target.service) else {
        let note = format!("graph {} has no service {}", target.name, target.service);
        warn(ctx, adapter, "ServiceNotFound", note).await;
        return Ok(Action::await_change());
    };
    if !adapter_enabled(&dgd.spec, spec) {
        let note = format!(
            "service {} of graph {} does not set scalingAdapter.enabled (nor is it an engine of a graph with a planner), so its replicas stay as written in the graph",
            target.service, target.name
        );
        warn(ctx, adapter, "AdapterDisabled", note).await;
        return Ok(Action::await_change());
    }

    let mut status = adapter.status.clone().unwrap_or_default();
    let desired = adapter.spec.replicas;
    let current = spec.replicas.unwrap_or(1);
    if current != desired {
        scale_graph(ctx, &dgd, &target.service, desired).await?;
        status.last_scale_time = Some(Time(Timestamp::now()));
        let event = Event {
            type_: EventType::Normal,
            reason: "Scaled".into(),
            note: Some(format!(
                "scaling adapter {} set {} replicas from {current} to {desired}",
                adapter.name_any(),
                target.service
            )),
            action: "Scale".into(),
            secondary: Some(adapter.object_ref(&())),
        };
        if let Err(e) = ctx.recorder().publish(&event, &dgd.object_ref(&())).await {
            tracing::warn!(adapter = %adapter.name_any(), error = %e, "publishing an Event");
        }
    }

    status.replicas = Some(
        dgd.status
            .as_ref()
            .and_then(|s| s.services.as_ref()?.get(&target.service))
            .map_or(0, |s| s.replicas),
    );
    status.selector = Some(labels::selector_string(&pod_selector(
        &target.name,
        &target.service,
        spec,
    )));
    write_status(&ctx.client, adapter, adapter.status.as_ref(), &status).await?;
    Ok(Action::await_change())
}

/// Sets one service's replicas in the graph. A JSON merge patch rather than server-side
/// apply: an apply from this field manager that named only this service would drop the
/// replicas it wrote earlier for the graph's other adapted services.
async fn scale_graph(
    ctx: &Context,
    dgd: &DynamoGraphDeployment,
    service: &str,
    replicas: i32,
) -> Result<(), Error> {
    let api: Api<DynamoGraphDeployment> =
        Api::namespaced(ctx.client.clone(), &dgd.namespace().unwrap_or_default());
    let patch =
        serde_json::json!({ "spec": { "services": { service: { "replicas": replicas } } } });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(&dgd.name_any(), &params, &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(|source| Error::Scale {
            graph: dgd.name_any(),
            service: service.into(),
            replicas,
            source,
        })
}

async fn warn(
    ctx: &Context,
    adapter: &DynamoGraphDeploymentScalingAdapter,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note),
        action: "Scale".into(),
        secondary: None,
    };
    if let Err(e) = ctx
        .recorder()
        .publish(&event, &adapter.object_ref(&()))
        .await
    {
        tracing::warn!(adapter = %adapter.name_any(), error = %e, "publishing an Event");
    }
}
