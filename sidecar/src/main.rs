//! `dynamo-sidecar`: the per-pod data plane beside an engine. See `docs/sidecar.md`.

use clap::Parser;
use dynamo_sidecar::{Config, Sidecar};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config = Config::parse();
    let sidecar = Sidecar::start(&config).await?;
    tracing::info!(
        proxy = %sidecar.proxy_addr,
        grpc = %sidecar.grpc_addr,
        metrics = %sidecar.metrics_addr,
        engine = %config.engine_url,
        kv_events = config.kv_events_endpoint().unwrap_or("off"),
        "dynamo-sidecar serving"
    );
    shutdown_signal().await;
    tracing::info!(grace = ?config.shutdown_grace, "shutting down");
    sidecar.shutdown(config.shutdown_grace).await;
    Ok(())
}

/// Ctrl-C or SIGTERM (what Kubernetes sends).
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
