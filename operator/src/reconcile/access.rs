//! A workload's own API access: a ServiceAccount, a Role with `rules` and the RoleBinding
//! between them, all three named `name` with `labels`, in the graph's namespace. The EPP
//! (`epp_access`) and each planner (`planner_access`) get one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};

use super::graph::Graph;

pub(crate) fn bound_account(
    g: &Graph,
    name: String,
    labels: BTreeMap<String, String>,
    rules: Vec<PolicyRule>,
) -> (ServiceAccount, Role, RoleBinding) {
    let metadata = || g.metadata(name.clone(), labels.clone());
    let account = ServiceAccount {
        metadata: metadata(),
        ..ServiceAccount::default()
    };
    let role = Role {
        metadata: metadata(),
        rules: Some(rules),
    };
    let binding = RoleBinding {
        metadata: metadata(),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.clone(),
            namespace: Some(g.namespace.to_string()),
            ..Subject::default()
        }]),
    };
    (account, role, binding)
}
