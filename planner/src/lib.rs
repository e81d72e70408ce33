//! The SLA planner's core (`DESIGN.md`, "Planner"): what it predicts and what it decides,
//! as pure functions over numbers, so every rule is tested without Prometheus or a
//! cluster. Reading Prometheus and writing replicas live in the planner service.
//!
//! - [`predict`]: next-interval load predictors (constant, moving average, Kalman,
//!   ARIMA-style);
//! - [`profile`]: an engine's measured performance (prefill throughput against ISL and
//!   TTFT, decode throughput against context and ITL) and its interpolation;
//! - [`decide`]: replicas from predicted load (throughput mode) or from per-engine
//!   queues and KV usage (load mode), within a GPU budget, with the safeguards;
//! - `knobs` (feature `cli`): the headroom settings as flags, one struct for the planner
//!   service and the replay.

pub mod decide;
#[cfg(feature = "cli")]
pub mod knobs;
pub mod predict;
pub mod profile;
