//! Calibration against published figures, and the profiler on calibrated factors.
//!
//! The figures: NVIDIA NIM LLMs Benchmarking, "Performance"
//! (https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance), Llama-3.3-70b-instruct,
//! NIM 1.8.0, 2 x H100 80G, fp8 TP2, in `tests/data/nim-llama-3.3-70b-h100-tp2.yaml`
//! (which rows are fitted and why: there, and `docs/perfmodel.md`, "Calibration").

use std::path::Path;

use dynamo_crds::dgdr::DynamoGraphDeploymentRequestSpec;
use dynamo_perfmodel::{Efficiency, Estimator, GpuSku, ModelArch, Uncertainty};
use dynamo_profiler::calibrate::{self, Metric};
use dynamo_profiler::{ProfileError, profile_calibrated, profile_named};

#[test]
fn nim_llama_70b_on_two_h100s_is_fitted_within_a_fifth_but_ttft_under_load() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nim-llama-3.3-70b-h100-tp2.yaml");
    let c = calibrate::load(&path).unwrap();
    let fit = calibrate::fit(&c.measurements).unwrap();
    let summary = fit.summary();
    println!("{summary}");
    let max = |metric, held_out| fit.error(metric, held_out, true).unwrap().max_factor;
    // The fitted TTFTs (one prefill each), the fitted ITLs (NIM's 500/2000 ITL doubles
    // from 1 to 150 in flight, which the KV reads' own bandwidth share follows) and the
    // held-out ITLs: within 1.2x.
    assert!(max(Metric::Ttft, false) <= 1.2, "{summary}");
    assert!(max(Metric::Itl, false) <= 1.2, "{summary}");
    assert!(max(Metric::Itl, true) <= 1.2, "{summary}");
    let before = fit.error(Metric::Itl, false, false).unwrap().max_factor;
    assert!(before > 1.4, "the defaults were further off: {summary}");
    // TTFT under load, held out: NIM's grows by 60-140 ms from 1 to 5 in flight at any
    // prompt length, the model's not at all until prefills queue behind each other. The
    // long prompts' come within 0.55-1.05x; the short prompts' stay at 0.23-0.35x.
    for p in fit.points.iter().filter(|p| p.point.held_out) {
        let Some(ttft) = p.ratios(true)[0] else {
            continue;
        };
        let range = if p.point.isl == 5000 {
            0.55..=1.2
        } else {
            0.15..=0.4
        };
        assert!(
            range.contains(&ttft),
            "{}: {ttft:.2}\n{summary}",
            p.point.source
        );
    }
    // Physically plausible: half the FP8 peak, the KV read at a third to two thirds of the
    // HBM bandwidth (below the weights' 0.8, which the fit keeps), a few ms a step besides.
    let e = &fit.efficiency;
    assert!((0.4..=0.6).contains(&e.compute), "{e:?}");
    assert_eq!(e.memory, Efficiency::default().memory);
    assert!((0.3..=0.7).contains(&e.kv_memory), "{e:?}");
    assert!((1.0..=5.0).contains(&e.step_overhead_ms), "{e:?}");
}

/// `Uncertainty::UNCALIBRATED` is the largest excess of NIM's measurements over the
/// built-in factors' predictions, each bound rounded up by at most 2%.
#[test]
fn the_uncalibrated_models_stated_uncertainty_is_what_nim_measured_beyond_it() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nim-llama-3.3-70b-h100-tp2.yaml");
    let m = calibrate::load(&path).unwrap().measurements;
    assert_eq!(m.estimator.efficiency, Efficiency::default());
    let u = Uncertainty::UNCALIBRATED;
    let (mut itl, mut prefill, mut steps) = (0.0f64, 0.0f64, 0.0f64);
    let predicted: Vec<_> = m
        .points
        .iter()
        .map(|p| (p, calibrate::predict(&m.estimator, p).unwrap()))
        .collect();
    for (p, at) in &predicted {
        if let Some(measured) = p.itl_ms {
            itl = itl.max(measured / at.itl_ms);
        }
        if let (Some(measured), 1) = (p.ttft_ms, p.concurrency) {
            prefill = prefill.max(measured / at.ttft_ms);
        }
    }
    for (p, at) in &predicted {
        if let Some(measured) = p.ttft_ms {
            steps = steps.max((measured - u.prefill * at.ttft_ms) / at.itl_ms);
        }
    }
    println!("measured / predicted: ITL {itl:.3}, lone TTFT {prefill:.3}; {steps:.2} ITLs more");
    for (what, measured, stated) in [
        ("ITL", itl, u.itl),
        ("lone TTFT", prefill, u.prefill),
        ("TTFT's admission steps", steps, u.admission_steps),
    ] {
        assert!(
            (measured..=measured * 1.02).contains(&stated),
            "{what}: {stated} stated, {measured:.3} measured"
        );
    }
    // Every measurement within its bounds.
    for (p, at) in &predicted {
        if let Some(measured) = p.ttft_ms {
            assert!(measured <= u.ttft_ms(at.ttft_ms, at.itl_ms), "{}", p.source);
        }
        if let Some(measured) = p.itl_ms {
            assert!(measured <= u.itl_ms(at.itl_ms), "{}", p.source);
        }
    }
}

fn qwen8b() -> DynamoGraphDeploymentRequestSpec {
    serde_saphyr::from_str(
        "{model: Qwen/Qwen3-8B, hardware: {gpuSku: h100_sxm, totalGpus: 2}, workload: {isl: 2000, \
         osl: 200, concurrency: 8}, sla: {ttft: 1000, itl: 50}}",
    )
    .unwrap()
}

#[test]
fn the_profiler_predicts_on_the_calibrated_factors_of_the_same_gpu_and_model() {
    let spec = qwen8b();
    let model = ModelArch::by_name("Qwen/Qwen3-8B").unwrap();
    let mut slow = Estimator::new(GpuSku::H100Sxm.spec(), model.clone(), 1).unwrap();
    slow.efficiency = Efficiency {
        compute: 0.25,
        memory: 0.4,
        step_overhead_ms: 6.0,
        ..Efficiency::default()
    };
    let built_in = profile_named("qwen", &spec, None).unwrap();
    let calibrated = profile_calibrated("qwen", &spec, None, Some(&slow)).unwrap();
    assert_eq!(calibrated.request.efficiency, slow.efficiency);
    // Measured factors need no headroom for the built-in ones' uncertainty.
    assert_eq!(built_in.request.uncertainty, Uncertainty::UNCALIBRATED);
    assert_eq!(calibrated.request.uncertainty, Uncertainty::NONE);
    let (a, b) = (&built_in.selected, &calibrated.selected);
    assert!(b.ttft_ms > 1.5 * a.ttft_ms, "{a:?} {b:?}");
    assert!(b.itl_ms > 1.5 * a.itl_ms, "{a:?} {b:?}");
    // Another GPU's factors are refused.
    let h200 = Estimator::new(GpuSku::H200Sxm.spec(), model, 1).unwrap();
    let err = profile_calibrated("qwen", &spec, None, Some(&h200)).unwrap_err();
    assert!(
        matches!(err, ProfileError::CalibrationMismatch { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("H200_SXM"), "{err}");
}
