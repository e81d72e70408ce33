//! `dynamo-e2e bench`: live load over HTTP against a running graph or graphs it launches.

use std::io::Write as _;

use dynamo_loadgen::client::RequestRecord;

use super::*;

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
    /// Write one JSON line per request here, every run's in turn: its run and request
    /// rate, when it was sent (ms from the run's start), TTFT, mean ITL, end-to-end time,
    /// tokens and error; where a run's breaches fall.
    #[arg(long, env = "DYNAMO_E2E_RECORDS")]
    pub records: Option<PathBuf>,
    /// How long a launched graph may take to become healthy.
    #[arg(long, default_value_t = 120.0, env = "DYNAMO_E2E_HEALTH_TIMEOUT_S")]
    pub health_timeout_s: f64,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub(super) async fn run_bench(args: BenchArgs) -> anyhow::Result<()> {
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
    if let Some(path) = &args.records {
        std::fs::File::create(path).with_context(|| format!("--records {}", path.display()))?;
    }
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
                let run = measure(&http, &args, &target, workload, (*rate, plan), &args.url);
                runs.push(run.await?);
            }
        }
        Some(template) => {
            // A fresh graph per mode and rate: nothing cached from the run before.
            for mode in &args.modes {
                for (rate, plan) in &plans {
                    let at = rate.map_or_else(String::new, |r| format!(" at {r} req/s"));
                    let port = dynamo_server::free_port()?;
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
                        let plan = (*rate, plan);
                        let mut run =
                            measure(&http, &args, &target, workload.clone(), plan, mode).await?;
                        let after = transfers::scrape_transfers(&http, &url).await;
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

/// One live run at a request rate (none: a closed loop): the load, then what
/// `--ttft-target-ms`, `--itl-target-ms`, `--watch-graph` and `--records` ask for.
pub(super) async fn measure(
    http: &reqwest::Client,
    args: &BenchArgs,
    target: &Target,
    workload: Arc<Workload>,
    (rate, plan): (Option<f64>, &Arrivals),
    label: &str,
) -> anyhow::Result<Report> {
    let watch = match &args.watch_graph {
        Some(url) => Some(GraphWatch::start(http, url).await?),
        None => None,
    };
    let records = bench::run_records(http, target, workload, plan).await?;
    if let Some(path) = &args.records {
        append_records(path, label, rate, &records)
            .with_context(|| format!("--records {}", path.display()))?;
    }
    let mut run = bench::report(label, &records);
    run.request_rate = rate;
    if let (Some(ttft_ms), Some(itl_ms)) = (args.ttft_target_ms, args.itl_target_ms) {
        let targets = SlaTargets { ttft_ms, itl_ms };
        run.attainment = Some(Attainment::of_records(&records, targets));
    }
    if let Some(watch) = watch {
        run.replicas = Some(watch.finish().await?);
    }
    Ok(run)
}

/// `records` as JSON lines at the end of `path`.
fn append_records(
    path: &Path,
    run: &str,
    rate: Option<f64>,
    records: &[RequestRecord],
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::OpenOptions::new().append(true).open(path)?);
    for r in records {
        let line = json!({
            "run": run, "request_rate": rate, "sent_ms": r.sent_ms, "ttft_ms": r.ttft_ms,
            "mean_itl_ms": r.mean_itl_ms(), "e2e_ms": r.e2e_ms, "output_tokens": r.output_tokens,
            "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
            "error": r.error, "session": r.session, "turn": r.turn,
        });
        writeln!(out, "{line}")?;
    }
    out.flush()
}

/// The target at `url`, its model named by `--model` or asked of `/v1/models`.
pub(super) async fn target(
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
