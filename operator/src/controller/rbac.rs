//! The API access the operator needs, declared once. `make crds` writes these tables into
//! the Helm chart (its ClusterRole and lease Role include them; in namespace-scoped mode a
//! Role holds the namespaced part), the operator checks them at start-up with
//! SelfSubjectAccessReviews, and the controller tests check every request the controllers
//! make against them, so code, chart and tests cannot drift apart.

use std::path::PathBuf;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

/// Verbs allowed on one resource of one API group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// API group; `""` is the core group.
    pub group: &'static str,
    /// Plural resource name, with `/subresource` where it applies to one.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// The objects it is limited to (`resourceNames`); empty: all of them.
    pub names: &'static [&'static str],
}

// Server-side apply needs `patch`, and `create` as well when the apply creates the object
// (k8s.io/apiserver endpoints/handlers/patch.go authorizes a creating apply as "create").
const APPLIED: &[&str] = &["create", "delete", "list", "patch", "watch"];

/// Cluster-wide access (the ClusterRole): graphs in every namespace, the objects generated
/// for them, nodes and pods for gang placement, Events.
pub const CLUSTER_RULES: &[Rule] = &[
    // Watched; `patch` writes a service's replicas on behalf of its scaling adapter; `get`
    // only to grant it to planners (reconcile/planner_access.rs: the API server lets the
    // operator grant only verbs it holds itself, RBAC escalation prevention).
    // `create` as well: a request's generated graph is applied (created) by the operator.
    Rule {
        group: "nvidia.com",
        resource: "dynamographdeployments",
        verbs: &["create", "get", "list", "patch", "watch"],
        names: &[],
    },
    Rule {
        group: "nvidia.com",
        resource: "dynamographdeployments/status",
        verbs: &["patch"],
        names: &[],
    },
    // Owner references with `blockOwnerDeletion` (every generated object's, so foreground
    // deletion waits for them) need `update` on the owner's finalizers where the
    // OwnerReferencesPermissionEnforcement admission is on (OpenShift's default).
    Rule {
        group: "nvidia.com",
        resource: "dynamographdeployments/finalizers",
        verbs: &["update"],
        names: &[],
    },
    // Created once per scalable service, then only their status is written; `get` and the
    // scale subresource only to grant them to planners, as above.
    Rule {
        group: "nvidia.com",
        resource: "dynamographdeploymentscalingadapters",
        verbs: &["create", "delete", "get", "list", "watch"],
        names: &[],
    },
    Rule {
        group: "nvidia.com",
        resource: "dynamographdeploymentscalingadapters/scale",
        verbs: &["get", "patch", "update"],
        names: &[],
    },
    Rule {
        group: "nvidia.com",
        resource: "dynamographdeploymentscalingadapters/status",
        verbs: &["patch"],
        names: &[],
    },
    // Requests are watched; only their status is written.
    Rule {
        group: "nvidia.com",
        resource: "dynamographdeploymentrequests",
        verbs: &["list", "watch"],
        names: &[],
    },
    Rule {
        group: "nvidia.com",
        resource: "dynamographdeploymentrequests/status",
        verbs: &["patch"],
        names: &[],
    },
    // A request owns its generated graph and the planner's profile, as above.
    Rule {
        group: "nvidia.com",
        resource: "dynamographdeploymentrequests/finalizers",
        verbs: &["update"],
        names: &[],
    },
    // A request's model `config.json` is read from the ConfigMap it names; a generated
    // planner's profile is applied as one.
    Rule {
        group: "",
        resource: "configmaps",
        verbs: &["create", "get", "patch"],
        names: &[],
    },
    Rule {
        group: "",
        resource: "pods",
        verbs: APPLIED,
        names: &[],
    },
    Rule {
        group: "",
        resource: "services",
        verbs: APPLIED,
        names: &[],
    },
    // `spec.pvcs` with `create: true`: created once, then left to the garbage collector.
    Rule {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["create"],
        names: &[],
    },
    // Each graph's block API credential (reconcile/credential.rs): created once, never
    // read back, so no `get`, `list` or `watch` on anyone's Secrets.
    Rule {
        group: "",
        resource: "secrets",
        verbs: &["create"],
        names: &[],
    },
    // Each graph's NetworkPolicy (reconcile/network_policy.rs).
    Rule {
        group: "networking.k8s.io",
        resource: "networkpolicies",
        verbs: APPLIED,
        names: &[],
    },
    // Free GPUs per topology domain, for gang placement.
    Rule {
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
        names: &[],
    },
    Rule {
        group: "apps",
        resource: "deployments",
        verbs: APPLIED,
        names: &[],
    },
    Rule {
        group: "inference.networking.k8s.io",
        resource: "inferencepools",
        verbs: APPLIED,
        names: &[],
    },
    Rule {
        group: "gateway.networking.k8s.io",
        resource: "httproutes",
        verbs: APPLIED,
        names: &[],
    },
    // Each graph's EPP gets its own account and Role (reconcile/epp_access.rs). The API
    // server lets the operator grant only verbs it holds itself (RBAC escalation
    // prevention), which the test `the_epp_role_grants_nothing_the_operator_lacks` checks.
    Rule {
        group: "",
        resource: "serviceaccounts",
        verbs: APPLIED,
        names: &[],
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resource: "roles",
        verbs: APPLIED,
        names: &[],
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resource: "rolebindings",
        verbs: APPLIED,
        names: &[],
    },
    // The conversion webhook points the graph CRD's `spec.conversion` at itself (and at
    // its CA); only that CRD.
    Rule {
        group: "apiextensions.k8s.io",
        resource: "customresourcedefinitions",
        verbs: &["get", "patch"],
        names: &["dynamographdeployments.nvidia.com"],
    },
    // kube's event Recorder creates an Event and patches it when it repeats.
    Rule {
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        names: &[],
    },
];

/// Access in the operator's own namespace (the Role): the leader-election Lease.
pub const LEASE_RULES: &[Rule] = &[Rule {
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["create", "get", "update"],
    names: &[],
}];

/// Access in the operator's own namespace (the webhook Role): the Secret with the
/// conversion webhook's certificate, read by every replica and created by the first.
/// (`create` cannot be limited to a name: the name is in the request body.)
pub const WEBHOOK_RULES: &[Rule] = &[Rule {
    group: "",
    resource: "secrets",
    verbs: &["create", "get"],
    names: &[],
}];

/// The cluster-scoped resources of [`CLUSTER_RULES`]. An operator that watches one
/// namespace (`--watch-namespace`) holds the rest in a Role there; of these it reads no
/// nodes (gang placement, which needs them, is off) and keeps the graph CRD's rule,
/// cluster-wide, for the conversion webhook.
const CLUSTER_SCOPED: &[&str] = &["nodes", "customresourcedefinitions"];

fn cluster_scoped(rule: &Rule) -> bool {
    let resource = rule.resource.split('/').next().unwrap_or(rule.resource);
    CLUSTER_SCOPED.contains(&resource)
}

/// The namespaced part of [`CLUSTER_RULES`]: the Role of a namespace-scoped operator.
pub fn namespaced_rules() -> Vec<Rule> {
    CLUSTER_RULES
        .iter()
        .filter(|r| !cluster_scoped(r))
        .copied()
        .collect()
}

/// What a namespace-scoped operator still needs cluster-wide: the conversion webhook
/// points the graph CRD (one named object) at itself.
pub fn conversion_rules() -> Vec<Rule> {
    CLUSTER_RULES
        .iter()
        .filter(|r| r.resource == "customresourcedefinitions")
        .copied()
        .collect()
}

/// Whether `rules` allow `verb` on `resource` (with its `/subresource`, if any) of `group`,
/// on some object.
pub fn allows(rules: &[Rule], group: &str, resource: &str, verb: &str) -> bool {
    rules
        .iter()
        .any(|r| r.group == group && r.resource == resource && r.verbs.contains(&verb))
}

/// [`allows`] on the object `name` (`None`: a collection, or a create).
pub fn allows_on(
    rules: &[Rule],
    group: &str,
    resource: &str,
    name: Option<&str>,
    verb: &str,
) -> bool {
    rules.iter().any(|r| {
        r.group == group
            && r.resource == resource
            && r.verbs.contains(&verb)
            && (r.names.is_empty() || name.is_some_and(|n| r.names.contains(&n)))
    })
}

/// `rules:` entries of a ClusterRole or Role, as YAML.
pub fn rules_yaml(rules: &[Rule]) -> String {
    let list = |items: &[&str]| {
        items
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    rules
        .iter()
        .map(|r| {
            let names = if r.names.is_empty() {
                String::new()
            } else {
                format!("  resourceNames: [{}]\n", list(r.names))
            };
            format!(
                "- apiGroups: [{}]\n  resources: [{}]\n{names}  verbs: [{}]\n",
                list(&[r.group]),
                list(&[r.resource]),
                list(r.verbs)
            )
        })
        .collect()
}

/// Generated chart files that hold the rules (written by `dynamo crds`).
pub fn generated_files() -> Vec<(PathBuf, String)> {
    let header = "# Generated from operator/src/controller/rbac.rs by `make crds`; do not edit.\n";
    vec![
        (
            PathBuf::from("charts/dynamo-platform/files/clusterrole-rules.yaml"),
            format!("{header}{}", rules_yaml(CLUSTER_RULES)),
        ),
        (
            PathBuf::from("charts/dynamo-platform/files/namespace-role-rules.yaml"),
            format!("{header}{}", rules_yaml(&namespaced_rules())),
        ),
        (
            PathBuf::from("charts/dynamo-platform/files/conversion-rules.yaml"),
            format!("{header}{}", rules_yaml(&conversion_rules())),
        ),
        (
            PathBuf::from("charts/dynamo-platform/files/role-rules.yaml"),
            format!("{header}{}", rules_yaml(LEASE_RULES)),
        ),
        (
            PathBuf::from("charts/dynamo-platform/files/webhook-role-rules.yaml"),
            format!("{header}{}", rules_yaml(WEBHOOK_RULES)),
        ),
    ]
}

/// What the operator needs, for [`missing_access`].
pub struct Needs<'a> {
    /// The operator's own namespace: the Lease's and the webhook Secret's.
    pub namespace: &'a str,
    /// `--watch-namespace`: the namespaced rules there (and the CRD's cluster-wide)
    /// instead of every cluster rule anywhere.
    pub watch_namespace: Option<&'a str>,
    pub leader_elect: bool,
    /// The conversion webhook keeps its certificate in a Secret.
    pub webhook_secret: bool,
}

/// Asks the API server whether this process may do everything in the tables it needs:
/// the cluster rules anywhere (or, watching one namespace, their namespaced part there
/// and the CRD rule), and in its own namespace the lease rules with `leader_elect` and
/// the webhook rules with `webhook_secret`. Returns what it may not do.
pub async fn missing_access(client: Client, needs: &Needs<'_>) -> Result<Vec<String>, kube::Error> {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client);
    let own = Some(needs.namespace.to_string());
    let mut scoped: Vec<(Rule, Option<String>)> = match needs.watch_namespace {
        None => CLUSTER_RULES.iter().map(|r| (*r, None)).collect(),
        Some(watched) => (namespaced_rules().into_iter())
            .map(|r| (r, Some(watched.to_string())))
            .chain(conversion_rules().into_iter().map(|r| (r, None)))
            .collect(),
    };
    if needs.leader_elect {
        scoped.extend(LEASE_RULES.iter().map(|r| (*r, own.clone())));
    }
    if needs.webhook_secret {
        scoped.extend(WEBHOOK_RULES.iter().map(|r| (*r, own.clone())));
    }
    let mut missing = Vec::new();
    for (rule, namespace) in scoped {
        let (resource, subresource) = match rule.resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_string())),
            None => (rule.resource, None),
        };
        let names: Vec<Option<&str>> = match rule.names {
            [] => vec![None],
            names => names.iter().copied().map(Some).collect(),
        };
        for (verb, name) in rule
            .verbs
            .iter()
            .flat_map(|v| names.iter().map(move |n| (v, n)))
        {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(rule.group.into()),
                        resource: Some(resource.into()),
                        subresource: subresource.clone(),
                        verb: Some((*verb).into()),
                        namespace: namespace.clone(),
                        name: name.map(str::to_string),
                        ..ResourceAttributes::default()
                    }),
                    ..SelfSubjectAccessReviewSpec::default()
                },
                ..SelfSubjectAccessReview::default()
            };
            let answer = reviews.create(&PostParams::default(), &review).await?;
            if !answer.status.is_some_and(|s| s.allowed) {
                let group = if rule.group.is_empty() {
                    "core".to_string()
                } else {
                    rule.group.to_string()
                };
                let on = name.map_or(String::new(), |n| format!(" {n}"));
                missing.push(format!("{verb} {}{on} ({group})", rule.resource));
            }
        }
    }
    Ok(missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_only_what_is_listed() {
        assert!(allows(CLUSTER_RULES, "", "pods", "patch"));
        assert!(allows(
            CLUSTER_RULES,
            "nvidia.com",
            "dynamographdeployments/status",
            "patch"
        ));
        assert!(!allows(CLUSTER_RULES, "", "nodes", "patch"));
        assert!(!allows(CLUSTER_RULES, "", "secrets", "list"));
        assert!(!allows(
            CLUSTER_RULES,
            "coordination.k8s.io",
            "leases",
            "get"
        ));
    }

    #[test]
    fn the_operator_may_do_to_every_kind_of_the_table_what_the_table_says() {
        use crate::reconcile::kinds::{Child, Delete, KindVisitor, Watch, Write, each_kind};
        struct Needs;
        impl KindVisitor for Needs {
            type Out = (String, String, Vec<&'static str>);
            fn visit<K: Child>(&mut self) -> Self::Out {
                let mut verbs = match K::WRITE {
                    // Server-side apply that creates an object needs `create` as well.
                    Write::Apply => vec!["create", "patch"],
                    Write::Create => vec!["create"],
                };
                if K::WATCH != Watch::No {
                    verbs.extend(["list", "watch"]);
                }
                if K::DELETE != Delete::Never {
                    verbs.push("delete");
                }
                (
                    K::group(&()).into_owned(),
                    K::plural(&()).into_owned(),
                    verbs,
                )
            }
        }
        for (group, resource, verbs) in each_kind(&mut Needs) {
            for verb in verbs {
                assert!(
                    allows(CLUSTER_RULES, &group, &resource, verb),
                    "the table has the operator {verb} {resource} ({group:?}); CLUSTER_RULES lack it"
                );
            }
        }
    }

    #[test]
    fn the_epp_role_grants_nothing_the_operator_lacks() {
        for (group, resource, verbs) in crate::reconcile::EPP_RULES {
            for verb in *verbs {
                assert!(
                    allows(CLUSTER_RULES, group, resource, verb),
                    "the EPP's Role grants {verb} {resource} ({group:?}), which the operator does not hold"
                );
            }
        }
    }

    #[test]
    fn the_planner_role_grants_nothing_the_operator_lacks() {
        use dynamo_crds::{DynamoGraphDeployment, DynamoGraphDeploymentScalingAdapter};
        use kube::Resource;

        for (group, resource, verbs, _) in crate::reconcile::PLANNER_RULES {
            for verb in *verbs {
                assert!(
                    allows(CLUSTER_RULES, group, resource, verb),
                    "the planner's Role grants {verb} {resource} ({group:?}), which the operator does not hold"
                );
            }
        }
        // The rules name the resources as the CRDs serve them.
        let graphs = DynamoGraphDeployment::plural(&()).into_owned();
        let adapters = DynamoGraphDeploymentScalingAdapter::plural(&()).into_owned();
        let resources: Vec<String> = crate::reconcile::PLANNER_RULES
            .iter()
            .map(|(group, resource, _, _)| {
                assert_eq!(*group, DynamoGraphDeployment::group(&()));
                resource.to_string()
            })
            .collect();
        assert_eq!(
            resources,
            [graphs, adapters.clone(), format!("{adapters}/scale")]
        );
    }

    #[test]
    fn the_crd_rule_covers_the_graph_crd_only() {
        use kube::CustomResourceExt;
        let crd = dynamo_crds::DynamoGraphDeployment::crd_name();
        let group = "apiextensions.k8s.io";
        let resource = "customresourcedefinitions";
        assert!(allows_on(
            CLUSTER_RULES,
            group,
            resource,
            Some(crd),
            "patch"
        ));
        assert!(!allows_on(
            CLUSTER_RULES,
            group,
            resource,
            Some("pods.example.com"),
            "patch"
        ));
        assert!(!allows_on(CLUSTER_RULES, group, resource, None, "list"));
        assert!(allows_on(WEBHOOK_RULES, "", "secrets", None, "create"));
        let rule = CLUSTER_RULES
            .iter()
            .find(|r| r.resource == resource)
            .unwrap();
        let yaml = rules_yaml(std::slice::from_ref(rule));
        assert_eq!(
            yaml,
            "- apiGroups: [\"apiextensions.k8s.io\"]\n  resources: [\"customresourcedefinitions\"]\n  resourceNames: [\"dynamographdeployments.nvidia.com\"]\n  verbs: [\"get\", \"patch\"]\n"
        );
    }

    #[test]
    fn the_namespace_role_holds_every_namespaced_rule_and_no_cluster_scoped_one() {
        let namespaced = namespaced_rules();
        let conversion = conversion_rules();
        for rule in CLUSTER_RULES {
            let kept = namespaced.contains(rule) || conversion.contains(rule);
            assert_eq!(kept, rule.resource != "nodes", "{rule:?}");
        }
        assert!(namespaced.iter().all(|r| r.group != "apiextensions.k8s.io"));
        assert!(!allows(&namespaced, "", "nodes", "list"));
        assert_eq!(conversion.len(), 1);
        assert_eq!(conversion[0].names, ["dynamographdeployments.nvidia.com"]);
        // What the operator grants the graphs' EPPs and planners (RBAC escalation
        // prevention) it holds in its Role too.
        for (group, resource, verbs) in crate::reconcile::EPP_RULES {
            for verb in *verbs {
                assert!(
                    allows(&namespaced, group, resource, verb),
                    "{verb} {resource}"
                );
            }
        }
        for (group, resource, verbs, _) in crate::reconcile::PLANNER_RULES {
            for verb in *verbs {
                assert!(
                    allows(&namespaced, group, resource, verb),
                    "{verb} {resource}"
                );
            }
        }
    }

    #[test]
    fn yaml_lists_each_rule() {
        let yaml = rules_yaml(LEASE_RULES);
        assert_eq!(
            yaml,
            "- apiGroups: [\"coordination.k8s.io\"]\n  resources: [\"leases\"]\n  verbs: [\"create\", \"get\", \"update\"]\n"
        );
    }
}
