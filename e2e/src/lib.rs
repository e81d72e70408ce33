//! `dynamo-e2e`: measures serving graphs from the outside and compares router modes,
//! over the load generator of `dynamo-loadgen` (workloads, arrivals, the client, the
//! report).
//!
//! - [`replay`]: a workload through simulated mock engines and the router's real
//!   scheduler, in simulated time;
//! - [`disagg`]: the replay over an aggregated or a disaggregated (prefill + decode
//!   engines, KV moving over a link) graph;
//! - [`planner_replay`]: the planner in the loop of a simulated graph under a load
//!   that steps up and down, against static replica counts;
//! - [`transfers`]: a live disaggregated run's KV transfers and prefill hops, from the
//!   picker's metrics;
//! - [`graph_watch`]: a live graph's replicas over a run, from its runner's admin API;
//! - [`overhead`]: CPU per request of the picker, a sidecar and a mock engine, live;
//! - [`cli`]: the `dynamo-e2e` command line.
//!
//! See `docs/performance.md`.

pub mod cli;
pub mod disagg;
pub mod graph_watch;
pub mod overhead;
pub mod planner_replay;
pub mod replay;
pub mod transfers;
