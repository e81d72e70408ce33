//! A graph's replicas on a cluster: read from the graph and its scaling adapters, written
//! to the adapters' scale subresource (`dynamographdeploymentscalingadapters/scale`), where
//! HPA and KEDA write too. Never the graph itself: the adapter's controller copies its
//! replicas into the graph, so a write here and a user's `kubectl scale` of the adapter
//! meet in one place, and a missing adapter is an error, not a fallback (dynamo#13538).

use dynamo_crds::{DynamoGraphDeployment, DynamoGraphDeploymentScalingAdapter, ServiceRole};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::target::{GraphView, ScaleError, ServiceView};
use dynamo_operator::reconcile::names;

pub struct KubeTarget {
    graphs: Api<DynamoGraphDeployment>,
    adapters: Api<DynamoGraphDeploymentScalingAdapter>,
    graph: String,
}

impl KubeTarget {
    pub fn new(client: Client, namespace: &str, graph: &str) -> Self {
        Self {
            graphs: Api::namespaced(client.clone(), namespace),
            adapters: Api::namespaced(client, namespace),
            graph: graph.to_string(),
        }
    }

    /// Each engine service's replicas from its adapter's scale subresource; rolling out
    /// while the graph has not caught up with the adapter or its pods are not all updated
    /// and ready (Dynamo's "desired == updated == ready" stability check).
    pub async fn read(&self) -> Result<GraphView, ScaleError> {
        let dgd = self
            .graphs
            .get(&self.graph)
            .await
            .map_err(|e| error(&format!("graph {}", self.graph), e))?;
        let status = dgd.status.as_ref();
        let stale = match (
            status.and_then(|s| s.observed_generation),
            dgd.metadata.generation,
        ) {
            (Some(seen), Some(generation)) => seen < generation,
            _ => true,
        };
        let mut services = Vec::new();
        for (service, spec) in &dgd.spec.services {
            let ServiceRole::Engine(role) = spec.role() else {
                continue;
            };
            let adapter = names::scaling_adapter(&self.graph, service);
            let scale = self
                .adapters
                .get_scale(&adapter)
                .await
                .map_err(|e| error(&format!("scaling adapter {adapter}"), e))?;
            let wanted = scale.spec.and_then(|s| s.replicas).unwrap_or(0).max(0);
            let counts = status
                .and_then(|s| s.services.as_ref())
                .and_then(|s| s.get(service));
            let settled = counts.is_some_and(|c| {
                c.replicas == wanted && c.updated_replicas == wanted && c.ready_replicas >= wanted
            });
            services.push(ServiceView {
                name: service.clone(),
                role,
                replicas: wanted as u32,
                rolling_out: stale || spec.replicas != Some(wanted) || !settled,
            });
        }
        Ok(GraphView { services })
    }

    pub async fn write(&self, service: &str, replicas: u32) -> Result<(), ScaleError> {
        let adapter = names::scaling_adapter(&self.graph, service);
        let patch = serde_json::json!({ "spec": { "replicas": replicas } });
        self.adapters
            .patch_scale(&adapter, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| error(&format!("scaling adapter {adapter}"), e))
    }
}

/// An API error as the planner reports it, by its HTTP code.
fn error(what: &str, e: kube::Error) -> ScaleError {
    let message = format!("{what}: {e}");
    match &e {
        kube::Error::Api(s) if s.code == 409 => ScaleError::Conflict(message),
        kube::Error::Api(s) if s.code == 403 => ScaleError::Forbidden(message),
        kube::Error::Api(s) if s.code == 404 => ScaleError::NotFound(message),
        _ => ScaleError::Other(message),
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, Response};
    use kube::client::Body;

    use super::*;

    /// A client whose every request is answered with `status` and `body`, and the requests
    /// it made.
    async fn write_answered(
        status: u16,
        body: serde_json::Value,
    ) -> (
        Result<(), ScaleError>,
        Vec<(String, String, serde_json::Value)>,
    ) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let target = KubeTarget::new(Client::new(service, "ns"), "ns", "g");
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some((request, send)) = handle.next_request().await {
                let (parts, sent) = request.into_parts();
                let bytes = sent.collect_bytes().await.unwrap();
                seen.push((
                    parts.method.to_string(),
                    parts.uri.path().to_string(),
                    serde_json::from_slice(&bytes).unwrap_or_default(),
                ));
                let reply = serde_json::to_vec(&body_of(status, &body)).unwrap();
                send.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(reply))
                        .unwrap(),
                );
            }
            seen
        });
        let result = target.write("worker", 3).await;
        drop(target);
        (result, server.await.unwrap())
    }

    fn body_of(status: u16, body: &serde_json::Value) -> serde_json::Value {
        if status < 300 {
            return body.clone();
        }
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "refused", "reason": "Refused", "code": status
        })
    }

    #[tokio::test]
    async fn a_write_patches_the_adapters_scale_subresource() {
        let scale = serde_json::json!({
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": "g-worker"}, "spec": {"replicas": 3}, "status": {"replicas": 1}
        });
        let (result, seen) = write_answered(200, scale).await;
        result.unwrap();
        assert_eq!(seen.len(), 1);
        let (method, path, body) = &seen[0];
        assert_eq!(method, "PATCH");
        assert_eq!(
            path,
            "/apis/nvidia.com/v1alpha1/namespaces/ns/dynamographdeploymentscalingadapters/g-worker/scale"
        );
        assert_eq!(body, &serde_json::json!({"spec": {"replicas": 3}}));
    }

    #[tokio::test]
    async fn refused_writes_are_told_apart() {
        for (status, label) in [
            (409, "conflict"),
            (403, "forbidden"),
            (404, "not_found"),
            (500, "error"),
        ] {
            let (result, seen) = write_answered(status, serde_json::Value::Null).await;
            let err = result.unwrap_err();
            assert_eq!(err.label(), label, "{status}: {err}");
            // One attempt; never a fallback write to the graph itself.
            assert!(
                seen.iter()
                    .all(|(_, path, _)| path.ends_with("/g-worker/scale")),
                "{seen:?}"
            );
        }
    }
}
