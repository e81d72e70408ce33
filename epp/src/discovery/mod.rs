//! Where the pods come from: a fixed list, a JSON file the local runner rewrites, or the
//! Kubernetes pods of an InferencePool. Every source publishes the whole current set on
//! a `watch` channel; [`crate::pool`] turns changes into added and removed workers.

pub mod file;
pub mod kubernetes;

use std::net::SocketAddr;

use dynamo_names::Role;
use tokio::sync::watch;

use crate::config::DiscoveryConfig;

/// One pod as discovery sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointSpec {
    /// Inference address `ip:port` (the pod's sidecar, port 8000).
    pub address: SocketAddr,
    /// The pod's KV event stream, `http://ip:port`.
    pub kv_events: String,
    pub role: Role,
    /// The pod's model card URL when its source names one; else the picker derives it
    /// from `--model-card-port`.
    pub model_card: Option<String>,
}

impl EndpointSpec {
    /// A pod whose KV event stream is on `kv_events_port` of its inference IP.
    pub fn new(address: SocketAddr, kv_events_port: u16, role: Role) -> Self {
        Self {
            address,
            kv_events: kv_events_url(address, kv_events_port),
            role,
            model_card: None,
        }
    }
}

/// `http://ip:port` of the sidecar's gRPC server beside an inference address.
pub fn kv_events_url(address: SocketAddr, kv_events_port: u16) -> String {
    format!("http://{}", SocketAddr::new(address.ip(), kv_events_port))
}

/// The current set of pods, sorted by address; a source sends a new set on each change.
pub type EndpointSet = Vec<EndpointSpec>;

/// Sorts by address and keeps the first entry of each address.
pub fn normalize(mut set: EndpointSet) -> EndpointSet {
    set.sort();
    set.dedup_by_key(|e| e.address);
    set
}

/// Starts the configured source; the receiver always holds the latest set. Errors only
/// when a source cannot start (no Kubernetes client configuration).
pub async fn start(
    config: &DiscoveryConfig,
    kv_events_port: u16,
) -> anyhow::Result<watch::Receiver<EndpointSet>> {
    let (tx, rx) = watch::channel(EndpointSet::new());
    match config {
        DiscoveryConfig::Static(addresses) => {
            let set = addresses
                .iter()
                .map(|&a| EndpointSpec::new(a, kv_events_port, Role::Aggregated))
                .collect();
            tx.send_replace(normalize(set));
            // Receivers see a closed channel as "no more changes"; keep the sender alive.
            tokio::spawn(async move { tx.closed().await });
        }
        DiscoveryConfig::File { path, poll } => {
            tokio::spawn(file::watch(path.clone(), *poll, kv_events_port, tx));
        }
        DiscoveryConfig::Kubernetes(k8s) => {
            let client = ::kube::Client::try_default().await.map_err(|e| {
                anyhow::anyhow!("Kubernetes discovery needs a cluster configuration: {e}")
            })?;
            tokio::spawn(kubernetes::watch(client, k8s.clone(), kv_events_port, tx));
        }
    }
    Ok(rx)
}
