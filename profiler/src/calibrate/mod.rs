//! The hardware model's efficiency factors fitted to measurements (`dynamo profile
//! --calibrate`, `docs/perfmodel.md`, "Calibration").
//!
//! Each measured point (TTFT, ITL or both of requests of ISL/OSL tokens at a
//! concurrency, on one GPU, model and TP) is predicted as the profiler predicts a layout: one engine in
//! the closed-loop simulation ([`crate::sim`]) at that concurrency. The fit moves
//! `compute`, `kv_memory` and `step_overhead_ms` (the factors a step's time depends on
//! that measurements of latency separate; the others stay as given) to minimise the sum of squared log ratios predicted / measured
//! of TTFT and ITL over the points not held out, by Levenberg-Marquardt on forward
//! differences within the physical bounds: deterministic, a few dozen simulations per
//! point. Held-out points are predicted with the result and judged, not fitted.

mod input;

use std::fmt::Write;

use dynamo_mocker::EngineConfig;
use dynamo_perfmodel::calibration::{OVERHEAD_BOUNDS_MS, SHARE_BOUNDS};
use dynamo_perfmodel::{Efficiency, Estimator};
use thiserror::Error;

// The file and its points, decoded in perfmodel (which the `calibration` fuzz target
// builds, without the simulator).
pub use dynamo_perfmodel::calibration::{
    Calibration, CalibrationError, CalibrationFile, Measurements, Metric, Point,
};
pub use input::{from_map, load};

use crate::sim::{Drive, SimError, Stage, simulate};
use crate::sweep::SEED;

/// Levenberg-Marquardt iterations (each a Jacobian and at most a few trial steps).
const MAX_ITERATIONS: usize = 12;
/// Forward-difference steps: 2% on the shares' logarithm, 0.1 ms on the overhead.
const STEP: Params = [0.02, 0.02, 0.1];

/// Why a fit, or a prediction, failed.
#[derive(Debug, Error)]
pub enum FitError {
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
    #[error("{source_name}: the simulated engine: {error}")]
    Sim {
        source_name: String,
        error: SimError,
    },
}

/// TTFT and ITL, predicted, ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Predicted {
    pub ttft_ms: f64,
    pub itl_ms: f64,
}

/// A point with its predictions before and after the fit.
#[derive(Clone, Debug, PartialEq)]
pub struct PointFit {
    pub point: Point,
    pub before: Predicted,
    pub after: Predicted,
}

impl PointFit {
    /// Predicted / measured TTFT and ITL, before or after the fit, where measured.
    pub fn ratios(&self, after: bool) -> [Option<f64>; 2] {
        let p = if after { &self.after } else { &self.before };
        [
            self.point.ttft_ms.map(|m| p.ttft_ms / m),
            self.point.itl_ms.map(|m| p.itl_ms / m),
        ]
    }
}

/// How far predictions are from measurements, as factors (a ratio r counts as
/// max(r, 1/r)): the largest, and the geometric mean, over the TTFTs and ITLs measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ErrorSummary {
    /// Ratios summarised: one per point measuring the metric.
    pub points: usize,
    pub max_factor: f64,
    pub geomean_factor: f64,
}

impl ErrorSummary {
    pub fn of(ratios: impl Iterator<Item = f64>) -> Option<Self> {
        let logs: Vec<f64> = ratios.map(|r| r.ln().abs()).collect();
        if logs.is_empty() {
            return None;
        }
        let n = logs.len() as f64;
        Some(Self {
            points: logs.len(),
            max_factor: logs.iter().copied().fold(0.0, f64::max).exp(),
            geomean_factor: (logs.iter().sum::<f64>() / n).exp(),
        })
    }
}

/// The fit's result.
#[derive(Clone, Debug, PartialEq)]
pub struct Fit {
    pub before: Efficiency,
    pub efficiency: Efficiency,
    pub points: Vec<PointFit>,
    /// Engine simulations run.
    pub simulations: usize,
}

impl Fit {
    /// The error of `metric` on the fitted points (`held_out` false) or the held-out
    /// ones, before or after the fit; `None` where none measures it.
    pub fn error(&self, metric: Metric, held_out: bool, after: bool) -> Option<ErrorSummary> {
        ErrorSummary::of(
            self.points
                .iter()
                .filter(|p| p.point.held_out == held_out)
                .filter_map(|p| p.ratios(after)[metric.index()]),
        )
    }

    /// The per-point table and the error summary, for people.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "  {:<28} {:>6} {:>5} {:>5} {:>10} {:>8} {:>12} {:>12}",
            "point", "ISL", "OSL", "conc", "TTFT ms", "ITL ms", "TTFT ratio", "ITL ratio"
        );
        for p in &self.points {
            let ratio = |i: usize| match (p.ratios(false)[i], p.ratios(true)[i]) {
                (Some(b), Some(a)) => format!("{b:.2}->{a:.2}"),
                _ => "-".into(),
            };
            let measured = |m: Option<f64>| m.map_or("-".into(), |v| format!("{v:.2}"));
            let mut source = p.point.source.clone();
            if source.len() > 28 {
                let cut = source.len() - 27;
                let cut = (cut..source.len())
                    .find(|&i| source.is_char_boundary(i))
                    .unwrap_or(source.len());
                source = format!("~{}", &source[cut..]);
            }
            let _ = writeln!(
                out,
                "{} {source:<28} {:>6} {:>5} {:>5} {:>10} {:>8} {:>12} {:>12}",
                if p.point.held_out { "h" } else { " " },
                p.point.isl,
                p.point.osl,
                p.point.concurrency,
                measured(p.point.ttft_ms),
                measured(p.point.itl_ms),
                ratio(0),
                ratio(1),
            );
        }
        let _ = writeln!(
            out,
            "ratios are predicted / measured, before -> after the fit; h: held out"
        );
        for (held_out, what) in [(false, "fitted"), (true, "held out")] {
            for (metric, name) in [(Metric::Ttft, "TTFT"), (Metric::Itl, "ITL")] {
                let (Some(b), Some(a)) = (
                    self.error(metric, held_out, false),
                    self.error(metric, held_out, true),
                ) else {
                    continue;
                };
                let _ = writeln!(
                    out,
                    "{what} {name} ({} points): max factor {:.3} -> {:.3}, geometric mean \
                     {:.3} -> {:.3}",
                    a.points, b.max_factor, a.max_factor, b.geomean_factor, a.geomean_factor
                );
            }
        }
        let (b, e) = (&self.before, &self.efficiency);
        let _ = writeln!(
            out,
            "efficiency: compute {:.3} -> {:.3}, kv_memory {:.3} -> {:.3}, step overhead \
             {:.2} -> {:.2} ms, memory {:.3} as given ({} simulations)",
            b.compute,
            e.compute,
            b.kv_memory,
            e.kv_memory,
            b.step_overhead_ms,
            e.step_overhead_ms,
            e.memory,
            self.simulations
        );
        out
    }
}

/// Predicts `point` on `estimator`: one engine, `concurrency` requests in flight.
pub fn predict(estimator: &Estimator, point: &Point) -> Result<Predicted, FitError> {
    let (config, _) = EngineConfig::default()
        .on_hardware(estimator.clone(), None)
        .map_err(|error| CalibrationError::DoesNotFit {
            source_name: point.source.clone(),
            error: Box::new(error),
        })?;
    let drive = Drive::Closed {
        in_flight: point.concurrency,
    };
    let (isl, osl) = (point.isl as usize, point.osl as usize);
    let run = simulate(&config, Stage::Aggregated, drive, isl, osl, SEED).map_err(|error| {
        FitError::Sim {
            source_name: point.source.clone(),
            error,
        }
    })?;
    Ok(Predicted {
        ttft_ms: run.ttft_ms,
        itl_ms: run.itl_ms,
    })
}

/// Predicts every point, in parallel over the machine's cores.
fn predict_all(estimator: &Estimator, points: &[&Point]) -> Result<Vec<Predicted>, FitError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = points.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = points
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|p| predict(estimator, p))
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        let mut out = Vec::with_capacity(points.len());
        for h in handles {
            out.extend(h.join().expect("a prediction does not panic")?);
        }
        Ok(out)
    })
}

/// The fitted parameters: ln compute, ln kv_memory, step overhead ms. The weights'
/// `memory` share stays as given: a decode step's weight read and its fixed overhead
/// are both the same at every batch size, so ITLs cannot tell them apart (a fit of both
/// to NIM's figures ran the share to its bound and the overhead to 7.5 ms).
const N: usize = 3;
type Params = [f64; N];

fn params(e: &Efficiency) -> Params {
    [e.compute.ln(), e.kv_memory.ln(), e.step_overhead_ms]
}

fn clamp(x: Params) -> Params {
    let (lo, hi) = (SHARE_BOUNDS.0.ln(), SHARE_BOUNDS.1.ln());
    [
        x[0].clamp(lo, hi),
        x[1].clamp(lo, hi),
        x[2].clamp(OVERHEAD_BOUNDS_MS.0, OVERHEAD_BOUNDS_MS.1),
    ]
}

fn with(base: &Efficiency, x: Params) -> Efficiency {
    Efficiency {
        compute: x[0].exp(),
        kv_memory: x[1].exp(),
        step_overhead_ms: x[2],
        ..base.clone()
    }
}

/// The objective's parts at some factors: the predictions and their log ratios.
struct Eval {
    predicted: Vec<Predicted>,
    residuals: Vec<f64>,
    cost: f64,
}

/// The estimator `c` gives: on the factors fitted to its points (the fit with it), or on
/// its factors as given when it has no points.
pub fn calibrated(c: &Calibration) -> Result<(Estimator, Option<Fit>), FitError> {
    let mut estimator = c.measurements.estimator.clone();
    if c.measurements.points.is_empty() {
        return Ok((estimator, None));
    }
    let fit = fit(&c.measurements)?;
    estimator.efficiency = fit.efficiency.clone();
    Ok((estimator, Some(fit)))
}

/// Fits `m`'s factors (see the module doc). Needs at least one point not held out.
pub fn fit(m: &Measurements) -> Result<Fit, FitError> {
    let fitted: Vec<&Point> = m.points.iter().filter(|p| !p.held_out).collect();
    if fitted.is_empty() {
        return Err(CalibrationError::invalid(
            "points",
            "every point is held out: at least one must be fitted",
        )
        .into());
    }
    let held: Vec<&Point> = m.points.iter().filter(|p| p.held_out).collect();
    let base = &m.estimator.efficiency;
    let mut simulations = 0;
    let mut eval = |x: Params| -> Result<Eval, FitError> {
        let mut e = m.estimator.clone();
        e.efficiency = with(base, x);
        let predicted = predict_all(&e, &fitted)?;
        simulations += fitted.len();
        let residuals: Vec<f64> = predicted
            .iter()
            .zip(&fitted)
            .flat_map(|(p, m)| {
                [
                    m.ttft_ms.map(|t| (p.ttft_ms / t).ln()),
                    m.itl_ms.map(|t| (p.itl_ms / t).ln()),
                ]
                .into_iter()
                .flatten()
            })
            .collect();
        let cost = residuals.iter().map(|r| r * r).sum();
        Ok(Eval {
            predicted,
            residuals,
            cost,
        })
    };
    let mut x = clamp(params(base));
    let mut cur = eval(x)?;
    let start = cur.predicted.clone();
    let mut lambda = 1e-3;
    'outer: for _ in 0..MAX_ITERATIONS {
        // Forward differences, backwards where the step would leave the bounds.
        let mut jac = vec![[0.0; N]; cur.residuals.len()];
        for j in 0..N {
            let mut y = x;
            y[j] += STEP[j];
            if clamp(y)[j] != y[j] {
                y[j] = x[j] - STEP[j];
            }
            let h = y[j] - x[j];
            let moved = eval(y)?;
            for (row, (a, b)) in jac
                .iter_mut()
                .zip(moved.residuals.iter().zip(&cur.residuals))
            {
                row[j] = (a - b) / h;
            }
        }
        let mut jtj = [[0.0; N]; N];
        let mut jtr = [0.0; N];
        for (row, r) in jac.iter().zip(&cur.residuals) {
            for a in 0..N {
                jtr[a] += row[a] * r;
                for b in 0..N {
                    jtj[a][b] += row[a] * row[b];
                }
            }
        }
        // Damped steps until one lowers the cost.
        loop {
            let mut lhs = jtj;
            for (a, row) in lhs.iter_mut().enumerate() {
                row[a] += lambda * jtj[a][a].max(1e-9);
            }
            let Some(delta) = solve(lhs, jtr.map(|v| -v)) else {
                break 'outer;
            };
            let y = clamp(std::array::from_fn(|i| x[i] + delta[i]));
            if y == x {
                break 'outer;
            }
            let next = eval(y)?;
            if next.cost < cur.cost {
                let gain = (cur.cost - next.cost) / cur.cost.max(1e-12);
                (x, cur) = (y, next);
                lambda = (lambda / 3.0).max(1e-7);
                if gain < 1e-4 {
                    break 'outer;
                }
                break;
            }
            lambda *= 8.0;
            if lambda > 1e4 {
                break 'outer;
            }
        }
    }
    let efficiency = with(base, x);
    // The held-out points, before and after.
    let mut after_estimator = m.estimator.clone();
    after_estimator.efficiency = efficiency.clone();
    let held_before = predict_all(&m.estimator, &held)?;
    let held_after = predict_all(&after_estimator, &held)?;
    simulations += 2 * held.len();
    let mut fitted_results = start.into_iter().zip(cur.predicted);
    let mut held_results = held_before.into_iter().zip(held_after);
    let points = m
        .points
        .iter()
        .map(|p| {
            let (before, after) = if p.held_out {
                held_results.next()
            } else {
                fitted_results.next()
            }
            .expect("one prediction per point");
            PointFit {
                point: p.clone(),
                before,
                after,
            }
        })
        .collect();
    Ok(Fit {
        before: base.clone(),
        efficiency,
        points,
        simulations,
    })
}

/// `a x = b` by Gaussian elimination with partial pivoting; `None` when singular.
fn solve(mut a: [[f64; N]; N], mut b: Params) -> Option<Params> {
    for col in 0..N {
        let pivot = (col..N).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..N {
            let f = a[row][col] / a[col][col];
            let pivot_row = a[col];
            for (v, p) in a[row].iter_mut().zip(pivot_row).skip(col) {
                *v -= f * p;
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = [0.0; N];
    for row in (0..N).rev() {
        let s: f64 = (row + 1..N).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use dynamo_perfmodel::{GpuSku, ModelArch};

    use super::*;

    fn qwen() -> Estimator {
        let model = ModelArch::by_name("Qwen/Qwen3-8B").unwrap();
        Estimator::new(GpuSku::H100Sxm.spec(), model, 1).unwrap()
    }

    #[test]
    fn points_the_model_made_are_fitted_back_to_its_factors() {
        let truth = Efficiency {
            compute: 0.35,
            kv_memory: 0.45,
            step_overhead_ms: 4.0,
            ..Efficiency::default()
        };
        let mut made = qwen();
        made.efficiency = truth.clone();
        // A long prefill alone (compute), decodes alone and with two sizes of KV working
        // set (the KV's bandwidth against the fixed overhead); one shape held out.
        let points: Vec<Point> = [
            (3000, 200, 1, false),
            (300, 200, 1, false),
            (3000, 200, 8, false),
            (3000, 200, 32, false),
            (1000, 200, 8, true),
        ]
        .into_iter()
        .map(|(isl, osl, concurrency, held_out)| {
            let mut p = Point {
                source: format!("{isl}/{osl} x{concurrency}"),
                isl,
                osl,
                concurrency,
                ttft_ms: None,
                itl_ms: None,
                held_out,
            };
            let made = predict(&made, &p).unwrap();
            (p.ttft_ms, p.itl_ms) = (Some(made.ttft_ms), Some(made.itl_ms));
            p
        })
        .collect();
        let m = Measurements {
            estimator: qwen(),
            points,
        };
        let fit = fit(&m).unwrap();
        let e = &fit.efficiency;
        let near = |got: f64, want: f64, tol: f64| (got / want - 1.0).abs() < tol;
        assert!(near(e.compute, truth.compute, 0.03), "{}", fit.summary());
        assert_eq!(e.memory, truth.memory);
        assert!(
            near(e.kv_memory, truth.kv_memory, 0.03),
            "{}",
            fit.summary()
        );
        assert!(
            near(e.step_overhead_ms, truth.step_overhead_ms, 0.05),
            "{}",
            fit.summary()
        );
        assert_eq!((e.tp_link, e.transfer), (truth.tp_link, truth.transfer));
        // The defaults were off by more than a fifth; the fit is not.
        for metric in [Metric::Ttft, Metric::Itl] {
            let before = fit.error(metric, false, false).unwrap();
            assert!(before.max_factor > 1.2, "{before:?}");
            for held_out in [false, true] {
                let after = fit.error(metric, held_out, true).unwrap();
                assert!(after.max_factor < 1.02, "{}", fit.summary());
            }
        }
        assert_eq!(fit.error(Metric::Itl, true, true).unwrap().points, 1);
        let summary = fit.summary();
        assert!(summary.contains("held out ITL (1 points)"), "{summary}");
        // Every point held out leaves nothing to fit.
        let mut all_held = m.clone();
        all_held.points.iter_mut().for_each(|p| p.held_out = true);
        assert!(fit_err(&all_held).contains("every point is held out"));
    }

    fn fit_err(m: &Measurements) -> String {
        fit(m).unwrap_err().to_string()
    }

    #[test]
    fn the_solver_solves_and_refuses_a_singular_system() {
        let a = [[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]];
        let x = solve(a, [3.0, 5.0, 5.0]).unwrap();
        for (got, want) in x.iter().zip([1.0; N]) {
            assert!((got - want).abs() < 1e-12, "{x:?}");
        }
        let singular = [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 0.0]];
        assert_eq!(solve(singular, [1.0; N]), None);
    }

    #[test]
    fn error_summaries_count_a_ratio_and_its_inverse_alike() {
        let s = ErrorSummary::of([2.0, 0.5, 1.0, 1.0].into_iter()).unwrap();
        assert_eq!(s.points, 4);
        assert!((s.max_factor - 2.0).abs() < 1e-12);
        assert!((s.geomean_factor - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(ErrorSummary::of([].into_iter()), None);
    }
}
