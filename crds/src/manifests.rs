//! CRD manifests generated from the Rust types.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{
    DynamoGraphDeployment, DynamoGraphDeploymentRequest, DynamoGraphDeploymentScalingAdapter,
    api_reference_markdown,
};

/// First line of every generated file, so nobody edits one by hand.
pub const GENERATED_HEADER: &str =
    "# Generated from crds/src by `make crds` (dynamo crds). Do not edit.\n";

/// The three CRDs, in a fixed order: DGD, DGDSA, DGDR.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        DynamoGraphDeployment::crd(),
        DynamoGraphDeploymentScalingAdapter::crd(),
        DynamoGraphDeploymentRequest::crd(),
    ]
}

/// `(file name, YAML)` for each CRD, e.g. `("nvidia.com_dynamographdeployments.yaml", ...)`
/// (kubebuilder's `<group>_<plural>.yaml` naming). Output is deterministic: the schema
/// maps are ordered, so the same types always give the same bytes.
pub fn crd_manifests() -> Vec<(String, String)> {
    crds()
        .into_iter()
        .map(|crd| {
            let file_name = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
            let body = serde_saphyr::to_string(&crd).expect("a CRD always serializes to YAML");
            (file_name, format!("{GENERATED_HEADER}{body}"))
        })
        .collect()
}

/// Folders, relative to the repository root, that hold nothing but generated CRD YAML.
pub const GENERATED_CRD_DIRS: [&str; 2] = ["crds/manifests", "charts/dynamo-platform/crds"];

/// Every generated file as (path from the repository root, content): each CRD in every
/// folder of [`GENERATED_CRD_DIRS`], and `docs/api.md`. `dynamo crds` writes them and a
/// test checks the checked-in copies against them.
pub fn generated_files() -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    for (name, yaml) in crd_manifests() {
        for dir in GENERATED_CRD_DIRS {
            files.push((Path::new(dir).join(&name), yaml.clone()));
        }
    }
    files.push((PathBuf::from("docs/api.md"), api_reference_markdown()));
    files
}
