//! The Helm chart agrees with the code: its RBAC rules are the operator's tables (the
//! controller tests check every request against those tables), every flag the
//! Deployment passes is one `dynamo operator` accepts, its image is the one `make image`
//! builds and the operator defaults to, and the operator's pod meets the Pod Security
//! Standards "restricted" profile. Rendering needs helm (`make helm`, a prerequisite of
//! `make nextest`; or `HELM=path`).

mod common;

use std::process::Command;

use clap::{Args, FromArgMatches};
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
        "{{ .Files.Get \"files/namespace-role-rules.yaml\" }}",
        "{{ .Files.Get \"files/conversion-rules.yaml\" }}",
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

/// The rendered documents of `kind`.
fn of_kind(docs: &[serde_json::Value], kind: &str) -> Vec<serde_json::Value> {
    docs.iter().filter(|d| d["kind"] == kind).cloned().collect()
}

/// One rendered document of `kind` named `name`.
fn named(docs: &[serde_json::Value], kind: &str, name: &str) -> serde_json::Value {
    of_kind(docs, kind)
        .into_iter()
        .find(|d| d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The `rules:` of a generated rules file, as JSON.
fn rules_json(yaml: &str) -> serde_json::Value {
    serde_saphyr::from_str(yaml).expect("the rules are YAML")
}

const FULLNAME: &str = "dynamo-dynamo-platform";

#[test]
fn the_monitoring_files_render_as_a_prometheus_rule_and_a_dashboard_config_map() {
    let docs = common::rendered_chart(&[]);
    assert!(of_kind(&docs, "PrometheusRule").is_empty());
    assert!(of_kind(&docs, "ConfigMap").is_empty());

    let docs = common::rendered_chart(&[
        "prometheusRule.enabled=true",
        "prometheusRule.labels.release=kps",
        "grafanaDashboard.enabled=true",
    ]);
    // The one copy of the rules, which promtool checks (e2e/tests/monitoring_config.rs).
    let rules: serde_json::Value =
        serde_saphyr::from_str(&chart_file("files/monitoring/prometheus-rules.yaml")).unwrap();
    let rule = named(&docs, "PrometheusRule", FULLNAME);
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["namespace"], "ns");
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    assert_eq!(rule["spec"]["groups"], rules["groups"]);
    assert!(rule["spec"]["groups"].as_array().unwrap().len() >= 2);

    let dashboard: serde_json::Value =
        serde_json::from_str(&chart_file("files/monitoring/grafana-dashboard.json")).unwrap();
    let map = named(&docs, "ConfigMap", &format!("{FULLNAME}-dashboard"));
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    let data = map["data"]["dynamo.json"].as_str().expect("the dashboard");
    // Byte for byte: Grafana's `{{model}}` legends are not taken for templates.
    assert_eq!(
        data,
        chart_file("files/monitoring/grafana-dashboard.json").trim_end()
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(data).unwrap(),
        dashboard
    );

    let docs = common::rendered_chart(&[
        "grafanaDashboard.enabled=true",
        "grafanaDashboard.label=dashboards.example.com/dynamo",
        "grafanaDashboard.labelValue=yes",
        "grafanaDashboard.namespace=monitoring",
        "grafanaDashboard.annotations.grafana_folder=Dynamo",
    ]);
    let map = named(&docs, "ConfigMap", &format!("{FULLNAME}-dashboard"));
    let labels = &map["metadata"]["labels"];
    assert_eq!(labels["dashboards.example.com/dynamo"], "yes");
    assert!(labels.get("grafana_dashboard").is_none(), "{labels}");
    assert_eq!(map["metadata"]["namespace"], "monitoring");
    assert_eq!(map["metadata"]["annotations"]["grafana_folder"], "Dynamo");
}

fn args(deployment: &Deployment) -> Vec<String> {
    operator_pod(deployment).1.args.clone().unwrap_or_default()
}

#[test]
fn namespace_scoped_mode_grants_a_role_where_the_operator_watches() {
    let docs = common::rendered_chart(&[]);
    let cluster = named(&docs, "ClusterRole", FULLNAME);
    assert_eq!(
        cluster["rules"],
        rules_json(&rbac::rules_yaml(rbac::CLUSTER_RULES))
    );
    assert_eq!(of_kind(&docs, "ClusterRole").len(), 1);
    assert!(
        !args(&rendered_deployment(&[]))
            .iter()
            .any(|a| a.starts_with("--watch-namespace"))
    );

    for (sets, watched) in [
        (&["namespaceScoped.enabled=true"][..], "ns"),
        (
            &[
                "namespaceScoped.enabled=true",
                "namespaceScoped.namespace=team-a",
            ][..],
            "team-a",
        ),
    ] {
        let docs = common::rendered_chart(sets);
        let role = named(&docs, "Role", FULLNAME);
        assert_eq!(role["metadata"]["namespace"], watched);
        assert_eq!(
            role["rules"],
            rules_json(&rbac::rules_yaml(&rbac::namespaced_rules()))
        );
        let binding = named(&docs, "RoleBinding", FULLNAME);
        assert_eq!(binding["metadata"]["namespace"], watched);
        assert_eq!(binding["roleRef"]["kind"], "Role");
        assert_eq!(binding["subjects"][0]["name"], FULLNAME);
        assert_eq!(binding["subjects"][0]["namespace"], "ns");
        // Cluster-wide only the graph CRD, by name; no binding to the full ClusterRole.
        let cluster_roles = of_kind(&docs, "ClusterRole");
        assert_eq!(cluster_roles.len(), 1, "{cluster_roles:?}");
        let crd_role = &cluster_roles[0];
        let crd_role_name = format!("{FULLNAME}-{watched}-crd");
        assert_eq!(crd_role["metadata"]["name"], crd_role_name.as_str());
        assert_eq!(
            crd_role["rules"],
            rules_json(&rbac::rules_yaml(&rbac::conversion_rules()))
        );
        let bindings = of_kind(&docs, "ClusterRoleBinding");
        assert_eq!(bindings.len(), 1);
        assert_eq!(bindings[0]["roleRef"]["name"], crd_role_name.as_str());
        // The lease and webhook Roles stay in the release's namespace.
        let webhook = named(&docs, "Role", &format!("{FULLNAME}-webhook"));
        assert_eq!(webhook["metadata"]["namespace"], "ns");

        let deployment = rendered_deployment(sets);
        let flag = format!("--watch-namespace={watched}");
        assert!(args(&deployment).contains(&flag), "{:?}", args(&deployment));
    }
    let refused = common::helm_template(&["namespaceScoped.namespace=Team_A"]).unwrap_err();
    assert!(refused.contains("/namespaceScoped/namespace"), "{refused}");
}

#[test]
fn an_optional_pod_disruption_budget_covers_the_operator_pods() {
    assert!(of_kind(&common::rendered_chart(&[]), "PodDisruptionBudget").is_empty());
    let selector = rendered_deployment(&[]).spec.unwrap().selector;
    for (sets, field, value) in [
        (
            &["podDisruptionBudget.enabled=true"][..],
            "maxUnavailable",
            serde_json::json!(1),
        ),
        (
            &[
                "podDisruptionBudget.enabled=true",
                "podDisruptionBudget.minAvailable=1",
            ][..],
            "minAvailable",
            serde_json::json!(1),
        ),
        (
            &[
                "podDisruptionBudget.enabled=true",
                "podDisruptionBudget.maxUnavailable=50%",
            ][..],
            "maxUnavailable",
            serde_json::json!("50%"),
        ),
    ] {
        let docs = common::rendered_chart(sets);
        let pdb = named(&docs, "PodDisruptionBudget", FULLNAME);
        assert_eq!(pdb["apiVersion"], "policy/v1");
        assert_eq!(pdb["spec"][field], value, "{sets:?}");
        let other = if field == "minAvailable" {
            "maxUnavailable"
        } else {
            "minAvailable"
        };
        assert!(pdb["spec"].get(other).is_none(), "{pdb}");
        assert_eq!(
            pdb["spec"]["selector"]["matchLabels"],
            serde_json::to_value(&selector.match_labels).unwrap()
        );
    }
    let both = common::helm_template(&[
        "podDisruptionBudget.enabled=true",
        "podDisruptionBudget.minAvailable=1",
        "podDisruptionBudget.maxUnavailable=1",
    ])
    .unwrap_err();
    assert!(both.contains("not both"), "{both}");
    let bad = common::helm_template(&["podDisruptionBudget.minAvailable=half"]).unwrap_err();
    assert!(bad.contains("/podDisruptionBudget/minAvailable"), "{bad}");
}

#[test]
fn an_image_digest_wins_over_the_tag_for_the_operator_and_every_image_it_generates() {
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let deployment = rendered_deployment(&[
        "image.repository=r.io/x/dynamo",
        "image.tag=t1",
        &format!("image.digest={digest}"),
        &format!("operator.sidecarImage=r.io/x/sidecar@{digest}"),
    ]);
    let (_, operator) = operator_pod(&deployment);
    let pinned = format!("r.io/x/dynamo@{digest}");
    assert_eq!(operator.image.as_deref(), Some(pinned.as_str()));
    let flags = args(&deployment);
    // --image is the default of the sidecar, EPP, planner and mocker images.
    assert!(flags.contains(&format!("--image={pinned}")), "{flags:?}");
    assert!(
        flags.contains(&format!("--sidecar-image=r.io/x/sidecar@{digest}")),
        "{flags:?}"
    );
    let command = OperatorArgs::augment_args(clap::Command::new("operator"));
    let parsed = command
        // The first argument is the subcommand, `operator`: the binary's name here.
        .try_get_matches_from(&flags)
        .expect("the operator takes the rendered flags");
    let config = OperatorArgs::from_arg_matches(&parsed)
        .unwrap()
        .operator_config();
    assert_eq!(config.epp_image, pinned);
    assert_eq!(config.planner_image, pinned);
    assert_eq!(config.mocker_image, pinned);
    assert_eq!(config.sidecar_image, format!("r.io/x/sidecar@{digest}"));

    for bad in [
        "image.digest=sha256:abc".to_string(),
        "image.digest=0123".to_string(),
        format!("operator.eppImage=r.io/x/epp@md5:{}", "0".repeat(32)),
    ] {
        let refused = common::helm_template(&[&bad]).unwrap_err();
        assert!(
            refused.contains("does not match pattern"),
            "{bad}: {refused}"
        );
    }
}

#[test]
fn extra_env_is_appended_to_the_operator_container() {
    let names = |deployment: &Deployment| -> Vec<String> {
        let (_, operator) = operator_pod(deployment);
        operator
            .env
            .iter()
            .flatten()
            .map(|e| e.name.clone())
            .collect()
    };
    let chart_own = names(&rendered_deployment(&[]));
    assert_eq!(chart_own, ["POD_NAME", "POD_NAMESPACE", "RUST_LOG"]);
    let deployment = rendered_deployment(&[
        "extraEnv[0].name=HTTPS_PROXY",
        "extraEnv[0].value=http://proxy:3128",
        "extraEnv[1].name=NODE",
        "extraEnv[1].valueFrom.fieldRef.fieldPath=spec.nodeName",
    ]);
    assert_eq!(
        names(&deployment),
        [
            "POD_NAME",
            "POD_NAMESPACE",
            "RUST_LOG",
            "HTTPS_PROXY",
            "NODE"
        ]
    );
    let (_, operator) = operator_pod(&deployment);
    let env = operator.env.as_ref().unwrap();
    assert_eq!(env[3].value.as_deref(), Some("http://proxy:3128"));
    let from = env[4]
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref());
    assert_eq!(from.map(|f| f.field_path.as_str()), Some("spec.nodeName"));
    let refused = common::helm_template(&["extraEnv[0].value=x"]).unwrap_err();
    assert!(refused.contains("name"), "{refused}");
}
