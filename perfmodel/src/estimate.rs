//! Step times, transfer times and memory fit of one model on one GPU type under tensor
//! parallelism. Equations and their sources: `docs/perfmodel.md`.
//!
//! One engine step is one forward pass over every token scheduled in it (prefill chunks
//! and one token per decoding sequence). Its linear layers and its attention run as
//! separate kernels, one after the other, so each takes the larger of its own compute
//! time (FLOPs over the GPUs' dense peak) and memory time (weights, or KV, over HBM
//! bandwidth), and the step their sum, plus the tensor-parallel all-reduces, which
//! overlap with neither, plus a fixed per-step overhead. A mixed step hides its decodes'
//! weight reads behind the chunk's GEMMs but not their KV reads.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{Dtype, GpuSpec, ModelArch};

// The efficiency factors were picked before the comparison with published figures in
// `docs/perfmodel.md` and not fitted to it; that table is how they are judged.

/// Fraction of the dense tensor peak that prefill reaches (its GEMMs and attention): a
/// round half. The prefill-bound published figures (a 5,000-token TTFT, the 2048/128
/// throughputs) come out at 0.92-1.00 of it.
pub const COMPUTE_EFFICIENCY: f64 = 0.5;
/// Fraction of memory bandwidth that streaming weights and KV reaches: the
/// `mem_bw_empirical_scaling_factor: 0.8` of Dynamo's AI Configurator system files
/// (`src/aiconfigurator/systems/h100_sxm.yaml`).
pub const MEMORY_EFFICIENCY: f64 = 0.8;
/// Fraction of the per-direction link bandwidth a ring all-reduce's bus bandwidth
/// reaches (protocol overhead, steps that do not overlap). The published figures here
/// barely depend on it: activations are small next to weights.
pub const TP_LINK_EFFICIENCY: f64 = 0.7;
/// Fraction of memory bandwidth attention's KV reads reach: a separate factor because
/// attention runs as its own kernels (paged, in blocks, per head group), which need not
/// stream as well as the weights' GEMMs; the weights' factor until a calibration says
/// otherwise.
pub const KV_MEMORY_EFFICIENCY: f64 = MEMORY_EFFICIENCY;
/// Fraction of a link's bandwidth a KV transfer (RDMA of many blocks) reaches. No public
/// figure here measures a KV transfer alone.
pub const TRANSFER_EFFICIENCY: f64 = 0.8;
/// Fixed cost of one all-reduce (launch and synchronisation): 8 us, between the 10 us
/// `p2p_latency` of AI Configurator's system files and the few microseconds of one-shot
/// custom all-reduce kernels. Two per layer per step: 1.3 ms a step for an 80-layer
/// model.
pub const ALLREDUCE_LATENCY_MS: f64 = 0.008;
/// Fixed cost of one step: scheduling, input preparation, sampling and the launches CUDA
/// graphs do not hide. With it, single-stream ITLs come out at 0.85-0.87 of NIM's.
pub const STEP_OVERHEAD_MS: f64 = 1.5;
/// Share of GPU memory the engine takes: the default of vLLM's
/// `--gpu-memory-utilization`, 0.9 (vLLM documentation, "Engine Arguments",
/// docs.vllm.ai/en/latest/models/engine_args.html). TensorRT-LLM's
/// `kv_cache_free_gpu_mem_fraction` defaults to 0.90 too, of what the weights leave (its
/// performance overview, perf-overview.md).
pub const GPU_MEMORY_UTILIZATION: f64 = 0.9;
/// Memory held besides weights, KV and activations: the CUDA context, CUDA graphs,
/// cuBLAS and NCCL workspaces. 2 GiB is a judgement call, below the 3.5 GiB (plus up to
/// 0.4 GiB for NCCL) AI Configurator's system files reserve "for safer deployment".
pub const RUNTIME_RESERVE_BYTES: u64 = 2 << 30;
/// Token budget of one step, which sizes the activation reserve: the mocker's
/// `--max-num-batched-tokens` default.
pub const MAX_NUM_BATCHED_TOKENS: u64 = 8192;

/// The efficiency factors, named constants by default (a field left out of a file
/// takes its constant).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Efficiency {
    pub compute: f64,
    pub memory: f64,
    pub kv_memory: f64,
    pub tp_link: f64,
    pub transfer: f64,
    pub allreduce_latency_ms: f64,
    pub step_overhead_ms: f64,
}

impl Default for Efficiency {
    fn default() -> Self {
        Self {
            compute: COMPUTE_EFFICIENCY,
            memory: MEMORY_EFFICIENCY,
            kv_memory: KV_MEMORY_EFFICIENCY,
            tp_link: TP_LINK_EFFICIENCY,
            transfer: TRANSFER_EFFICIENCY,
            allreduce_latency_ms: ALLREDUCE_LATENCY_MS,
            step_overhead_ms: STEP_OVERHEAD_MS,
        }
    }
}

/// The work of one engine step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepLoad {
    /// New prompt tokens computed (all chunks of all sequences).
    pub prefill_tokens: u64,
    /// Sequences with a prefill chunk in the step.
    pub prefill_seqs: u64,
    /// Already-computed tokens whose KV the prefill chunks attend to.
    pub prefill_context_tokens: u64,
    /// (query, key) pairs of the prefill chunks' causal attention.
    pub prefill_attention_pairs: u64,
    /// Sequences decoding one token.
    pub decode_seqs: u64,
    /// Tokens the decoding sequences attend to, summed (each sequence's whole context).
    pub decode_context_tokens: u64,
}

impl StepLoad {
    /// One prefill chunk of `new_tokens` after `cached` computed tokens.
    pub fn prefill(new_tokens: u64, cached: u64) -> Self {
        let mut load = Self::default();
        load.add_prefill(new_tokens, cached);
        load
    }

    /// `batch` sequences decoding, attending to `total_context` tokens together.
    pub fn decode(batch: u64, total_context: u64) -> Self {
        Self {
            decode_seqs: batch,
            decode_context_tokens: total_context,
            ..Self::default()
        }
    }

    pub fn add_prefill(&mut self, new_tokens: u64, cached: u64) {
        if new_tokens == 0 {
            return;
        }
        self.prefill_tokens += new_tokens;
        self.prefill_seqs += 1;
        self.prefill_context_tokens += cached;
        self.prefill_attention_pairs += attention_pairs(new_tokens, cached);
    }

    /// One sequence decoding with `context` tokens (the new one included).
    pub fn add_decode(&mut self, context: u64) {
        self.decode_seqs += 1;
        self.decode_context_tokens += context;
    }

    /// Tokens through the model in the step.
    pub fn tokens(&self) -> u64 {
        self.prefill_tokens + self.decode_seqs
    }
}

/// Causal attention of `n` new tokens after `cached` ones: token i sees `cached + i`.
pub fn attention_pairs(n: u64, cached: u64) -> u64 {
    n * cached + n * (n + 1) / 2
}

/// A part of a step that runs as its own kernels: bound by its FLOPs or by its bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Roofline {
    pub compute_ms: f64,
    pub memory_ms: f64,
}

impl Roofline {
    pub fn ms(&self) -> f64 {
        self.compute_ms.max(self.memory_ms)
    }
}

/// A step's time by part, ms.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTime {
    /// The GEMMs of the transformer blocks and the LM head, and the weights they read.
    pub linear: Roofline,
    /// Attention, and the KV it reads and writes.
    pub attention: Roofline,
    pub allreduce_ms: f64,
    pub overhead_ms: f64,
}

impl StepTime {
    pub fn total_ms(&self) -> f64 {
        self.linear.ms() + self.attention.ms() + self.allreduce_ms + self.overhead_ms
    }
}

/// What a KV transfer crosses.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Link {
    /// Within a node: NVLink, or PCIe where the GPU has none.
    NvLink,
    /// Across nodes: the GPU's scale-out NIC.
    Network,
    Pcie,
    /// Any other link, bytes/s per GPU and direction.
    Custom(f64),
}

/// Memory of one GPU of the deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub memory_bytes: u64,
    /// `memory_bytes` x `gpu_memory_utilization`.
    pub usable_bytes: u64,
    pub weight_bytes: u64,
    /// Activations at the token budget and the runtime reserve.
    pub reserve_bytes: u64,
    pub kv_cache_bytes: u64,
    pub kv_bytes_per_token: u64,
    /// Tokens of KV the deployment holds (each GPU holds its shard of each token).
    pub kv_tokens: u64,
}

impl Capacity {
    pub fn kv_blocks(&self, block_size: u64) -> u64 {
        self.kv_tokens / block_size.max(1)
    }

    /// Sequences of `context` tokens that fit at once.
    pub fn max_batch(&self, context: u64) -> u64 {
        self.kv_tokens / context.max(1)
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

#[derive(Clone, Debug, Error, PartialEq)]
pub enum DoesNotFit {
    #[error(
        "{model} does not fit on {gpu} at tensor parallel {tp}: its {dtype} weights take {:.1} GiB \
         ({weight_bytes} bytes) per GPU plus {:.1} GiB of activations and runtime, over the \
         {:.1} GiB usable of {:.1} GiB GPU memory (gpu_memory_utilization {utilization})",
        gib(*weight_bytes), gib(*reserve_bytes), gib(*usable_bytes), gib(*memory_bytes)
    )]
    Weights {
        model: String,
        gpu: String,
        tp: u64,
        dtype: Dtype,
        weight_bytes: u64,
        reserve_bytes: u64,
        usable_bytes: u64,
        memory_bytes: u64,
        utilization: f64,
    },
    #[error(
        "{model} on {gpu} at tensor parallel {tp}: the KV cache holds {kv_tokens} tokens \
         ({:.1} GiB per GPU), {needed_tokens} needed ({batch} sequences of {context} tokens)",
        gib(*kv_cache_bytes)
    )]
    KvCache {
        model: String,
        gpu: String,
        tp: u64,
        kv_tokens: u64,
        kv_cache_bytes: u64,
        needed_tokens: u64,
        batch: u64,
        context: u64,
    },
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum InvalidParallelism {
    #[error("tensor parallel size must be at least 1")]
    Zero,
    #[error("tensor parallel {tp} does not divide {heads} attention heads")]
    Heads { tp: u64, heads: u64 },
    #[error("tensor parallel {tp} and {kv_heads} KV heads: neither divides the other")]
    KvHeads { tp: u64, kv_heads: u64 },
}

/// Steady state of a saturated engine (every request ISL in, OSL out).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throughput {
    /// Sequences running at once.
    pub batch: u64,
    /// Decode step time at that batch, ms.
    pub decode_step_ms: f64,
    /// Output tokens per second of the whole deployment (all its GPUs).
    pub output_tokens_per_s: f64,
}

/// One model on `tp` GPUs of one type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Estimator {
    pub gpu: GpuSpec,
    pub model: ModelArch,
    pub tp: u64,
    pub weight_dtype: Dtype,
    pub kv_dtype: Dtype,
    pub efficiency: Efficiency,
    pub gpu_memory_utilization: f64,
    pub max_num_batched_tokens: u64,
}

impl Estimator {
    /// Weights in the checkpoint's dtype, KV in the model's (vLLM's `auto`), default
    /// efficiencies. `tp` must divide the attention heads (as vLLM requires), and the KV
    /// heads must divide `tp` or be divisible by it.
    pub fn new(gpu: GpuSpec, model: ModelArch, tp: u64) -> Result<Self, InvalidParallelism> {
        if tp == 0 {
            return Err(InvalidParallelism::Zero);
        }
        if !model.heads.is_multiple_of(tp) {
            return Err(InvalidParallelism::Heads {
                tp,
                heads: model.heads,
            });
        }
        if model.mla.is_none()
            && !model.kv_heads.is_multiple_of(tp)
            && !tp.is_multiple_of(model.kv_heads)
        {
            return Err(InvalidParallelism::KvHeads {
                tp,
                kv_heads: model.kv_heads,
            });
        }
        Ok(Self {
            weight_dtype: model.weight_dtype,
            kv_dtype: model.dtype,
            gpu,
            model,
            tp,
            efficiency: Efficiency::default(),
            gpu_memory_utilization: GPU_MEMORY_UTILIZATION,
            max_num_batched_tokens: MAX_NUM_BATCHED_TOKENS,
        })
    }

    pub fn with_weight_dtype(mut self, dtype: Dtype) -> Self {
        self.weight_dtype = dtype;
        self
    }

    pub fn with_kv_dtype(mut self, dtype: Dtype) -> Self {
        self.kv_dtype = dtype;
        self
    }

    /// Time of one step by part.
    pub fn step(&self, load: &StepLoad) -> StepTime {
        let tokens = load.tokens();
        if tokens == 0 {
            return StepTime::default();
        }
        StepTime {
            linear: Roofline {
                compute_ms: self.linear_compute_ms(load),
                memory_ms: self.weight_read_ms(load),
            },
            attention: Roofline {
                compute_ms: self.attention_compute_ms(load),
                memory_ms: self.kv_access_ms(load),
            },
            allreduce_ms: self.allreduce_ms(tokens),
            overhead_ms: self.efficiency.step_overhead_ms,
        }
    }

    /// Duration of one step, ms; 0 for an empty step.
    pub fn step_ms(&self, load: &StepLoad) -> f64 {
        self.step(load).total_ms()
    }

    /// One sequence's prefill of `new_tokens` after `cached_context` cached tokens.
    pub fn prefill_ms(&self, new_tokens: u64, cached_context: u64) -> f64 {
        self.step_ms(&StepLoad::prefill(new_tokens, cached_context))
    }

    /// One decode step of `batch` sequences of `mean_context` tokens on average.
    pub fn decode_step_ms(&self, batch: u64, mean_context: f64) -> f64 {
        let total = (batch as f64 * mean_context.max(1.0)).round() as u64;
        self.step_ms(&StepLoad::decode(batch, total))
    }

    /// Moving a prompt's KV from a prefill to a decode deployment over `link`. Each
    /// rank sends its own shard over its own link at once, so the time is one GPU's
    /// share over one GPU's bandwidth.
    pub fn kv_transfer_ms(&self, prompt_tokens: u64, link: Link) -> f64 {
        let bandwidth = match link {
            Link::NvLink => self.gpu.tp_link_bandwidth(),
            Link::Network => self.gpu.network_bandwidth,
            Link::Pcie => self.gpu.pcie_bandwidth,
            Link::Custom(bytes_per_s) => bytes_per_s,
        };
        let bytes = prompt_tokens * self.kv_bytes_per_token_per_gpu();
        bytes as f64 / (bandwidth * self.efficiency.transfer) * 1e3
    }

    pub fn kv_bytes_per_token_per_gpu(&self) -> u64 {
        self.model
            .kv_bytes_per_token_per_gpu(self.kv_dtype, self.tp)
    }

    /// Weights one GPU holds: its 1/tp share.
    pub fn weight_bytes_per_gpu(&self) -> u64 {
        self.model.weight_bytes(self.weight_dtype).div_ceil(self.tp)
    }

    /// Peak activations of a step at the token budget, on one GPU: the residual stream
    /// and the attention and MLP inputs and outputs (about four hidden-size vectors per
    /// token) plus the MLP's gate and up projections (two of its 1/tp-wide intermediates).
    fn activation_bytes(&self) -> u64 {
        let m = &self.model;
        let ffn = match &m.moe {
            Some(moe) => m
                .intermediate
                .max((moe.experts_per_token + moe.shared_experts) * moe.expert_intermediate),
            None => m.intermediate,
        };
        let per_token = 4 * m.hidden + 2 * ffn.div_ceil(self.tp);
        self.max_num_batched_tokens * per_token * m.dtype.bytes()
    }

    /// Whether the weights fit, with room for `min_batch` sequences of `max_context`
    /// tokens; the memory of one GPU either way.
    pub fn fits(&self, max_context: u64, min_batch: u64) -> Result<Capacity, DoesNotFit> {
        let memory_bytes = self.gpu.memory_bytes;
        let usable_bytes = (memory_bytes as f64 * self.gpu_memory_utilization) as u64;
        let weight_bytes = self.weight_bytes_per_gpu();
        let reserve_bytes = RUNTIME_RESERVE_BYTES + self.activation_bytes();
        let Some(kv_cache_bytes) = usable_bytes.checked_sub(weight_bytes + reserve_bytes) else {
            return Err(DoesNotFit::Weights {
                model: self.model.name.clone(),
                gpu: self.gpu.name.clone(),
                tp: self.tp,
                dtype: self.weight_dtype,
                weight_bytes,
                reserve_bytes,
                usable_bytes,
                memory_bytes,
                utilization: self.gpu_memory_utilization,
            });
        };
        let kv_bytes_per_token = self.kv_bytes_per_token_per_gpu();
        let capacity = Capacity {
            memory_bytes,
            usable_bytes,
            weight_bytes,
            reserve_bytes,
            kv_cache_bytes,
            kv_bytes_per_token,
            kv_tokens: kv_cache_bytes / kv_bytes_per_token,
        };
        let needed_tokens = max_context.saturating_mul(min_batch);
        if capacity.kv_tokens < needed_tokens {
            return Err(DoesNotFit::KvCache {
                model: self.model.name.clone(),
                gpu: self.gpu.name.clone(),
                tp: self.tp,
                kv_tokens: capacity.kv_tokens,
                kv_cache_bytes,
                needed_tokens,
                batch: min_batch,
                context: max_context,
            });
        }
        Ok(capacity)
    }

    /// Tokens of KV the deployment holds; 0 when the weights do not fit.
    pub fn max_kv_tokens(&self) -> u64 {
        self.fits(0, 0).map_or(0, |c| c.kv_tokens)
    }

    /// Output throughput with the engine saturated by requests of `isl` prompt and
    /// `osl` output tokens: as many run at once as `max_batch` and the KV cache allow
    /// (each holding its final `isl + osl` tokens, so none is preempted). While they
    /// produce `osl` tokens each in decode steps at the mean context `isl + osl / 2`,
    /// the prefills of as many new requests ride along, costing their compute and
    /// all-reduces. `None` when not one request fits.
    pub fn saturated_throughput(&self, isl: u64, osl: u64, max_batch: u64) -> Option<Throughput> {
        let capacity = self.fits(isl + osl, 1).ok()?;
        let batch = capacity.max_batch(isl + osl).min(max_batch);
        if batch == 0 || osl == 0 {
            return None;
        }
        let decode_step_ms = self.decode_step_ms(batch, isl as f64 + osl as f64 / 2.0);
        let prefill = StepLoad::prefill(isl, 0);
        let prefill_ms = self.linear_compute_ms(&prefill)
            + self.attention_compute_ms(&prefill)
            + self.allreduce_ms(isl);
        let cycle_ms = osl as f64 * decode_step_ms + batch as f64 * prefill_ms;
        Some(Throughput {
            batch,
            decode_step_ms,
            output_tokens_per_s: (batch * osl) as f64 / cycle_ms * 1e3,
        })
    }

    /// FLOPs of the linear layers over the deployment's dense peak: 2 per weight per
    /// token through the transformer blocks (active experts only) and the LM head for each
    /// sequence that samples.
    fn linear_compute_ms(&self, load: &StepLoad) -> f64 {
        let m = &self.model;
        let block_params = (m.active_params() - m.params().embeddings()) as f64;
        let lm_head = (m.vocab * m.hidden) as f64;
        let flops = 2.0 * block_params * load.tokens() as f64
            + 2.0 * lm_head * (load.prefill_seqs + load.decode_seqs) as f64;
        self.flops_ms(flops)
    }

    /// Attention's FLOPs per (query, key) pair over the deployment's dense peak.
    fn attention_compute_ms(&self, load: &StepLoad) -> f64 {
        let pairs = load.prefill_attention_pairs + load.decode_context_tokens;
        self.flops_ms(self.model.attention_flops_per_pair() * pairs as f64)
    }

    fn flops_ms(&self, flops: f64) -> f64 {
        let peak = self.gpu.peak_flops(self.weight_dtype) * self.tp as f64;
        flops / (peak * self.efficiency.compute) * 1e3
    }

    /// Weight bytes one GPU reads (its shard, and the experts the step's tokens route
    /// to) over its bandwidth.
    fn weight_read_ms(&self, load: &StepLoad) -> f64 {
        let m = &self.model;
        let p = m.params();
        let wb = self.weight_dtype.bytes() as f64;
        let eb = if self.weight_dtype == Dtype::Fp8 {
            2.0
        } else {
            wb
        };
        // The input embedding is gathered by row, so only the LM head's matrix is read.
        let blocks = (p.total() - p.embeddings() - p.routed_experts) as f64 * wb;
        let lm_head = (m.vocab * m.hidden) as f64 * eb;
        let experts = p.routed_experts as f64 * wb * self.routed_share_read(load.tokens());
        self.bytes_ms((blocks + lm_head + experts) / self.tp as f64)
    }

    /// KV bytes one GPU reads (what the step's tokens attend to) and writes (the new
    /// tokens' KV) over its bandwidth.
    fn kv_access_ms(&self, load: &StepLoad) -> f64 {
        let kv_tokens = load.prefill_context_tokens + load.decode_context_tokens + load.tokens();
        let bytes = (kv_tokens * self.kv_bytes_per_token_per_gpu()) as f64;
        bytes / (self.gpu.memory_bandwidth * self.efficiency.kv_memory) * 1e3
    }

    fn bytes_ms(&self, bytes: f64) -> f64 {
        bytes / (self.gpu.memory_bandwidth * self.efficiency.memory) * 1e3
    }

    /// Share of the routed experts a step of `tokens` tokens reads: with each token
    /// routed to k of E experts uniformly, an expert is untouched with probability
    /// (1 - k/E)^tokens.
    fn routed_share_read(&self, tokens: u64) -> f64 {
        match &self.model.moe {
            None => 0.0,
            Some(moe) => {
                let k_over_e = moe.experts_per_token as f64 / moe.experts as f64;
                1.0 - (1.0 - k_over_e).powf(tokens as f64)
            }
        }
    }

    /// Two all-reduces per layer (after attention, after the MLP) of the step's hidden
    /// states. A ring all-reduce moves 2(tp-1)/tp of the buffer through each GPU's link.
    fn allreduce_ms(&self, tokens: u64) -> f64 {
        if self.tp == 1 || tokens == 0 {
            return 0.0;
        }
        let tp = self.tp as f64;
        let bytes = (tokens * self.model.hidden * self.model.dtype.bytes()) as f64;
        let link = self.gpu.tp_link_bandwidth() * self.efficiency.tp_link;
        let one = 2.0 * (tp - 1.0) / tp * bytes / link * 1e3 + self.efficiency.allreduce_latency_ms;
        (2 * self.model.layers) as f64 * one
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuSku;

    fn est(gpu: GpuSku, model: &str, tp: u64) -> Estimator {
        Estimator::new(gpu.spec(), ModelArch::by_name(model).unwrap(), tp).unwrap()
    }

    const LLAMA_8B: &str = "meta-llama/Llama-3.1-8B-Instruct";
    const LLAMA_70B: &str = "meta-llama/Llama-3.1-70B-Instruct";

    #[test]
    fn prefill_grows_with_new_tokens_and_with_cached_context() {
        let e = est(GpuSku::H100Sxm, LLAMA_8B, 1);
        assert_eq!(e.prefill_ms(0, 0), 0.0);
        let mut last = 0.0;
        for n in [1, 16, 128, 1024, 4096, 16384, 65536] {
            let t = e.prefill_ms(n, 0);
            assert!(t > last, "{n}: {t} <= {last}");
            last = t;
        }
        // Attention is quadratic: the same chunk after a long prefix costs more.
        assert!(e.prefill_ms(1024, 32768) > e.prefill_ms(1024, 0));
        // Long prompts are compute-bound: twice the tokens, at least twice the time
        // less the fixed overhead.
        let overhead = e.efficiency.step_overhead_ms;
        assert!(e.prefill_ms(32768, 0) - overhead >= 2.0 * (e.prefill_ms(16384, 0) - overhead));
    }

    #[test]
    fn decode_is_memory_bound_and_grows_with_batch_and_context() {
        let e = est(GpuSku::H100Sxm, LLAMA_8B, 1);
        let one = e.step(&StepLoad::decode(1, 1000));
        assert!(one.linear.memory_ms > one.linear.compute_ms, "{one:?}");
        assert!(
            one.attention.memory_ms > one.attention.compute_ms,
            "{one:?}"
        );
        // A lone decode reads the weights but the input embedding (gathered by row), and
        // 1,000 tokens of KV; writes one: 15.14 GB at 80% of 3.35 TB/s = 5.65 ms.
        let bytes = 16_060_522_496u64 - 2 * 128256 * 4096 + 1001 * 131_072;
        let expected = bytes as f64 / (3.35e12 * MEMORY_EFFICIENCY) * 1e3;
        let memory = one.linear.memory_ms + one.attention.memory_ms;
        assert!((memory - expected).abs() < 1e-9, "{one:?}");
        let mut last = 0.0;
        for batch in [1, 8, 64, 256] {
            let t = e.decode_step_ms(batch, 2000.0);
            assert!(t > last, "batch {batch}");
            last = t;
        }
        assert!(e.decode_step_ms(32, 8000.0) > e.decode_step_ms(32, 1000.0));
        // Batching amortises the weights: 64 sequences take far less than 64 steps.
        assert!(e.decode_step_ms(64, 1000.0) < 4.0 * e.decode_step_ms(1, 1000.0));
    }

    #[test]
    fn tensor_parallelism_speeds_a_70b_model_up_at_an_all_reduce_cost() {
        let tp = |n| est(GpuSku::H200Sxm, LLAMA_70B, n).with_weight_dtype(Dtype::Fp8);
        let (tp1, tp2, tp4) = (tp(1), tp(2), tp(4));
        for (a, b) in [(&tp1, &tp2), (&tp2, &tp4)] {
            assert!(b.decode_step_ms(1, 1000.0) < a.decode_step_ms(1, 1000.0));
            assert!(b.prefill_ms(4000, 0) < a.prefill_ms(4000, 0));
        }
        // Not linear: all-reduces and the fixed overhead do not shrink.
        assert!(tp2.decode_step_ms(1, 1000.0) > tp1.decode_step_ms(1, 1000.0) / 2.0);
        assert_eq!(tp1.step(&StepLoad::decode(1, 1000)).allreduce_ms, 0.0);
        let ar = tp2.step(&StepLoad::decode(1, 1000)).allreduce_ms;
        assert!(ar >= 160.0 * ALLREDUCE_LATENCY_MS, "{ar}");
        // Without NVLink the all-reduces of a long prefill cost far more.
        let l40s = est(GpuSku::L40s, LLAMA_8B, 2).step(&StepLoad::prefill(8192, 0));
        let h100 = est(GpuSku::H100Sxm, LLAMA_8B, 2).step(&StepLoad::prefill(8192, 0));
        assert!(l40s.allreduce_ms > 5.0 * h100.allreduce_ms);
    }

    #[test]
    fn faster_gpus_are_faster() {
        let time = |gpu| {
            let e = est(gpu, LLAMA_8B, 1);
            (e.prefill_ms(4096, 0), e.decode_step_ms(16, 2000.0))
        };
        let (h100, h200, b200, a100, l40s) = (
            time(GpuSku::H100Sxm),
            time(GpuSku::H200Sxm),
            time(GpuSku::B200Sxm),
            time(GpuSku::A100Sxm),
            time(GpuSku::L40s),
        );
        // Decode follows memory bandwidth: B200 > H200 > H100 > A100 > L40S.
        assert!(b200.1 < h200.1 && h200.1 < h100.1 && h100.1 < a100.1 && a100.1 < l40s.1);
        // Prefill follows compute: H100 and H200 alike, B200 ahead, A100 behind.
        assert!((h100.0 - h200.0).abs() / h100.0 < 0.02);
        assert!(b200.0 < h100.0 && h100.0 < a100.0);
    }

    #[test]
    fn a_mixed_step_costs_less_than_its_parts_apart() {
        let e = est(GpuSku::H100Sxm, LLAMA_8B, 1);
        let mut mixed = StepLoad::prefill(512, 0);
        for _ in 0..32 {
            mixed.add_decode(1500);
        }
        let apart = e.prefill_ms(512, 0) + e.decode_step_ms(32, 1500.0);
        let together = e.step_ms(&mixed);
        assert!(together < apart, "{together} vs {apart}");
        assert!(together > e.prefill_ms(512, 0).max(e.decode_step_ms(32, 1500.0)));
        // The chunk's GEMMs hide the decodes' weight reads, not their KV reads: the step
        // is the chunk's alone plus at least the decodes' KV time.
        let kv = e.step(&StepLoad::decode(32, 32 * 1500)).attention.memory_ms;
        assert!(together >= e.prefill_ms(512, 0) + kv, "{together}");
    }

    #[test]
    fn moe_decode_reads_only_the_experts_it_routes_to() {
        let e = Estimator::new(
            GpuSku::H200Sxm.spec(),
            ModelArch::by_name("deepseek-ai/DeepSeek-V3").unwrap(),
            8,
        )
        .unwrap();
        assert_eq!(e.routed_share_read(0), 0.0);
        let one = e.routed_share_read(1);
        assert!((one - 8.0 / 256.0).abs() < 1e-12, "{one}");
        assert!(e.routed_share_read(64) > 0.8 && e.routed_share_read(4096) > 0.999);
        // So a batch of 64 costs far more than one sequence, unlike a dense model.
        assert!(e.decode_step_ms(64, 1000.0) > 3.0 * e.decode_step_ms(1, 1000.0));
    }

    #[test]
    fn fits_weights_and_kv_or_says_why_not() {
        // Llama 3.1 8B in BF16 on one H100: 16.06 GB of weights, the rest KV.
        let e = est(GpuSku::H100Sxm, LLAMA_8B, 1);
        let c = e.fits(131072, 1).unwrap();
        assert_eq!(c.weight_bytes, 16_060_522_496);
        assert_eq!(c.kv_bytes_per_token, 131_072);
        assert_eq!(c.usable_bytes, (85_899_345_920.0 * 0.9) as u64);
        assert_eq!(
            c.kv_cache_bytes,
            c.usable_bytes - c.weight_bytes - c.reserve_bytes
        );
        assert_eq!(c.kv_tokens, c.kv_cache_bytes / 131_072);
        assert!((400_000..500_000).contains(&c.kv_tokens), "{c:?}");
        assert_eq!(e.max_kv_tokens(), c.kv_tokens);
        assert_eq!(c.kv_blocks(16), c.kv_tokens / 16);
        // Four full 131k contexts do not.
        let err = e.fits(131072, 4).unwrap_err();
        assert!(
            matches!(
                err,
                DoesNotFit::KvCache {
                    needed_tokens: 524288,
                    ..
                }
            ),
            "{err}"
        );

        // 70B in BF16 (141 GB) fits no single GPU here but the B200.
        for gpu in [
            GpuSku::H100Sxm,
            GpuSku::H200Sxm,
            GpuSku::A100Sxm,
            GpuSku::L40s,
        ] {
            let e = est(gpu, LLAMA_70B, 1);
            let err = e.fits(1, 1).unwrap_err();
            let DoesNotFit::Weights { weight_bytes, .. } = err else {
                panic!("{err}")
            };
            assert_eq!(weight_bytes, 141_107_412_992);
            let text = err.to_string();
            assert!(
                text.contains("141107412992 bytes") && text.contains(gpu.name()),
                "{text}"
            );
            assert_eq!(e.max_kv_tokens(), 0);
        }
        assert!(est(GpuSku::B200Sxm, LLAMA_70B, 1).fits(8192, 1).is_ok());
        // TP splits weights and KV heads, so more GPUs hold more tokens.
        let tp2 = est(GpuSku::H100Sxm, LLAMA_70B, 2).max_kv_tokens();
        let tp4 = est(GpuSku::H100Sxm, LLAMA_70B, 4).max_kv_tokens();
        assert!(tp2 > 0 && tp4 > 2 * tp2, "{tp2} {tp4}");
        // DeepSeek-V3 in FP8 (~673 GB) fits eight H200s, not eight H100s.
        let ds = ModelArch::by_name("deepseek-ai/DeepSeek-V3").unwrap();
        let on = |gpu: GpuSku| Estimator::new(gpu.spec(), ds.clone(), 8).unwrap();
        assert!(on(GpuSku::H200Sxm).fits(32768, 1).is_ok());
        assert!(matches!(
            on(GpuSku::H100Sxm).fits(1, 1),
            Err(DoesNotFit::Weights { .. })
        ));
        // FP8 KV holds twice the tokens.
        let fp8 = est(GpuSku::H100Sxm, LLAMA_8B, 1).with_kv_dtype(Dtype::Fp8);
        assert_eq!(fp8.max_kv_tokens(), c.kv_cache_bytes / 65_536);
    }

    #[test]
    fn parallelism_must_divide_the_heads() {
        let m = ModelArch::by_name("Qwen/Qwen3-0.6B").unwrap();
        let new = |tp| Estimator::new(GpuSku::H100Sxm.spec(), m.clone(), tp);
        assert_eq!(new(0).unwrap_err(), InvalidParallelism::Zero);
        assert_eq!(
            new(3).unwrap_err(),
            InvalidParallelism::Heads { tp: 3, heads: 16 }
        );
        assert!(new(16).is_ok(), "KV heads replicate past 8");
        let odd = ModelArch {
            kv_heads: 3,
            heads: 12,
            ..m
        };
        let err = Estimator::new(GpuSku::H100Sxm.spec(), odd, 2).unwrap_err();
        assert_eq!(err, InvalidParallelism::KvHeads { tp: 2, kv_heads: 3 });
    }

    #[test]
    fn kv_transfer_is_bytes_over_the_link() {
        let e = est(GpuSku::H100Sxm, LLAMA_8B, 1);
        // 4096 tokens x 128 KiB = 512 MiB over 50 GB/s at 80%.
        let network = e.kv_transfer_ms(4096, Link::Network);
        let expected = 4096.0 * 131072.0 / (50e9 * TRANSFER_EFFICIENCY) * 1e3;
        assert!((network - expected).abs() < 1e-9, "{network}");
        assert!(e.kv_transfer_ms(4096, Link::NvLink) < network / 8.0);
        assert_eq!(e.kv_transfer_ms(0, Link::Network), 0.0);
        assert!(e.kv_transfer_ms(8192, Link::Pcie) > e.kv_transfer_ms(4096, Link::Pcie));
        // Each rank moves its shard at once: TP 2 halves the time.
        let tp2 = est(GpuSku::H100Sxm, LLAMA_8B, 2).kv_transfer_ms(4096, Link::Network);
        assert!((tp2 - network / 2.0).abs() < 1e-9);
        let custom = e.kv_transfer_ms(4096, Link::Custom(25e9));
        assert!((custom - 2.0 * network).abs() < 1e-9);
    }

    #[test]
    fn saturated_throughput_is_bounded_by_kv_and_batch() {
        let e = est(GpuSku::H100Sxm, LLAMA_8B, 1);
        let free = e.saturated_throughput(1000, 1000, 1 << 20).unwrap();
        assert_eq!(free.batch, e.max_kv_tokens() / 2000);
        let capped = e.saturated_throughput(1000, 1000, 8).unwrap();
        assert_eq!(capped.batch, 8);
        assert!(capped.output_tokens_per_s < free.output_tokens_per_s);
        // Longer prompts cost prefill work per output token.
        let long = e.saturated_throughput(8000, 1000, 1 << 20).unwrap();
        assert!(long.output_tokens_per_s < free.output_tokens_per_s);
        assert!(e.saturated_throughput(10_000_000, 1, 1).is_none());
    }

    #[test]
    fn an_estimator_round_trips_through_json() {
        let e = est(GpuSku::B200Sxm, "deepseek-ai/DeepSeek-V3", 8);
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<Estimator>(&json).unwrap(), e);
    }
}
