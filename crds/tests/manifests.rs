//! The checked-in CRD YAML and API reference match what the types generate.
//! `make crds` (`dynamo crds`) rewrites them.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn checked_in_files_match_the_types() {
    let root = repo_root();
    let stale: Vec<String> = dynamo_crds::generated_files()
        .into_iter()
        .filter(|(path, content)| {
            std::fs::read_to_string(root.join(path)).ok().as_ref() != Some(content)
        })
        .map(|(path, _)| path.display().to_string())
        .collect();
    assert!(
        stale.is_empty(),
        "generated files are out of date: {stale:?}; run `make crds`"
    );
}

#[test]
fn generation_is_deterministic() {
    assert_eq!(dynamo_crds::crd_manifests(), dynamo_crds::crd_manifests());
    assert_eq!(
        dynamo_crds::api_reference_markdown(),
        dynamo_crds::api_reference_markdown()
    );
}

#[test]
fn generated_yaml_reads_back_as_the_same_crd() {
    for (crd, (name, yaml)) in dynamo_crds::crds()
        .into_iter()
        .zip(dynamo_crds::crd_manifests())
    {
        let parsed: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
            serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(parsed, crd, "{name}");
    }
}
