//! The `dynamo-e2e` command line: `bench` (live, over HTTP) and `replay` (simulated).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use dynamo_kvcache::{ApproxConfig, RouterMode, SchedulerConfig};
use dynamo_llm::ModelDir;
use dynamo_mocker::EngineConfig;
use serde::Serialize;
use serde_json::json;

use crate::arrivals::{self, Arrivals};
use crate::client::{Api, Target, Words};
use crate::launch::{self, Launched};
use crate::report::{self, Report};
use crate::workload::{SharedPrefix, Workload};
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
    /// Requests per second (open loop); with a trace, replaces its timestamps.
    #[arg(long, env = "DYNAMO_E2E_REQUEST_RATE")]
    pub request_rate: Option<f64>,
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
    /// Router modes to launch, in order (with `--launch`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kv,approx,round-robin",
        env = "DYNAMO_E2E_MODES"
    )]
    pub modes: Vec<RouterMode>,
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
    #[command(flatten)]
    pub output: OutputArgs,
}

impl WorkloadArgs {
    fn workload(&self) -> anyhow::Result<Workload> {
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

    /// Open-loop times: `--request-rate` if given, else the trace's own (scaled).
    fn times_ms(&self, workload: &Workload) -> anyhow::Result<Vec<f64>> {
        let n = workload.len();
        match (self.request_rate, workload.timestamps_ms()) {
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
        match (concurrency, self.request_rate) {
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
    let times = w.times_ms(&workload)?;
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
    let mut runs = Vec::new();
    for &mode in &args.modes {
        let setup = replay::RouterSetup {
            mode,
            scheduler,
            approx,
            seed: w.seed,
        };
        let run = replay::run(&workload, &times, &engine, args.workers, setup)?;
        let wall_s = run.replay.map_or(0.0, |d| d.wall_s);
        eprintln!("replay {mode}: computed in {wall_s:.2} s");
        runs.push(run);
    }
    let title = format!(
        "Replay: {}; {}; {} engines x {} blocks of {} tokens; router prefill_load_scale {}, temperature {}",
        workload.describe(),
        w.describe_arrivals(None),
        args.workers,
        args.num_gpu_blocks,
        args.block_size,
        args.prefill_load_scale,
        args.temperature
    );
    let config = json!({
        "workers": args.workers,
        "engine": engine,
        "router": {"prefill_load_scale": args.prefill_load_scale, "temperature": args.temperature,
                   "approx_ttl_s": args.approx_ttl_s},
    });
    publish("replay", &title, config, &runs, &args.output)
}

async fn run_bench(args: BenchArgs) -> anyhow::Result<()> {
    let w = &args.workload;
    let workload = Arc::new(w.workload()?);
    let plan = match args.concurrency {
        Some(c) => Arrivals::Concurrency(c),
        None => Arrivals::At(w.times_ms(&workload)?),
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
            runs.push(bench::run(&http, &target, workload.clone(), &plan, &args.url).await?);
        }
        Some(template) => {
            for mode in &args.modes {
                let port = launch::free_port()?;
                let mut graph = Launched::start(launch::expand(template, mode.as_str(), port))?;
                eprintln!("bench {mode}: started `{}`", graph.command);
                let url = format!("http://127.0.0.1:{port}");
                let run = async {
                    graph
                        .wait_healthy(&http, &url, Duration::from_secs_f64(args.health_timeout_s))
                        .await?;
                    let target = target(&http, &args, &url, words.clone()).await?;
                    bench::run(&http, &target, workload.clone(), &plan, mode.as_str()).await
                };
                let result = tokio::select! {
                    r = run => r,
                    _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
                };
                let stopped = graph.stop(Duration::from_secs(30)).await?;
                eprintln!("bench {mode}: {stopped:?}");
                runs.push(result?);
            }
        }
    }
    let title = format!(
        "Bench: {}; {}; {:?} API",
        workload.describe(),
        w.describe_arrivals(args.concurrency),
        args.api
    );
    let config = json!({"url": args.url, "launch": args.launch, "api": args.api});
    publish("bench", &title, config, &runs, &args.output)
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

/// Prints the tables (and ratios against round-robin when it ran) and writes the files.
fn publish(
    kind: &str,
    title: &str,
    config: serde_json::Value,
    runs: &[Report],
    output: &OutputArgs,
) -> anyhow::Result<()> {
    let ratios = report::ratios(runs, RouterMode::RoundRobin.as_str());
    let mut md = format!("### {title}\n\n{}", report::markdown_table(runs));
    if !ratios.is_empty() {
        md.push('\n');
        md.push_str(&report::ratio_table(&ratios));
    }
    for r in runs.iter().filter(|r| !r.error_samples.is_empty()) {
        md.push_str(&format!(
            "\n{} errors: {}\n",
            r.label,
            r.error_samples.join("; ")
        ));
    }
    print!("{md}");
    if let Some(path) = &output.markdown {
        write(path, &md)?;
    }
    if let Some(path) = &output.out {
        let doc =
            json!({"kind": kind, "title": title, "config": config, "runs": runs, "ratios": ratios});
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
