//! `dynamo-mocker`: a CPU-only engine that serves vLLM's HTTP API, metrics and KV
//! events with a real KV block pool and modelled timing.

use std::process::ExitCode;

use clap::Parser;
use dynamo_mocker::Args;
use dynamo_mocker::server::{ServerConfig, start};
use dynamo_server::{exit_code, init_logging, shutdown_signal};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(&args.log);
    let log = args.log.clone();
    exit_code(&log, serve(args).await)
}

async fn serve(args: Args) -> anyhow::Result<()> {
    // `--planner-profile-out`: measure, write, and exit without serving.
    if args.write_planner_profile()? {
        return Ok(());
    }
    let config = ServerConfig::from_args(args).await?;
    let server = start(config, shutdown_signal()).await?;
    tracing::info!(
        model = %server.model_name,
        http = %server.http_addr,
        kv_events = server.kv_events_endpoint.as_deref().unwrap_or("off"),
        "dynamo-mocker serving"
    );
    server.wait().await
}
