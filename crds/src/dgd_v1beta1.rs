//! `DynamoGraphDeployment` at `nvidia.com/v1beta1`: the same graph as v1alpha1
//! ([`crate::dgd`]) in the shape Dynamo now documents: a `components` list whose entries
//! carry their `name`, a `type` with `prefill`/`decode` as roles of their own, and one
//! `podTemplate` (a Kubernetes PodTemplateSpec whose container `main` runs the engine) in
//! place of v1alpha1's `resources`, `envs`, `extraPodSpec`, probes and pod metadata.
//!
//! Field names follow Dynamo's v1beta1 Go types (ai-dynamo/dynamo
//! `deploy/operator/api/dynamo/v1beta1/dynamographdeployment_types.go` and the
//! `DynamoComponentDeploymentSharedSpec` of `dynamocomponentdeployment_types.go`), and so
//! do its validation rules (unique names compared case-insensitively, at most one `epp`,
//! `eppConfig` only on an `epp`, `minAvailable` bounds). Both versions are served from one
//! CRD; [`crate::conversion`] converts between them losslessly.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMapKeySelector, EnvVar};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{MultinodeSpec, PreservedFields};
use crate::dgd::{BackendFramework, GraphState, MAX_SERVICES, ServiceReplicaStatus};

/// Desired state of a DynamoGraphDeployment (v1beta1).
// Each printcolumn(...) repeats `type_ = ...`, which clippy mistakes for a duplicate attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "nvidia.com",
    version = "v1beta1",
    kind = "DynamoGraphDeployment",
    plural = "dynamographdeployments",
    shortname = "dgd",
    namespaced,
    status = "DynamoGraphDeploymentStatus",
    derive = "PartialEq",
    doc = "A graph of inference components (frontend, endpoint picker, workers, planner) deployed and scaled together.",
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.state",
        description = "Lifecycle state of the graph"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.readyComponents",
        description = "Ready components / components"
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
    /// Annotations for every object generated for the graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Labels for every object generated for the graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// PriorityClass of the graph's pods (Dynamo uses it for Grove PodCliqueSets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Components of the graph (at most 25), each with a `name` unique within the graph
    /// compared case-insensitively; at most one has `type: epp` and at most one `type: planner`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_SERVICES))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(
        validation = kube::core::Rule::new("self.all(c1, self.filter(c2, c2.name.lowerAscii() == c1.name.lowerAscii()).size() == 1)").message("component names must be unique, compared case-insensitively (spec.components[].name)"),
        validation = kube::core::Rule::new("self.filter(c, has(c.type) && c.type == 'epp').size() <= 1").message("at most one component may have type epp"),
        validation = kube::core::Rule::new("self.filter(c, has(c.type) && c.type == 'planner').size() <= 1").message("at most one component may have type planner"),
    )]
    pub components: Vec<Component>,
    /// Environment variables put before every component's own (a component's `main`
    /// container wins on a name both set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
    /// Inference engine of the workers. `mocker` runs the CPU-only simulated engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_framework: Option<BackendFramework>,
    /// Restart request: changing `id` restarts the graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<Restart>,
    /// Default placement domain for components that set none, and the ClusterTopology
    /// that defines the levels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_constraint: Option<SpecTopologyConstraint>,
    /// Preview features of the graph (e.g. `kvTransferPolicy`), kept but not acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experimental: Option<PreservedFields>,
    /// Other Dynamo fields, kept but not acted on.
    #[serde(flatten)]
    pub other: PreservedFields,
}

/// One component of the graph: its name, role, size and pod template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("!has(self.eppConfig) || (has(self.type) && self.type == 'epp')").message("eppConfig may only be set when type is epp"),
    validation = kube::core::Rule::new("!has(self.minAvailable) || (has(self.replicas) && self.replicas == 0) || self.minAvailable <= (has(self.replicas) ? self.replicas : 1)").message("minAvailable must be at most replicas, unless replicas is 0"),
    validation = kube::core::Rule::new("!has(self.frontendSidecar) || (has(self.podTemplate) && has(self.podTemplate.spec) && has(self.podTemplate.spec.containers) && self.podTemplate.spec.containers.exists(c, c.name == self.frontendSidecar))").message("frontendSidecar must name a container of podTemplate.spec.containers"),
    validation = kube::core::Rule::new("!has(self.multinode) || (has(self.podTemplate) && has(self.podTemplate.spec) && has(self.podTemplate.spec.containers) && self.podTemplate.spec.containers.exists(c, c.name == 'main' && has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, r.endsWith('/gpu'))) || (has(c.resources.requests) && c.resources.requests.exists(r, r.endsWith('/gpu'))))))").message("multinode requires GPUs: set a GPU resource (e.g. nvidia.com/gpu) in the limits or requests of the podTemplate's container main"),
)]
pub struct Component {
    /// Name of the component, unique within the graph (compared case-insensitively):
    /// letters, digits and '-', starting and ending with a letter or digit, at most 63
    /// characters. Object names derived from it are lower-cased.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$")
    )]
    pub name: String,
    /// Role of the component; decides how the operator wires it.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub component_type: Option<ComponentType>,
    /// Place the component in Dynamo's global runtime namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_dynamo_namespace: Option<bool>,
    /// Pod template of the component's pods: the operator merges its defaults into the
    /// container named `main` and keeps every other container as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplate>,
    /// Number of pods (of gangs, for a multinode component). Owned by the scaling adapter
    /// when `scalingAdapter` is set, and for an engine component of a graph with a planner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Replicas that must be placed together (Dynamo's Grove gang minimum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_available: Option<i32>,
    /// Spread each replica over several nodes (leader plus workers, gang-scheduled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multinode: Option<MultinodeSpec>,
    /// Size of the tmpfs at /dev/shm; unset means the operator's default (8Gi), "0" none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_memory_size: Option<Quantity>,
    /// Model served by the component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_ref: Option<ModelReference>,
    /// Present (even as `{}`): a DynamoGraphDeploymentScalingAdapter owns `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling_adapter: Option<ScalingAdapterOptIn>,
    /// Endpoint picker configuration; only on a component of type `epp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epp_config: Option<EppConfig>,
    /// Name of the container of `podTemplate` that runs Dynamo's frontend beside the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_CONTAINER_NAME))]
    pub frontend_sidecar: Option<String>,
    /// A claim mounted as the engine's compilation cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compilation_cache: Option<CompilationCache>,
    /// Placement domain this component's pods are packed into; narrower than or equal to the graph's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_constraint: Option<ComponentTopologyConstraint>,
    /// Preview features of the component (e.g. `gpuMemoryService`, `failover`,
    /// `checkpoint`), kept but not acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experimental: Option<PreservedFields>,
    /// Other Dynamo fields, kept but not acted on.
    #[serde(flatten)]
    pub other: PreservedFields,
}

/// Role of a component (Dynamo's v1beta1 enum).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ComponentType {
    /// OpenAI-compatible HTTP entry point.
    Frontend,
    /// Aggregated engine worker (prefill and decode in one).
    Worker,
    /// Prefill-only engine worker of a disaggregated graph.
    Prefill,
    /// Decode-only engine worker of a disaggregated graph.
    Decode,
    /// SLA planner that scales the workers.
    Planner,
    /// Endpoint picker (Gateway API Inference Extension ext_proc server).
    Epp,
    /// A component without a special role.
    Default,
}

/// Bounds of a component's pod template. The API server estimates a CEL rule's cost from
/// the largest list and map the schema allows, and refuses the CRD when a rule could cost
/// more than its budget: the rules that look for `main`'s GPU and the frontend container
/// walk `containers` and each one's resource names, so both are bounded. Measured on
/// kube-apiserver v1.36: 64 containers x 256 names or 256 x 32 are accepted, 1024 x 32 or
/// 64 x 1024 refused; 32 x 32 leaves the budget room for later rules.
pub const MAX_CONTAINERS: usize = 32;
/// Resource names in a container's `limits` (or `requests`).
pub const MAX_RESOURCE_NAMES: usize = 32;
/// A container's name is a DNS label.
pub const MAX_CONTAINER_NAME: usize = 63;

/// A Kubernetes PodTemplateSpec. Only what the schema checks is spelled out; every other
/// field is kept as written and checked by the API server when the pods are created.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PodTemplate {
    /// Labels and annotations of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<PodTemplateMetadata>,
    /// The pod spec; its container `main` is the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodTemplatePodSpec>,
}

/// Metadata of the pods of a component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PodTemplateMetadata {
    /// Labels added to every pod of the component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations added to every pod of the component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Other ObjectMeta fields, kept as written.
    #[serde(flatten)]
    pub other: PreservedFields,
}

/// A Kubernetes PodSpec; every field but `containers` is kept as written.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PodTemplatePodSpec {
    /// Containers of the pod (at most 32), by name: `main` (the engine, merged with the
    /// operator's defaults) and the user's own, which must name their `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_CONTAINERS))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub containers: Option<Vec<PodContainer>>,
    /// Other PodSpec fields, kept as written.
    #[serde(flatten)]
    pub other: PreservedFields,
}

/// A Kubernetes Container; the fields the schema's rules read are spelled out.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[x_kube(validation = kube::core::Rule::new("self.name == 'main' || has(self.image)").message("every container but main must set image (the operator fills in main's)"))]
pub struct PodContainer {
    /// Name of the container (a DNS label, as Kubernetes requires); `main` is the engine.
    #[schemars(length(min = 1, max = MAX_CONTAINER_NAME))]
    pub name: String,
    /// Image of the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Requests and limits, by resource name (e.g. `nvidia.com/gpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ContainerResources>,
    /// Other Container fields, kept as written.
    #[serde(flatten)]
    pub other: PreservedFields,
}

/// A Container's ResourceRequirements.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ContainerResources {
    /// Maximum amounts, by resource name (at most 32 names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = MAX_RESOURCE_NAMES))]
    pub limits: Option<BTreeMap<String, Quantity>>,
    /// Amounts reserved by the scheduler, by resource name (at most 32 names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = MAX_RESOURCE_NAMES))]
    pub requests: Option<BTreeMap<String, Quantity>>,
    /// Other fields (e.g. `claims`), kept as written.
    #[serde(flatten)]
    pub other: PreservedFields,
}

/// Opt-in to the scaling adapter; no settings yet (Dynamo's is an empty struct).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ScalingAdapterOptIn {}

/// A model a component serves.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelReference {
    /// Base model identifier.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Revision of the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// Endpoint picker configuration: a ConfigMap key, or the configuration itself.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.configMapRef) != has(self.config)").message("eppConfig needs exactly one of configMapRef and config"))]
pub struct EppConfig {
    /// ConfigMap key holding an EndpointPickerConfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapKeySelector>,
    /// An EndpointPickerConfig, kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<PreservedFields>,
}

/// A claim mounted as the engine's compilation cache.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompilationCache {
    /// Name of an existing PersistentVolumeClaim in the graph's namespace.
    #[schemars(length(min = 1))]
    pub pvc_name: String,
    /// Where to mount it; a backend default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<String>,
}

/// Placement domain of one component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentTopologyConstraint {
    /// Topology level to pack within, e.g. "rack", "host", or "nvlink" (node label
    /// `nvidia.com/gpu.clique`).
    #[schemars(regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"))]
    pub pack_domain: String,
}

/// Placement of the whole graph.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpecTopologyConstraint {
    /// Name of the ClusterTopology that defines the levels (v1alpha1's `topologyProfile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_topology_name: Option<String>,
    /// Default topology level to pack within.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"))]
    pub pack_domain: Option<String>,
}

/// A restart request.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Restart {
    /// Any string; changing it requests a restart.
    #[schemars(length(min = 1))]
    pub id: String,
    /// How the components restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<RestartStrategy>,
}

/// Order of a restart.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestartStrategy {
    /// One component after another, or all at once.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub strategy_type: Option<RestartStrategyType>,
    /// Component names in restart order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<String>>,
}

/// Kinds of restart.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RestartStrategyType {
    /// One component after another.
    Sequential,
    /// All components at once.
    Parallel,
}

/// Observed state of a DynamoGraphDeployment (v1beta1): v1alpha1's, by component.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DynamoGraphDeploymentStatus {
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Lifecycle state of the whole graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<GraphState>,
    /// Ready components out of all components, e.g. "2/3" (shown by `kubectl get dgd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_components: Option<String>,
    /// Conditions of the graph; `Ready` at least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// Replica counts per component, by component name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub components: Option<BTreeMap<String, ServiceReplicaStatus>>,
}
