//! The model against public benchmark figures (the table in `docs/perfmodel.md`):
//! every prediction within a factor of 2 of the published figure, and the set as a
//! whole within 25% on average (geometric mean of the ratios).
//!
//! Sources:
//! - [NIM] NVIDIA NIM LLMs Benchmarking, "Performance"
//!   (docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance), Llama-3.3-70b-instruct,
//!   NIM 1.8.0, "2 x H100 80G", "fp8 TP2", concurrency 1 (one request at a time, so
//!   TTFT is one prefill and ITL one decode step).
//! - [TRT] TensorRT-LLM performance overview (NVIDIA/TensorRT-LLM,
//!   docs/source/performance/perf-overview.md at 00f37686aa854010d68bcbd0f4ab000221541ca6,
//!   the v1.0 tables), "Total Output Throughput (tokens/sec)" of `trtllm-bench
//!   throughput` with all requests queued at once, nvidia/*-FP8 checkpoints.
//! - [vLLM] vLLM's nightly performance benchmark, build 9515
//!   (buildkite.com/vllm/performance-benchmark/builds/9515), "Latency tests": input 32
//!   tokens, output 128, batch 8, BF16 (the checkpoints' dtype; tests defined in
//!   vllm-project/vllm `.buildkite/nightly-benchmarks/tests/latency-tests.json`). Its
//!   Llama 3 8B and 70B share Llama 3.1's architecture.
//!
//! NIM and TRT run FP8 weights from NVIDIA's ModelOpt checkpoints, whose export also
//! quantizes the KV cache to FP8 (`kv_cache_quant_algo: FP8`): their KV dtype is FP8.

use dynamo_perfmodel::{Dtype, Estimator, GpuSku, ModelArch, StepLoad, Uncertainty};

/// TensorRT-LLM's default `max_batch_size`; the KV cache binds first in every case.
const MAX_BATCH: u64 = 2048;

enum Metric {
    /// Time to first token of a lone request, ms.
    Ttft { isl: u64 },
    /// Inter-token latency of a lone request, ms.
    Itl { isl: u64, osl: u64 },
    /// Output tokens/s of the deployment, saturated.
    Throughput { isl: u64, osl: u64 },
    /// End-to-end latency of a batch submitted at once, ms.
    BatchLatency { batch: u64, isl: u64, osl: u64 },
}

struct Published {
    source: &'static str,
    model: &'static str,
    gpu: GpuSku,
    tp: u64,
    /// Weights and KV cache.
    dtype: Dtype,
    metric: Metric,
    value: f64,
}

const LLAMA_8B: &str = "nvidia/Llama-3.1-8B-Instruct-FP8";
const LLAMA_70B: &str = "nvidia/Llama-3.3-70B-Instruct-FP8";

fn published() -> Vec<Published> {
    use Metric::*;
    let nim = |metric, value| Published {
        source: "NIM",
        model: LLAMA_70B,
        gpu: GpuSku::H100Sxm,
        tp: 2,
        dtype: Dtype::Fp8,
        metric,
        value,
    };
    let trt = |model, gpu, tp, isl, osl, value| Published {
        source: "TRT",
        model,
        gpu,
        tp,
        dtype: Dtype::Fp8,
        metric: Throughput { isl, osl },
        value,
    };
    let vllm = |model, tp, value| Published {
        source: "vLLM",
        model,
        gpu: GpuSku::H200Sxm,
        tp,
        dtype: Dtype::Bf16,
        metric: BatchLatency {
            batch: 8,
            isl: 32,
            osl: 128,
        },
        value,
    };
    vec![
        // NIM: "5000 Input Tokens / 500 Output Tokens", concurrency 1.
        nim(Ttft { isl: 5000 }, 406.77),
        nim(
            Itl {
                isl: 5000,
                osl: 500,
            },
            18.58,
        ),
        // NIM: "500 Input Tokens / 2000 Output Tokens", concurrency 1.
        nim(Ttft { isl: 500 }, 47.77),
        nim(
            Itl {
                isl: 500,
                osl: 2000,
            },
            18.91,
        ),
        // TRT: "Llama 3.1 8B", "H100 TP1 (FP8)" and "H200 TP1 (FP8)" columns.
        trt(LLAMA_8B, GpuSku::H100Sxm, 1, 1000, 1000, 15_220.0),
        trt(LLAMA_8B, GpuSku::H100Sxm, 1, 2048, 128, 3_450.0),
        trt(LLAMA_8B, GpuSku::H100Sxm, 1, 128, 2048, 22_714.0),
        trt(LLAMA_8B, GpuSku::H200Sxm, 1, 1000, 1000, 17_744.0),
        // TRT: "Llama 3.3 70B", "H100 TP2 (FP8)" and "H200 TP1 (FP8)" columns.
        trt(LLAMA_70B, GpuSku::H100Sxm, 2, 1000, 1000, 4_205.0),
        trt(LLAMA_70B, GpuSku::H100Sxm, 2, 2048, 128, 762.0),
        trt(LLAMA_70B, GpuSku::H200Sxm, 1, 1000, 1000, 2_909.0),
        // vLLM: "latency_llama8B_tp1", "latency_llama70B_tp4", H200, mean latency.
        vllm("meta-llama/Llama-3.1-8B", 1, 833.421),
        vllm("meta-llama/Llama-3.1-70B-Instruct", 4, 2077.53),
    ]
}

fn predict(p: &Published) -> f64 {
    let model = ModelArch::by_name(p.model).unwrap();
    let e = Estimator::new(p.gpu.spec(), model, p.tp)
        .unwrap()
        .with_weight_dtype(p.dtype)
        .with_kv_dtype(p.dtype);
    match p.metric {
        Metric::Ttft { isl } => e.prefill_ms(isl, 0),
        // Mean context over the output.
        Metric::Itl { isl, osl } => e.decode_step_ms(1, isl as f64 + osl as f64 / 2.0),
        Metric::Throughput { isl, osl } => {
            e.saturated_throughput(isl, osl, MAX_BATCH)
                .unwrap()
                .output_tokens_per_s
        }
        // One step prefills the whole batch and samples each first token; the other
        // tokens take a decode step each.
        Metric::BatchLatency { batch, isl, osl } => {
            let mut prefill = StepLoad::default();
            for _ in 0..batch {
                prefill.add_prefill(isl, 0);
            }
            let context = isl as f64 + osl as f64 / 2.0;
            e.step_ms(&prefill) + (osl - 1) as f64 * e.decode_step_ms(batch, context)
        }
    }
}

#[test]
fn predictions_stay_within_a_factor_of_two_of_published_figures() {
    let mut log_sum = 0.0;
    let rows = published();
    for p in &rows {
        let predicted = predict(p);
        let ratio = predicted / p.value;
        let what = match p.metric {
            Metric::Ttft { isl } => format!("TTFT ms, ISL {isl}"),
            Metric::Itl { isl, osl } => format!("ITL ms, {isl}/{osl}"),
            Metric::Throughput { isl, osl } => format!("tok/s, {isl}/{osl}"),
            Metric::BatchLatency { batch, isl, osl } => {
                format!("latency ms, {batch} x {isl}/{osl}")
            }
        };
        println!(
            "| {} | {} | {} TP{} {} | {what} | {} | {predicted:.1} | {ratio:.2} |",
            p.source, p.model, p.gpu, p.tp, p.dtype, p.value
        );
        assert!(
            (0.5..=2.0).contains(&ratio),
            "{} {what}: ratio {ratio:.2}",
            p.model
        );
        log_sum += ratio.ln();
    }
    let geomean = (log_sum / rows.len() as f64).exp();
    println!("geometric mean ratio {geomean:.3}");
    assert!((0.8..=1.25).contains(&geomean), "{geomean}");
}

/// The stated uncertainty (`Uncertainty::UNCALIBRATED`, from NIM's measurements under load)
/// holds for these figures too: a lone prompt's TTFT within its prefill factor, every
/// other latency within the ITL factor, a saturated throughput at least the prediction
/// over it.
#[test]
fn published_figures_are_within_the_stated_uncertainty() {
    let u = Uncertainty::UNCALIBRATED;
    for p in &published() {
        let predicted = predict(p);
        let within = match p.metric {
            Metric::Ttft { .. } => p.value <= u.prefill * predicted,
            Metric::Itl { .. } | Metric::BatchLatency { .. } => p.value <= u.itl_ms(predicted),
            Metric::Throughput { .. } => p.value >= predicted / u.itl,
        };
        assert!(
            within,
            "{} {}: {} published, {predicted:.1} predicted",
            p.source, p.model, p.value
        );
    }
}
