//! A DGDR's spec resolved into what the sweep needs: the model's architecture, the
//! backend, the GPUs, the workload and the SLA, with the defaults filled in and every
//! value checked (the CRD schema refuses most bad values already; a spec handed to the
//! library directly gets the same answers here).

use std::fmt;

use dynamo_crds::BackendFramework;
use dynamo_crds::dgdr::{
    DynamoGraphDeploymentRequestSpec, OptimizationType, RequestBackend, SlaSpec, WorkloadSpec,
};
use dynamo_perfmodel::estimate::GPU_MEMORY_UTILIZATION;
use dynamo_perfmodel::{Efficiency, GpuSpec, ModelArch, Uncertainty, catalog_names};

use crate::ProfileError;

/// `hardware.gpuSku` when unset.
pub const DEFAULT_GPU_SKU: &str = "H100_SXM";
/// `hardware.numGpusPerNode` when neither it nor `totalGpus` is set: an HGX/DGX node.
pub const DEFAULT_GPUS_PER_NODE: u32 = 8;
/// Dynamo's SLA defaults (its profiler's `ttft` 2000 ms and `itl` 30 ms), used when the
/// request names no SLA.
pub const DEFAULT_TTFT_MS: f64 = 2000.0;
pub const DEFAULT_ITL_MS: f64 = 30.0;

/// How much traffic the graph must carry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    /// Open loop: requests arrive at this rate (per second, Poisson) whatever the graph does.
    Rate(f64),
    /// Closed loop: this many requests in flight; each one that ends is replaced at once.
    Concurrency(u32),
}

impl fmt::Display for Load {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rate(r) => write!(f, "{r} req/s"),
            Self::Concurrency(c) => write!(f, "{c} in flight"),
        }
    }
}

/// The latency targets, ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sla {
    TtftItl { ttft_ms: f64, itl_ms: f64 },
    E2e { e2e_ms: f64 },
}

impl fmt::Display for Sla {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TtftItl { ttft_ms, itl_ms } => {
                write!(f, "TTFT <= {ttft_ms} ms, ITL <= {itl_ms} ms")
            }
            Self::E2e { e2e_ms } => write!(f, "end-to-end <= {e2e_ms} ms"),
        }
    }
}

/// A request with its defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub model: ModelArch,
    /// The model name clients send (`spec.model`).
    pub served_model: String,
    /// The engine the generated workers run.
    pub backend: BackendFramework,
    /// The GPU, as its datasheet has it.
    pub gpu: GpuSpec,
    /// The share of its memory engines use: vLLM's default, scaled down to `vramMb` when
    /// the request gives less memory than the datasheet (as the mock engine takes it).
    pub gpu_memory_utilization: Option<f64>,
    pub total_gpus: u32,
    pub gpus_per_node: u32,
    pub isl: u32,
    pub osl: u32,
    /// The traffic to carry; `None` when the request names none: the profiler then sizes
    /// one engine of each role for the most it serves within the SLA, and the planner (or
    /// the user) adds replicas from there (Dynamo's minimal DGDRs name no load).
    pub load: Option<Load>,
    pub sla: Sla,
    pub optimization: Option<OptimizationType>,
    /// Whether the generated graph gets a planner service.
    pub planner: bool,
    /// Whether the endpoint picker routes by KV overlap (its default), or round-robin
    /// (`features.kvRouter.enabled: false`).
    pub kv_router: bool,
    /// The hardware model's efficiency factors: the built-in ones, or a calibration's
    /// ([`crate::calibrate`]).
    pub efficiency: Efficiency,
    /// The headroom the SLA is checked with: the built-in factors' for a real engine,
    /// none for the mock engine (it runs the model) or a calibration's factors.
    pub uncertainty: Uncertainty,
}

impl Request {
    /// What the choice optimizes: the spec's `optimizationType`; without a load, every
    /// layout is one unit, and the one worth growing is the one that makes the most of
    /// each GPU (Dynamo's rule) unless latency is asked for.
    pub fn optimization(&self) -> Option<OptimizationType> {
        match self.load {
            Some(_) => self.optimization,
            None => self.optimization.or(Some(OptimizationType::Throughput)),
        }
    }
}

/// Resolves `spec`; `model_config` (a `config.json` the caller read) takes precedence over
/// the built-in catalog.
pub fn resolve(
    spec: &DynamoGraphDeploymentRequestSpec,
    model_config: Option<ModelArch>,
) -> Result<Request, ProfileError> {
    let model = match model_config {
        Some(m) => m,
        None => ModelArch::by_name(&spec.model).map_err(|_| ProfileError::UnknownModel {
            model: spec.model.clone(),
            known: catalog_names().join(", "),
        })?,
    };
    let features = spec.features.as_ref();
    let mocker = features
        .and_then(|f| f.mocker.as_ref())
        .and_then(|t| t.enabled)
        .unwrap_or(false);
    let backend = match spec.backend {
        _ if mocker => BackendFramework::Mocker,
        RequestBackend::Auto | RequestBackend::Vllm => BackendFramework::Vllm,
        RequestBackend::Sglang => BackendFramework::Sglang,
        RequestBackend::Trtllm => BackendFramework::Trtllm,
        RequestBackend::Mocker => BackendFramework::Mocker,
    };
    // Present and not `enabled: false`: `planner: {}` asks for one (the sample's spelling),
    // as does Dynamo's `planner: {enabled: true}`.
    let planner = features
        .and_then(|f| f.planner.as_ref())
        .is_some_and(|p| p.get("enabled").and_then(|e| e.as_bool()) != Some(false));
    let kv_router = features
        .and_then(|f| f.kv_router.as_ref())
        .and_then(|t| t.enabled)
        .unwrap_or(true);
    let (gpu, gpu_memory_utilization, total_gpus, gpus_per_node) = hardware(spec)?;
    // An absent block takes the field defaults of the type (Dynamo's ISL 4000, OSL 1000).
    let default: WorkloadSpec =
        serde_json::from_value(serde_json::json!({})).expect("every workload field has a default");
    let w = spec.workload.as_ref().unwrap_or(&default);
    let (isl, osl) = (
        positive_int("workload.isl", w.isl)?,
        positive_int("workload.osl", w.osl)?,
    );
    let tokens = u64::from(isl) + u64::from(osl);
    if tokens > model.max_context {
        return Err(ProfileError::OverContext {
            isl,
            osl,
            model: model.name.clone(),
            max_context: model.max_context,
        });
    }
    let load = match (w.request_rate, w.concurrency) {
        (Some(_), Some(_)) => return Err(ProfileError::ContradictoryWorkload),
        (Some(rate), None) => Some(Load::Rate(positive("workload.requestRate", rate)?)),
        (None, Some(c)) => {
            // A fractional concurrency (Dynamo's field is a float) rounds up: the graph
            // must carry at least that much.
            Some(Load::Concurrency(
                positive("workload.concurrency", c)?.ceil() as u32,
            ))
        }
        (None, None) => None,
    };
    let (sla, optimization) = sla(spec.sla.as_ref())?;
    Ok(Request {
        model,
        served_model: spec.model.clone(),
        backend,
        gpu,
        gpu_memory_utilization,
        total_gpus,
        gpus_per_node,
        isl,
        osl,
        load,
        sla,
        optimization,
        planner,
        kv_router,
        efficiency: Efficiency::default(),
        uncertainty: match backend {
            BackendFramework::Mocker => Uncertainty::NONE,
            _ => Uncertainty::UNCALIBRATED,
        },
    })
}

type Hardware = (GpuSpec, Option<f64>, u32, u32);

fn hardware(spec: &DynamoGraphDeploymentRequestSpec) -> Result<Hardware, ProfileError> {
    let hw = spec.hardware.clone().unwrap_or_default();
    let sku = hw.gpu_sku.as_deref().unwrap_or(DEFAULT_GPU_SKU);
    let gpu = GpuSpec::by_name(sku)?;
    let count = |field: &'static str, v: Option<i32>| match v {
        Some(n) if n >= 1 => Ok(Some(n as u32)),
        Some(n) => Err(ProfileError::NoGpus { field, value: n }),
        None => Ok(None),
    };
    let total = count("hardware.totalGpus", hw.total_gpus)?;
    let per_node = count("hardware.numGpusPerNode", hw.num_gpus_per_node)?;
    let (total, per_node) = match (total, per_node) {
        (Some(t), Some(n)) if n > t => {
            return Err(ProfileError::NodeOverTotal {
                per_node: n,
                total: t,
            });
        }
        (Some(t), Some(n)) => (t, n),
        (Some(t), None) => (t, t.min(DEFAULT_GPUS_PER_NODE)),
        (None, Some(n)) => (n, n),
        (None, None) => (DEFAULT_GPUS_PER_NODE, DEFAULT_GPUS_PER_NODE),
    };
    let share = match hw.vram_mb {
        Some(mb) => {
            let bytes = positive("hardware.vramMb", mb)? * (1u64 << 20) as f64;
            if bytes > gpu.memory_bytes as f64 {
                return Err(ProfileError::VramOverDatasheet {
                    vram_mb: mb,
                    gpu: gpu.name.clone(),
                    datasheet_mb: gpu.memory_bytes >> 20,
                });
            }
            Some(GPU_MEMORY_UTILIZATION * bytes / gpu.memory_bytes as f64)
        }
        None => None,
    };
    Ok((gpu, share, total, per_node))
}

fn sla(spec: Option<&SlaSpec>) -> Result<(Sla, Option<OptimizationType>), ProfileError> {
    let Some(s) = spec else {
        return Ok((
            Sla::TtftItl {
                ttft_ms: DEFAULT_TTFT_MS,
                itl_ms: DEFAULT_ITL_MS,
            },
            None,
        ));
    };
    let sla = match (s.ttft, s.itl, s.e2e_latency) {
        (Some(ttft), Some(itl), None) => Sla::TtftItl {
            ttft_ms: positive("sla.ttft", ttft)?,
            itl_ms: positive("sla.itl", itl)?,
        },
        (None, None, Some(e2e)) => Sla::E2e {
            e2e_ms: positive("sla.e2eLatency", e2e)?,
        },
        (None, None, None) => Sla::TtftItl {
            ttft_ms: DEFAULT_TTFT_MS,
            itl_ms: DEFAULT_ITL_MS,
        },
        _ => return Err(ProfileError::ContradictorySla),
    };
    Ok((sla, s.optimization_type))
}

fn positive(field: &'static str, value: f64) -> Result<f64, ProfileError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(ProfileError::NotPositive { field, value })
    }
}

fn positive_int(field: &'static str, value: i32) -> Result<u32, ProfileError> {
    positive(field, f64::from(value)).map(|_| value as u32)
}
