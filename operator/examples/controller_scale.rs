//! Cost of reconciling 1000 graphs through the whole controller pass (caches -> observe ->
//! pure reconcile -> server-side applies, deletions, status and Events) against kube-rs's
//! mocked client and the in-memory API server of the tests; and of the pure function alone.
//!
//! `cargo run --release -p dynamo-operator --example controller_scale`
//!
//! 900 single-node graphs (agg-mocker, disagg-mocker) and 100 gang graphs (multinode-vllm)
//! on 320 8-GPU nodes in 40 NVLink domains. Passes run one after another on one thread,
//! so the figures are per-core costs, the in-memory API server included.

#[path = "../tests/common/api.rs"]
mod api;

use std::sync::Arc;
use std::time::{Duration, Instant};

use api::FakeApi;
use dynamo_crds::DynamoGraphDeployment;
use dynamo_operator::controller::metrics::Metrics;
use dynamo_operator::controller::{ChildStores, Context, Stores, dgd, observe};
use dynamo_operator::reconcile::kinds::{Child, KindVisitor, Watch, each_kind};
use dynamo_operator::reconcile::{OperatorConfig, reconcile};
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::Event;
use serde_json::json;

const GRAPHS: usize = 1000;
const NS: &str = "bench";

fn sample(name: &str) -> DynamoGraphDeployment {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../config/samples/{name}.yaml"));
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn store_of<K: kube::Resource<DynamicType = ()> + Clone + 'static>(objects: Vec<K>) -> Store<K> {
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&Event::Init);
    for o in objects {
        writer.apply_watcher_event(&Event::InitApply(o));
    }
    writer.apply_watcher_event(&Event::InitDone);
    store
}

/// One cache per watched kind of the table, as the reflectors would fill them.
fn caches(api: &FakeApi) -> Stores {
    struct Fill<'a>(&'a FakeApi, ChildStores);
    impl KindVisitor for Fill<'_> {
        type Out = ();
        fn visit<K: Child>(&mut self) {
            if K::WATCH != Watch::No {
                self.1.insert(store_of::<K>(self.0.objects_of()));
            }
        }
    }
    let mut fill = Fill(api, ChildStores::default());
    each_kind(&mut fill);
    Stores {
        graphs: store_of(api.objects_of()),
        requests: store_of(api.objects_of()),
        nodes: store_of(api.objects_of()),
        children: fill.1,
    }
}

/// kubelet and the Deployment controller: everything released runs and is ready.
fn run_everything(api: &FakeApi) {
    for p in api.paths("/pods/") {
        api.edit(&p, |pod| {
            if pod["spec"]["schedulingGates"].is_array() {
                return;
            }
            pod["spec"]["nodeName"] = json!("node-0");
            pod["status"] = json!({
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
            });
        });
    }
    for p in api.paths("/deployments/") {
        api.edit(&p, |d| {
            let r = d["spec"]["replicas"].clone();
            d["status"] =
                json!({"observedGeneration": 1, "replicas": r, "updatedReplicas": r, "readyReplicas": r});
        });
    }
}

/// One controller pass over every graph; returns the time and the API requests made.
async fn controller_pass(client: &Client, api: &FakeApi, names: &[String]) -> (Duration, usize) {
    let stores = caches(api);
    let ctx = Arc::new(Context::new(
        client.clone(),
        OperatorConfig::default(),
        stores.clone(),
        Arc::new(Metrics::default()),
        Some("bench".into()),
    ));
    api.take_requests();
    let start = Instant::now();
    for name in names {
        let graph = stores.graphs.get(&ObjectRef::new(name).within(NS)).unwrap();
        dgd::reconcile(graph, ctx.clone())
            .await
            .expect("reconciles");
    }
    (start.elapsed(), api.take_requests().len())
}

/// Reading the caches (`observe`) and the pure function, timed apart.
fn pure_pass(api: &FakeApi, names: &[String]) -> (Duration, Duration) {
    let stores = caches(api);
    let config = OperatorConfig::default();
    let (mut observing, mut reconciling) = (Duration::ZERO, Duration::ZERO);
    for name in names {
        let graph = stores.graphs.get(&ObjectRef::new(name).within(NS)).unwrap();
        let start = Instant::now();
        let observed = observe(&graph, &stores);
        observing += start.elapsed();
        let start = Instant::now();
        std::hint::black_box(reconcile(&graph, &observed, &config).unwrap());
        reconciling += start.elapsed();
    }
    (observing, reconciling)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (client, api) = FakeApi::start();
    for i in 0..320 {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(format!("node-{i}")),
                labels: Some(
                    [
                        ("kubernetes.io/hostname".to_string(), format!("node-{i}")),
                        (
                            "nvidia.com/gpu.clique".to_string(),
                            format!("clique-{}", i / 8),
                        ),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                allocatable: Some([("nvidia.com/gpu".to_string(), Quantity("8".into()))].into()),
                ..NodeStatus::default()
            }),
            ..Node::default()
        };
        api.put(
            &format!("/api/v1/nodes/node-{i}"),
            serde_json::to_value(&node).unwrap(),
        );
    }
    let kinds = ["agg-mocker", "disagg-mocker", "multinode-vllm"];
    let mut names = Vec::new();
    for i in 0..GRAPHS {
        let kind = if i % 10 == 0 { kinds[2] } else { kinds[i % 2] };
        let name = format!("g{i:04}");
        let mut graph = sample(kind);
        graph.metadata.name = Some(name.clone());
        graph.metadata.namespace = Some(NS.into());
        graph.metadata.uid = Some(format!("uid-{name}"));
        graph.metadata.generation = Some(1);
        api.put(
            &format!("/apis/nvidia.com/v1alpha1/namespaces/{NS}/dynamographdeployments/{name}"),
            serde_json::to_value(&graph).unwrap(),
        );
        names.push(name);
    }

    let report = |what: &str, took: Duration, requests: Option<usize>| {
        let per = took / GRAPHS as u32;
        match requests {
            Some(n) => {
                println!("{what:<44} {took:>10.1?} total, {per:>9.1?} per graph, {n} API requests")
            }
            None => println!("{what:<44} {took:>10.1?} total, {per:>9.1?} per graph"),
        }
    };
    let (observing, reconciling) = pure_pass(&api, &names);
    report("observe, empty cluster", observing, None);
    report("pure reconcile, empty cluster", reconciling, None);
    let (took, n) = controller_pass(&client, &api, &names).await;
    report("controller pass 1: create everything", took, Some(n));
    let (took, n) = controller_pass(&client, &api, &names).await;
    report("controller pass 2: release gangs", took, Some(n));
    run_everything(&api);
    let (took, n) = controller_pass(&client, &api, &names).await;
    report(
        "controller pass 3: all ready (status writes)",
        took,
        Some(n),
    );
    let (observing, reconciling) = pure_pass(&api, &names);
    report("observe, steady state", observing, None);
    report("pure reconcile, steady state", reconciling, None);
    let (took, n) = controller_pass(&client, &api, &names).await;
    report("controller pass 4: steady state", took, Some(n));
    println!(
        "cluster: {} pods, {} objects in the API server",
        api.paths("/pods/").len(),
        api.paths("/").len()
    );
}
