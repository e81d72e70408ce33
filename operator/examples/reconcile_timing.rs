//! Rough cost of one `reconcile` pass for a 10-service graph (not a benchmark harness):
//! `cargo run --release -p dynamo-operator --example reconcile_timing`.

use std::collections::BTreeMap;
use std::time::Instant;

use dynamo_crds::common::{MultinodeSpec, ResourceItem, Resources};
use dynamo_crds::{ComponentSpec, ComponentType, DynamoGraphDeployment, DynamoGraphDeploymentSpec};
use dynamo_operator::reconcile::{Observed, OperatorConfig, reconcile};
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn main() {
    let mut services = BTreeMap::new();
    services.insert(
        "epp".to_string(),
        ComponentSpec {
            component_type: Some(ComponentType::Epp),
            ..ComponentSpec::default()
        },
    );
    for i in 0..9 {
        let gpus = Resources {
            limits: Some(ResourceItem {
                gpu: Some("8".into()),
                ..ResourceItem::default()
            }),
            ..Resources::default()
        };
        services.insert(
            format!("Worker{i}"),
            ComponentSpec {
                component_type: Some(if i % 2 == 0 {
                    ComponentType::Prefill
                } else {
                    ComponentType::Decode
                }),
                replicas: Some(4),
                multinode: (i % 3 == 0).then_some(MultinodeSpec { node_count: 2 }),
                resources: Some(gpus),
                ..ComponentSpec::default()
            },
        );
    }
    let mut dgd = DynamoGraphDeployment::new(
        "bench",
        DynamoGraphDeploymentSpec {
            services,
            ..DynamoGraphDeploymentSpec::default()
        },
    );
    dgd.metadata.namespace = Some("default".into());
    dgd.metadata.uid = Some("uid".into());
    let nodes: Vec<Node> = (0..64)
        .map(|i| Node {
            metadata: ObjectMeta {
                name: Some(format!("node-{i}")),
                labels: Some(BTreeMap::from([(
                    "nvidia.com/gpu.clique".to_string(),
                    format!("clique-{}", i / 8),
                )])),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                allocatable: Some(BTreeMap::from([(
                    "nvidia.com/gpu".to_string(),
                    Quantity("8".into()),
                )])),
                ..NodeStatus::default()
            }),
            ..Node::default()
        })
        .collect();
    let config = OperatorConfig::default();
    let first = reconcile(
        &dgd,
        &Observed {
            nodes: nodes.clone(),
            ..Observed::default()
        },
        &config,
    )
    .expect("reconciles");
    // Steady state: every pod of the first pass exists.
    let observed = Observed {
        pods: first.pods.clone(),
        nodes,
        ..Observed::default()
    };
    let iterations = 200;
    let start = Instant::now();
    let mut pods = 0;
    for _ in 0..iterations {
        pods += reconcile(&dgd, &observed, &config)
            .expect("reconciles")
            .pods
            .len();
    }
    let per_pass = start.elapsed() / iterations;
    println!(
        "reconcile: {per_pass:?} per pass ({} pods, 64 nodes, 10 services)",
        pods / iterations as usize
    );
}
