//! `dynamo-loadgen`: the load generator for OpenAI endpoints, shared by the benchmarks
//! (`dynamo-e2e`) and `dynamo profile --verify`.
//!
//! - [`workload`]: what to send, as token ids: shared-prefix synthetic, Mooncake trace,
//!   multi-turn conversations;
//! - [`arrivals`]: when to send it: Poisson or fixed rate, trace time, fixed concurrency;
//! - [`client`]: one streamed OpenAI request, timed chunk by chunk;
//! - [`bench`](mod@bench): the load generator over HTTP;
//! - [`launch`]: starting and stopping a serving graph's processes;
//! - [`report`]: the figures of a run, live or replayed, JSON and Markdown tables, ratios
//!   to a baseline.
//!
//! See `docs/performance.md`.

pub mod arrivals;
pub mod bench;
pub mod client;
pub mod launch;
pub mod report;
pub mod workload;
