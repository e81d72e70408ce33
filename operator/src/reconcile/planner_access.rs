//! A planner's own API access: a ServiceAccount, a Role and its RoleBinding per planner
//! service, so the planner reads its graph and scales the graph's engine services through
//! their scaling adapters, and nothing else: every rule is limited to those objects by
//! name. A planner service that names its own `serviceAccountName` brings its own access.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding};

use super::access::bound_account;
use super::graph::Graph;
use super::{adapter_enabled, names};

/// Which objects of a planner rule it may touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlannerScope {
    /// Its graph.
    Graph,
    /// The scaling adapters of the graph's engine services.
    Adapters,
}

/// What the planner does (`planner/kube.rs`): gets its graph, gets each engine service's
/// adapter through the scale subresource and patches it; `update` lets a planner that
/// replaces the scale object (as `kubectl scale` does) work too. The operator must hold
/// every one of these verbs itself, or the API server refuses to let it create the Role
/// (RBAC escalation prevention).
pub const PLANNER_RULES: &[(&str, &str, &[&str], PlannerScope)] = &[
    (
        "nvidia.com",
        "dynamographdeployments",
        &["get"],
        PlannerScope::Graph,
    ),
    (
        "nvidia.com",
        "dynamographdeploymentscalingadapters",
        &["get"],
        PlannerScope::Adapters,
    ),
    (
        "nvidia.com",
        "dynamographdeploymentscalingadapters/scale",
        &["get", "patch", "update"],
        PlannerScope::Adapters,
    ),
];

/// The three objects, all named like the planner's Deployment.
pub(crate) fn build(g: &Graph, service: &str) -> (ServiceAccount, Role, RoleBinding) {
    let name = names::planner(g.name, service);
    let spec = &g.spec.services[service];
    let adapters: Vec<String> = g
        .spec
        .services
        .iter()
        .filter(|(_, s)| matches!(s.role(), dynamo_crds::ServiceRole::Engine(_)))
        .filter(|(_, s)| adapter_enabled(g.spec, s))
        .map(|(s, _)| names::scaling_adapter(g.name, s))
        .collect();
    let rules = PLANNER_RULES
        .iter()
        .filter_map(|(group, resource, verbs, scope)| {
            let names = match scope {
                PlannerScope::Graph => vec![g.name.to_string()],
                // No names would mean every adapter in the namespace: no rule instead.
                PlannerScope::Adapters if adapters.is_empty() => return None,
                PlannerScope::Adapters => adapters.clone(),
            };
            Some(PolicyRule {
                api_groups: Some(vec![group.to_string()]),
                resources: Some(vec![resource.to_string()]),
                resource_names: Some(names),
                verbs: verbs.iter().map(|v| v.to_string()).collect(),
                ..PolicyRule::default()
            })
        })
        .collect();
    bound_account(g, name, g.service_labels(service, spec), rules)
}
