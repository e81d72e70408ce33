//! Builds the pure reconciler's [`Observed`] for one graph from the watch caches.

use std::collections::{BTreeMap, HashSet};

use dynamo_crds::DynamoGraphDeployment;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};

use super::context::Stores;
use crate::reconcile::{ObjectKey, ObjectKind, Observed, labels};

pub fn observe(dgd: &DynamoGraphDeployment, stores: &Stores) -> Observed {
    let namespace = dgd.namespace().unwrap_or_default();
    let name = dgd.name_any();
    let uid = dgd.uid().unwrap_or_default();
    let in_namespace = |meta: &ObjectMeta| meta.namespace.as_deref() == Some(namespace.as_str());
    // Only objects the graph controls: a user's object that merely carries our label is
    // never listed for deletion.
    let controlled = |meta: &ObjectMeta| {
        in_namespace(meta)
            && meta
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == uid && o.controller == Some(true))
    };

    // `state_filter` copies only the matches out of the caches.
    let pods: Vec<Pod> = stores
        .pods
        .state_filter(|p| {
            in_namespace(&p.metadata)
                && p.labels().get(labels::GRAPH).map(String::as_str) == Some(name.as_str())
        })
        .iter()
        .map(|p| (**p).clone())
        .collect();
    let deployments = stores
        .deployments
        .state_filter(|d| controlled(&d.metadata))
        .iter()
        .map(|d| (**d).clone())
        .collect();

    let mut owned = Vec::new();
    keys(
        &stores.services,
        ObjectKind::Service,
        &controlled,
        &mut owned,
    );
    keys(
        &stores.adapters,
        ObjectKind::DynamoGraphDeploymentScalingAdapter,
        &controlled,
        &mut owned,
    );
    keys(
        &stores.service_accounts,
        ObjectKind::ServiceAccount,
        &controlled,
        &mut owned,
    );
    keys(&stores.roles, ObjectKind::Role, &controlled, &mut owned);
    keys(
        &stores.role_bindings,
        ObjectKind::RoleBinding,
        &controlled,
        &mut owned,
    );
    if let Some(pools) = &stores.inference_pools {
        keys(pools, ObjectKind::InferencePool, &controlled, &mut owned);
    }
    if let Some(routes) = &stores.http_routes {
        keys(routes, ObjectKind::HTTPRoute, &controlled, &mut owned);
    }

    // Nodes and the other workloads' pods matter only for gang placement, and copying
    // them is the dearest part of a pass: only graphs with gangs get them, and of another
    // workload's pod only what placement reads (node, phase, extended resources).
    let (nodes, other_pods) = if dgd.spec.services.values().any(|s| s.multinode.is_some()) {
        let ours: HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        let other_pods = stores
            .pods
            .state_filter(|p| {
                !p.metadata.uid.as_deref().is_some_and(|u| ours.contains(u))
                    && p.spec.as_ref().is_some_and(|s| s.node_name.is_some())
            })
            .iter()
            .filter_map(|p| gpu_holder(p))
            .collect();
        let nodes = stores.nodes.state().iter().map(|n| (**n).clone()).collect();
        (nodes, other_pods)
    } else {
        (Vec::new(), Vec::new())
    };

    Observed {
        pods,
        deployments,
        owned,
        nodes,
        other_pods,
        now: Some(Time(Timestamp::now())),
    }
}

fn keys<K: Resource + Clone>(
    store: &Store<K>,
    kind: ObjectKind,
    controlled: &impl Fn(&ObjectMeta) -> bool,
    out: &mut Vec<ObjectKey>,
) where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    out.extend(
        store
            .state_filter(|o| controlled(o.meta()))
            .iter()
            .map(|o| o.meta())
            .map(|m| ObjectKey {
                kind,
                name: m.name.clone().unwrap_or_default(),
                uid: m.uid.clone(),
            }),
    );
}

/// The part of a bound pod that holds extended resources (GPUs) that gang placement reads:
/// its containers and init containers (with their `restartPolicy`, which decides how the
/// scheduler counts them) reduced to those resources; `None` for pods that hold none or
/// are not on a node.
fn gpu_holder(pod: &Pod) -> Option<Pod> {
    let spec = pod.spec.as_ref()?;
    spec.node_name.as_ref()?;
    let extended = |r: &Option<BTreeMap<String, Quantity>>| -> Option<BTreeMap<String, Quantity>> {
        let kept: BTreeMap<String, Quantity> = r
            .iter()
            .flatten()
            .filter(|(name, _)| name.contains('/'))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (!kept.is_empty()).then_some(kept)
    };
    let holding = |containers: &[Container]| -> Vec<Container> {
        containers
            .iter()
            .filter_map(|c| {
                let r = c.resources.as_ref()?;
                let (limits, requests) = (extended(&r.limits), extended(&r.requests));
                (limits.is_some() || requests.is_some()).then(|| Container {
                    name: c.name.clone(),
                    restart_policy: c.restart_policy.clone(),
                    resources: Some(ResourceRequirements {
                        limits,
                        requests,
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                })
            })
            .collect()
    };
    let containers = holding(&spec.containers);
    let init_containers = holding(spec.init_containers.as_deref().unwrap_or_default());
    if containers.is_empty() && init_containers.is_empty() {
        return None;
    }
    Some(Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: spec.node_name.clone(),
            containers,
            init_containers: (!init_containers.is_empty()).then_some(init_containers),
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
            ..PodStatus::default()
        }),
    })
}
