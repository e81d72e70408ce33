//! The planner in the loop of a simulated graph (`dynamo_e2e::planner_replay`): what it
//! does under a load that steps up 4x and back down, and under a constant one. Behaviour
//! only, in simulated time: the same figures on any host.
//!
//! The engines are the mocker's, 10x slower than its modelled GPU (so a few hundred
//! simulated seconds are a few thousand requests) on 512-token prompts with 32-token
//! answers; the targets are the planner's defaults scaled alike (TTFT 5 s, ITL 500 ms).
//! The profile sizes one engine at about 1.9 requests/s: the step from 1.25 to 5 req/s
//! takes it from 1 replica to 3, each rate well inside its band (not at a rounding edge,
//! where a window's Poisson noise would flip it).

use std::time::Duration;

use dynamo_e2e::planner_replay::{
    PlannerMode, PlannerRun, PlannerSetup, compare, simulate, timeline_csv,
};
use dynamo_e2e::replay::RouterSetup;
use dynamo_kvcache::{ApproxConfig, RouterMode, SchedulerConfig};
use dynamo_loadgen::arrivals::{RateSchedule, poisson_schedule};
use dynamo_loadgen::workload::{SharedPrefix, Workload};
use dynamo_mocker::EngineConfig;
use dynamo_mocker::profile::{ProfileSweep, planner_profile};
use dynamo_planner::decide::{Limits, LoadTarget, SlaTargets};
use dynamo_planner::knobs::HeadroomKnobs;
use dynamo_planner::predict::{PredictorConfig, PredictorKind};

const ISL: usize = 512;
const OSL: usize = 32;

fn engine() -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: 2048,
        block_size: 16,
        speedup_ratio: 0.1,
        ..EngineConfig::default()
    }
}

fn setup() -> PlannerSetup {
    let engine = engine();
    let sweep = ProfileSweep {
        isls: vec![128, 256, 512, 1024, 2048],
        context_lengths: vec![256, 512, 1024],
        concurrencies: vec![1, 2, 4, 8, 16, 32, 64],
        decode_steps: 3,
        gpus_per_engine: 1,
    };
    PlannerSetup {
        profile: planner_profile(&engine, &sweep).unwrap(),
        engine,
        router: RouterSetup {
            mode: RouterMode::RoundRobin,
            scheduler: SchedulerConfig::default(),
            approx: ApproxConfig::default(),
            seed: 1,
        },
        targets: SlaTargets {
            ttft_ms: 5000.0,
            itl_ms: 500.0,
        },
        limits: Limits {
            max_gpu_budget: 16,
            ..Limits::default()
        },
        predictor: PredictorConfig::new(PredictorKind::Constant),
        correction: true,
        interval_s: 20.0,
        load_interval_s: 5.0,
        load_target: LoadTarget::Throughput,
        context_length: 4096.0,
        startup_s: 10.0,
        initial_replicas: 1,
        max_waiting_requests: None,
        headroom: DYNAMO_FORMULA,
    }
}

/// Dynamo's throughput formula: engines filled to their profiled capacity, scale-downs at
/// once. The tests below pin its counts; `headroom_...` tests ours against it.
const DYNAMO_FORMULA: HeadroomKnobs = HeadroomKnobs {
    target_utilization: 1.0,
    scale_down_window: Duration::ZERO,
};

/// `schedule`'s Poisson arrivals (seed 3) of distinct prompts.
fn traffic(schedule: &RateSchedule) -> (Workload, Vec<f64>) {
    let times = poisson_schedule(schedule, 3);
    let workload = Workload::shared_prefix(SharedPrefix {
        prefixes: times.len(),
        suffixes: 1,
        prefix_tokens: 0,
        unique_tokens: ISL,
        output_tokens: OSL,
        seed: 3,
    })
    .unwrap();
    (workload, times)
}

fn run(schedule: &str, setup: &PlannerSetup, mode: PlannerMode) -> PlannerRun {
    let schedule = RateSchedule::parse(schedule).unwrap();
    let (workload, times) = traffic(&schedule);
    simulate(&workload, &times, &schedule, setup, mode).unwrap()
}

/// The replicas set at `t_s` (the last timeline point at or before it).
fn replicas_at(run: &PlannerRun, t_s: f64) -> u32 {
    run.timeline
        .iter()
        .take_while(|p| p.t_s <= t_s)
        .last()
        .map_or(0, |p| p.replicas)
}

const STEP: &str = "1.25x120,5x240,1.25x240";

#[test]
fn the_profile_sizes_the_step_at_about_four_times_the_base() {
    let s = setup();
    let isl = ISL as f64;
    let osl = OSL as f64;
    assert_eq!(s.replicas_for(1.25, isl, osl), 1);
    assert_eq!(s.replicas_for(5.0, isl, osl), 3);
    // The band edges, for the rates the tests pick.
    assert_eq!(s.replicas_for(1.8, isl, osl), 1);
    assert_eq!(s.replicas_for(2.0, isl, osl), 2);
    assert_eq!(s.replicas_for(3.8, isl, osl), 2);
    assert_eq!(s.replicas_for(5.7, isl, osl), 3);
}

#[test]
fn throughput_mode_scales_up_during_the_step_and_back_down_after_it() {
    let s = setup();
    let r = run(STEP, &s, PlannerMode::Throughput);
    assert_eq!((r.completed, r.rejected), (r.requests, 0), "{r:#?}");
    // Before the step: the one replica it started with.
    assert_eq!(replicas_at(&r, 119.0), 1, "{:?}", r.timeline);
    // The first interval that saw the step (120-140 s) scales up at 140 s; its engines
    // serve 10 s later. During the step the planner holds at least 3.
    let up = r
        .scalings
        .iter()
        .find(|x| x.to > x.from)
        .expect("a scale-up");
    assert_eq!(up.t_s, 140.0, "{:?}", r.scalings);
    assert!(replicas_at(&r, 300.0) >= 3, "{:?}", r.timeline);
    let serving_then = r
        .timeline
        .iter()
        .take_while(|p| p.t_s <= 300.0)
        .last()
        .unwrap();
    assert_eq!(serving_then.serving, serving_then.replicas);
    // After the step (360 s): back down within a few intervals, to what the base needs.
    let down = r
        .scalings
        .iter()
        .find(|x| x.t_s > 360.0 && x.to < x.from)
        .expect("a scale-down");
    assert!(down.t_s <= 360.0 + 3.0 * s.interval_s, "{:?}", r.scalings);
    assert!(replicas_at(&r, 599.0) <= 2, "{:?}", r.timeline);
    // Within the targets before the step and well after it.
    assert!(r.per_step[0].both_pct() > 95.0, "{:?}", r.per_step);
    assert!(r.per_step[2].both_pct() > 95.0, "{:?}", r.per_step);
    // Decisions come one interval apart.
    assert!(
        r.scalings
            .windows(2)
            .all(|w| w[1].t_s - w[0].t_s >= s.interval_s),
        "{:?}",
        r.scalings
    );
    // The timeline CSV has a row per change.
    let csv = timeline_csv(std::slice::from_ref(&r));
    assert_eq!(csv.lines().count(), 1 + r.timeline.len());
    assert!(
        csv.starts_with("run,t_s,replicas,serving,starting,draining\nthroughput,0.000,1,1,0,0\n")
    );
}

#[test]
fn the_peak_static_count_costs_no_less_and_the_planner_beats_what_its_cost_buys() {
    let s = setup();
    let planner = run(STEP, &s, PlannerMode::Throughput);
    let peak = s.replicas_for(5.0, ISL as f64, OSL as f64);
    let statics: Vec<PlannerRun> = (1..=peak.max(planner.max_replicas))
        .map(|n| run(STEP, &s, PlannerMode::Static(n)))
        .collect();
    let at_peak = &statics[peak as usize - 1];
    assert!(
        at_peak.gpu_seconds >= planner.gpu_seconds,
        "{} vs {}",
        at_peak.gpu_seconds,
        planner.gpu_seconds
    );
    // A static count costs its engines for the whole run.
    for (n, r) in statics.iter().enumerate() {
        let expected = (n + 1) as f64 * r.duration_s;
        assert!(
            (r.gpu_seconds - expected).abs() < 1e-6,
            "{}: {} vs {expected}",
            r.label,
            r.gpu_seconds
        );
        assert_eq!(r.replica_changes(), 0);
    }
    // The static count the planner's GPU-seconds buy (rounded up) breaches more.
    let mut all = vec![planner.clone()];
    all.extend(statics.iter().cloned());
    let versus = compare(&all, peak);
    let same_cost = versus.iter().find(|v| v.against == "same cost").unwrap();
    assert!(same_cost.static_gpu_seconds >= planner.gpu_seconds);
    assert!(
        same_cost.static_breaches > planner.breaches(),
        "{versus:#?}"
    );
    let best = versus.iter().find(|v| v.against == "best static").unwrap();
    let best_run = &statics[best.static_replicas as usize - 1];
    assert!(
        best_run.attainment.both_pct() >= planner.attainment.both_pct()
            || best.static_replicas == statics.len() as f64
    );
    assert!(
        versus
            .iter()
            .any(|v| v.against == "peak" && v.static_replicas == f64::from(peak))
    );
}

#[test]
fn load_mode_reacts_to_the_step_within_seconds() {
    let s = setup();
    let r = run(STEP, &s, PlannerMode::Load);
    assert_eq!(r.completed, r.requests);
    // Load mode looks every 5 s: its first scale-up after the step comes within a few
    // looks, before throughput mode's first interval would even end.
    let up = r
        .scalings
        .iter()
        .find(|x| x.t_s >= 120.0 && x.to > x.from)
        .expect("a scale-up in the step");
    assert!(up.t_s < 140.0, "{:?}", r.scalings);
    assert!(r.max_replicas >= 2);
    // One replica at a time, and none while the last one starts (10 s).
    assert!(r.scalings.iter().all(|x| x.to.abs_diff(x.from) == 1));
    assert!(r.scalings.windows(2).all(|w| w[1].t_s > w[0].t_s));
}

#[test]
fn a_timetable_scales_at_the_steps_early_to_add_and_late_both_ways() {
    let s = setup();
    let at = |mode: PlannerMode| {
        let r = run(STEP, &s, mode);
        assert_eq!((r.completed, r.rejected), (r.requests, 0), "{mode}");
        r.scalings
            .iter()
            .map(|x| (x.t_s, x.from, x.to))
            .collect::<Vec<_>>()
    };
    // The profile's counts for 1.25 and 5 req/s: 1 and 3.
    assert_eq!(
        at(PlannerMode::Scheduled { lead_s: 0 }),
        [(120.0, 1, 3), (360.0, 3, 1)]
    );
    // Ahead to add, at the step to remove.
    assert_eq!(
        at(PlannerMode::Scheduled { lead_s: 10 }),
        [(110.0, 1, 3), (360.0, 3, 1)]
    );
    // Late: both.
    assert_eq!(
        at(PlannerMode::Scheduled { lead_s: -6 }),
        [(126.0, 1, 3), (366.0, 3, 1)]
    );
    // Starting a start's worth ahead, the step meets its engines serving: no fewer
    // requests within the targets than reacting at the step, or late.
    let within = |lead_s| {
        run(STEP, &s, PlannerMode::Scheduled { lead_s })
            .attainment
            .both_pct()
    };
    let (early, now, late) = (within(10), within(0), within(-10));
    assert!(early >= now && now > late, "{early} {now} {late}");
}

#[test]
fn throughput_mode_does_not_oscillate_under_constant_load() {
    let s = setup();
    for (rate, expected) in [("1x600", 1), ("3x600", 2)] {
        let r = run(rate, &s, PlannerMode::Throughput);
        let want = s.replicas_for(
            rate.split('x').next().unwrap().parse().unwrap(),
            ISL as f64,
            OSL as f64,
        );
        assert_eq!(want, expected);
        // Starting from one replica: at most one change (up to what the load needs),
        // then it stays there.
        assert!(r.replica_changes() <= 1, "{rate}: {:?}", r.scalings);
        assert_eq!(
            replicas_at(&r, 590.0),
            expected.max(1),
            "{rate}: {:?}",
            r.timeline
        );
    }
}

#[test]
fn headroom_cuts_breaches_and_the_scale_down_window_delays_the_step_down() {
    let dynamo = run(STEP, &setup(), PlannerMode::Throughput);
    let ours = PlannerSetup {
        headroom: HeadroomKnobs {
            target_utilization: 0.8,
            scale_down_window: Duration::from_secs(60),
        },
        ..setup()
    };
    // 5 req/s is 2.6 engines' worth: 3 at full utilization, 4 at 0.8.
    assert_eq!(ours.replicas_for(5.0, ISL as f64, OSL as f64), 4);
    let r = run(STEP, &ours, PlannerMode::Throughput);
    assert_eq!((r.completed, r.rejected), (r.requests, 0));
    assert!(
        r.breaches() < dynamo.breaches(),
        "{} vs {}",
        r.breaches(),
        dynamo.breaches()
    );
    // The step ends at 360 s; the decision then still saw it. Dynamo's formula scales down
    // at the next one; ours keeps the replicas until that ask is 60 s old.
    let first_down = |r: &PlannerRun| {
        r.scalings
            .iter()
            .find(|x| x.t_s > 360.0 && x.to < x.from)
            .map(|x| x.t_s)
            .expect("a scale-down after the step")
    };
    assert_eq!(first_down(&dynamo), 380.0, "{:?}", dynamo.scalings);
    assert_eq!(first_down(&r), 420.0, "{:?}", r.scalings);
}

#[test]
fn a_start_slower_than_the_interval_holds_the_next_decisions() {
    // Engines take 50 s to start, the planner looks every 20 s: while they start it is
    // told a change is rolling out and takes only a further scale-up, so no scale-down
    // comes within 50 s of a scale-up (a scale-down is over once its engines have
    // drained).
    let s = PlannerSetup {
        startup_s: 50.0,
        ..setup()
    };
    let r = run(STEP, &s, PlannerMode::Throughput);
    assert!(r.scalings.iter().any(|x| x.to > x.from));
    assert!(
        r.scalings
            .windows(2)
            .all(|w| w[0].to < w[0].from || w[1].to > w[1].from || w[1].t_s - w[0].t_s >= 50.0),
        "{:?}",
        r.scalings
    );
    assert!(r.decisions > r.scalings.len());
    // An engine starting costs GPU time from the decision: more than the same
    // timeline with instant starts would.
    let instant = run(
        STEP,
        &PlannerSetup {
            startup_s: 0.0,
            ..setup()
        },
        PlannerMode::Throughput,
    );
    assert!(instant.timeline.iter().all(|p| p.starting == 0));
    assert!(r.timeline.iter().any(|p| p.starting > 0));
}

#[test]
fn a_picker_queue_hands_the_backlog_to_new_engines() {
    // With the picker's saturation threshold, requests that find every engine busy wait
    // at the picker and go to the engines that start, instead of piling up on the old
    // ones: fewer breaches for the same planner.
    let plain = run(STEP, &setup(), PlannerMode::Throughput);
    let queued = run(
        STEP,
        &PlannerSetup {
            max_waiting_requests: Some(1),
            ..setup()
        },
        PlannerMode::Throughput,
    );
    assert_eq!((queued.completed, queued.rejected), (queued.requests, 0));
    assert!(
        queued.breaches() <= plain.breaches(),
        "{} vs {}",
        queued.breaches(),
        plain.breaches()
    );
}

#[test]
fn replays_are_deterministic_and_the_combined_mode_never_goes_below_throughput() {
    let s = setup();
    let strip = |mut r: PlannerRun| {
        r.wall_s = 0.0;
        serde_json::to_string(&r).unwrap()
    };
    let a = run(STEP, &s, PlannerMode::ThroughputLoad);
    assert_eq!(
        strip(a.clone()),
        strip(run(STEP, &s, PlannerMode::ThroughputLoad))
    );
    assert_eq!(a.completed, a.requests);
    // Load-mode scale-downs stop at the last throughput decision.
    let mut floor = s.initial_replicas;
    for x in &a.scalings {
        if x.decision.contains("throughput:") {
            floor = x.to;
        } else if x.to < x.from {
            assert!(x.to >= floor.min(x.from), "{:?}", a.scalings);
        }
    }
}

#[test]
fn the_planner_command_prints_tables_and_writes_json_csv_and_the_profile() {
    let dir = std::env::temp_dir().join(format!("dynamo-e2e-planner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let base = [
        "planner",
        "--rate-schedule",
        "1.25x60,5x120,1.25x60",
        "--isl",
        "512",
        "--osl",
        "32",
        "--num-gpu-blocks",
        "2048",
        "--block-size",
        "16",
        "--speedup-ratio",
        "0.1",
        "--ttft-ms",
        "5000",
        "--itl-ms",
        "500",
        "--interval-s",
        "20",
        "--startup-s",
        "10",
        "--planner",
        "throughput",
    ];
    let dynamo_e2e = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_dynamo-e2e"))
            .args(base.iter().chain(extra))
            .output()
            .unwrap()
    };
    let (json, md, csv, profile) = (
        path("p.json"),
        path("p.md"),
        path("p.csv"),
        path("profile.json"),
    );
    let out = dynamo_e2e(&[
        "--out",
        &json,
        "--markdown",
        &md,
        "--timeline-csv",
        &csv,
        "--profile-out",
        &profile,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "### Planner replay: rate schedule 1.25x60,5x120,1.25x60",
        "| throughput | 1-",
        "| static:1 | 1-1 | 0 |",
        "| throughput | best static |",
        "Replica timeline, throughput:",
        "| 0.0 | 1 | 1 | 0 | 0 |",
    ] {
        assert!(stdout.contains(needle), "{needle}\n{stdout}");
    }
    assert_eq!(std::fs::read_to_string(&md).unwrap(), stdout);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["kind"], "planner");
    assert_eq!(doc["runs"][0]["label"], "throughput");
    assert!(
        doc["runs"][0]["scalings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["to"].as_u64() > s["from"].as_u64())
    );
    assert!(
        std::fs::read_to_string(&csv)
            .unwrap()
            .starts_with("run,t_s,replicas,serving,starting,draining\n")
    );
    // The profile written is the planner's format, and reading it back gives the same run.
    let text = std::fs::read_to_string(&profile).unwrap();
    dynamo_planner::profile::Profile::from_json(&text).unwrap();
    let again = dynamo_e2e(&["--profile", &profile]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let first_table = |s: &str| s.split("\n\n").nth(2).unwrap().to_owned();
    assert_eq!(
        first_table(&String::from_utf8(again.stdout).unwrap()),
        first_table(&stdout)
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // Bad input is refused with the reason.
    for (flag, value, says) in [
        ("--planner", "static:0", "static:N takes a whole number"),
        ("--rate-schedule", "2x", "the duration is missing"),
        ("--predictor", "prophet", "unknown load predictor"),
        ("--load-target", "fast", "throughput or latency"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dynamo-e2e"))
            .args(["planner", flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{flag} {value}: {err}"
        );
    }
}
