//! Hardware performance model shared by the mock engine, the DGDR profiler and the
//! planner: for a GPU SKU and a model architecture under tensor parallelism, how long a
//! prefill, a decode step and a KV transfer take, and what fits in GPU memory.
//!
//! - [`gpu`]: the GPU catalog (datasheet figures, cited);
//! - [`model`]: architectures from `config.json` or the built-in catalog; parameter,
//!   weight and KV bytes;
//! - [`estimate`]: step and transfer times, memory fit, saturated throughput;
//! - [`calibration`]: the calibration file of measured TTFT/ITL points, decoded;
//! - [`uncertainty`]: how far real engines' latencies have been above the predictions.
//!
//! Equations, efficiency factors and the comparison with published benchmarks:
//! `docs/perfmodel.md`. No I/O here: callers read `config.json` and calibration files
//! themselves.

pub mod calibration;
pub mod dtype;
pub mod estimate;
pub mod gpu;
pub mod model;
pub mod uncertainty;

pub use dtype::{Dtype, UnknownDtype};
pub use estimate::{
    Capacity, DoesNotFit, Efficiency, Estimator, InvalidParallelism, Link, Roofline, StepLoad,
    StepTime, Throughput, attention_pairs,
};
pub use gpu::{GpuSku, GpuSpec, UnknownGpu};
pub use model::{ConfigError, Mla, ModelArch, Moe, ParamCounts, UnknownModel, catalog_names};
pub use uncertainty::Uncertainty;
