//! Engine replicas: create what is missing, replace what failed, restart gangs that lost a
//! member, release gangs that fit, and roll spec changes one replica at a time.

use std::collections::{BTreeMap, BTreeSet};

use dynamo_crds::{ComponentSpec, ServiceReplicaStatus};
use k8s_openapi::api::core::v1::Pod;

use super::gang::{Capacity, GangPlacement, GangRequest, is_terminated};
use super::graph::Graph;
use super::pods::{self, Slot};
use super::{
    Decision, Desired, ObjectKey, ObjectKind, Observed, ReconcileError, Severity, labels, names,
};

/// What happened to one engine service in this pass, for the status.
#[derive(Clone, Debug, Default)]
pub(crate) struct EngineOutcome {
    pub service: String,
    pub status: ServiceReplicaStatus,
    /// Every desired replica exists at the current spec, is ready, and nothing extra is left.
    pub ready: bool,
    /// Whether the service is multinode.
    pub has_gangs: bool,
    /// Gangs that are gated, with the reason.
    pub gangs_pending: Vec<String>,
    /// Gangs that cannot fit even on an empty cluster.
    pub gangs_unschedulable: Vec<String>,
}

/// A gang or single pod's member, as observed.
#[derive(Clone, Copy)]
enum Member<'p> {
    Missing,
    Terminating,
    /// Exited (`Failed`, or `Succeeded`: an engine is not supposed to finish).
    Failed(&'p Pod),
    Live(&'p Pod),
}

struct ReplicaView<'p> {
    replica: u32,
    members: Vec<(String, Member<'p>)>,
}

impl ReplicaView<'_> {
    fn all_missing(&self) -> bool {
        self.members
            .iter()
            .all(|(_, m)| matches!(m, Member::Missing))
    }
    fn live(&self) -> impl Iterator<Item = &Pod> {
        self.members.iter().filter_map(|(_, m)| match m {
            Member::Live(p) => Some(*p),
            _ => None,
        })
    }
    fn all_live(&self) -> bool {
        self.members
            .iter()
            .all(|(_, m)| matches!(m, Member::Live(_)))
    }
    fn ready(&self) -> bool {
        self.all_live() && self.live().all(is_ready)
    }
    fn outdated(&self, hash: &str) -> bool {
        self.live()
            .any(|p| label(p, labels::SPEC_HASH) != Some(hash))
    }
    /// A gang once released has members that are no longer gated.
    fn released(&self) -> bool {
        self.live().any(|p| !pods::is_gated(p))
    }
    fn exists(&self) -> bool {
        !self.all_missing()
    }
}

pub(crate) fn reconcile_engines(
    g: &Graph,
    observed: &Observed,
    desired: &mut Desired,
) -> Result<Vec<EngineOutcome>, ReconcileError> {
    // Pods the graph owns directly (the EPP's pods belong to its ReplicaSet).
    let own_pods: Vec<&Pod> = observed.pods.iter().filter(|p| g.owns(p)).collect();
    let by_name: BTreeMap<&str, &Pod> = own_pods
        .iter()
        .filter_map(|p| Some((p.metadata.name.as_deref()?, *p)))
        .collect();

    let bound = observed
        .other_pods
        .iter()
        .chain(observed.pods.iter())
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some());
    let mut capacity = Capacity::from_cluster(&observed.nodes, bound);
    let empty_cluster = Capacity::from_cluster(&observed.nodes, []);

    let mut expected: BTreeSet<String> = BTreeSet::new();
    let mut outcomes = Vec::new();
    let mut earlier_settled = true;

    // Gang pods already released but not bound yet hold their GPUs in their domain.
    for (service, spec, _) in g.engine_services() {
        if spec.multinode.is_none() {
            continue;
        }
        let request = gang_request(g, service, spec, 0)?;
        let mut unbound: BTreeMap<String, u32> = BTreeMap::new();
        for pod in own_pods.iter().filter(|p| {
            label(p, labels::COMPONENT) == Some(service.as_str())
                && label(p, labels::GANG).is_some()
                && !pods::is_gated(p)
                && !is_terminated(p)
                && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()
        }) {
            if let Some(domain) = pods::pinned_domain(pod, &request.domain_label) {
                *unbound.entry(domain).or_default() += 1;
            }
        }
        for (domain, count) in unbound {
            capacity.reserve_unbound(&request, &domain, count);
        }
    }

    for (service, spec, role) in g.engine_services() {
        let template = pods::engine_template(g, service, spec, role);
        let hash = labels::spec_hash(&template);
        let node_count = spec.node_count().max(1) as u32;
        let replicas = spec.replicas.unwrap_or(1).max(0) as u32;
        let mut outcome = EngineOutcome {
            service: service.clone(),
            has_gangs: node_count > 1,
            ..EngineOutcome::default()
        };

        let views: Vec<ReplicaView> = (0..replicas)
            .map(|replica| ReplicaView {
                replica,
                members: (0..node_count)
                    .map(|rank| {
                        let slot = Slot {
                            service,
                            replica,
                            rank,
                            node_count,
                        };
                        let name = slot.pod_name(g.name);
                        let member = match by_name.get(name.as_str()) {
                            None => Member::Missing,
                            Some(p) if p.metadata.deletion_timestamp.is_some() => {
                                Member::Terminating
                            }
                            Some(p) if is_terminated(p) => Member::Failed(p),
                            Some(p) => Member::Live(p),
                        };
                        (name, member)
                    })
                    .collect(),
            })
            .collect();
        for view in &views {
            expected.extend(view.members.iter().map(|(n, _)| n.clone()));
        }
        let unavailable = views.iter().filter(|v| !v.ready()).count();
        let mut rolled_one = false;

        for view in &views {
            let slots = |rank| Slot {
                service,
                replica: view.replica,
                rank,
                node_count,
            };
            let fresh = || -> Vec<Pod> {
                (0..node_count)
                    .map(|rank| pods::replica_pod(g, &template, &hash, slots(rank)))
                    .collect()
            };
            let what = describe(service, view.replica, node_count);

            if view.all_missing() {
                desired.pods.extend(fresh());
                if node_count > 1 {
                    outcome.gangs_pending.push(format!(
                        "{what}: creating its {node_count} pods behind the gang gate"
                    ));
                }
                desired.decisions.push(decision(
                    Severity::Normal,
                    "Creating",
                    format!("creating {what}"),
                ));
                continue;
            }
            if !view.all_live() {
                let broken: Vec<String> = view
                    .members
                    .iter()
                    .filter_map(|(name, m)| match m {
                        Member::Missing => Some(format!("{name} is gone")),
                        Member::Failed(_) => Some(format!("{name} exited")),
                        Member::Terminating => Some(format!("{name} is terminating")),
                        Member::Live(_) => None,
                    })
                    .collect();
                let any_failed_or_terminating = view
                    .members
                    .iter()
                    .any(|(_, m)| matches!(m, Member::Failed(_) | Member::Terminating));
                if node_count > 1 && !view.released() && !any_failed_or_terminating {
                    // Never released: finish creating the gang, still gated.
                    desired.pods.extend(fresh());
                    outcome
                        .gangs_pending
                        .push(format!("{what}: creating its missing pods"));
                    continue;
                }
                let to_delete: Vec<ObjectKey> = view
                    .members
                    .iter()
                    .filter_map(|(_, m)| match m {
                        Member::Live(p) | Member::Failed(p) => Some(pod_key(p)),
                        _ => None,
                    })
                    .collect();
                if !to_delete.is_empty() {
                    let (reason, verb) = if node_count > 1 {
                        ("GangRestart", "restarting the whole gang")
                    } else {
                        ("PodFailed", "recreating it")
                    };
                    desired.decisions.push(decision(
                        Severity::Warning,
                        reason,
                        format!("{what}: {}; {verb}", broken.join(", ")),
                    ));
                    desired.deletions.extend(to_delete);
                }
                continue;
            }
            if view.outdated(&hash) {
                let may_roll =
                    !view.ready() || (earlier_settled && unavailable == 0 && !rolled_one);
                if may_roll {
                    rolled_one |= view.ready();
                    desired.deletions.extend(view.live().map(pod_key));
                    desired.decisions.push(decision(
                        Severity::Normal,
                        "RollingUpdate",
                        format!("replacing {what} with the new spec"),
                    ));
                }
                continue;
            }
            let mut pods = fresh();
            if node_count == 1 {
                desired.pods.extend(pods);
                continue;
            }
            let request = gang_request(g, service, spec, view.replica)?;
            let pinned = view
                .live()
                .filter(|p| !pods::is_gated(p))
                .find_map(|p| pods::pinned_domain(p, &request.domain_label));
            if let Some(domain) = pinned {
                for pod in &mut pods {
                    pods::release(pod, &request.domain_label, &domain);
                }
                desired.pods.extend(pods);
                continue;
            }
            match capacity.place(&request) {
                GangPlacement::Placed(placement) => {
                    capacity.commit(&request, &placement);
                    for pod in &mut pods {
                        pods::release(pod, &placement.domain_label, &placement.domain);
                    }
                    desired.decisions.push(decision(
                        Severity::Normal,
                        "GangScheduled",
                        format!(
                            "{what}: placed in {}={} (nodes {}), releasing all {node_count} pods",
                            placement.domain_label,
                            placement.domain,
                            placement.nodes.join(", ")
                        ),
                    ));
                }
                GangPlacement::Pending { reason, .. } => {
                    let message = format!("{what} {reason}");
                    if matches!(empty_cluster.place(&request), GangPlacement::Pending { .. }) {
                        outcome
                            .gangs_unschedulable
                            .push(format!("{message}, and would not fit even on idle nodes"));
                    }
                    desired.decisions.push(decision(
                        Severity::Warning,
                        "GangPending",
                        message.clone(),
                    ));
                    outcome.gangs_pending.push(message);
                }
            }
            desired.pods.extend(pods);
        }

        // Pods of this service outside the desired replicas (scaled down) or of an old shape.
        let leftovers: Vec<&&Pod> = own_pods
            .iter()
            .filter(|p| label(p, labels::COMPONENT) == Some(service.as_str()))
            .filter(|p| !expected.contains(p.metadata.name.as_deref().unwrap_or_default()))
            .collect();

        outcome.status = ServiceReplicaStatus {
            replicas: views.iter().filter(|v| v.exists()).count() as i32,
            updated_replicas: views
                .iter()
                .filter(|v| v.all_live() && !v.outdated(&hash))
                .count() as i32,
            ready_replicas: views.iter().filter(|v| v.ready()).count() as i32,
        };
        outcome.ready =
            leftovers.is_empty() && views.iter().all(|v| v.ready() && !v.outdated(&hash));
        earlier_settled &= outcome.ready;
        outcomes.push(outcome);
    }

    // Our pods that no replica wants: scaled down, removed services, old shapes.
    let mut leftovers: Vec<&Pod> = own_pods
        .into_iter()
        .filter(|p| !expected.contains(p.metadata.name.as_deref().unwrap_or_default()))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    leftovers.sort_by_key(|p| p.metadata.name.clone());
    if !leftovers.is_empty() {
        let list: Vec<&str> = leftovers
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        desired.decisions.push(decision(
            Severity::Normal,
            "ScaledDown",
            format!("deleting pods no longer in the spec: {}", list.join(", ")),
        ));
        desired.deletions.extend(leftovers.into_iter().map(pod_key));
    }
    Ok(outcomes)
}

fn gang_request(
    g: &Graph,
    service: &str,
    spec: &ComponentSpec,
    replica: u32,
) -> Result<GangRequest, ReconcileError> {
    let (gpus_per_pod, gpu_resource) = pods::gpu_request(spec);
    Ok(GangRequest {
        name: names::gang(g.name, service, replica),
        pods: spec.node_count().max(1) as u32,
        gpus_per_pod,
        gpu_resource,
        domain_label: g.gang_domain_label(service, spec)?,
    })
}

fn describe(service: &str, replica: u32, node_count: u32) -> String {
    if node_count > 1 {
        format!("{service} replica {replica} (gang of {node_count})")
    } else {
        format!("{service} replica {replica}")
    }
}

pub(crate) fn decision(severity: Severity, reason: &str, message: String) -> Decision {
    Decision {
        severity,
        reason: reason.into(),
        message,
    }
}

fn pod_key(pod: &Pod) -> ObjectKey {
    ObjectKey {
        kind: ObjectKind::Pod,
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone(),
    }
}

fn label<'p>(pod: &'p Pod, key: &str) -> Option<&'p str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The pod's `Ready` condition is true.
pub(crate) fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
