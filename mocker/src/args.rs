//! The mock engine's command line: the binary's flags, turned into an [`EngineConfig`].
//! Outside `server`, so that whoever writes a mock engine's flags (the profiler,
//! `dynamo profile --verify`, tests) reads them with the engine's own parser without
//! linking the server.

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::{Parser, ValueEnum};
use dynamo_llm::parsers::ToolCallParser;
use dynamo_perfmodel::{Dtype, Estimator, GpuSpec, ModelArch};
use dynamo_server::{LogArgs, ServerLimits};

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
    #[command(flatten)]
    pub shape: EngineShapeArgs,
    /// Run this many times faster than the modelled GPU.
    #[arg(long, default_value_t = 1.0)]
    pub speedup_ratio: f64,
    /// ZMQ PUB endpoint for KV events; "none" disables them.
    #[arg(long, default_value = "tcp://127.0.0.1:5557")]
    pub kv_events_endpoint: String,
    #[command(flatten)]
    pub timing: TimingArgs,
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
    /// File of the graph's block API credential, which the sidecar requires when it was
    /// given one (its `--block-api-token-file`).
    // `dynamo_kvblocks::CREDENTIAL_FILE_ENV`, spelled out: the engine core builds
    // without the block API.
    #[arg(long, env = "DYNAMO_BLOCK_API_TOKEN_FILE")]
    pub kv_blocks_token_file: Option<PathBuf>,
    /// This engine's id in the `kv_transfer_params` it answers a prefill with (vLLM's
    /// `kv_transfer_config.engine_id`) [default: a random uuid made at start].
    #[arg(long, env = "DYNAMO_MOCKER_ENGINE_ID")]
    pub engine_id: Option<String>,
    /// Measure the planner's performance profile of the engine these flags configure
    /// (prefill TTFT and decode ITL on the simulated clock; `dynamo_planner::profile`'s
    /// JSON), write it to this file and exit without serving.
    #[arg(long)]
    pub planner_profile_out: Option<PathBuf>,
    /// Play a reasoning model: chat answers open with thinking closed by `</think>`
    /// (DeepSeek-R1's and Qwen3's), unless the request turns thinking off.
    #[arg(long, env = "DYNAMO_MOCKER_REASONING")]
    pub reasoning: bool,
    /// Play a tool-calling model of this family: a chat request offering `tools` is
    /// answered with a call in its format (vLLM's `--tool-call-parser` names: hermes,
    /// mistral, llama3_json, deepseek_v3, pythonic, phi4_mini_json).
    #[arg(long, env = "DYNAMO_MOCKER_TOOL_CALL_FORMAT", value_parser = tool_call_format)]
    pub tool_call_format: Option<ToolCallParser>,
    #[command(flatten)]
    pub server: ServerLimits,
    #[command(flatten)]
    pub log: LogArgs,
}

/// The engine's pool and batch limits, vLLM's flags: the mock engine's and the replays'
/// (`dynamo-e2e`), defaults [`EngineConfig::default`]'s.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineShapeArgs {
    /// KV blocks in the pool [default: 16384; with `--perf-model hardware`, what the
    /// GPUs' memory holds after the weights].
    #[arg(long)]
    pub num_gpu_blocks: Option<usize>,
    #[arg(long, default_value_t = EngineConfig::default().block_size)]
    pub block_size: usize,
    #[arg(long, default_value_t = EngineConfig::default().max_num_seqs)]
    pub max_num_seqs: usize,
    #[arg(long, default_value_t = EngineConfig::default().max_num_batched_tokens)]
    pub max_num_batched_tokens: usize,
}

impl EngineShapeArgs {
    /// `base` in this shape (its pool's size unless one is given).
    pub fn apply(&self, base: EngineConfig) -> EngineConfig {
        EngineConfig {
            num_gpu_blocks: self.num_gpu_blocks.unwrap_or(base.num_gpu_blocks),
            block_size: self.block_size,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            ..base
        }
    }
}

fn tool_call_format(name: &str) -> Result<ToolCallParser, String> {
    ToolCallParser::from_name(name).map_err(|e| e.to_string())
}

/// How long a step takes: the mock engine's flags, which the replays share.
#[derive(clap::Args, Clone, Debug)]
pub struct TimingArgs {
    /// JSON timing table replacing the built-in polynomials (see docs/mocker.md).
    #[arg(long)]
    pub timing_table: Option<PathBuf>,
    /// Step times: Dynamo's polynomial, or the performance model of `--gpu` running the
    /// model (the mock engine's: `--model-path`'s config.json, else the catalog's
    /// `--model-name`).
    #[arg(long, value_enum, default_value_t = PerfModel::Polynomial)]
    pub perf_model: PerfModel,
    /// GPU SKU of `--perf-model hardware`: H100_SXM, H200_SXM, B200_SXM, A100_SXM, L40S.
    #[arg(long)]
    pub gpu: Option<String>,
    /// GPUs one engine spans: the hardware model splits the model across them, and the
    /// planner profile divides throughputs by them.
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: u64,
    /// Weights' dtype (`--perf-model hardware`): auto (config.json's), bfloat16, float16,
    /// float32.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// `fp8`: FP8 weights (`--perf-model hardware`).
    #[arg(long)]
    pub quantization: Option<String>,
    /// KV cache dtype (`--perf-model hardware`): auto (the model's), fp8, bfloat16, ...
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: String,
    /// Share of GPU memory for weights, activations and KV (`--perf-model hardware`).
    #[arg(long, default_value_t = dynamo_perfmodel::estimate::GPU_MEMORY_UTILIZATION)]
    pub gpu_memory_utilization: f64,
}

impl TimingArgs {
    /// `config` with these step times. `model` gives the architecture the hardware model
    /// runs (asked only for it); `num_gpu_blocks`, when set, overrides the blocks its
    /// memory holds.
    pub fn apply(
        &self,
        config: EngineConfig,
        model: impl FnOnce() -> anyhow::Result<ModelArch>,
        num_gpu_blocks: Option<usize>,
    ) -> anyhow::Result<EngineConfig> {
        anyhow::ensure!(
            !(self.perf_model == PerfModel::Hardware && self.timing_table.is_some()),
            "--timing-table and --perf-model hardware both set the step times"
        );
        if let Some(path) = &self.timing_table {
            let json = std::fs::read_to_string(path)
                .with_context(|| format!("--timing-table {}", path.display()))?;
            return Ok(EngineConfig {
                timing: TimingModel::Table(TimingTable::from_json(&json)?),
                ..config
            });
        }
        if self.perf_model == PerfModel::Polynomial {
            return Ok(config);
        }
        let e = self.estimator(model()?)?;
        let (gpu, model, tp) = (e.gpu.name.clone(), e.model.name.clone(), e.tp);
        let (config, capacity) = config.on_hardware(e, num_gpu_blocks)?;
        tracing::info!(
            %gpu,
            %model,
            tp,
            weights_per_gpu = capacity.weight_bytes,
            kv_tokens = capacity.kv_tokens,
            "hardware performance model"
        );
        Ok(config)
    }

    /// The performance model these flags describe for `model`.
    pub fn estimator(&self, model: ModelArch) -> anyhow::Result<Estimator> {
        let gpu = self.gpu.as_deref().ok_or_else(|| {
            anyhow!(
                "--perf-model hardware needs --gpu (H100_SXM, H200_SXM, B200_SXM, A100_SXM, L40S)"
            )
        })?;
        let mut e = Estimator::new(GpuSpec::by_name(gpu)?, model, self.tensor_parallel_size)?;
        if self.dtype != "auto" {
            e.weight_dtype = self.dtype.parse().context("--dtype")?;
        }
        match self.quantization.as_deref() {
            None => {}
            Some(q) if q.eq_ignore_ascii_case("fp8") => e.weight_dtype = Dtype::Fp8,
            Some(q) => anyhow::bail!("--quantization {q}: only fp8 is modelled"),
        }
        if self.kv_cache_dtype != "auto" {
            e.kv_dtype = self.kv_cache_dtype.parse().context("--kv-cache-dtype")?;
        }
        anyhow::ensure!(
            self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0,
            "--gpu-memory-utilization must be in (0, 1]"
        );
        e.gpu_memory_utilization = self.gpu_memory_utilization;
        Ok(e)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PerfModel {
    /// Dynamo mocker's polynomials of an 8B model on an H100.
    Polynomial,
    /// `dynamo-perfmodel`: a GPU SKU, a model architecture, tensor parallelism.
    Hardware,
}

impl Args {
    /// The engine configuration these flags ask for (reads the timing table, or the
    /// model's config.json for the hardware model). Serving adds the model's vocabulary
    /// size and name, which do not change timing.
    pub fn engine_config(&self) -> anyhow::Result<EngineConfig> {
        let config = EngineConfig {
            speedup_ratio: self.speedup_ratio,
            seed: self.seed,
            enable_prefix_caching: !self.no_enable_prefix_caching,
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
                token_file: self.kv_blocks_token_file.clone(),
            }),
            ..self.shape.apply(EngineConfig::default())
        };
        self.timing
            .apply(config, || self.model_arch(), self.shape.num_gpu_blocks)
    }

    /// The architecture in the model directory's config.json, else the catalog's of the
    /// served name (`--model-name`, else the directory's name).
    fn model_arch(&self) -> anyhow::Result<ModelArch> {
        let name = self.model_name.clone().unwrap_or_else(|| {
            let dir = self.model_path.file_name().unwrap_or_default();
            dir.to_string_lossy().into_owned()
        });
        let path = self.model_path.join(dynamo_llm::model_dir::CONFIG_FILE);
        let from_config = std::fs::read_to_string(&path)
            .map_err(anyhow::Error::from)
            .and_then(|json| Ok(ModelArch::from_config_json(&name, &json)?));
        match from_config {
            Ok(model) => Ok(model),
            Err(why) => ModelArch::by_name(&name).map_err(|unknown| {
                anyhow!(
                    "no model architecture: {}: {why}; and {unknown}",
                    path.display()
                )
            }),
        }
    }

    /// With `--planner-profile-out PATH`: measures the planner's profile of the engine
    /// these flags configure (the serving engine, on the simulated clock, over
    /// [`ProfileSweep::default`] with `--tensor-parallel-size` GPUs per engine), writes it
    /// to PATH and returns true: the caller exits without serving. Without the flag,
    /// false.
    pub fn write_planner_profile(&self) -> anyhow::Result<bool> {
        let Some(path) = &self.planner_profile_out else {
            return Ok(false);
        };
        // Per-GPU throughputs: the engine stands for all the GPUs it spans.
        let gpus_per_engine = u32::try_from(self.timing.tensor_parallel_size)?;
        let sweep = ProfileSweep {
            gpus_per_engine,
            ..ProfileSweep::default()
        };
        let profile = planner_profile(&self.engine_config()?, &sweep)?;
        let text = serde_json::to_string_pretty(&profile)?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("writing the planner profile to {}", path.display()))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_planner::profile::Profile;

    fn config(extra: &[&str]) -> EngineConfig {
        let argv = ["dynamo-mocker", "--model-path", "/m"].iter().chain(extra);
        Args::try_parse_from(argv).unwrap().engine_config().unwrap()
    }

    #[cfg(feature = "server")]
    #[test]
    fn the_credential_file_is_the_block_apis_variable() {
        let flag = <Args as clap::CommandFactory>::command()
            .get_arguments()
            .find(|a| a.get_id() == "kv_blocks_token_file")
            .and_then(|a| a.get_env().map(ToOwned::to_owned));
        assert_eq!(flag.unwrap(), dynamo_kvblocks::CREDENTIAL_FILE_ENV);
    }

    #[test]
    fn the_block_api_is_on_with_a_url_and_takes_its_defaults() {
        assert_eq!(config(&[]).kv_blocks, None);
        let on = config(&[
            "--kv-blocks-url",
            "http://127.0.0.1:9100",
            "--kv-offload",
            "all",
            "--kv-bytes-scale",
            "0.01",
        ]);
        assert_eq!(
            on.kv_blocks,
            Some(KvBlocksConfig {
                url: "http://127.0.0.1:9100".into(),
                offload: OffloadMode::All,
                bytes_scale: 0.01,
                ..KvBlocksConfig::default()
            })
        );
    }

    #[test]
    fn a_disaggregated_engine_takes_no_tiers_its_link_and_its_id() {
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

    fn hardware(extra: &[&str]) -> anyhow::Result<EngineConfig> {
        let base = ["dynamo-mocker", "--model-path", "/nonexistent/m"];
        let hw = ["--perf-model", "hardware"];
        Args::try_parse_from(base.iter().chain(&hw).chain(extra))
            .unwrap()
            .engine_config()
    }

    #[test]
    fn the_hardware_model_sizes_the_pool_unless_told() {
        let llama = [
            "--model-name",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--gpu",
            "h100_sxm",
        ];
        let cfg = hardware(&llama).unwrap();
        let TimingModel::Hardware(e) = &cfg.timing else {
            panic!("{:?}", cfg.timing)
        };
        assert_eq!((e.gpu.name.as_str(), e.tp), ("H100_SXM", 1));
        assert_eq!(e.max_num_batched_tokens, 8192);
        let blocks = e.max_kv_tokens() as usize / 64;
        assert_eq!(cfg.num_gpu_blocks, blocks);
        // Two GPUs hold more than twice the KV (the weights are split too).
        let mut tp2 = llama.to_vec();
        tp2.extend(["--tensor-parallel-size", "2"]);
        assert!(hardware(&tp2).unwrap().num_gpu_blocks > 2 * blocks);
        // FP8 KV holds twice the tokens; a smaller share of memory fewer.
        let mut fp8 = llama.to_vec();
        fp8.extend(["--kv-cache-dtype", "fp8"]);
        assert_eq!(hardware(&fp8).unwrap().num_gpu_blocks / 2, blocks);
        let mut half = llama.to_vec();
        half.extend(["--gpu-memory-utilization", "0.5"]);
        assert!(hardware(&half).unwrap().num_gpu_blocks < blocks / 2);
        // An explicit pool wins; the polynomial keeps its default.
        let mut fixed = llama.to_vec();
        fixed.extend(["--num-gpu-blocks", "100"]);
        assert_eq!(hardware(&fixed).unwrap().num_gpu_blocks, 100);
        let argv = ["dynamo-mocker", "--model-path", "/m"];
        let poly = Args::try_parse_from(argv).unwrap().engine_config().unwrap();
        assert_eq!(
            (poly.num_gpu_blocks, poly.timing),
            (16384, TimingModel::Polynomial)
        );
    }

    #[test]
    fn a_model_that_does_not_fit_is_refused_naming_weights_and_memory() {
        let err = hardware(&[
            "--model-name",
            "meta-llama/Llama-3.1-70B-Instruct",
            "--gpu",
            "L40S",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("does not fit on L40S at tensor parallel 1"),
            "{err}"
        );
        assert!(
            err.contains("bfloat16 weights take 131.4 GiB (141107412992 bytes)"),
            "{err}"
        );
        assert!(err.contains("of 48.0 GiB GPU memory"), "{err}");
        // FP8 at TP 4 does.
        let fits = hardware(&[
            "--model-name",
            "meta-llama/Llama-3.1-70B-Instruct",
            "--gpu",
            "L40S",
            "--quantization",
            "fp8",
            "--tensor-parallel-size",
            "4",
        ]);
        assert!(fits.is_ok(), "{fits:?}");
    }

    #[test]
    fn hardware_flags_are_checked() {
        let name = ["--model-name", "Qwen/Qwen3-0.6B"];
        let with = |extra: &[&str]| {
            let mut argv = name.to_vec();
            argv.extend(extra);
            hardware(&argv).unwrap_err().to_string()
        };
        assert!(with(&[]).contains("needs --gpu"));
        let err = with(&["--gpu", "V100"]);
        assert!(err.contains("V100") && err.contains("B200_SXM"), "{err}");
        assert!(with(&["--gpu", "H100_SXM", "--tensor-parallel-size", "3"]).contains("divide"));
        assert!(with(&["--gpu", "H100_SXM", "--quantization", "awq"]).contains("awq"));
        assert!(with(&["--gpu", "H100_SXM", "--dtype", "int4"]).contains("--dtype"));
        let table = with(&["--gpu", "H100_SXM", "--timing-table", "/t.json"]);
        assert!(table.contains("both set the step times"), "{table}");
        let err = hardware(&["--model-name", "acme/secret-7b", "--gpu", "H100_SXM"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("config.json") && err.contains("acme/secret-7b"),
            "{err}"
        );
    }

    #[test]
    fn the_model_dir_config_comes_first_then_the_catalog() {
        let dir = std::env::temp_dir().join(format!("dynamo-mocker-arch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let parse = |extra: &[&str]| {
            let base = ["dynamo-mocker", "--model-path", dir.to_str().unwrap()];
            let hw = ["--perf-model", "hardware", "--gpu", "H100_SXM"];
            let args = Args::try_parse_from(base.iter().chain(&hw).chain(extra)).unwrap();
            match args.engine_config()?.timing {
                TimingModel::Hardware(e) => Ok(e.model),
                other => panic!("{other:?}"),
            }
        };
        // A config without an MLP size (like .cache/models/qwen-mock's): the catalog.
        let config = dir.join("config.json");
        let partial = r#"{"num_hidden_layers": 24, "hidden_size": 896,
            "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151851}"#;
        std::fs::write(&config, partial).unwrap();
        let m: anyhow::Result<ModelArch> = parse(&["--model-name", "Qwen/Qwen3-0.6B"]);
        assert_eq!(m.unwrap().layers, 28);
        let err = parse(&[]).unwrap_err().to_string();
        assert!(err.contains("lacks intermediate_size"), "{err}");
        // A complete one wins over the catalog.
        let full = r#"{"num_hidden_layers": 24, "hidden_size": 896, "intermediate_size": 4864,
            "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151851}"#;
        std::fs::write(&config, full).unwrap();
        let m = parse(&["--model-name", "Qwen/Qwen3-0.6B"]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            (m.layers, m.intermediate, m.name.as_str()),
            (24, 4864, "Qwen/Qwen3-0.6B")
        );
    }

    #[test]
    fn a_hardware_planner_profile_counts_every_gpu_of_the_engine() {
        let path =
            std::env::temp_dir().join(format!("dynamo-mocker-hw-{}.json", std::process::id()));
        let profile = |tp: &str| {
            let argv = [
                "dynamo-mocker",
                "--model-path",
                "/m",
                "--model-name",
                "meta-llama/Llama-3.1-8B",
                "--perf-model",
                "hardware",
                "--gpu",
                "H100_SXM",
                "--tensor-parallel-size",
                tp,
                "--num-gpu-blocks",
                "512",
                "--block-size",
                "16",
                "--max-num-seqs",
                "32",
                "--planner-profile-out",
                path.to_str().unwrap(),
            ];
            assert!(
                Args::try_parse_from(argv)
                    .unwrap()
                    .write_planner_profile()
                    .unwrap()
            );
            Profile::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap()
        };
        let (tp1, tp2) = (profile("1"), profile("2"));
        std::fs::remove_file(&path).unwrap();
        assert_eq!((tp1.gpus_per_engine(), tp2.gpus_per_engine()), (1, 2));
        // Faster per engine, not twice as fast: less per GPU.
        let first = |p: &Profile| p.prefill_points()[0];
        assert!(first(&tp2).ttft_ms < first(&tp1).ttft_ms);
        assert!(first(&tp2).throughput_per_gpu < first(&tp1).throughput_per_gpu);
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
