//! The calibration file (YAML or JSON, `docs/perfmodel.md`, "Calibration"): the
//! deployment measured, and its points, given inline or as aiperf exports
//! (`profile_export_aiperf.json`), decoded into [`Measurements`]. Sizes are bounded and
//! every value is checked; an error names the field at fault. No I/O: the caller reads
//! the file and gives a reader for the files it names. The profiler fits the factors to
//! the points (`dynamo_profiler::calibrate`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::{DoesNotFit, Dtype, Efficiency, Estimator, GpuSpec, ModelArch, catalog_names};

/// Largest calibration file read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Largest aiperf export or `config.json` read (an export with GPU telemetry runs to
/// megabytes).
pub const MAX_EXPORT_BYTES: u64 = 16 << 20;
/// Points, inline and aiperf together: each costs a few dozen simulations.
pub const MAX_POINTS: usize = 64;
/// Requests in flight of one point.
pub const MAX_CONCURRENCY: u32 = 1024;
pub const MAX_TP: u64 = 64;
/// Bounds of the factors a file gives and the fit keeps to: shares of the peak in
/// (0.05, 1], the step overhead in [0, 20] ms.
pub const SHARE_BOUNDS: (f64, f64) = (0.05, 1.0);
pub const OVERHEAD_BOUNDS_MS: (f64, f64) = (0.0, 20.0);

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Where it came from, for tables and errors (`points[3]`, an aiperf export's path).
    pub source: String,
    pub isl: u32,
    pub osl: u32,
    /// Requests in flight (a closed loop, as aiperf's `--concurrency` runs).
    pub concurrency: u32,
    /// Mean TTFT and ITL measured, ms; either may be left out (not measured, or not
    /// to be fitted).
    pub ttft_ms: Option<f64>,
    pub itl_ms: Option<f64>,
    /// Judged with the fit, not fitted.
    pub held_out: bool,
}

/// What a point measures; in files, by the field's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Metric {
    #[serde(rename = "ttft_ms")]
    Ttft,
    #[serde(rename = "itl_ms")]
    Itl,
}

impl Metric {
    /// Its place in `[ttft, itl]` pairs.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Measurements of one deployment: the GPU, model, TP and dtypes of `estimator`, whose
/// efficiency is where the fit starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurements {
    pub estimator: Estimator,
    pub points: Vec<Point>,
}

#[derive(Debug, Error)]
pub enum CalibrationError {
    /// Bad input, naming the field.
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("{source_name}: {error}")]
    DoesNotFit {
        source_name: String,
        error: Box<DoesNotFit>,
    },
}

impl CalibrationError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// The file as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationFile {
    /// A GPU SKU name (`H100_SXM`, ...).
    pub gpu: String,
    /// A catalog model name, or the name of the model `model_config` describes.
    pub model: String,
    /// A Hugging Face `config.json`, relative to this file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_config: Option<PathBuf>,
    pub tp: u64,
    /// Default: the checkpoint's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_dtype: Option<String>,
    /// Default: the model's dtype.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_dtype: Option<String>,
    /// Where the fit starts (the built-in factors by default); without points, the
    /// factors used as they are (what a fit prints, fed back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<Efficiency>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<PointEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aiperf: Vec<AiperfEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PointEntry {
    pub isl: u32,
    pub osl: u32,
    pub concurrency: u32,
    /// Mean TTFT and ITL, ms: at least one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itl_ms: Option<f64>,
    #[serde(default)]
    pub held_out: bool,
}

/// One aiperf run: its export, and what the export may not record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AiperfEntry {
    /// `profile_export_aiperf.json`, relative to this file.
    pub path: PathBuf,
    /// Default: the export's `input_config.loadgen.concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    #[serde(default)]
    pub statistic: Statistic,
    /// The measurements taken from the export (default both).
    #[serde(default = "both")]
    pub metrics: Vec<Metric>,
    #[serde(default)]
    pub held_out: bool,
}

fn both() -> Vec<Metric> {
    vec![Metric::Ttft, Metric::Itl]
}

/// Which of aiperf's statistics of TTFT and ITL is the measurement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Statistic {
    /// The mean, as the simulation predicts.
    #[default]
    Avg,
    P50,
}

impl Statistic {
    fn key(self) -> &'static str {
        match self {
            Self::Avg => "avg",
            Self::P50 => "p50",
        }
    }
}

/// A calibration file read: as written, and as measurements.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    pub file: CalibrationFile,
    pub measurements: Measurements,
}

impl Calibration {
    /// The file with `efficiency` and no points: fed back, the factors are used as
    /// they are.
    pub fn with_efficiency(&self, efficiency: &Efficiency) -> CalibrationFile {
        CalibrationFile {
            efficiency: Some(efficiency.clone()),
            points: Vec::new(),
            aiperf: Vec::new(),
            ..self.file.clone()
        }
    }
}

/// Parses a calibration file's `text`; the files it names are relative to `dir` and
/// read by `read` (path, byte limit).
pub fn parse(
    text: &str,
    dir: &Path,
    read: &dyn Fn(&Path, u64) -> Result<String, String>,
) -> Result<Calibration, CalibrationError> {
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(CalibrationError::invalid(
            "calibration file",
            format!("larger than {MAX_FILE_BYTES} bytes"),
        ));
    }
    let file: CalibrationFile = serde_saphyr::from_str(text)
        .map_err(|e| CalibrationError::invalid("calibration file", e.to_string()))?;
    let read_in = |field: &str, p: &Path| {
        read(&dir.join(p), MAX_EXPORT_BYTES)
            .map_err(|e| CalibrationError::invalid(field, format!("{}: {e}", p.display())))
    };
    let estimator = estimator(&file, &read_in)?;
    let count = file.points.len() + file.aiperf.len();
    if count > MAX_POINTS {
        return Err(CalibrationError::invalid(
            "points",
            format!("{count} points (inline and aiperf), more than {MAX_POINTS}"),
        ));
    }
    if count == 0 && file.efficiency.is_none() {
        return Err(CalibrationError::invalid(
            "points",
            "no points, aiperf exports or efficiency: give measurements to fit, or the \
             factors to use",
        ));
    }
    let mut points = Vec::with_capacity(count);
    for (i, p) in file.points.iter().enumerate() {
        let point = Point {
            source: format!("points[{i}]"),
            isl: p.isl,
            osl: p.osl,
            concurrency: p.concurrency,
            ttft_ms: p.ttft_ms,
            itl_ms: p.itl_ms,
            held_out: p.held_out,
        };
        check_point(&estimator, &point)?;
        points.push(point);
    }
    for (i, entry) in file.aiperf.iter().enumerate() {
        let source = format!("aiperf[{i}]");
        let text = read_in(&format!("{source}.path"), &entry.path)?;
        let point = aiperf_point(&source, entry, &text)?;
        check_point(&estimator, &point)?;
        points.push(point);
    }
    Ok(Calibration {
        measurements: Measurements { estimator, points },
        file,
    })
}

fn estimator(
    file: &CalibrationFile,
    read_in: &dyn Fn(&str, &Path) -> Result<String, CalibrationError>,
) -> Result<Estimator, CalibrationError> {
    let gpu =
        GpuSpec::by_name(&file.gpu).map_err(|e| CalibrationError::invalid("gpu", e.to_string()))?;
    let model = match &file.model_config {
        Some(path) => {
            let json = read_in("model_config", path)?;
            ModelArch::from_config_json(&file.model, &json).map_err(|e| {
                CalibrationError::invalid("model_config", format!("{}: {e}", path.display()))
            })?
        }
        None => ModelArch::by_name(&file.model).map_err(|_| {
            CalibrationError::invalid(
                "model",
                format!(
                    "{:?} is not in the built-in catalog: give model_config (its config.json), \
                     or name one of {}",
                    file.model,
                    catalog_names().join(", ")
                ),
            )
        })?,
    };
    if !(1..=MAX_TP).contains(&file.tp) {
        return Err(CalibrationError::invalid(
            "tp",
            format!("{}: must be 1 to {MAX_TP}", file.tp),
        ));
    }
    let mut e = Estimator::new(gpu, model, file.tp)
        .map_err(|err| CalibrationError::invalid("tp", err.to_string()))?;
    let dtype = |field: &str, s: &str| {
        s.parse::<Dtype>()
            .map_err(|err| CalibrationError::invalid(field, err.to_string()))
    };
    if let Some(d) = &file.weight_dtype {
        e = e.with_weight_dtype(dtype("weight_dtype", d)?);
    }
    if let Some(d) = &file.kv_dtype {
        e = e.with_kv_dtype(dtype("kv_dtype", d)?);
    }
    if let Some(eff) = &file.efficiency {
        check_efficiency(eff)?;
        e.efficiency = eff.clone();
    }
    Ok(e)
}

/// The factors within the bounds the fit keeps to.
fn check_efficiency(e: &Efficiency) -> Result<(), CalibrationError> {
    let (lo, hi) = SHARE_BOUNDS;
    let (olo, ohi) = OVERHEAD_BOUNDS_MS;
    let checks = [
        ("compute", e.compute, lo, hi),
        ("memory", e.memory, lo, hi),
        ("kv_memory", e.kv_memory, lo, hi),
        ("tp_link", e.tp_link, lo, hi),
        ("transfer", e.transfer, lo, hi),
        ("allreduce_latency_ms", e.allreduce_latency_ms, 0.0, 1.0),
        ("step_overhead_ms", e.step_overhead_ms, olo, ohi),
    ];
    for (name, v, lo, hi) in checks {
        if !(lo..=hi).contains(&v) {
            return Err(CalibrationError::invalid(
                format!("efficiency.{name}"),
                format!("{v}: must be within [{lo}, {hi}]"),
            ));
        }
    }
    Ok(())
}

fn check_point(e: &Estimator, p: &Point) -> Result<(), CalibrationError> {
    let field = |f: &str| format!("{}.{f}", p.source);
    if p.isl == 0 {
        return Err(CalibrationError::invalid(
            field("isl"),
            "must be at least 1",
        ));
    }
    if p.osl < 2 {
        return Err(CalibrationError::invalid(
            field("osl"),
            format!("{}: an ITL needs at least 2 output tokens", p.osl),
        ));
    }
    let tokens = u64::from(p.isl) + u64::from(p.osl);
    if tokens > e.model.max_context {
        return Err(CalibrationError::invalid(
            field("isl"),
            format!(
                "isl {} + osl {} is more than {}'s context of {} tokens",
                p.isl, p.osl, e.model.name, e.model.max_context
            ),
        ));
    }
    if !(1..=MAX_CONCURRENCY).contains(&p.concurrency) {
        return Err(CalibrationError::invalid(
            field("concurrency"),
            format!("{}: must be 1 to {MAX_CONCURRENCY}", p.concurrency),
        ));
    }
    if p.ttft_ms.is_none() && p.itl_ms.is_none() {
        return Err(CalibrationError::invalid(
            p.source.clone(),
            "neither ttft_ms nor itl_ms: give at least one",
        ));
    }
    for (name, v) in [("ttft_ms", p.ttft_ms), ("itl_ms", p.itl_ms)] {
        let Some(v) = v else { continue };
        if !(v.is_finite() && v > 0.0) {
            return Err(CalibrationError::invalid(
                field(name),
                format!("{v}: must be a number above 0"),
            ));
        }
    }
    e.fits(tokens, 1)
        .map_err(|error| CalibrationError::DoesNotFit {
            source_name: p.source.clone(),
            error: Box::new(error),
        })?;
    Ok(())
}

/// The point an aiperf export measured. Its metrics sit at the top level (as recent
/// aiperf writes them: its `docs/tutorials/working-with-profile-exports.md`) or under
/// `records` (earlier versions' `JsonExportData`, `aiperf/exporters/json_exporter.py`),
/// each `{unit, avg, p50, ...}`; the concurrency is the run's
/// `input_config.loadgen.concurrency` (ai-dynamo/aiperf).
fn aiperf_point(source: &str, entry: &AiperfEntry, text: &str) -> Result<Point, CalibrationError> {
    let field = |f: &str| format!("{source} ({}): {f}", entry.path.display());
    let root: Value = serde_json::from_str(text)
        .map_err(|e| CalibrationError::invalid(field("JSON"), e.to_string()))?;
    if !root.is_object() {
        return Err(CalibrationError::invalid(field("JSON"), "not an object"));
    }
    let records = root
        .get("records")
        .filter(|r| r.is_object())
        .unwrap_or(&root);
    let stat = |name: &str, key: &str| -> Result<(f64, Option<&str>), CalibrationError> {
        let m = records
            .get(name)
            .ok_or_else(|| CalibrationError::invalid(field(name), "missing"))?;
        let v = m
            .get(key)
            .and_then(Value::as_f64)
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| {
                CalibrationError::invalid(
                    field(&format!("{name}.{key}")),
                    "missing, or not a number above 0",
                )
            })?;
        Ok((v, m.get("unit").and_then(Value::as_str)))
    };
    let ms = |name: &str| -> Result<f64, CalibrationError> {
        let (v, unit) = stat(name, entry.statistic.key())?;
        let scale = match unit {
            Some("ms") => 1.0,
            Some("s" | "sec") => 1e3,
            Some("us") => 1e-3,
            Some("ns") => 1e-6,
            other => {
                return Err(CalibrationError::invalid(
                    field(&format!("{name}.unit")),
                    format!("{other:?}: expected ms, s, sec, us or ns"),
                ));
            }
        };
        Ok(v * scale)
    };
    let tokens = |name: &str| -> Result<u32, CalibrationError> {
        let (v, _) = stat(name, "avg")?;
        if v > f64::from(u32::MAX) {
            return Err(CalibrationError::invalid(
                field(&format!("{name}.avg")),
                "too large",
            ));
        }
        Ok(v.round() as u32)
    };
    let uses = |m: Metric| entry.metrics.contains(&m);
    let concurrency = match entry.concurrency {
        Some(c) => c,
        None => root
            .pointer("/input_config/loadgen/concurrency")
            .and_then(Value::as_u64)
            .and_then(|c| u32::try_from(c).ok())
            .ok_or_else(|| {
                CalibrationError::invalid(
                    field("input_config.loadgen.concurrency"),
                    "missing (the run was not a concurrency run, or the export omits its \
                     configuration): set concurrency on the entry",
                )
            })?,
    };
    Ok(Point {
        source: format!("{source} {}", entry.path.display()),
        isl: tokens("input_sequence_length")?,
        osl: tokens("output_sequence_length")?,
        concurrency,
        ttft_ms: uses(Metric::Ttft)
            .then(|| ms("time_to_first_token"))
            .transpose()?,
        itl_ms: uses(Metric::Itl)
            .then(|| ms("inter_token_latency"))
            .transpose()?,
        held_out: entry.held_out,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const GOOD: &str = "\
gpu: H100_SXM
model: nvidia/Llama-3.3-70B-Instruct-FP8
tp: 2
weight_dtype: fp8
kv_dtype: fp8
points:
  - {isl: 5000, osl: 500, concurrency: 1, ttft_ms: 406.77, itl_ms: 18.58}
  - {isl: 5000, osl: 500, concurrency: 5, ttft_ms: 546.7, itl_ms: 21.83, held_out: true}
aiperf:
  - {path: runs/c25.json, held_out: true}
";

    /// Recent aiperf's layout: metrics at the top level, the run's configuration beside.
    const EXPORT: &str = r#"{
  "time_to_first_token": {"unit": "ms", "avg": 688.69, "p50": 650.0},
  "inter_token_latency": {"unit": "sec", "avg": 0.03875, "p50": 0.0380},
  "input_sequence_length": {"unit": "tokens", "avg": 4999.6},
  "output_sequence_length": {"unit": "tokens", "avg": 500.0},
  "input_config": {"loadgen": {"concurrency": 25}}
}"#;

    fn files(extra: &[(&str, &str)]) -> HashMap<PathBuf, String> {
        [("runs/c25.json", EXPORT)]
            .into_iter()
            .chain(extra.iter().copied())
            .map(|(p, t)| (Path::new("/cal").join(p), t.to_string()))
            .collect()
    }

    fn parse_with(text: &str, files: &HashMap<PathBuf, String>) -> Result<Calibration, String> {
        let read = |p: &Path, limit: u64| match files.get(p) {
            Some(t) if t.len() as u64 > limit => Err("too large".to_string()),
            Some(t) => Ok(t.clone()),
            None => Err("no such file".to_string()),
        };
        parse(text, Path::new("/cal"), &read).map_err(|e| e.to_string())
    }

    #[test]
    fn a_file_of_points_and_aiperf_exports_reads_into_measurements() {
        let c = parse_with(GOOD, &files(&[])).unwrap();
        let m = &c.measurements;
        assert_eq!(m.estimator.tp, 2);
        assert_eq!(
            (m.estimator.weight_dtype, m.estimator.kv_dtype),
            (Dtype::Fp8, Dtype::Fp8)
        );
        assert_eq!(m.estimator.efficiency, Efficiency::default());
        assert_eq!(m.points.len(), 3);
        assert_eq!(m.points[0].source, "points[0]");
        assert!(!m.points[0].held_out && m.points[1].held_out);
        // The export: ISL rounded, the ITL from seconds, the concurrency from its config.
        let a = &m.points[2];
        assert_eq!(
            (a.isl, a.osl, a.concurrency, a.held_out),
            (5000, 500, 25, true)
        );
        assert_eq!(a.ttft_ms, Some(688.69));
        assert!((a.itl_ms.unwrap() - 38.75).abs() < 1e-9, "{a:?}");
        // The median, and an export of aiperf's earlier layout (metrics under `records`)
        // with the concurrency given on the entry.
        let nested = format!(
            r#"{{"records": {}}}"#,
            EXPORT.replace(
                r#""input_config": {"loadgen": {"concurrency": 25}}"#,
                r#""x": {}"#
            )
        );
        let text = "gpu: h100\nmodel: Qwen/Qwen3-8B\ntp: 1\naiperf:\n  - {path: old.json, \
                    concurrency: 7, statistic: p50}\n";
        let c = parse_with(text, &files(&[("old.json", &nested)])).unwrap();
        let p = &c.measurements.points[0];
        assert_eq!((p.concurrency, p.ttft_ms), (7, Some(650.0)));
        assert!((p.itl_ms.unwrap() - 38.0).abs() < 1e-9);
        // One metric only: the other is neither read nor fitted.
        let text = text.replace("statistic: p50", "metrics: [itl_ms]");
        let only_itl = nested.replace("time_to_first_token", "ttft_missing");
        let c = parse_with(&text, &files(&[("old.json", &only_itl)])).unwrap();
        assert_eq!(c.measurements.points[0].ttft_ms, None);
        // Factors alone: used as they are, and what a fit prints reads back the same.
        let fed = c.with_efficiency(&Efficiency {
            compute: 0.4,
            ..Efficiency::default()
        });
        let yaml = serde_saphyr::to_string(&fed).unwrap();
        let back = parse_with(&yaml, &files(&[])).unwrap();
        assert!(back.measurements.points.is_empty());
        assert_eq!(back.measurements.estimator.efficiency.compute, 0.4);
        assert_eq!(back.file, fed);
    }

    #[test]
    fn bad_input_is_refused_naming_the_field() {
        let with = |from: &str, to: &str| GOOD.replace(from, to);
        let cases = [
            ("gpu: [".to_string(), "calibration file"),
            (with("tp: 2", "tp: 2\ngpus: 4"), "gpus"),
            (with("tp: 2\n", ""), "tp"),
            (with("H100_SXM", "Z100"), "gpu"),
            (
                with("nvidia/Llama-3.3-70B-Instruct-FP8", "no/such"),
                "model",
            ),
            (with("tp: 2", "tp: 3"), "tp"),
            (with("tp: 2", "tp: 100000"), "tp"),
            (with("kv_dtype: fp8", "kv_dtype: int3"), "kv_dtype"),
            (
                with("osl: 500, concurrency: 1", "osl: 1, concurrency: 1"),
                "points[0].osl",
            ),
            (
                with(
                    "isl: 5000, osl: 500, concurrency: 1",
                    "isl: 0, osl: 500, concurrency: 1",
                ),
                "points[0].isl",
            ),
            (
                with(
                    "isl: 5000, osl: 500, concurrency: 1",
                    "isl: 200000, osl: 500, concurrency: 1",
                ),
                "points[0].isl",
            ),
            (
                with("concurrency: 1,", "concurrency: 0,"),
                "points[0].concurrency",
            ),
            (
                with("concurrency: 1,", "concurrency: 5000,"),
                "points[0].concurrency",
            ),
            (
                with("ttft_ms: 406.77", "ttft_ms: .nan"),
                "points[0].ttft_ms",
            ),
            (with("itl_ms: 18.58", "itl_ms: -1"), "points[0].itl_ms"),
            (with("itl_ms: 18.58", "itl_ms: fast"), "calibration file"),
            (
                with(", ttft_ms: 406.77, itl_ms: 18.58", ""),
                "neither ttft_ms nor itl_ms",
            ),
            (
                with("runs/c25.json", "runs/c25.json, metrics: []"),
                "aiperf[0]",
            ),
            (
                with("held_out: true}", "held_out: true, bogus: 1}"),
                "bogus",
            ),
            (
                with("tp: 2", "tp: 2\nefficiency: {compute: 1.5}"),
                "efficiency.compute",
            ),
            (with("tp: 2", "tp: 2\nefficiency: {speed: 1}"), "speed"),
            (with("runs/c25.json", "missing.json"), "aiperf[0].path"),
            (
                with("runs/c25.json", "runs/c25.json, statistic: p99"),
                "calibration file",
            ),
            (
                "gpu: h100\nmodel: Qwen/Qwen3-8B\ntp: 1\n".to_string(),
                "points",
            ),
        ];
        for (text, field) in cases {
            let err = parse_with(&text, &files(&[])).unwrap_err();
            assert!(err.contains(field), "{field:?} not in {err:?} for\n{text}");
        }
        // The 70B model in BF16 on one H100 does not fit.
        let err = parse_with(
            &with("tp: 2\nweight_dtype: fp8", "tp: 1\nweight_dtype: bf16"),
            &files(&[]),
        )
        .unwrap_err();
        assert!(
            err.contains("points[0]") && err.contains("does not fit"),
            "{err}"
        );
        // Too many points, too large a file.
        let many = format!(
            "gpu: h100\nmodel: Qwen/Qwen3-8B\ntp: 1\npoints:\n{}",
            "  - {isl: 100, osl: 10, concurrency: 1, ttft_ms: 1, itl_ms: 1}\n".repeat(65)
        );
        assert!(
            parse_with(&many, &files(&[]))
                .unwrap_err()
                .contains("more than 64")
        );
        let huge = format!("{GOOD}#{}\n", "x".repeat(MAX_FILE_BYTES as usize));
        assert!(
            parse_with(&huge, &files(&[]))
                .unwrap_err()
                .contains("larger than")
        );
    }

    #[test]
    fn bad_aiperf_exports_are_refused_naming_the_field() {
        let text = "gpu: h100\nmodel: Qwen/Qwen3-8B\ntp: 1\naiperf:\n  - {path: x.json}\n";
        let no_config = EXPORT.replace(
            r#""input_config": {"loadgen": {"concurrency": 25}}"#,
            r#""x": 1"#,
        );
        let cases = [
            ("{".to_string(), "JSON"),
            ("[1, 2]".to_string(), "not an object"),
            (no_config, "input_config.loadgen.concurrency"),
            (
                EXPORT.replace("\"unit\": \"sec\"", "\"unit\": \"minutes\""),
                "inter_token_latency.unit",
            ),
            (
                EXPORT.replace("\"unit\": \"ms\", ", ""),
                "time_to_first_token.unit",
            ),
            (EXPORT.replace("688.69", "-3"), "time_to_first_token.avg"),
            (
                EXPORT.replace("\"avg\": 500.0", "\"avg\": \"many\""),
                "output_sequence_length.avg",
            ),
            (
                EXPORT.replace("input_sequence_length", "isl"),
                "input_sequence_length",
            ),
            (
                EXPORT.replace("\"avg\": 500.0", "\"avg\": 1e300"),
                "output_sequence_length.avg",
            ),
            (
                EXPORT.replace("\"concurrency\": 25", "\"concurrency\": -25"),
                "concurrency",
            ),
        ];
        for (export, field) in cases {
            let err = parse_with(text, &files(&[("x.json", &export)])).unwrap_err();
            assert!(
                err.contains("aiperf[0]") && err.contains(field),
                "{field:?} not in {err:?}"
            );
        }
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse_with(text, &files(&[("x.json", &deep)])).is_err());
    }

    #[test]
    fn no_prefix_of_a_good_file_panics() {
        // Every cut of the calibration file and of the export parses or is refused.
        for cut in (0..=GOOD.len()).filter(|&i| GOOD.is_char_boundary(i)) {
            let _ = parse_with(&GOOD[..cut], &files(&[]));
        }
        for cut in 0..=EXPORT.len() {
            let _ = parse_with(GOOD, &files(&[("runs/c25.json", &EXPORT[..cut])]));
        }
        // Bytes flipped one at a time.
        let bytes = GOOD.as_bytes();
        for i in 0..bytes.len() {
            for b in [b'{', b'-', b':', b'\'', b'9', b'\n', b'&', b'*'] {
                let mut v = bytes.to_vec();
                v[i] = b;
                if let Ok(text) = String::from_utf8(v) {
                    let _ = parse_with(&text, &files(&[]));
                }
            }
        }
    }
}
