//! `InferencePool` (`inference.networking.k8s.io/v1`) of the Gateway API Inference Extension.
//!
//! The operator creates one per graph; the CRD itself belongs to the Inference Extension
//! and is installed with it, so this type is NOT part of [`crate::crds`]. `gateway-api`
//! has no Inference Extension types, hence our own. Field names and shapes follow
//! `api/v1/inferencepool_types.go` in kubernetes-sigs/gateway-api-inference-extension
//! (v1: `selector.matchLabels`, `targetPorts[{number}]` with exactly one entry,
//! `endpointPickerRef{group, kind, name, port{number}, failureMode}`, where `port` is
//! required when `kind` is `Service`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of an InferencePool: which pods serve, on which port, and who picks among them.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "inference.networking.k8s.io",
    version = "v1",
    kind = "InferencePool",
    plural = "inferencepools",
    shortname = "infpool",
    namespaced,
    status = "InferencePoolStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// Pods of this namespace that are members of the pool, by label.
    pub selector: PoolLabelSelector,
    /// Port the gateway sends traffic to on member pods (the API allows exactly one).
    pub target_ports: Vec<PoolPort>,
    /// The Endpoint Picker extension that chooses a member pod per request.
    pub endpoint_picker_ref: EndpointPickerRef,
}

/// Label selector of the pool: equality matches only (Service-selector compatible).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolLabelSelector {
    /// Labels a pod must carry, all of them, to be a member.
    pub match_labels: BTreeMap<String, String>,
}

/// A port number (1..=65535).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct PoolPort {
    /// The port number.
    pub number: i32,
}

/// Reference to the Endpoint Picker extension.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPickerRef {
    /// API group of the referent; "" (core) when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind of the referent; "Service" when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the referent.
    pub name: String,
    /// Service port of the extension (not the target port); required for a Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PoolPort>,
    /// What the gateway does when the picker does not answer; `FailClose` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<EndpointPickerFailureMode>,
}

/// How the gateway behaves when the Endpoint Picker is unresponsive.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum EndpointPickerFailureMode {
    /// Forward the request to an endpoint of the gateway's own choosing.
    FailOpen,
    /// Drop the request.
    FailClose,
}

/// Observed state of an InferencePool, written by the gateways that use it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolStatus {
    /// One entry per parent (typically a Gateway) the pool is associated with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parents: Option<Vec<InferencePoolParentStatus>>,
}

/// Status of the pool as one parent sees it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolParentStatus {
    /// `Accepted` and `ResolvedRefs` conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// The parent this entry describes.
    pub parent_ref: InferencePoolParentReference,
}

/// A parent (by default a `gateway.networking.k8s.io` Gateway) of the pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolParentReference {
    /// API group; `gateway.networking.k8s.io` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind; `Gateway` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name of the parent.
    pub name: String,
    /// Namespace of the parent; the pool's own when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}
