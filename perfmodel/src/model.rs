//! Model architectures: read from a Hugging Face `config.json`, or from the built-in
//! catalog of well-known models; their parameter counts, weight bytes and KV bytes.
//!
//! Assumed of every architecture: a decoder-only transformer with gated (SwiGLU) MLPs,
//! i.e. three `hidden x intermediate` matrices per MLP, as all the catalog's models
//! have. Attention is grouped-query (GQA), or DeepSeek's multi-head latent attention
//! (MLA) when `kv_lora_rank` is present. Norm weights are counted; biases are not.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{Dtype, UnknownDtype};

/// Mixture-of-experts MLP.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Moe {
    /// Routed experts per MoE layer.
    pub experts: u64,
    /// Routed experts each token goes to.
    pub experts_per_token: u64,
    /// Intermediate size of one expert.
    pub expert_intermediate: u64,
    /// Experts every token goes through (DeepSeek's `n_shared_experts`).
    pub shared_experts: u64,
    /// Leading layers with a dense MLP instead (DeepSeek's `first_k_dense_replace`).
    pub dense_layers: u64,
}

/// DeepSeek's multi-head latent attention: the cache holds one compressed latent
/// (`kv_lora_rank`) plus the shared rotary key (`qk_rope_head_dim`) per token and layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mla {
    pub q_lora_rank: Option<u64>,
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelArch {
    pub name: String,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    /// MLP intermediate size of the dense layers.
    pub intermediate: u64,
    pub vocab: u64,
    /// `torch_dtype`: activations, and the KV cache unless told otherwise.
    pub dtype: Dtype,
    /// The checkpoint's weights: `dtype`, or FP8 for an FP8-quantized checkpoint.
    pub weight_dtype: Dtype,
    /// `max_position_embeddings`.
    pub max_context: u64,
    pub tie_word_embeddings: bool,
    pub moe: Option<Moe>,
    pub mla: Option<Mla>,
}

/// Parameters by part, summed over all layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamCounts {
    pub attention: u64,
    pub dense_mlp: u64,
    /// Every routed expert of every MoE layer.
    pub routed_experts: u64,
    /// Shared experts and routers of the MoE layers.
    pub shared_experts: u64,
    pub norms: u64,
    pub embedding: u64,
    /// 0 when tied to the embedding.
    pub lm_head: u64,
}

impl ParamCounts {
    pub fn total(&self) -> u64 {
        self.attention
            + self.dense_mlp
            + self.routed_experts
            + self.shared_experts
            + self.norms
            + self.embedding
            + self.lm_head
    }

    /// Embedding and LM head: kept at 16 bits by FP8 quantizers.
    pub fn embeddings(&self) -> u64 {
        self.embedding + self.lm_head
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("config.json is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("config.json lacks {0}")]
    Missing(&'static str),
    #[error("config.json: {0}")]
    Dtype(#[from] UnknownDtype),
    #[error("config.json: {0}")]
    Invalid(String),
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("no architecture for model {name:?} in the catalog (known: {})", catalog_names().join(", "))]
pub struct UnknownModel {
    pub name: String,
}

/// The fields of `config.json` this model reads. Multimodal configs keep the language
/// model's under `text_config`.
#[derive(Default, Deserialize)]
struct HfConfig {
    num_hidden_layers: Option<u64>,
    hidden_size: Option<u64>,
    num_attention_heads: Option<u64>,
    num_key_value_heads: Option<u64>,
    head_dim: Option<u64>,
    intermediate_size: Option<u64>,
    vocab_size: Option<u64>,
    torch_dtype: Option<String>,
    /// Newer transformers write `dtype` instead of `torch_dtype`.
    dtype: Option<String>,
    max_position_embeddings: Option<u64>,
    tie_word_embeddings: Option<bool>,
    num_experts: Option<u64>,
    n_routed_experts: Option<u64>,
    num_local_experts: Option<u64>,
    num_experts_per_tok: Option<u64>,
    moe_intermediate_size: Option<u64>,
    n_shared_experts: Option<u64>,
    first_k_dense_replace: Option<u64>,
    q_lora_rank: Option<u64>,
    kv_lora_rank: Option<u64>,
    qk_nope_head_dim: Option<u64>,
    qk_rope_head_dim: Option<u64>,
    v_head_dim: Option<u64>,
    quantization_config: Option<QuantizationConfig>,
    text_config: Option<Box<HfConfig>>,
}

#[derive(Default, Deserialize)]
struct QuantizationConfig {
    quant_method: Option<String>,
}

impl ModelArch {
    /// Reads a Hugging Face `config.json`.
    pub fn from_config_json(name: &str, json: &str) -> Result<Self, ConfigError> {
        let outer: HfConfig = serde_json::from_str(json)?;
        let quant = outer
            .quantization_config
            .as_ref()
            .and_then(|q| q.quant_method.clone());
        let outer_dtype = outer.torch_dtype.clone().or(outer.dtype.clone());
        let c = match outer.text_config {
            Some(text) if outer.num_hidden_layers.is_none() => *text,
            _ => outer,
        };
        let need = |v: Option<u64>, field: &'static str| match v {
            Some(0) => Err(ConfigError::Invalid(format!("{field} is 0"))),
            Some(n) => Ok(n),
            None => Err(ConfigError::Missing(field)),
        };
        let layers = need(c.num_hidden_layers, "num_hidden_layers")?;
        let hidden = need(c.hidden_size, "hidden_size")?;
        let heads = need(c.num_attention_heads, "num_attention_heads")?;
        let kv_heads = need(c.num_key_value_heads.or(Some(heads)), "num_key_value_heads")?;
        if !heads.is_multiple_of(kv_heads) {
            return Err(ConfigError::Invalid(format!(
                "{heads} attention heads do not group into {kv_heads} KV heads"
            )));
        }
        let head_dim = need(c.head_dim.or(Some(hidden / heads)), "head_dim")?;
        let intermediate = need(c.intermediate_size, "intermediate_size")?;
        let vocab = need(c.vocab_size, "vocab_size")?;
        let dtype: Dtype = c
            .torch_dtype
            .or(c.dtype)
            .or(outer_dtype)
            .as_deref()
            .unwrap_or("bfloat16")
            .parse()?;
        // DeepSeek-V3's checkpoint says `torch_dtype: bfloat16` but ships FP8 weights.
        let weight_dtype = match quant.as_deref() {
            Some(q) if q.eq_ignore_ascii_case("fp8") => Dtype::Fp8,
            _ => dtype,
        };
        let experts = c.num_experts.or(c.n_routed_experts).or(c.num_local_experts);
        let moe = match experts {
            None | Some(0) => None,
            Some(experts) => {
                let per_token = need(c.num_experts_per_tok, "num_experts_per_tok")?;
                if per_token > experts {
                    return Err(ConfigError::Invalid(format!(
                        "{per_token} experts per token of {experts}"
                    )));
                }
                let dense_layers = c.first_k_dense_replace.unwrap_or(0).min(layers);
                Some(Moe {
                    experts,
                    experts_per_token: per_token,
                    // Mixtral names an expert's size `intermediate_size`.
                    expert_intermediate: c.moe_intermediate_size.unwrap_or(intermediate),
                    shared_experts: c.n_shared_experts.unwrap_or(0),
                    dense_layers,
                })
            }
        };
        let mla = match c.kv_lora_rank {
            None | Some(0) => None,
            Some(kv_lora_rank) => Some(Mla {
                q_lora_rank: c.q_lora_rank.filter(|&r| r > 0),
                kv_lora_rank,
                qk_nope_head_dim: need(c.qk_nope_head_dim, "qk_nope_head_dim")?,
                qk_rope_head_dim: need(c.qk_rope_head_dim, "qk_rope_head_dim")?,
                v_head_dim: need(c.v_head_dim, "v_head_dim")?,
            }),
        };
        Ok(Self {
            name: name.into(),
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
            dtype,
            weight_dtype,
            max_context: c.max_position_embeddings.unwrap_or(0),
            tie_word_embeddings: c.tie_word_embeddings.unwrap_or(false),
            moe,
            mla,
        })
    }

    /// The catalog architecture of a Hugging Face model name (case-insensitive; the
    /// organisation prefix may be left out).
    pub fn by_name(name: &str) -> Result<Self, UnknownModel> {
        let wanted = name.trim().to_ascii_lowercase();
        let short = |n: &str| n.rsplit('/').next().unwrap_or(n).to_ascii_lowercase();
        let matches = |n: &str| {
            n.eq_ignore_ascii_case(&wanted) || (!wanted.contains('/') && short(n) == wanted)
        };
        if let Some((fp8, base)) = FP8_CHECKPOINTS.iter().find(|(fp8, _)| matches(fp8)) {
            let mut arch = Self::by_name(base)?;
            arch.name = (*fp8).into();
            arch.weight_dtype = Dtype::Fp8;
            return Ok(arch);
        }
        CATALOG
            .iter()
            .find(|e| e.names.iter().any(|n| matches(n)))
            .map(|e| Self::from_config_json(e.names[0], e.config).expect("catalog entries parse"))
            .ok_or_else(|| UnknownModel { name: name.into() })
    }

    pub fn params(&self) -> ParamCounts {
        let (h, l) = (self.hidden, self.layers);
        let attention = l * match &self.mla {
            None => {
                let q_and_o = 2 * h * self.heads * self.head_dim;
                q_and_o + 2 * h * self.kv_heads * self.head_dim
            }
            Some(m) => {
                let qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
                let q = match m.q_lora_rank {
                    // Down-projection, its norm, up-projection.
                    Some(r) => h * r + r + r * self.heads * qk_dim,
                    None => h * self.heads * qk_dim,
                };
                let kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank;
                let kv_up = m.kv_lora_rank * self.heads * (m.qk_nope_head_dim + m.v_head_dim);
                q + kv_down + kv_up + self.heads * m.v_head_dim * h
            }
        };
        let (dense_layers, routed_experts, shared_experts) = match &self.moe {
            None => (l, 0, 0),
            Some(m) => {
                let moe_layers = l - m.dense_layers;
                let expert = self.mlp_params(m.expert_intermediate);
                let router = h * m.experts;
                (
                    m.dense_layers,
                    moe_layers * m.experts * expert,
                    moe_layers * (m.shared_experts * expert + router),
                )
            }
        };
        let embedding = self.vocab * h;
        ParamCounts {
            attention,
            dense_mlp: dense_layers * self.mlp_params(self.intermediate),
            routed_experts,
            shared_experts,
            norms: (2 * l + 1) * h,
            embedding,
            lm_head: if self.tie_word_embeddings {
                0
            } else {
                embedding
            },
        }
    }

    pub fn total_params(&self) -> u64 {
        self.params().total()
    }

    /// Parameters one token goes through: every routed expert counted at the share
    /// `experts_per_token / experts` a token uses.
    pub fn active_params(&self) -> u64 {
        let p = self.params();
        p.total() - p.routed_experts + self.active_routed_params()
    }

    pub(crate) fn active_routed_params(&self) -> u64 {
        match &self.moe {
            None => 0,
            Some(m) => self.params().routed_experts / m.experts * m.experts_per_token,
        }
    }

    /// A gated MLP's three matrices.
    fn mlp_params(&self, intermediate: u64) -> u64 {
        3 * self.hidden * intermediate
    }

    /// Bytes of the weights at `dtype`. An FP8 checkpoint keeps its embedding and LM
    /// head at 16 bits (NVIDIA's ModelOpt FP8 model cards: "Only the weights and
    /// activations of the linear operators within transformers blocks are quantized";
    /// DeepSeek-V3's FP8 checkpoint likewise).
    pub fn weight_bytes(&self, dtype: Dtype) -> u64 {
        let p = self.params();
        let embedding_bytes = if dtype == Dtype::Fp8 {
            2
        } else {
            dtype.bytes()
        };
        (p.total() - p.embeddings()) * dtype.bytes() + p.embeddings() * embedding_bytes
    }

    /// KV cache bytes of one token over all layers and all tensor-parallel ranks.
    pub fn kv_bytes_per_token(&self, kv_dtype: Dtype) -> u64 {
        self.kv_bytes_per_token_per_gpu(kv_dtype, 1)
    }

    /// KV cache bytes of one token on one of `tp` ranks. GQA shards the KV heads across
    /// ranks, each rank keeping at least one (vLLM replicates a KV head when `tp`
    /// exceeds the KV heads); MLA's latent is not split by heads, so every rank keeps
    /// all of it.
    pub fn kv_bytes_per_token_per_gpu(&self, kv_dtype: Dtype, tp: u64) -> u64 {
        let per_layer = match &self.mla {
            None => 2 * (self.kv_heads / tp.max(1)).max(1) * self.head_dim,
            Some(m) => m.kv_lora_rank + m.qk_rope_head_dim,
        };
        self.layers * per_layer * kv_dtype.bytes()
    }

    /// FLOPs of attention for one (query, key) pair over all layers: QK^T and PV, a
    /// multiply-add (2 FLOPs) per element, summed over heads.
    pub fn attention_flops_per_pair(&self) -> f64 {
        let (qk, v) = match &self.mla {
            None => (self.head_dim, self.head_dim),
            Some(m) => (m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim),
        };
        2.0 * (self.layers * self.heads * (qk + v)) as f64
    }
}

/// Catalog names, canonical ones first.
pub fn catalog_names() -> Vec<&'static str> {
    CATALOG
        .iter()
        .flat_map(|e| e.names.iter().copied())
        .chain(FP8_CHECKPOINTS.iter().map(|(fp8, _)| *fp8))
        .collect()
}

struct CatalogEntry {
    /// Hugging Face names sharing the architecture, canonical first.
    names: &'static [&'static str],
    /// The `config.json` fields we read, as published.
    config: &'static str,
}

/// NVIDIA's ModelOpt FP8 checkpoints and their base models: the same architecture with
/// FP8 weights in the transformer blocks (their model cards, see `weight_bytes`).
const FP8_CHECKPOINTS: &[(&str, &str)] = &[
    (
        "nvidia/Llama-3.1-8B-Instruct-FP8",
        "meta-llama/Llama-3.1-8B-Instruct",
    ),
    (
        "nvidia/Llama-3.3-70B-Instruct-FP8",
        "meta-llama/Llama-3.3-70B-Instruct",
    ),
];

// Each config below is the model's published `config.json`
// (huggingface.co/<name>/blob/main/config.json), trimmed to the fields read.
const CATALOG: &[CatalogEntry] = &[
    // meta-llama/Llama-3.1-8B; model card: 8B parameters.
    CatalogEntry {
        names: &[
            "meta-llama/Llama-3.1-8B-Instruct",
            "meta-llama/Llama-3.1-8B",
            "meta-llama/Meta-Llama-3.1-8B-Instruct",
            "meta-llama/Meta-Llama-3.1-8B",
        ],
        config: r#"{"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
            "max_position_embeddings": 131072, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16"}"#,
    },
    // meta-llama/Llama-3.1-70B; model card: 70B (70.6B in its safetensors index).
    // Llama 3.3 70B keeps the 3.1 architecture.
    CatalogEntry {
        names: &[
            "meta-llama/Llama-3.1-70B-Instruct",
            "meta-llama/Llama-3.1-70B",
            "meta-llama/Meta-Llama-3.1-70B-Instruct",
            "meta-llama/Meta-Llama-3.1-70B",
            "meta-llama/Llama-3.3-70B-Instruct",
        ],
        config: r#"{"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
            "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
            "max_position_embeddings": 131072, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16"}"#,
    },
    // Qwen/Qwen3-0.6B; model card: 0.6B parameters, 0.44B non-embedding.
    CatalogEntry {
        names: &["Qwen/Qwen3-0.6B"],
        config: r#"{"num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
            "vocab_size": 151936, "max_position_embeddings": 40960,
            "tie_word_embeddings": true, "torch_dtype": "bfloat16"}"#,
    },
    // Qwen/Qwen3-8B; model card: 8.2B parameters, 6.95B non-embedding.
    CatalogEntry {
        names: &["Qwen/Qwen3-8B"],
        config: r#"{"num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
            "vocab_size": 151936, "max_position_embeddings": 40960,
            "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#,
    },
    // Qwen/Qwen3-32B; model card: 32.8B parameters, 31.2B non-embedding.
    CatalogEntry {
        names: &["Qwen/Qwen3-32B"],
        config: r#"{"num_hidden_layers": 64, "hidden_size": 5120, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600,
            "vocab_size": 151936, "max_position_embeddings": 40960,
            "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#,
    },
    // deepseek-ai/DeepSeek-V3; model card: 671B total, 37B activated per token (plus a
    // 14B multi-token-prediction module, not modelled). FP8 weights
    // (`quantization_config.quant_method: fp8`). DeepSeek-R1 shares the architecture.
    CatalogEntry {
        names: &[
            "deepseek-ai/DeepSeek-V3",
            "deepseek-ai/DeepSeek-V3-0324",
            "deepseek-ai/DeepSeek-R1",
            "deepseek-ai/DeepSeek-R1-0528",
        ],
        config: r#"{"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
            "num_key_value_heads": 128, "intermediate_size": 18432, "vocab_size": 129280,
            "max_position_embeddings": 163840, "tie_word_embeddings": false,
            "torch_dtype": "bfloat16", "n_routed_experts": 256, "num_experts_per_tok": 8,
            "moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 3,
            "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128,
            "quantization_config": {"quant_method": "fp8"}}"#,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    fn within(actual: u64, published: f64, tolerance: f64) -> bool {
        ((actual as f64) / published - 1.0).abs() <= tolerance
    }

    #[test]
    fn parameter_counts_match_the_published_ones() {
        // (name, published total, published active), from each model card.
        let published = [
            ("meta-llama/Llama-3.1-8B", 8.0e9, 8.0e9),
            ("meta-llama/Llama-3.1-70B", 70.6e9, 70.6e9),
            ("Qwen/Qwen3-0.6B", 0.6e9, 0.6e9),
            ("Qwen/Qwen3-8B", 8.2e9, 8.2e9),
            ("Qwen/Qwen3-32B", 32.8e9, 32.8e9),
            ("deepseek-ai/DeepSeek-V3", 671e9, 37e9),
        ];
        for (name, total, active) in published {
            let m = ModelArch::by_name(name).unwrap();
            let (t, a) = (m.total_params(), m.active_params());
            assert!(within(t, total, 0.03), "{name}: {t} vs {total}");
            assert!(within(a, active, 0.03), "{name}: active {a} vs {active}");
        }
        // Non-embedding counts on the Qwen3 cards: 0.44B, 6.95B, 31.2B.
        for (name, non_embedding) in [
            ("Qwen/Qwen3-0.6B", 0.44e9),
            ("Qwen/Qwen3-8B", 6.95e9),
            ("Qwen/Qwen3-32B", 31.2e9),
        ] {
            let p = ModelArch::by_name(name).unwrap().params();
            let n = p.total() - p.embeddings();
            assert!(within(n, non_embedding, 0.01), "{name}: {n}");
        }
    }

    #[test]
    fn llama_8b_counts_by_hand() {
        let m = ModelArch::by_name("meta-llama/Llama-3.1-8B-Instruct").unwrap();
        let p = m.params();
        // q and o 4096x4096, k and v 4096x1024, per layer.
        assert_eq!(p.attention, 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024));
        assert_eq!(p.dense_mlp, 32 * 3 * 4096 * 14336);
        assert_eq!((p.embedding, p.lm_head), (128256 * 4096, 128256 * 4096));
        assert_eq!(p.total(), 8_030_261_248);
        assert_eq!(m.weight_bytes(Dtype::Bf16), 2 * 8_030_261_248);
        // FP8 halves the transformer blocks, not the embedding and LM head.
        let emb = 2 * 128256 * 4096;
        assert_eq!(m.weight_bytes(Dtype::Fp8), (8_030_261_248 - emb) + 2 * emb);
    }

    #[test]
    fn kv_bytes_per_token_by_hand() {
        let llama = ModelArch::by_name("meta-llama/Llama-3.1-8B").unwrap();
        // 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes.
        assert_eq!(llama.kv_bytes_per_token(Dtype::Bf16), 131_072);
        assert_eq!(llama.kv_bytes_per_token(Dtype::Fp8), 65_536);
        // TP shards KV heads: 4 of 8 per rank at TP 2; at TP 16 each rank keeps one.
        assert_eq!(llama.kv_bytes_per_token_per_gpu(Dtype::Bf16, 2), 65_536);
        assert_eq!(llama.kv_bytes_per_token_per_gpu(Dtype::Bf16, 16), 16_384);
        // MLA: the latent (512) and the rotary key (64) per layer, on every rank.
        let ds = ModelArch::by_name("deepseek-ai/DeepSeek-V3").unwrap();
        assert_eq!(ds.kv_bytes_per_token(Dtype::Bf16), 61 * 576 * 2);
        assert_eq!(ds.kv_bytes_per_token_per_gpu(Dtype::Bf16, 8), 61 * 576 * 2);
        assert_eq!(ds.weight_dtype, Dtype::Fp8);
        assert_eq!(ds.moe.as_ref().unwrap().dense_layers, 3);
    }

    #[test]
    fn nvidias_fp8_checkpoints_have_fp8_weights_and_the_base_models_architecture() {
        for (base, fp8) in [
            (
                "meta-llama/Llama-3.1-8B-Instruct",
                "nvidia/Llama-3.1-8B-Instruct-FP8",
            ),
            (
                "meta-llama/Llama-3.3-70B-Instruct",
                "nvidia/Llama-3.3-70B-Instruct-FP8",
            ),
        ] {
            let (b, q) = (
                ModelArch::by_name(base).unwrap(),
                ModelArch::by_name(fp8).unwrap(),
            );
            assert_eq!((b.weight_dtype, q.weight_dtype), (Dtype::Bf16, Dtype::Fp8));
            assert_eq!(q.name, fp8);
            assert_eq!((q.dtype, q.params()), (b.dtype, b.params()));
        }
    }

    #[test]
    fn config_json_reads_defaults_aliases_and_text_config() {
        // head_dim defaults to hidden / heads; no KV heads means multi-head attention.
        let m = ModelArch::from_config_json(
            "x",
            r#"{"text_config": {"num_hidden_layers": 2, "hidden_size": 256,
                "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000,
                "num_local_experts": 8, "num_experts_per_tok": 2}, "dtype": "float16"}"#,
        )
        .unwrap();
        assert_eq!((m.head_dim, m.kv_heads, m.dtype), (64, 4, Dtype::F16));
        let moe = m.moe.unwrap();
        assert_eq!((moe.experts, moe.expert_intermediate), (8, 512));
        assert_eq!(m.weight_dtype, Dtype::F16);
    }

    #[test]
    fn incomplete_or_inconsistent_configs_are_refused() {
        let err = ModelArch::from_config_json(
            "qwen-mock",
            r#"{"num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14,
                "num_key_value_heads": 2, "vocab_size": 151851}"#,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "config.json lacks intermediate_size");
        let err = ModelArch::from_config_json(
            "x",
            r#"{"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 3,
                "num_key_value_heads": 2, "intermediate_size": 8, "vocab_size": 8}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("do not group"), "{err}");
        assert!(ModelArch::from_config_json("x", "[").is_err());
    }

    #[test]
    fn catalog_lookup_is_case_insensitive_and_lists_names_on_a_miss() {
        for name in ["qwen/qwen3-8b", "Qwen3-8B", "QWEN/QWEN3-8B"] {
            assert_eq!(ModelArch::by_name(name).unwrap().name, "Qwen/Qwen3-8B");
        }
        let llama = ModelArch::by_name("meta-llama/Llama-3.3-70B-Instruct").unwrap();
        assert_eq!(llama.name, "meta-llama/Llama-3.1-70B-Instruct");
        let err = ModelArch::by_name("gpt2").unwrap_err().to_string();
        assert!(
            err.contains("\"gpt2\"") && err.contains("Qwen/Qwen3-0.6B"),
            "{err}"
        );
        // Another organisation's model of the same short name is not ours.
        assert!(ModelArch::by_name("someone/Qwen3-8B").is_err());
        for name in catalog_names() {
            assert!(ModelArch::by_name(name).is_ok(), "{name}");
        }
    }
}
