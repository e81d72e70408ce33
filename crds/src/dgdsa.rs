//! `DynamoGraphDeploymentScalingAdapter` (`dgdsa`, nvidia.com/v1alpha1): the scale
//! subresource of one service of a graph. The planner, HPA and KEDA scale through it; only
//! its controller writes the graph's `replicas`.
//!
//! Field names follow Dynamo's `dynamographdeploymentscalingadapter_types.go`.

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
        json_path = ".spec.dgdRef.service",
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
    pub dgd_ref: DgdServiceRef,
}

/// A service inside a DynamoGraphDeployment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DgdServiceRef {
    /// Name of the DynamoGraphDeployment, in the adapter's namespace.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key of the service in the graph's `spec.services`.
    #[schemars(length(min = 1))]
    pub service: String,
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
