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

#[test]
fn the_replays_engines_run_on_the_hardware_model_the_mock_engine_has() {
    let default = replay(&[]).unwrap().engine.config().unwrap();
    assert_eq!(default.timing, TimingModel::Polynomial);
    assert_eq!(default.num_gpu_blocks, 16384);
    assert_eq!(hardware_block_bytes(&default), None);

    let hardware = [
        "--perf-model",
        "hardware",
        "--gpu",
        "H100_SXM",
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
    ];
    let engine = replay(&hardware).unwrap().engine.config().unwrap();
    let TimingModel::Hardware(e) = &engine.timing else {
        panic!("{:?}", engine.timing)
    };
    assert_eq!((e.gpu.name.as_str(), e.tp), ("H100_SXM", 1));
    // The blocks the mock engine's memory fit gives with the same flags.
    let (fitted, _) = EngineConfig::default()
        .on_hardware(e.as_ref().clone(), None)
        .unwrap();
    assert_eq!(engine.num_gpu_blocks, fitted.num_gpu_blocks);
    // Llama 3.1 8B in BF16: 32 layers x 8 KV heads x 128 x 2 bytes x K and V = 128 KiB a
    // token, 8 MiB a block of 64.
    assert_eq!(hardware_block_bytes(&engine), Some(8 << 20));
    assert!(engine.timing.describe().contains("H100_SXM"));

    let explicit = replay(&[&hardware[..], &["--num-gpu-blocks", "100"]].concat()).unwrap();
    assert_eq!(explicit.engine.config().unwrap().num_gpu_blocks, 100);
    let no_model = replay(&hardware[..4]).unwrap().engine.config().unwrap_err();
    assert!(no_model.to_string().contains("--model"), "{no_model}");
    let no_gpu = replay(&["--perf-model", "hardware", "--model", "Qwen/Qwen3-8B"]).unwrap();
    let why = no_gpu.engine.config().unwrap_err();
    assert!(why.to_string().contains("--gpu"), "{why}");
}
