//! The Helm chart agrees with the code: its RBAC rules are the operator's tables (the
//! controller tests check every request against those tables), every flag the
//! Deployment passes is one `dynamo operator` accepts, its image is the one `make image`
//! builds and the operator defaults to, and the operator's pod meets the Pod Security
//! Standards "restricted" profile. Rendering needs helm (`make helm`, a prerequisite of
//! `make nextest`; or `HELM=path`).

mod common;

use std::process::Command;

use clap::Args;
use common::repo_root;
use dynamo_operator::controller::{OperatorArgs, rbac};
use dynamo_operator::reconcile::DEFAULT_IMAGE;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec};

fn chart_file(rel: &str) -> String {
    let path = repo_root().join("charts/dynamo-platform").join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_chart_rbac_is_generated_from_the_operator_tables() {
    for (rel, content) in rbac::generated_files() {
        let on_disk = std::fs::read_to_string(repo_root().join(&rel)).unwrap_or_default();
        assert!(
            on_disk == content,
            "{} is stale: run `make crds`",
            rel.display()
        );
    }
    let template = chart_file("templates/rbac.yaml");
    for include in [
        "kind: ClusterRole\n",
        "{{ .Files.Get \"files/clusterrole-rules.yaml\" }}",
        "kind: Role\n",
        "{{ .Files.Get \"files/role-rules.yaml\" }}",
    ] {
        assert!(template.contains(include), "rbac.yaml lacks {include:?}");
    }
    // Least privilege: nothing the code does not use, e.g. no wildcards, and of Secrets
    // only creating the graphs' credentials: no reading anyone's.
    let rules = chart_file("files/clusterrole-rules.yaml");
    assert!(!rules.contains('*'), "{rules}");
    let secrets: Vec<&str> = rules
        .split("- apiGroups:")
        .filter(|rule| rule.contains("\"secrets\""))
        .collect();
    assert_eq!(
        secrets,
        [" [\"\"]\n  resources: [\"secrets\"]\n  verbs: [\"create\"]\n"],
        "{rules}"
    );
}

#[test]
fn the_pod_monitor_selects_the_label_and_port_every_generated_pod_carries() {
    use dynamo_operator::reconcile::{METRICS_PORT_NAME, labels};

    let monitor = chart_file("templates/podmonitor.yaml");
    for wanted in [
        format!("- key: {}\n        operator: Exists", labels::GRAPH),
        format!("- port: {METRICS_PORT_NAME}\n"),
    ] {
        assert!(
            monitor.contains(&wanted),
            "podmonitor.yaml lacks {wanted:?}"
        );
    }
}

#[test]
fn every_flag_the_chart_passes_is_an_operator_flag() {
    let command = OperatorArgs::augment_args(clap::Command::new("operator"));
    let known: Vec<String> = command
        .get_arguments()
        .filter_map(|a| a.get_long().map(String::from))
        .collect();
    let deployment = chart_file("templates/deployment.yaml");
    let passed: Vec<&str> = deployment
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- --"))
        .map(|flag| flag.split('=').next().unwrap())
        .collect();
    assert!(passed.len() >= 10, "{passed:?}");
    for flag in passed {
        assert!(
            known.iter().any(|k| k == flag),
            "--{flag} is not a flag of `dynamo operator`"
        );
    }
    assert!(deployment.contains("- operator\n"));
}

/// The operator Deployment `helm template` renders with `--set` values `sets`.
fn rendered_deployment(sets: &[&str]) -> Deployment {
    let deployment = common::rendered_chart(sets)
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the chart renders a Deployment");
    serde_json::from_value(deployment).expect("a well-formed apps/v1 Deployment")
}

fn operator_pod(deployment: &Deployment) -> (&PodSpec, &Container) {
    let pod = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod template");
    (pod, &pod.containers[0])
}

/// What the securityContext rules of the Pod Security Standards "restricted" profile
/// (kubernetes.io/docs/concepts/security/pod-security-standards) refuse in `pod`.
fn restricted_violations(pod: &PodSpec) -> Vec<String> {
    let pod_context = pod.security_context.clone().unwrap_or_default();
    let mut found = Vec::new();
    for c in &pod.containers {
        let sc = c.security_context.clone().unwrap_or_default();
        let name = &c.name;
        if sc.allow_privilege_escalation != Some(false) {
            found.push(format!("{name}: allowPrivilegeEscalation is not false"));
        }
        let caps = sc.capabilities.clone().unwrap_or_default();
        if !caps.drop.iter().flatten().any(|c| c == "ALL") {
            found.push(format!("{name}: capabilities.drop lacks ALL"));
        }
        if caps.add.iter().flatten().any(|c| c != "NET_BIND_SERVICE") {
            found.push(format!("{name}: adds capabilities {:?}", caps.add));
        }
        let non_root = sc.run_as_non_root.or(pod_context.run_as_non_root);
        if non_root != Some(true) {
            found.push(format!("{name}: runAsNonRoot is not true"));
        }
        if sc.run_as_user.or(pod_context.run_as_user) == Some(0) {
            found.push(format!("{name}: runAsUser 0"));
        }
        let seccomp = sc.seccomp_profile.or(pod_context.seccomp_profile.clone());
        if !seccomp.is_some_and(|p| p.type_ == "RuntimeDefault" || p.type_ == "Localhost") {
            found.push(format!(
                "{name}: seccompProfile is not RuntimeDefault or Localhost"
            ));
        }
    }
    found
}

#[test]
fn the_rendered_operator_pod_is_restricted_with_a_read_only_root() {
    let deployment = rendered_deployment(&[]);
    let (pod, operator) = operator_pod(&deployment);
    assert_eq!(restricted_violations(pod), Vec::<String>::new());
    let sc = operator.security_context.clone().unwrap();
    // The operator writes no file.
    assert_eq!(sc.read_only_root_filesystem, Some(true));

    // The checker itself refuses what the profile refuses.
    let mut loose = pod.clone();
    loose.security_context = None;
    loose.containers[0].security_context = None;
    assert_eq!(restricted_violations(&loose).len(), 4, "{loose:?}");
}

#[test]
fn the_chart_runs_the_image_make_image_builds_and_hands_it_to_the_operator() {
    let image_flag = |c: &Container| {
        c.args
            .iter()
            .flatten()
            .find_map(|a| a.strip_prefix("--image="))
            .map(String::from)
    };
    let deployment = rendered_deployment(&[]);
    let (_, operator) = operator_pod(&deployment);
    // The chart's repository and appVersion are the operator's default image.
    assert_eq!(operator.image.as_deref(), Some(DEFAULT_IMAGE));
    assert_eq!(image_flag(operator).as_deref(), Some(DEFAULT_IMAGE));
    assert_eq!(operator.command, Some(vec!["dynamo".to_string()]));

    let deployment = rendered_deployment(&["image.repository=r.io/x/dynamo", "image.tag=t1"]);
    let (_, operator) = operator_pod(&deployment);
    assert_eq!(operator.image.as_deref(), Some("r.io/x/dynamo:t1"));
    assert_eq!(image_flag(operator).as_deref(), Some("r.io/x/dynamo:t1"));

    // `make image` tags the same name by default.
    let output = Command::new(std::env::var("MAKE").unwrap_or_else(|_| "make".into()))
        .args([
            "-s",
            "--no-print-directory",
            "--eval",
            "print-image: ; @echo $(IMAGE)",
            "print-image",
        ])
        .current_dir(repo_root())
        .env_remove("IMAGE_REGISTRY")
        .env_remove("IMAGE_TAG")
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .output()
        .expect("make runs");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        DEFAULT_IMAGE
    );
}
