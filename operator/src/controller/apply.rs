//! Writes the pure reconciler's [`Desired`] to the API server: server-side apply of every
//! object (one field manager, forced, so the operator always wins over its own earlier
//! writes), creation of missing scaling adapters, and deletions with UID preconditions.
//! Every write is tried even when an earlier one failed; the failures come back together.

use std::fmt::Debug;

use futures::future::BoxFuture;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::{ChildError, Error, Verb};
use crate::reconcile::kinds::{Child, KindVisitor, Write, each_kind};
use crate::reconcile::{Desired, FIELD_MANAGER, ObjectKey, ObjectKind};

/// Applies, creates and deletes what `desired` asks for in `namespace`: kind by kind in the
/// table's order (`reconcile::kinds`, where what a pod needs comes before the pod), then the
/// deletions.
pub async fn children(client: &Client, namespace: &str, desired: &Desired) -> Result<(), Error> {
    let mut writes = Writes {
        client,
        namespace,
        failed: Vec::new(),
        total: 0,
    };
    let kinds = each_kind(&mut KindWrites);
    for kind in &kinds {
        (kind.write)(&mut writes, desired).await;
    }
    for key in &desired.deletions {
        let kind = kinds
            .iter()
            .find(|k| k.kind == key.kind)
            .expect("every kind is in the table");
        (kind.delete)(&mut writes, key).await;
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

/// The writes of one kind of the table, typed.
struct KindWrites;

struct Ops {
    kind: ObjectKind,
    /// Writes every desired object of the kind.
    write: for<'a> fn(&'a mut Writes<'_>, &'a Desired) -> BoxFuture<'a, ()>,
    delete: for<'a> fn(&'a mut Writes<'_>, &'a ObjectKey) -> BoxFuture<'a, ()>,
}

impl KindVisitor for KindWrites {
    type Out = Ops;

    fn visit<K: Child>(&mut self) -> Ops {
        Ops {
            kind: K::KIND,
            write: |writes, desired| {
                Box::pin(async move {
                    for object in K::desired(desired) {
                        match K::WRITE {
                            Write::Apply => writes.apply(K::KIND, object).await,
                            Write::Create => writes.create(K::KIND, object).await,
                        }
                    }
                })
            },
            delete: |writes, key| Box::pin(writes.delete::<K>(key)),
        }
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

    async fn apply<K: Child>(&mut self, kind: ObjectKind, object: &K) {
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
    async fn create<K: Child>(&mut self, kind: ObjectKind, object: &K) {
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

    async fn delete<K: Child>(&mut self, key: &ObjectKey) {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: key.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        let name = key.name.as_str();
        let result = match self.api::<K>().delete(name, &params).await {
            // Already gone (404), or a namesake with another UID replaced it (409): done.
            Err(e) if matches!(status_code(&e), Some(404 | 409)) => Ok(()),
            other => other.map(drop),
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
