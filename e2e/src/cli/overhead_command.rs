//! `dynamo-e2e overhead`: CPU per request of the live serving path.

use super::*;

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

pub(super) async fn run_overhead(args: OverheadArgs) -> anyhow::Result<()> {
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
