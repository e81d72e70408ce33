//! Where "now" comes from. The engine reads the clock at the start of a step and
//! stamps the step's tokens at `start + duration`; it never sleeps itself.
//!
//! - [`SimClock`]: simulated time, moved forward by the engine by each step's duration
//!   (replays, tests, benchmarks: as fast as the CPU allows).
//! - [`RealClock`]: wall time; `advance_to` does nothing, and the caller (the HTTP
//!   server) sleeps until [`RealClock::deadline`] of the step's end before publishing
//!   its tokens and stepping again.

use std::time::{Duration, Instant};

pub trait Clock {
    /// Milliseconds since the clock's origin.
    fn now_ms(&self) -> f64;
    /// Called by the engine once a step of simulated work ends at `t_ms`.
    fn advance_to(&mut self, t_ms: f64);
}

#[derive(Clone, Debug, Default)]
pub struct SimClock {
    now_ms: f64,
}

impl SimClock {
    pub fn new(start_ms: f64) -> Self {
        Self { now_ms: start_ms }
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> f64 {
        self.now_ms
    }

    /// Never goes backwards.
    fn advance_to(&mut self, t_ms: f64) {
        if t_ms > self.now_ms {
            self.now_ms = t_ms;
        }
    }
}

/// How late a wake-up may be and still count as on time. Timers fire late (tokio's
/// have 1 ms granularity); without this, every back-to-back step would start at the
/// late wake-up and inter-token latency would grow by the timer's lag.
const WAKE_TOLERANCE_MS: f64 = 2.0;

#[derive(Clone, Debug)]
pub struct RealClock {
    origin: Instant,
    /// End of the last step: the next step of a busy engine starts here.
    last_step_end_ms: f64,
}

impl Default for RealClock {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_step_end_ms: f64::NEG_INFINITY,
        }
    }
}

impl RealClock {
    /// The instant `t_ms` after the origin: what the caller sleeps until.
    pub fn deadline(&self, t_ms: f64) -> Instant {
        self.origin + Duration::from_secs_f64(t_ms.max(0.0) / 1000.0)
    }

    /// Milliseconds from the origin to `at` (0 for an earlier instant).
    pub fn ms_at(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.origin).as_secs_f64() * 1000.0
    }
}

impl Clock for RealClock {
    /// Wall time, except just after a step ended: then the step's scheduled end, so
    /// back-to-back steps follow the timing model's timeline however late the caller
    /// woke (the lag delays delivery by at most the tolerance; it never accumulates).
    fn now_ms(&self) -> f64 {
        let wall = self.origin.elapsed().as_secs_f64() * 1000.0;
        if wall <= self.last_step_end_ms + WAKE_TOLERANCE_MS {
            self.last_step_end_ms
        } else {
            wall
        }
    }

    fn advance_to(&mut self, t_ms: f64) {
        self.last_step_end_ms = t_ms;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_clock_moves_only_forward() {
        let mut c = SimClock::new(5.0);
        c.advance_to(7.5);
        c.advance_to(6.0);
        assert_eq!(c.now_ms(), 7.5);
    }

    #[test]
    fn real_clock_keeps_back_to_back_steps_on_the_model_timeline() {
        let mut c = RealClock::default();
        // A step that ends in the future: time does not run past it early...
        let end = c.now_ms() + 50.0;
        c.advance_to(end);
        assert_eq!(c.now_ms(), end);
        // ...and a wake-up a little after a step's end counts as that end.
        let slightly_late = c.origin.elapsed().as_secs_f64() * 1000.0 - 0.5;
        c.advance_to(slightly_late);
        assert_eq!(c.now_ms(), slightly_late);
        // After a long idle, wall time again.
        c.advance_to(slightly_late - 10.0);
        assert!(c.now_ms() > slightly_late);
    }

    #[test]
    fn real_clock_deadline_is_origin_plus_offset() {
        let c = RealClock::default();
        assert_eq!(
            c.deadline(1500.0) - c.deadline(500.0),
            Duration::from_secs(1)
        );
        assert_eq!(c.ms_at(c.deadline(1500.0)), 1500.0);
    }
}
