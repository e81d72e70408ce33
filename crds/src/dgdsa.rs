//! `DynamoGraphDeploymentScalingAdapter` (`dgdsa`, nvidia.com/v1alpha1): the scale
//! subresource of one service of a graph. The planner, HPA and KEDA scale through it; only
//! its controller writes the graph's `replicas`.
//!
//! Field names follow Dynamo's v1alpha1 `dynamographdeploymentscalingadapter_types.go`
//! (ai-dynamo/dynamo `deploy/operator/api/v1alpha1`): `spec.dgdRef{name, serviceName}`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired replicas of one service of a DynamoGraphDeployment.
// Each printcolumn(...) repeats `type_ = ...`, which clippy mistakes for a duplicate attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nvidia.com",
    version = "v1alpha1",
    kind = "DynamoGraphDeploymentScalingAdapter",
    plural = "dynamographdeploymentscalingadapters",
    shortname = "dgdsa",
    namespaced,
    status = "DynamoGraphDeploymentScalingAdapterStatus",
    derive = "PartialEq",
    doc = "Scale subresource for one service of a DynamoGraphDeployment, so the planner, HPA and KEDA can scale it.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "DGD",
        type_ = "string",
        json_path = ".spec.dgdRef.name",
        description = "DynamoGraphDeployment name"
    ),
    printcolumn(
        name = "Service",
        type_ = "string",
        json_path = ".spec.dgdRef.serviceName",
        description = "Service name"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Desired replicas"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.replicas",
        description = "Current replicas"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DynamoGraphDeploymentScalingAdapterSpec {
    /// Desired replicas of the service; written by autoscalers through the scale subresource.
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// The graph and service this adapter scales.
    #[schemars(schema_with = "dgd_ref_schema")]
    pub dgd_ref: DgdServiceRef,
}

/// A service inside a DynamoGraphDeployment. Written as Dynamo's `serviceName`; `service`,
/// the name this operator used before, is still read (adapters it created carry it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct DgdServiceRef {
    /// Name of the DynamoGraphDeployment, in the adapter's namespace.
    pub name: String,
    /// Key of the service in the graph's `spec.services` (the component's `name` in v1beta1).
    #[serde(rename = "serviceName", alias = "service")]
    pub service: String,
}

/// The schema of [`DgdServiceRef`]: both spellings of the service, exactly one of them set
/// (serde refuses an object with both as a duplicate field).
fn dgd_ref_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let service =
        "Key of the service in the graph's `spec.services` (the component's `name` in v1beta1).";
    schemars::json_schema!({
        "description": "The graph and service this adapter scales.",
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {
                "description": "Name of the DynamoGraphDeployment, in the adapter's namespace.",
                "type": "string",
                "minLength": 1
            },
            "serviceName": {"description": service, "type": "string", "minLength": 1},
            "service": {
                "description": "Older spelling of `serviceName`, still read.",
                "type": "string",
                "minLength": 1
            }
        },
        "x-kubernetes-validations": [{
            "rule": "has(self.serviceName) != has(self.service)",
            "message": "dgdRef needs serviceName (or its older spelling service), not both"
        }]
    })
}

/// Observed state of a scaling adapter.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DynamoGraphDeploymentScalingAdapterStatus {
    /// Current replicas of the service (the scale subresource's status replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Label selector of the service's pods, as a string (needed by the HPA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// When the adapter last changed the service's replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
}
