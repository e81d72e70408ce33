//! Hand-made clusters and graphs for the reconcile tests.
#![allow(dead_code)]

pub mod api;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dynamo_crds::DynamoGraphDeployment;
use dynamo_operator::reconcile::{Desired, Observed, OperatorConfig, reconcile};
use k8s_openapi::api::core::v1::{
    Container, Node, NodeSpec, NodeStatus, Pod, PodCondition, PodSpec, PodStatus,
    ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A sample from config/samples, as the API server would hand it to the controller.
pub fn sample(name: &str) -> DynamoGraphDeployment {
    let path = repo_root()
        .join("config/samples")
        .join(format!("{name}.yaml"));
    let yaml = std::fs::read_to_string(&path).expect("sample exists");
    let mut dgd: DynamoGraphDeployment = serde_saphyr::from_str(&yaml).expect("sample parses");
    dgd.metadata.namespace = Some("inference".into());
    dgd.metadata.uid = Some(format!("uid-{name}"));
    dgd.metadata.generation = Some(1);
    dgd
}

pub fn now() -> Time {
    Time("2026-01-01T00:00:00Z".parse().unwrap())
}

/// A GPU node in an NVLink domain (`nvidia.com/gpu.clique`).
pub fn gpu_node(name: &str, clique: &str, gpus: u32) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                ("nvidia.com/gpu.clique".to_string(), clique.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("64".into())),
                ("nvidia.com/gpu".to_string(), Quantity(gpus.to_string())),
            ])),
            ..NodeStatus::default()
        }),
    }
}

/// A pod of another workload bound to `node`, holding `gpus`.
pub fn busy_pod(name: &str, node: &str, gpus: u32) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    limits: Some(BTreeMap::from([(
                        "nvidia.com/gpu".to_string(),
                        Quantity(gpus.to_string()),
                    )])),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..PodStatus::default()
        }),
    }
}

/// Two NVLink domains of two 8-GPU nodes each, plus one lone 8-GPU node.
pub fn cluster() -> Vec<Node> {
    vec![
        gpu_node("a1", "clique-a", 8),
        gpu_node("a2", "clique-a", 8),
        gpu_node("b1", "clique-b", 8),
        gpu_node("b2", "clique-b", 8),
        gpu_node("c1", "clique-c", 8),
    ]
}

pub fn observed(pods: Vec<Pod>, nodes: Vec<Node>) -> Observed {
    Observed {
        pods,
        nodes,
        now: Some(now()),
        fresh_token: "token-drawn-by-the-controller".into(),
        ..Observed::default()
    }
}

pub fn run(dgd: &DynamoGraphDeployment, observed: &Observed) -> Desired {
    reconcile(dgd, observed, &OperatorConfig::default()).expect("reconciles")
}

/// What the cluster would show after applying `desired.pods`: the pods exist, scheduled on
/// `node` and Running/Ready when they are not gated.
pub fn running(desired: &Desired, node: &str) -> Vec<Pod> {
    desired
        .pods
        .iter()
        .cloned()
        .map(|mut pod| {
            pod.metadata.uid = Some(format!("uid-{}", pod.metadata.name.clone().unwrap()));
            let gated = pod
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| !g.is_empty());
            if !gated {
                pod.spec.as_mut().unwrap().node_name = Some(node.into());
                pod.status = Some(PodStatus {
                    phase: Some("Running".into()),
                    conditions: Some(vec![PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        ..PodCondition::default()
                    }]),
                    ..PodStatus::default()
                });
            }
            pod
        })
        .collect()
}

/// Path of a namespaced object in the fake API server.
pub fn path(group_version: &str, namespace: &str, plural: &str, name: &str) -> String {
    let prefix = if group_version.contains('/') {
        format!("/apis/{group_version}")
    } else {
        format!("/api/{group_version}")
    };
    format!("{prefix}/namespaces/{namespace}/{plural}/{name}")
}

pub fn graph_path(name: &str) -> String {
    path(
        "nvidia.com/v1alpha1",
        "inference",
        "dynamographdeployments",
        name,
    )
}

pub fn pod_path(name: &str) -> String {
    path("v1", "inference", "pods", name)
}

/// Reasons of the Events the requests reported, in order.
pub fn events(requests: &[api::Recorded]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.path.contains("events.k8s.io") && r.method == "POST")
        .map(|r| r.body["reason"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Watch caches filled with what the fake API server holds, as the reflectors would: one
/// per watched kind of the table.
pub fn caches(api: &api::FakeApi) -> dynamo_operator::controller::Stores {
    use dynamo_operator::controller::ChildStores;
    use dynamo_operator::reconcile::kinds::{Child, KindVisitor, Watch, each_kind};
    struct Fill<'a>(&'a api::FakeApi, ChildStores);
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
    dynamo_operator::controller::Stores {
        graphs: store_of(api.objects_of()),
        requests: store_of(api.objects_of()),
        nodes: store_of(api.objects_of()),
        children: fill.1,
    }
}

fn store_of<K>(objects: Vec<K>) -> kube::runtime::reflector::Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    use kube::runtime::watcher::Event;
    let (store, mut writer) = kube::runtime::reflector::store();
    writer.apply_watcher_event(&Event::Init);
    for o in objects {
        writer.apply_watcher_event(&Event::InitApply(o));
    }
    writer.apply_watcher_event(&Event::InitDone);
    store
}

/// The documents `helm template` renders with `--set` values `sets`.
pub fn rendered_chart(sets: &[&str]) -> Vec<serde_json::Value> {
    helm_template(sets).unwrap_or_else(|stderr| panic!("{stderr}"))
}

/// [`rendered_chart`], or helm's error output when it refuses the values.
pub fn helm_template(sets: &[&str]) -> Result<Vec<serde_json::Value>, String> {
    let helm = std::env::var_os("HELM")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/bin/helm"));
    let mut command = std::process::Command::new(&helm);
    command
        .args([
            "template",
            "dynamo",
            "charts/dynamo-platform",
            "--namespace",
            "ns",
        ])
        .current_dir(repo_root());
    for set in sets {
        command.args(["--set", set]);
    }
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}; `make helm` fetches it", helm.display()));
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(serde_saphyr::from_multiple(&String::from_utf8(output.stdout).unwrap()).unwrap())
}
