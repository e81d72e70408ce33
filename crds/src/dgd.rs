//! `DynamoGraphDeployment` (`dgd`, nvidia.com/v1alpha1): a graph of services (frontend,
//! EPP, workers, planner) deployed together.
//!
//! Field names follow Dynamo's v1alpha1 Go types (`dynamographdeployment_types.go` and the
//! `DynamoComponentDeploymentSharedSpec` in `dynamocomponentdeployment_types.go`); fields we
//! do not act on are kept in `other` maps so Dynamo manifests round-trip.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{
    ExtraPodMetadata, ExtraPodSpec, MultinodeSpec, PreservedFields, Pvc, Resources, ScalingAdapter,
    SharedMemorySpec, TopologyConstraint, VolumeMount,
};

/// Most services one graph may have (Dynamo's `MaxProperties=25`).
pub const MAX_SERVICES: usize = 25;

/// Extended resource name of a service's GPUs when `resources.*.gpuType` is unset (the
/// NVIDIA device plugin's).
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Desired state of a DynamoGraphDeployment.
// Each printcolumn(...) repeats `type_ = ...`, which clippy mistakes for a duplicate attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "nvidia.com",
    version = "v1alpha1",
    kind = "DynamoGraphDeployment",
    plural = "dynamographdeployments",
    shortname = "dgd",
    namespaced,
    status = "DynamoGraphDeploymentStatus",
    derive = "PartialEq",
    doc = "A graph of inference services (frontend, endpoint picker, workers, planner) deployed and scaled together.",
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.state",
        description = "Lifecycle state of the graph"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.readyServices",
        description = "Ready services / services"
    ),
    printcolumn(
        name = "Backend",
        type_ = "string",
        json_path = ".spec.backendFramework",
        description = "Inference engine"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DynamoGraphDeploymentSpec {
    /// Services of the graph by name (at most 25). A name is a DNS-1123 label, compared
    /// case-insensitively (Dynamo's examples use names like `VllmDecodeWorker`; object names
    /// derived from it are lower-cased), at most 63 characters.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 25))]
    #[x_kube(
        validation = kube::core::Rule::new("self.all(name, size(name) <= 63 && name.lowerAscii().matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))").message("service names must be DNS-1123 labels: letters, digits and '-', starting and ending with a letter or digit, at most 63 characters"),
        validation = kube::core::Rule::new("size(self.filter(name, has(self[name].componentType) && self[name].componentType == 'planner')) <= 1").message("at most one service may have componentType planner"),
        validation = kube::core::Rule::new("size(self.filter(name, has(self[name].componentType) && self[name].componentType == 'epp')) <= 1").message("at most one service may have componentType epp"),
    )]
    pub services: BTreeMap<String, ComponentSpec>,
    /// Inference engine of the workers. `mocker` runs the CPU-only simulated engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_framework: Option<BackendFramework>,
    /// Environment variables for every service; a service's own `envs` win on conflicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envs: Option<Vec<EnvVar>>,
    /// Persistent volume claims services can mount through `volumeMounts` (at most 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 100))]
    pub pvcs: Option<Vec<Pvc>>,
    /// Default placement domain for services that do not set their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_constraint: Option<TopologyConstraint>,
    /// Annotations for every object generated for the graph; service-level annotations win.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Labels for every object generated for the graph; service-level labels win.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Other Dynamo fields (e.g. `restart`, `experimental`), kept but not acted on.
    #[serde(flatten)]
    pub other: PreservedFields,
}

/// One service of the graph: its role, size, resources and pod overrides.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.multinode) || (has(self.resources) && ((has(self.resources.limits) && has(self.resources.limits.gpu) && self.resources.limits.gpu != '0') || (has(self.resources.requests) && has(self.resources.requests.gpu) && self.resources.requests.gpu != '0')))").message("multinode requires GPUs: set resources.limits.gpu (or resources.requests.gpu) to at least 1"))]
pub struct ComponentSpec {
    /// Role of the service; decides how the operator wires it (frontend, epp, worker,
    /// prefill, decode, planner; `main` and `default` are older Dynamo spellings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component_type: Option<ComponentType>,
    /// Sub-role of a worker, e.g. "prefill" or "decode" for a disaggregated graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_component_type: Option<String>,
    /// Number of pods (of gangs, for a multinode service). Owned by the scaling adapter when
    /// `scalingAdapter.enabled` is true, and for an engine service of a graph with a planner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Spread each replica over several nodes (leader plus workers, gang-scheduled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multinode: Option<MultinodeSpec>,
    /// CPU, memory and GPU requests and limits of the main container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Extra environment variables of the main container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envs: Option<Vec<EnvVar>>,
    /// Name of a Secret whose keys become environment variables (e.g. a Hugging Face token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_from_secret: Option<String>,
    /// Claims from `spec.pvcs` to mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<VolumeMount>>,
    /// Size of /dev/shm, or no tmpfs at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_memory: Option<SharedMemorySpec>,
    /// Pod spec overrides, including `mainContainer` (image, command, args).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_pod_spec: Option<ExtraPodSpec>,
    /// Labels and annotations added to the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_pod_metadata: Option<ExtraPodMetadata>,
    /// Liveness probe of the main container, replacing the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<Probe>,
    /// Readiness probe of the main container, replacing the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Probe>,
    /// Let a DynamoGraphDeploymentScalingAdapter own `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling_adapter: Option<ScalingAdapter>,
    /// Placement domain this service's pods are packed into; narrower than or equal to the graph's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_constraint: Option<TopologyConstraint>,
    /// Annotations for the objects generated for this service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Labels for the objects generated for this service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Dynamo runtime namespace (deprecated in Dynamo; kept for compatibility).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamo_namespace: Option<String>,
    /// Other Dynamo fields (e.g. `globalDynamoNamespace`, `ingress`, `autoscaling`,
    /// `eppConfig`), kept but not acted on.
    #[serde(flatten)]
    pub other: PreservedFields,
}

impl ComponentSpec {
    /// Nodes per replica: `multinode.nodeCount`, or 1.
    pub fn node_count(&self) -> i32 {
        self.multinode.as_ref().map_or(1, |m| m.node_count)
    }
}

/// Role of a service in the graph. Dynamo's v1alpha1 takes a free string; these are the
/// values its operator understands (`main` and `default` are older names of a plain worker).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ComponentType {
    /// OpenAI-compatible HTTP entry point.
    Frontend,
    /// Endpoint picker (Gateway API Inference Extension ext_proc server).
    Epp,
    /// Aggregated engine worker (prefill and decode in one).
    Worker,
    /// Prefill-only engine worker of a disaggregated graph.
    Prefill,
    /// Decode-only engine worker of a disaggregated graph.
    Decode,
    /// SLA planner that scales the workers.
    Planner,
    /// Older Dynamo name of the main component.
    Main,
    /// Older Dynamo name of a component without a special role.
    Default,
}

/// Inference engine run by the workers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BackendFramework {
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
    /// TensorRT-LLM.
    Trtllm,
    /// The CPU-only simulated engine (no GPUs).
    Mocker,
}

/// Observed state of a DynamoGraphDeployment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DynamoGraphDeploymentStatus {
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Lifecycle state of the whole graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<GraphState>,
    /// Ready services out of all services, e.g. "2/3" (shown by `kubectl get dgd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_services: Option<String>,
    /// Conditions of the graph; `Ready` at least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// Replica counts per service, by service name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<BTreeMap<String, ServiceReplicaStatus>>,
}

/// Lifecycle state of a graph.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GraphState {
    /// Accepted, nothing created yet.
    Pending,
    /// Objects created, pods not all ready.
    Deploying,
    /// Every service has all its replicas ready.
    Ready,
    /// Was ready, now some replicas are not.
    Degraded,
    /// Cannot make progress (see conditions).
    Failed,
}

/// Replica counts of one service.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceReplicaStatus {
    /// Replicas that exist.
    #[serde(default)]
    pub replicas: i32,
    /// Replicas running the current spec.
    #[serde(default)]
    pub updated_replicas: i32,
    /// Replicas whose pods are all ready.
    #[serde(default)]
    pub ready_replicas: i32,
}
