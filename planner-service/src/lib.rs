//! `dynamo planner`: the SLA planner service (`DESIGN.md`, "Planner"). Every interval it
//! reads the graph's replicas ([`target`]) and Prometheus ([`source`]), decides with the
//! pure core in `dynamo-planner` ([`cycle`]), writes the new replicas (unless advisory) and
//! exports what it did ([`metrics`]). docs/planner.md is the user's guide.

pub mod cycle;
mod kube;
mod local;
pub mod metrics;
pub mod source;
pub mod target;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use dynamo_planner::decide::{Limits, LoadTarget, SlaTargets};
use dynamo_planner::profile::Profile;
use dynamo_server::metrics_endpoint;
use dynamo_wiring::planner::{LoadTargetArg, ModeArg, PlannerArgs};
use tokio::net::TcpListener;

use cycle::{LoadMode, Mode, Planner, Settings, ThroughputMode, Tick};
use metrics::Metrics;
use source::Prometheus;
use target::Target;

/// The settings of `args`, with the profiles read and checked.
pub fn settings(args: &PlannerArgs) -> anyhow::Result<Settings> {
    let interval = args.interval();
    if interval.is_zero() {
        bail!("--interval must be above 0");
    }
    for (flag, v) in [("--ttft-ms", args.ttft_ms), ("--itl-ms", args.itl_ms)] {
        if !(v.is_finite() && v > 0.0) {
            bail!("{flag} must be a positive number of milliseconds, not {v}");
        }
    }
    args.headroom.check().map_err(anyhow::Error::msg)?;
    let throughput = || -> anyhow::Result<ThroughputMode> {
        let read = |specific: &Option<PathBuf>, role: &str| -> anyhow::Result<Profile> {
            let path = specific.as_ref().or(args.profile.as_ref()).with_context(|| {
                format!(
                    "throughput mode needs the {role} engines' profile: --profile or --{role}-profile"
                )
            })?;
            read_profile(path)
        };
        Ok(ThroughputMode {
            prefill_profile: read(&args.prefill_profile, "prefill")?,
            decode_profile: read(&args.decode_profile, "decode")?,
            correction: !args.no_correction,
        })
    };
    let load = || -> anyhow::Result<LoadMode> {
        if !(args.context_length.is_finite() && args.context_length > 0.0) {
            bail!("--context-length must be a positive number of tokens");
        }
        Ok(LoadMode {
            target: match args.load_target {
                LoadTargetArg::Throughput => LoadTarget::Throughput,
                LoadTargetArg::Latency => LoadTarget::Latency,
            },
            context_length: args.context_length,
        })
    };
    if args.load_interval.is_some() && args.mode != ModeArg::ThroughputLoad {
        bail!(
            "--load-interval is throughput+load's (--mode throughput+load); load mode's interval is --interval"
        );
    }
    let mode = match args.mode {
        ModeArg::Throughput => Mode::Throughput(throughput()?),
        ModeArg::Load => Mode::Load(load()?),
        ModeArg::ThroughputLoad => {
            let load_interval = args.load_interval();
            // Dynamo's rule too: the load loop runs between throughput decisions.
            if load_interval.is_zero() || load_interval >= interval {
                bail!(
                    "--load-interval ({load_interval:?}) must be above 0 and below --interval ({interval:?})"
                );
            }
            Mode::ThroughputLoad {
                throughput: throughput()?,
                load: load()?,
                load_interval_s: load_interval.as_secs_f64(),
            }
        }
    };
    Ok(Settings {
        mode,
        targets: SlaTargets {
            ttft_ms: args.ttft_ms,
            itl_ms: args.itl_ms,
        },
        limits: Limits {
            min_endpoint: args.min_endpoint,
            max_gpu_budget: args.max_gpu_budget,
            max_step: args.max_step,
        },
        prefill_gpus: args.prefill_gpus.max(1),
        decode_gpus: args.decode_gpus.max(1),
        interval_s: interval.as_secs_f64(),
        headroom: args.headroom.clone(),
    })
}

fn read_profile(path: &Path) -> anyhow::Result<Profile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the profile {}", path.display()))?;
    Profile::from_json(&text).with_context(|| format!("profile {}", path.display()))
}

/// Runs the planner until SIGINT/SIGTERM (logging is the caller's: `dynamo --log-format`).
pub fn run(args: PlannerArgs) -> anyhow::Result<()> {
    // Every setting is checked before anything starts: a bad profile is a clear exit.
    let settings = settings(&args)?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(serve(args, settings))
}

async fn serve(args: PlannerArgs, settings: Settings) -> anyhow::Result<()> {
    let source = Prometheus::new(
        &args.prometheus,
        args.model.as_deref(),
        &args.prometheus_access,
    )?;
    let target = match (&args.admin_url, &args.graph) {
        (Some(url), _) => Target::Local(local::LocalTarget::new(url, args.admin_token.clone())),
        (None, Some(graph)) => {
            let client = ::kube::Client::try_default()
                .await
                .context("connecting to the API server")?;
            let namespace = args
                .namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_string());
            Target::Kube(Box::new(kube::KubeTarget::new(client, &namespace, graph)))
        }
        (None, None) => bail!("give --admin-url (a local graph) or --graph (a cluster graph)"),
    };
    let metrics = Arc::new(Metrics::new(
        settings.targets,
        args.advisory,
        settings.interval_s,
    ));
    let listener = TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("binding {}", args.metrics_addr))?;
    let scraped = metrics.clone();
    tokio::spawn(metrics_endpoint::serve(listener, move || scraped.encode()));

    let loops = settings.loops();
    let mut planner = Planner::new(settings, &args.predictor).map_err(anyhow::Error::msg)?;
    tracing::info!(
        mode = ?args.mode,
        loops = ?loops,
        prometheus = %args.prometheus,
        advisory = args.advisory,
        metrics = %args.metrics_addr,
        "planner started; first decision after the startup delay and one interval"
    );
    let shutdown = dynamo_server::logged_shutdown_signal();
    tokio::pin!(shutdown);
    tokio::select! {
        () = tokio::time::sleep(args.startup_delay) => {}
        () = &mut shutdown => return Ok(()),
    }
    let started = tokio::time::Instant::now();
    // One ticker per kind of decision; both run on this task, one decision at a time.
    let mut tickers: Vec<(Tick, tokio::time::Interval)> = loops
        .into_iter()
        .map(|(tick, seconds)| {
            let every = Duration::from_secs_f64(seconds);
            let mut ticker = tokio::time::interval_at(started + every, every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            (tick, ticker)
        })
        .collect();
    loop {
        let next = futures::future::select_all(tickers.iter_mut().map(|(tick, ticker)| {
            Box::pin(async move {
                ticker.tick().await;
                *tick
            })
        }));
        tokio::select! {
            (tick, _, _) = next => {
                let now_s = started.elapsed().as_secs_f64();
                plan_once(&mut planner, tick, now_s, &source, &target, &metrics, args.advisory).await;
            }
            () = &mut shutdown => return Ok(()),
        }
    }
}

/// One decision: read, decide, write (unless advisory or held), record.
async fn plan_once(
    planner: &mut Planner,
    tick: Tick,
    now_s: f64,
    source: &Prometheus,
    target: &Target,
    metrics: &Metrics,
    advisory: bool,
) {
    let view = match target.read().await {
        Ok(view) => view,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the graph's replicas; holding");
            return;
        }
    };
    let (outcome, traffic) = match tick {
        Tick::Throughput => {
            let interval_s = planner.settings().interval_s;
            let traffic = source.traffic(interval_s).await.map_err(|e| e.to_string());
            if let Err(e) = &traffic {
                tracing::warn!(error = %e, "frontend metrics unreadable; holding");
            }
            (
                planner.plan_throughput(now_s, &view, &traffic),
                traffic.ok(),
            )
        }
        Tick::Load => {
            let interval_s = planner.settings().interval_s;
            let load = source.load(interval_s).await.map_err(|e| e.to_string());
            if let Err(e) = &load {
                tracing::warn!(error = %e, "engine metrics unreadable; holding");
            }
            (planner.plan_load(&view, &load), None)
        }
    };
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            tracing::error!(error = %e, "the graph's shape is not one the planner can set; holding");
            return;
        }
    };
    let decision = &outcome.decision;
    metrics.record(
        Some(&view),
        traffic.as_ref(),
        outcome.forecast.as_ref(),
        decision,
    );
    tracing::info!(
        ?tick,
        decision = %decision,
        capped = decision.capped,
        advisory,
        forecast = ?outcome.forecast,
        "planner decision"
    );
    if advisory || decision.is_hold() {
        return;
    }
    for (service, replicas) in cycle::writes(&view, decision) {
        match target.write(&service, replicas).await {
            Ok(()) => {
                metrics.write("ok");
                tracing::info!(service, replicas, "scaled");
            }
            Err(e) => {
                metrics.write(e.label());
                // The rest waits for the next interval, which reads the graph again.
                tracing::warn!(service, replicas, error = %e, "scale write failed");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        planner: PlannerArgs,
    }

    fn parse(args: &[&str]) -> Result<PlannerArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("planner").chain(args.iter().copied()))
            .map(|c| c.planner)
    }

    #[test]
    fn defaults_are_dynamos_and_a_target_is_required() {
        let args = parse(&["--graph", "g", "--mode", "load"]).unwrap();
        assert_eq!(args.interval(), Duration::from_secs(5));
        let settings = settings(&args).unwrap();
        assert_eq!(
            (settings.targets.ttft_ms, settings.targets.itl_ms),
            (500.0, 50.0)
        );
        assert_eq!(settings.limits.max_gpu_budget, 8);
        let args = parse(&["--admin-url", "http://127.0.0.1:1"]).unwrap();
        assert_eq!(args.interval(), Duration::from_secs(180));
        assert!(parse(&["--mode", "load"]).is_err());
        assert!(parse(&["--graph", "g", "--predictor", "prophet"]).is_err());
    }

    #[test]
    fn throughput_load_runs_both_loops_the_load_one_between() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.json");
        std::fs::write(
            &path,
            r#"{"gpus_per_engine": 1,
                "prefill": [{"isl": 100, "ttft_ms": 10.0, "throughput_per_gpu": 10000.0}],
                "decode": [{"context_length": 100, "concurrency": 1, "itl_ms": 10.0, "throughput_per_gpu": 1000.0}]}"#,
        )
        .unwrap();
        let path = path.to_str().unwrap();
        let both = [
            "--graph",
            "g",
            "--mode",
            "throughput+load",
            "--profile",
            path,
        ];
        let loops = settings(&parse(&both).unwrap()).unwrap().loops();
        assert_eq!(loops, [(Tick::Throughput, 180.0), (Tick::Load, 5.0)]);
        let quick = [&both[..], &["--interval", "10s", "--load-interval", "2s"]].concat();
        let loops = settings(&parse(&quick).unwrap()).unwrap().loops();
        assert_eq!(loops, [(Tick::Throughput, 10.0), (Tick::Load, 2.0)]);
        // The load loop must run between throughput decisions.
        let slow = [&both[..], &["--interval", "10s", "--load-interval", "10s"]].concat();
        let err = settings(&parse(&slow).unwrap()).unwrap_err();
        assert!(err.to_string().contains("--load-interval"), "{err}");
        // It needs the profile as throughput mode does.
        let err = settings(&parse(&["--graph", "g", "--mode", "throughput+load"]).unwrap());
        assert!(format!("{:#}", err.unwrap_err()).contains("--profile"));
        // --load-interval belongs to throughput+load only.
        let load = ["--graph", "g", "--mode", "load", "--load-interval", "2s"];
        let err = settings(&parse(&load).unwrap()).unwrap_err();
        assert!(err.to_string().contains("--interval"), "{err}");
    }

    #[test]
    fn a_bad_profile_is_refused_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let missing = settings(&parse(&["--graph", "g"]).unwrap()).unwrap_err();
        assert!(format!("{missing:#}").contains("--profile"), "{missing:#}");
        let path = dir.path().join("profile.json");
        std::fs::write(&path, r#"{"gpus_per_engine": 1, "prefill": []}"#).unwrap();
        let path = path.to_str().unwrap();
        let bad = settings(&parse(&["--graph", "g", "--profile", path]).unwrap()).unwrap_err();
        assert!(format!("{bad:#}").contains("profile.json"), "{bad:#}");
        let nan =
            settings(&parse(&["--graph", "g", "--mode", "load", "--ttft-ms", "NaN"]).unwrap())
                .unwrap_err();
        assert!(nan.to_string().contains("--ttft-ms"), "{nan}");
    }
}
