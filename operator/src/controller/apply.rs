//! Writes the pure reconciler's [`Desired`] to the API server: server-side apply of every
//! object (one field manager, forced, so the operator always wins over its own earlier
//! writes), creation of missing scaling adapters, and deletions with UID preconditions.
//! Every write is tried even when an earlier one failed; the failures come back together.

use std::fmt::Debug;

use dynamo_crds::DynamoGraphDeploymentScalingAdapter;
use dynamo_crds::inference_pool::InferencePool;
use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::{ChildError, Error, Verb};
use crate::reconcile::{Desired, FIELD_MANAGER, ObjectKey, ObjectKind};

/// Applies, creates and deletes what `desired` asks for in `namespace`.
pub async fn children(client: &Client, namespace: &str, desired: &Desired) -> Result<(), Error> {
    let mut writes = Writes {
        client,
        namespace,
        failed: Vec::new(),
        total: 0,
    };
    // What a pod needs exists before the pod: the API server's ServiceAccount admission
    // refuses a pod whose account is missing, and the scheduler holds back one whose
    // claim is. The account comes before the Role, both before the binding joining them.
    for o in &desired.service_accounts {
        writes.apply(ObjectKind::ServiceAccount, o).await;
    }
    for o in &desired.roles {
        writes.apply(ObjectKind::Role, o).await;
    }
    for o in &desired.role_bindings {
        writes.apply(ObjectKind::RoleBinding, o).await;
    }
    for o in &desired.persistent_volume_claims {
        writes.create(ObjectKind::PersistentVolumeClaim, o).await;
    }
    for o in &desired.services {
        writes.apply(ObjectKind::Service, o).await;
    }
    for o in &desired.pods {
        writes.apply(ObjectKind::Pod, o).await;
    }
    for o in &desired.deployments {
        writes.apply(ObjectKind::Deployment, o).await;
    }
    for o in &desired.inference_pools {
        writes.apply(ObjectKind::InferencePool, o).await;
    }
    for o in &desired.http_routes {
        writes.apply(ObjectKind::HTTPRoute, o).await;
    }
    for o in &desired.scaling_adapters {
        writes
            .create(ObjectKind::DynamoGraphDeploymentScalingAdapter, o)
            .await;
    }
    for key in &desired.deletions {
        writes.delete(key).await;
    }
    if writes.failed.is_empty() {
        Ok(())
    } else {
        Err(Error::Children {
            failed: writes.failed,
            total: writes.total,
        })
    }
}

struct Writes<'a> {
    client: &'a Client,
    namespace: &'a str,
    failed: Vec<ChildError>,
    total: usize,
}

impl Writes<'_> {
    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), self.namespace)
    }

    fn record(&mut self, verb: Verb, kind: ObjectKind, name: &str, result: kube::Result<()>) {
        self.total += 1;
        if let Err(source) = result {
            self.failed.push(ChildError {
                verb,
                kind,
                name: name.to_string(),
                source,
            });
        }
    }

    async fn apply<K>(&mut self, kind: ObjectKind, object: &K)
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Serialize
            + DeserializeOwned
            + Clone
            + Debug,
    {
        let name = object.meta().name.clone().unwrap_or_default();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let result = self
            .api::<K>()
            .patch(&name, &params, &Patch::Apply(object))
            .await
            .map(drop);
        self.record(Verb::Apply, kind, &name, result);
    }

    /// Creates `object` unless it exists: for objects whose spec, once made, belongs to
    /// someone else (an adapter's replicas) or cannot change (a claim).
    async fn create<K>(&mut self, kind: ObjectKind, object: &K)
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Serialize
            + DeserializeOwned
            + Clone
            + Debug,
    {
        let name = object.meta().name.clone().unwrap_or_default();
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        let result = match self.api::<K>().create(&params, object).await {
            // Made by an earlier pass the cache has not seen yet.
            Err(e) if status_code(&e) == Some(409) => Ok(()),
            other => other.map(drop),
        };
        self.record(Verb::Create, kind, &name, result);
    }

    async fn delete(&mut self, key: &ObjectKey) {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: key.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        let name = key.name.as_str();
        let result = match key.kind {
            ObjectKind::Pod => self.api::<Pod>().delete(name, &params).await.map(drop),
            ObjectKind::Service => self.api::<Service>().delete(name, &params).await.map(drop),
            ObjectKind::Deployment => self
                .api::<Deployment>()
                .delete(name, &params)
                .await
                .map(drop),
            ObjectKind::InferencePool => self
                .api::<InferencePool>()
                .delete(name, &params)
                .await
                .map(drop),
            ObjectKind::HTTPRoute => self
                .api::<HttpRoute>()
                .delete(name, &params)
                .await
                .map(drop),
            ObjectKind::DynamoGraphDeploymentScalingAdapter => self
                .api::<DynamoGraphDeploymentScalingAdapter>()
                .delete(name, &params)
                .await
                .map(drop),
            ObjectKind::ServiceAccount => self
                .api::<ServiceAccount>()
                .delete(name, &params)
                .await
                .map(drop),
            ObjectKind::Role => self.api::<Role>().delete(name, &params).await.map(drop),
            ObjectKind::RoleBinding => self
                .api::<RoleBinding>()
                .delete(name, &params)
                .await
                .map(drop),
            ObjectKind::PersistentVolumeClaim => self
                .api::<PersistentVolumeClaim>()
                .delete(name, &params)
                .await
                .map(drop),
        };
        // Already gone (404), or a namesake with another UID replaced it (409): done.
        let result = match result {
            Err(e) if matches!(status_code(&e), Some(404 | 409)) => Ok(()),
            other => other,
        };
        self.record(Verb::Delete, key.kind, name, result);
    }
}

/// Writes `status` to `object`'s status subresource (server-side apply, forced) unless it
/// is the `current` one already.
pub(crate) async fn write_status<K, S>(
    client: &Client,
    object: &K,
    current: Option<&S>,
    status: &S,
) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + Clone
        + Debug,
    S: Serialize + PartialEq,
{
    if current == Some(status) {
        return Ok(());
    }
    let name = object.meta().name.clone().unwrap_or_default();
    let namespace = object.meta().namespace.clone().unwrap_or_default();
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    Api::<K>::namespaced(client.clone(), &namespace)
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map(drop)
        .map_err(|source| Error::Status {
            kind: K::kind(&()).into_owned(),
            name,
            source,
        })
}

pub(crate) fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}
