//! The kinds of object the graph controller generates, in one table.
//!
//! Each row of the table below is one kind: its Rust type, its [`ObjectKind`], the
//! [`Desired`] field its objects are built into, and (where it differs from the default)
//! how the controller writes ([`Write`]), watches ([`Watch`], [`Child::OPTIONAL`]), observes
//! ([`Observe`]) and deletes ([`Delete`]) it. The rows are in the order the controller writes
//! the kinds: what a pod needs exists before the pod (the API server's ServiceAccount
//! admission refuses a pod whose account is missing, and the scheduler holds back one whose
//! claim is; the account comes before the Role, both before the binding joining them), the
//! adapters last; deletions come after every write, in the reverse order.
//!
//! Everything per kind (the controller's writes, deletions, watches, the caches it reads,
//! the tests' caches and the real-cluster test of collection) goes through [`each_kind`],
//! so a new kind is one row here, its `Desired` field and its place in
//! [`Desired::to_yaml`] (the compiler asks for both), and its RBAC rule
//! (`controller/rbac.rs`, checked against the table by a test).

use std::fmt::Debug;

use dynamo_crds::DynamoGraphDeploymentScalingAdapter;
use dynamo_crds::inference_pool::InferencePool;
use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Desired, Observed};

/// How the controller writes a kind's desired objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// Server-side applied on every pass with [`super::FIELD_MANAGER`] and `force`: the
    /// operator owns what it generates.
    Apply,
    /// Created when missing and never rewritten: `Desired` holds only the missing ones (a
    /// 409 counts as done). An adapter's replicas belong to whoever scales it; a claim
    /// cannot change.
    Create,
}

/// How the controller watches a kind: one cluster-wide watch feeding a cache and triggers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    /// Not watched, so never observed (claims: created once, then left to the garbage
    /// collector).
    No,
    /// Every object; a change wakes the graph that controls the object.
    All,
    /// Only objects with the graph label (every namespace has plenty of its own), which
    /// wake the graph that controls them.
    Labeled,
    /// Every object, with triggers of its own in `controller/watches.rs`: a pod also wakes
    /// the graphs waiting for GPUs; an adapter has a controller of its own and wakes its
    /// graph only when it goes.
    Custom,
}

/// How the controller reads which objects of a (watched) kind a graph has.
pub enum Observe<K: 'static> {
    /// Their keys, in [`Observed::owned`]: the objects the graph controls.
    Keys,
    /// The objects the graph controls, whole, in a field of [`Observed`] (their status is
    /// read).
    Controlled(Field<K>),
    /// The objects carrying the graph label, whole and in any state, in a field of
    /// [`Observed`].
    Labeled(Field<K>),
}

/// A field of [`Observed`] holding whole objects of one kind.
pub struct Field<K: 'static> {
    pub get: fn(&Observed) -> &Vec<K>,
    pub get_mut: fn(&mut Observed) -> &mut Vec<K>,
}

macro_rules! field {
    ($name:ident) => {
        Field {
            get: |o| &o.$name,
            get_mut: |o| &mut o.$name,
        }
    };
}

/// Which objects of a kind the pure function deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delete {
    /// Those the graph has that it no longer wants (a removed service, a graph that lost its
    /// workers or its gateway annotation, a service no longer scaled by an adapter).
    Unwanted,
    /// Only those it decides on one by one (pods: rolled, failed, gangs restarted).
    Decided,
    /// None: they stay until the garbage collector takes them with the graph (the data in
    /// a claim should outlive edits of the graph).
    Never,
}

/// A kind of object the graph controller generates: a row of the table.
pub trait Child:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    const KIND: ObjectKind;
    const WRITE: Write = Write::Apply;
    const WATCH: Watch = Watch::All;
    /// `Some(remedy)`: the cluster may lack the API (it is looked for at start-up); without
    /// it the graph's objects of the kind are skipped and a Warning Event gives the remedy.
    const OPTIONAL: Option<&'static str> = None;
    const OBSERVE: Observe<Self> = Observe::Keys;
    const DELETE: Delete = Delete::Unwanted;

    /// The objects of the kind one pass wants.
    fn desired(d: &Desired) -> &[Self];
    fn desired_mut(d: &mut Desired) -> &mut Vec<Self>;
}

/// Something done once per kind of the table (see [`each_kind`]).
pub trait KindVisitor {
    type Out;
    fn visit<K: Child>(&mut self) -> Self::Out;
}

macro_rules! table {
    ($($(#[$doc:meta])* $kind:ident($ty:ty) in $field:ident { $($settings:tt)* })*) => {
        /// Kinds of object the operator creates, in the order the controller writes them.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        pub enum ObjectKind {
            $($(#[$doc])* $kind,)*
        }

        impl ObjectKind {
            /// Every kind, in the table's order.
            pub const ALL: &[ObjectKind] = &[$(ObjectKind::$kind),*];
        }

        $(impl Child for $ty {
            const KIND: ObjectKind = ObjectKind::$kind;
            $($settings)*

            fn desired(d: &Desired) -> &[Self] {
                &d.$field
            }
            fn desired_mut(d: &mut Desired) -> &mut Vec<Self> {
                &mut d.$field
            }
        })*

        /// Calls `visitor` once per kind, in the table's order; returns what it returned.
        pub fn each_kind<V: KindVisitor>(visitor: &mut V) -> Vec<V::Out> {
            vec![$(visitor.visit::<$ty>()),*]
        }
    };
}

table! {
    /// The EPP's and the planners' API access (see `epp_access`, `planner_access`).
    ServiceAccount(ServiceAccount) in service_accounts {
        const WATCH: Watch = Watch::Labeled;
    }
    Role(Role) in roles {
        const WATCH: Watch = Watch::Labeled;
    }
    RoleBinding(RoleBinding) in role_bindings {
        const WATCH: Watch = Watch::Labeled;
    }
    /// Claims of `spec.pvcs` with `create: true` (see `volumes`).
    PersistentVolumeClaim(PersistentVolumeClaim) in persistent_volume_claims {
        const WRITE: Write = Write::Create;
        const WATCH: Watch = Watch::No;
        const DELETE: Delete = Delete::Never;
    }
    /// The graph's block API credential (see `credential`): never read back, so the
    /// operator needs no right to read Secrets.
    Secret(Secret) in secrets {
        const WRITE: Write = Write::Create;
        const WATCH: Watch = Watch::No;
        const DELETE: Delete = Delete::Never;
    }
    /// See `network_policy`.
    NetworkPolicy(NetworkPolicy) in network_policies {
        const WATCH: Watch = Watch::Labeled;
    }
    Service(Service) in services {}
    /// Engine pods, created directly (see `replicas`, `pods`).
    Pod(Pod) in pods {
        const WATCH: Watch = Watch::Custom;
        const OBSERVE: Observe<Self> = Observe::Labeled(field!(pods));
        const DELETE: Delete = Delete::Decided;
    }
    /// The EPP and the planners.
    Deployment(Deployment) in deployments {
        const OBSERVE: Observe<Self> = Observe::Controlled(field!(deployments));
    }
    InferencePool(InferencePool) in inference_pools {
        const OPTIONAL: Option<&'static str> = Some(
            "install the Gateway API Inference Extension CRDs and restart the operator to \
             route through a Gateway",
        );
    }
    HTTPRoute(HttpRoute) in http_routes {
        const OPTIONAL: Option<&'static str> =
            Some("install the Gateway API CRDs and restart the operator");
    }
    /// See `adapters`.
    DynamoGraphDeploymentScalingAdapter(DynamoGraphDeploymentScalingAdapter) in scaling_adapters {
        const WRITE: Write = Write::Create;
        const WATCH: Watch = Watch::Custom;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Kinds;
    impl KindVisitor for Kinds {
        type Out = (ObjectKind, String);
        fn visit<K: Child>(&mut self) -> Self::Out {
            (K::KIND, K::kind(&()).into_owned())
        }
    }

    #[test]
    fn each_kind_visits_every_kind_once_in_the_table_order() {
        let visited = each_kind(&mut Kinds);
        let kinds: Vec<ObjectKind> = visited.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, ObjectKind::ALL);
        // Each variant is named after its Kubernetes kind (Events and errors use both).
        for (kind, name) in visited {
            assert_eq!(format!("{kind:?}"), name);
        }
    }

    #[test]
    fn what_a_pod_needs_is_written_before_the_pod() {
        let position = |kind| ObjectKind::ALL.iter().position(|k| *k == kind).unwrap();
        for needed in [
            ObjectKind::ServiceAccount,
            ObjectKind::Role,
            ObjectKind::RoleBinding,
            ObjectKind::PersistentVolumeClaim,
            ObjectKind::Secret,
            ObjectKind::NetworkPolicy,
        ] {
            assert!(position(needed) < position(ObjectKind::Pod), "{needed:?}");
        }
        assert!(position(ObjectKind::ServiceAccount) < position(ObjectKind::Role));
        assert!(position(ObjectKind::Role) < position(ObjectKind::RoleBinding));
    }
}
