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

#[derive(Clone, Debug)]
pub struct RealClock {
    origin: Instant,
}

impl Default for RealClock {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl RealClock {
    /// The instant `t_ms` after the origin: what the caller sleeps until.
    pub fn deadline(&self, t_ms: f64) -> Instant {
        self.origin + Duration::from_secs_f64(t_ms.max(0.0) / 1000.0)
    }
}

impl Clock for RealClock {
    fn now_ms(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * 1000.0
    }

    fn advance_to(&mut self, _t_ms: f64) {}
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
    fn real_clock_deadline_is_origin_plus_offset() {
        let c = RealClock::default();
        assert_eq!(
            c.deadline(1500.0) - c.deadline(500.0),
            Duration::from_secs(1)
        );
    }
}
