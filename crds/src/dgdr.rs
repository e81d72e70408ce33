//! `DynamoGraphDeploymentRequest` (`dgdr`, nvidia.com/v1beta1): "serve this model within
//! this SLA on this hardware". The operator profiles, generates a DynamoGraphDeployment and
//! (with `autoApply`) deploys it.
//!
//! Field names follow Dynamo's v1beta1 `dynamographdeploymentrequest_types.go`; we add the
//! `mocker` backend and state the one-SLA-mode rule in the schema.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::common::PreservedFields;

/// What to serve and the targets to meet.
// Each printcolumn(...) repeats `type_ = ...`, which clippy mistakes for a duplicate attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nvidia.com",
    version = "v1beta1",
    kind = "DynamoGraphDeploymentRequest",
    plural = "dynamographdeploymentrequests",
    shortname = "dgdr",
    namespaced,
    status = "DynamoGraphDeploymentRequestStatus",
    derive = "PartialEq",
    doc = "A request to serve a model within an SLA: the operator profiles it, generates a DynamoGraphDeployment and deploys it.",
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model"),
    printcolumn(name = "Backend", type_ = "string", json_path = ".spec.backend"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Profiling",
        type_ = "string",
        json_path = ".status.profilingPhase",
        priority = 1
    ),
    printcolumn(name = "DGD", type_ = "string", json_path = ".status.dgdName"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DynamoGraphDeploymentRequestSpec {
    /// Model to serve: a Hugging Face ID such as "Qwen/Qwen3-0.6B", or a private model name.
    #[schemars(length(min = 1))]
    pub model: String,
    /// Inference engine; `auto` lets the profiler choose.
    #[serde(default = "default_backend")]
    pub backend: RequestBackend,
    /// Container image of the profiling job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// GPUs available for profiling and deployment; discovered from the cluster when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<HardwareSpec>,
    /// Expected traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadSpec>,
    /// Latency targets: either `ttft` and `itl`, or `e2eLatency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sla: Option<SlaSpec>,
    /// Optional platform features of the generated graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<FeaturesSpec>,
    /// The model's `config.json` in a ConfigMap of the request's namespace, for a model the
    /// profiler's built-in catalog does not know (an extension of ours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_config_ref: Option<ModelConfigRef>,
    /// How the profiler predicts the engines (Dynamo's v1alpha1 field; of its contents only
    /// `calibrationRef` is ours and acted on, the others are kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiling_config: Option<ProfilingConfig>,
    /// Deploy the generated DynamoGraphDeployment when profiling is done; when false it is
    /// only stored in `status.profilingResults.selectedConfig`.
    #[serde(default = "default_true")]
    pub auto_apply: bool,
    /// Other Dynamo fields (e.g. `modelCache`, `overrides`, `searchStrategy`), kept but not acted on.
    #[serde(flatten)]
    pub other: PreservedFields,
}

fn default_backend() -> RequestBackend {
    RequestBackend::Auto
}

fn default_true() -> bool {
    true
}

/// Inference engine of a request.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RequestBackend {
    /// Let the profiler choose.
    #[default]
    Auto,
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
    /// TensorRT-LLM.
    Trtllm,
    /// The CPU-only simulated engine.
    Mocker,
}

/// GPU hardware for profiling and deployment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.totalGpus) || !has(self.numGpusPerNode) || self.totalGpus >= self.numGpusPerNode").message("totalGpus must be >= numGpusPerNode"))]
pub struct HardwareSpec {
    /// GPU type to target, e.g. "h100_sxm", "h200_sxm", "b200_sxm", "l40s".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9_]+$"))]
    pub gpu_sku: Option<String>,
    /// Memory per GPU in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1.0))]
    pub vram_mb: Option<f64>,
    /// GPU budget for the whole deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub total_gpus: Option<i32>,
    /// GPUs per node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub num_gpus_per_node: Option<i32>,
    /// Other Dynamo fields (e.g. `interconnect`, `rdma`), kept but not acted on.
    #[serde(flatten)]
    pub other: PreservedFields,
}

/// Expected traffic of the model.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!(has(self.concurrency) && has(self.requestRate))").message("set at most one of concurrency and requestRate"))]
#[x_kube(validation = kube::core::Rule::new("(!has(self.concurrency) || self.concurrency > 0.0) && (!has(self.requestRate) || self.requestRate > 0.0)").message("concurrency and requestRate must be above 0"))]
pub struct WorkloadSpec {
    /// Input sequence length in tokens.
    #[serde(default = "default_isl")]
    #[schemars(range(min = 1))]
    pub isl: i32,
    /// Output sequence length in tokens.
    #[serde(default = "default_osl")]
    #[schemars(range(min = 1))]
    pub osl: i32,
    /// Target concurrent requests (excludes `requestRate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub concurrency: Option<f64>,
    /// Target request rate in requests per second (excludes `concurrency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub request_rate: Option<f64>,
}

fn default_isl() -> i32 {
    4000
}

fn default_osl() -> i32 {
    1000
}

/// Latency targets, in milliseconds. Exactly one mode: `ttft` and `itl` together, or `e2eLatency`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("(has(self.ttft) && has(self.itl) && !has(self.e2eLatency)) || (!has(self.ttft) && !has(self.itl) && has(self.e2eLatency))").message("set exactly one SLA mode: ttft and itl together, or e2eLatency"))]
#[x_kube(validation = kube::core::Rule::new("[has(self.ttft) ? self.ttft : 1.0, has(self.itl) ? self.itl : 1.0, has(self.e2eLatency) ? self.e2eLatency : 1.0].all(t, t > 0.0)").message("latency targets must be above 0 ms"))]
pub struct SlaSpec {
    /// What the profiler optimizes once the targets are met.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimization_type: Option<OptimizationType>,
    /// Time to first token target, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub ttft: Option<f64>,
    /// Inter-token latency target, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub itl: Option<f64>,
    /// End-to-end request latency target, ms (instead of `ttft` and `itl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub e2e_latency: Option<f64>,
}

/// Optimization target of the profiler.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OptimizationType {
    /// Lowest latency within the GPU budget.
    Latency,
    /// Highest throughput per GPU within the SLA.
    Throughput,
}

/// A key of a ConfigMap holding a model's Hugging Face `config.json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelConfigRef {
    /// Name of the ConfigMap.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key of the `config.json` document.
    #[serde(default = "default_config_key")]
    pub key: String,
}

fn default_config_key() -> String {
    "config.json".into()
}

/// How the profiler predicts the request's engines.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfilingConfig {
    /// Measurements of the model on the request's GPU (`dynamo profile --calibrate`'s
    /// file, docs/perfmodel.md "Calibration") in a ConfigMap of the request's namespace:
    /// the profiler predicts on the efficiency factors fitted to them. The files it names
    /// (aiperf exports, `model_config`) are keys of the same ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration_ref: Option<CalibrationRef>,
    /// Dynamo's other fields (`profilerImage`, `config`, `configMapRef`, ...), kept but not
    /// acted on.
    #[serde(flatten)]
    pub other: PreservedFields,
}

/// A key of a ConfigMap holding a calibration file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CalibrationRef {
    /// Name of the ConfigMap.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key of the calibration file (YAML or JSON).
    #[serde(default = "default_calibration_key")]
    pub key: String,
}

fn default_calibration_key() -> String {
    "calibration.yaml".into()
}

/// Optional features of the generated graph.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeaturesSpec {
    /// Planner configuration, passed through to the planner; its presence adds a planner service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object_schema")]
    pub planner: Option<Value>,
    /// KV-cache-aware routing in the endpoint picker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_router: Option<Toggle>,
    /// Deploy mocker (simulated, CPU-only) workers instead of real engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mocker: Option<Toggle>,
}

/// An on/off switch.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Toggle {
    /// Turn the feature on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Schema of a free-form object kept as written.
fn preserved_object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Observed state of a request.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DynamoGraphDeploymentRequestStatus {
    /// Lifecycle phase of the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RequestPhase>,
    /// Step of the profiling pipeline while `phase` is Profiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiling_phase: Option<ProfilingPhase>,
    /// Conditions: Succeeded, Validation, Profiling, SpecGenerated, DeploymentReady.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// Output of profiling, including the generated graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiling_results: Option<ProfilingResults>,
    /// Name of the generated DynamoGraphDeployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dgd_name: Option<String>,
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Lifecycle phase of a request.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum RequestPhase {
    /// Validated, waiting to profile.
    Pending,
    /// The profiling job runs.
    Profiling,
    /// Profiling done; the generated graph is in status.
    Ready,
    /// The generated graph is being rolled out.
    Deploying,
    /// The generated graph is ready.
    Deployed,
    /// Cannot make progress (see conditions).
    Failed,
}

/// Step of the profiling pipeline (Dynamo's names).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ProfilingPhase {
    /// Loading the model and detecting hardware.
    Initializing,
    /// Measuring prefill (TTFT) across parallel layouts.
    SweepingPrefill,
    /// Measuring decode (ITL) across parallel layouts and concurrencies.
    SweepingDecode,
    /// Picking the cheapest configuration that meets the SLA.
    SelectingConfig,
    /// Fitting the planner's performance curves.
    BuildingCurves,
    /// Writing the DynamoGraphDeployment.
    GeneratingDGD,
    /// Finished.
    Done,
}

/// One configuration of the Pareto set: its layout and predictions (our profiler's
/// fields: `layout`, `gpus`, `ttftMs`, `itlMs`, `e2eMs`, `tokensPerSecondPerGpu`, `meetsSla`,
/// `selected`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParetoConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object_schema")]
    pub config: Option<Value>,
}

/// Output of profiling.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfilingResults {
    /// The configurations no other beats on both throughput per GPU and latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pareto: Option<Vec<ParetoConfig>>,
    /// The chosen configuration: a complete DynamoGraphDeployment manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object_schema")]
    pub selected_config: Option<Value>,
    /// Other results, kept as written.
    #[serde(flatten)]
    pub other: PreservedFields,
}
