//! The engine's side of the sidecar's KV block API (`DESIGN.md`, "KV blocks in the
//! sidecar"), without I/O: its settings, the size of one block's KV from the model's
//! `config.json`, the bytes a block holds, and the modelled time to bring blocks back.
//!
//! A block's payload is derived from its sequence hash alone (the SplitMix64 stream
//! seeded with it), so any engine of the model can tell whether bytes it received are
//! that block's: a wrong, stale or corrupted block never passes as another.

use bytes::Bytes;
use dynamo_kvcache::{SeqHash, Tier};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::tokens::splitmix64;

/// G2 (pinned CPU DRAM): ~200 GB/s (`shared/research/brief.md`, "Memory tiers").
pub const DEFAULT_HOST_BANDWIDTH_GBPS: f64 = 200.0;
/// G3 (local NVMe): 7-12 GB/s per drive; the low end, one drive (brief, "Memory tiers").
pub const DEFAULT_DISK_BANDWIDTH_GBPS: f64 = 7.0;
/// G4 (remote storage): 10-100 Gb/s; the low end, 10 Gb/s = 1.25 GB/s (brief, "Memory tiers").
pub const DEFAULT_OBJECT_BANDWIDTH_GBPS: f64 = 1.25;
/// A disaggregated prefill's KV, prefill GPU to decode GPU: InfiniBand, 400 Gb/s = 50 GB/s,
/// across nodes (brief, "Transfer (NIXL) transports"). Within one node NVLink carries
/// it at 900 GB/s (NVL72), which `--kv-link-bandwidth-gbps 900` models.
pub const DEFAULT_LINK_BANDWIDTH_GBPS: f64 = 50.0;

/// Limit of one lookup + onboard: a healthy loopback lookup and onboard take
/// milliseconds; a second is far past that, yet short of what most long-prompt
/// recomputes cost at a queue.
pub const DEFAULT_TIMEOUT_MS: u64 = 1000;

/// Which blocks the engine hands to its sidecar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OffloadMode {
    /// Each block as the GPU pool evicts it (vLLM's offloading connector).
    #[default]
    Evicted,
    /// Every block as soon as it is full and registered (write-through).
    All,
    /// None, and no lookups in the tiers either: only the leases of disaggregated
    /// serving (a disaggregated graph without KVBM).
    None,
}

/// The sidecar's block API as the engine's offload tier (the role of vLLM's
/// `--kv-transfer-config`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvBlocksConfig {
    /// The sidecar's gRPC address.
    pub url: String,
    pub offload: OffloadMode,
    /// Payload bytes actually moved, as a fraction of the model's real KV bytes per
    /// block (at least 1 byte): a small value keeps tests and crowded hosts light.
    /// Modelled transfer times always use the real size.
    pub bytes_scale: f64,
    /// Onboarding bandwidth from each sidecar tier, GB/s (10^9 bytes per second).
    pub host_bandwidth_gbps: f64,
    pub disk_bandwidth_gbps: f64,
    pub object_bandwidth_gbps: f64,
    /// Bandwidth of the link a disaggregated prefill's KV crosses, GB/s.
    pub link_bandwidth_gbps: f64,
    /// Limit of one lookup + onboard (and of one offload, lend or lease fetch); past it
    /// the request recomputes its prefix.
    pub timeout_ms: u64,
    /// Names this engine in the `kv_transfer_params` it answers a prefill with
    /// (`remote_engine_id`; vLLM's `kv_transfer_config.engine_id`); `None`: a random id
    /// made at start, as vLLM's default uuid.
    pub engine_id: Option<String>,
    /// File of the graph's block API credential, sent with every call (a sidecar given
    /// one refuses calls without it).
    pub token_file: Option<std::path::PathBuf>,
}

impl Default for KvBlocksConfig {
    fn default() -> Self {
        Self {
            // The sidecar's gRPC port.
            url: "http://127.0.0.1:9100".into(),
            offload: OffloadMode::Evicted,
            bytes_scale: 1.0,
            host_bandwidth_gbps: DEFAULT_HOST_BANDWIDTH_GBPS,
            disk_bandwidth_gbps: DEFAULT_DISK_BANDWIDTH_GBPS,
            object_bandwidth_gbps: DEFAULT_OBJECT_BANDWIDTH_GBPS,
            link_bandwidth_gbps: DEFAULT_LINK_BANDWIDTH_GBPS,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            engine_id: None,
            token_file: None,
        }
    }
}

impl KvBlocksConfig {
    /// Modelled milliseconds to copy `bytes` from `tier` into the GPU (before the
    /// speedup ratio).
    pub fn transfer_ms(&self, bytes: u64, tier: Tier) -> f64 {
        let gbps = match tier {
            Tier::Gpu => return 0.0,
            Tier::Host => self.host_bandwidth_gbps,
            Tier::Disk => self.disk_bandwidth_gbps,
            Tier::Object => self.object_bandwidth_gbps,
        };
        bytes as f64 / (gbps * 1e6)
    }

    /// Modelled milliseconds to move `bytes` from a prefill engine's GPU (before the
    /// speedup ratio).
    pub fn link_ms(&self, bytes: u64) -> f64 {
        bytes as f64 / (self.link_bandwidth_gbps * 1e6)
    }

    /// Whether blocks go to and come back from the sidecar's tiers.
    pub fn uses_tiers(&self) -> bool {
        self.offload != OffloadMode::None
    }

    /// Payload bytes of a block whose real KV is `real_bytes`.
    pub fn payload_bytes(&self, real_bytes: u64) -> u64 {
        ((real_bytes as f64 * self.bytes_scale).round() as u64).max(1)
    }

    pub(crate) fn invalid_field(&self) -> Option<&'static str> {
        let positive = |x: f64| x > 0.0 && x.is_finite();
        [
            (positive(self.bytes_scale), "kv_blocks.bytes_scale"),
            (
                positive(self.host_bandwidth_gbps),
                "kv_blocks.host_bandwidth_gbps",
            ),
            (
                positive(self.disk_bandwidth_gbps),
                "kv_blocks.disk_bandwidth_gbps",
            ),
            (
                positive(self.object_bandwidth_gbps),
                "kv_blocks.object_bandwidth_gbps",
            ),
            (
                positive(self.link_bandwidth_gbps),
                "kv_blocks.link_bandwidth_gbps",
            ),
            (self.timeout_ms > 0, "kv_blocks.timeout_ms"),
        ]
        .into_iter()
        .find_map(|(ok, name)| (!ok).then_some(name))
    }
}

/// Why `config.json` does not say how big the KV cache is.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GeometryError {
    #[error("config.json has no positive integer {0:?}")]
    Missing(&'static str),
    #[error("config.json: KV dtype {0:?} is not bfloat16, float16 or float32")]
    Dtype(String),
}

/// The shape of a model's KV cache, from its Hugging Face `config.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// The dtype's name as `config.json` spells it, e.g. `bfloat16`.
    pub dtype: String,
    pub dtype_bytes: u32,
}

impl KvGeometry {
    /// `num_hidden_layers`, `num_key_value_heads` (else `num_attention_heads`: no GQA),
    /// `head_dim` (else `hidden_size / num_attention_heads`), `torch_dtype` (newer
    /// transformers: `dtype`; absent: bfloat16). Multimodal configs keep these under
    /// `text_config`. Attention variants that shrink the cache (MLA, sliding windows)
    /// are not modelled.
    pub fn from_config(config: &Value) -> Result<Self, GeometryError> {
        let text = config
            .get("text_config")
            .filter(|_| config.get("num_hidden_layers").is_none())
            .unwrap_or(config);
        let int = |key| {
            text.get(key)
                .and_then(Value::as_u64)
                .filter(|&n| n > 0 && n <= u32::MAX as u64)
                .map(|n| n as u32)
        };
        let layers = int("num_hidden_layers").ok_or(GeometryError::Missing("num_hidden_layers"))?;
        let heads = int("num_attention_heads");
        let kv_heads = int("num_key_value_heads")
            .or(heads)
            .ok_or(GeometryError::Missing("num_key_value_heads"))?;
        let head_dim = int("head_dim")
            .or_else(|| Some(int("hidden_size")? / heads?).filter(|&d| d > 0))
            .ok_or(GeometryError::Missing("head_dim"))?;
        let dtype = ["torch_dtype", "dtype"]
            .iter()
            .find_map(|k| text.get(k).or_else(|| config.get(k))?.as_str())
            .unwrap_or("bfloat16");
        let dtype_bytes = match dtype {
            "bfloat16" | "float16" => 2,
            "float32" => 4,
            other => return Err(GeometryError::Dtype(other.into())),
        };
        Ok(Self {
            layers,
            kv_heads,
            head_dim,
            dtype: dtype.into(),
            dtype_bytes,
        })
    }

    /// K and V of every layer for `block_size` tokens.
    pub fn block_bytes(&self, block_size: usize) -> u64 {
        2 * u64::from(self.layers)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
            * block_size as u64
    }
}

/// Word `i` of the payload of `hash`: the SplitMix64 stream seeded with the hash.
fn word(hash: SeqHash, i: usize) -> [u8; 8] {
    splitmix64(
        hash.0
            .wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
    )
    .to_le_bytes()
}

/// The `len` payload bytes of block `hash`.
pub fn payload(hash: SeqHash, len: usize) -> Bytes {
    let mut out = vec![0u8; len];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&word(hash, i)[..chunk.len()]);
    }
    out.into()
}

/// Whether `bytes` is the payload of block `hash` (of that length).
pub fn is_payload_of(hash: SeqHash, bytes: &[u8]) -> bool {
    bytes
        .chunks(8)
        .enumerate()
        .all(|(i, chunk)| chunk == &word(hash, i)[..chunk.len()])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn geometry_of_qwen2_gqa_with_derived_head_dim() {
        // Qwen2.5-0.5B: 24 layers, 2 KV heads, 896 / 14 = 64 per head, bfloat16.
        let g = KvGeometry::from_config(&json!({
            "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "torch_dtype": "bfloat16"
        }))
        .unwrap();
        assert_eq!(
            (g.layers, g.kv_heads, g.head_dim, g.dtype_bytes),
            (24, 2, 64, 2)
        );
        assert_eq!(g.block_bytes(16), 2 * 24 * 2 * 64 * 2 * 16);
    }

    #[test]
    fn geometry_reads_head_dim_text_config_and_defaults() {
        // Llama 3 70B's numbers under `text_config`, explicit head_dim, float32, no GQA.
        let g = KvGeometry::from_config(&json!({
            "dtype": "float32",
            "text_config": {"hidden_size": 8192, "num_hidden_layers": 80,
                            "num_attention_heads": 64, "head_dim": 128}
        }))
        .unwrap();
        assert_eq!(
            (g.layers, g.kv_heads, g.head_dim, g.dtype_bytes),
            (80, 64, 128, 4)
        );
        assert_eq!(g.dtype, "float32");
        let err = KvGeometry::from_config(&json!({"num_hidden_layers": 2})).unwrap_err();
        assert_eq!(err, GeometryError::Missing("num_key_value_heads"));
        let err = KvGeometry::from_config(&json!({
            "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 8, "torch_dtype": "int8"
        }))
        .unwrap_err();
        assert_eq!(err, GeometryError::Dtype("int8".into()));
    }

    #[test]
    fn payloads_are_the_hash_stream_and_any_change_shows() {
        let p = payload(SeqHash(42), 21);
        assert_eq!(p.len(), 21);
        assert_eq!(p, payload(SeqHash(42), 21));
        assert!(is_payload_of(SeqHash(42), &p));
        assert!(!is_payload_of(SeqHash(43), &p));
        let mut flipped = p.to_vec();
        flipped[20] ^= 1;
        assert!(!is_payload_of(SeqHash(42), &flipped));
    }

    #[test]
    fn scaled_sizes_and_transfer_times() {
        let c = KvBlocksConfig {
            bytes_scale: 1e-9,
            ..KvBlocksConfig::default()
        };
        assert_eq!(c.payload_bytes(196_608), 1, "never below one byte");
        let c = KvBlocksConfig::default();
        assert_eq!(c.payload_bytes(1000), 1000);
        // 2 GB: 10 ms from host memory, 1.6 s from the object store.
        assert_eq!(c.transfer_ms(2_000_000_000, Tier::Host), 10.0);
        assert_eq!(c.transfer_ms(2_000_000_000, Tier::Object), 1600.0);
        // Over InfiniBand (50 GB/s): 40 ms.
        assert_eq!(c.link_ms(2_000_000_000), 40.0);
        assert_eq!(
            KvBlocksConfig { timeout_ms: 0, ..c }.invalid_field(),
            Some("kv_blocks.timeout_ms")
        );
    }
}
