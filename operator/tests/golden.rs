//! Golden YAML of everything the operator wants for each sample graph.
//! Regenerate with `UPDATE_GOLDEN=1 cargo nextest run -p dynamo-operator --test golden`.

mod common;

use common::{cluster, observed, run, sample};

fn check(name: &str) {
    let mut dgd = sample(name);
    if name == "agg-vllm" {
        // Exercise the HTTPRoute too.
        dgd.metadata.annotations = Some(
            [(
                "nvidia.com/dynamo-gateway".to_string(),
                "gateways/inference-gw".to_string(),
            )]
            .into(),
        );
    }
    // First pass on an empty cluster, then a pass that sees what the first created, so
    // the golden shows the converged objects (a gang is released on the second pass).
    let first = run(&dgd, &observed(vec![], cluster()));
    let second = run(&dgd, &observed(first.pods.clone(), cluster()));
    let actual = second.to_yaml();
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{name}.yaml"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == actual,
        "{} differs from what reconcile produces; if the change is intended, run \
         `UPDATE_GOLDEN=1 cargo nextest run -p dynamo-operator --test golden` and review the diff",
        path.display()
    );
}

#[test]
fn agg_mocker() {
    check("agg-mocker");
}

#[test]
fn agg_mocker_kvbm() {
    check("agg-mocker-kvbm");
}

#[test]
fn disagg_mocker() {
    check("disagg-mocker");
}

#[test]
fn agg_vllm() {
    check("agg-vllm");
}

#[test]
fn agg_vllm_kvbm() {
    check("agg-vllm-kvbm");
}

#[test]
fn disagg_vllm() {
    check("disagg-vllm");
}

#[test]
fn multinode_vllm() {
    check("multinode-vllm");
}

#[test]
fn agg_mocker_planner() {
    check("agg-mocker-planner");
}
