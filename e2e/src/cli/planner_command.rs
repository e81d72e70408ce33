//! `dynamo-e2e planner`: the planner's decisions replayed against simulated engines.

use super::*;

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
    /// as Dynamo runs them together), `static:N`, `scheduled[:LEAD]` (a timetable of the
    /// rate schedule's steps, LEAD seconds ahead to add replicas, or late if negative).
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
    #[command(flatten)]
    pub headroom: HeadroomKnobs,
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

pub(super) fn parse_predictor(s: &str) -> Result<PredictorConfig, String> {
    s.parse()
        .map_err(|e: dynamo_planner::predict::PredictorError| e.to_string())
}

pub(super) fn parse_load_target(s: &str) -> Result<LoadTarget, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "throughput" => Ok(LoadTarget::Throughput),
        "latency" => Ok(LoadTarget::Latency),
        _ => Err(format!("{s:?}: a load target is throughput or latency")),
    }
}

pub(super) fn run_planner(args: PlannerArgs) -> anyhow::Result<()> {
    let engine = EngineConfig {
        speedup_ratio: args.speedup_ratio,
        seed: args.seed,
        ..args.engine.config()?
    };
    engine.validate()?;
    anyhow::ensure!(
        args.isl > 0 && args.osl > 0,
        "--isl and --osl must be at least 1"
    );
    for (flag, v) in [("--ttft-ms", args.ttft_ms), ("--itl-ms", args.itl_ms)] {
        anyhow::ensure!(v.is_finite() && v > 0.0, "{flag} must be positive");
    }
    args.headroom.check().map_err(anyhow::Error::msg)?;
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
        headroom: args.headroom.clone(),
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
        "Planner replay: rate schedule {schedule} (req/s x s), {} arrivals, {} requests of ISL {} / OSL {}; targets TTFT {} ms, ITL {} ms; aggregated mocker engines ({} blocks of {} tokens, max_num_seqs {}, max_num_batched_tokens {}, speedup {}, {}), {} routing{}; planner interval {} s (load mode {} s), predictor {}, correction {}, startup {} s, budget {} GPUs",
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
        engine.timing.describe(),
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
