//! Numeric formats of weights, KV cache and activations.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    Bf16,
    F16,
    /// FP8 (E4M3 or E5M2): one byte.
    Fp8,
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("unknown dtype {0:?} (known: float32, bfloat16, float16, fp8)")]
pub struct UnknownDtype(pub String);

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
            Self::Fp8 => 1,
        }
    }

    /// The name `config.json`'s `torch_dtype` uses (fp8 has none there).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
            Self::Fp8 => "fp8",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = UnknownDtype;

    /// `torch_dtype` spellings, vLLM's `--dtype` / `--kv-cache-dtype` spellings.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "float32" | "fp32" | "float" | "f32" => Ok(Self::F32),
            "bfloat16" | "bf16" => Ok(Self::Bf16),
            "float16" | "fp16" | "half" | "f16" => Ok(Self::F16),
            "fp8" | "fp8_e4m3" | "fp8_e5m2" | "float8_e4m3fn" | "float8_e5m2" => Ok(Self::Fp8),
            _ => Err(UnknownDtype(s.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_parse_in_every_spelling_and_know_their_size() {
        for (s, d) in [
            ("bfloat16", Dtype::Bf16),
            ("BF16", Dtype::Bf16),
            ("float16", Dtype::F16),
            ("half", Dtype::F16),
            ("float32", Dtype::F32),
            ("fp8_e4m3", Dtype::Fp8),
            ("float8_e4m3fn", Dtype::Fp8),
        ] {
            assert_eq!(s.parse::<Dtype>(), Ok(d), "{s}");
        }
        assert_eq!(
            [Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::Fp8].map(Dtype::bytes),
            [4, 2, 2, 1]
        );
        assert!(
            "int3"
                .parse::<Dtype>()
                .unwrap_err()
                .to_string()
                .contains("int3")
        );
    }
}
