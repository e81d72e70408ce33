//! `dynamo-sidecar`: the per-pod data plane beside an engine. See `docs/sidecar.md`.

use std::process::ExitCode;

use clap::Parser;
use dynamo_server::{exit_code, init_logging, shutdown_signal};
use dynamo_sidecar::{Config, Sidecar};

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    init_logging(&config.log);
    exit_code(&config.log, serve(&config).await)
}

async fn serve(config: &Config) -> anyhow::Result<()> {
    // Block payloads pass through every sidecar that moves KV (its tiers, and the leases
    // of disaggregated serving); one that moves none never allocates blocks to keep.
    dynamo_sidecar::keep_freed_blocks();
    let sidecar = Sidecar::start(config).await?;
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
