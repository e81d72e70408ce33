//! The local runner's admin API as its clients read it: `GET /graph` answers a
//! [`GraphStatus`]. The runner writes it; the planner's local target and
//! `dynamo profile --verify` read it back, so its one definition sits below all three.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What `GET /graph` answers; the planner's local target reads it back.
#[derive(Serialize, Deserialize)]
pub struct GraphStatus {
    pub name: String,
    pub model: String,
    /// The endpoint picker's process id, 0 while it restarts.
    pub epp_pid: u32,
    /// Each worker service's role (`Role::as_str`), also for a service scaled to 0.
    pub roles: BTreeMap<String, String>,
    pub services: BTreeMap<String, Vec<ReplicaStatus>>,
    /// The Prometheus the planner reads, for a graph with a planner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<ProcessStatus>,
    /// The graph's planner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planner: Option<PlannerStatus>,
}

#[derive(Serialize, Deserialize)]
pub struct ProcessStatus {
    /// Its base URL.
    pub url: String,
    /// Its process id, 0 while it restarts.
    pub pid: u32,
    pub restarts: u32,
}

#[derive(Serialize, Deserialize)]
pub struct PlannerStatus {
    pub service: String,
    /// Its `/metrics`.
    pub metrics: String,
    /// Its process id, 0 until it starts (once the graph is up and Prometheus ready) and
    /// while it restarts.
    pub pid: u32,
    pub restarts: u32,
}

#[derive(Serialize, Deserialize)]
pub struct ReplicaStatus {
    pub index: u32,
    pub role: String,
    pub engine: String,
    pub sidecar: String,
    pub kv_events: String,
    /// Where Prometheus scrapes each process of the replica.
    pub engine_metrics: String,
    pub sidecar_metrics: String,
    /// Whether the sidecar answered `/ready` at the last probe (and so takes traffic).
    pub ready: bool,
    pub engine_pid: u32,
    pub sidecar_pid: u32,
    pub restarts: u32,
}
