//! Where the planner reads the graph's replicas and writes new ones: on a cluster the
//! scale subresource of each service's DynamoGraphDeploymentScalingAdapter ([`super::kube`]),
//! locally the runner's admin API ([`super::local`]). Both give the same [`GraphView`].

use dynamo_names::Role;
use dynamo_planner::decide::{PerRole, Replicas};
use thiserror::Error;

/// One engine service as the planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceView {
    pub name: String,
    pub role: Role,
    /// The replicas asked for (the adapter's `spec.replicas`; locally, the replicas running).
    pub replicas: u32,
    /// Whether a change is still rolling out: replicas not all updated and ready.
    pub rolling_out: bool,
}

/// The engine services of the graph.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct GraphView {
    pub services: Vec<ServiceView>,
}

impl GraphView {
    /// The replicas per role: a prefill and a decode service, or one aggregated worker
    /// service. Any other shape is an error that names it (the planner sets one service
    /// per role).
    pub fn replicas(&self) -> Result<Replicas, ShapeError> {
        let one = |role: Role| -> Result<Option<u32>, ShapeError> {
            let mut of_role = self.services.iter().filter(|s| s.role == role);
            match (of_role.next(), of_role.next()) {
                (None, _) => Ok(None),
                (Some(s), None) => Ok(Some(s.replicas)),
                (Some(a), Some(b)) => Err(ShapeError::TwoServices {
                    role,
                    first: a.name.clone(),
                    second: b.name.clone(),
                }),
            }
        };
        match (
            one(Role::Prefill)?,
            one(Role::Decode)?,
            one(Role::Aggregated)?,
        ) {
            (Some(prefill), Some(decode), None) => Ok(PerRole::Disaggregated { prefill, decode }),
            (None, None, Some(worker)) => Ok(PerRole::Aggregated { worker }),
            _ => Err(ShapeError::Roles(
                self.services
                    .iter()
                    .map(|s| format!("{} ({})", s.name, s.role))
                    .collect::<Vec<_>>()
                    .join(", "),
            )),
        }
    }

    pub fn rolling_out(&self) -> bool {
        self.services.iter().any(|s| s.rolling_out)
    }

    /// The service that plays `role`.
    pub fn service(&self, role: Role) -> Option<&ServiceView> {
        self.services.iter().find(|s| s.role == role)
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum ShapeError {
    #[error(
        "services {first:?} and {second:?} are both {role}: the planner sets one service per role"
    )]
    TwoServices {
        role: Role,
        first: String,
        second: String,
    },
    #[error(
        "the planner needs a prefill and a decode service, or one aggregated worker service; the graph has: {0}"
    )]
    Roles(String),
}

/// Why reading or writing replicas failed. [`ScaleError::label`] is the metric label.
#[derive(Debug, Error)]
pub enum ScaleError {
    /// Someone else changed the object between our read and write (HTTP 409).
    #[error("conflict writing {0}: it changed since it was read; retried next interval")]
    Conflict(String),
    /// Our ServiceAccount may not do this (HTTP 403): the RBAC the operator generates allows
    /// only this graph's adapters.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The object is not there (HTTP 404). The planner never falls back to writing the
    /// graph itself (that would fight HPA/KEDA and a user's own edits).
    #[error("not found: {0}")]
    NotFound(String),
    #[error("{0}")]
    Other(String),
}

impl ScaleError {
    pub fn label(&self) -> &'static str {
        match self {
            ScaleError::Conflict(_) => "conflict",
            ScaleError::Forbidden(_) => "forbidden",
            ScaleError::NotFound(_) => "not_found",
            ScaleError::Other(_) => "error",
        }
    }
}

/// Where replicas live.
pub enum Target {
    Local(super::local::LocalTarget),
    Kube(Box<super::kube::KubeTarget>),
}

impl Target {
    pub async fn read(&self) -> Result<GraphView, ScaleError> {
        match self {
            Target::Local(t) => t.read().await,
            Target::Kube(t) => t.read().await,
        }
    }

    pub async fn write(&self, service: &str, replicas: u32) -> Result<(), ScaleError> {
        match self {
            Target::Local(t) => t.write(service, replicas).await,
            Target::Kube(t) => t.write(service, replicas).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, role: Role, replicas: u32) -> ServiceView {
        ServiceView {
            name: name.into(),
            role,
            replicas,
            rolling_out: false,
        }
    }

    #[test]
    fn replicas_follow_the_graph_shape() {
        let disagg = GraphView {
            services: vec![
                service("decode", Role::Decode, 3),
                service("prefill", Role::Prefill, 2),
            ],
        };
        assert_eq!(
            disagg.replicas(),
            Ok(PerRole::Disaggregated {
                prefill: 2,
                decode: 3
            })
        );
        let agg = GraphView {
            services: vec![service("w", Role::Aggregated, 1)],
        };
        assert_eq!(agg.replicas(), Ok(PerRole::Aggregated { worker: 1 }));
    }

    #[test]
    fn shapes_the_planner_cannot_set_are_named() {
        let two = GraphView {
            services: vec![
                service("a", Role::Aggregated, 1),
                service("b", Role::Aggregated, 1),
            ],
        };
        assert!(matches!(
            two.replicas(),
            Err(ShapeError::TwoServices { .. })
        ));
        let half = GraphView {
            services: vec![service("p", Role::Prefill, 1)],
        };
        let err = half.replicas().unwrap_err().to_string();
        assert!(err.contains("p (prefill)"), "{err}");
        assert!(GraphView::default().replicas().is_err());
    }
}
