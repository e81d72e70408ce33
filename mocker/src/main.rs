//! `dynamo-mocker`: a CPU-only engine that serves vLLM's HTTP API, metrics and KV
//! events with a real KV block pool and modelled timing.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use dynamo_mocker::server::{ServerConfig, start};
use dynamo_mocker::{EngineConfig, TimingModel, TimingTable};

/// Flags follow vLLM's names where vLLM has the knob.
#[derive(Parser, Debug)]
#[command(name = "dynamo-mocker", version, about)]
struct Args {
    /// Hugging Face-style model directory (tokenizer.json, tokenizer_config.json, config.json).
    #[arg(long, env = "DYNAMO_MODEL_PATH")]
    model_path: PathBuf,
    /// Served model name [default: the directory's name].
    #[arg(long, env = "DYNAMO_MODEL_NAME")]
    model_name: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    #[arg(long, default_value_t = 16384)]
    num_gpu_blocks: usize,
    #[arg(long, default_value_t = 64)]
    block_size: usize,
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    #[arg(long, default_value_t = 8192)]
    max_num_batched_tokens: usize,
    /// Run this many times faster than the modelled GPU.
    #[arg(long, default_value_t = 1.0)]
    speedup_ratio: f64,
    /// ZMQ PUB endpoint for KV events; "none" disables them.
    #[arg(long, default_value = "tcp://127.0.0.1:5557")]
    kv_events_endpoint: String,
    /// JSON timing table replacing the built-in polynomials (see docs/mocker.md).
    #[arg(long)]
    timing_table: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    no_enable_prefix_caching: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let timing = match &args.timing_table {
        Some(path) => TimingModel::Table(TimingTable::from_json(&std::fs::read_to_string(path)?)?),
        None => TimingModel::Polynomial,
    };
    let listen: SocketAddr = tokio::net::lookup_host((args.host.as_str(), args.port))
        .await?
        .next()
        .ok_or_else(|| anyhow::anyhow!("cannot resolve {}", args.host))?;
    let config = ServerConfig {
        model_path: args.model_path,
        model_name: args.model_name,
        listen,
        kv_events_endpoint: (args.kv_events_endpoint != "none").then_some(args.kv_events_endpoint),
        engine: EngineConfig {
            num_gpu_blocks: args.num_gpu_blocks,
            block_size: args.block_size,
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: args.max_num_batched_tokens,
            speedup_ratio: args.speedup_ratio,
            seed: args.seed,
            enable_prefix_caching: !args.no_enable_prefix_caching,
            timing,
            ..EngineConfig::default()
        },
    };
    let server = start(config, shutdown_signal()).await?;
    tracing::info!(
        model = %server.model_name,
        http = %server.http_addr,
        kv_events = server.kv_events_endpoint.as_deref().unwrap_or("off"),
        "dynamo-mocker serving"
    );
    server.wait().await
}

/// Ctrl-C or SIGTERM (what Kubernetes sends) starts a graceful shutdown.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}
