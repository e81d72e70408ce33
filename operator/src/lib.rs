//! Library side of the `dynamo` binary: the pure reconcile function with gang placement,
//! the controllers that apply it to a cluster, and the local runner.

pub mod controller;
pub mod local;
pub mod reconcile;

/// Returns on Ctrl-C or SIGTERM (what Kubernetes sends).
pub(crate) async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
