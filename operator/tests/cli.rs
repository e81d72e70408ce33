//! The `dynamo` binary as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn dynamo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dynamo"))
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("dynamo runs")
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn validate_accepts_a_sample_and_names_the_object() {
    let out = dynamo(&["validate", "-f", "config/samples/disagg-mocker.yaml"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("DynamoGraphDeployment/disagg-mocker is valid"),
        "{stdout}"
    );
}

#[test]
fn validate_refuses_a_bad_manifest_with_the_field_and_fails() {
    let out = dynamo(&[
        "validate",
        "-f",
        "config/samples/agg-mocker.yaml",
        "crds/tests/bad/multinode-one-node.yaml",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("multinode-one-node.yaml")
            && stderr.contains("spec.services.decode.multinode.nodeCount"),
        "{stderr}"
    );
    // The good file is still reported as valid.
    assert!(String::from_utf8_lossy(&out.stdout).contains("agg-mocker is valid"));
}

#[test]
fn crds_writes_every_generated_file_and_removes_stale_yaml() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("crds-root");
    let _ = std::fs::remove_dir_all(&root);
    let stale = root.join("crds/manifests/nvidia.com_renamed.yaml");
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    std::fs::write(&stale, "old").unwrap();

    let out = dynamo(&["crds", "--root", root.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");

    assert!(!stale.exists(), "a YAML file no type generates is removed");
    let generated = dynamo_crds::generated_files()
        .into_iter()
        .chain(dynamo_operator::controller::rbac::generated_files());
    for (path, content) in generated {
        let written = std::fs::read_to_string(root.join(&path)).unwrap();
        assert_eq!(written, content, "{}", path.display());
    }
}
