//! Engine core of the mock engine: a CPU-only stand-in for vLLM with a real KV block
//! pool (prefix caching, LRU eviction, KV events), vLLM's continuous-batching scheduler
//! (chunked prefill, preemption) and a timing model, on simulated or real time; and
//! [`args`], the engine's command line, which also configures it for whoever writes its
//! flags (the profiler, `dynamo profile --verify`).
//! No I/O here but the files the flags name: the HTTP server, the ZMQ socket and the
//! metrics endpoint sit on top, in `server` (feature `server`, on by default: the
//! `dynamo-mocker` binary). See `docs/mocker.md`.

pub mod args;
pub mod block_pool;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod engine;
pub mod kv_blocks;
pub mod onboard_cost;
pub mod profile;
pub mod replay;
pub mod scheduler;
#[cfg(feature = "server")]
pub mod server;
pub mod timing;
pub mod tokens;

pub use args::Args;
pub use block_pool::{BlockId, BlockPool, OffloadBlock, OutOfBlocks, PinCounters};
pub use clock::{Clock, RealClock, SimClock};
pub use cluster::{Driver, SimCluster, Stuck};
pub use config::{ConfigError, EngineConfig};
pub use engine::{Engine, EngineMetrics, StepOutcome};
pub use kv_blocks::{KvBlocksConfig, KvGeometry, OffloadMode};
pub use scheduler::{
    FinishReason, FinishedRequest, PromptKv, Rejected, Request, RequestId, SchedulerCounters,
    TokenOutput,
};
pub use timing::{StepWork, TimingModel, TimingTable};
