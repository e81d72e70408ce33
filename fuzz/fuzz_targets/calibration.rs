//! Raw bytes as a calibration file (`dynamo profile --calibrate`,
//! `dynamo_perfmodel::calibration::parse`) and the files it names: the input, when UTF-8,
//! is the file's text up to the first NUL, and what follows it is the text of every file
//! it names (aiperf exports, `model_config`); without a NUL, those cannot be read.
//! Nothing may panic; what parses keeps every bound (points, TP, ISL + OSL within the
//! context and in memory, concurrency, positive finite times, the factors' ranges), and
//! the file of factors a fit prints reads back the same.
#![no_main]

use std::path::Path;

use dynamo_perfmodel::calibration::{
    Calibration, CalibrationError, MAX_CONCURRENCY, MAX_POINTS, MAX_TP, OVERHEAD_BOUNDS_MS,
    SHARE_BOUNDS, parse,
};
use libfuzzer_sys::fuzz_target;

fn parse_with(text: &str, named: Option<&str>) -> Result<Calibration, CalibrationError> {
    let read = |_: &Path, limit: u64| match named {
        Some(t) if t.len() as u64 > limit => Err("too large".to_string()),
        Some(t) => Ok(t.to_string()),
        None => Err("no such file".to_string()),
    };
    parse(text, Path::new("/cal"), &read)
}

fn check(c: &Calibration) {
    let (file, m) = (&c.file, &c.measurements);
    let e = &m.estimator;
    assert_eq!(m.points.len(), file.points.len() + file.aiperf.len());
    assert!(m.points.len() <= MAX_POINTS);
    assert!(!m.points.is_empty() || file.efficiency.is_some());
    assert!((1..=MAX_TP).contains(&e.tp) && e.tp == file.tp);
    if let Some(given) = &file.efficiency {
        assert_eq!(&e.efficiency, given);
        let share = SHARE_BOUNDS.0..=SHARE_BOUNDS.1;
        for v in [given.compute, given.memory, given.tp_link, given.transfer] {
            assert!(share.contains(&v), "{given:?}");
        }
        assert!((OVERHEAD_BOUNDS_MS.0..=OVERHEAD_BOUNDS_MS.1).contains(&given.step_overhead_ms));
        assert!((0.0..=1.0).contains(&given.allreduce_latency_ms));
    }
    for p in &m.points {
        let tokens = u64::from(p.isl) + u64::from(p.osl);
        assert!(
            p.isl >= 1 && p.osl >= 2 && tokens <= e.model.max_context,
            "{p:?}"
        );
        assert!((1..=MAX_CONCURRENCY).contains(&p.concurrency), "{p:?}");
        assert!(p.ttft_ms.is_some() || p.itl_ms.is_some(), "{p:?}");
        for v in [p.ttft_ms, p.itl_ms].into_iter().flatten() {
            assert!(v.is_finite() && v > 0.0, "{p:?}");
        }
        assert!(e.fits(tokens, 1).is_ok(), "{p:?}");
    }
    for (p, entry) in m.points.iter().zip(&file.points) {
        assert_eq!(
            (p.isl, p.osl, p.concurrency, p.ttft_ms, p.itl_ms, p.held_out),
            (
                entry.isl,
                entry.osl,
                entry.concurrency,
                entry.ttft_ms,
                entry.itl_ms,
                entry.held_out
            )
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let (text, named) = match input.split_once('\0') {
        Some((text, named)) => (text, Some(named)),
        None => (input, None),
    };
    let Ok(c) = parse_with(text, named) else {
        return;
    };
    check(&c);
    // What `--calibrate` prints after a fit: the file with its factors and no points.
    let fed = c.with_efficiency(&c.measurements.estimator.efficiency);
    let yaml = serde_saphyr::to_string(&fed).expect("serializes");
    let back = parse_with(&yaml, named).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    assert_eq!(back.file, fed, "{yaml}");
    assert_eq!(
        back.measurements.estimator, c.measurements.estimator,
        "{yaml}"
    );
    assert!(back.measurements.points.is_empty());
});
