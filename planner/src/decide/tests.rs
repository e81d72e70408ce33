use super::*;
use crate::profile::tests::sample;
use proptest::prelude::*;

fn disagg(prefill: u32, decode: u32) -> Replicas {
    PerRole::Disaggregated { prefill, decode }
}

const ONE_GPU: PerRole<u32> = PerRole::Disaggregated {
    prefill: 1,
    decode: 1,
};

fn big() -> Limits {
    Limits {
        max_gpu_budget: 1000,
        ..Limits::default()
    }
}

fn config(profile: &Profile, limits: Limits) -> ThroughputConfig<'_> {
    ThroughputConfig {
        targets: SlaTargets::default(),
        prefill_profile: profile,
        decode_profile: profile,
        gpus: ONE_GPU,
        correction: true,
        target_utilization: 1.0,
        limits,
    }
}

/// `requests` per 180 s interval at ISL 3000, OSL 2000: decode context is
/// 3000 + 2000 / 2 = 4000, a profiled context length, so the arithmetic stays exact.
fn inputs(requests: f64, current: Replicas) -> ThroughputInputs {
    ThroughputInputs {
        forecast: Forecast {
            requests: Some(requests),
            isl: Some(3000.0),
            osl: Some(2000.0),
        },
        observed: Observed::default(),
        interval_s: 180.0,
        current,
        rolling_out: false,
        backlog: 0.0,
    }
}

/// Observed latencies at the forecast's own ISL/OSL and concurrency 16 per decode
/// engine, where the profile expects TTFT 400 ms and ITL 30 ms.
fn observed(ttft_ms: f64, itl_ms: f64) -> Observed {
    Observed {
        ttft_ms: Some(ttft_ms),
        itl_ms: Some(itl_ms),
        isl: Some(3000.0),
        osl: Some(2000.0),
        decode_concurrency: Some(16.0),
    }
}

#[test]
fn disaggregated_formula_by_hand() {
    let p = sample();
    // Prefill: 900 req * 3000 tok / 180 s = 15000 tok/s; 7500 tok/s/GPU at ISL 3000
    //   -> 15000 / 7500 / 1 = 2.0 -> 2.
    // Decode: 900 * 2000 / 180 = 10000 tok/s; best at ITL 50, ctx 4000 = 5400
    //   -> 10000 / 5400 = 1.85 -> 2.
    let d = decide_throughput(&config(&p, big()), &inputs(900.0, disagg(1, 1)));
    assert_eq!(d.replicas, disagg(2, 2));
    assert!(!d.capped && !d.is_hold() && d.changes());
    assert!(d.reasons.contains(&Reason::Throughput {
        role: Role::Prefill,
        wanted: 2
    }));
    // Twice the traffic: prefill 30000 / 7500 = 4; decode 20000 / 5400 = 3.7 -> 4.
    let d = decide_throughput(&config(&p, big()), &inputs(1800.0, disagg(1, 1)));
    assert_eq!(d.replicas, disagg(4, 4));
}

#[test]
fn headroom_and_backlog_by_hand() {
    let p = sample();
    // At 0.8 utilization the same 900 requests need prefill 2.0 / 0.8 = 2.5 -> 3 and
    // decode 1.85 / 0.8 = 2.31 -> 3.
    let c = ThroughputConfig {
        target_utilization: 0.8,
        ..config(&p, big())
    };
    let d = decide_throughput(&c, &inputs(900.0, disagg(1, 1)));
    assert_eq!(d.replicas, disagg(3, 3));
    // 900 requests already waiting are served within the interval on top of the 900
    // forecast: as 1800 (prefill 4, decode 3.7 -> 4 at full utilization).
    let waiting = ThroughputInputs {
        backlog: 900.0,
        ..inputs(900.0, disagg(1, 1))
    };
    assert_eq!(
        decide_throughput(&config(&p, big()), &waiting).replicas,
        disagg(4, 4)
    );
    // A utilization outside (0, 1], or a backlog that is not a count, holds.
    for u in [0.0, 1.5, f64::NAN] {
        let c = ThroughputConfig {
            target_utilization: u,
            ..config(&p, big())
        };
        let d = decide_throughput(&c, &inputs(900.0, disagg(1, 1)));
        assert!(d.is_hold(), "{u}: {d}");
    }
    let bad = ThroughputInputs {
        backlog: -1.0,
        ..inputs(900.0, disagg(1, 1))
    };
    assert!(decide_throughput(&config(&p, big()), &bad).is_hold());
}

#[test]
fn gpus_per_engine_divide_the_demand() {
    let p = sample();
    let mut c = config(&p, big());
    c.gpus = disagg(2, 2);
    // 1800 requests: prefill 4 engines' worth / 2 GPUs = 2; decode 3.7 / 2 = 1.85 -> 2.
    let d = decide_throughput(&c, &inputs(1800.0, disagg(1, 1)));
    assert_eq!(d.replicas, disagg(2, 2));
}

#[test]
fn aggregated_sums_both_phases() {
    let p = sample();
    let mut c = config(&p, big());
    c.gpus = PerRole::Aggregated { worker: 1 };
    // 900 requests: prefill 2.0 + decode 1.85 = 3.85 engines -> 4 workers (max would
    // have said 2 and overloaded both phases).
    let d = decide_throughput(&c, &inputs(900.0, PerRole::Aggregated { worker: 1 }));
    assert_eq!(d.replicas, PerRole::Aggregated { worker: 4 });
}

#[test]
fn decode_correction_raises_and_lowers_decode() {
    let p = sample();
    // 540 requests: decode 540 * 2000 / 180 = 6000 tok/s. Uncorrected: 6000 / 5400 =
    // 1.11 -> 2. Prefill 540 * 3000 / 180 = 9000 / 7500 = 1.2 -> 2 throughout.
    let base = decide_throughput(&config(&p, big()), &inputs(540.0, disagg(2, 2)));
    assert_eq!(base.replicas, disagg(2, 2));
    assert!(
        base.reasons
            .contains(&Reason::NoCorrection { which: "decode" })
    );

    // ITL 60 observed where the profile expects 30: correction 2, corrected ITL 25.
    // At ctx 4000: between (12 ms, 800) and (30 ms, 5000): t = 13/18 -> 3833.3.
    // 6000 / 3833.3 = 1.57 -> 2; with 900 requests 10000 / 3833.3 = 2.6 -> 3 (was 2).
    let mut i = inputs(900.0, disagg(2, 2));
    i.observed = observed(400.0, 60.0);
    let up = decide_throughput(&config(&p, big()), &i);
    assert_eq!(up.replicas, disagg(2, 3));

    // ITL 15 where 30 expected: correction 0.5, corrected ITL 100 -> best 6400.
    // 6000 / 6400 = 0.94 -> 1 (was 2).
    let mut i = inputs(540.0, disagg(2, 2));
    i.observed = observed(400.0, 15.0);
    let down = decide_throughput(&config(&p, big()), &i);
    assert_eq!(down.replicas, disagg(2, 1));

    // With correction off, the same observation changes nothing.
    let mut c = config(&p, big());
    c.correction = false;
    assert_eq!(decide_throughput(&c, &i).replicas, disagg(2, 2));
}

#[test]
fn prefill_correction_only_lowers() {
    let p = sample();
    // 900 requests: 15000 tok/s -> 2 replicas uncorrected.
    // TTFT 200 where 400 expected: 0.5 -> 7500 / 7500 = 1 replica.
    let mut i = inputs(900.0, disagg(2, 2));
    i.observed = observed(200.0, 30.0);
    assert_eq!(
        decide_throughput(&config(&p, big()), &i).replicas,
        disagg(1, 2)
    );
    // TTFT 800: correction 2, but min(1, 2) = 1 -> still 2.
    i.observed = observed(800.0, 30.0);
    assert_eq!(
        decide_throughput(&config(&p, big()), &i).replicas,
        disagg(2, 2)
    );
}

#[test]
fn unreachable_itl_is_reported() {
    let p = sample();
    let mut c = config(&p, big());
    c.targets.itl_ms = 5.0;
    // Sized at the lightest point, 800 tok/s: 10000 / 800 = 12.5 -> 13, step cap 8
    // from 1 -> 9.
    let d = decide_throughput(&c, &inputs(900.0, disagg(1, 1)));
    assert!(d.reasons.contains(&Reason::ItlUnreachable));
    assert_eq!(d.replicas, disagg(2, 9));
    assert!(d.reasons.contains(&Reason::StepCapped {
        role: Role::Decode,
        wanted: 13
    }));
}

#[test]
fn budget_splits_proportionally_and_reports_capped() {
    let p = sample();
    // 2700 requests: prefill 45000 / 7500 = 6; decode 30000 / 5400 = 5.56 -> 6.
    // 12 GPUs wanted, budget 8: 8 * 6/12 = 4 each.
    let d = decide_throughput(
        &config(&p, Limits::default()),
        &inputs(2700.0, disagg(1, 1)),
    );
    assert_eq!(d.replicas, disagg(4, 4));
    assert!(d.capped);
    assert_eq!(d.wanted, disagg(6, 6));
    assert!(d.reasons.contains(&Reason::GpuBudget {
        wanted_gpus: 12,
        budget: 8
    }));
    assert!(d.to_string().contains("capped"), "{d}");

    // Uneven: wanted 6 + 3 = 9 GPUs: shares 5.33 and 2.67 -> floors 5 and 2; the one
    // GPU left goes to decode (1/3 short of its want vs prefill's 1/6) -> 5 + 3 = 8.
    let mut r = Vec::new();
    let (got, capped) = fit_budget(disagg(6, 3), ONE_GPU, &Limits::default(), &mut r).unwrap();
    assert_eq!((got, capped), (disagg(5, 3), true));

    // Two GPUs per decode engine: wanted 4*1 + 4*2 = 12; shares 8*4/12 = 2.67 -> 2
    // prefill, 8*8/12 = 5.33 GPUs -> 2 decode engines (4 GPUs); 2 GPUs left: prefill is
    // 2/4 short, decode 2/4 short; either way the total ends at 8 GPUs.
    let (got, _) = fit_budget(disagg(4, 4), disagg(1, 2), &Limits::default(), &mut r).unwrap();
    let PerRole::Disaggregated { prefill, decode } = got else {
        unreachable!()
    };
    assert_eq!(prefill + 2 * decode, 8, "{got}");

    // Within budget: untouched.
    let (got, capped) = fit_budget(disagg(3, 5), ONE_GPU, &Limits::default(), &mut r).unwrap();
    assert_eq!((got, capped), (disagg(3, 5), false));
}

#[test]
fn min_endpoints_never_scale_to_zero() {
    let p = sample();
    // No traffic: 0 engines' worth -> raised to 1 each.
    let d = decide_throughput(&config(&p, big()), &inputs(0.0, disagg(3, 3)));
    assert_eq!(d.replicas, disagg(1, 1));
    assert!(d.reasons.contains(&Reason::MinEndpoint {
        role: Role::Prefill
    }));
    // min_endpoint 0 is read as 1; min 2 holds 2.
    let zero = Limits {
        min_endpoint: 0,
        ..big()
    };
    assert_eq!(
        decide_throughput(&config(&p, zero), &inputs(0.0, disagg(3, 3))).replicas,
        disagg(1, 1)
    );
    let two = Limits {
        min_endpoint: 2,
        ..big()
    };
    assert_eq!(
        decide_throughput(&config(&p, two), &inputs(0.0, disagg(3, 3))).replicas,
        disagg(2, 2)
    );
    // Minimums beat a budget too small for them: reported as capped.
    let tight = Limits {
        min_endpoint: 3,
        max_gpu_budget: 4,
        max_step: 8,
    };
    let d = decide_throughput(&config(&p, tight), &inputs(0.0, disagg(3, 3)));
    assert_eq!(d.replicas, disagg(3, 3));
    assert!(d.capped);
}

#[test]
fn step_cap_limits_each_role() {
    let p = sample();
    let step2 = Limits {
        max_step: 2,
        ..big()
    };
    // Wants 4 / 4 from 1 / 1: moves 2 per decision: 3 / 3, then 4 / 4.
    let d = decide_throughput(&config(&p, step2), &inputs(1800.0, disagg(1, 1)));
    assert_eq!(d.replicas, disagg(3, 3));
    assert!(d.reasons.contains(&Reason::StepCapped {
        role: Role::Prefill,
        wanted: 4
    }));
    let d = decide_throughput(&config(&p, step2), &inputs(1800.0, d.replicas));
    assert_eq!(d.replicas, disagg(4, 4));
    // Down too: from 10 / 10 toward 1 / 1.
    let d = decide_throughput(&config(&p, step2), &inputs(0.0, disagg(10, 10)));
    assert_eq!(d.replicas, disagg(8, 8));
}

#[test]
fn holds_while_rolling_out_and_on_missing_or_bad_data() {
    let p = sample();
    let c = config(&p, big());
    // Rolling out, 900 requests want (2, 2): a scale-down, a mixed change or none holds.
    for current in [disagg(5, 5), disagg(1, 5), disagg(2, 2)] {
        let mut i = inputs(900.0, current);
        i.rolling_out = true;
        let d = decide_throughput(&c, &i);
        assert_eq!(d.replicas, current);
        assert_eq!(d.reasons, vec![Reason::RollingOut]);
        assert!(d.is_hold() && d.to_string().starts_with("hold"), "{d}");
    }
    // A scale-up is taken while the last one still starts: the formula sizes the graph.
    let mut i = inputs(1800.0, disagg(2, 2));
    i.rolling_out = true;
    let d = decide_throughput(&c, &i);
    assert_eq!(d.replicas, disagg(4, 4));
    assert!(!d.is_hold(), "{d}");

    let mut i = inputs(1800.0, disagg(2, 2));
    i.forecast.requests = None;
    let d = decide_throughput(&c, &i);
    assert_eq!(d.replicas, disagg(2, 2));
    assert_eq!(
        d.reasons,
        vec![Reason::MissingInput {
            input: "predicted requests"
        }]
    );
    assert_eq!(d.reasons[0].label(), "missing_input");

    let mut i = inputs(1800.0, disagg(2, 2));
    i.forecast.isl = Some(f64::NAN);
    let d = decide_throughput(&c, &i);
    assert_eq!(d.replicas, disagg(2, 2));
    assert!(matches!(
        d.reasons[..],
        [Reason::InvalidInput {
            input: "predicted isl",
            ..
        }]
    ));

    let mut i = inputs(0.0, disagg(2, 2));
    i.forecast.osl = Some(-1.0);
    assert!(decide_throughput(&c, &i).is_hold());
    let mut i = inputs(0.0, disagg(2, 2));
    i.interval_s = 0.0;
    assert!(decide_throughput(&c, &i).is_hold());

    // A NaN latency (0/0 over an idle interval) only skips the correction.
    let mut i = inputs(900.0, disagg(1, 1));
    i.observed = observed(f64::NAN, f64::NAN);
    let d = decide_throughput(&c, &i);
    assert!(!d.is_hold());
    assert_eq!(d.replicas, disagg(2, 2));

    // Replicas and GPUs of different shapes.
    let mut i = inputs(900.0, PerRole::Aggregated { worker: 1 });
    i.current = PerRole::Aggregated { worker: 1 };
    assert_eq!(
        decide_throughput(&c, &i).reasons,
        vec![Reason::ShapeMismatch]
    );
}

fn engine(prefill_ratio: f64, kv_usage: f64) -> EngineLoad {
    EngineLoad {
        queued_prefill_tokens: prefill_ratio * 8192.0,
        context_length: 8192.0,
        scheduled_decode_kv: kv_usage * 100_000.0,
        queued_decode_kv: 0.0,
        max_kv_tokens: 100_000.0,
    }
}

fn load(
    prefill: &[EngineLoad],
    decode: &[EngineLoad],
    target: LoadTarget,
    limits: &Limits,
) -> Decision {
    let inputs = LoadInputs {
        engines: PerRole::Disaggregated { prefill, decode },
        current: disagg(prefill.len() as u32, decode.len() as u32),
        rolling_out: false,
    };
    decide_load(&inputs, target, ONE_GPU, limits)
}

#[test]
fn load_mode_up_on_any_engine() {
    let l = big();
    // One of three decode engines past 1.0 KV use: +1 decode; prefill queue 1.0 (>= 1.0)
    // on one engine: +1 prefill.
    let d = load(
        &[engine(0.5, 0.0), engine(1.0, 0.0)],
        &[engine(0.0, 0.3), engine(0.0, 1.05), engine(0.0, 0.3)],
        LoadTarget::Throughput,
        &l,
    );
    assert_eq!(d.replicas, disagg(3, 4));
    assert!(d.reasons.contains(&Reason::LoadUp { role: Role::Decode }));
    // Exactly 1.0 KV use is not past the (strict) decode threshold.
    let d = load(
        &[engine(0.5, 0.0)],
        &[engine(0.0, 1.0)],
        LoadTarget::Throughput,
        &l,
    );
    assert_eq!(d.replicas, disagg(1, 1));
    // Latency target: 0.45 KV use is past 0.4; 0.1 prefill queue reaches 0.1.
    let d = load(
        &[engine(0.1, 0.0)],
        &[engine(0.0, 0.45)],
        LoadTarget::Latency,
        &l,
    );
    assert_eq!(d.replicas, disagg(2, 2));
}

#[test]
fn load_mode_down_only_when_all_are_under() {
    let l = big();
    // Decode: all three under 0.6 and the mean 0.2 * 3/2 = 0.3 fits: -1.
    // Prefill: one of two engines at 0.5 (not < 0.1): stays.
    let d = load(
        &[engine(0.0, 0.0), engine(0.5, 0.0)],
        &[engine(0.0, 0.2), engine(0.0, 0.2), engine(0.0, 0.2)],
        LoadTarget::Throughput,
        &l,
    );
    assert_eq!(d.replicas, disagg(2, 2));
    assert!(d.reasons.contains(&Reason::LoadDown { role: Role::Decode }));
    assert!(d.reasons.contains(&Reason::LoadSteady {
        role: Role::Prefill
    }));
    // One decode engine at 0.7 (not < 0.6): no scale-down.
    let d = load(
        &[engine(0.0, 0.0)],
        &[engine(0.0, 0.2), engine(0.0, 0.7)],
        LoadTarget::Throughput,
        &l,
    );
    assert_eq!(d.replicas, disagg(1, 2));
    // Latency prefill down needs an empty queue.
    let d = load(
        &[engine(0.0, 0.0), engine(0.01, 0.0)],
        &[engine(0.0, 0.0)],
        LoadTarget::Latency,
        &l,
    );
    assert_eq!(d.replicas, disagg(2, 1));
    // At the minimum: stays.
    let d = load(
        &[engine(0.0, 0.0)],
        &[engine(0.0, 0.0)],
        LoadTarget::Throughput,
        &l,
    );
    assert_eq!(d.replicas, disagg(1, 1));
}

#[test]
fn load_mode_consolidation_blocks_the_two_one_flip() {
    // Two decode engines at 0.55 KV: both under 0.6, but on one engine it would be
    // 0.55 * 2 / 1 = 1.1 > 1.0 and the next interval would scale back up: refused.
    let d = load(
        &[engine(0.0, 0.0)],
        &[engine(0.0, 0.55), engine(0.0, 0.55)],
        LoadTarget::Throughput,
        &big(),
    );
    assert_eq!(d.replicas, disagg(1, 2));
    assert!(
        d.reasons
            .contains(&Reason::ConsolidationBlocked { role: Role::Decode })
    );
    assert_eq!(
        Reason::ConsolidationBlocked { role: Role::Decode }.label(),
        "consolidation_blocked"
    );
    // At 0.45 each, 0.9 on one engine fits: -1.
    let d = load(
        &[engine(0.0, 0.0)],
        &[engine(0.0, 0.45), engine(0.0, 0.45)],
        LoadTarget::Throughput,
        &big(),
    );
    assert_eq!(d.replicas, disagg(1, 1));
}

#[test]
fn load_mode_aggregated_judges_both_metrics() {
    let engines = [engine(0.0, 0.5), engine(1.2, 0.0)];
    let inputs = LoadInputs {
        engines: PerRole::Aggregated { worker: &engines },
        current: PerRole::Aggregated { worker: 2 },
        rolling_out: false,
    };
    let gpus = PerRole::Aggregated { worker: 1 };
    // The second worker's prefill queue (1.2 >= 1.0) scales up.
    let d = decide_load(&inputs, LoadTarget::Throughput, gpus, &big());
    assert_eq!(d.replicas, PerRole::Aggregated { worker: 3 });
}

#[test]
fn load_mode_holds() {
    let l = big();
    let p = [engine(0.0, 0.0)];
    let dd = [engine(0.0, 2.0)];
    // Rolling out.
    let mut inputs = LoadInputs {
        engines: PerRole::Disaggregated {
            prefill: &p,
            decode: &dd,
        },
        current: disagg(1, 1),
        rolling_out: true,
    };
    assert_eq!(
        decide_load(&inputs, LoadTarget::Throughput, ONE_GPU, &l).reasons,
        vec![Reason::RollingOut]
    );
    // Two replicas configured, one reported.
    inputs.rolling_out = false;
    inputs.current = disagg(1, 2);
    let d = decide_load(&inputs, LoadTarget::Throughput, ONE_GPU, &l);
    assert_eq!(d.replicas, disagg(1, 2));
    assert_eq!(d.reasons[0].label(), "worker_count_mismatch");
    // No reports at all: hold, never down to the minimum.
    let d = load(&[], &dd, LoadTarget::Throughput, &l);
    assert!(d.is_hold());
    assert_eq!(d.replicas, disagg(0, 1));
    // NaN KV usage.
    let mut bad = engine(0.0, 0.0);
    bad.scheduled_decode_kv = f64::NAN;
    let d = load(&p, &[bad], LoadTarget::Throughput, &l);
    assert_eq!(d.replicas, disagg(1, 1));
    assert!(matches!(
        d.reasons[..],
        [Reason::InvalidInput {
            input: "scheduled decode kv",
            ..
        }]
    ));
    // Zero KV capacity cannot be divided by.
    let mut bad = engine(0.0, 0.0);
    bad.max_kv_tokens = 0.0;
    assert!(load(&p, &[bad], LoadTarget::Throughput, &l).is_hold());
}

#[test]
fn the_throughput_floor_stops_load_modes_scale_downs_only() {
    let l = big();
    let idle = [engine(0.0, 0.0), engine(0.0, 0.0), engine(0.0, 0.0)];
    let busy = [engine(2.0, 0.0)];
    // Every engine idle: load mode takes prefill 3 -> 2 and decode 1 stays at the minimum.
    let down = load(&idle, &[engine(0.0, 0.0)], LoadTarget::Throughput, &l);
    assert_eq!(down.replicas, disagg(2, 1));
    // Throughput last asked for 3 prefill engines: the scale-down stops there, and says so.
    let floored = floor_by_throughput(down.clone(), disagg(3, 1));
    assert_eq!(floored.replicas, disagg(3, 1));
    assert!(
        floored.reasons.contains(&Reason::ThroughputFloor {
            role: Role::Prefill,
            floor: 3
        }),
        "{floored}"
    );
    // A floor above the current count is not a scale-up: it stops at the current count.
    assert_eq!(
        floor_by_throughput(down.clone(), disagg(5, 1)).replicas,
        disagg(3, 1)
    );
    // A floor at or below the load decision changes nothing.
    assert_eq!(floor_by_throughput(down.clone(), disagg(1, 1)), down);
    // Scale-ups and holds pass as they are, and a floor of the other shape is ignored.
    let up = load(&busy, &[engine(0.0, 0.0)], LoadTarget::Throughput, &l);
    assert_eq!(floor_by_throughput(up.clone(), disagg(1, 1)), up);
    let held = Decision::hold(disagg(3, 1), Reason::RollingOut);
    assert_eq!(floor_by_throughput(held.clone(), disagg(9, 9)), held);
    let agg = PerRole::Aggregated { worker: 3 };
    assert_eq!(floor_by_throughput(down.clone(), agg), down);
}

#[test]
fn decision_prints_for_logs() {
    let p = sample();
    let d = decide_throughput(&config(&p, big()), &inputs(900.0, disagg(1, 1)));
    let s = d.to_string();
    assert!(
        s.starts_with(
            "scale prefill=1 decode=1 -> prefill=2 decode=2: throughput: prefill needs 2"
        ),
        "{s}"
    );
}

/// Fixed point and no 2-cycle: repeated decisions under constant load.
fn assert_settles(history: &[Replicas]) -> Result<(), TestCaseError> {
    let last = history[history.len() - 1];
    prop_assert_eq!(
        history[history.len() - 2],
        last,
        "no fixed point: {:?}",
        history
    );
    for w in history.windows(3) {
        prop_assert!(!(w[0] == w[2] && w[0] != w[1]), "alternates: {:?}", history);
    }
    Ok(())
}

proptest! {
    /// Throughput mode, with the engines `slowdown` times slower than profiled (so the
    /// decode correction is active): observed ITL is the profile's at the concurrency
    /// the current decode replicas give (Little's law), times `slowdown`; the
    /// correction cancels the concurrency, so the answer settles.
    #[test]
    fn throughput_mode_settles(
        requests in 0.0f64..4000.0,
        slowdown in 0.5f64..2.0,
        start_p in 1u32..12,
        start_d in 1u32..12,
        step in 1u32..9,
        budget in 2u32..40,
        gpus_p in 1u32..4,
        gpus_d in 1u32..4,
    ) {
        let p = sample();
        let limits = Limits { min_endpoint: 1, max_gpu_budget: budget, max_step: step };
        let mut c = config(&p, limits);
        c.gpus = disagg(gpus_p, gpus_d);
        let mut current = disagg(start_p, start_d);
        let mut history = vec![current];
        for _ in 0..40 {
            let PerRole::Disaggregated { decode, .. } = current else { unreachable!() };
            // Little's law: requests/s * ~osl * itl seconds per request, per replica.
            let conc = (requests / 180.0 * 2000.0 * 0.03 / f64::from(decode.max(1))).max(1.0);
            let mut i = inputs(requests, current);
            i.observed = Observed {
                ttft_ms: Some(400.0 * slowdown),
                itl_ms: Some(p.expected_itl_ms(4000.0, conc) * slowdown),
                isl: Some(3000.0),
                osl: Some(2000.0),
                decode_concurrency: Some(conc),
            };
            current = decide_throughput(&c, &i).replicas;
            history.push(current);
        }
        assert_settles(&history)?;
    }

    /// Load mode: a constant total load spread evenly over however many engines there
    /// are; the consolidation check keeps it from flipping between N and N-1.
    #[test]
    fn load_mode_settles(
        prefill_total in 0.0f64..4.0,
        decode_total in 0.0f64..6.0,
        latency in any::<bool>(),
        start_p in 1u32..8,
        start_d in 1u32..8,
    ) {
        let target = if latency { LoadTarget::Latency } else { LoadTarget::Throughput };
        let limits = Limits { max_gpu_budget: 1000, ..Limits::default() };
        let mut current = disagg(start_p, start_d);
        let mut history = vec![current];
        for _ in 0..100 {
            let PerRole::Disaggregated { prefill, decode } = current else { unreachable!() };
            let pe = vec![engine(prefill_total / f64::from(prefill), 0.0); prefill as usize];
            let de = vec![engine(0.0, decode_total / f64::from(decode)); decode as usize];
            current = load(&pe, &de, target, &limits).replicas;
            history.push(current);
        }
        assert_settles(&history)?;
    }
}
