//! The engine on the hardware performance model (`--perf-model hardware`), on
//! simulated time.

use dynamo_mocker::{Engine, EngineConfig, Request, StepOutcome, TimingModel};
use dynamo_perfmodel::{Dtype, Estimator, GpuSku, ModelArch};

fn estimator(gpu: GpuSku, model: &str, tp: u64) -> Estimator {
    Estimator::new(gpu.spec(), ModelArch::by_name(model).unwrap(), tp).unwrap()
}

fn engine(e: Estimator) -> Engine {
    let block_size = 16;
    Engine::simulated(EngineConfig {
        num_gpu_blocks: e.fits(1, 1).unwrap().kv_blocks(block_size) as usize,
        block_size: block_size as usize,
        vocab_size: 1000,
        timing: TimingModel::Hardware(Box::new(e)),
        ..EngineConfig::default()
    })
    .unwrap()
}

/// TTFT and mean ITL of one request alone on the engine.
fn lone_request(e: Estimator, isl: usize, osl: usize) -> (f64, f64) {
    let mut engine = engine(e);
    engine
        .submit(Request {
            id: 1,
            token_ids: (0..isl as u32).collect(),
            max_tokens: osl,
            seed: None,
            pin_ttl: None,
        })
        .unwrap();
    let mut steps: Vec<StepOutcome> = Vec::new();
    while engine.has_work() {
        steps.push(engine.step());
    }
    let outputs: Vec<_> = steps.iter().flat_map(|s| &s.outputs).collect();
    assert_eq!(outputs.len(), osl);
    let ttft = outputs[0].ttft_ms.unwrap();
    let itls: Vec<f64> = outputs[1..].iter().map(|o| o.itl_ms.unwrap()).collect();
    (ttft, itls.iter().sum::<f64>() / itls.len() as f64)
}

#[test]
fn ttft_grows_with_the_prompt_and_equals_the_models_prefill() {
    let e = estimator(GpuSku::H100Sxm, "meta-llama/Llama-3.1-8B-Instruct", 1);
    let mut last = 0.0;
    for isl in [16, 128, 1024, 4096, 8192] {
        let (ttft, _) = lone_request(e.clone(), isl, 2);
        assert!(ttft > last, "ISL {isl}: {ttft} <= {last}");
        // One chunk within the 8192-token budget: TTFT is one prefill step.
        assert!(
            (ttft - e.prefill_ms(isl as u64, 0)).abs() < 1e-9,
            "ISL {isl}"
        );
        last = ttft;
    }
    // Past the budget the prompt is chunked; the later chunks attend to the earlier.
    let (chunked, _) = lone_request(e.clone(), 20_000, 2);
    let one_pass = e.prefill_ms(20_000, 0);
    assert!(chunked > one_pass, "{chunked} vs {one_pass}");
}

#[test]
fn itl_grows_with_the_context_it_attends_to() {
    let e = estimator(GpuSku::H100Sxm, "meta-llama/Llama-3.1-8B-Instruct", 1);
    let (_, short) = lone_request(e.clone(), 128, 16);
    let (_, long) = lone_request(e.clone(), 60_000, 16);
    assert!(long > short, "{long} vs {short}");
    // A lone 8B decode on an H100 reads ~15 GB of weights: several ms.
    assert!((4.0..12.0).contains(&short), "{short}");
}

#[test]
fn tensor_parallel_2_is_faster_than_1_for_a_70b_model() {
    // 70B in FP8 (72 GB) fits one H200; TP 2 splits the weights and the work.
    let on = |tp| {
        estimator(GpuSku::H200Sxm, "meta-llama/Llama-3.1-70B-Instruct", tp)
            .with_weight_dtype(Dtype::Fp8)
    };
    let (ttft1, itl1) = lone_request(on(1), 4000, 8);
    let (ttft2, itl2) = lone_request(on(2), 4000, 8);
    assert!(
        ttft2 < ttft1 && itl2 < itl1,
        "TP1 {ttft1}/{itl1}, TP2 {ttft2}/{itl2}"
    );
    // Faster, not twice as fast: the all-reduces and the step overhead remain.
    assert!(itl2 > itl1 / 2.0, "TP1 {itl1}, TP2 {itl2}");
}

#[test]
fn batching_decodes_costs_less_than_running_them_one_by_one() {
    let e = estimator(GpuSku::H100Sxm, "Qwen/Qwen3-8B", 1);
    let mut engine = engine(e.clone());
    for id in 0..32 {
        let token_ids = (id as u32 * 1000..id as u32 * 1000 + 512).collect();
        engine
            .submit(Request {
                id,
                token_ids,
                max_tokens: 4,
                seed: None,
                pin_ttl: None,
            })
            .unwrap();
    }
    let mut decode_steps = Vec::new();
    while engine.has_work() {
        let s = engine.step();
        if s.work.prefill_tokens == 0 {
            decode_steps.push(s.duration_ms);
        }
    }
    let (_, lone_itl) = lone_request(e, 512, 4);
    let batched = decode_steps.iter().cloned().fold(0.0, f64::max);
    assert!(
        batched > lone_itl && batched < 4.0 * lone_itl,
        "{batched} vs {lone_itl}"
    );
}
