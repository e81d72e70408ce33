//! CRD manifests generated from the Rust types.

use std::path::{Path, PathBuf};

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, CustomResourceDefinitionVersion,
    ServiceReference, WebhookClientConfig, WebhookConversion,
};
use kube::CustomResourceExt;
use kube::core::crd::merge_crds;

use crate::conversion::{WEBHOOK_NAMESPACE, WEBHOOK_PATH, WEBHOOK_SERVICE, WEBHOOK_SERVICE_PORT};
use crate::{
    DynamoGraphDeployment, DynamoGraphDeploymentRequest, DynamoGraphDeploymentScalingAdapter,
    api_reference_markdown, dgd_v1beta1,
};

/// First line of every generated file, so nobody edits one by hand.
pub const GENERATED_HEADER: &str =
    "# Generated from crds/src by `make crds` (dynamo crds). Do not edit.\n";

/// The three CRDs, in a fixed order: DGD, DGDSA, DGDR.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        graph_crd(),
        DynamoGraphDeploymentScalingAdapter::crd(),
        DynamoGraphDeploymentRequest::crd(),
    ]
}

/// The DynamoGraphDeployment CRD: v1alpha1 (the storage version, as in Dynamo, so objects
/// written before v1beta1 existed stay readable without conversion and the controller's
/// own reads never wait on the webhook) and v1beta1, converted by the operator's webhook
/// at the default install's Service (the operator repoints it at start-up).
pub fn graph_crd() -> CustomResourceDefinition {
    let mut crd = merge_crds(
        vec![
            DynamoGraphDeployment::crd(),
            dgd_v1beta1::DynamoGraphDeployment::crd(),
        ],
        "v1alpha1",
    )
    .expect("both versions share group, kind and scope");
    crd.spec.conversion = Some(webhook_conversion(service_client_config(
        WEBHOOK_NAMESPACE,
        WEBHOOK_SERVICE,
        None,
    )));
    crd
}

/// `spec.conversion` of the DynamoGraphDeployment CRD: the webhook `client_config` names,
/// with `apiextensions.k8s.io/v1` ConversionReviews.
pub fn webhook_conversion(client_config: WebhookClientConfig) -> CustomResourceConversion {
    CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            client_config: Some(client_config),
            conversion_review_versions: vec!["v1".into()],
        }),
    }
}

/// The webhook at `https://{service}.{namespace}.svc:443/convert`, trusted through
/// `ca_bundle` (PEM): the operator in the cluster.
pub fn service_client_config(
    namespace: &str,
    service: &str,
    ca_bundle: Option<&[u8]>,
) -> WebhookClientConfig {
    WebhookClientConfig {
        ca_bundle: ca_bundle.map(|pem| ByteString(pem.to_vec())),
        service: Some(ServiceReference {
            name: service.into(),
            namespace: namespace.into(),
            path: Some(WEBHOOK_PATH.into()),
            port: Some(WEBHOOK_SERVICE_PORT),
        }),
        url: None,
    }
}

/// The webhook at `url` (https), trusted through `ca_bundle` (PEM): an operator run
/// outside the cluster, which the API server reaches directly.
pub fn url_client_config(url: &str, ca_bundle: &[u8]) -> WebhookClientConfig {
    WebhookClientConfig {
        ca_bundle: Some(ByteString(ca_bundle.to_vec())),
        service: None,
        url: Some(url.into()),
    }
}

/// The openAPIV3 schema of one version of a generated CRD, as JSON.
pub fn schema_of(version: &CustomResourceDefinitionVersion) -> serde_json::Value {
    serde_json::to_value(
        version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("every generated CRD version has a schema"),
    )
    .expect("a schema serializes")
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
