//! The mock engine's command line: the binary's flags, turned into a [`ServerConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use dynamo_server::ServerLimits;

use super::ServerConfig;
use crate::{EngineConfig, TimingModel, TimingTable};

/// Flags follow vLLM's names where vLLM has the knob.
#[derive(Parser, Debug)]
#[command(name = "dynamo-mocker", version, about)]
pub struct Args {
    /// Hugging Face-style model directory (tokenizer.json, tokenizer_config.json, config.json).
    #[arg(long, env = "DYNAMO_MODEL_PATH")]
    pub model_path: PathBuf,
    /// Served model name [default: the directory's name].
    #[arg(long, env = "DYNAMO_MODEL_NAME")]
    pub model_name: Option<String>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    #[arg(long, default_value_t = 16384)]
    pub num_gpu_blocks: usize,
    #[arg(long, default_value_t = 64)]
    pub block_size: usize,
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Run this many times faster than the modelled GPU.
    #[arg(long, default_value_t = 1.0)]
    pub speedup_ratio: f64,
    /// ZMQ PUB endpoint for KV events; "none" disables them.
    #[arg(long, default_value = "tcp://127.0.0.1:5557")]
    pub kv_events_endpoint: String,
    /// JSON timing table replacing the built-in polynomials (see docs/mocker.md).
    #[arg(long)]
    pub timing_table: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    #[command(flatten)]
    pub server: ServerLimits,
}

impl Args {
    /// The server configuration these flags ask for (reads the timing table, resolves
    /// the host).
    pub async fn into_config(self) -> anyhow::Result<ServerConfig> {
        let timing = match &self.timing_table {
            Some(path) => {
                TimingModel::Table(TimingTable::from_json(&std::fs::read_to_string(path)?)?)
            }
            None => TimingModel::Polynomial,
        };
        let listen: SocketAddr = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await?
            .next()
            .ok_or_else(|| anyhow::anyhow!("cannot resolve {}", self.host))?;
        Ok(ServerConfig {
            model_path: self.model_path,
            model_name: self.model_name,
            listen,
            kv_events_endpoint: (self.kv_events_endpoint != "none")
                .then_some(self.kv_events_endpoint),
            engine: EngineConfig {
                num_gpu_blocks: self.num_gpu_blocks,
                block_size: self.block_size,
                max_num_seqs: self.max_num_seqs,
                max_num_batched_tokens: self.max_num_batched_tokens,
                speedup_ratio: self.speedup_ratio,
                seed: self.seed,
                enable_prefix_caching: !self.no_enable_prefix_caching,
                timing,
                ..EngineConfig::default()
            },
            server: self.server,
        })
    }
}
