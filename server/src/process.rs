//! What every binary's `main` does around its servers.

/// Resolves on Ctrl-C or SIGTERM (what Kubernetes sends before it kills a container).
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// [`shutdown_signal`], then a log line saying so: what the operator, the planner and the
/// local runner wait on.
pub async fn logged_shutdown_signal() {
    shutdown_signal().await;
    tracing::info!("shutting down");
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
}
