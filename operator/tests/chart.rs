//! The Helm chart agrees with the code: its RBAC rules are the operator's tables (the
//! controller tests check every request against those tables), and every flag the
//! Deployment passes is one `dynamo operator` accepts.

mod common;

use clap::Args;
use common::repo_root;
use dynamo_operator::controller::{OperatorArgs, rbac};

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
    // Least privilege: nothing the code does not use, e.g. no secrets, no wildcards.
    let rules = chart_file("files/clusterrole-rules.yaml");
    assert!(
        !rules.contains('*') && !rules.contains("secrets"),
        "{rules}"
    );
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
