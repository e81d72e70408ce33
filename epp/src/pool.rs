//! Keeps the router's pods equal to what discovery reports: a new pod gets a fresh
//! `WorkerId`, a KV event follower (kv mode), an engine metrics poller and a model card
//! follower; a pod that
//! leaves has its tasks stopped before its state is dropped, so no late event of a gone
//! pod reaches the index.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dynamo_kvblocks::Credential;
use dynamo_kvcache::{RouterMode, WorkerId};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::discovery::{EndpointSet, EndpointSpec};
use crate::model_source::{self, ModelSource};
use crate::router::Router;
use crate::{engine_metrics, events};

struct Member {
    worker: WorkerId,
    tasks: Vec<JoinHandle<()>>,
}

/// Reconciles until discovery stops publishing; aborting this task stops every
/// per-pod task too.
pub async fn run(
    router: Arc<Router>,
    mut endpoints: watch::Receiver<EndpointSet>,
    tasks: PodTasks,
) {
    let mut members = Members::default();
    loop {
        let set = endpoints.borrow_and_update().clone();
        members.reconcile(&router, set, &tasks).await;
        if endpoints.changed().await.is_err() {
            // The source ended (it logged why): keep the last set.
            std::future::pending::<()>().await;
        }
    }
}

/// What runs for each pod besides its KV event follower.
#[derive(Clone)]
pub struct PodTasks {
    /// How often its engine's metrics are read, if at all.
    pub metrics_poll: Option<Duration>,
    /// The model its card is checked against (and loaded from, if not yet known).
    pub model: ModelSource,
    /// Its sidecar's card port, when its discovery source names no card URL.
    pub model_card_port: Option<u16>,
    pub client: reqwest::Client,
    /// The graph's credential, for its KV event stream.
    pub credential: Option<Credential>,
}

#[derive(Default)]
struct Members {
    live: HashMap<EndpointSpec, Member>,
    last_id: u64,
}

impl Members {
    async fn reconcile(&mut self, router: &Arc<Router>, set: EndpointSet, pod: &PodTasks) {
        let gone: Vec<EndpointSpec> = self
            .live
            .keys()
            .filter(|spec| !set.contains(spec))
            .cloned()
            .collect();
        for spec in gone {
            let member = self.live.remove(&spec).expect("listed");
            for task in &member.tasks {
                task.abort();
            }
            for task in member.tasks {
                let _ = task.await;
            }
            router.remove_endpoint(member.worker);
            tracing::info!(address = %spec.address, role = spec.role.as_str(), "endpoint removed");
        }
        for spec in set {
            if self.live.contains_key(&spec) {
                continue;
            }
            self.last_id += 1;
            let worker = WorkerId(self.last_id);
            router.add_endpoint(worker, spec.clone());
            let mut tasks = Vec::new();
            if router.config().mode == RouterMode::Kv {
                tasks.push(tokio::spawn(events::follow(
                    router.clone(),
                    worker,
                    spec.kv_events.clone(),
                    pod.credential.clone(),
                )));
            }
            if let Some(interval) = pod.metrics_poll {
                tasks.push(tokio::spawn(engine_metrics::poll(
                    router.clone(),
                    worker,
                    spec.address,
                    interval,
                    pod.client.clone(),
                )));
            }
            let card = spec.model_card.clone().or_else(|| {
                pod.model_card_port
                    .map(|port| model_source::card_url(spec.address, port))
            });
            if let Some(card) = card {
                tasks.push(tokio::spawn(model_source::follow(
                    router.clone(),
                    worker,
                    card,
                    pod.model.clone(),
                    pod.client.clone(),
                )));
            }
            tracing::info!(address = %spec.address, kv_events = %spec.kv_events, role = spec.role.as_str(), "endpoint added");
            self.live.insert(spec, Member { worker, tasks });
        }
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        for task in self.live.values().flat_map(|m| &m.tasks) {
            task.abort();
        }
    }
}
