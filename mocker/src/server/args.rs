//! The mock engine's command line: the binary's flags, turned into a [`ServerConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use dynamo_server::ServerLimits;

use super::ServerConfig;
use crate::kv_blocks::{
    DEFAULT_DISK_BANDWIDTH_GBPS, DEFAULT_HOST_BANDWIDTH_GBPS, DEFAULT_LINK_BANDWIDTH_GBPS,
    DEFAULT_OBJECT_BANDWIDTH_GBPS, DEFAULT_TIMEOUT_MS,
};
use crate::profile::{ProfileSweep, planner_profile};
use crate::{EngineConfig, KvBlocksConfig, OffloadMode, TimingModel, TimingTable};

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
    /// The sidecar's KV block API (its gRPC address, e.g. http://127.0.0.1:9100): blocks
    /// go to its tiers and new requests onboard from them. Unset: blocks stay on the GPU.
    #[arg(long, env = "DYNAMO_MOCKER_KV_BLOCKS_URL")]
    pub kv_blocks_url: Option<String>,
    /// Which blocks go to the sidecar: those the GPU pool evicts, all as they fill, or
    /// none (no tiers: only the leases of disaggregated serving).
    #[arg(long, value_enum, default_value_t = OffloadMode::Evicted)]
    pub kv_offload: OffloadMode,
    /// Payload bytes actually moved per block, as a fraction of the model's KV bytes
    /// (from config.json; at least 1 byte). Modelled transfer times use the full size.
    #[arg(long, default_value_t = 1.0)]
    pub kv_bytes_scale: f64,
    /// Onboarding bandwidth from the sidecar's host memory (G2), GB/s.
    #[arg(long, default_value_t = DEFAULT_HOST_BANDWIDTH_GBPS)]
    pub kv_host_bandwidth_gbps: f64,
    /// Onboarding bandwidth from the sidecar's disk (G3), GB/s.
    #[arg(long, default_value_t = DEFAULT_DISK_BANDWIDTH_GBPS)]
    pub kv_disk_bandwidth_gbps: f64,
    /// Onboarding bandwidth from the sidecar's object store (G4), GB/s.
    #[arg(long, default_value_t = DEFAULT_OBJECT_BANDWIDTH_GBPS)]
    pub kv_object_bandwidth_gbps: f64,
    /// Bandwidth of the link a disaggregated prefill's KV crosses to this decode, GB/s:
    /// InfiniBand 400 Gb/s across nodes; 900 for NVLink within one.
    #[arg(long, default_value_t = DEFAULT_LINK_BANDWIDTH_GBPS)]
    pub kv_link_bandwidth_gbps: f64,
    /// Limit of one lookup + onboard (and one offload, lend or lease fetch); past it the
    /// request recomputes.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_MS)]
    pub kv_blocks_timeout_ms: u64,
    /// This engine's id in the `kv_transfer_params` it answers a prefill with (vLLM's
    /// `kv_transfer_config.engine_id`) [default: a random uuid made at start].
    #[arg(long, env = "DYNAMO_MOCKER_ENGINE_ID")]
    pub engine_id: Option<String>,
    /// Measure the planner's performance profile of the engine these flags configure
    /// (prefill TTFT and decode ITL on the simulated clock; `dynamo_planner::profile`'s
    /// JSON), write it to this file and exit without serving.
    #[arg(long)]
    pub planner_profile_out: Option<PathBuf>,
    #[command(flatten)]
    pub server: ServerLimits,
}

impl Args {
    /// The engine configuration these flags ask for (reads the timing table). Serving
    /// adds the model's vocabulary size and name, which do not change timing.
    pub fn engine_config(&self) -> anyhow::Result<EngineConfig> {
        let timing = match &self.timing_table {
            Some(path) => {
                TimingModel::Table(TimingTable::from_json(&std::fs::read_to_string(path)?)?)
            }
            None => TimingModel::Polynomial,
        };
        Ok(EngineConfig {
            num_gpu_blocks: self.num_gpu_blocks,
            block_size: self.block_size,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            speedup_ratio: self.speedup_ratio,
            seed: self.seed,
            enable_prefix_caching: !self.no_enable_prefix_caching,
            timing,
            kv_blocks: self.kv_blocks_url.clone().map(|url| KvBlocksConfig {
                url,
                offload: self.kv_offload,
                bytes_scale: self.kv_bytes_scale,
                host_bandwidth_gbps: self.kv_host_bandwidth_gbps,
                disk_bandwidth_gbps: self.kv_disk_bandwidth_gbps,
                object_bandwidth_gbps: self.kv_object_bandwidth_gbps,
                link_bandwidth_gbps: self.kv_link_bandwidth_gbps,
                timeout_ms: self.kv_blocks_timeout_ms,
                engine_id: self.engine_id.clone(),
            }),
            ..EngineConfig::default()
        })
    }

    /// With `--planner-profile-out PATH`: measures the planner's profile of the engine
    /// these flags configure (the serving engine, on the simulated clock, over
    /// [`ProfileSweep::default`]), writes it to PATH and returns true: the caller exits
    /// without serving. Without the flag, false.
    pub fn write_planner_profile(&self) -> anyhow::Result<bool> {
        let Some(path) = &self.planner_profile_out else {
            return Ok(false);
        };
        let profile = planner_profile(&self.engine_config()?, &ProfileSweep::default())?;
        let text = serde_json::to_string_pretty(&profile)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("writing the planner profile to {}", path.display()))?;
        Ok(true)
    }

    /// The server configuration these flags ask for (reads the timing table, resolves
    /// the host).
    pub async fn into_config(self) -> anyhow::Result<ServerConfig> {
        let engine = self.engine_config()?;
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
            engine,
            server: self.server,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_planner::profile::Profile;

    async fn config(extra: &[&str]) -> ServerConfig {
        let argv = ["dynamo-mocker", "--model-path", "/m"].iter().chain(extra);
        Args::try_parse_from(argv)
            .unwrap()
            .into_config()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_block_api_is_on_with_a_url_and_takes_its_defaults() {
        assert_eq!(config(&[]).await.engine.kv_blocks, None);
        let on = config(&[
            "--kv-blocks-url",
            "http://127.0.0.1:9100",
            "--kv-offload",
            "all",
            "--kv-bytes-scale",
            "0.01",
        ])
        .await;
        assert_eq!(
            on.engine.kv_blocks,
            Some(KvBlocksConfig {
                url: "http://127.0.0.1:9100".into(),
                offload: OffloadMode::All,
                bytes_scale: 0.01,
                ..KvBlocksConfig::default()
            })
        );
    }

    #[tokio::test]
    async fn a_disaggregated_engine_takes_no_tiers_its_link_and_its_id() {
        let kv = config(&[
            "--kv-blocks-url",
            "http://127.0.0.1:9100",
            "--kv-offload",
            "none",
            "--kv-link-bandwidth-gbps",
            "900",
            "--engine-id",
            "prefill-0",
        ])
        .await
        .engine
        .kv_blocks
        .unwrap();
        assert_eq!(kv.offload, OffloadMode::None);
        assert!(!kv.uses_tiers());
        assert_eq!(kv.link_bandwidth_gbps, 900.0);
        assert_eq!(kv.engine_id.as_deref(), Some("prefill-0"));
        let default = KvBlocksConfig::default();
        assert_eq!(default.link_bandwidth_gbps, 50.0, "InfiniBand, 400 Gb/s");
        assert!(default.uses_tiers() && default.engine_id.is_none());
    }

    #[test]
    fn the_planner_profile_is_written_for_the_engine_the_flags_configure() {
        let path =
            std::env::temp_dir().join(format!("dynamo-mocker-profile-{}.json", std::process::id()));
        let argv = |extra: &[&str]| {
            let base = ["dynamo-mocker", "--model-path", "/m"];
            Args::try_parse_from(base.iter().chain(extra)).unwrap()
        };
        assert!(!argv(&[]).write_planner_profile().unwrap());
        let out = path.to_str().unwrap();
        // A small engine, so the default sweep stays quick: 8k tokens of KV.
        let small = [
            "--num-gpu-blocks",
            "512",
            "--block-size",
            "16",
            "--max-num-seqs",
            "32",
        ];
        let mut args = small.to_vec();
        args.extend(["--planner-profile-out", out]);
        let slow = argv(&args);
        assert_eq!(slow.engine_config().unwrap().num_gpu_blocks, 512);
        assert!(slow.write_planner_profile().unwrap());
        let slow = Profile::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
        args.extend(["--speedup-ratio", "4"]);
        assert!(argv(&args).write_planner_profile().unwrap());
        let fast = Profile::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        // ISLs up to the pool's 8,192 tokens; concurrency capped at --max-num-seqs.
        assert_eq!(slow.prefill_points().last().unwrap().isl, 8192.0);
        assert!(slow.decode_points().iter().all(|d| d.concurrency <= 32.0));
        let ratio = fast.prefill_points()[0].throughput_per_gpu
            / slow.prefill_points()[0].throughput_per_gpu;
        assert!((ratio - 4.0).abs() < 1e-9, "{ratio}");
    }
}
