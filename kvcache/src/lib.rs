//! KV cache core shared by the endpoint picker, the sidecar and the mock engine.
//!
//! No I/O lives here: only the contracts and data structures every part must agree on
//! (`DESIGN.md`, "Block hashing", "Sidecar -> EPP: KV event stream", "Scheduling (EPP)").
//!
//! - [`hash`]: block identity (chained XXH3 sequence hashes);
//! - [`events`]: KV events as the router sees them, and gap detection on a pod's stream;
//! - [`index`]: exact index of which pod holds which block, fed by events;
//! - [`approx`]: approximate index learnt from the router's own decisions, with a TTL;
//! - [`overlap`]: the shared answer of both indexes, per pod and tier;
//! - [`load`]: prefill/decode blocks in flight per pod, and saturation;
//! - [`scheduler`]: the pure cost function and pick;
//! - [`queue`]: where requests wait while every pod is saturated;
//! - [`routing`]: the routing step the picker, the replay and the benchmarks share;
//! - [`vllm_events`]: vLLM's ZMQ KV event wire format as bytes, shared by the sidecar
//!   (decoding) and the mock engine (encoding).

pub mod approx;
pub mod events;
mod fast_map;
pub mod hash;
pub mod index;
#[cfg(feature = "cli")]
mod knobs;
pub mod load;
pub mod overlap;
pub mod queue;
pub mod routing;
pub mod scheduler;
pub mod vllm_events;
pub mod worker;

pub use approx::{ApproxConfig, ApproxIndex};
pub use events::{
    Continuity, KvEvent, KvEventEnvelope, RemovedBlock, StoredBlock, StreamCursor, Tier,
    UnknownTier,
};
pub use hash::{BlockHasher, LocalHash, SeqHash};
pub use index::{IndexError, KvIndex};
#[cfg(feature = "cli")]
pub use knobs::RouterKnobs;
pub use load::{EngineMetrics, LoadError, LoadTracker, RequestId, SaturationThreshold, WorkerLoad};
pub use overlap::{OverlapScores, TierCounts, TierCredits};
pub use queue::{
    QueueFull, QueuePolicy, QueuedRequest, Ticket, UnknownQueuePolicy, WaitingQueue, WorkModel,
};
pub use routing::{PickError, Route, RoutingCore, Side};
pub use scheduler::{
    DEFAULT_PREFILL_LOAD_SCALE, Decision, RouterMode, ScheduleError, Scheduler, SchedulerConfig,
    UnknownRouterMode, pick_by_cost,
};
pub use worker::WorkerId;
