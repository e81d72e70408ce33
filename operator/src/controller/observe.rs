//! Builds the pure reconciler's [`Observed`] for one graph from the watch caches.

use std::collections::{BTreeMap, HashSet};

use dynamo_crds::DynamoGraphDeployment;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::context::{ChildStores, Stores};
use crate::reconcile::kinds::{Child, KindVisitor, Observe, each_kind};
use crate::reconcile::{ObjectKey, Observed, labels};

pub fn observe(dgd: &DynamoGraphDeployment, stores: &Stores) -> Observed {
    let mut observed = Observed::default();
    each_kind(&mut Read {
        stores: &stores.children,
        namespace: dgd.namespace().unwrap_or_default(),
        name: dgd.name_any(),
        uid: dgd.uid().unwrap_or_default(),
        observed: &mut observed,
    });

    // Nodes and the other workloads' pods matter only for gang placement, and copying
    // them is the dearest part of a pass: only graphs with gangs get them, and of another
    // workload's pod only what placement reads (node, phase, extended resources).
    if dgd.spec.services.values().any(|s| s.multinode.is_some()) {
        let ours: HashSet<&str> = (observed.pods.iter())
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        let other_pods = (stores.children.get::<Pod>().into_iter())
            .flat_map(|pods| {
                pods.state_filter(|p| {
                    !p.metadata.uid.as_deref().is_some_and(|u| ours.contains(u))
                        && p.spec.as_ref().is_some_and(|s| s.node_name.is_some())
                })
            })
            .filter_map(|p| gpu_holder(&p))
            .collect();
        observed.other_pods = other_pods;
        observed.nodes = stores.nodes.state().iter().map(|n| (**n).clone()).collect();
    }
    observed.now = Some(Time(Timestamp::now()));
    observed.fresh_token = dynamo_wiring::credential::new_token();
    observed
}

/// Reads one graph's objects of each watched kind out of the caches, as the table's
/// [`Observe`] says.
struct Read<'a> {
    stores: &'a ChildStores,
    namespace: String,
    name: String,
    uid: String,
    observed: &'a mut Observed,
}

impl Read<'_> {
    fn in_namespace(&self, meta: &ObjectMeta) -> bool {
        meta.namespace.as_deref() == Some(self.namespace.as_str())
    }

    /// Only objects the graph controls: a user's object that merely carries our label is
    /// never listed for deletion.
    fn controlled(&self, meta: &ObjectMeta) -> bool {
        self.in_namespace(meta)
            && (meta.owner_references.iter().flatten())
                .any(|o| o.uid == self.uid && o.controller == Some(true))
    }

    fn labeled(&self, meta: &ObjectMeta) -> bool {
        self.in_namespace(meta)
            && meta.labels.as_ref().and_then(|l| l.get(labels::GRAPH)) == Some(&self.name)
    }
}

impl KindVisitor for Read<'_> {
    type Out = ();

    fn visit<K: Child>(&mut self) {
        let Some(store) = self.stores.get::<K>() else {
            return;
        };
        // `state_filter` copies only the matches out of the caches.
        match K::OBSERVE {
            Observe::Keys => {
                let keys = store
                    .state_filter(|o| self.controlled(o.meta()))
                    .iter()
                    .map(|o| ObjectKey {
                        kind: K::KIND,
                        name: o.meta().name.clone().unwrap_or_default(),
                        uid: o.meta().uid.clone(),
                    })
                    .collect::<Vec<_>>();
                self.observed.owned.extend(keys);
            }
            Observe::Controlled(field) => {
                let objects = store.state_filter(|o| self.controlled(o.meta()));
                (field.get_mut)(self.observed).extend(objects.iter().map(|o| (**o).clone()));
            }
            Observe::Labeled(field) => {
                let objects = store.state_filter(|o| self.labeled(o.meta()));
                (field.get_mut)(self.observed).extend(objects.iter().map(|o| (**o).clone()));
            }
        }
    }
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
