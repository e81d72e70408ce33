//! What every reconcile shares: the client, the watch caches, settings, metrics, Events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_crds::inference_pool::InferencePool;
use dynamo_crds::{
    DynamoGraphDeployment, DynamoGraphDeploymentRequest, DynamoGraphDeploymentScalingAdapter,
};
use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{Node, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;

use super::metrics::Metrics;
use crate::reconcile::{Decision, FIELD_MANAGER, OperatorConfig, Severity};

/// Watch caches (reflector stores) of everything the controllers read. The two Gateway
/// API kinds are `None` when their CRDs are not installed in the cluster.
#[derive(Clone)]
pub struct Stores {
    pub graphs: Store<DynamoGraphDeployment>,
    pub requests: Store<DynamoGraphDeploymentRequest>,
    pub adapters: Store<DynamoGraphDeploymentScalingAdapter>,
    pub pods: Store<Pod>,
    pub nodes: Store<Node>,
    pub deployments: Store<Deployment>,
    pub services: Store<Service>,
    pub inference_pools: Option<Store<InferencePool>>,
    pub http_routes: Option<Store<HttpRoute>>,
    /// The EPPs' access objects; only those carrying a graph label are cached.
    pub service_accounts: Store<ServiceAccount>,
    pub roles: Store<Role>,
    pub role_bindings: Store<RoleBinding>,
}

impl Stores {
    /// Waits until every cache holds its first full list; reconciling earlier would take
    /// existing objects for missing ones.
    pub async fn ready(&self) -> Result<(), super::Error> {
        let stopped = |_| super::Error::CachesStopped;
        self.graphs.wait_until_ready().await.map_err(stopped)?;
        self.requests.wait_until_ready().await.map_err(stopped)?;
        self.adapters.wait_until_ready().await.map_err(stopped)?;
        self.pods.wait_until_ready().await.map_err(stopped)?;
        self.nodes.wait_until_ready().await.map_err(stopped)?;
        self.deployments.wait_until_ready().await.map_err(stopped)?;
        self.services.wait_until_ready().await.map_err(stopped)?;
        self.service_accounts
            .wait_until_ready()
            .await
            .map_err(stopped)?;
        self.roles.wait_until_ready().await.map_err(stopped)?;
        self.role_bindings
            .wait_until_ready()
            .await
            .map_err(stopped)?;
        if let Some(s) = &self.inference_pools {
            s.wait_until_ready().await.map_err(stopped)?;
        }
        if let Some(s) = &self.http_routes {
            s.wait_until_ready().await.map_err(stopped)?;
        }
        Ok(())
    }
}

pub struct Context {
    pub client: Client,
    pub config: OperatorConfig,
    pub stores: Stores,
    pub metrics: Arc<Metrics>,
    reporter: Reporter,
    backoff: Backoff,
}

impl Context {
    /// `instance` names this operator replica in the Events it reports.
    pub fn new(
        client: Client,
        config: OperatorConfig,
        stores: Stores,
        metrics: Arc<Metrics>,
        instance: Option<String>,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance,
        };
        Self {
            reporter,
            client,
            config,
            stores,
            metrics,
            backoff: Backoff::default(),
        }
    }

    /// An Event recorder for one reconcile pass. kube's Recorder folds a repeat of the
    /// same reason into a series of the first Event and keeps its first note, which would
    /// hide what changed; a pass-long recorder reports each pass's own words.
    pub fn recorder(&self) -> Recorder {
        Recorder::new(self.client.clone(), self.reporter.clone())
    }

    /// Reports `decisions` as Events on the object `reference`: one per reason, with the
    /// messages of that reason joined. An Event that cannot be written is logged, never a
    /// reason to fail.
    pub async fn publish(&self, reference: &ObjectReference, decisions: &[&Decision]) {
        let mut grouped: Vec<(Severity, &str, Vec<&str>)> = Vec::new();
        for d in decisions {
            match grouped
                .iter_mut()
                .find(|(s, r, _)| *s == d.severity && *r == d.reason)
            {
                Some((_, _, messages)) => messages.push(&d.message),
                None => grouped.push((d.severity, &d.reason, vec![&d.message])),
            }
        }
        let recorder = self.recorder();
        for (severity, reason, messages) in grouped {
            let event = Event {
                type_: match severity {
                    Severity::Normal => EventType::Normal,
                    Severity::Warning => EventType::Warning,
                },
                reason: reason.into(),
                note: Some(truncate(&messages.join("; "), 1024)),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, reference).await {
                let object = reference.name.as_deref().unwrap_or_default();
                tracing::warn!(%object, error = %e, %reason, "publishing an Event");
            }
        }
    }

    /// Delay before retrying the object `key` after another failure.
    pub fn next_retry(&self, key: &str) -> Duration {
        self.backoff.next(key)
    }

    /// Forgets the failures of `key` after a successful reconcile.
    pub fn succeeded(&self, key: &str) {
        self.backoff.reset(key);
    }
}

/// At most `max` bytes (Events' notes are limited to 1 kB), cut at a character boundary.
fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Per-object exponential back-off: 1 s, 2 s, 4 s, ... capped at 5 minutes.
#[derive(Default)]
struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    const BASE: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(300);

    fn next(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().expect("back-off lock");
        let n = failures.entry(key.to_string()).or_insert(0);
        let delay = Self::BASE.saturating_mul(1 << (*n).min(16)).min(Self::MAX);
        *n += 1;
        delay
    }

    fn reset(&self, key: &str) {
        self.failures.lock().expect("back-off lock").remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_to_a_cap_and_resets() {
        let b = Backoff::default();
        let delays: Vec<u64> = (0..11).map(|_| b.next("ns/a").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(b.next("ns/b").as_secs(), 1, "per object");
        b.reset("ns/a");
        assert_eq!(b.next("ns/a").as_secs(), 1);
    }
}
