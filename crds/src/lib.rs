//! Rust types of Dynamo's custom resources (group `nvidia.com`), their CRD manifests, the
//! API reference, and (feature `validate`) a validator that checks a manifest the way the API server would.
//!
//! - [`DynamoGraphDeployment`] (`dgd`, v1alpha1, stored) and
//!   [`dgd_v1beta1::DynamoGraphDeployment`] (v1beta1): a graph of services (components),
//!   served in both versions from one CRD; [`conversion`] converts between them.
//! - [`DynamoGraphDeploymentScalingAdapter`] (`dgdsa`, v1alpha1): scale subresource of one service.
//! - [`DynamoGraphDeploymentRequest`] (`dgdr`, v1beta1): SLA-driven request that yields a graph.

pub mod api_doc;
pub mod common;
pub mod conversion;
pub mod dgd;
pub mod dgd_v1beta1;
pub mod dgdr;
pub mod dgdsa;
pub mod inference_pool;
pub mod manifests;
pub mod role;
#[cfg(feature = "validate")]
pub mod validate;

pub use api_doc::api_reference_markdown;
pub use dgd::{
    BackendFramework, ComponentSpec, ComponentType, DynamoGraphDeployment,
    DynamoGraphDeploymentSpec, DynamoGraphDeploymentStatus, GraphState, ServiceReplicaStatus,
};
pub use dgdr::{
    DynamoGraphDeploymentRequest, DynamoGraphDeploymentRequestSpec,
    DynamoGraphDeploymentRequestStatus, RequestBackend, RequestPhase,
};
pub use dgdsa::{
    DgdServiceRef, DynamoGraphDeploymentScalingAdapter, DynamoGraphDeploymentScalingAdapterSpec,
    DynamoGraphDeploymentScalingAdapterStatus,
};
pub use manifests::{GENERATED_CRD_DIRS, crd_manifests, crds, generated_files};
pub use role::ServiceRole;
#[cfg(feature = "validate")]
pub use validate::{DynamoObject, Problem, Validated, ValidationError, validate_manifest};
