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
//! interpolated. A step costs the sum of its parts, divided by the speedup ratio.

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
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TimingModel {
    #[default]
    Polynomial,
    Table(TimingTable),
}

impl TimingModel {
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
        }
    }

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
        }
    }

    /// Duration of a step in (simulated) ms, already divided by `speedup_ratio`.
    pub fn step_ms(&self, work: StepWork, speedup_ratio: f64) -> f64 {
        (self.prefill_ms(work.prefill_tokens) + self.decode_ms(work.decode_seqs, work.kv_usage))
            / speedup_ratio
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
            kv_usage: 0.0,
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
