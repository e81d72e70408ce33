//! `dynamo-e2e`: measures serving graphs from the outside and compares router modes.
//!
//! - [`workload`]: what to send, as token ids: shared-prefix synthetic, Mooncake trace,
//!   multi-turn conversations;
//! - [`arrivals`]: when to send it: Poisson or fixed rate, trace time, fixed concurrency;
//! - [`client`]: one streamed OpenAI request, timed chunk by chunk;
//! - [`bench`]: the load generator over HTTP;
//! - [`replay`]: the same workload through simulated mock engines and the router's real
//!   scheduler, in simulated time;
//! - [`disagg`]: the replay over an aggregated or a disaggregated (prefill + decode
//!   engines, KV moving over a link) graph;
//! - [`planner_replay`]: the planner in the loop of a simulated graph under a load
//!   that steps up and down, against static replica counts;
//! - [`launch`]: starting and stopping a graph per router mode for live comparisons;
//! - [`overhead`]: CPU per request of the picker, a sidecar and a mock engine, live;
//! - [`report`]: the figures of a run, JSON and Markdown tables, ratios to round-robin;
//! - [`cli`]: the `dynamo-e2e` command line.
//!
//! See `docs/performance.md`.

pub mod arrivals;
pub mod bench;
pub mod cli;
pub mod client;
pub mod disagg;
pub mod graph_watch;
pub mod launch;
pub mod overhead;
pub mod planner_replay;
pub mod replay;
pub mod report;
pub mod workload;
