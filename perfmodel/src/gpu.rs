//! GPU SKUs: peak dense tensor throughput, memory, and the links between GPUs.
//!
//! Figures are the vendor datasheets'. Conventions:
//! - FLOPS are dense: datasheets print the 2:4-sparsity figure with an asterisk, and the
//!   dense one is half of it. Inference kernels do not use structured sparsity.
//! - Memory capacity: the datasheet's "GB" read as GiB. HBM stacks come in binary
//!   sizes (an H100 SXM is five 16 GiB stacks), and Dynamo's AI Configurator system
//!   files (`src/aiconfigurator/systems/h100_sxm.yaml`: `mem_capacity: 85899345920 #
//!   80GiB`) read them the same way.
//! - Bandwidths are decimal (1 GB/s = 1e9 B/s) and per direction: NVLink's "900 GB/s"
//!   counts both directions together, so one direction is 450 GB/s; a 400 Gb/s NIC
//!   moves 50 GB/s each way; PCIe Gen5 x16's "128 GB/s" is 64 GB/s each way.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::Dtype;

const GIB: u64 = 1 << 30;
const TERA: f64 = 1e12;
const GB: f64 = 1e9;

/// One GPU's figures. Custom SKUs (e.g. from a ConfigMap) deserialize into this too.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuSpec {
    /// Canonical name, as DGDR's `hardware.gpuSku` writes it (e.g. `H100_SXM`).
    pub name: String,
    /// Dense BF16/FP16 tensor-core peak, FLOP/s.
    pub bf16_flops: f64,
    /// Dense FP8 tensor-core peak, FLOP/s; `None` where the GPU has no FP8 tensor cores.
    pub fp8_flops: Option<f64>,
    /// GPU memory, bytes.
    pub memory_bytes: u64,
    /// GPU memory bandwidth, bytes/s.
    pub memory_bandwidth: f64,
    /// NVLink bandwidth of one GPU, one direction, bytes/s; `None` without NVLink.
    pub nvlink_bandwidth: Option<f64>,
    /// PCIe bandwidth of one GPU, one direction, bytes/s.
    pub pcie_bandwidth: f64,
    /// Scale-out network per GPU, one direction, bytes/s.
    pub network_bandwidth: f64,
}

impl GpuSpec {
    /// The catalog SKU of that name (case-insensitive; `-` and `_` alike).
    pub fn by_name(name: &str) -> Result<Self, UnknownGpu> {
        name.parse::<GpuSku>().map(GpuSku::spec)
    }

    /// Dense tensor peak for math in `dtype`. FP8 weights on a GPU without FP8 tensor
    /// cores run weight-only (dequantized to 16 bits, as vLLM's Marlin FP8 kernel does on
    /// Ampere), so at the 16-bit rate. FP32 runs as TF32, whose dense peak is half the
    /// BF16 one on every SKU here (each datasheet's TF32 vs BF16 rows).
    pub fn peak_flops(&self, dtype: Dtype) -> f64 {
        match dtype {
            Dtype::Fp8 => self.fp8_flops.unwrap_or(self.bf16_flops),
            Dtype::Bf16 | Dtype::F16 => self.bf16_flops,
            Dtype::F32 => self.bf16_flops / 2.0,
        }
    }

    /// The link tensor-parallel all-reduces cross inside a node: NVLink, else PCIe.
    pub fn tp_link_bandwidth(&self) -> f64 {
        self.nvlink_bandwidth.unwrap_or(self.pcie_bandwidth)
    }
}

/// The built-in SKUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GpuSku {
    H100Sxm,
    H200Sxm,
    B200Sxm,
    A100Sxm,
    L40s,
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("unknown GPU SKU {name:?}; known: {}", GpuSku::ALL.map(GpuSku::name).join(", "))]
pub struct UnknownGpu {
    pub name: String,
}

impl GpuSku {
    pub const ALL: [Self; 5] = [
        Self::H100Sxm,
        Self::H200Sxm,
        Self::B200Sxm,
        Self::A100Sxm,
        Self::L40s,
    ];

    /// Canonical name: Dynamo's DGDR `hardware.gpuSku` spelling (`H100_SXM`), upper-case.
    pub fn name(self) -> &'static str {
        match self {
            Self::H100Sxm => "H100_SXM",
            Self::H200Sxm => "H200_SXM",
            Self::B200Sxm => "B200_SXM",
            Self::A100Sxm => "A100_SXM",
            Self::L40s => "L40S",
        }
    }

    /// Other accepted spellings, after upper-casing and `-` -> `_`. The canonical names
    /// lower-cased are AI Configurator's system names (`h100_sxm`, `h200_sxm`,
    /// `b200_sxm`, `a100_sxm`, `l40s`: its `src/aiconfigurator/systems/*.yaml`).
    fn aliases(self) -> &'static [&'static str] {
        match self {
            Self::H100Sxm => &["H100", "H100_SXM5", "H100_80GB", "H100_SXM_80GB"],
            Self::H200Sxm => &["H200", "H200_SXM5", "H200_141GB"],
            Self::B200Sxm => &["B200", "B200_180GB"],
            Self::A100Sxm => &[
                "A100",
                "A100_80GB",
                "A100_SXM4",
                "A100_80GB_SXM",
                "A100_SXM_80GB",
            ],
            Self::L40s => &["L40S_48GB"],
        }
    }

    pub fn spec(self) -> GpuSpec {
        let name = self.name().to_string();
        match self {
            // NVIDIA H100 Tensor Core GPU datasheet, "H100 SXM" column
            // (nvidia.com/en-us/data-center/h100): BF16 Tensor Core 1,979 TFLOPS and FP8
            // 3,958 TFLOPS "with sparsity"; GPU memory 80 GB; 3.35 TB/s; NVLink 900 GB/s;
            // PCIe Gen5 128 GB/s. NVIDIA DGX H100 datasheet: 8x ConnectX-7, 400 Gb/s
            // InfiniBand/Ethernet, one per GPU.
            Self::H100Sxm => GpuSpec {
                name,
                bf16_flops: 1979.0 / 2.0 * TERA,
                fp8_flops: Some(3958.0 / 2.0 * TERA),
                memory_bytes: 80 * GIB,
                memory_bandwidth: 3350.0 * GB,
                nvlink_bandwidth: Some(900.0 / 2.0 * GB),
                pcie_bandwidth: 128.0 / 2.0 * GB,
                network_bandwidth: 400.0 / 8.0 * GB,
            },
            // NVIDIA H200 Tensor Core GPU datasheet, "H200 SXM" column
            // (nvidia.com/en-us/data-center/h200): the H100's tensor figures (BF16 1,979,
            // FP8 3,958 TFLOPS with sparsity); 141 GB HBM3e; 4.8 TB/s; NVLink 900 GB/s;
            // PCIe Gen5 128 GB/s. NVIDIA DGX H200 datasheet: 8x ConnectX-7, 400 Gb/s.
            Self::H200Sxm => GpuSpec {
                name,
                bf16_flops: 1979.0 / 2.0 * TERA,
                fp8_flops: Some(3958.0 / 2.0 * TERA),
                memory_bytes: 141 * GIB,
                memory_bandwidth: 4800.0 * GB,
                nvlink_bandwidth: Some(900.0 / 2.0 * GB),
                pcie_bandwidth: 128.0 / 2.0 * GB,
                network_bandwidth: 400.0 / 8.0 * GB,
            },
            // NVIDIA DGX B200 datasheet (nvidia.com/en-us/data-center/dgx-b200), eight
            // GPUs: 1,440 GB HBM3e (180 GB each), 64 TB/s (8 TB/s each), FP8 72 PFLOPS with
            // sparsity (4.5 PFLOPS dense each), NVLink 14.4 TB/s aggregate (1.8 TB/s
            // each), 8x ConnectX-7 400 Gb/s. NVIDIA HGX B200 specifications
            // (nvidia.com/en-us/data-center/hgx): FP16/BF16 36 PFLOPS with sparsity for
            // eight (2.25 PFLOPS dense each). PCIe Gen6 x16: 128 GB/s each way.
            Self::B200Sxm => GpuSpec {
                name,
                bf16_flops: 36.0e3 / 8.0 / 2.0 * TERA,
                fp8_flops: Some(72.0e3 / 8.0 / 2.0 * TERA),
                memory_bytes: 1440 / 8 * GIB,
                memory_bandwidth: 64.0e3 / 8.0 * GB,
                nvlink_bandwidth: Some(14.4e3 / 8.0 / 2.0 * GB),
                pcie_bandwidth: 128.0 * GB,
                network_bandwidth: 400.0 / 8.0 * GB,
            },
            // NVIDIA A100 Tensor Core GPU datasheet, "A100 80GB SXM" column
            // (nvidia.com/en-us/data-center/a100): BF16 Tensor Core 312 TFLOPS (624 with
            // sparsity), no FP8; 80 GB HBM2e; 2,039 GB/s; NVLink 600 GB/s; PCIe Gen4
            // 64 GB/s. NVIDIA DGX A100 datasheet: 8x single-port ConnectX-6, 200 Gb/s HDR
            // InfiniBand.
            Self::A100Sxm => GpuSpec {
                name,
                bf16_flops: 312.0 * TERA,
                fp8_flops: None,
                memory_bytes: 80 * GIB,
                memory_bandwidth: 2039.0 * GB,
                nvlink_bandwidth: Some(600.0 / 2.0 * GB),
                pcie_bandwidth: 64.0 / 2.0 * GB,
                network_bandwidth: 200.0 / 8.0 * GB,
            },
            // NVIDIA L40S GPU datasheet (nvidia.com/en-us/data-center/l40s): BF16 Tensor
            // Core 362.05 TFLOPS (733 with sparsity), FP8 733 (1,466 with sparsity);
            // 48 GB GDDR6; 864 GB/s; PCIe Gen4 x16 64 GB/s bidirectional; no NVLink. No
            // NVIDIA reference system fixes a NIC per L40S: 200 Gb/s per GPU is our
            // assumption (one 400 Gb/s NIC per two GPUs), not a datasheet figure.
            Self::L40s => GpuSpec {
                name,
                bf16_flops: 362.05 * TERA,
                fp8_flops: Some(733.0 * TERA),
                memory_bytes: 48 * GIB,
                memory_bandwidth: 864.0 * GB,
                nvlink_bandwidth: None,
                pcie_bandwidth: 64.0 / 2.0 * GB,
                network_bandwidth: 200.0 / 8.0 * GB,
            },
        }
    }
}

impl fmt::Display for GpuSku {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GpuSku {
    type Err = UnknownGpu;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let key = s.trim().to_ascii_uppercase().replace(['-', ' '], "_");
        Self::ALL
            .into_iter()
            .find(|sku| sku.name() == key || sku.aliases().contains(&key.as_str()))
            .ok_or_else(|| UnknownGpu { name: s.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dgdr_and_aic_spellings_parse_case_insensitively() {
        for (s, sku) in [
            ("H100_SXM", GpuSku::H100Sxm),
            ("h100_sxm", GpuSku::H100Sxm),
            ("H100-SXM5", GpuSku::H100Sxm),
            ("h200_sxm", GpuSku::H200Sxm),
            ("b200_sxm", GpuSku::B200Sxm),
            ("a100_sxm", GpuSku::A100Sxm),
            ("A100_80GB", GpuSku::A100Sxm),
            ("l40s", GpuSku::L40s),
            ("L40S", GpuSku::L40s),
        ] {
            assert_eq!(s.parse::<GpuSku>(), Ok(sku), "{s}");
        }
        for sku in GpuSku::ALL {
            assert_eq!(sku.name().parse::<GpuSku>(), Ok(sku));
            assert_eq!(sku.spec().name, sku.name());
        }
    }

    #[test]
    fn an_unknown_sku_names_the_known_ones() {
        let err = GpuSpec::by_name("V100").unwrap_err().to_string();
        assert!(err.contains("\"V100\""), "{err}");
        for sku in GpuSku::ALL {
            assert!(err.contains(sku.name()), "{err}");
        }
    }

    #[test]
    fn catalog_figures_are_dense_and_per_direction() {
        let h100 = GpuSku::H100Sxm.spec();
        assert_eq!(h100.peak_flops(Dtype::Bf16), 989.5e12);
        assert_eq!(h100.peak_flops(Dtype::Fp8), 1979e12);
        assert_eq!(h100.peak_flops(Dtype::F32), 989.5e12 / 2.0);
        assert_eq!(h100.memory_bytes, 85_899_345_920);
        assert_eq!(h100.tp_link_bandwidth(), 450e9);
        assert_eq!(h100.network_bandwidth, 50e9);
        // Same compute, more and faster memory.
        let h200 = GpuSku::H200Sxm.spec();
        assert_eq!(h200.bf16_flops, h100.bf16_flops);
        assert!(h200.memory_bytes > h100.memory_bytes);
        assert!(h200.memory_bandwidth > h100.memory_bandwidth);
        let b200 = GpuSku::B200Sxm.spec();
        assert_eq!((b200.bf16_flops, b200.fp8_flops), (2250e12, Some(4500e12)));
        assert_eq!(b200.memory_bandwidth, 8e12);
        assert_eq!(b200.nvlink_bandwidth, Some(900e9));
        // No FP8 on Ampere: FP8 weights compute at the 16-bit rate.
        let a100 = GpuSku::A100Sxm.spec();
        assert_eq!(a100.fp8_flops, None);
        assert_eq!(a100.peak_flops(Dtype::Fp8), a100.peak_flops(Dtype::Bf16));
        // No NVLink on the L40S: tensor parallelism crosses PCIe.
        let l40s = GpuSku::L40s.spec();
        assert_eq!(l40s.nvlink_bandwidth, None);
        assert_eq!(l40s.tp_link_bandwidth(), 32e9);
    }

    #[test]
    fn a_custom_spec_round_trips_through_json() {
        let spec = GpuSku::L40s.spec();
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<GpuSpec>(&json).unwrap(), spec);
    }
}
