//! Library side of the `dynamo` binary: the pure reconcile function with gang placement,
//! the DGDR lifecycle, the controllers that apply them to a cluster, the local runner and the planner service.

pub mod controller;
pub mod dgdr;
pub mod local;
pub mod planner;
pub mod reconcile;
pub mod wiring;

/// Returns on Ctrl-C or SIGTERM (what Kubernetes sends).
pub(crate) async fn shutdown_signal() {
    dynamo_server::shutdown_signal().await;
    tracing::info!("shutting down");
}
