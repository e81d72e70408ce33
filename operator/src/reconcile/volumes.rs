//! Claims the graph creates: each `spec.pvcs` entry with `create: true` becomes a
//! PersistentVolumeClaim of that name, owned by the graph so it goes when the graph goes.
//! It is created once and never changed: a claim's class and access modes cannot change,
//! and the data in it (downloaded weights, a compilation cache) should outlive edits of
//! the graph, so a claim dropped from `spec.pvcs` stays until the graph is deleted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};

use super::graph::Graph;
use super::{Desired, ObjectKind, Observed};

pub(crate) fn build(g: &Graph, observed: &Observed, desired: &mut Desired) {
    for pvc in g.spec.pvcs.iter().flatten() {
        let exists = observed
            .owned
            .iter()
            .any(|k| k.kind == ObjectKind::PersistentVolumeClaim && k.name == pvc.name);
        if pvc.create != Some(true) || exists {
            continue;
        }
        desired
            .persistent_volume_claims
            .push(PersistentVolumeClaim {
                metadata: g.metadata(pvc.name.clone(), g.labels()),
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: pvc.volume_access_mode.clone().map(|mode| vec![mode]),
                    storage_class_name: pvc.storage_class.clone(),
                    resources: pvc.size.clone().map(|size| VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([("storage".to_string(), size)])),
                        ..VolumeResourceRequirements::default()
                    }),
                    ..PersistentVolumeClaimSpec::default()
                }),
                status: None,
            });
    }
}
