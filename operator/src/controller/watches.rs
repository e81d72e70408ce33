//! One watch per kind feeds both a cache (reflector store) the reconcilers read and the
//! triggers of the two controllers:
//!
//! - graph: its own spec/annotation changes, anything it controls changing (every watched
//!   kind of the table in `reconcile::kinds`), its scaling adapters vanishing, and for
//!   graphs with gated gangs, any node capacity change or another workload's GPU pod going
//!   away;
//! - scaling adapter: its own changes, and any change of its graph (spec or status);
//! - request (DGDR): its own spec changes, and any change of the graph it generated.

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use dynamo_crds::{
    DynamoGraphDeployment, DynamoGraphDeploymentRequest, DynamoGraphDeploymentScalingAdapter,
};
use futures::channel::mpsc;
use futures::stream::{BoxStream, select_all};
use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::context::{ChildStores, Stores};
use crate::reconcile::kinds::{Child, KindVisitor, Watch, each_kind};
use crate::reconcile::{GANG_SCHEDULED, ObjectKind, labels};

/// The optional APIs (kinds of the table with `OPTIONAL`) the cluster does not serve,
/// looked for at start-up. The default: every API is served.
#[derive(Clone, Debug, Default)]
pub struct OptionalApis {
    pub missing: BTreeSet<ObjectKind>,
}

impl OptionalApis {
    /// Asks the API server which optional kinds of the table it serves.
    pub async fn discover(client: &Client) -> Self {
        struct Optional;
        impl KindVisitor for Optional {
            type Out = Option<(ObjectKind, String, String)>;
            fn visit<K: Child>(&mut self) -> Self::Out {
                K::OPTIONAL?;
                Some((
                    K::KIND,
                    K::api_version(&()).into_owned(),
                    K::plural(&()).into_owned(),
                ))
            }
        }
        let mut missing = BTreeSet::new();
        for (kind, group_version, plural) in each_kind(&mut Optional).into_iter().flatten() {
            if !served(client, &group_version, &plural).await {
                missing.insert(kind);
            }
        }
        Self { missing }
    }

    fn serves<K: Child>(&self) -> bool {
        !self.missing.contains(&K::KIND)
    }
}

/// Whether the API server serves `resource` in `group_version` (discovery needs no RBAC).
async fn served(client: &Client, group_version: &str, resource: &str) -> bool {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => list.resources.iter().any(|r| r.name == resource),
        Err(e) => {
            if super::apply::status_code(&e) != Some(404) {
                tracing::warn!(%group_version, error = %e, "discovery");
            }
            false
        }
    }
}

type GraphRef = ObjectRef<DynamoGraphDeployment>;
type AdapterRef = ObjectRef<DynamoGraphDeploymentScalingAdapter>;
type RequestRef = ObjectRef<DynamoGraphDeploymentRequest>;

/// Something to reconcile.
enum Trigger {
    Graph(GraphRef),
    Adapter(AdapterRef),
    Request(RequestRef),
}

/// Reconcile requests of each controller, as the appliers take them.
pub struct Queues {
    pub graphs: mpsc::UnboundedReceiver<GraphRef>,
    pub adapters: mpsc::UnboundedReceiver<AdapterRef>,
    pub requests: mpsc::UnboundedReceiver<RequestRef>,
}

/// Starts nothing by itself: returns the caches, the queues, and the future that drives
/// every watch (poll it for as long as the controllers run). With `namespace`, every
/// watch is of that namespace only and nodes are not watched (their cache stays empty).
pub fn start(
    client: Client,
    apis: OptionalApis,
    namespace: Option<&str>,
) -> (Stores, Queues, impl Future<Output = ()> + Send) {
    let all = watcher::Config::default;
    let (graphs, graph_events) =
        reflect::<DynamoGraphDeployment>(scoped(&client, namespace), all(), |_| {});
    let (adapters, adapter_events) =
        reflect::<DynamoGraphDeploymentScalingAdapter>(scoped(&client, namespace), all(), |_| {});
    let (requests, request_events) =
        reflect::<DynamoGraphDeploymentRequest>(scoped(&client, namespace), all(), |_| {});
    let (pods, pod_events) = reflect::<Pod>(scoped(&client, namespace), all(), |_| {});
    let (nodes, node_events) = match namespace {
        // A node's image list can run to hundreds of entries.
        None => {
            let (nodes, events) = reflect::<Node>(Api::all(client.clone()), all(), |n| {
                if let Some(status) = n.status.as_mut() {
                    status.images = None;
                }
            });
            (nodes, events.boxed())
        }
        Some(_) => (empty_store(), futures::stream::empty().boxed()),
    };

    let mut streams: Vec<BoxStream<'static, Vec<Trigger>>> = Vec::new();
    streams.push(graph_triggers(graph_events, adapters.clone()).boxed());
    streams.push(request_triggers(request_events).boxed());
    streams.push(
        adapter_events
            .map(|seen| {
                let a = seen.object();
                let mut out = vec![Trigger::Adapter(ObjectRef::from_obj(a))];
                // The graph only cares that its adapter is gone (it recreates it).
                if let Seen::Deleted(a) = &seen {
                    out.extend(owner(a).map(Trigger::Graph));
                }
                out
            })
            .boxed(),
    );
    streams.push(pod_triggers(pod_events, graphs.clone()).boxed());
    streams.push(node_triggers(node_events, graphs.clone()).boxed());
    // The kinds of the table watched with triggers of their own (`Watch::Custom`, above),
    // then every other watched kind.
    let mut children = ChildStores::default();
    children.insert(pods);
    children.insert(adapters);
    each_kind(&mut WatchChildren {
        client: &client,
        namespace,
        apis: &apis,
        children: &mut children,
        streams: &mut streams,
    });

    let (graph_tx, graph_rx) = mpsc::unbounded();
    let (adapter_tx, adapter_rx) = mpsc::unbounded();
    let (request_tx, request_rx) = mpsc::unbounded();
    let drive = async move {
        let mut all = select_all(streams);
        while let Some(triggers) = all.next().await {
            for trigger in triggers {
                // A closed queue means the controllers are stopping.
                let sent = match trigger {
                    Trigger::Graph(r) => graph_tx.unbounded_send(r).is_ok(),
                    Trigger::Adapter(r) => adapter_tx.unbounded_send(r).is_ok(),
                    Trigger::Request(r) => request_tx.unbounded_send(r).is_ok(),
                };
                if !sent {
                    return;
                }
            }
        }
    };
    let stores = Stores {
        graphs,
        requests,
        nodes,
        children,
    };
    let queues = Queues {
        graphs: graph_rx,
        adapters: adapter_rx,
        requests: request_rx,
    };
    (stores, queues, drive)
}

/// Watches a kind of the table ([`Watch::All`], [`Watch::Labeled`]) into a cache whose
/// changes wake the graph that controls the object; kinds not watched, watched with triggers
/// of their own ([`Watch::Custom`], above), or of an API the cluster lacks are skipped.
struct WatchChildren<'a> {
    client: &'a Client,
    namespace: Option<&'a str>,
    apis: &'a OptionalApis,
    children: &'a mut ChildStores,
    streams: &'a mut Vec<BoxStream<'static, Vec<Trigger>>>,
}

impl KindVisitor for WatchChildren<'_> {
    type Out = ();

    fn visit<K: Child>(&mut self) {
        let config = match K::WATCH {
            Watch::No | Watch::Custom => return,
            Watch::All => watcher::Config::default(),
            Watch::Labeled => watcher::Config::default().labels(labels::GRAPH),
        };
        if !self.apis.serves::<K>() {
            return;
        }
        let (store, events) = reflect::<K>(scoped(self.client, self.namespace), config, |_| {});
        self.streams.push(owner_triggers(events).boxed());
        self.children.insert(store);
    }
}

/// An object a watch saw.
enum Seen<K> {
    Changed(K),
    Deleted(K),
}

impl<K> Seen<K> {
    fn object(&self) -> &K {
        match self {
            Seen::Changed(o) | Seen::Deleted(o) => o,
        }
    }
}

/// The namespaced kind `K` in `namespace`, or in every namespace.
fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A cache that holds nothing and is ready at once.
fn empty_store<K>() -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}

/// A watch through `api` (of the objects `config` selects) into a store; yields every
/// object it sees change or vanish. Watch errors are logged; the watcher retries them
/// with back-off. `trim` drops parts of each object nothing reads, to keep the caches
/// small.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
) -> (Store<K>, impl Stream<Item = Seen<K>> + Send + 'static)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let events = watcher(api, config)
        .default_backoff()
        // Managed fields are large and never read.
        .modify(move |o: &mut K| {
            o.managed_fields_mut().clear();
            trim(o);
        })
        .reflect(writer)
        .filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    Some(Seen::Changed(o))
                }
                Ok(watcher::Event::Delete(o)) => Some(Seen::Deleted(o)),
                Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
                Err(e) => {
                    tracing::warn!(kind = %K::kind(&()), error = %e, "watch");
                    None
                }
            }
        });
    (store, events)
}

/// The graph that controls `object`, if any.
fn owner<K: Resource>(object: &K) -> Option<GraphRef> {
    controller_of::<DynamoGraphDeployment>(object)
}

/// The request (DGDR) that controls `object`, if any.
fn requester<K: Resource>(object: &K) -> Option<RequestRef> {
    controller_of::<DynamoGraphDeploymentRequest>(object)
}

/// The object of kind `O` that controls `object`, if any.
fn controller_of<O: Resource<DynamicType = ()>>(object: &impl Resource) -> Option<ObjectRef<O>> {
    let namespace = object.meta().namespace.as_deref()?;
    object
        .owner_references()
        .iter()
        .find(|o| {
            o.controller == Some(true)
                && o.kind == O::kind(&())
                && o.api_version == O::api_version(&())
        })
        .map(|o| ObjectRef::new(&o.name).within(namespace))
}

/// A request reconciles when its spec changes (its generation) or its deletion starts;
/// not on its own status writes, which its controller makes step by step.
fn request_triggers(
    events: impl Stream<Item = Seen<DynamoGraphDeploymentRequest>>,
) -> impl Stream<Item = Vec<Trigger>> {
    let mut fingerprints: HashMap<RequestRef, u64> = HashMap::new();
    events.map(move |seen| {
        let request = match seen {
            Seen::Changed(r) => r,
            Seen::Deleted(r) => {
                fingerprints.remove(&ObjectRef::from_obj(&r));
                return Vec::new();
            }
        };
        let key = ObjectRef::from_obj(&request);
        let fingerprint = hash(&(
            request.metadata.generation,
            request.metadata.deletion_timestamp.is_some(),
            request.uid(),
        ));
        if fingerprints.insert(key.clone(), fingerprint) == Some(fingerprint) {
            return Vec::new();
        }
        vec![Trigger::Request(key)]
    })
}

fn owner_triggers<K: Resource>(
    events: impl Stream<Item = Seen<K>>,
) -> impl Stream<Item = Vec<Trigger>> {
    events.map(|seen| {
        owner(seen.object())
            .map(Trigger::Graph)
            .into_iter()
            .collect()
    })
}

/// A graph reconciles when what its reconciler reads changes: its generation (the spec),
/// its annotations (the gateway), or the start of its deletion; not on its own status
/// writes. Its adapters reconcile on every change, status included.
fn graph_triggers(
    events: impl Stream<Item = Seen<DynamoGraphDeployment>>,
    adapters: Store<DynamoGraphDeploymentScalingAdapter>,
) -> impl Stream<Item = Vec<Trigger>> {
    let mut fingerprints: HashMap<GraphRef, u64> = HashMap::new();
    events.map(move |seen| {
        // The request that generated the graph follows its every change.
        let mut out: Vec<Trigger> = requester(seen.object())
            .map(Trigger::Request)
            .into_iter()
            .collect();
        let dgd = match seen {
            Seen::Changed(dgd) => dgd,
            Seen::Deleted(dgd) => {
                fingerprints.remove(&ObjectRef::from_obj(&dgd));
                return out;
            }
        };
        let key = ObjectRef::from_obj(&dgd);
        let fingerprint = hash(&(
            dgd.metadata.generation,
            dgd.annotations(),
            dgd.metadata.deletion_timestamp.is_some(),
            dgd.uid(),
        ));
        if fingerprints.insert(key.clone(), fingerprint) != Some(fingerprint) {
            out.push(Trigger::Graph(key));
        }
        let namespace = dgd.namespace();
        out.extend(
            adapters
                .state()
                .iter()
                .filter(|a| a.namespace() == namespace && a.spec.dgd_ref.name == dgd.name_any())
                .map(|a| Trigger::Adapter(ObjectRef::from_obj(&**a))),
        );
        out
    })
}

/// Graphs whose `GangScheduled` condition is False: they wait for capacity.
fn pending_gangs(graphs: &Store<DynamoGraphDeployment>) -> Vec<Trigger> {
    graphs
        .state()
        .iter()
        .filter(|g| {
            g.status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == GANG_SCHEDULED && c.status == "False")
        })
        .map(|g| Trigger::Graph(ObjectRef::from_obj(&**g)))
        .collect()
}

/// A pod reconciles its graph; another workload's GPU pod that goes away frees capacity
/// for gated gangs.
fn pod_triggers(
    events: impl Stream<Item = Seen<Pod>>,
    graphs: Store<DynamoGraphDeployment>,
) -> impl Stream<Item = Vec<Trigger>> {
    events.map(move |seen| {
        let pod = seen.object();
        if let Some(graph) = owner(pod) {
            return vec![Trigger::Graph(graph)];
        }
        let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        let going = matches!(seen, Seen::Deleted(_))
            || pod.metadata.deletion_timestamp.is_some()
            || matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
        if bound && going && holds_extended_resources(pod) {
            pending_gangs(&graphs)
        } else {
            Vec::new()
        }
    })
}

/// Nodes trigger the graphs with gated gangs when their schedulability, labels or
/// allocatable resources change (not on every status heartbeat).
fn node_triggers(
    events: impl Stream<Item = Seen<Node>>,
    graphs: Store<DynamoGraphDeployment>,
) -> impl Stream<Item = Vec<Trigger>> {
    let mut fingerprints: HashMap<String, u64> = HashMap::new();
    events.map(move |seen| {
        let node = match seen {
            Seen::Changed(node) => node,
            // Less capacity releases nothing.
            Seen::Deleted(node) => {
                fingerprints.remove(&node.name_any());
                return Vec::new();
            }
        };
        let fingerprint = hash(&(
            node.labels(),
            node.spec.as_ref().and_then(|s| s.unschedulable),
            node.status
                .iter()
                .flat_map(|s| s.allocatable.iter().flatten())
                .map(|(k, q)| (k, &q.0))
                .collect::<Vec<_>>(),
        ));
        if fingerprints.insert(node.name_any(), fingerprint) == Some(fingerprint) {
            return Vec::new();
        }
        pending_gangs(&graphs)
    })
}

/// Extended resources (names with a `/`, e.g. `nvidia.com/gpu`) are what gangs wait for.
fn holds_extended_resources(pod: &Pod) -> bool {
    pod.spec.iter().flat_map(|s| &s.containers).any(|c| {
        c.resources.as_ref().is_some_and(|r| {
            [&r.limits, &r.requests]
                .into_iter()
                .flatten()
                .any(|m| m.keys().any(|k| k.contains('/')))
        })
    })
}

fn hash<T: Hash>(value: &T) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_crds::DynamoGraphDeploymentSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        Condition, ObjectMeta, OwnerReference, Time,
    };
    use kube::runtime::watcher::Event;

    fn graph(name: &str, gang_pending: bool) -> DynamoGraphDeployment {
        let mut g = DynamoGraphDeployment::new(name, DynamoGraphDeploymentSpec::default());
        g.metadata.namespace = Some("ns".into());
        g.metadata.generation = Some(1);
        g.status = Some(dynamo_crds::DynamoGraphDeploymentStatus {
            conditions: Some(vec![Condition {
                type_: GANG_SCHEDULED.into(),
                status: if gang_pending { "False" } else { "True" }.into(),
                reason: "Test".into(),
                message: String::new(),
                observed_generation: Some(1),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }]),
            ..Default::default()
        });
        g
    }

    fn store_of<K: Resource<DynamicType = ()> + Clone + 'static>(objects: Vec<K>) -> Store<K> {
        let (store, mut writer) = reflector::store();
        for o in objects {
            writer.apply_watcher_event(&Event::Apply(o));
        }
        store
    }

    fn graph_names(triggers: Vec<Trigger>) -> Vec<String> {
        triggers
            .into_iter()
            .filter_map(|t| match t {
                Trigger::Graph(r) => Some(r.name),
                Trigger::Adapter(_) | Trigger::Request(_) => None,
            })
            .collect()
    }

    async fn run<T>(
        stream: impl Stream<Item = Vec<Trigger>>,
        f: impl Fn(Vec<Trigger>) -> T,
    ) -> Vec<T> {
        stream.map(f).collect().await
    }

    #[tokio::test]
    async fn a_graph_reconciles_on_spec_changes_not_on_its_status() {
        let first = graph("g", false);
        let mut status_only = first.clone();
        status_only.status = None;
        let mut new_spec = first.clone();
        new_spec.metadata.generation = Some(2);
        let events = futures::stream::iter([
            Seen::Changed(first),
            Seen::Changed(status_only),
            Seen::Changed(new_spec),
        ]);
        let out = run(graph_triggers(events, store_of(vec![])), graph_names).await;
        assert_eq!(out, [vec!["g".to_string()], vec![], vec!["g".to_string()]]);
    }

    #[tokio::test]
    async fn a_request_reconciles_on_spec_changes_and_on_any_change_of_its_graph() {
        let spec: dynamo_crds::dgdr::DynamoGraphDeploymentRequestSpec =
            serde_json::from_value(serde_json::json!({"model": "m"})).unwrap();
        let mut request = DynamoGraphDeploymentRequest::new("r", spec);
        request.metadata.namespace = Some("ns".into());
        request.metadata.generation = Some(1);
        let mut status_only = request.clone();
        status_only.status = Some(Default::default());
        let mut new_spec = request.clone();
        new_spec.metadata.generation = Some(2);
        let events = futures::stream::iter([
            Seen::Changed(request),
            Seen::Changed(status_only),
            Seen::Changed(new_spec),
        ]);
        let requests = |triggers: Vec<Trigger>| -> Vec<String> {
            triggers
                .into_iter()
                .filter_map(|t| match t {
                    Trigger::Request(r) => Some(r.name),
                    _ => None,
                })
                .collect()
        };
        let out = run(request_triggers(events), requests).await;
        assert_eq!(out, [vec!["r".to_string()], vec![], vec!["r".to_string()]]);

        let mut generated = graph("g", false);
        generated.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "nvidia.com/v1beta1".into(),
            kind: "DynamoGraphDeploymentRequest".into(),
            name: "r".into(),
            uid: "u".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        let mut ready = generated.clone();
        ready.status.as_mut().unwrap().state = Some(dynamo_crds::GraphState::Ready);
        let events = futures::stream::iter([
            Seen::Changed(generated),
            Seen::Changed(ready.clone()),
            Seen::Deleted(ready),
            Seen::Changed(graph("other", false)),
        ]);
        let out = run(graph_triggers(events, store_of(vec![])), requests).await;
        let r = vec!["r".to_string()];
        assert_eq!(out, [r.clone(), r.clone(), r, vec![]]);
    }

    #[tokio::test]
    async fn capacity_changes_wake_only_graphs_with_waiting_gangs() {
        let graphs = store_of(vec![graph("waiting", true), graph("placed", false)]);
        let node = |gpus: &str| Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                ..ObjectMeta::default()
            },
            status: Some(k8s_openapi::api::core::v1::NodeStatus {
                allocatable: Some([("nvidia.com/gpu".to_string(), Quantity(gpus.into()))].into()),
                ..Default::default()
            }),
            ..Node::default()
        };
        let mut heartbeat = node("8");
        heartbeat.status.as_mut().unwrap().conditions = Some(vec![]);
        let events = futures::stream::iter([
            Seen::Changed(node("8")),
            Seen::Changed(heartbeat),
            Seen::Changed(node("16")),
        ]);
        let out = run(node_triggers(events, graphs), graph_names).await;
        let waiting = vec!["waiting".to_string()];
        assert_eq!(out, [waiting.clone(), vec![], waiting]);
    }

    #[tokio::test]
    async fn pods_wake_their_graph_and_freed_gpus_wake_waiting_gangs() {
        let graphs = store_of(vec![graph("waiting", true)]);
        let owned = Pod {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "nvidia.com/v1alpha1".into(),
                    kind: "DynamoGraphDeployment".into(),
                    name: "mine".into(),
                    uid: "u".into(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        let gpu_pod = Pod {
            metadata: ObjectMeta {
                namespace: Some("other".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                containers: vec![Container {
                    resources: Some(ResourceRequirements {
                        limits: Some([("nvidia.com/gpu".to_string(), Quantity("8".into()))].into()),
                        ..Default::default()
                    }),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let events = futures::stream::iter([
            Seen::Changed(owned),
            Seen::Changed(gpu_pod.clone()),
            Seen::Deleted(gpu_pod),
        ]);
        let out = run(pod_triggers(events, graphs), graph_names).await;
        assert_eq!(
            out,
            [
                vec!["mine".to_string()],
                vec![],
                vec!["waiting".to_string()]
            ]
        );
    }
}
