//! The calibration file read from disk; decoding it is `dynamo_perfmodel::calibration`'s.

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
