//! The calibration file read from disk; decoding it is `dynamo_perfmodel::calibration`'s.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use dynamo_perfmodel::calibration::{Calibration, CalibrationError, MAX_FILE_BYTES, parse};

/// `path`'s text, refused past `limit` bytes.
fn read_bounded(path: &Path, limit: u64) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut text = String::new();
    file.take(limit + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > limit {
        return Err(format!("larger than {limit} bytes"));
    }
    Ok(text)
}

/// Reads the calibration file at `path`, and the files it names.
pub fn load(path: &Path) -> Result<Calibration, CalibrationError> {
    let text = read_bounded(path, MAX_FILE_BYTES)
        .map_err(|e| CalibrationError::invalid(path.display().to_string(), e))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    parse(&text, dir, &read_bounded)
}

/// Reads the calibration file at `key` of `files` (a ConfigMap's data, say), the files it
/// names being the keys of their paths.
pub fn from_map(
    files: &BTreeMap<String, String>,
    key: &str,
) -> Result<Calibration, CalibrationError> {
    let text = files
        .get(key)
        .ok_or_else(|| CalibrationError::invalid(key, "no such key"))?;
    let named = |path: &Path, limit: u64| {
        let text = files
            .get(&*path.to_string_lossy())
            .ok_or_else(|| "no such key".to_string())?;
        if text.len() as u64 > limit {
            return Err(format!("larger than {limit} bytes"));
        }
        Ok(text.clone())
    };
    parse(text, Path::new(""), &named)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calibration_in_a_map_reads_the_files_it_names_from_their_keys() {
        let export = r#"{"time_to_first_token": {"unit": "ms", "avg": 250.0},
            "inter_token_latency": {"unit": "ms", "avg": 12.5},
            "input_sequence_length": {"avg": 1000}, "output_sequence_length": {"avg": 100},
            "input_config": {"loadgen": {"concurrency": 4}}}"#;
        let file = "{gpu: H100_SXM, model: Qwen/Qwen3-8B, tp: 1, aiperf: [{path: c4.json}]}";
        let mut map: BTreeMap<String, String> = [
            ("calibration.yaml".to_string(), file.to_string()),
            ("c4.json".to_string(), export.to_string()),
        ]
        .into();
        let c = from_map(&map, "calibration.yaml").unwrap();
        let p = &c.measurements.points[0];
        assert_eq!((p.isl, p.osl, p.concurrency), (1000, 100, 4));
        assert_eq!((p.ttft_ms, p.itl_ms), (Some(250.0), Some(12.5)));

        let err = from_map(&map, "other.yaml").unwrap_err().to_string();
        assert_eq!(err, "other.yaml: no such key");
        map.remove("c4.json");
        let err = from_map(&map, "calibration.yaml").unwrap_err().to_string();
        assert!(
            err.starts_with("aiperf[0].path: c4.json: no such key"),
            "{err}"
        );
    }
}
