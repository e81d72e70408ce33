//! The endpoint picker's own API access: a ServiceAccount, a Role and its RoleBinding per
//! graph, so the EPP can watch its InferencePool and the pool's pods in the graph's
//! namespace and nothing else. A graph whose EPP names its own `serviceAccountName`
//! brings its own access and gets none of these.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding};

use super::access::bound_account;
use super::graph::Graph;
use super::names;

/// What the EPP reads (`epp/src/discovery/kubernetes.rs`): kube-runtime watchers, which
/// only list and watch. The operator must hold every one of these verbs itself, or the
/// API server refuses to let it create the Role (RBAC escalation prevention).
pub const EPP_RULES: &[(&str, &str, &[&str])] = &[
    ("", "pods", &["list", "watch"]),
    (
        "inference.networking.k8s.io",
        "inferencepools",
        &["list", "watch"],
    ),
];

/// The three objects, all named like the EPP Deployment.
pub(crate) fn build(g: &Graph) -> (ServiceAccount, Role, RoleBinding) {
    let rules = EPP_RULES
        .iter()
        .map(|(group, resource, verbs)| PolicyRule {
            api_groups: Some(vec![group.to_string()]),
            resources: Some(vec![resource.to_string()]),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            ..PolicyRule::default()
        })
        .collect();
    bound_account(g, names::epp(g.name), g.labels(), rules)
}
