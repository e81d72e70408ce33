//! Next-interval load predictors. Every adjustment interval the planner feeds one
//! observation per quantity (request count, mean ISL, mean OSL: one predictor each) and
//! sizes the next interval on the prediction, so it scales ahead of a ramp instead of one
//! interval behind it.
//!
//! Mirrors Dynamo's `load_predictor` choice (`components/src/dynamo/planner/config/
//! defaults.py`, `planner_design.md`): `constant`, `arima` (Dynamo's default) and `kalman`,
//! plus a `moving-average`; Dynamo's `prophet` is not offered. As in Dynamo, a predictor
//! that has too few points answers with the last value (the constant predictor) until it
//! is warmed up, and `load_predictor_log1p` fits on `ln(1 + x)`.
//!
//! Bad input never reaches a model: NaN, infinite and negative observations are counted
//! and dropped ([`Predictor::ignored`]), and a prediction is always finite and
//! non-negative, or `None` before the first good observation, so the planner holds its
//! replicas on missing data instead of scaling to zero.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A one-step-ahead forecaster fed one value per adjustment interval. A trait so the
/// planner's decision loop can be tested with a scripted predictor.
pub trait Predictor {
    /// Feeds the value observed over the interval that just ended. Returns whether it was
    /// used: a NaN, infinite or negative value is counted and dropped, never folded into
    /// the state.
    fn observe(&mut self, value: f64) -> bool;

    /// The value expected over the next interval: finite and `>= 0`, or `None` while no
    /// valid value has been observed (the planner must then hold, not scale).
    fn predict(&self) -> Option<f64>;

    /// How many observations were dropped as invalid.
    fn ignored(&self) -> u64;
}

/// Which model predicts. Parsed case-insensitively from a CLI flag (`_` and `-` are
/// interchangeable) and written in kebab-case in a config file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PredictorKind {
    /// The last value: reacts one interval late, never overshoots.
    Constant,
    /// Mean of the last `window` values: smooths noise, lags a step or ramp by design.
    #[serde(alias = "moving_average")]
    MovingAverage,
    /// Local linear trend (level + slope) Kalman filter: follows ramps.
    Kalman,
    /// ARIMA(p,1,0) with drift: follows ramps and periodic swings. Dynamo's default.
    #[default]
    Arima,
}

impl PredictorKind {
    pub const ALL: [Self; 4] = [
        Self::Constant,
        Self::MovingAverage,
        Self::Kalman,
        Self::Arima,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Constant => "constant",
            Self::MovingAverage => "moving-average",
            Self::Kalman => "kalman",
            Self::Arima => "arima",
        }
    }
}

impl fmt::Display for PredictorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PredictorKind {
    type Err = PredictorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().replace('_', "-");
        Self::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(&wanted))
            .ok_or_else(|| PredictorError::UnknownKind(s.to_owned()))
    }
}

/// Why a predictor could not be configured.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum PredictorError {
    #[error("unknown load predictor {0:?}: expected constant, moving-average, kalman or arima")]
    UnknownKind(String),
    #[error("invalid load predictor setting {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> PredictorError {
    PredictorError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// Moving-average settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MovingAverageParams {
    /// Values averaged. Default 5 (Dynamo has no moving average): with Dynamo's 180 s
    /// interval that is 15 minutes, long enough to smooth bursts, short enough to follow
    /// a shift within a few intervals.
    pub window: usize,
}

impl Default for MovingAverageParams {
    fn default() -> Self {
        Self { window: 5 }
    }
}

/// Kalman settings; defaults are Dynamo's (`defaults.py`: `kalman_q_level` 1.0,
/// `kalman_q_trend` 0.1, `kalman_r` 10.0, `kalman_min_points` 5). Variances are in the
/// units of the fitted series (after `log1p` when that is on), so only their ratios and
/// their size against the series' own noise matter.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KalmanParams {
    /// Process noise of the level: how far the load may jump per interval.
    pub q_level: f64,
    /// Process noise of the trend: how fast the slope may change.
    pub q_trend: f64,
    /// Measurement noise: how much one interval's reading is trusted.
    pub r: f64,
    /// Observations before the filter's forecast is used; the last value until then.
    pub min_points: usize,
}

impl Default for KalmanParams {
    fn default() -> Self {
        Self {
            q_level: 1.0,
            q_trend: 0.1,
            r: 10.0,
            min_points: 5,
        }
    }
}

/// ARIMA(p,1,0)-with-drift settings. Dynamo fits its ARIMA with `pmdarima`; ours is an
/// AR(`order`) on first differences fitted by Yule-Walker over the last `window` values,
/// which is cheap, needs no optimiser and is always stationary (it cannot explode).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArimaParams {
    /// AR order p on the differences. Default 2: the smallest that can represent an
    /// oscillation (a daily or bursty cycle), larger orders overfit short windows.
    pub order: usize,
    /// Most recent values fitted. Default 64 (3.2 h at Dynamo's 180 s interval), so an
    /// old regime stops shaping the fit.
    pub window: usize,
    /// Values needed before the fit is used; the last value until then. Default 8.
    pub min_points: usize,
}

impl Default for ArimaParams {
    fn default() -> Self {
        Self {
            order: 2,
            window: 64,
            min_points: 8,
        }
    }
}

/// Everything needed to build a [`LoadPredictor`]; every field has a default, so a config
/// file names only what it changes. Defaults follow Dynamo (`arima`, `log1p` off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PredictorConfig {
    pub kind: PredictorKind,
    /// Fit on `ln(1 + x)` and predict `exp(y) - 1` (Dynamo's `load_predictor_log1p`):
    /// multiplicative swings become additive and a forecast cannot go below zero.
    pub log1p: bool,
    pub moving_average: MovingAverageParams,
    pub kalman: KalmanParams,
    pub arima: ArimaParams,
}

/// Largest ARIMA order accepted: beyond this a window of planner intervals cannot fit it.
const MAX_ARIMA_ORDER: usize = 16;

impl PredictorConfig {
    /// A config with default parameters for `kind`.
    pub fn new(kind: PredictorKind) -> Self {
        Self {
            kind,
            ..Self::default()
        }
    }

    /// Checks every parameter, including those of kinds not selected, so a typo in a
    /// config file fails at start-up rather than when someone switches kind.
    pub fn validate(&self) -> Result<(), PredictorError> {
        if self.moving_average.window == 0 {
            return Err(invalid("moving_average.window", "must be at least 1"));
        }
        let k = &self.kalman;
        for (field, v) in [("kalman.q_level", k.q_level), ("kalman.q_trend", k.q_trend)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(field, format!("{v} is not a finite value >= 0")));
            }
        }
        if !(k.r.is_finite() && k.r > 0.0) {
            return Err(invalid(
                "kalman.r",
                format!("{} is not a finite value > 0", k.r),
            ));
        }
        if k.min_points == 0 {
            return Err(invalid("kalman.min_points", "must be at least 1"));
        }
        let a = &self.arima;
        if a.order > MAX_ARIMA_ORDER {
            return Err(invalid(
                "arima.order",
                format!("{} exceeds {MAX_ARIMA_ORDER}", a.order),
            ));
        }
        // p + 1 differences at least, i.e. p + 2 values, for the fit to mean anything.
        if a.min_points < a.order + 2 {
            return Err(invalid(
                "arima.min_points",
                format!("{} is below order + 2 = {}", a.min_points, a.order + 2),
            ));
        }
        if a.window < a.min_points {
            return Err(invalid(
                "arima.window",
                format!("{} is below min_points {}", a.window, a.min_points),
            ));
        }
        Ok(())
    }

    /// Validates and builds a fresh predictor.
    pub fn build(&self) -> Result<LoadPredictor, PredictorError> {
        self.validate()?;
        Ok(LoadPredictor {
            config: *self,
            model: Model::new(self),
            last: None,
            observed: 0,
            ignored: 0,
            resets: 0,
        })
    }
}

/// Parses a CLI flag value: a kind name, optionally with a window for the kinds that
/// have one: `constant`, `kalman`, `arima`, `arima:32`, `moving-average`,
/// `moving-average:10`. Other parameters keep their defaults.
impl FromStr for PredictorConfig {
    type Err = PredictorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, window) = match s.split_once(':') {
            Some((name, w)) => {
                let w = w.trim().parse::<usize>().map_err(|e| {
                    invalid("window", format!("{w:?} in {s:?} is not a count: {e}"))
                })?;
                (name, Some(w))
            }
            None => (s, None),
        };
        let mut config = Self::new(name.parse()?);
        match (config.kind, window) {
            (_, None) => {}
            (PredictorKind::MovingAverage, Some(w)) => config.moving_average.window = w,
            (PredictorKind::Arima, Some(w)) => config.arima.window = w,
            (kind, Some(_)) => {
                return Err(invalid("window", format!("{kind} takes no window")));
            }
        }
        config.validate()?;
        Ok(config)
    }
}

/// The planner's predictor for one quantity: one of the models behind the input guard,
/// the optional `log1p` transform and the output clamp.
#[derive(Clone, Debug)]
pub struct LoadPredictor {
    config: PredictorConfig,
    model: Model,
    /// Last accepted value, raw and as fitted: the fallback answer.
    last: Option<(f64, f64)>,
    observed: u64,
    ignored: u64,
    resets: u64,
}

impl LoadPredictor {
    pub fn config(&self) -> &PredictorConfig {
        &self.config
    }

    pub fn kind(&self) -> PredictorKind {
        self.config.kind
    }

    /// Observations accepted so far.
    pub fn observed(&self) -> u64 {
        self.observed
    }

    /// Times the model's state overflowed (values near `f64::MAX`) and was restarted from
    /// the current value; kept so a report can say why a forecast jumped.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// Whether the model has enough points to forecast; until then `predict` answers
    /// with the last value, as Dynamo does during warm-up.
    pub fn is_warm(&self) -> bool {
        match self.model {
            Model::Constant => self.last.is_some(),
            _ => self.model.forecast().is_some(),
        }
    }

    /// Feeds a history (Dynamo's `load_predictor_warmup_trace`) so a fresh planner does
    /// not start cold. Returns how many values were accepted.
    pub fn warm_up(&mut self, values: impl IntoIterator<Item = f64>) -> usize {
        values.into_iter().filter(|&v| self.observe(v)).count()
    }
}

impl Predictor for LoadPredictor {
    fn observe(&mut self, value: f64) -> bool {
        if !value.is_finite() || value < 0.0 {
            self.ignored += 1;
            return false;
        }
        let raw = value + 0.0; // -0.0 -> 0.0
        let fitted = if self.config.log1p { raw.ln_1p() } else { raw };
        self.model.observe(fitted);
        if !self.model.is_finite() {
            // Overflow, not bad input: restart the model from this value.
            self.model = Model::new(&self.config);
            self.model.observe(fitted);
            self.resets += 1;
        }
        self.last = Some((raw, fitted));
        self.observed += 1;
        true
    }

    fn predict(&self) -> Option<f64> {
        let (raw_last, fitted_last) = self.last?;
        let fitted = self
            .model
            .forecast()
            .filter(|f| f.is_finite())
            .unwrap_or(fitted_last);
        let value = if self.config.log1p {
            fitted.exp_m1()
        } else {
            fitted
        };
        let value = if value.is_finite() { value } else { raw_last };
        Some(value.max(0.0))
    }

    fn ignored(&self) -> u64 {
        self.ignored
    }
}

/// The models see only finite, already-transformed values; `forecast` is `None` until
/// they have enough points (the wrapper then answers with the last value).
#[derive(Clone, Debug)]
enum Model {
    Constant,
    MovingAverage(MovingAverage),
    Kalman(Kalman),
    Arima(Arima),
}

impl Model {
    fn new(config: &PredictorConfig) -> Self {
        match config.kind {
            PredictorKind::Constant => Self::Constant,
            PredictorKind::MovingAverage => Self::MovingAverage(MovingAverage {
                window: config.moving_average.window,
                values: VecDeque::new(),
            }),
            PredictorKind::Kalman => Self::Kalman(Kalman::new(config.kalman)),
            PredictorKind::Arima => Self::Arima(Arima {
                params: config.arima,
                values: VecDeque::new(),
            }),
        }
    }

    fn observe(&mut self, x: f64) {
        match self {
            Self::Constant => {}
            Self::MovingAverage(m) => push_window(&mut m.values, m.window, x),
            Self::Kalman(k) => k.observe(x),
            Self::Arima(a) => push_window(&mut a.values, a.params.window, x),
        }
    }

    fn forecast(&self) -> Option<f64> {
        match self {
            Self::Constant => None,
            Self::MovingAverage(m) => m.forecast(),
            Self::Kalman(k) => k.forecast(),
            Self::Arima(a) => a.forecast(),
        }
    }

    /// Whether the state is still usable (the window models keep raw finite values, so
    /// only the filter can overflow).
    fn is_finite(&self) -> bool {
        match self {
            Self::Kalman(k) => [k.level, k.trend, k.p00, k.p01, k.p11]
                .iter()
                .all(|v| v.is_finite()),
            _ => true,
        }
    }
}

fn push_window(values: &mut VecDeque<f64>, window: usize, x: f64) {
    if values.len() == window {
        values.pop_front();
    }
    values.push_back(x);
}

#[derive(Clone, Debug)]
struct MovingAverage {
    window: usize,
    values: VecDeque<f64>,
}

impl MovingAverage {
    fn forecast(&self) -> Option<f64> {
        // Dividing first keeps the sum finite for values near f64::MAX.
        let n = self.values.len() as f64;
        (!self.values.is_empty()).then(|| self.values.iter().map(|v| v / n).sum())
    }
}

/// Prior variance of the trend, as a multiple of `r`: large, so the second observation
/// sets the slope (a near-diffuse start) instead of the filter learning it over many
/// intervals at the steady-state gain that `q_trend / r` = 0.01 implies.
const TREND_PRIOR: f64 = 1e4;

/// Local linear trend model: level' = level + trend + w_l, trend' = trend + w_t,
/// y = level + v, with var(w_l) = q_level, var(w_t) = q_trend, var(v) = r.
#[derive(Clone, Debug)]
struct Kalman {
    params: KalmanParams,
    seen: usize,
    level: f64,
    trend: f64,
    // Symmetric state covariance [[p00, p01], [p01, p11]].
    p00: f64,
    p01: f64,
    p11: f64,
}

impl Kalman {
    fn new(params: KalmanParams) -> Self {
        Self {
            params,
            seen: 0,
            level: 0.0,
            trend: 0.0,
            p00: 0.0,
            p01: 0.0,
            p11: 0.0,
        }
    }

    fn observe(&mut self, y: f64) {
        let KalmanParams {
            q_level,
            q_trend,
            r,
            ..
        } = self.params;
        if self.seen == 0 {
            // The level is known to within one measurement; the slope is unknown.
            self.level = y;
            self.trend = 0.0;
            self.p00 = r;
            self.p01 = 0.0;
            self.p11 = TREND_PRIOR * r;
        } else {
            // Time update with F = [[1, 1], [0, 1]]: P = F P F' + Q.
            let level = self.level + self.trend;
            let p00 = self.p00 + 2.0 * self.p01 + self.p11 + q_level;
            let p01 = self.p01 + self.p11;
            let p11 = self.p11 + q_trend;
            // Measurement update with H = [1, 0].
            let s = p00 + r;
            let (k0, k1) = (p00 / s, p01 / s);
            let innovation = y - level;
            self.level = level + k0 * innovation;
            self.trend += k1 * innovation;
            self.p00 = (1.0 - k0) * p00;
            self.p01 = (1.0 - k0) * p01;
            // Rounding must not make the covariance indefinite.
            self.p11 = (p11 - k1 * p01).max(0.0);
        }
        self.seen += 1;
    }

    fn forecast(&self) -> Option<f64> {
        (self.seen >= self.params.min_points).then_some(self.level + self.trend)
    }
}

/// ARIMA(p,1,0) with drift: the next difference is the window's mean difference plus an
/// AR(p) on the centred differences, fitted by Yule-Walker (Levinson-Durbin). A constant
/// series has zero differences (forecast = last value); a clean ramp has constant ones
/// (zero variance, so the forecast is last + slope).
#[derive(Clone, Debug)]
struct Arima {
    params: ArimaParams,
    values: VecDeque<f64>,
}

impl Arima {
    fn forecast(&self) -> Option<f64> {
        if self.values.len() < self.params.min_points {
            return None;
        }
        let last = *self.values.back()?;
        let diffs: Vec<f64> = self
            .values
            .iter()
            .zip(self.values.iter().skip(1))
            .map(|(a, b)| b - a)
            .collect();
        let n = diffs.len();
        let mean = diffs.iter().map(|d| d / n as f64).sum::<f64>();
        let centred: Vec<f64> = diffs.iter().map(|d| d - mean).collect();
        let order = self.params.order.min(n - 1);
        // Biased autocovariances: they keep the Toeplitz system positive definite, which
        // is what makes the Yule-Walker fit stationary.
        let gamma: Vec<f64> = (0..=order)
            .map(|lag| {
                centred
                    .iter()
                    .zip(&centred[lag..])
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
                    / n as f64
            })
            .collect();
        let phi = levinson_durbin(&gamma, order);
        let ar: f64 = phi
            .iter()
            .enumerate()
            .map(|(i, p)| p * centred[n - 1 - i])
            .sum();
        Some(last + mean + ar)
    }
}

/// Solves the Yule-Walker equations for AR coefficients `phi[0..order]` (lag 1 first).
/// Stops at the last stable order when a reflection coefficient reaches |1| or the data
/// has no variance, so the fit never explodes.
fn levinson_durbin(gamma: &[f64], order: usize) -> Vec<f64> {
    let mut phi = vec![0.0; order];
    let mut error = gamma[0];
    for k in 0..order {
        if !(error.is_finite() && error > 0.0) {
            break;
        }
        let acc = gamma[k + 1] - (0..k).map(|j| phi[j] * gamma[k - j]).sum::<f64>();
        let reflection = acc / error;
        if !reflection.is_finite() || reflection.abs() >= 1.0 {
            break;
        }
        let previous = phi.clone();
        phi[k] = reflection;
        for j in 0..k {
            phi[j] = previous[j] - reflection * previous[k - 1 - j];
        }
        error *= 1.0 - reflection * reflection;
    }
    phi
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn build(kind: PredictorKind) -> LoadPredictor {
        PredictorConfig::new(kind).build().unwrap()
    }

    /// Feeds `series` and returns, for each index, what was predicted before that value
    /// was observed.
    fn forecasts(mut p: LoadPredictor, series: &[f64]) -> Vec<Option<f64>> {
        series
            .iter()
            .map(|&v| {
                let before = p.predict();
                p.observe(v);
                before
            })
            .collect()
    }

    /// Mean absolute one-step error over `series[from..]`.
    fn mae(kind: PredictorKind, series: &[f64], from: usize) -> f64 {
        let f = forecasts(build(kind), series);
        let errors: Vec<f64> = (from..series.len())
            .map(|i| (f[i].unwrap() - series[i]).abs())
            .collect();
        errors.iter().sum::<f64>() / errors.len() as f64
    }

    /// Tiny deterministic LCG (Knuth's MMIX constants): uniform in [0, 1).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn nothing_observed_predicts_none() {
        for kind in PredictorKind::ALL {
            let mut p = build(kind);
            assert_eq!(p.predict(), None, "{kind}");
            p.observe(f64::NAN);
            assert_eq!(p.predict(), None, "{kind}: NaN must not count as data");
        }
    }

    #[test]
    fn constant_series_every_predictor_predicts_the_constant() {
        let series = vec![42.0; 40];
        for log1p in [false, true] {
            for kind in PredictorKind::ALL {
                let config = PredictorConfig {
                    log1p,
                    ..PredictorConfig::new(kind)
                };
                let f = forecasts(config.build().unwrap(), &series);
                for (i, v) in f.iter().enumerate().skip(1) {
                    let v = v.unwrap();
                    assert!((v - 42.0).abs() < 1e-9, "{kind} log1p={log1p} at {i}: {v}");
                }
            }
        }
    }

    #[test]
    fn warm_up_answers_with_the_last_value() {
        let series = [10.0, 20.0, 30.0, 40.0];
        for kind in [PredictorKind::Kalman, PredictorKind::Arima] {
            let mut p = build(kind);
            for v in series {
                p.observe(v);
                assert!(!p.is_warm(), "{kind}");
                assert_eq!(p.predict(), Some(v), "{kind}");
            }
        }
        let mut c = build(PredictorKind::Constant);
        assert!(!c.is_warm());
        c.observe(1.0);
        assert!(c.is_warm(), "the constant predictor needs one value");
        let mut k = build(PredictorKind::Kalman);
        k.warm_up([10.0, 20.0, 30.0, 40.0, 50.0]);
        assert!(k.is_warm(), "kalman warms after min_points = 5");
        assert!(k.predict().unwrap() > 50.0, "and then forecasts the ramp");
    }

    #[test]
    fn linear_ramp_kalman_and_arima_predict_the_next_point() {
        let series: Vec<f64> = (0..40).map(|i| 100.0 + 25.0 * i as f64).collect();
        let constant = mae(PredictorKind::Constant, &series, 10);
        let kalman = mae(PredictorKind::Kalman, &series, 10);
        let arima = mae(PredictorKind::Arima, &series, 10);
        assert!(
            (constant - 25.0).abs() < 1e-9,
            "constant lags one step: {constant}"
        );
        assert!(kalman < 1.0, "kalman error {kalman}");
        assert!(arima < 1e-6, "arima error {arima}");
        assert!(arima <= kalman && kalman < constant);
        // And at the end of the ramp, both forecast the next point.
        for kind in [PredictorKind::Kalman, PredictorKind::Arima] {
            let mut p = build(kind);
            p.warm_up(series.iter().copied());
            let next = 100.0 + 25.0 * 40.0;
            let got = p.predict().unwrap();
            assert!((got - next).abs() < 1.0, "{kind}: {got} vs {next}");
        }
    }

    #[test]
    fn noisy_ramp_kalman_and_arima_beat_constant() {
        let mut rng = Lcg(7);
        let series: Vec<f64> = (0..120)
            .map(|i| 200.0 + 10.0 * i as f64 + 8.0 * (rng.next() - 0.5))
            .collect();
        let constant = mae(PredictorKind::Constant, &series, 20);
        let kalman = mae(PredictorKind::Kalman, &series, 20);
        let arima = mae(PredictorKind::Arima, &series, 20);
        assert!(
            kalman < constant / 2.0,
            "kalman {kalman} vs constant {constant}"
        );
        assert!(
            arima < constant / 2.0,
            "arima {arima} vs constant {constant}"
        );
    }

    #[test]
    fn step_change_moving_average_lags_and_kalman_converges() {
        let mut series = vec![100.0; 30];
        series.extend(vec![400.0; 30]);
        let ma = forecasts(build(PredictorKind::MovingAverage), &series);
        // Window 5: the step is fully reflected only five intervals later, linearly.
        for j in 1..=5 {
            let expected = 100.0 + 300.0 * j as f64 / 5.0;
            assert!((ma[30 + j].unwrap() - expected).abs() < 1e-9, "ma step {j}");
        }
        assert!(ma[31].unwrap() < 200.0, "moving average lags by design");
        // The trend model reads the jump as a slope at first and overshoots (to about
        // 465), then settles.
        const K: usize = 15;
        let kalman = forecasts(build(PredictorKind::Kalman), &series);
        for (i, v) in kalman.iter().enumerate().skip(30 + K) {
            let v = v.unwrap();
            assert!((v - 400.0).abs() < 0.05 * 300.0, "kalman at {i}: {v}");
        }
        let last = kalman[59].unwrap();
        assert!((last - 400.0).abs() < 1.0, "kalman settles: {last}");
    }

    fn noisy_sine(period: f64, len: usize, seed: u64) -> Vec<f64> {
        let mut rng = Lcg(seed);
        (0..len)
            .map(|i| {
                let phase = 2.0 * std::f64::consts::PI * i as f64 / period;
                500.0 + 200.0 * phase.sin() + 20.0 * (rng.next() - 0.5)
            })
            .collect()
    }

    /// A cycle of 100 intervals (5 h at Dynamo's 180 s interval), like a daily swing.
    #[test]
    fn noisy_sine_arima_and_kalman_beat_constant() {
        let series = noisy_sine(100.0, 300, 42);
        let constant = mae(PredictorKind::Constant, &series, 10);
        let kalman = mae(PredictorKind::Kalman, &series, 10);
        let arima = mae(PredictorKind::Arima, &series, 10);
        assert!(kalman < constant, "kalman {kalman} vs constant {constant}");
        assert!(arima < constant, "arima {arima} vs constant {constant}");
    }

    /// A cycle of 20 intervals. The AR part fits the oscillation; Dynamo's Kalman defaults
    /// fix its gains (about 0.42 on the level, 0.076 on the trend, whatever the data), so
    /// its trend lags a cycle this fast and it does worse than the last value: the
    /// filter suits slow drifts, ARIMA fast cycles.
    #[test]
    fn fast_noisy_sine_arima_beats_constant_and_kalman_lags() {
        let series = noisy_sine(20.0, 200, 42);
        let constant = mae(PredictorKind::Constant, &series, 10);
        let kalman = mae(PredictorKind::Kalman, &series, 10);
        let arima = mae(PredictorKind::Arima, &series, 10);
        assert!(
            arima < constant / 2.0,
            "arima {arima} vs constant {constant}"
        );
        assert!(kalman > constant, "kalman {kalman} vs constant {constant}");
    }

    #[test]
    fn nan_infinite_and_negative_are_ignored_and_counted() {
        for kind in PredictorKind::ALL {
            let mut clean = build(kind);
            let mut dirty = build(kind);
            for i in 0..30 {
                let v = 50.0 + 3.0 * i as f64;
                clean.observe(v);
                assert!(dirty.observe(v));
                assert!(!dirty.observe(f64::NAN));
                assert!(!dirty.observe(f64::INFINITY));
                assert!(!dirty.observe(f64::NEG_INFINITY));
                assert!(!dirty.observe(-1.0));
            }
            assert_eq!(dirty.ignored(), 120, "{kind}");
            assert_eq!(dirty.observed(), 30, "{kind}");
            assert_eq!(clean.predict(), dirty.predict(), "{kind}: state untouched");
        }
    }

    #[test]
    fn predictions_never_go_below_zero() {
        // A ramp down to zero: the trend models would extrapolate below it.
        let series: Vec<f64> = (0..20)
            .map(|i| (100.0 - 10.0 * i as f64).max(0.0))
            .collect();
        for kind in PredictorKind::ALL {
            let mut p = build(kind);
            for v in &series {
                p.observe(*v);
                assert!(p.predict().unwrap() >= 0.0, "{kind}");
            }
        }
        let mut k = build(PredictorKind::Kalman);
        k.warm_up([100.0, 80.0, 60.0, 40.0, 20.0, 0.0]);
        assert_eq!(k.predict(), Some(0.0), "clamped, not negative");
    }

    #[test]
    fn huge_values_do_not_poison_the_state() {
        for kind in PredictorKind::ALL {
            let mut p = build(kind);
            p.warm_up([f64::MAX, 0.0, f64::MAX, f64::MAX / 3.0, 0.0, f64::MAX]);
            p.warm_up(std::iter::repeat_n(f64::MAX, 10));
            let v = p.predict().unwrap();
            assert!(v.is_finite() && v >= 0.0, "{kind}: {v}");
            // Back to ordinary load: the window models forget the huge values once they
            // leave the window. The filter forgets geometrically (its error shrinks by
            // about 0.76 per interval), so from 1e308 it stays finite but needs ~2600.
            p.warm_up(std::iter::repeat_n(10.0, 80));
            let v = p.predict().unwrap();
            assert!(v.is_finite() && v >= 0.0, "{kind}: {v}");
            if kind != PredictorKind::Kalman {
                assert!((v - 10.0).abs() < 1e-6, "{kind}: {v}");
            }
        }
    }

    #[test]
    fn log1p_follows_exponential_growth() {
        let series: Vec<f64> = (0..30).map(|i| 10.0 * 1.2f64.powi(i)).collect();
        let config = PredictorConfig {
            log1p: true,
            ..PredictorConfig::new(PredictorKind::Arima)
        };
        let mut p = config.build().unwrap();
        p.warm_up(series.iter().copied());
        let next = 10.0 * 1.2f64.powi(30);
        let got = p.predict().unwrap();
        let last = *series.last().unwrap();
        assert!(
            (got - next).abs() < (last - next).abs() / 2.0,
            "{got} vs {next}"
        );
    }

    #[test]
    fn kinds_parse_from_cli_strings() {
        for kind in PredictorKind::ALL {
            assert_eq!(kind.as_str().parse::<PredictorKind>(), Ok(kind));
            assert_eq!(kind.to_string().to_uppercase().parse(), Ok(kind));
        }
        assert_eq!("moving_average".parse(), Ok(PredictorKind::MovingAverage));
        assert_eq!(
            "prophet".parse::<PredictorKind>(),
            Err(PredictorError::UnknownKind("prophet".into()))
        );
        let c: PredictorConfig = "moving-average:10".parse().unwrap();
        assert_eq!(c.kind, PredictorKind::MovingAverage);
        assert_eq!(c.moving_average.window, 10);
        let c: PredictorConfig = "arima:32".parse().unwrap();
        assert_eq!(c.arima.window, 32);
        assert_eq!(
            "kalman".parse(),
            Ok(PredictorConfig::new(PredictorKind::Kalman))
        );
        assert!("kalman:3".parse::<PredictorConfig>().is_err());
        assert!("moving-average:0".parse::<PredictorConfig>().is_err());
        assert!("moving-average:x".parse::<PredictorConfig>().is_err());
        assert!(
            "arima:4".parse::<PredictorConfig>().is_err(),
            "below min_points"
        );
    }

    #[test]
    fn defaults_are_dynamos_and_serde_round_trips() {
        let d = PredictorConfig::default();
        assert_eq!(d.kind, PredictorKind::Arima);
        assert!(!d.log1p);
        assert_eq!(
            d.kalman,
            KalmanParams {
                q_level: 1.0,
                q_trend: 0.1,
                r: 10.0,
                min_points: 5
            }
        );
        assert_eq!(d.moving_average.window, 5);
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<PredictorConfig>(&json).unwrap(), d);
        let partial: PredictorConfig = serde_json::from_str(
            r#"{"kind": "moving-average", "log1p": true, "moving_average": {"window": 3}}"#,
        )
        .unwrap();
        assert_eq!(partial.kind, PredictorKind::MovingAverage);
        assert!(partial.log1p);
        assert_eq!(partial.moving_average.window, 3);
        assert_eq!(partial.kalman, KalmanParams::default());
        assert!(serde_json::from_str::<PredictorConfig>(r#"{"knd": "arima"}"#).is_err());
        assert!(serde_json::from_str::<PredictorConfig>(r#"{"kind": "prophet"}"#).is_err());
    }

    #[test]
    fn invalid_parameters_are_rejected() {
        let bad = [
            PredictorConfig {
                kalman: KalmanParams {
                    r: 0.0,
                    ..KalmanParams::default()
                },
                ..PredictorConfig::default()
            },
            PredictorConfig {
                kalman: KalmanParams {
                    q_level: f64::NAN,
                    ..KalmanParams::default()
                },
                ..PredictorConfig::default()
            },
            PredictorConfig {
                kalman: KalmanParams {
                    min_points: 0,
                    ..KalmanParams::default()
                },
                ..PredictorConfig::default()
            },
            PredictorConfig {
                arima: ArimaParams {
                    order: 7,
                    ..ArimaParams::default()
                },
                ..PredictorConfig::default()
            },
            PredictorConfig {
                arima: ArimaParams {
                    order: 40,
                    window: 100,
                    min_points: 50,
                },
                ..PredictorConfig::default()
            },
            PredictorConfig {
                moving_average: MovingAverageParams { window: 0 },
                ..PredictorConfig::default()
            },
        ];
        for config in bad {
            assert!(config.build().is_err(), "{config:?}");
        }
    }

    #[test]
    fn levinson_durbin_recovers_an_ar2() {
        // Autocovariances of x_t = 0.5 x_{t-1} - 0.3 x_{t-2} + e (up to scale): solve the
        // Yule-Walker system forwards, then check the solver inverts it.
        let (a1, a2) = (0.5, -0.3);
        let rho1 = a1 / (1.0 - a2);
        let rho2 = a1 * rho1 + a2;
        let phi = levinson_durbin(&[1.0, rho1, rho2], 2);
        assert!(
            (phi[0] - a1).abs() < 1e-12 && (phi[1] - a2).abs() < 1e-12,
            "{phi:?}"
        );
        assert_eq!(levinson_durbin(&[0.0, 0.0, 0.0], 2), vec![0.0, 0.0]);
    }

    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            8 => 0.0..1e6f64,
            2 => 0.0..f64::MAX,
            1 => Just(0.0),
            1 => Just(f64::NAN),
            1 => Just(f64::INFINITY),
            1 => -1e6..0.0f64,
        ]
    }

    proptest! {
        #[test]
        fn predictions_are_finite_and_non_negative(
            series in prop::collection::vec(value(), 0..80),
            kind in prop::sample::select(PredictorKind::ALL.to_vec()),
            log1p in any::<bool>(),
        ) {
            let config = PredictorConfig { log1p, ..PredictorConfig::new(kind) };
            let mut p = config.build().unwrap();
            let mut valid = 0u64;
            for v in series {
                if p.observe(v) {
                    valid += 1;
                }
                match p.predict() {
                    None => prop_assert_eq!(valid, 0),
                    Some(f) => prop_assert!(f.is_finite() && f >= 0.0, "{} gave {}", kind, f),
                }
            }
            prop_assert_eq!(p.observed(), valid);
        }
    }
}
