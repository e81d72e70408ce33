//! Disaggregated serving in the sidecar (`DESIGN.md`, "Disaggregated request"):
//!
//! - [`hop`]: the prefill hop, a tower layer in front of the proxy;
//! - [`peers`]: the prefill pods a hop may go to (`--prefill-peers`);
//! - [`transfer`]: fetching a prompt's blocks from the prefill pod's sidecar;
//! - [`metrics`]: `dynamo_sidecar_prefill_*` and `dynamo_sidecar_kv_transfer_*`.
//!
//! The leases both ends hold blocks under are in [`crate::blocks::lease`].

pub mod hop;
pub mod metrics;
pub mod peers;
pub mod transfer;
