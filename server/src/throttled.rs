//! Warnings that may repeat at a high rate (one per dropped KV block, one per failed
//! write of a file the process rewrites every half second): logged at most once per
//! interval, each saying how many like it were not logged since, so a full disk shows as
//! a line every few seconds instead of thousands.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One kind of warning, throttled: keep it in a `static` beside the code that warns.
pub struct Throttled {
    every: Duration,
    /// When it was last logged, and how many were not logged since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttled {
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// Calls `log(skipped)` when this warning is due, `skipped` being how many were not
    /// logged since the last; otherwise counts this one.
    pub fn log(&self, log: impl FnOnce(u64)) {
        if let Some(skipped) = self.due(Instant::now()) {
            log(skipped);
        }
    }

    fn due(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (last, skipped) = &mut *state;
        if last.is_some_and(|at| now.duration_since(at) < self.every) {
            *skipped += 1;
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(skipped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_interval_with_the_count_of_the_rest() {
        let warning = Throttled::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(warning.due(start), Some(0));
        for i in 1..=999 {
            assert_eq!(warning.due(start + Duration::from_millis(i)), None);
        }
        assert_eq!(warning.due(start + Duration::from_secs(10)), Some(999));
        assert_eq!(warning.due(start + Duration::from_secs(11)), None);
        assert_eq!(warning.due(start + Duration::from_secs(25)), Some(1));
    }
}
