//! `dynamo-epp`: the endpoint picker binary (see `docs/epp.md`).

use clap::Parser;
use dynamo_epp::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config = Args::parse().into_config()?;
    let epp = dynamo_epp::start(config).await?;
    tracing::info!(
        model = %epp.model_name,
        http = %epp.http_addr,
        ext_proc = %epp.ext_proc_addr,
        metrics = ?epp.metrics_addr,
        mode = %epp.router.config().mode,
        "dynamo-epp serving"
    );
    let stop = epp.stop_token();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        stop.cancel();
    });
    epp.wait().await
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
