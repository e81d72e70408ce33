//! What every reconcile shares: the client, the watch caches, settings, metrics, Events.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_crds::{DynamoGraphDeployment, DynamoGraphDeploymentRequest};
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::WriterDropped;

use super::metrics::Metrics;
use crate::reconcile::kinds::Child;
use crate::reconcile::{Decision, FIELD_MANAGER, ObjectKind, OperatorConfig, Severity};

/// Watch caches (reflector stores) of everything the controllers read.
#[derive(Clone)]
pub struct Stores {
    pub graphs: Store<DynamoGraphDeployment>,
    pub requests: Store<DynamoGraphDeploymentRequest>,
    pub nodes: Store<Node>,
    /// The graphs' children: one cache per watched kind of the table (`reconcile::kinds`),
    /// none for an optional API the cluster does not serve.
    pub children: ChildStores,
}

impl Stores {
    /// Waits until every cache holds its first full list; reconciling earlier would take
    /// existing objects for missing ones.
    pub async fn ready(&self) -> Result<(), super::Error> {
        let stopped = |_| super::Error::CachesStopped;
        self.graphs.wait_until_ready().await.map_err(stopped)?;
        self.requests.wait_until_ready().await.map_err(stopped)?;
        self.nodes.wait_until_ready().await.map_err(stopped)?;
        for store in self.children.0.values() {
            store.wait_until_ready().await.map_err(stopped)?;
        }
        Ok(())
    }
}

/// Watch caches of the graphs' children, by kind.
#[derive(Clone, Default)]
pub struct ChildStores(BTreeMap<ObjectKind, Arc<dyn ChildStore>>);

impl ChildStores {
    pub fn insert<K: Child>(&mut self, store: Store<K>) {
        self.0.insert(K::KIND, Arc::new(store));
    }

    /// The cache of kind `K`; `None` when the kind is not watched or its API not served.
    pub fn get<K: Child>(&self) -> Option<&Store<K>> {
        self.0.get(&K::KIND)?.as_any().downcast_ref()
    }

    /// Forgets the cache of kind `K`, as if its API were not served.
    pub fn remove<K: Child>(&mut self) {
        self.0.remove(&K::KIND);
    }
}

/// A [`Store`] of some kind of the table.
trait ChildStore: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn wait_until_ready(&self) -> BoxFuture<'_, Result<(), WriterDropped>>;
}

impl<K: Child> ChildStore for Store<K> {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn wait_until_ready(&self) -> BoxFuture<'_, Result<(), WriterDropped>> {
        Store::wait_until_ready(self).boxed()
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
