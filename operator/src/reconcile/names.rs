//! Stable object names. Every name is derived from the graph and service names alone, so a
//! reconcile pass finds the objects of the previous one without any stored state.
//!
//! [`problems`] checks, before anything is applied, that the API server will accept every
//! name (and label value) a graph generates; the reconcile refuses a graph that fails it,
//! and `dynamo validate` / `dynamo run` report it with the field to change.

use std::collections::BTreeMap;

use dynamo_crds::common::NameRule;
use dynamo_crds::validate::validate_manifest_with;
use dynamo_crds::{DynamoGraphDeploymentSpec, DynamoObject, Validated, ValidationError};

use dynamo_crds::ServiceRole;
use dynamo_names::Role;

use super::labels;
use dynamo_wiring::kvbm;

/// Service names are compared case-insensitively (Dynamo uses `VllmDecodeWorker`); object
/// names use the lower-cased form.
pub fn service_slug(service: &str) -> String {
    service.to_ascii_lowercase()
}

/// Pod of a single-node replica: `{dgd}-{service}-{replica}`.
pub fn single_pod(dgd: &str, service: &str, replica: u32) -> String {
    format!("{}-{replica}", replica_base(dgd, service))
}

/// Prefix shared by every object of one replica: `{dgd}-{service}`.
pub fn replica_base(dgd: &str, service: &str) -> String {
    format!("{dgd}-{}", service_slug(service))
}

/// Name of the gang of a multinode replica; also its headless Service (the `subdomain`
/// of its pods, which gives the leader a stable DNS name).
pub fn gang(dgd: &str, service: &str, replica: u32) -> String {
    format!("{}-{replica}", replica_base(dgd, service))
}

/// Pod of rank `rank` of a gang: rank 0 is `{gang}-ldr`, the others `{gang}-wkr-{rank}`.
pub fn gang_pod(dgd: &str, service: &str, replica: u32, rank: u32) -> String {
    let gang = gang(dgd, service, replica);
    if rank == 0 {
        format!("{gang}-ldr")
    } else {
        format!("{gang}-wkr-{rank}")
    }
}

/// ClusterIP Service of one graph service (port 8000).
pub fn service(dgd: &str, service: &str) -> String {
    replica_base(dgd, service)
}

/// Headless Service of a prefill service's ready pods, which its graph's decode sidecars
/// resolve to know their prefill peers.
pub fn prefill_peers(dgd: &str, service: &str) -> String {
    format!("{}-peers", replica_base(dgd, service))
}

/// Scaling adapter of one graph service.
pub fn scaling_adapter(dgd: &str, service: &str) -> String {
    replica_base(dgd, service)
}

/// A planner service's Deployment, and its ServiceAccount, Role and RoleBinding.
pub fn planner(dgd: &str, service: &str) -> String {
    replica_base(dgd, service)
}

/// The endpoint picker's Deployment and Service.
pub fn epp(dgd: &str) -> String {
    format!("{dgd}-epp")
}

/// The graph's InferencePool (and the HTTPRoute to it).
pub fn inference_pool(dgd: &str) -> String {
    format!("{dgd}-pool")
}

/// The Secret holding the graph's block API credential (see `credential`), and the
/// NetworkPolicy keeping strangers from the port (see `network_policy`).
pub fn block_api(dgd: &str) -> String {
    format!("{dgd}-block-api")
}

/// The graph's HTTPRoute.
pub fn http_route(dgd: &str) -> String {
    dgd.to_string()
}

/// A name or label value generated from a graph that the API server would refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct NameProblem {
    /// The field to change, e.g. `metadata.name` or `spec.services.decode.replicas`.
    pub path: String,
    /// The generated name and the rule it breaks.
    pub message: String,
}

/// What is wrong with the names graph `dgd` would generate; empty when nothing is.
///
/// Checked: the graph label's value (the graph's name, on every object: at most 63), the
/// Services (DNS-1035 labels: the EPP's `{dgd}-epp`, each engine's and frontend's
/// `{dgd}-{service}`, each gang's headless `{dgd}-{service}-{replica}`, each prefill
/// service's headless `{dgd}-{service}-peers`), gang pod
/// hostnames (`...-ldr`, `...-wkr-{rank}`, DNS-1123 labels), label values taken from the
/// spec, and the labels and annotations copied onto generated objects. Names held only
/// to the 253-character subdomain rule (pods without a hostname of their own, the EPP
/// Deployment, planner Deployments, InferencePool, HTTPRoute, scaling adapters) pass
/// whenever the graph label's value does, as they are the graph's name (at most 63)
/// plus a lower-case service name (at most 63) and a short suffix.
pub fn problems(dgd: &str, spec: &DynamoGraphDeploymentSpec) -> Vec<NameProblem> {
    let mut found = Found::default();
    let engines = spec
        .services
        .values()
        .any(|s| matches!(s.role(), ServiceRole::Engine(_)));
    let front = spec
        .services
        .values()
        .any(|s| matches!(s.role(), ServiceRole::Epp | ServiceRole::Frontend));
    found.check(
        "metadata.name",
        &format!(
            "the value of label {} (on every generated object)",
            labels::GRAPH
        ),
        NameRule::LabelValue,
        dgd,
    );
    if engines || front {
        found.check(
            "metadata.name",
            "the endpoint picker's Service name",
            NameRule::Dns1035Label,
            &epp(dgd),
        );
    }
    // Every other name starts with the graph's: fix that first, then see what remains.
    if !found.0.is_empty() {
        return found.0;
    }
    found.user_metadata("spec", spec.labels.as_ref(), spec.annotations.as_ref());

    let mut slugs: BTreeMap<String, &String> = BTreeMap::new();
    for (service, component) in &spec.services {
        let path = format!("spec.services.{service}");
        if let Some(first) = slugs.insert(service_slug(service), service) {
            found.0.push(NameProblem {
                path: path.clone(),
                message: format!(
                    "services {first:?} and {service:?} differ only in case; object names are lower-cased"
                ),
            });
        }
        found.user_metadata(
            &path,
            component.labels.as_ref(),
            component.annotations.as_ref(),
        );
        if let Some(meta) = &component.extra_pod_metadata {
            found.user_metadata(
                &format!("{path}.extraPodMetadata"),
                meta.labels.as_ref(),
                meta.annotations.as_ref(),
            );
        }
        let kind = component.role();
        let before = found.0.len();
        if matches!(kind, ServiceRole::Engine(_) | ServiceRole::Frontend) {
            found.check(
                &path,
                "the Service name",
                NameRule::Dns1035Label,
                &self::service(dgd, service),
            );
        }
        // Gang names extend the Service's, and would only repeat its problem.
        if !matches!(kind, ServiceRole::Engine(_)) || found.0.len() > before {
            continue;
        }
        if dynamo_wiring::engine_role(component) == Some(Role::Prefill) {
            found.check(
                &path,
                "the prefill peers' headless Service name",
                NameRule::Dns1035Label,
                &prefill_peers(dgd, service),
            );
        }
        if let Some(sub) = &component.sub_component_type {
            found.check(
                &format!("{path}.subComponentType"),
                &format!("the value of label {}", labels::SUB_COMPONENT_TYPE),
                NameRule::LabelValue,
                sub,
            );
        }
        if component.multinode.is_some() {
            // The longest names belong to the last replica and rank; blame the field
            // that made them long.
            let last = component.replicas.unwrap_or(1).max(1) as u32 - 1;
            let last_rank = component.node_count().max(2) as u32 - 1;
            let blame = |first_fits: bool, field: &str| {
                if first_fits {
                    format!("{path}.{field}")
                } else {
                    path.clone()
                }
            };
            let fits = |rule: NameRule, name: String| rule.check(&name).is_ok();
            found.check(
                &blame(
                    fits(NameRule::Dns1035Label, gang(dgd, service, 0)),
                    "replicas",
                ),
                "the gang's headless Service name",
                NameRule::Dns1035Label,
                &gang(dgd, service, last),
            );
            found.check(
                &blame(
                    fits(NameRule::Dns1123Label, gang_pod(dgd, service, last, 1)),
                    "multinode.nodeCount",
                ),
                "the gang pod's hostname",
                NameRule::Dns1123Label,
                &gang_pod(dgd, service, last, last_rank),
            );
        }
    }
    found.0
}

/// Problems found so far.
#[derive(Default)]
struct Found(Vec<NameProblem>);

impl Found {
    fn check(&mut self, path: &str, what: &str, rule: NameRule, value: &str) {
        if let Err(e) = rule.check(value) {
            self.0.push(NameProblem {
                path: path.to_string(),
                message: format!("{what} {e}"),
            });
        }
    }

    /// Labels and annotations the operator copies onto the objects it generates.
    fn user_metadata(
        &mut self,
        path: &str,
        labels: Option<&BTreeMap<String, String>>,
        annotations: Option<&BTreeMap<String, String>>,
    ) {
        for (key, value) in labels.into_iter().flatten() {
            self.check(
                &format!("{path}.labels"),
                "key",
                NameRule::QualifiedName,
                key,
            );
            self.check(
                &format!("{path}.labels.{key}"),
                "value",
                NameRule::LabelValue,
                value,
            );
        }
        for key in annotations.into_iter().flat_map(BTreeMap::keys) {
            // The API server checks annotation keys lower-cased (`ValidateAnnotations`).
            self.check(
                &format!("{path}.annotations"),
                "key",
                NameRule::QualifiedName,
                &key.to_lowercase(),
            );
        }
    }
}

/// What `dynamo validate` and `dynamo run` check: the API server's checks of each object
/// (schema, CEL rules, metadata), then, for each graph, the names it would generate and
/// the KV block tiers its services ask for ([`kvbm::problems`]).
pub fn validate_manifest(yaml: &str) -> Result<Validated, ValidationError> {
    validate_manifest_with(yaml, |object| match object {
        DynamoObject::GraphDeployment(dgd) => {
            let names = problems(dgd.metadata.name.as_deref().unwrap_or_default(), &dgd.spec)
                .into_iter()
                .map(|p| (p.path, p.message));
            let tiers = kvbm::problems(&dgd.spec).into_iter().map(|e| {
                (
                    format!("spec.services.{}", e.service),
                    format!("{} {}", e.variable, e.problem),
                )
            });
            names.chain(tiers).collect()
        }
        DynamoObject::ScalingAdapter(_) | DynamoObject::Request(_) => Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use dynamo_crds::DynamoGraphDeployment;
    use serde_json::{Value, json};

    use super::super::{Observed, OperatorConfig, ReconcileError, reconcile};
    use super::*;

    #[test]
    fn names_are_lower_cased_and_stable() {
        assert_eq!(single_pod("g", "VllmWorker", 1), "g-vllmworker-1");
        assert_eq!(gang_pod("g", "Decode", 0, 0), "g-decode-0-ldr");
        assert_eq!(gang_pod("g", "Decode", 2, 3), "g-decode-2-wkr-3");
    }

    fn spec(spec: Value) -> DynamoGraphDeploymentSpec {
        serde_json::from_value(spec).unwrap()
    }

    fn worker() -> Value {
        json!({"services": {"worker": {"componentType": "worker"}}})
    }

    /// `(path, message)` of each problem.
    fn found(dgd: &str, spec: &DynamoGraphDeploymentSpec) -> Vec<(String, String)> {
        problems(dgd, spec)
            .into_iter()
            .map(|p| (p.path, p.message))
            .collect()
    }

    #[test]
    fn a_plain_graph_has_none() {
        assert_eq!(found("agg", &spec(worker())), vec![]);
        // "{dgd}-epp" and "{dgd}-w" fit in 63.
        let w = spec(json!({"services": {"w": {"componentType": "worker"}}}));
        assert_eq!(found(&"g".repeat(59), &w), vec![]);
    }

    #[test]
    fn the_graph_name_is_reported_alone_when_it_is_the_problem() {
        let long = "g".repeat(64);
        let problems = found(&long, &spec(worker()));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems.iter().all(|(path, _)| path == "metadata.name"));
        assert!(problems[0].1.starts_with(
            "the value of label nvidia.com/dynamo-graph-deployment-name (on every generated object) \""
        ));
        assert!(
            problems[1]
                .1
                .contains("is not a valid DNS-1035 label: it has 68 characters")
        );

        // Services must start with a letter and hold no dots (DNS-1035), which a custom
        // resource's name may.
        assert_eq!(
            found("1graph", &spec(worker())),
            vec![(
                "metadata.name".to_string(),
                "the endpoint picker's Service name \"1graph-epp\" is not a valid DNS-1035 label: it starts with '1' (at most 63 lower-case letters, digits and '-', starting with a letter and ending with a letter or digit)".to_string()
            )]
        );
        assert!(
            found("my.graph", &spec(worker()))[0]
                .1
                .contains("it contains '.'")
        );
        // A graph of a planner alone makes no Service: its name may start with a digit.
        let planner = spec(json!({"services": {"planner": {"componentType": "planner"}}}));
        assert_eq!(found("1graph", &planner), vec![]);
    }

    #[test]
    fn service_names_are_checked_as_the_services_they_become() {
        let long = format!("w{}", "x".repeat(60));
        let graph = spec(json!({"services": {
            "Worker": {"componentType": "frontend"},
            "worker": {"componentType": "worker", "subComponentType": "pre fill"},
            long.clone(): {"componentType": "worker"},
        }}));
        assert_eq!(
            found("ab", &graph),
            vec![
                (
                    "spec.services.worker".to_string(),
                    "services \"Worker\" and \"worker\" differ only in case; object names are lower-cased".to_string()
                ),
                (
                    "spec.services.worker.subComponentType".to_string(),
                    "the value of label nvidia.com/dynamo-sub-component-type \"pre fill\" is not a valid label value: it contains ' ' (empty, or at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit)".to_string()
                ),
                (
                    format!("spec.services.{long}"),
                    format!("the Service name \"ab-{long}\" is not a valid DNS-1035 label: it has 64 characters (at most 63 lower-case letters, digits and '-', starting with a letter and ending with a letter or digit)")
                ),
            ]
        );
    }

    #[test]
    fn a_prefill_service_is_checked_for_its_peers_service_too() {
        // g-{56}-peers has 64 characters; g-{56} itself fits.
        let long = "p".repeat(56);
        let graph = |service: Value| spec(json!({"services": {long.clone(): service}}));
        let expected = vec![(
            format!("spec.services.{long}"),
            format!(
                "the prefill peers' headless Service name \"g-{long}-peers\" is not a valid DNS-1035 label: it has 64 characters (at most 63 lower-case letters, digits and '-', starting with a letter and ending with a letter or digit)"
            ),
        )];
        assert_eq!(
            found("g", &graph(json!({"componentType": "prefill"}))),
            expected
        );
        // Dynamo's vLLM wrapper says it with a flag.
        let wrapper = json!({"extraPodSpec": {"mainContainer": {
            "command": ["python3", "-m", "dynamo.vllm"],
            "args": ["--model", "m", "--is-prefill-worker"]}}});
        assert_eq!(found("g", &graph(wrapper)), expected);
        // Other engines have none.
        assert_eq!(
            found("g", &graph(json!({"componentType": "decode"}))),
            vec![]
        );
    }

    #[test]
    fn gang_names_blame_the_field_that_made_them_too_long() {
        let gang = |service: &str, replicas: i32, node_count: i32| {
            spec(json!({"services": {service: {
                "componentType": "decode",
                "replicas": replicas,
                "multinode": {"nodeCount": node_count},
            }}}))
        };
        // g-{57}-0 fits in 63; g-{57}-99999 does not.
        let long = "d".repeat(57);
        let problems = found("g", &gang(&long, 100_000, 2));
        assert_eq!(problems[0].0, format!("spec.services.{long}.replicas"));
        assert!(problems[0].1.starts_with(&format!(
            "the gang's headless Service name \"g-{long}-99999\" is not a valid DNS-1035 label: it has 65 characters"
        )));
        // Its hostnames are too long from the first replica on: the name is to blame.
        assert_eq!(problems[1].0, format!("spec.services.{long}"));
        assert!(problems[1].1.contains(&format!("\"g-{long}-99999-wkr-1\"")));

        // g-{50}-0-wkr-1 fits; g-{50}-0-wkr-99999 does not.
        let long = "d".repeat(50);
        assert_eq!(
            found("g", &gang(&long, 1, 100_000)),
            vec![(
                format!("spec.services.{long}.multinode.nodeCount"),
                format!(
                    "the gang pod's hostname \"g-{long}-0-wkr-99999\" is not a valid DNS-1123 label: it has 64 characters (at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit)"
                )
            )]
        );
    }

    #[test]
    fn labels_and_annotations_copied_to_generated_objects_are_checked() {
        let graph = spec(json!({
            "labels": {"team": "a b"},
            "annotations": {"Example.com/Note": "fine", "bad key": "x"},
            "services": {"worker": {
                "componentType": "worker",
                "extraPodMetadata": {"labels": {"-x": "y"}},
            }},
        }));
        let paths: Vec<String> = found("g", &graph).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            [
                "spec.labels.team",
                "spec.annotations",
                "spec.services.worker.extraPodMetadata.labels"
            ]
        );
    }

    #[test]
    fn validation_reports_every_bad_kv_tier_variable_with_its_service() {
        let yaml = "
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata: {name: g}
spec:
  backendFramework: mocker
  services:
    epp: {componentType: epp, envs: [{name: DYN_KVBM_CPU_CACHE_GB, value: ignored}]}
    prefill:
      componentType: prefill
      envs: [{name: DYN_KVBM_DISK_CACHE_GB, value: 10GB}]
    decode:
      componentType: decode
      extraPodSpec: {mainContainer: {env: [{name: DYN_KVBM_OBJECT_ENABLED, value: 'true'}]}}
";
        let err = validate_manifest(yaml).unwrap_err();
        let found: Vec<(&str, &str)> = err
            .problems()
            .iter()
            .map(|p| (p.path.as_str(), p.message.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                (
                    "spec.services.decode",
                    "DYN_KVBM_OBJECT_BUCKET is not set, and DYN_KVBM_OBJECT_ENABLED is: name the bucket"
                ),
                (
                    "spec.services.prefill",
                    "DYN_KVBM_DISK_CACHE_GB is \"10GB\", not a size: a number of gigabytes \
                     (10^9 bytes, as Dynamo counts them), e.g. 4 or 0.5"
                ),
            ]
        );
    }

    #[test]
    fn reconcile_refuses_a_graph_with_a_name_it_cannot_use() {
        let dgd: DynamoGraphDeployment = serde_json::from_value(json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "1graph", "namespace": "ns", "uid": "u1"},
            "spec": worker(),
        }))
        .unwrap();
        let Err(ReconcileError::InvalidName(problem)) =
            reconcile(&dgd, &Observed::default(), &OperatorConfig::default())
        else {
            panic!("a graph whose Services would be refused is reconciled");
        };
        assert_eq!(problem.path, "metadata.name");
        assert!(problem.to_string().starts_with(
            "metadata.name: the endpoint picker's Service name \"1graph-epp\" is not a valid DNS-1035 label"
        ));
    }
}
