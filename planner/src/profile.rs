//! An engine's measured performance, as throughput mode needs it: how fast it prefills a
//! prompt of a given length, and how many tokens per second per GPU it decodes at a given
//! context length without exceeding a target inter-token latency.
//!
//! Dynamo's profiler writes the same two surfaces as NPZ files that its planner loads into
//! a prefill interpolator (ISL -> TTFT, throughput/GPU) and a decode interpolator (KV usage
//! x context length -> ITL, throughput/GPU) (`planner_design.md`, see
//! `../shared/research/pillars.md` section 4). Ours is JSON, and the decode load axis is
//! *concurrency* (sequences in flight per engine) rather than KV usage, because the planner
//! can measure concurrency from the frontend's in-flight gauge; a KV-usage sweep converts
//! with `concurrency = kv_usage * max_kv_tokens / context_length`.
//!
//! # Format
//!
//! ```json
//! {
//!   "gpus_per_engine": 1,
//!   "prefill": [
//!     {"isl": 1000, "ttft_ms": 100.0, "throughput_per_gpu": 10000.0},
//!     {"isl": 3000, "ttft_ms": 400.0, "throughput_per_gpu": 7500.0}
//!   ],
//!   "decode": [
//!     {"context_length": 2000, "concurrency": 1,  "itl_ms": 10.0, "throughput_per_gpu": 1000.0},
//!     {"context_length": 2000, "concurrency": 16, "itl_ms": 20.0, "throughput_per_gpu": 8000.0},
//!     {"context_length": 4000, "concurrency": 1,  "itl_ms": 12.0, "throughput_per_gpu": 800.0}
//!   ]
//! }
//! ```
//!
//! - `gpus_per_engine` (>= 1): the GPU count one engine was measured with; throughputs are
//!   per GPU, so the planner divides by its own configured GPUs per engine.
//! - `prefill`: non-empty, `isl` strictly increasing, `ttft_ms` non-decreasing (a longer
//!   prompt never prefills sooner).
//! - `decode`: non-empty, sorted by `context_length` then strictly increasing
//!   `concurrency`; within one context length `itl_ms` is non-decreasing in concurrency
//!   (more sequences per step never make a step faster).
//! - every number finite and `> 0`; unknown fields are rejected (a typo is an error, not a
//!   silently ignored knob).
//!
//! Lookups interpolate linearly between points and clamp at the ends: beyond the last ISL
//! the last point's throughput is used, never an extrapolation that could reach zero or
//! go negative.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One prefill measurement: a prompt of `isl` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillPoint {
    /// Input sequence length, tokens.
    pub isl: f64,
    /// Time to first token, milliseconds.
    pub ttft_ms: f64,
    /// Prefill throughput, input tokens per second per GPU.
    pub throughput_per_gpu: f64,
}

/// One decode measurement: `concurrency` sequences of `context_length` tokens per engine.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodePoint {
    /// Mean context length (prompt + generated so far), tokens.
    pub context_length: f64,
    /// Sequences decoding at once on one engine.
    pub concurrency: f64,
    /// Inter-token latency, milliseconds.
    pub itl_ms: f64,
    /// Decode throughput, output tokens per second per GPU.
    pub throughput_per_gpu: f64,
}

/// Why a profile was refused. Names the section, the index and the field so the message
/// points at the offending line of the file.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum ProfileError {
    #[error("profile is not valid JSON for this format: {0}")]
    Json(String),
    #[error("gpus_per_engine must be >= 1")]
    ZeroGpus,
    #[error("{section} has no points")]
    Empty { section: &'static str },
    #[error("{section}[{index}].{field} is {value}: must be finite and > 0")]
    NotPositive {
        section: &'static str,
        index: usize,
        field: &'static str,
        value: f64,
    },
    #[error(
        "{section}[{index}].{field} is not after the previous point: points must be sorted, without duplicates"
    )]
    Unsorted {
        section: &'static str,
        index: usize,
        field: &'static str,
    },
    #[error("{section}[{index}].{field} decreases: it must not fall as {axis} grows")]
    NotMonotonic {
        section: &'static str,
        index: usize,
        field: &'static str,
        axis: &'static str,
    },
}

/// The raw file shape; [`Profile`] is only ever built from it through validation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    gpus_per_engine: u32,
    prefill: Vec<PrefillPoint>,
    decode: Vec<DecodePoint>,
}

/// A validated profile. Fields are private so every instance satisfies the format's rules
/// and lookups never divide by zero or meet a NaN.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawProfile")]
pub struct Profile {
    gpus_per_engine: u32,
    prefill: Vec<PrefillPoint>,
    decode: Vec<DecodePoint>,
}

impl TryFrom<RawProfile> for Profile {
    type Error = ProfileError;
    fn try_from(raw: RawProfile) -> Result<Self, ProfileError> {
        Profile::new(raw.gpus_per_engine, raw.prefill, raw.decode)
    }
}

/// The best decode operating point found for an ITL target at a context length.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeEstimate {
    /// Output tokens per second per GPU.
    pub throughput_per_gpu: f64,
    /// False when even the lightest measured load is slower than the target: the
    /// throughput is then the lightest load's, the most conservative the profile offers.
    pub meets_target: bool,
}

fn positive(
    section: &'static str,
    index: usize,
    field: &'static str,
    value: f64,
) -> Result<(), ProfileError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(ProfileError::NotPositive {
            section,
            index,
            field,
            value,
        })
    }
}

impl Profile {
    /// Validates and builds a profile (the rules are in the module doc).
    pub fn new(
        gpus_per_engine: u32,
        prefill: Vec<PrefillPoint>,
        decode: Vec<DecodePoint>,
    ) -> Result<Self, ProfileError> {
        if gpus_per_engine == 0 {
            return Err(ProfileError::ZeroGpus);
        }
        if prefill.is_empty() {
            return Err(ProfileError::Empty { section: "prefill" });
        }
        if decode.is_empty() {
            return Err(ProfileError::Empty { section: "decode" });
        }
        const P: &str = "prefill";
        for (i, p) in prefill.iter().enumerate() {
            positive(P, i, "isl", p.isl)?;
            positive(P, i, "ttft_ms", p.ttft_ms)?;
            positive(P, i, "throughput_per_gpu", p.throughput_per_gpu)?;
            if i > 0 {
                let prev = &prefill[i - 1];
                if p.isl <= prev.isl {
                    return Err(ProfileError::Unsorted {
                        section: P,
                        index: i,
                        field: "isl",
                    });
                }
                if p.ttft_ms < prev.ttft_ms {
                    return Err(ProfileError::NotMonotonic {
                        section: P,
                        index: i,
                        field: "ttft_ms",
                        axis: "isl",
                    });
                }
            }
        }
        const D: &str = "decode";
        for (i, d) in decode.iter().enumerate() {
            positive(D, i, "context_length", d.context_length)?;
            positive(D, i, "concurrency", d.concurrency)?;
            positive(D, i, "itl_ms", d.itl_ms)?;
            positive(D, i, "throughput_per_gpu", d.throughput_per_gpu)?;
            if i > 0 {
                let prev = &decode[i - 1];
                if d.context_length < prev.context_length {
                    return Err(ProfileError::Unsorted {
                        section: D,
                        index: i,
                        field: "context_length",
                    });
                }
                if d.context_length == prev.context_length {
                    if d.concurrency <= prev.concurrency {
                        return Err(ProfileError::Unsorted {
                            section: D,
                            index: i,
                            field: "concurrency",
                        });
                    }
                    if d.itl_ms < prev.itl_ms {
                        return Err(ProfileError::NotMonotonic {
                            section: D,
                            index: i,
                            field: "itl_ms",
                            axis: "concurrency",
                        });
                    }
                }
            }
        }
        Ok(Self {
            gpus_per_engine,
            prefill,
            decode,
        })
    }

    /// Parses and validates a profile file's text (a ConfigMap value or a file).
    pub fn from_json(text: &str) -> Result<Self, ProfileError> {
        let raw: RawProfile =
            serde_json::from_str(text).map_err(|e| ProfileError::Json(e.to_string()))?;
        raw.try_into()
    }

    pub fn gpus_per_engine(&self) -> u32 {
        self.gpus_per_engine
    }

    pub fn prefill_points(&self) -> &[PrefillPoint] {
        &self.prefill
    }

    pub fn decode_points(&self) -> &[DecodePoint] {
        &self.decode
    }

    /// Prefill throughput (input tokens/s/GPU) at `isl`, linear between points, clamped at
    /// the ends. A non-finite `isl` clamps to the first point (callers validate first).
    pub fn prefill_throughput_per_gpu(&self, isl: f64) -> f64 {
        lerp_by(&self.prefill, isl, |p| p.isl, |p| p.throughput_per_gpu)
    }

    /// The TTFT (ms) the profile expects at `isl`: the denominator of Dynamo's prefill
    /// correction factor (`actual_ttft / expected_ttft`).
    pub fn expected_ttft_ms(&self, isl: f64) -> f64 {
        lerp_by(&self.prefill, isl, |p| p.isl, |p| p.ttft_ms)
    }

    /// The ITL (ms) the profile expects for `concurrency` sequences per engine at
    /// `context_length`: the denominator of Dynamo's decode correction factor. Linear in
    /// concurrency within each measured context length, then linear between the two
    /// context lengths around `context_length`; clamped at every end.
    pub fn expected_itl_ms(&self, context_length: f64, concurrency: f64) -> f64 {
        self.across_context(context_length, |g| {
            lerp_by(g, concurrency, |d| d.concurrency, |d| d.itl_ms)
        })
    }

    /// Dynamo's `find_best_throughput_per_gpu(itl, context_length)`: the highest decode
    /// throughput per GPU whose ITL stays within `itl_ms` at `context_length`.
    pub fn find_best_throughput_per_gpu(&self, itl_ms: f64, context_length: f64) -> f64 {
        self.best_decode(itl_ms, context_length).throughput_per_gpu
    }

    /// [`Self::find_best_throughput_per_gpu`] plus whether the target is reachable at all.
    /// Within a context length the best point is the largest throughput among points at
    /// or under the target, or on the segment where ITL crosses the target (read by linear
    /// interpolation); between context lengths the two answers are interpolated.
    pub fn best_decode(&self, itl_ms: f64, context_length: f64) -> DecodeEstimate {
        let mut meets = true;
        let throughput_per_gpu = self.across_context(context_length, |g| {
            let (t, ok) = best_in_group(g, itl_ms);
            meets &= ok;
            t
        });
        DecodeEstimate {
            throughput_per_gpu,
            meets_target: meets,
        }
    }

    /// Applies `f` to the measured context-length groups bracketing `context_length` and
    /// interpolates between them (clamped: outside the range only the end group is used).
    fn across_context(&self, context_length: f64, mut f: impl FnMut(&[DecodePoint]) -> f64) -> f64 {
        let groups: Vec<&[DecodePoint]> = self
            .decode
            .chunk_by(|a, b| a.context_length == b.context_length)
            .collect();
        let first = groups[0];
        let last = groups[groups.len() - 1];
        let ctx = |g: &[DecodePoint]| g[0].context_length;
        if context_length.is_nan() || context_length <= ctx(first) {
            return f(first);
        }
        if context_length >= ctx(last) {
            return f(last);
        }
        let hi = groups
            .iter()
            .position(|g| ctx(g) >= context_length)
            .unwrap_or(groups.len() - 1);
        let (a, b) = (groups[hi - 1], groups[hi]);
        let (ya, yb) = (f(a), f(b));
        let t = (context_length - ctx(a)) / (ctx(b) - ctx(a));
        ya + (yb - ya) * t
    }
}

/// Best throughput within `itl` along one context length's concurrency sweep (ITL
/// non-decreasing by validation). Returns the lightest point's throughput and `false` when
/// even that is over the target: the conservative answer, more replicas rather than fewer.
fn best_in_group(g: &[DecodePoint], itl: f64) -> (f64, bool) {
    if itl.is_nan() || g[0].itl_ms > itl {
        return (g[0].throughput_per_gpu, false);
    }
    let mut best = 0.0_f64;
    for (i, d) in g.iter().enumerate() {
        if d.itl_ms <= itl {
            best = best.max(d.throughput_per_gpu);
        } else {
            // First point over the target: the previous one is within it, so ITL rises
            // strictly across this segment and the crossing is well defined.
            let p = &g[i - 1];
            let t = (itl - p.itl_ms) / (d.itl_ms - p.itl_ms);
            best =
                best.max(p.throughput_per_gpu + (d.throughput_per_gpu - p.throughput_per_gpu) * t);
            break;
        }
    }
    (best, true)
}

/// Linear interpolation of `y` against `x` over points sorted by strictly increasing `x`,
/// clamped to the first/last `y` outside the range.
fn lerp_by<T>(pts: &[T], x: f64, xf: impl Fn(&T) -> f64, yf: impl Fn(&T) -> f64) -> f64 {
    let first = &pts[0];
    let last = &pts[pts.len() - 1];
    if x.is_nan() || x <= xf(first) {
        return yf(first);
    }
    if x >= xf(last) {
        return yf(last);
    }
    let hi = pts.iter().position(|p| xf(p) >= x).unwrap_or(pts.len() - 1);
    let (a, b) = (&pts[hi - 1], &pts[hi]);
    let t = (x - xf(a)) / (xf(b) - xf(a));
    yf(a) + (yf(b) - yf(a)) * t
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The profile the decision tests use too; its numbers are chosen so hand arithmetic
    /// stays exact (see each test's comments).
    pub(crate) fn sample() -> Profile {
        let p = |isl, ttft_ms, throughput_per_gpu| PrefillPoint {
            isl,
            ttft_ms,
            throughput_per_gpu,
        };
        let d = |context_length, concurrency, itl_ms, throughput_per_gpu| DecodePoint {
            context_length,
            concurrency,
            itl_ms,
            throughput_per_gpu,
        };
        Profile::new(
            1,
            vec![
                p(1000.0, 100.0, 10000.0),
                p(3000.0, 400.0, 7500.0),
                p(5000.0, 800.0, 6250.0),
            ],
            vec![
                d(2000.0, 1.0, 10.0, 1000.0),
                d(2000.0, 16.0, 20.0, 8000.0),
                d(2000.0, 64.0, 60.0, 10000.0),
                d(4000.0, 1.0, 12.0, 800.0),
                d(4000.0, 16.0, 30.0, 5000.0),
                d(4000.0, 64.0, 100.0, 6400.0),
            ],
        )
        .unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn prefill_interpolates_linearly_and_clamps_at_both_ends() {
        let p = sample();
        // 2000 is halfway 1000..3000: 10000 + (7500 - 10000) * 0.5 = 8750; TTFT 250.
        assert!(close(p.prefill_throughput_per_gpu(2000.0), 8750.0));
        assert!(close(p.expected_ttft_ms(2000.0), 250.0));
        assert_eq!(p.prefill_throughput_per_gpu(3000.0), 7500.0);
        // Clamped: below the first and past the last point, the end values.
        assert_eq!(p.prefill_throughput_per_gpu(10.0), 10000.0);
        assert_eq!(p.prefill_throughput_per_gpu(100_000.0), 6250.0);
        assert_eq!(p.expected_ttft_ms(100_000.0), 800.0);
    }

    #[test]
    fn decode_best_throughput_reads_the_itl_crossing() {
        let p = sample();
        // ctx 4000, ITL 50: 30 ms (5000) is within, 100 ms (6400) is not; crossing at
        // t = (50-30)/(100-30) = 2/7 -> 5000 + 1400 * 2/7 = 5400.
        assert!(close(p.find_best_throughput_per_gpu(50.0, 4000.0), 5400.0));
        // ctx 2000, ITL 50: between 20 (8000) and 60 (10000): t = 0.75 -> 9500.
        assert!(close(p.find_best_throughput_per_gpu(50.0, 2000.0), 9500.0));
        // ctx 3000 is halfway: (9500 + 5400) / 2 = 7450.
        assert!(close(p.find_best_throughput_per_gpu(50.0, 3000.0), 7450.0));
        // A loose target takes the best measured point (ctx 4000: 6400).
        assert_eq!(p.find_best_throughput_per_gpu(1000.0, 4000.0), 6400.0);
        // Context clamps at both ends.
        assert!(close(p.find_best_throughput_per_gpu(50.0, 100.0), 9500.0));
        assert!(close(p.find_best_throughput_per_gpu(50.0, 1e6), 5400.0));
    }

    #[test]
    fn unreachable_itl_gives_the_lightest_point_and_says_so() {
        let p = sample();
        // 5 ms is below every measured ITL: the lightest load's 800 tokens/s at ctx 4000.
        let e = p.best_decode(5.0, 4000.0);
        assert_eq!(e.throughput_per_gpu, 800.0);
        assert!(!e.meets_target);
        assert!(p.best_decode(50.0, 4000.0).meets_target);
    }

    #[test]
    fn expected_itl_interpolates_concurrency_then_context() {
        let p = sample();
        assert_eq!(p.expected_itl_ms(4000.0, 16.0), 30.0);
        // ctx 2000, concurrency 40: halfway 16..64 -> (20 + 60) / 2 = 40; ctx 4000: 65;
        // ctx 3000 -> (40 + 65) / 2 = 52.5.
        assert!(close(p.expected_itl_ms(3000.0, 40.0), 52.5));
        // Clamped at concurrency ends.
        assert_eq!(p.expected_itl_ms(4000.0, 0.1), 12.0);
        assert_eq!(p.expected_itl_ms(4000.0, 1000.0), 100.0);
    }

    #[test]
    fn json_round_trip_and_the_documented_format_parses() {
        let text = r#"{
          "gpus_per_engine": 2,
          "prefill": [{"isl": 1000, "ttft_ms": 100.0, "throughput_per_gpu": 10000.0}],
          "decode": [{"context_length": 2000, "concurrency": 1, "itl_ms": 10.0, "throughput_per_gpu": 1000.0}]
        }"#;
        let p = Profile::from_json(text).unwrap();
        assert_eq!(p.gpus_per_engine(), 2);
        let again: Profile = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(again, p);
    }

    #[test]
    fn malformed_profiles_give_typed_errors_naming_the_field() {
        let wrap = |prefill: &str, decode: &str| {
            format!(r#"{{"gpus_per_engine": 1, "prefill": [{prefill}], "decode": [{decode}]}}"#)
        };
        let pp = r#"{"isl": 1000, "ttft_ms": 100, "throughput_per_gpu": 10000}"#;
        let dd = r#"{"context_length": 2000, "concurrency": 1, "itl_ms": 10, "throughput_per_gpu": 1000}"#;

        assert!(matches!(
            Profile::from_json("{not json"),
            Err(ProfileError::Json(_))
        ));
        assert!(matches!(
            Profile::from_json(r#"{"gpus_per_engine": 1, "prefill": []}"#),
            Err(ProfileError::Json(m)) if m.contains("decode")
        ));
        assert!(matches!(
            Profile::from_json(&wrap(&format!(r#"{pp}, {{"isl": 1000, "ttft_ms": 1, "throughput_per_gpu": 1, "typo": 1}}"#), dd)),
            Err(ProfileError::Json(m)) if m.contains("typo")
        ));
        assert_eq!(
            Profile::from_json(&wrap("", dd)),
            Err(ProfileError::Empty { section: "prefill" })
        );
        assert_eq!(
            Profile::from_json(&wrap(pp, "")),
            Err(ProfileError::Empty { section: "decode" })
        );
        assert_eq!(
            Profile::from_json(
                &wrap(pp, dd).replace("\"gpus_per_engine\": 1", "\"gpus_per_engine\": 0")
            ),
            Err(ProfileError::ZeroGpus)
        );
        assert!(matches!(
            Profile::from_json(&wrap(&pp.replace("10000", "-5"), dd)),
            Err(ProfileError::NotPositive { section: "prefill", index: 0, field: "throughput_per_gpu", value }) if value == -5.0
        ));
        // Unsorted ISL (second point before the first).
        assert_eq!(
            Profile::from_json(&wrap(
                &format!(r#"{pp}, {{"isl": 500, "ttft_ms": 200, "throughput_per_gpu": 1}}"#),
                dd
            )),
            Err(ProfileError::Unsorted {
                section: "prefill",
                index: 1,
                field: "isl"
            })
        );
        // TTFT falling as ISL grows.
        assert_eq!(
            Profile::from_json(&wrap(
                &format!(r#"{pp}, {{"isl": 2000, "ttft_ms": 50, "throughput_per_gpu": 1}}"#),
                dd
            )),
            Err(ProfileError::NotMonotonic {
                section: "prefill",
                index: 1,
                field: "ttft_ms",
                axis: "isl"
            })
        );
        // Duplicate concurrency at one context length, then ITL falling with concurrency.
        assert_eq!(
            Profile::from_json(&wrap(pp, &format!("{dd}, {dd}"))),
            Err(ProfileError::Unsorted {
                section: "decode",
                index: 1,
                field: "concurrency"
            })
        );
        assert_eq!(
            Profile::from_json(&wrap(
                pp,
                &format!(
                    r#"{dd}, {{"context_length": 2000, "concurrency": 8, "itl_ms": 5, "throughput_per_gpu": 1}}"#
                )
            )),
            Err(ProfileError::NotMonotonic {
                section: "decode",
                index: 1,
                field: "itl_ms",
                axis: "concurrency"
            })
        );
        assert_eq!(
            Profile::from_json(&wrap(
                pp,
                &format!(
                    r#"{dd}, {{"context_length": 1000, "concurrency": 8, "itl_ms": 50, "throughput_per_gpu": 1}}"#
                )
            )),
            Err(ProfileError::Unsorted {
                section: "decode",
                index: 1,
                field: "context_length"
            })
        );
        // NaN cannot be written in JSON but can be built in code: refused the same way.
        let nan = Profile::new(
            1,
            vec![PrefillPoint {
                isl: 1.0,
                ttft_ms: f64::NAN,
                throughput_per_gpu: 1.0,
            }],
            vec![DecodePoint {
                context_length: 1.0,
                concurrency: 1.0,
                itl_ms: 1.0,
                throughput_per_gpu: 1.0,
            }],
        );
        assert!(matches!(
            nan,
            Err(ProfileError::NotPositive {
                section: "prefill",
                index: 0,
                field: "ttft_ms",
                ..
            })
        ));
        // Deserializing through serde (e.g. inside a larger config) validates too.
        assert!(serde_json::from_str::<Profile>(&wrap("", dd)).is_err());
    }
}
