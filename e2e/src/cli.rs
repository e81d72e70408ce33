//! The `dynamo-e2e` command line: `bench` (live, over HTTP), `replay` and `planner`
//! (simulated), `overhead` (CPU per request of the live serving path).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use dynamo_kvblocks::parse_bytes;
use dynamo_kvblocks::placement::{PlacementConfig, TierLimits};
use dynamo_kvcache::{ApproxConfig, RouterKnobs, RouterMode, SchedulerConfig};
use dynamo_llm::ModelDir;
use dynamo_mocker::{EngineConfig, KvBlocksConfig, KvGeometry};
use serde::Serialize;
use serde_json::json;

use dynamo_mocker::profile::{ProfileSweep, planner_profile};
use dynamo_planner::decide::{Limits, LoadTarget, SlaTargets};
use dynamo_planner::predict::PredictorConfig;
use dynamo_planner::profile::Profile;

use dynamo_loadgen::arrivals::{self, Arrivals, RateSchedule};
use dynamo_loadgen::bench;
use dynamo_loadgen::client::{Api, Target, Words};
use dynamo_loadgen::launch::{self, Launched};
use dynamo_loadgen::report::{self, Attainment, Report};
use dynamo_loadgen::workload::{Sessions, SharedPrefix, Workload};

use crate::disagg::{self, Topology};
use crate::graph_watch::GraphWatch;
use crate::overhead::{self, Delivery};
use crate::planner_replay::{self, PlannerMode, PlannerRun, PlannerSetup};
use crate::{replay, transfers};

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
    /// The planner in the loop of a simulated aggregated graph under a stepped load,
    /// against static replica counts.
    Planner(PlannerArgs),
    /// CPU per request of the picker, a sidecar and a mock engine (real processes) under
    /// a closed loop of small chat requests, streamed and not.
    Overhead(OverheadArgs),
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
    /// A request rate that changes in steps, instead of `--request-rate`:
    /// `RATExSECONDS` steps, comma-separated (`2x60,8x120,2x60`: 2 req/s for a minute, 8
    /// for two, then 2 for one), spaced by `--arrival` within each step and seeded by
    /// `--seed`. The run sends as many requests as the schedule draws: the shared-prefix
    /// workload grows (more requests per prefix) to that many; a trace or conversations
    /// are cut to it, and must have enough (sessions are started by the schedule).
    #[arg(
        long,
        conflicts_with = "request_rate",
        value_parser = RateSchedule::parse,
        // `-1x5` is a bad schedule to explain, not an unknown flag.
        allow_hyphen_values = true,
        env = "DYNAMO_E2E_RATE_SCHEDULE"
    )]
    pub rate_schedule: Option<RateSchedule>,
    /// How `--request-rate` (or `--rate-schedule`) spaces requests.
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
    #[arg(
        long,
        conflicts_with_all = ["request_rate", "rate_schedule"],
        env = "DYNAMO_E2E_CONCURRENCY"
    )]
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
    /// Count the requests within this TTFT target (with `--itl-target-ms`).
    #[arg(long, requires = "itl_target_ms", env = "DYNAMO_E2E_TTFT_TARGET_MS")]
    pub ttft_target_ms: Option<f64>,
    /// Count the requests whose mean gap between tokens is within this (with
    /// `--ttft-target-ms`).
    #[arg(long, requires = "ttft_target_ms", env = "DYNAMO_E2E_ITL_TARGET_MS")]
    pub itl_target_ms: Option<f64>,
    /// Follow a local graph's worker replicas during each run: its runner's admin
    /// `GET /graph` URL (e.g. with `dynamo run --admin-port 9901`:
    /// `http://127.0.0.1:9901/graph`).
    #[arg(long, env = "DYNAMO_E2E_WATCH_GRAPH")]
    pub watch_graph: Option<String>,
    /// How long a launched graph may take to become healthy.
    #[arg(long, default_value_t = 120.0, env = "DYNAMO_E2E_HEALTH_TIMEOUT_S")]
    pub health_timeout_s: f64,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The simulated engines' shape (the replays').
#[derive(Args, Debug)]
pub struct SimEngineArgs {
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
}

impl SimEngineArgs {
    fn config(&self) -> EngineConfig {
        EngineConfig {
            num_gpu_blocks: self.num_gpu_blocks,
            block_size: self.block_size,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            ..EngineConfig::default()
        }
    }
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Simulated engines.
    #[arg(long, default_value_t = 4, env = "DYNAMO_E2E_WORKERS")]
    pub workers: usize,
    #[command(flatten)]
    pub engine: SimEngineArgs,
    /// Router modes to compare, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kv,approx,round-robin",
        env = "DYNAMO_E2E_MODES"
    )]
    pub modes: Vec<RouterMode>,
    /// Closed loop: this many clients, each sending the next request as soon as its
    /// previous one ends (aiperf's `--concurrency`, as workload B runs live), instead of
    /// a request rate.
    #[arg(
        long,
        conflicts_with_all = ["request_rate", "rate_schedule", "sessions", "tiers", "topology"],
        env = "DYNAMO_E2E_CONCURRENCY"
    )]
    pub concurrency: Option<usize>,
    /// The picker's cost knobs, under its names.
    #[command(flatten)]
    pub router: RouterKnobs,
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

/// `dynamo-e2e planner`: see `planner_replay` and docs/performance-planner.md, "Planner".
#[derive(Args, Debug)]
pub struct PlannerArgs {
    /// The load, `RATExSECONDS` steps (requests/s x seconds), comma-separated. The
    /// default steps up 4x and back down, sized so the mocker's default engine needs
    /// about 2 replicas at the base rate and 8 at the peak.
    #[arg(
        long,
        default_value = "16x600,64x600,16x600",
        value_parser = RateSchedule::parse,
        allow_hyphen_values = true,
        env = "DYNAMO_E2E_RATE_SCHEDULE"
    )]
    pub rate_schedule: RateSchedule,
    /// How requests are spaced within each step.
    #[arg(long, value_enum, default_value_t = Pattern::Poisson, env = "DYNAMO_E2E_ARRIVAL")]
    pub arrival: Pattern,
    /// Prompt tokens per request, none shared (Dynamo's planner default ISL).
    #[arg(long, default_value_t = 3000, env = "DYNAMO_E2E_ISL")]
    pub isl: usize,
    /// Output tokens per request (Dynamo's planner default OSL).
    #[arg(long, default_value_t = 150, env = "DYNAMO_E2E_OSL")]
    pub osl: usize,
    /// Seeds the prompts, the arrivals and the router's random choices.
    #[arg(long, default_value_t = 0, env = "DYNAMO_E2E_SEED")]
    pub seed: u64,
    /// Who sets the replicas, each a run: `throughput`, `load`, `throughput+load` (both,
    /// as Dynamo runs them together), `static:N`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "throughput,load,throughput+load",
        value_parser = PlannerMode::parse,
        env = "DYNAMO_E2E_PLANNER"
    )]
    pub planner: Vec<PlannerMode>,
    /// Do not add the static runs the comparison needs (every count from the base
    /// rate's to the peak's, and up to the most any planner run used).
    #[arg(long, env = "DYNAMO_E2E_NO_STATIC_SWEEP")]
    pub no_static_sweep: bool,
    /// TTFT target, ms (Dynamo's planner default).
    #[arg(long, default_value_t = 500.0, env = "DYNAMO_E2E_TTFT_MS")]
    pub ttft_ms: f64,
    /// ITL target, ms (Dynamo's planner default): a request meets it when its mean gap
    /// between tokens does.
    #[arg(long, default_value_t = 50.0, env = "DYNAMO_E2E_ITL_MS")]
    pub itl_ms: f64,
    /// Throughput mode's adjustment interval, s.
    #[arg(long, default_value_t = 60.0, env = "DYNAMO_E2E_INTERVAL_S")]
    pub interval_s: f64,
    /// Load mode's adjustment interval, s (Dynamo's default).
    #[arg(long, default_value_t = 5.0, env = "DYNAMO_E2E_LOAD_INTERVAL_S")]
    pub load_interval_s: f64,
    /// Seconds from a scale-up to the new engine taking requests: a pod's start.
    #[arg(long, default_value_t = 30.0, env = "DYNAMO_E2E_STARTUP_S")]
    pub startup_s: f64,
    /// Predictor of requests, ISL and OSL: constant, moving-average[:N], kalman,
    /// arima[:N].
    #[arg(long, default_value = "arima", value_parser = parse_predictor, env = "DYNAMO_E2E_PREDICTOR")]
    pub predictor: PredictorConfig,
    /// Throughput mode without its correction factors.
    #[arg(long, env = "DYNAMO_E2E_NO_CORRECTION")]
    pub no_correction: bool,
    /// Load mode's thresholds: `throughput` or `latency`.
    #[arg(long, default_value = "throughput", value_parser = parse_load_target, env = "DYNAMO_E2E_LOAD_TARGET")]
    pub load_target: LoadTarget,
    /// The model's context length, tokens: load mode's prefill queue is measured in it.
    #[arg(long, default_value_t = 32768.0, env = "DYNAMO_E2E_CONTEXT_LENGTH")]
    pub context_length: f64,
    /// Most GPUs the planner may use.
    #[arg(long, default_value_t = 32, env = "DYNAMO_E2E_MAX_GPU_BUDGET")]
    pub max_gpu_budget: u32,
    /// Fewest replicas.
    #[arg(long, default_value_t = 1, env = "DYNAMO_E2E_MIN_ENDPOINT")]
    pub min_endpoint: u32,
    /// Most replicas one decision moves.
    #[arg(long, default_value_t = 8, env = "DYNAMO_E2E_MAX_STEP")]
    pub max_step: u32,
    /// Replicas a planner starts with [default: the profile's for the first step's rate].
    #[arg(long, env = "DYNAMO_E2E_INITIAL_REPLICAS")]
    pub initial_replicas: Option<u32>,
    /// The engines' profile (`dynamo_planner::profile` JSON) [default: measured on the
    /// mock engine these flags configure, as `dynamo-mocker --planner-profile-out` does].
    #[arg(long, env = "DYNAMO_E2E_PROFILE")]
    pub profile: Option<PathBuf>,
    /// Write the profile used here.
    #[arg(long, env = "DYNAMO_E2E_PROFILE_OUT")]
    pub profile_out: Option<PathBuf>,
    #[command(flatten)]
    pub engine: SimEngineArgs,
    /// The mock engines run this many times faster than the modelled GPU.
    #[arg(long, default_value_t = 1.0, env = "DYNAMO_E2E_SPEEDUP_RATIO")]
    pub speedup_ratio: f64,
    /// The endpoint picker's routing mode. Round-robin by default: no two prompts share
    /// a block, so KV overlap has nothing to find, and the `kv` mode's cost (decode
    /// blocks dominate it) leaves prefill queues uneven on this load (docs/performance-planner.md,
    /// "Planner").
    #[arg(long, default_value = "round-robin", env = "DYNAMO_E2E_ROUTER_MODE")]
    pub router_mode: RouterMode,
    /// The picker's saturation threshold: an engine with more requests than this
    /// waiting in it takes no new request, which waits in the picker's queue instead
    /// (the EPP's `--max-waiting-requests`). Unset, as the EPP's default: every request
    /// is routed on arrival and a backlog stays on the engine that took it.
    #[arg(long, env = "DYNAMO_E2E_MAX_WAITING_REQUESTS")]
    pub max_waiting_requests: Option<u64>,
    /// Write every run's figures (timelines and decisions included) as JSON here.
    #[arg(long, env = "DYNAMO_E2E_OUT")]
    pub out: Option<PathBuf>,
    /// Write the Markdown tables here too.
    #[arg(long, env = "DYNAMO_E2E_MARKDOWN")]
    pub markdown: Option<PathBuf>,
    /// Write every run's replica timeline as CSV here.
    #[arg(long, env = "DYNAMO_E2E_TIMELINE_CSV")]
    pub timeline_csv: Option<PathBuf>,
}

/// `dynamo-e2e overhead`: see `overhead` and docs/performance-overhead.md, "CPU per request".
#[derive(Args, Debug)]
pub struct OverheadArgs {
    /// Where `dynamo-mocker`, `dynamo-sidecar` and `dynamo-epp` are [default: beside
    /// this program].
    #[arg(long, env = "DYNAMO_E2E_BIN_DIR")]
    pub bin_dir: Option<PathBuf>,
    /// Model directory of the three processes (tokenizer, chat template), whose words
    /// make the prompts.
    #[arg(
        long,
        default_value = ".cache/models/qwen-mock",
        env = "DYNAMO_E2E_MODEL_PATH"
    )]
    pub model_path: PathBuf,
    /// Served model name.
    #[arg(long, default_value = "qwen-mock", env = "DYNAMO_E2E_MODEL")]
    pub model: String,
    /// The picker's routing mode.
    #[arg(long, default_value = "kv", env = "DYNAMO_E2E_ROUTER_MODE")]
    pub router_mode: RouterMode,
    /// The mock engine runs this many times faster than the modelled GPU: 1000 leaves
    /// microseconds of simulated time per step (the reference kit's `SPEEDUP=1000`).
    #[arg(long, default_value_t = 1000.0, env = "DYNAMO_E2E_SPEEDUP_RATIO")]
    pub speedup_ratio: f64,
    /// Requests in flight (the reference kit's `CONN`).
    #[arg(long, default_value_t = 32, env = "DYNAMO_E2E_CONCURRENCY")]
    pub concurrency: usize,
    /// Words of each chat prompt (`WRK_WORDS`).
    #[arg(long, default_value_t = 20, env = "DYNAMO_E2E_PROMPT_WORDS")]
    pub prompt_words: usize,
    /// Output tokens of each answer (`WRK_MAX_TOKENS`).
    #[arg(long, default_value_t = 16, env = "DYNAMO_E2E_OUTPUT_TOKENS")]
    pub output_tokens: usize,
    /// Load before each measured window.
    #[arg(long, default_value_t = 3.0, env = "DYNAMO_E2E_WARMUP_S")]
    pub warmup_s: f64,
    /// The measured window of each delivery.
    #[arg(long, default_value_t = 20.0, env = "DYNAMO_E2E_DURATION_S")]
    pub duration_s: f64,
    /// The windows to measure, in order: `streamed`, `whole`.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "streamed,whole",
        env = "DYNAMO_E2E_DELIVERIES"
    )]
    pub deliveries: Vec<Delivery>,
    /// Seeds the prompts.
    #[arg(long, default_value_t = 0, env = "DYNAMO_E2E_SEED")]
    pub seed: u64,
    #[arg(long, default_value_t = 30.0, env = "DYNAMO_E2E_REQUEST_TIMEOUT_S")]
    pub request_timeout_s: f64,
    /// How long each process may take to become healthy.
    #[arg(long, default_value_t = 60.0, env = "DYNAMO_E2E_HEALTH_TIMEOUT_S")]
    pub health_timeout_s: f64,
    /// Write the figures as JSON here.
    #[arg(long, env = "DYNAMO_E2E_OUT")]
    pub out: Option<PathBuf>,
    /// Write the Markdown table here too.
    #[arg(long, env = "DYNAMO_E2E_MARKDOWN")]
    pub markdown: Option<PathBuf>,
}

fn parse_predictor(s: &str) -> Result<PredictorConfig, String> {
    s.parse()
        .map_err(|e: dynamo_planner::predict::PredictorError| e.to_string())
}

fn parse_load_target(s: &str) -> Result<LoadTarget, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "throughput" => Ok(LoadTarget::Throughput),
        "latency" => Ok(LoadTarget::Latency),
        _ => Err(format!("{s:?}: a load target is throughput or latency")),
    }
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
    /// The workload to send: with `--rate-schedule`, as many requests (sessions) as the
    /// schedule draws (see the flag).
    fn workload(&self) -> anyhow::Result<Workload> {
        let workload = self.unscheduled_workload()?;
        match &self.rate_schedule {
            Some(schedule) => fit_to_schedule(workload, self.schedule_times(schedule).len()),
            None => Ok(workload),
        }
    }

    /// The `--rate-schedule` arrivals (ms), spaced as `--arrival` says.
    fn schedule_times(&self, schedule: &RateSchedule) -> Vec<f64> {
        schedule_times(self.arrival, schedule, self.seed)
    }

    fn unscheduled_workload(&self) -> anyhow::Result<Workload> {
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
        if let Some(schedule) = &self.rate_schedule {
            let times = self.schedule_times(schedule);
            anyhow::ensure!(
                times.len() == n,
                "the rate schedule draws {} arrivals for {n} requests (or sessions)",
                times.len()
            );
            return Ok(times);
        }
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
        let rates = match &self.rate_schedule {
            Some(schedule) => Some(format!("{schedule} (req/s x s)")),
            None => (!self.request_rate.is_empty()).then(|| {
                let list: Vec<String> = self.request_rate.iter().map(f64::to_string).collect();
                list.join(", ")
            }),
        };
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

/// A rate schedule's arrivals (ms), spaced as `arrival` says.
fn schedule_times(arrival: Pattern, schedule: &RateSchedule, seed: u64) -> Vec<f64> {
    match arrival {
        Pattern::Poisson => arrivals::poisson_schedule(schedule, seed),
        Pattern::Fixed => arrivals::fixed_schedule(schedule),
    }
}

/// `workload` with exactly `n` requests (sessions, for conversations), for a rate
/// schedule that draws `n` arrivals: a shared-prefix workload grows by requests per
/// prefix as needed, then every kind is cut to `n`; a trace or conversations with fewer
/// than `n` are an error.
fn fit_to_schedule(workload: Workload, n: usize) -> anyhow::Result<Workload> {
    anyhow::ensure!(
        n > 0,
        "the rate schedule draws no arrival: raise a rate or a duration"
    );
    Ok(match workload {
        Workload::SharedPrefix { spec, .. } => {
            let suffixes = n.div_ceil(spec.prefixes.max(1)).max(spec.suffixes);
            let grown = Workload::shared_prefix(SharedPrefix { suffixes, ..spec })?;
            match grown {
                Workload::SharedPrefix { spec, mut order } => {
                    order.truncate(n);
                    Workload::SharedPrefix { spec, order }
                }
                other => other,
            }
        }
        Workload::Trace { mut records } => {
            anyhow::ensure!(
                records.len() >= n,
                "the rate schedule draws {n} arrivals, the trace has {} requests: shorten the schedule",
                records.len()
            );
            records.truncate(n);
            Workload::Trace { records }
        }
        Workload::Sessions { mut spec } => {
            anyhow::ensure!(
                spec.sessions >= n,
                "the rate schedule starts {n} sessions, --sessions is {}: raise it",
                spec.sessions
            );
            spec.sessions = n;
            Workload::Sessions { spec }
        }
    })
}

/// Runs the command; what it prints on stdout is the Markdown.
pub async fn main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Bench(args) => run_bench(args).await,
        Command::Replay(args) => run_replay(args),
        Command::Planner(args) => run_planner(args),
        Command::Overhead(args) => run_overhead(args).await,
    }
}

async fn run_overhead(args: OverheadArgs) -> anyhow::Result<()> {
    let seconds = |flag: &str, s: f64| {
        anyhow::ensure!(s.is_finite() && s >= 0.0, "{flag} must be >= 0");
        Ok(Duration::from_secs_f64(s))
    };
    let bin_dir = match args.bin_dir {
        Some(dir) => dir,
        None => std::env::current_exe()?
            .parent()
            .context("this program's directory")?
            .to_owned(),
    };
    let setup = overhead::Setup {
        bin_dir,
        model_path: args.model_path.clone(),
        model_name: args.model,
        router_mode: args.router_mode,
        speedup_ratio: args.speedup_ratio,
        concurrency: args.concurrency,
        prompt_words: args.prompt_words,
        output_tokens: args.output_tokens,
        warmup_s: args.warmup_s,
        window_s: args.duration_s,
        deliveries: args.deliveries,
        seed: args.seed,
        request_timeout: seconds("--request-timeout-s", args.request_timeout_s)?,
        health_timeout: seconds("--health-timeout-s", args.health_timeout_s)?,
    };
    let report = overhead::run(setup, load_words(&args.model_path)?).await?;
    let md = overhead::markdown(&report);
    print!("{md}");
    if let Some(path) = &args.markdown {
        write(path, &md)?;
    }
    if let Some(path) = &args.out {
        write(path, &serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

fn run_planner(args: PlannerArgs) -> anyhow::Result<()> {
    let engine = EngineConfig {
        speedup_ratio: args.speedup_ratio,
        seed: args.seed,
        ..args.engine.config()
    };
    engine.validate()?;
    anyhow::ensure!(
        args.isl > 0 && args.osl > 0,
        "--isl and --osl must be at least 1"
    );
    for (flag, v) in [("--ttft-ms", args.ttft_ms), ("--itl-ms", args.itl_ms)] {
        anyhow::ensure!(v.is_finite() && v > 0.0, "{flag} must be positive");
    }
    let profile = match &args.profile {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the profile {}", path.display()))?;
            Profile::from_json(&text).with_context(|| path.display().to_string())?
        }
        None => planner_profile(&engine, &ProfileSweep::default())?,
    };
    if let Some(path) = &args.profile_out {
        write(path, &(serde_json::to_string_pretty(&profile)? + "\n"))?;
    }
    let schedule = &args.rate_schedule;
    let times = schedule_times(args.arrival, schedule, args.seed);
    anyhow::ensure!(!times.is_empty(), "the rate schedule draws no request");
    let workload = Workload::shared_prefix(SharedPrefix {
        prefixes: times.len(),
        suffixes: 1,
        prefix_tokens: 0,
        unique_tokens: args.isl,
        output_tokens: args.osl,
        seed: args.seed,
    })?;
    let mut setup = PlannerSetup {
        engine: engine.clone(),
        router: replay::RouterSetup {
            mode: args.router_mode,
            scheduler: SchedulerConfig::default(),
            approx: ApproxConfig::default(),
            seed: args.seed,
        },
        profile,
        targets: SlaTargets {
            ttft_ms: args.ttft_ms,
            itl_ms: args.itl_ms,
        },
        limits: Limits {
            min_endpoint: args.min_endpoint,
            max_gpu_budget: args.max_gpu_budget,
            max_step: args.max_step,
        },
        predictor: args.predictor,
        correction: !args.no_correction,
        interval_s: args.interval_s,
        load_interval_s: args.load_interval_s,
        load_target: args.load_target,
        context_length: args.context_length,
        startup_s: args.startup_s,
        initial_replicas: 1,
        max_waiting_requests: args.max_waiting_requests,
    };
    let (isl, osl) = (args.isl as f64, args.osl as f64);
    let rates: Vec<f64> = schedule
        .steps()
        .iter()
        .map(|s| s.rate)
        .filter(|&r| r > 0.0)
        .collect();
    let base_rate = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let base = setup.replicas_for(base_rate, isl, osl);
    let peak = setup.replicas_for(schedule.peak_rate(), isl, osl);
    setup.initial_replicas = match args.initial_replicas {
        Some(n) => n,
        None => setup.replicas_for(schedule.steps()[0].rate.max(base_rate), isl, osl),
    };
    let mut modes = args.planner.clone();
    let mut runs: Vec<PlannerRun> = Vec::new();
    let ran = |mode: PlannerMode, runs: &mut Vec<PlannerRun>| -> anyhow::Result<()> {
        if runs.iter().any(|r| r.label == mode.to_string()) {
            return Ok(());
        }
        let run = planner_replay::simulate(&workload, &times, schedule, &setup, mode)?;
        eprintln!(
            "planner {mode}: {} requests, {:.1}% within both targets, {:.0} GPU-s, replicas {}-{}; computed in {:.1} s",
            run.requests,
            run.attainment.both_pct(),
            run.gpu_seconds,
            run.min_replicas,
            run.max_replicas,
            run.wall_s
        );
        runs.push(run);
        Ok(())
    };
    modes.sort_by_key(PlannerMode::is_static);
    for &mode in &modes {
        ran(mode, &mut runs)?;
    }
    if !args.no_static_sweep {
        // Every count from the base rate's up: past the peak's, and past the first that
        // meets every planner run's attainment, a larger one is only dearer.
        let wanted = runs
            .iter()
            .map(|r| r.attainment.both_pct())
            .fold(0.0, f64::max);
        let most = runs
            .iter()
            .map(|r| r.max_replicas)
            .max()
            .unwrap_or(peak)
            .max(peak);
        for n in base.min(peak)..=most {
            ran(PlannerMode::Static(n), &mut runs)?;
            let last = runs.last().expect("just ran");
            if n >= peak && last.attainment.both_pct() >= wanted {
                break;
            }
        }
    }
    runs.sort_by_key(|r| match PlannerMode::parse(&r.label) {
        Ok(PlannerMode::Static(n)) => (1, n),
        _ => (0, 0),
    });
    let versus = planner_replay::compare(&runs, peak);
    let title = format!(
        "Planner replay: rate schedule {schedule} (req/s x s), {} arrivals, {} requests of ISL {} / OSL {}; targets TTFT {} ms, ITL {} ms; aggregated mocker engines ({} blocks of {} tokens, max_num_seqs {}, max_num_batched_tokens {}, speedup {}), {} routing{}; planner interval {} s (load mode {} s), predictor {}, correction {}, startup {} s, budget {} GPUs",
        format!("{:?}", args.arrival).to_lowercase(),
        times.len(),
        args.isl,
        args.osl,
        args.ttft_ms,
        args.itl_ms,
        engine.num_gpu_blocks,
        engine.block_size,
        engine.max_num_seqs,
        engine.max_num_batched_tokens,
        engine.speedup_ratio,
        args.router_mode,
        match args.max_waiting_requests {
            Some(n) => format!(", picker queue past {n} waiting per engine"),
            None => String::new(),
        },
        args.interval_s,
        args.load_interval_s,
        args.predictor.kind,
        if args.no_correction { "off" } else { "on" },
        args.startup_s,
        args.max_gpu_budget,
    );
    let mut md = format!("### {title}\n\n");
    md.push_str(&format!(
        "The profile sizes the base rate ({base_rate} req/s) at {base} replicas and the peak ({} req/s) at {peak}.\n\n",
        schedule.peak_rate()
    ));
    md.push_str(&planner_replay::runs_table(&runs));
    if !versus.is_empty() {
        md.push_str("\nThe planner against static counts (best static: the cheapest meeting the planner's attainment of both targets; same cost: the cheapest costing at least the planner's GPU-seconds; peak: sized for the peak rate):\n\n");
        md.push_str(&planner_replay::versus_table(&versus));
    }
    md.push_str("\nAttainment of both targets by the step the request arrived in:\n\n");
    md.push_str(&planner_replay::steps_table(&runs, schedule));
    for r in runs.iter().filter(|r| !r.label.starts_with("static")) {
        md.push_str(&format!("\nReplica timeline, {}:\n\n", r.label));
        md.push_str(&planner_replay::timeline_table(r));
    }
    print!("{md}");
    if let Some(path) = &args.markdown {
        write(path, &md)?;
    }
    if let Some(path) = &args.timeline_csv {
        write(path, &planner_replay::timeline_csv(&runs))?;
    }
    if let Some(path) = &args.out {
        let doc = json!({
            "kind": "planner", "title": title, "rate_schedule": schedule.to_string(),
            "isl": args.isl, "osl": args.osl, "requests": times.len(),
            "targets": {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms},
            "engine": engine, "profile": setup.profile,
            "base_replicas": base, "peak_replicas": peak, "runs": runs, "versus": versus,
        });
        write(path, &serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}

fn run_replay(args: ReplayArgs) -> anyhow::Result<()> {
    let w = &args.workload;
    let workload = w.workload()?;
    let rates = w.rates();
    // A closed loop sends each request when an earlier one ends: no times to compute.
    let times: Vec<Vec<f64>> = match args.concurrency {
        Some(_) => vec![Vec::new()],
        None => rates
            .iter()
            .map(|&rate| w.times_ms(&workload, rate))
            .collect::<anyhow::Result<_>>()?,
    };
    anyhow::ensure!(args.workers > 0, "--workers must be at least 1");
    args.router.check().map_err(anyhow::Error::msg)?;
    let engine = args.engine.config();
    engine.validate()?;
    let scheduler = SchedulerConfig {
        prefill_load_scale: args.router.overlap_score_weight,
        temperature: args.router.router_temperature,
        ..SchedulerConfig::default()
    };
    let approx = ApproxConfig {
        ttl: args.router.approx_ttl,
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
        (None, true) => Some(kv_block_bytes(&args.model_path, args.engine.block_size)?),
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
            if let Some(clients) = args.concurrency {
                let run =
                    replay::run_closed_loop(&workload, clients, &engine, args.workers, setup)?;
                these.push(run);
            }
            for tiers in tier_setups
                .iter()
                .filter(|_| !topologies && args.concurrency.is_none())
            {
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
        args.engine.num_gpu_blocks, args.engine.block_size
    );
    let graph = if topologies {
        let list: Vec<String> = args.topology.iter().map(Topology::to_string).collect();
        format!("graphs {}, engines of {blocks}", list.join(", "))
    } else {
        format!("{} engines x {blocks}", args.workers)
    };
    let mut title = format!(
        "Replay: {}; {}; {graph}; router overlap_score_weight {}, router_temperature {}",
        workload.describe(),
        w.describe_arrivals(args.concurrency),
        args.router.overlap_score_weight,
        args.router.router_temperature
    );
    let mut config = json!({
        "workers": args.workers,
        "engine": engine,
        "router": {"overlap_score_weight": args.router.overlap_score_weight,
                   "router_temperature": args.router.router_temperature,
                   "approx_ttl_s": args.router.approx_ttl.as_secs_f64()},
    });
    if !w.request_rate.is_empty() {
        config["request_rates"] = json!(w.request_rate);
    }
    if let Some(clients) = args.concurrency {
        config["concurrency"] = json!(clients);
    }
    if let Some(schedule) = &w.rate_schedule {
        config["rate_schedule"] = json!(schedule.to_string());
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
                let mut run = measure(&http, &args, &target, workload, plan, &args.url).await?;
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
                        let before = transfers::scrape_transfers(&http, &url).await;
                        let mut run =
                            measure(&http, &args, &target, workload.clone(), plan, mode).await?;
                        let after = transfers::scrape_transfers(&http, &url).await;
                        run.request_rate = *rate;
                        // A mode named as a graph (`agg4`, `2p2d`): its engines and KV
                        // transfers, as the picker counted them.
                        if let Ok(topology) = Topology::parse(mode) {
                            run.disagg =
                                Some(transfers::live_disagg(&run, topology, before, after));
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
    if let Some(schedule) = &w.rate_schedule {
        config["rate_schedule"] = json!(schedule.to_string());
    }
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

/// One live run: the load, then what `--ttft-target-ms`, `--itl-target-ms` and
/// `--watch-graph` ask for.
async fn measure(
    http: &reqwest::Client,
    args: &BenchArgs,
    target: &Target,
    workload: Arc<Workload>,
    plan: &Arrivals,
    label: &str,
) -> anyhow::Result<Report> {
    let watch = match &args.watch_graph {
        Some(url) => Some(GraphWatch::start(http, url).await?),
        None => None,
    };
    let records = bench::run_records(http, target, workload, plan).await?;
    let mut run = bench::report(label, &records);
    if let (Some(ttft_ms), Some(itl_ms)) = (args.ttft_target_ms, args.itl_target_ms) {
        let targets = SlaTargets { ttft_ms, itl_ms };
        run.attainment = Some(Attainment::of_records(&records, targets));
    }
    if let Some(watch) = watch {
        run.replicas = Some(watch.finish().await?);
    }
    Ok(run)
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
        if runs
            .iter()
            .any(|r| r.attainment.is_some() || r.replicas.is_some())
        {
            md.push_str("\nTargets and replicas:\n\n");
            md.push_str(&report::targets_table(runs));
        }
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
            _ => unreachable!(),
        }
    }

    fn planner(args: &[&str]) -> Result<PlannerArgs, clap::Error> {
        let argv = ["dynamo-e2e", "planner"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Planner(p) => Ok(p),
            _ => unreachable!(),
        }
    }

    #[test]
    fn planner_flags_parse_with_their_defaults() {
        let p = planner(&[]).unwrap();
        assert_eq!(p.rate_schedule.to_string(), "16x600,64x600,16x600");
        assert_eq!(
            p.planner,
            [
                PlannerMode::Throughput,
                PlannerMode::Load,
                PlannerMode::ThroughputLoad
            ]
        );
        assert_eq!(
            (p.isl, p.osl, p.ttft_ms, p.itl_ms),
            (3000, 150, 500.0, 50.0)
        );
        assert_eq!(
            (p.interval_s, p.load_interval_s, p.startup_s),
            (60.0, 5.0, 30.0)
        );
        assert_eq!(
            (p.router_mode, p.max_waiting_requests),
            (RouterMode::RoundRobin, None)
        );
        assert_eq!(
            p.predictor.kind,
            dynamo_planner::predict::PredictorKind::Arima
        );
        assert_eq!(p.load_target, LoadTarget::Throughput);
        assert!(!p.no_correction && !p.no_static_sweep);
        let p = planner(&[
            "--planner",
            "static:3,load",
            "--predictor",
            "moving-average:4",
            "--load-target",
            "latency",
            "--max-waiting-requests",
            "2",
            "--router-mode",
            "kv",
        ])
        .unwrap();
        assert_eq!(p.planner, [PlannerMode::Static(3), PlannerMode::Load]);
        assert_eq!(p.predictor.moving_average.window, 4);
        assert_eq!(p.load_target, LoadTarget::Latency);
        assert_eq!(
            (p.max_waiting_requests, p.router_mode),
            (Some(2), RouterMode::Kv)
        );
        for bad in [
            ["--planner", "static:0"],
            ["--rate-schedule", "-1x5"],
            ["--predictor", "arima:x"],
            ["--load-target", "x"],
        ] {
            assert!(planner(&bad).is_err(), "{bad:?}");
        }
    }

    fn replay(args: &[&str]) -> Result<ReplayArgs, clap::Error> {
        let argv = ["dynamo-e2e", "replay"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Replay(r) => Ok(r),
            _ => unreachable!(),
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
        // The replay's closed loop, as bench's, replaces the request rate.
        let closed = replay(&["--concurrency", "16"]).unwrap();
        assert_eq!(closed.concurrency, Some(16));
        assert_eq!(
            closed.workload.describe_arrivals(closed.concurrency),
            "16 requests in flight"
        );
        for other in [
            ["--request-rate", "2"],
            ["--sessions", "4"],
            ["--tiers", "off"],
            ["--topology", "2p2d"],
        ] {
            let args = ["--concurrency", "16", other[0], other[1]];
            assert!(replay(&args).is_err(), "{args:?}");
        }
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

    #[test]
    fn a_rate_schedule_sizes_the_run_and_bad_ones_are_refused_clearly() {
        let b = bench(&["--rate-schedule", "2x30,8x30,2x30", "--prefixes", "4"]).unwrap();
        let w = b.workload.workload().unwrap();
        let times = b.workload.times_ms(&w, b.workload.rates()[0]).unwrap();
        assert_eq!(b.workload.rates(), [None]);
        // About 60 + 240 + 60 requests; the workload grew from 4 x 16 to exactly that.
        assert_eq!(w.len(), times.len());
        assert!((300..420).contains(&times.len()), "{}", times.len());
        assert!(times.windows(2).all(|p| p[1] > p[0]) && times[times.len() - 1] < 90_000.0);
        let in_step = |a: f64, b: f64| times.iter().filter(|&&t| t >= a && t < b).count();
        assert!(in_step(30_000.0, 60_000.0) > 2 * in_step(0.0, 30_000.0));
        assert!(
            b.workload
                .describe_arrivals(None)
                .starts_with("poisson arrivals at 2x30,8x30,2x30 (req/s x s)")
        );
        // Evenly spaced, and the same in the replay.
        let r = replay(&["--rate-schedule", "1x2,4x1", "--arrival", "fixed"]).unwrap();
        let w = r.workload.workload().unwrap();
        assert_eq!(
            r.workload.times_ms(&w, None).unwrap(),
            [0.0, 1000.0, 2000.0, 2250.0, 2500.0, 2750.0]
        );
        // Sessions: the schedule starts them, and there must be enough.
        let s = bench(&[
            "--sessions",
            "3",
            "--rate-schedule",
            "1x2",
            "--arrival",
            "fixed",
        ])
        .unwrap();
        let w = s.workload.workload().unwrap();
        assert_eq!(w.conversations().unwrap().sessions, 2);
        let s = bench(&[
            "--sessions",
            "1",
            "--rate-schedule",
            "1x5",
            "--arrival",
            "fixed",
        ])
        .unwrap();
        let err = s.workload.workload().unwrap_err().to_string();
        assert!(err.contains("starts 5 sessions"), "{err}");
        // Bad schedules, and schedules with another rate, are refused with the reason.
        for (bad, says) in [
            ("2x", "the duration is missing"),
            ("-1x5", "the rate must be"),
            ("0x0", "the duration must be"),
        ] {
            let err = bench(&["--rate-schedule", bad]).unwrap_err().to_string();
            assert!(
                err.contains(says) && err.contains("RATExSECONDS"),
                "{bad}: {err}"
            );
        }
        assert!(bench(&["--rate-schedule", "2x60", "--request-rate", "3"]).is_err());
        assert!(bench(&["--rate-schedule", "2x60", "--concurrency", "3"]).is_err());
    }
}
