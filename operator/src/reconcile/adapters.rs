//! Scaling adapters: one DynamoGraphDeploymentScalingAdapter per service with
//! `scalingAdapter.enabled`, and per engine service of a graph with a planner (which writes
//! replicas only through adapters, `planner/kube.rs`), and the pod selector an adapter's
//! status reports (the HPA reads it).
//!
//! An adapter is created with the service's current replicas and never written again by
//! the graph's reconciler: from then on its `spec.replicas` belongs to whoever scales it
//! (`kubectl scale`, the HPA, KEDA, the planner), and the adapter's controller copies it
//! into the graph.

use std::collections::BTreeMap;

use dynamo_crds::{
    ComponentSpec, DgdServiceRef, DynamoGraphDeploymentScalingAdapter,
    DynamoGraphDeploymentScalingAdapterSpec, DynamoGraphDeploymentSpec,
};

use dynamo_crds::ServiceRole;

use super::graph::Graph;
use super::{Desired, ObjectKind, Observed, labels, names};

/// Names of the adapters the graph wants; the missing ones go to `desired.scaling_adapters`.
pub(crate) fn build(g: &Graph, observed: &Observed, desired: &mut Desired) -> Vec<String> {
    let mut wanted = Vec::new();
    for (service, spec) in &g.spec.services {
        if !adapter_enabled(g.spec, spec) {
            continue;
        }
        let name = names::scaling_adapter(g.name, service);
        wanted.push(name.clone());
        let exists = observed
            .owned
            .iter()
            .any(|k| k.kind == ObjectKind::DynamoGraphDeploymentScalingAdapter && k.name == name);
        if exists {
            continue;
        }
        let mut adapter = DynamoGraphDeploymentScalingAdapter::new(
            &name,
            DynamoGraphDeploymentScalingAdapterSpec {
                replicas: spec.replicas.unwrap_or(1),
                dgd_ref: DgdServiceRef {
                    name: g.name.to_string(),
                    service: service.clone(),
                },
            },
        );
        adapter.metadata = g.metadata(name, g.service_labels(service, spec));
        desired.scaling_adapters.push(adapter);
    }
    wanted
}

/// Whether a service of `graph` has a scaling adapter, which then owns its replicas: the
/// service sets `scalingAdapter.enabled`, or it is an engine service of a graph with a
/// planner.
pub fn adapter_enabled(graph: &DynamoGraphDeploymentSpec, spec: &ComponentSpec) -> bool {
    let enabled = spec
        .scaling_adapter
        .as_ref()
        .and_then(|a| a.enabled)
        .unwrap_or(false);
    let planned = matches!(spec.role(), ServiceRole::Engine(_))
        && graph
            .services
            .values()
            .any(|s| s.role() == ServiceRole::Planner);
    enabled || planned
}

/// Labels selecting the pods that realize one service of graph `dgd`: engine and planner
/// pods by their component label; a frontend or epp service by the endpoint picker's pods.
pub fn pod_selector(dgd: &str, service: &str, spec: &ComponentSpec) -> BTreeMap<String, String> {
    let mut selector = BTreeMap::from([(labels::GRAPH.to_string(), dgd.to_string())]);
    match spec.role() {
        ServiceRole::Epp | ServiceRole::Frontend => {
            selector.insert(labels::COMPONENT_TYPE.into(), "epp".into());
        }
        ServiceRole::Engine(_) | ServiceRole::Planner => {
            selector.insert(labels::COMPONENT.into(), service.to_string());
        }
    }
    selector
}
