//! Engine configuration. Defaults follow vLLM's where vLLM has one (`max_num_seqs`,
//! `max_num_batched_tokens`) and Dynamo's mocker elsewhere (`num_gpu_blocks`, `block_size`).

use dynamo_perfmodel::{Capacity, DoesNotFit, Estimator};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::kv_blocks::KvBlocksConfig;
use crate::timing::TimingModel;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// KV blocks in the (simulated) GPU pool.
    pub num_gpu_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Most sequences running at once (vLLM `--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Token budget of one step (vLLM `--max-num-batched-tokens`).
    pub max_num_batched_tokens: usize,
    /// Simulated time runs this many times faster than the modelled GPU.
    pub speedup_ratio: f64,
    /// Output tokens are drawn from `0..vocab_size`.
    pub vocab_size: u32,
    /// Seed of the output token stream.
    pub seed: u64,
    pub enable_prefix_caching: bool,
    /// Salts block hashes with the model name (see `dynamo_kvcache::BlockHasher::new`);
    /// `None` uses the unsalted hasher.
    pub model_name: Option<String>,
    pub timing: TimingModel,
    /// Offload to and onboard from a sidecar's KV block API; `None` keeps every block on
    /// the GPU. The core lists the blocks to offload ([`crate::StepOutcome::offload`]);
    /// the server does the I/O.
    pub kv_blocks: Option<KvBlocksConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            num_gpu_blocks: 16384,
            block_size: 64,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            speedup_ratio: 1.0,
            vocab_size: 32000,
            seed: 0,
            enable_prefix_caching: true,
            model_name: None,
            timing: TimingModel::Polynomial,
            kv_blocks: None,
        }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("{0} must be positive")]
    NotPositive(&'static str),
    #[error("the KV block API needs prefix caching: blocks are named by their prefix")]
    KvBlocksWithoutPrefixCaching,
}

impl EngineConfig {
    /// This configuration on the hardware model `e` (`--perf-model hardware`): its step
    /// times, and a KV pool of what the GPUs hold after the weights and the activations of
    /// a step at this token budget, unless `num_gpu_blocks` names the pool's size. Refuses
    /// a model whose weights, or a single block, do not fit: a vLLM engine would not start.
    pub fn on_hardware(
        self,
        mut e: Estimator,
        num_gpu_blocks: Option<usize>,
    ) -> Result<(Self, Capacity), DoesNotFit> {
        e.max_num_batched_tokens = self.max_num_batched_tokens as u64;
        let capacity = e.fits(self.block_size as u64, 1)?;
        let fitting = capacity.kv_blocks(self.block_size as u64) as usize;
        let config = Self {
            num_gpu_blocks: num_gpu_blocks.unwrap_or(fitting),
            timing: TimingModel::Hardware(Box::new(e)),
            ..self
        };
        Ok((config, capacity))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let checks = [
            (self.num_gpu_blocks > 0, "num_gpu_blocks"),
            (self.block_size > 0, "block_size"),
            (self.max_num_seqs > 0, "max_num_seqs"),
            (self.max_num_batched_tokens > 0, "max_num_batched_tokens"),
            (
                self.speedup_ratio > 0.0 && self.speedup_ratio.is_finite(),
                "speedup_ratio",
            ),
            (self.vocab_size > 0, "vocab_size"),
        ];
        if let Some((_, name)) = checks.iter().find(|(ok, _)| !ok) {
            return Err(ConfigError::NotPositive(name));
        }
        match &self.kv_blocks {
            Some(_) if !self.enable_prefix_caching => {
                Err(ConfigError::KvBlocksWithoutPrefixCaching)
            }
            Some(kv) => kv
                .invalid_field()
                .map_or(Ok(()), |name| Err(ConfigError::NotPositive(name))),
            None => Ok(()),
        }
    }
}
