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
use dynamo_mocker::args::{EngineShapeArgs, TimingArgs};
use dynamo_mocker::{EngineConfig, KvBlocksConfig, KvGeometry, TimingModel};
use dynamo_perfmodel::ModelArch;
use serde::Serialize;
use serde_json::json;

use dynamo_mocker::profile::{ProfileSweep, planner_profile};
use dynamo_planner::decide::{Limits, LoadTarget, SlaTargets};
use dynamo_planner::knobs::HeadroomKnobs;
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

mod bench_command;
mod overhead_command;
mod planner_command;
mod replay_command;

pub use bench_command::BenchArgs;
use bench_command::run_bench;
pub use overhead_command::OverheadArgs;
use overhead_command::run_overhead;
pub use planner_command::PlannerArgs;
use planner_command::run_planner;
use replay_command::run_replay;
pub use replay_command::{ReplayArgs, TierSpec};

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

/// The simulated engines' shape and step times (the replays').
#[derive(Args, Debug, Clone)]
pub struct SimEngineArgs {
    #[command(flatten)]
    pub shape: EngineShapeArgs,
    /// The model `--perf-model hardware` runs: a name of the performance model's catalog
    /// (docs/perfmodel.md), e.g. meta-llama/Llama-3.1-8B-Instruct.
    #[arg(long, env = "DYNAMO_E2E_MODEL")]
    pub model: Option<String>,
    #[command(flatten)]
    pub timing: TimingArgs,
}

impl SimEngineArgs {
    fn config(&self) -> anyhow::Result<EngineConfig> {
        let config = self.shape.apply(EngineConfig::default());
        let model = || {
            let name = self.model.as_deref().context(
                "--perf-model hardware needs --model (a catalog name, e.g. meta-llama/Llama-3.1-8B-Instruct)",
            )?;
            Ok(ModelArch::by_name(name)?)
        };
        self.timing.apply(config, model, self.shape.num_gpu_blocks)
    }
}

/// Real KV bytes of one block of `block_size` tokens of the hardware model's model, all
/// its GPUs together: what a transfer between two engines moves.
fn hardware_block_bytes(engine: &EngineConfig) -> Option<u64> {
    match &engine.timing {
        TimingModel::Hardware(e) => {
            Some(e.kv_bytes_per_token_per_gpu() * e.tp * engine.block_size as u64)
        }
        _ => None,
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
            "\nGraphs (KV transfer: a prefill's end to its KV at the decode engine, ms; per GPU: output tok/s / the graph's GPUs; vs baseline ({baseline}) at the same rate: above 1 is better):\n\n"
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

fn load_words(model_path: &Path) -> anyhow::Result<Words> {
    let model = ModelDir::load(model_path, None)
        .with_context(|| format!("loading the tokenizer from {}", model_path.display()))?;
    Words::from_model(&model)
}

#[cfg(test)]
mod tests;
