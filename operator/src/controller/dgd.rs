//! The DynamoGraphDeployment controller: observe the caches, run the pure reconciler,
//! apply its result, write the status, report its decisions as Events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dynamo_crds::{DynamoGraphDeployment, DynamoGraphDeploymentStatus, GraphState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::apply::{self, write_status};
use super::context::{ChildStores, Context};
use super::error::Error;
use super::observe;
use crate::reconcile::kinds::{Child, KindVisitor, each_kind};
use crate::reconcile::{self, Decision, Desired, Severity};

/// Label value of this controller in the metrics.
pub const CONTROLLER: &str = "dgd";

/// Resync period of a settled graph; watches trigger everything else.
const RESYNC: Duration = Duration::from_secs(300);
/// Retry period of a graph with gated gangs, in case capacity frees up in a way no watch
/// reports to it (another workload's pod finishing without a deletion event reaching us).
const GANG_RETRY: Duration = Duration::from_secs(30);

pub async fn reconcile(
    dgd: Arc<DynamoGraphDeployment>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let start = Instant::now();
    let result = reconcile_graph(&dgd, &ctx).await;
    let error = result.as_ref().err().map(Error::metric_label);
    ctx.metrics.observe(CONTROLLER, start.elapsed(), error);
    if result.is_ok() {
        ctx.succeeded(&retry_key(&dgd));
    }
    result
}

/// Retries a failed graph with exponential back-off.
pub fn error_policy(dgd: Arc<DynamoGraphDeployment>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.next_retry(&retry_key(&dgd));
    tracing::warn!(graph = %dgd.name_any(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

fn retry_key(dgd: &DynamoGraphDeployment) -> String {
    format!(
        "dgd/{}/{}",
        dgd.namespace().unwrap_or_default(),
        dgd.name_any()
    )
}

async fn reconcile_graph(dgd: &DynamoGraphDeployment, ctx: &Context) -> Result<Action, Error> {
    ctx.stores.ready().await?;
    if dgd.metadata.deletion_timestamp.is_some() {
        // Owner references let the garbage collector remove everything; nothing is
        // created outside them, so no finalizer is needed.
        return Ok(Action::await_change());
    }
    let observed = observe::observe(dgd, &ctx.stores);
    let now = observed.now.clone().unwrap_or(Time(Timestamp::now()));
    let mut desired = match reconcile::reconcile(dgd, &observed, &ctx.config) {
        Ok(desired) => desired,
        Err(invalid) => {
            // Bad input: say so in the status and wait for the spec to change.
            let message = invalid.to_string();
            let mut status = dgd.status.clone().unwrap_or_default();
            status.observed_generation = dgd.metadata.generation;
            status.state = Some(GraphState::Failed);
            set_ready_false(&mut status, "InvalidSpec", &message, dgd, now);
            publish(ctx, dgd, &[warning("InvalidSpec", message)], &status).await;
            write_status(&ctx.client, dgd, dgd.status.as_ref(), &status).await?;
            return Ok(Action::await_change());
        }
    };
    skip_missing_apis(ctx, &mut desired);

    let written = apply::children(&ctx.client, &namespace(dgd), &desired).await;
    let mut status = desired.status.clone();
    if let Err(e) = &written {
        let message = e.to_string();
        set_ready_false(&mut status, "ApplyFailed", &message, dgd, now);
        if status.state == Some(GraphState::Ready) {
            status.state = Some(GraphState::Degraded);
        }
        desired.decisions.push(warning("ApplyFailed", message));
    }
    publish(ctx, dgd, &desired.decisions, &status).await;
    let status_written = write_status(&ctx.client, dgd, dgd.status.as_ref(), &status).await;
    written?;
    status_written?;

    let gangs_pending = desired
        .status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == reconcile::GANG_SCHEDULED && c.status == "False");
    Ok(Action::requeue(if gangs_pending {
        GANG_RETRY
    } else {
        RESYNC
    }))
}

/// The kinds of the table with an optional API (the Gateway API's): without their CRDs the
/// graph is served through its Services only, and the Events say so.
fn skip_missing_apis(ctx: &Context, desired: &mut Desired) {
    struct Skip<'a> {
        stores: &'a ChildStores,
        desired: &'a mut Desired,
    }
    impl KindVisitor for Skip<'_> {
        type Out = ();
        fn visit<K: Child>(&mut self) {
            let Some(remedy) = K::OPTIONAL else { return };
            if self.stores.get::<K>().is_some() || K::desired(self.desired).is_empty() {
                return;
            }
            K::desired_mut(self.desired).clear();
            let (kind, api_version) = (K::kind(&()), K::api_version(&()));
            self.desired.decisions.push(warning(
                &format!("{kind}ApiMissing"),
                format!("the {kind} API ({api_version}) is not installed; {remedy}"),
            ));
        }
    }
    each_kind(&mut Skip {
        stores: &ctx.stores.children,
        desired,
    });
}

/// Reports the decisions as Events on the graph: one per reason, with the messages of
/// that reason joined. A gang still pending, or KV tiers still unfed, for the same reasons
/// as in the status is not reported again. An Event that cannot be written is logged, never a reason to fail.
async fn publish(
    ctx: &Context,
    dgd: &DynamoGraphDeployment,
    decisions: &[Decision],
    status: &DynamoGraphDeploymentStatus,
) {
    // A warning its condition already carried on the last pass, unchanged.
    let unchanged = |type_: &str, reason: &str| {
        condition(dgd.status.as_ref(), type_)
            .zip(condition(Some(status), type_))
            .is_some_and(|(before, now)| before.reason == reason && before == now)
    };
    let repeated = [
        (reconcile::GANG_SCHEDULED, "GangPending"),
        (reconcile::KV_TIERS_FED, reconcile::NO_KV_CONNECTOR),
    ]
    .into_iter()
    .filter(|(type_, reason)| unchanged(type_, reason))
    .map(|(_, reason)| reason)
    .collect::<Vec<_>>();
    let reported: Vec<&Decision> = decisions
        .iter()
        .filter(|d| !repeated.contains(&d.reason.as_str()))
        .collect();
    ctx.publish(&dgd.object_ref(&()), &reported).await;
}

fn condition<'s>(
    status: Option<&'s DynamoGraphDeploymentStatus>,
    type_: &str,
) -> Option<&'s Condition> {
    status?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn warning(reason: &str, message: String) -> Decision {
    Decision {
        severity: Severity::Warning,
        reason: reason.into(),
        message,
    }
}

/// Sets the `Ready` condition to False; its transition time moves only if it was True.
fn set_ready_false(
    status: &mut DynamoGraphDeploymentStatus,
    reason: &str,
    message: &str,
    dgd: &DynamoGraphDeployment,
    now: Time,
) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let previous = conditions.iter().position(|c| c.type_ == reconcile::READY);
    let last_transition_time = previous
        .map(|i| &conditions[i])
        .filter(|c| c.status == "False")
        .map_or(now, |c| c.last_transition_time.clone());
    let ready = Condition {
        type_: reconcile::READY.into(),
        status: "False".into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: dgd.metadata.generation,
        last_transition_time,
    };
    match previous {
        Some(i) => conditions[i] = ready,
        None => conditions.insert(0, ready),
    }
}

fn namespace(dgd: &DynamoGraphDeployment) -> String {
    dgd.namespace().unwrap_or_default()
}
