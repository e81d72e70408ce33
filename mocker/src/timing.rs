//! How long a step takes on the modelled GPU.
//!
//! `Polynomial` is the model Dynamo's mocker uses (ai-dynamo/dynamo,
//! `lib/mocker/src/common/perf_model.rs`, `PerfModel::Polynomial`, fitted on an H100
//! serving an 8B model; later revisions moved it into their AISimulate engine):
//! - prefill ms = 4.209989e-7 * T^2 + 1.518344e-2 * T + 16.50142, T = new (uncached)
//!   prompt tokens computed in the step, 0 ms when T = 0;
//! - decode ms = max(1, -25.74 u^2 + 54.01 u + 5.74), u = fraction of the KV pool in use.
//!
//! `Table` replaces it with measured points (e.g. from a profiler run), linearly
//! interpolated. With both, a step costs the sum of its parts, divided by the speedup
//! ratio.
//!
//! `Hardware` is the performance model of a GPU SKU and a model architecture
//! (`dynamo-perfmodel`): a step is one forward pass over its prefill chunks and decode
//! tokens together, so it needs the attention contexts of the step as well.

use dynamo_perfmodel::{Estimator, StepLoad};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// What a step computed, as the timing model sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepWork {
    /// Uncached prompt tokens prefilled in the step (all chunks of all sequences).
    pub prefill_tokens: usize,
    /// Sequences that decoded one token in the step.
    pub decode_seqs: usize,
    /// Fraction of the KV pool referenced during the step, 0..=1.
    pub kv_usage: f64,
    /// Sequences with a prefill chunk in the step.
    pub prefill_seqs: usize,
    /// Already-computed tokens the prefill chunks attend to (their prefixes), summed.
    pub prefill_context_tokens: usize,
    /// (query, key) pairs of the prefill chunks' causal attention.
    pub prefill_attention_pairs: u64,
    /// Tokens the decoding sequences attend to (each one's whole context), summed.
    pub decode_context_tokens: usize,
}

impl StepWork {
    /// The step as the hardware model sees it.
    pub fn load(&self) -> StepLoad {
        StepLoad {
            prefill_tokens: self.prefill_tokens as u64,
            prefill_seqs: self.prefill_seqs as u64,
            prefill_context_tokens: self.prefill_context_tokens as u64,
            prefill_attention_pairs: self.prefill_attention_pairs,
            decode_seqs: self.decode_seqs as u64,
            decode_context_tokens: self.decode_context_tokens as u64,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TimingModel {
    #[default]
    Polynomial,
    Table(TimingTable),
    /// A GPU SKU x model architecture x tensor parallelism (`--perf-model hardware`).
    Hardware(Box<Estimator>),
}

impl TimingModel {
    /// What the step times come from, for a report's title: the GPU and model of the
    /// hardware model.
    pub fn describe(&self) -> String {
        match self {
            Self::Polynomial => "step times: Dynamo's polynomial (an 8B model on an H100)".into(),
            Self::Table(_) => "step times: a timing table".into(),
            Self::Hardware(e) => format!(
                "step times: {} on {} x {} ({} weights, {} KV)",
                e.model.name, e.tp, e.gpu.name, e.weight_dtype, e.kv_dtype
            ),
        }
    }

    pub fn prefill_ms(&self, tokens: usize) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        match self {
            Self::Polynomial => {
                let t = tokens as f64;
                4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142
            }
            Self::Table(table) => interpolate(&table.prefill, tokens as f64).max(0.0),
            Self::Hardware(e) => e.prefill_ms(tokens as u64, 0),
        }
    }

    /// A decode step of `decode_seqs` sequences. `Hardware` needs their contexts, which
    /// the pool usage does not give: here it takes one token each (`step_ms` has them).
    pub fn decode_ms(&self, decode_seqs: usize, kv_usage: f64) -> f64 {
        if decode_seqs == 0 {
            return 0.0;
        }
        match self {
            Self::Polynomial => {
                let u = kv_usage.clamp(0.0, 1.0);
                (-25.74 * u * u + 54.01 * u + 5.74).max(1.0)
            }
            // Decode steps must take time, or token timestamps would collide.
            Self::Table(table) => interpolate(&table.decode, decode_seqs as f64).max(1.0),
            Self::Hardware(e) => e.decode_step_ms(decode_seqs as u64, 1.0),
        }
    }

    /// Duration of a step in (simulated) ms, already divided by `speedup_ratio`.
    pub fn step_ms(&self, work: StepWork, speedup_ratio: f64) -> f64 {
        let ms = match self {
            Self::Hardware(e) => e.step_ms(&work.load()),
            _ => {
                self.prefill_ms(work.prefill_tokens)
                    + self.decode_ms(work.decode_seqs, work.kv_usage)
            }
        };
        ms / speedup_ratio
    }
}

/// Measured step times: prefill by tokens prefilled in the step (ISL), decode by the
/// number of decoding sequences (batch). Points are sorted by `x` on load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimingTable {
    pub prefill: Vec<Point>,
    pub decode: Vec<Point>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub x: f64,
    pub ms: f64,
}

#[derive(Debug, Error)]
pub enum TableError {
    #[error("timing table is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0} table needs at least one point")]
    Empty(&'static str),
    #[error("{0} table has a non-finite or duplicate x")]
    BadX(&'static str),
}

impl TimingTable {
    /// Parses `{"prefill": [{"x": isl, "ms": ..}, ..], "decode": [{"x": batch, "ms": ..}, ..]}`.
    pub fn from_json(json: &str) -> Result<Self, TableError> {
        let mut t: TimingTable = serde_json::from_str(json)?;
        for (name, pts) in [("prefill", &mut t.prefill), ("decode", &mut t.decode)] {
            if pts.is_empty() {
                return Err(TableError::Empty(name));
            }
            if pts.iter().any(|p| !p.x.is_finite() || !p.ms.is_finite()) {
                return Err(TableError::BadX(name));
            }
            pts.sort_by(|a, b| a.x.total_cmp(&b.x));
            if pts.windows(2).any(|w| w[0].x == w[1].x) {
                return Err(TableError::BadX(name));
            }
        }
        Ok(t)
    }
}

/// Piecewise-linear through the points, extended along the end segments outside them
/// (a longer prompt than any measured one still costs more).
fn interpolate(pts: &[Point], x: f64) -> f64 {
    match pts {
        [] => 0.0,
        [p] => p.ms,
        _ => {
            let i = pts.partition_point(|p| p.x < x).clamp(1, pts.len() - 1);
            let (a, b) = (pts[i - 1], pts[i]);
            a.ms + (b.ms - a.ms) * (x - a.x) / (b.x - a.x)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polynomial_matches_dynamo_coefficients() {
        let m = TimingModel::Polynomial;
        assert_eq!(m.prefill_ms(0), 0.0);
        let t = 1000.0;
        assert_eq!(
            m.prefill_ms(1000),
            4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142
        );
        assert_eq!(m.decode_ms(0, 0.5), 0.0);
        assert_eq!(m.decode_ms(3, 0.0), 5.74);
        assert_eq!(m.decode_ms(3, 0.5), -25.74 * 0.25 + 54.01 * 0.5 + 5.74);
        let work = StepWork {
            prefill_tokens: 1000,
            decode_seqs: 2,
            ..StepWork::default()
        };
        assert_eq!(m.step_ms(work, 10.0), (m.prefill_ms(1000) + 5.74) / 10.0);
    }

    #[test]
    fn table_interpolates_linearly_and_extends_end_segments() {
        let json = r#"{"prefill": [{"x": 2000, "ms": 60}, {"x": 1000, "ms": 40}],
                       "decode": [{"x": 1, "ms": 8}, {"x": 9, "ms": 12}]}"#;
        let m = TimingModel::Table(TimingTable::from_json(json).unwrap());
        assert_eq!(m.prefill_ms(0), 0.0);
        assert_eq!(m.prefill_ms(1500), 50.0);
        assert_eq!(m.prefill_ms(3000), 80.0);
        assert_eq!(m.prefill_ms(500), 30.0);
        assert_eq!(m.decode_ms(5, 0.9), 10.0);
        assert_eq!(m.decode_ms(1, 0.0), 8.0);
    }

    #[test]
    fn hardware_steps_are_one_pass_over_their_contexts() {
        use dynamo_perfmodel::{GpuSku, ModelArch};
        let model = ModelArch::by_name("meta-llama/Llama-3.1-8B-Instruct").unwrap();
        let e = Estimator::new(GpuSku::H100Sxm.spec(), model, 1).unwrap();
        let m = TimingModel::Hardware(Box::new(e.clone()));
        let decode = |context: usize| StepWork {
            decode_seqs: 8,
            decode_context_tokens: 8 * context,
            ..StepWork::default()
        };
        assert_eq!(m.step_ms(StepWork::default(), 1.0), 0.0);
        assert_eq!(
            m.step_ms(decode(1000), 2.0),
            e.decode_step_ms(8, 1000.0) / 2.0
        );
        // Longer contexts read more KV; the pool usage plays no part.
        assert!(m.step_ms(decode(8000), 1.0) > m.step_ms(decode(1000), 1.0));
        let mut busy = decode(1000);
        busy.kv_usage = 0.9;
        assert_eq!(m.step_ms(busy, 1.0), m.step_ms(decode(1000), 1.0));
        // A prefill chunk after a cached prefix attends to it.
        let chunk = |cached: usize| StepWork {
            prefill_tokens: 512,
            prefill_seqs: 1,
            prefill_context_tokens: cached,
            prefill_attention_pairs: dynamo_perfmodel::attention_pairs(512, cached as u64),
            ..StepWork::default()
        };
        assert_eq!(m.step_ms(chunk(0), 1.0), m.prefill_ms(512));
        assert!(m.step_ms(chunk(30_000), 1.0) > m.step_ms(chunk(0), 1.0));
        // The polynomial ignores contexts.
        let p = TimingModel::Polynomial;
        assert_eq!(p.step_ms(chunk(30_000), 1.0), p.step_ms(chunk(0), 1.0));
        // An engine config carries the model as JSON, tagged like the others.
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["kind"], "hardware");
        assert_eq!(serde_json::from_value::<TimingModel>(json).unwrap(), m);
    }

    #[test]
    fn bad_tables_are_refused() {
        assert!(matches!(
            TimingTable::from_json(r#"{"prefill": [], "decode": [{"x": 1, "ms": 1}]}"#),
            Err(TableError::Empty("prefill"))
        ));
        assert!(matches!(
            TimingTable::from_json(
                r#"{"prefill": [{"x": 1, "ms": 1}, {"x": 1, "ms": 2}], "decode": [{"x": 1, "ms": 1}]}"#
            ),
            Err(TableError::BadX("prefill"))
        ));
        assert!(TimingTable::from_json("nope").is_err());
    }
}
