//! The `dynamo-e2e` command line: `bench` (live, over HTTP) and `replay` (simulated).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use dynamo_kvblocks::parse_bytes;
use dynamo_kvblocks::placement::{PlacementConfig, TierLimits};
use dynamo_kvcache::{ApproxConfig, RouterMode, SchedulerConfig};
use dynamo_llm::ModelDir;
use dynamo_mocker::{EngineConfig, KvBlocksConfig, KvGeometry};
use serde::Serialize;
use serde_json::json;

use crate::arrivals::{self, Arrivals};
use crate::client::{Api, Target, Words};
use crate::disagg::{self, Topology};
use crate::launch::{self, Launched};
use crate::report::{self, Report};
use crate::workload::{Sessions, SharedPrefix, Workload};
use crate::{bench, replay};

#[derive(Parser, Debug)]
#[command(
    name = "dynamo-e2e",
    version,
    about = "Load generator and router-mode comparisons"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Send a workload to an OpenAI endpoint (or to a graph started per router mode).
    Bench(BenchArgs),
    /// Run a workload through simulated mock engines and the real router scheduler.
    Replay(ReplayArgs),
}

/// What to send. Without `--trace`, the synthetic shared-prefix workload.
#[derive(Args, Debug, Clone)]
pub struct WorkloadArgs {
    /// Mooncake-format trace (JSON lines: timestamp ms, input_length, output_length,
    /// hash_ids of 512-token blocks).
    #[arg(long, env = "DYNAMO_E2E_TRACE")]
    pub trace: Option<PathBuf>,
    /// Multi-turn conversations: this many sessions (users) of `--turns` requests each,
    /// turns of a session one after the other. `--request-rate` then starts sessions
    /// (sessions/s), `--concurrency` keeps that many going; without either, all start at once.
    #[arg(long, conflicts_with = "trace", env = "DYNAMO_E2E_SESSIONS")]
    pub sessions: Option<usize>,
    /// Requests per session.
    #[arg(long, default_value_t = 10, env = "DYNAMO_E2E_TURNS")]
    pub turns: usize,
    /// Tokens every session starts with (a common system prompt).
    #[arg(long, default_value_t = 0, env = "DYNAMO_E2E_SYSTEM_TOKENS")]
    pub system_tokens: usize,
    /// Tokens of each session's own first prompt (after the system prompt).
    #[arg(long, default_value_t = 1024, env = "DYNAMO_E2E_SESSION_PREFIX_TOKENS")]
    pub session_prefix_tokens: usize,
    /// Tokens of each later user message; the previous answer's stand-in
    /// (`--output-tokens`) comes before it.
    #[arg(long, default_value_t = 256, env = "DYNAMO_E2E_TURN_TOKENS")]
    pub turn_tokens: usize,
    /// Pause between the end of a turn's answer and the next turn of its session.
    #[arg(long, default_value_t = 0.0, env = "DYNAMO_E2E_THINK_TIME_S")]
    pub think_time_s: f64,
    /// Send only the first N requests of the trace.
    #[arg(long, env = "DYNAMO_E2E_MAX_REQUESTS")]
    pub max_requests: Option<usize>,
    /// Skip trace requests with longer prompts (e.g. the model's context length).
    #[arg(long, env = "DYNAMO_E2E_MAX_INPUT_TOKENS")]
    pub max_input_tokens: Option<usize>,
    /// Multiplies the trace's timestamps: 0.5 sends it twice as fast.
    #[arg(long, default_value_t = 1.0, env = "DYNAMO_E2E_TIME_SCALE")]
    pub time_scale: f64,
    /// Shared prefixes.
    #[arg(long, default_value_t = 32, env = "DYNAMO_E2E_PREFIXES")]
    pub prefixes: usize,
    /// Requests per prefix.
    #[arg(long, default_value_t = 16, env = "DYNAMO_E2E_SUFFIXES")]
    pub suffixes: usize,
    #[arg(long, default_value_t = 2048, env = "DYNAMO_E2E_PREFIX_TOKENS")]
    pub prefix_tokens: usize,
    /// Tokens after the prefix, unique to each request.
    #[arg(long, default_value_t = 256, env = "DYNAMO_E2E_UNIQUE_TOKENS")]
    pub unique_tokens: usize,
    #[arg(long, default_value_t = 64, env = "DYNAMO_E2E_OUTPUT_TOKENS")]
    pub output_tokens: usize,
    /// Seeds the workload, the Poisson arrivals and the router's random choices.
    #[arg(long, default_value_t = 0, env = "DYNAMO_E2E_SEED")]
    pub seed: u64,
    /// Requests per second (open loop); with a trace, replaces its timestamps. Several,
    /// comma-separated (`2,4,8`), sweep: every run is repeated at each rate in turn.
    #[arg(long, value_delimiter = ',', env = "DYNAMO_E2E_REQUEST_RATE")]
    pub request_rate: Vec<f64>,
    /// How `--request-rate` spaces requests.
    #[arg(long, value_enum, default_value_t = Pattern::Poisson, env = "DYNAMO_E2E_ARRIVAL")]
    pub arrival: Pattern,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Exponential gaps (a Poisson process).
    Poisson,
    /// Even gaps.
    Fixed,
}

/// Where the results go besides the Markdown on stdout.
#[derive(Args, Debug, Clone)]
pub struct OutputArgs {
    /// Write every run's figures as JSON here.
    #[arg(long, env = "DYNAMO_E2E_OUT")]
    pub out: Option<PathBuf>,
    /// Write the Markdown tables here too.
    #[arg(long, env = "DYNAMO_E2E_MARKDOWN")]
    pub markdown: Option<PathBuf>,
    /// Graph runs over several request rates: the TTFT p99 target of the goodput table
    /// (the highest rate each graph sustains within both targets). Default: the
    /// planner's default TTFT target (brief, "Planner defaults").
    #[arg(long, default_value_t = 500.0, env = "DYNAMO_E2E_SLA_TTFT_MS")]
    pub sla_ttft_ms: f64,
    /// The goodput table's ITL p99 target; default: the planner's default ITL target.
    #[arg(long, default_value_t = 50.0, env = "DYNAMO_E2E_SLA_ITL_MS")]
    pub sla_itl_ms: f64,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// OpenAI endpoint (`make run` serves on localhost:8000); ignored with `--launch`.
    #[arg(long, default_value = "http://127.0.0.1:8000", env = "DYNAMO_E2E_URL")]
    pub url: String,
    /// Served model name [default: the first of GET /v1/models].
    #[arg(long, env = "DYNAMO_E2E_MODEL")]
    pub model: Option<String>,
    #[arg(long, value_enum, default_value_t = Api::Completions, env = "DYNAMO_E2E_API")]
    pub api: Api,
    /// Model directory whose tokenizer turns token ids into words (`--api chat`).
    #[arg(
        long,
        default_value = ".cache/models/qwen-mock",
        env = "DYNAMO_E2E_MODEL_PATH"
    )]
    pub model_path: PathBuf,
    /// Closed loop: keep this many requests in flight instead of a request rate.
    #[arg(long, conflicts_with = "request_rate", env = "DYNAMO_E2E_CONCURRENCY")]
    pub concurrency: Option<usize>,
    /// Per-request limit, whole stream included.
    #[arg(long, default_value_t = 600.0, env = "DYNAMO_E2E_REQUEST_TIMEOUT_S")]
    pub request_timeout_s: f64,
    /// Start a graph per router mode with this shell command (`{mode}` and `{port}` are
    /// filled in), wait for GET /health, run the load, stop it with SIGTERM.
    #[arg(long, env = "DYNAMO_E2E_LAUNCH")]
    pub launch: Option<String>,
    /// Runs to launch, in order (with `--launch`): each is put in the command's `{mode}`
    /// and labels its results. Router modes, or any other names (`off,host,disk` for
    /// one config file per offload tier: `-f cfg-{mode}.yaml`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kv,approx,round-robin",
        value_parser = run_label,
        env = "DYNAMO_E2E_MODES"
    )]
    pub modes: Vec<String>,
    /// The run the others are compared with [default: round-robin if it ran, else the
    /// first of `--modes`].
    #[arg(long, env = "DYNAMO_E2E_BASELINE")]
    pub baseline: Option<String>,
    /// How long a launched graph may take to become healthy.
    #[arg(long, default_value_t = 120.0, env = "DYNAMO_E2E_HEALTH_TIMEOUT_S")]
    pub health_timeout_s: f64,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Simulated engines.
    #[arg(long, default_value_t = 4, env = "DYNAMO_E2E_WORKERS")]
    pub workers: usize,
    /// KV blocks per engine.
    #[arg(long, default_value_t = 16384, env = "DYNAMO_E2E_NUM_GPU_BLOCKS")]
    pub num_gpu_blocks: usize,
    #[arg(long, default_value_t = 64, env = "DYNAMO_E2E_BLOCK_SIZE")]
    pub block_size: usize,
    #[arg(long, default_value_t = 256, env = "DYNAMO_E2E_MAX_NUM_SEQS")]
    pub max_num_seqs: usize,
    #[arg(
        long,
        default_value_t = 8192,
        env = "DYNAMO_E2E_MAX_NUM_BATCHED_TOKENS"
    )]
    pub max_num_batched_tokens: usize,
    /// Router modes to compare, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kv,approx,round-robin",
        env = "DYNAMO_E2E_MODES"
    )]
    pub modes: Vec<RouterMode>,
    /// Weight of prefill blocks against decode blocks in the router's cost.
    #[arg(long, default_value_t = 1.0, env = "DYNAMO_E2E_PREFILL_LOAD_SCALE")]
    pub prefill_load_scale: f64,
    /// 0 picks the cheapest engine; above 0 samples a softmax over costs.
    #[arg(long, default_value_t = 0.0, env = "DYNAMO_E2E_TEMPERATURE")]
    pub temperature: f64,
    /// How long the approx index trusts a routing decision.
    #[arg(long, default_value_t = 120.0, env = "DYNAMO_E2E_APPROX_TTL_S")]
    pub approx_ttl_s: f64,
    /// KV block tier configs to compare (conversations only), each run with every router
    /// mode: `off`, or tiers joined by `+` among `host=SIZE`, `disk=SIZE`,
    /// `object=SIZE`, e.g. `off,host=2GB,host=512MB+disk=8GB`. Sizes are each engine's
    /// (its sidecar's), in real KV bytes: `2GB`, `512MiB` or plain bytes.
    #[arg(long, value_delimiter = ',', value_parser = TierSpec::parse, env = "DYNAMO_E2E_TIERS")]
    pub tiers: Vec<TierSpec>,
    /// Uses a block needs before it moves from host memory to disk.
    #[arg(long, default_value_t = 2, env = "DYNAMO_E2E_KV_DISK_MIN_REUSE")]
    pub kv_disk_min_reuse: u32,
    /// Uses a block needs before it moves from disk (or host memory) to the object store.
    #[arg(long, default_value_t = 2, env = "DYNAMO_E2E_KV_OBJECT_MIN_REUSE")]
    pub kv_object_min_reuse: u32,
    /// Real KV bytes of one block [default: from `--model-path`'s config.json and
    /// `--block-size`].
    #[arg(long, value_parser = parse_bytes, env = "DYNAMO_E2E_KV_BLOCK_BYTES")]
    pub kv_block_bytes: Option<u64>,
    /// Graphs to compare (request workloads), each run with every router mode in place
    /// of `--workers`: `agg:N` (N engines that prefill and decode) or `XpYd` (X prefill
    /// and Y decode engines, each prompt's KV moving over `--kv-link-bandwidth-gbps`),
    /// e.g. `agg:4,2p2d,1p3d`.
    #[arg(long, value_delimiter = ',', value_parser = Topology::parse, env = "DYNAMO_E2E_TOPOLOGY")]
    pub topology: Vec<Topology>,
    /// Bandwidth of each engine's link for disaggregated KV transfers, GB/s: InfiniBand's
    /// 400 Gb/s across nodes; NVLink within a node is 900 GB/s (brief, "Transfer (NIXL)
    /// transports").
    #[arg(
        long,
        default_value_t = dynamo_mocker::kv_blocks::DEFAULT_LINK_BANDWIDTH_GBPS,
        env = "DYNAMO_E2E_KV_LINK_BANDWIDTH_GBPS"
    )]
    pub kv_link_bandwidth_gbps: f64,
    /// Model directory whose config.json sizes a KV block (with `--tiers` or a
    /// disaggregated `--topology`).
    #[arg(
        long,
        default_value = ".cache/models/qwen-mock",
        env = "DYNAMO_E2E_MODEL_PATH"
    )]
    pub model_path: PathBuf,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// One `--tiers` entry: its text (the run's label) and each tier's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierSpec {
    pub label: String,
    pub host: Option<u64>,
    pub disk: Option<u64>,
    pub object: Option<u64>,
}

impl TierSpec {
    fn parse(s: &str) -> Result<Self, String> {
        let mut spec = Self {
            label: s.trim().to_owned(),
            host: None,
            disk: None,
            object: None,
        };
        if spec.label == "off" {
            return Ok(spec);
        }
        for part in spec.label.clone().split('+') {
            let (name, size) = part.split_once('=').ok_or_else(|| {
                format!("{part:?}: a tier is host=SIZE, disk=SIZE or object=SIZE (or `off`)")
            })?;
            let slot = match name.trim() {
                "host" => &mut spec.host,
                "disk" => &mut spec.disk,
                "object" => &mut spec.object,
                other => return Err(format!("{other:?}: tiers are host, disk and object")),
            };
            if slot.is_some() {
                return Err(format!("{s:?} names {name} twice"));
            }
            // 0 bytes is a tier that is off, as for the sidecar.
            *slot = Some(parse_bytes(size)?).filter(|&b| b > 0);
        }
        Ok(spec)
    }

    fn placement(&self, disk_min_reuse: u32, object_min_reuse: u32) -> PlacementConfig {
        let limits = |bytes: Option<u64>, min_reuse| {
            bytes.map(|capacity_bytes| TierLimits {
                capacity_bytes,
                min_reuse,
            })
        };
        PlacementConfig {
            host: limits(self.host, 1),
            disk: limits(self.disk, disk_min_reuse),
            object: limits(self.object, object_min_reuse),
        }
    }
}

/// Real KV bytes of one block of `block_size` tokens of the model at `model_path`.
fn kv_block_bytes(model_path: &Path, block_size: usize) -> anyhow::Result<u64> {
    let path = model_path.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} to size KV blocks (or give --kv-block-bytes)",
            path.display()
        )
    })?;
    let config: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let geometry =
        KvGeometry::from_config(&config).with_context(|| format!("{}", path.display()))?;
    Ok(geometry.block_bytes(block_size))
}

/// A `--modes` entry: letters, digits, `.`, `_` and `-` only, since it goes into a shell
/// command and file names.
fn run_label(s: &str) -> Result<String, String> {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?}: a run name is letters, digits, '.', '_' and '-'"
        ))
    }
}

impl WorkloadArgs {
    fn workload(&self) -> anyhow::Result<Workload> {
        if let Some(sessions) = self.sessions {
            anyhow::ensure!(
                self.think_time_s.is_finite() && self.think_time_s >= 0.0,
                "--think-time-s must be >= 0"
            );
            return Workload::sessions(Sessions {
                sessions,
                turns: self.turns,
                system_tokens: self.system_tokens,
                session_prefix_tokens: self.session_prefix_tokens,
                turn_tokens: self.turn_tokens,
                output_tokens: self.output_tokens,
                think_time_ms: self.think_time_s * 1000.0,
                seed: self.seed,
            });
        }
        match &self.trace {
            Some(path) => Workload::trace(path, self.max_requests, self.max_input_tokens),
            None => Workload::shared_prefix(SharedPrefix {
                prefixes: self.prefixes,
                suffixes: self.suffixes,
                prefix_tokens: self.prefix_tokens,
                unique_tokens: self.unique_tokens,
                output_tokens: self.output_tokens,
                seed: self.seed,
            }),
        }
    }

    /// The request rates to run at: each of `--request-rate`, or none (the trace's own
    /// times, a concurrency, sessions all at once).
    fn rates(&self) -> Vec<Option<f64>> {
        if self.request_rate.is_empty() {
            vec![None]
        } else {
            self.request_rate.iter().copied().map(Some).collect()
        }
    }

    /// Open-loop times: `rate` (one of [`Self::rates`]) if given, else the trace's own
    /// (scaled). For conversations: when each session starts (all at 0 without a rate).
    fn times_ms(&self, workload: &Workload, rate: Option<f64>) -> anyhow::Result<Vec<f64>> {
        let n = workload
            .conversations()
            .map_or(workload.len(), |s| s.sessions);
        if workload.conversations().is_some() && rate.is_none() {
            return Ok(vec![0.0; n]);
        }
        match (rate, workload.timestamps_ms()) {
            (Some(rate), _) => {
                anyhow::ensure!(
                    rate.is_finite() && rate > 0.0,
                    "--request-rate must be positive"
                );
                Ok(match self.arrival {
                    Pattern::Poisson => arrivals::poisson(n, rate, self.seed),
                    Pattern::Fixed => arrivals::fixed(n, rate),
                })
            }
            (None, Some(trace)) => {
                anyhow::ensure!(
                    self.time_scale.is_finite() && self.time_scale >= 0.0,
                    "--time-scale must be >= 0"
                );
                Ok(arrivals::scaled(&trace, self.time_scale))
            }
            (None, None) => anyhow::bail!(
                "the shared-prefix workload needs --request-rate (or, for bench, --concurrency)"
            ),
        }
    }

    fn describe_arrivals(&self, concurrency: Option<usize>) -> String {
        let rates = (!self.request_rate.is_empty()).then(|| {
            let list: Vec<String> = self.request_rate.iter().map(f64::to_string).collect();
            list.join(", ")
        });
        if self.sessions.is_some() {
            let starts = match (concurrency, rates) {
                (Some(c), _) => format!("{c} sessions at a time"),
                (None, Some(r)) => {
                    format!("{:?} session starts at {r} sessions/s", self.arrival).to_lowercase()
                }
                (None, None) => "all sessions at once".to_owned(),
            };
            return format!("{starts}, each turn after the previous answer");
        }
        match (concurrency, rates) {
            (Some(c), _) => format!("{c} requests in flight"),
            (None, Some(r)) => format!("{:?} arrivals at {r} req/s", self.arrival).to_lowercase(),
            (None, None) => format!("trace timestamps x {}", self.time_scale),
        }
    }
}

/// Runs the command; what it prints on stdout is the Markdown.
pub async fn main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Bench(args) => run_bench(args).await,
        Command::Replay(args) => run_replay(args),
    }
}

fn run_replay(args: ReplayArgs) -> anyhow::Result<()> {
    let w = &args.workload;
    let workload = w.workload()?;
    let rates = w.rates();
    let times: Vec<Vec<f64>> = rates
        .iter()
        .map(|&rate| w.times_ms(&workload, rate))
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(args.workers > 0, "--workers must be at least 1");
    anyhow::ensure!(
        args.approx_ttl_s.is_finite() && args.approx_ttl_s >= 0.0,
        "--approx-ttl-s must be >= 0"
    );
    let engine = EngineConfig {
        num_gpu_blocks: args.num_gpu_blocks,
        block_size: args.block_size,
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        ..EngineConfig::default()
    };
    engine.validate()?;
    let scheduler = SchedulerConfig {
        prefill_load_scale: args.prefill_load_scale,
        temperature: args.temperature,
        ..SchedulerConfig::default()
    };
    let approx = ApproxConfig {
        ttl: Duration::from_secs_f64(args.approx_ttl_s),
        ..ApproxConfig::default()
    };
    anyhow::ensure!(
        args.tiers.is_empty() || workload.conversations().is_some(),
        "--tiers simulates KV block tiers for conversations: give --sessions"
    );
    let topologies = !args.topology.is_empty();
    anyhow::ensure!(
        !topologies || (args.tiers.is_empty() && workload.conversations().is_none()),
        "--topology simulates request workloads (shared prefix, trace): not with --sessions or --tiers"
    );
    anyhow::ensure!(
        args.kv_link_bandwidth_gbps.is_finite() && args.kv_link_bandwidth_gbps > 0.0,
        "--kv-link-bandwidth-gbps must be positive"
    );
    let on = |t: &TierSpec| t.host.is_some() || t.disk.is_some() || t.object.is_some();
    let moves_kv = args
        .topology
        .iter()
        .any(|t| matches!(t, Topology::Disaggregated { .. }));
    let block_bytes = match (args.kv_block_bytes, args.tiers.iter().any(on) || moves_kv) {
        (Some(b), _) => Some(b),
        (None, true) => Some(kv_block_bytes(&args.model_path, args.block_size)?),
        (None, false) => None,
    };
    anyhow::ensure!(block_bytes != Some(0), "--kv-block-bytes must be positive");
    let tier_setups: Vec<Option<(String, replay::TierSetup)>> = if args.tiers.is_empty() {
        vec![None]
    } else {
        args.tiers
            .iter()
            .map(|t| {
                let placement = t.placement(args.kv_disk_min_reuse, args.kv_object_min_reuse);
                let setup = replay::TierSetup::new(placement, block_bytes.unwrap_or(1));
                Some((t.label.clone(), setup))
            })
            .collect()
    };
    let link = disagg::Link {
        bandwidth_gbps: args.kv_link_bandwidth_gbps,
        block_bytes: block_bytes.unwrap_or(1),
    };
    let mut runs = Vec::new();
    for (&rate, times) in rates.iter().zip(&times) {
        let at = rate.map_or_else(String::new, |r| format!(" at {r} req/s"));
        for &mode in &args.modes {
            let setup = replay::RouterSetup {
                mode,
                scheduler,
                approx,
                seed: w.seed,
            };
            let mut these = Vec::new();
            if topologies {
                for &topology in &args.topology {
                    let mut run = disagg::run(&workload, times, &engine, topology, setup, &link)?;
                    if args.modes.len() > 1 {
                        run.label = format!("{mode} {topology}");
                    }
                    these.push(run);
                }
            }
            for tiers in tier_setups.iter().filter(|_| !topologies) {
                let mut run = replay::run_with_tiers(
                    &workload,
                    times,
                    &engine,
                    args.workers,
                    setup,
                    tiers.as_ref().map(|(_, t)| t),
                )?;
                if let Some((label, _)) = tiers {
                    run.label = if args.modes.len() == 1 {
                        label.clone()
                    } else {
                        format!("{mode} {label}")
                    };
                }
                these.push(run);
            }
            for mut run in these {
                let wall_s = run.replay.map_or(0.0, |d| d.wall_s);
                eprintln!("replay {}{at}: computed in {wall_s:.2} s", run.label);
                run.request_rate = rate;
                runs.push(run);
            }
        }
    }
    let blocks = format!(
        "{} blocks of {} tokens",
        args.num_gpu_blocks, args.block_size
    );
    let graph = if topologies {
        let list: Vec<String> = args.topology.iter().map(Topology::to_string).collect();
        format!("graphs {}, engines of {blocks}", list.join(", "))
    } else {
        format!("{} engines x {blocks}", args.workers)
    };
    let mut title = format!(
        "Replay: {}; {}; {graph}; router prefill_load_scale {}, temperature {}",
        workload.describe(),
        w.describe_arrivals(None),
        args.prefill_load_scale,
        args.temperature
    );
    let mut config = json!({
        "workers": args.workers,
        "engine": engine,
        "router": {"prefill_load_scale": args.prefill_load_scale, "temperature": args.temperature,
                   "approx_ttl_s": args.approx_ttl_s},
    });
    if !w.request_rate.is_empty() {
        config["request_rates"] = json!(w.request_rate);
    }
    // Ratios against round-robin, or with tiers or graphs against the first of them.
    let mut baseline = RouterMode::RoundRobin.as_str().to_owned();
    if topologies {
        title.push_str(&format!(
            "; disaggregated KV over {} GB/s links, blocks of {} bytes",
            args.kv_link_bandwidth_gbps,
            block_bytes.unwrap_or(0)
        ));
        config["topologies"] = json!({
            "graphs": args.topology.iter().map(Topology::to_string).collect::<Vec<_>>(),
            "kv_link_bandwidth_gbps": args.kv_link_bandwidth_gbps,
            "block_bytes": block_bytes,
        });
        baseline = runs.first().map(|r| r.label.clone()).unwrap_or_default();
    }
    if !args.tiers.is_empty() {
        let kv = KvBlocksConfig::default();
        title.push_str(&format!(
            "; KV tiers per engine, blocks of {} bytes, onboarding at host {} / disk {} / object {} GB/s, disk min reuse {}",
            block_bytes.unwrap_or(0),
            kv.host_bandwidth_gbps,
            kv.disk_bandwidth_gbps,
            kv.object_bandwidth_gbps,
            args.kv_disk_min_reuse,
        ));
        config["tiers"] = json!({
            "configs": args.tiers.iter().map(|t| json!({
                "label": t.label, "host_bytes": t.host, "disk_bytes": t.disk, "object_bytes": t.object,
            })).collect::<Vec<_>>(),
            "block_bytes": block_bytes,
            "kv_disk_min_reuse": args.kv_disk_min_reuse,
            "kv_object_min_reuse": args.kv_object_min_reuse,
            "bandwidth_gbps": {"host": kv.host_bandwidth_gbps, "disk": kv.disk_bandwidth_gbps,
                               "object": kv.object_bandwidth_gbps},
        });
        baseline = runs.first().map(|r| r.label.clone()).unwrap_or_default();
    }
    publish("replay", &title, config, &runs, &baseline, &args.output)
}

async fn run_bench(args: BenchArgs) -> anyhow::Result<()> {
    let w = &args.workload;
    let workload = Arc::new(w.workload()?);
    // One plan per request rate (a sweep), or the concurrency.
    let plans: Vec<(Option<f64>, Arrivals)> = match args.concurrency {
        Some(c) => vec![(None, Arrivals::Concurrency(c))],
        None => w
            .rates()
            .into_iter()
            .map(|rate| Ok((rate, Arrivals::At(w.times_ms(&workload, rate)?))))
            .collect::<anyhow::Result<_>>()?,
    };
    anyhow::ensure!(
        args.request_timeout_s.is_finite() && args.request_timeout_s > 0.0,
        "--request-timeout-s must be positive"
    );
    let http = bench::http_client(Duration::from_secs_f64(args.request_timeout_s))?;
    let words = match args.api {
        Api::Chat => Some(Arc::new(load_words(&args.model_path)?)),
        Api::Completions => None,
    };
    let mut runs = Vec::new();
    match &args.launch {
        None => {
            let target = target(&http, &args, &args.url, words.clone()).await?;
            for (k, (rate, plan)) in plans.iter().enumerate() {
                // The graph's caches outlive a rate: each later rate of a sweep sends
                // prompts of its own (the workload with seed + k).
                let workload = match k {
                    0 => workload.clone(),
                    _ => Arc::new(
                        WorkloadArgs {
                            seed: w.seed + k as u64,
                            ..w.clone()
                        }
                        .workload()?,
                    ),
                };
                let mut run = bench::run(&http, &target, workload, plan, &args.url).await?;
                run.request_rate = *rate;
                runs.push(run);
            }
        }
        Some(template) => {
            // A fresh graph per mode and rate: nothing cached from the run before.
            for mode in &args.modes {
                for (rate, plan) in &plans {
                    let at = rate.map_or_else(String::new, |r| format!(" at {r} req/s"));
                    let port = launch::free_port()?;
                    let mut graph = Launched::start(launch::expand(template, mode, port))?;
                    eprintln!("bench {mode}{at}: started `{}`", graph.command);
                    let url = format!("http://127.0.0.1:{port}");
                    let run = async {
                        graph
                            .wait_healthy(
                                &http,
                                &url,
                                Duration::from_secs_f64(args.health_timeout_s),
                            )
                            .await?;
                        let target = target(&http, &args, &url, words.clone()).await?;
                        let before = bench::scrape_transfers(&http, &url).await;
                        let mut run =
                            bench::run(&http, &target, workload.clone(), plan, mode).await?;
                        let after = bench::scrape_transfers(&http, &url).await;
                        run.request_rate = *rate;
                        // A mode named as a graph (`agg4`, `2p2d`): its engines and KV
                        // transfers, as the picker counted them.
                        if let Ok(topology) = Topology::parse(mode) {
                            run.disagg = Some(bench::live_disagg(&run, topology, before, after));
                        }
                        anyhow::Ok(run)
                    };
                    let result = tokio::select! {
                        r = run => r,
                        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
                    };
                    let stopped = graph.stop(Duration::from_secs(30)).await?;
                    eprintln!("bench {mode}{at}: {stopped:?}");
                    runs.push(result?);
                }
            }
        }
    }
    let title = format!(
        "Bench: {}; {}; {:?} API",
        workload.describe(),
        w.describe_arrivals(args.concurrency),
        args.api
    );
    let mut config = json!({"url": args.url, "launch": args.launch, "api": args.api});
    if let Some(spec) = workload.conversations() {
        config["conversations"] = json!(spec);
    }
    let baseline = match &args.baseline {
        Some(b) => b.clone(),
        None if runs
            .iter()
            .any(|r| r.label == RouterMode::RoundRobin.as_str()) =>
        {
            RouterMode::RoundRobin.as_str().to_owned()
        }
        None => runs.first().map(|r| r.label.clone()).unwrap_or_default(),
    };
    publish("bench", &title, config, &runs, &baseline, &args.output)
}

fn load_words(model_path: &Path) -> anyhow::Result<Words> {
    let model = ModelDir::load(model_path, None)
        .with_context(|| format!("loading the tokenizer from {}", model_path.display()))?;
    Words::from_model(&model)
}

/// The target at `url`, its model named by `--model` or asked of `/v1/models`.
async fn target(
    http: &reqwest::Client,
    args: &BenchArgs,
    url: &str,
    words: Option<Arc<Words>>,
) -> anyhow::Result<Target> {
    let model = match &args.model {
        Some(m) => m.clone(),
        None => {
            let models_url = format!("{}/v1/models", url.trim_end_matches('/'));
            let list: serde_json::Value = http
                .get(&models_url)
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .with_context(|| format!("GET {models_url} (or give --model)"))?
                .json()
                .await?;
            list["data"][0]["id"]
                .as_str()
                .with_context(|| format!("{models_url} lists no model; give --model"))?
                .to_owned()
        }
    };
    Ok(Target {
        base_url: url.to_owned(),
        model,
        api: args.api,
        words,
    })
}

/// Prints the tables (and ratios against `baseline` when it ran, per turn for
/// conversations; per request rate for a rate sweep, then graph runs across rates) and
/// writes the files.
fn publish(
    kind: &str,
    title: &str,
    config: serde_json::Value,
    runs: &[Report],
    baseline: &str,
    output: &OutputArgs,
) -> anyhow::Result<()> {
    // Runs by request rate, in the order they ran.
    let mut groups: Vec<(Option<f64>, Vec<Report>)> = Vec::new();
    for r in runs {
        match groups.iter_mut().find(|(rate, _)| *rate == r.request_rate) {
            Some((_, group)) => group.push(r.clone()),
            None => groups.push((r.request_rate, vec![r.clone()])),
        }
    }
    let mut md = format!("### {title}\n\n");
    let mut all_ratios = Vec::new();
    for (rate, runs) in &groups {
        if let (true, Some(rate)) = (groups.len() > 1, rate) {
            md.push_str(&format!("#### {rate} req/s\n\n"));
        }
        let ratios = report::ratios(runs, baseline);
        md.push_str(&report::markdown_table(runs));
        if runs.iter().any(|r| r.tiers.is_some()) {
            md.push_str("\nKV block tiers (hit rates: GPU + onboarded tokens / prompt tokens; vs baseline: its TTFT p50 / the run's):\n\n");
            md.push_str(&report::tier_table(runs, baseline));
        }
        if !ratios.is_empty() {
            md.push('\n');
            md.push_str(&report::ratio_table(&ratios));
        }
        if runs.iter().any(|r| !r.turns.is_empty()) {
            md.push_str("\nTTFT per turn (turn 1: nothing cached yet; later turns: the previous turn's prompt can be reused):\n\n");
            md.push_str(&report::turn_table(runs));
            let turn_ratios = report::turn_ratio_table(&ratios);
            if !turn_ratios.is_empty() {
                md.push('\n');
                md.push_str(&turn_ratios);
            }
        }
        for r in runs.iter().filter(|r| !r.error_samples.is_empty()) {
            md.push_str(&format!(
                "\n{} errors: {}\n",
                r.label,
                r.error_samples.join("; ")
            ));
        }
        if groups.len() > 1 {
            md.push('\n');
        }
        all_ratios.extend(ratios);
    }
    if runs.iter().any(|r| r.disagg.is_some()) {
        md.push_str(&format!(
            "\nGraphs (KV transfer: a prefill's end to its KV at the decode engine, ms; per engine: output tok/s / engines; vs baseline ({baseline}) at the same rate: above 1 is better):\n\n"
        ));
        md.push_str(&report::disagg_table(runs, baseline));
        if groups.len() > 1 {
            let sla = report::Sla {
                ttft_p99_ms: output.sla_ttft_ms,
                itl_p99_ms: output.sla_itl_ms,
            };
            md.push_str("\nGoodput (each graph at the highest swept rate up to which every rate met both targets, with no errors):\n\n");
            md.push_str(&report::sla_table(runs, baseline, sla));
        }
    }
    print!("{md}");
    if let Some(path) = &output.markdown {
        write(path, &md)?;
    }
    if let Some(path) = &output.out {
        let doc = json!({"kind": kind, "title": title, "config": config, "runs": runs,
                         "ratios": all_ratios});
        write(path, &serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        let argv = ["dynamo-e2e", "bench"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Bench(b) => Ok(b),
            Command::Replay(_) => unreachable!(),
        }
    }

    fn replay(args: &[&str]) -> Result<ReplayArgs, clap::Error> {
        let argv = ["dynamo-e2e", "replay"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Replay(r) => Ok(r),
            Command::Bench(_) => unreachable!(),
        }
    }

    #[test]
    fn launched_runs_may_have_any_plain_name() {
        let b = bench(&[
            "--modes",
            "off,host,disk",
            "--launch",
            "x -f cfg-{mode}.yaml",
        ])
        .unwrap();
        assert_eq!(b.modes, ["off", "host", "disk"]);
        assert_eq!(b.baseline, None);
        assert_eq!(
            launch::expand(b.launch.as_deref().unwrap(), &b.modes[1], 9),
            "x -f cfg-host.yaml"
        );
        assert_eq!(bench(&[]).unwrap().modes, ["kv", "approx", "round-robin"]);
        for bad in ["off,", "a b", "x;rm", "$(y)"] {
            assert!(bench(&["--modes", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn tier_configs_parse_as_the_sidecar_reads_sizes() {
        let t = TierSpec::parse("host=512MB+disk=8GiB").unwrap();
        assert_eq!(
            (t.label.as_str(), t.host, t.disk, t.object),
            (
                "host=512MB+disk=8GiB",
                Some(512_000_000),
                Some(8 << 30),
                None
            )
        );
        let p = t.placement(3, 4);
        assert_eq!(
            (
                p.host.unwrap().min_reuse,
                p.disk.unwrap().min_reuse,
                p.object
            ),
            (1, 3, None)
        );
        // `off`, and a tier of 0 bytes, are no tiers (as for the sidecar).
        assert!(!TierSpec::parse("off").unwrap().placement(2, 2).any());
        assert!(!TierSpec::parse("host=0").unwrap().placement(2, 2).any());
        assert!(TierSpec::parse("object=1TB").unwrap().object == Some(1_000_000_000_000));
        for bad in [
            "",
            "host",
            "host=1GB+",
            "gpu=1GB",
            "disk=1GB+disk=2GB",
            "host=big",
        ] {
            assert!(TierSpec::parse(bad).is_err(), "{bad}");
        }
        let r = replay(&["--sessions", "2", "--tiers", "off,host=2GB"]).unwrap();
        assert_eq!(r.tiers.len(), 2);
        assert_eq!((r.kv_disk_min_reuse, r.kv_block_bytes), (2, None));
    }

    #[test]
    fn request_rates_sweep_and_graphs_parse() {
        let r = replay(&["--request-rate", "2,4.5", "--topology", "agg:4,2p2d"]).unwrap();
        assert_eq!(r.workload.rates(), [Some(2.0), Some(4.5)]);
        assert_eq!(
            r.topology,
            [
                Topology::Aggregated { engines: 4 },
                Topology::Disaggregated {
                    prefill: 2,
                    decode: 2
                }
            ]
        );
        assert_eq!(r.kv_link_bandwidth_gbps, 50.0);
        assert_eq!((r.output.sla_ttft_ms, r.output.sla_itl_ms), (500.0, 50.0));
        assert!(
            r.workload
                .describe_arrivals(None)
                .starts_with("poisson arrivals at 2, 4.5 req/s")
        );
        let w = r.workload.workload().unwrap();
        let (slow, fast) = (
            r.workload.times_ms(&w, Some(2.0)).unwrap(),
            r.workload.times_ms(&w, Some(4.0)).unwrap(),
        );
        assert_eq!(slow.len(), w.len());
        assert!(
            slow.iter()
                .zip(&fast)
                .all(|(s, f)| (s - 2.0 * f).abs() < 1e-6)
        );
        assert_eq!(replay(&[]).unwrap().workload.rates(), [None]);
        assert!(replay(&["--topology", "4"]).is_err());
        // A closed loop is one run, not a sweep.
        assert!(bench(&["--request-rate", "1,2", "--concurrency", "3"]).is_err());
        assert_eq!(
            bench(&["--request-rate", "3"]).unwrap().workload.rates(),
            [Some(3.0)]
        );
    }

    #[test]
    fn conversations_start_all_at_once_or_at_the_session_rate() {
        let b = bench(&["--sessions", "80", "--turns", "10"]).unwrap();
        let w = b.workload.workload().unwrap();
        assert_eq!(
            (w.len(), w.conversations().unwrap().session_prefix_tokens),
            (800, 1024)
        );
        assert_eq!(
            b.workload.times_ms(&w, b.workload.rates()[0]).unwrap(),
            vec![0.0; 80]
        );
        assert!(
            b.workload
                .describe_arrivals(None)
                .starts_with("all sessions at once")
        );
        let b = bench(&[
            "--sessions",
            "3",
            "--request-rate",
            "2",
            "--arrival",
            "fixed",
        ])
        .unwrap();
        let w = b.workload.workload().unwrap();
        assert_eq!(
            b.workload.times_ms(&w, b.workload.rates()[0]).unwrap(),
            [0.0, 500.0, 1000.0]
        );
        assert!(
            b.workload
                .describe_arrivals(Some(4))
                .starts_with("4 sessions at a time")
        );
        let b = bench(&["--sessions", "3", "--think-time-s=-1"]).unwrap();
        assert!(b.workload.workload().is_err());
        assert!(bench(&["--sessions", "3", "--trace", "t.jsonl"]).is_err());
    }
}
