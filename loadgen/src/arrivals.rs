//! When requests are sent: open loop (each at a planned time, whatever the server does)
//! or closed loop (a fixed number in flight). An open loop's rate is constant, or a
//! [`RateSchedule`] of constant steps (a load that steps up and back down, for the
//! planner).

use std::fmt;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// The sending plan of a run.
#[derive(Clone, Debug, PartialEq)]
pub enum Arrivals {
    /// Request `i` is sent `times_ms[i]` after the start (non-decreasing).
    At(Vec<f64>),
    /// Each of this many clients sends its next request when its last one ends.
    Concurrency(usize),
}

/// `n` arrivals of a Poisson process of `rate` requests/s: exponential gaps, mean
/// `1/rate`, drawn by inversion from a generator seeded with `seed`. The first request
/// goes at 0.
pub fn poisson(n: usize, rate: f64, seed: u64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                t += exponential_gap_ms(&mut rng, rate);
            }
            t
        })
        .collect()
}

/// A gap between two arrivals of a Poisson process of `rate` requests/s, ms: exponential
/// with mean `1/rate`, drawn by inversion.
pub fn exponential_gap_ms(rng: &mut StdRng, rate: f64) -> f64 {
    // 1 - u lies in (0, 1], so the logarithm is finite.
    let u: f64 = rng.random();
    -(1.0 - u).ln() / rate * 1000.0
}

/// `n` arrivals evenly `1/rate` seconds apart.
pub fn fixed(n: usize, rate: f64) -> Vec<f64> {
    (0..n).map(|i| i as f64 * 1000.0 / rate).collect()
}

/// A trace's own times (ms from its first request) stretched by `time_scale`: 0.5 sends
/// the same requests in half the time.
pub fn scaled(times_ms: &[f64], time_scale: f64) -> Vec<f64> {
    times_ms.iter().map(|t| t * time_scale).collect()
}

/// One step of a [`RateSchedule`]: `rate` requests/s for `duration_s` seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RateStep {
    /// Requests per second; 0 is a pause.
    pub rate: f64,
    pub duration_s: f64,
}

/// A piecewise-constant request rate: its steps one after the other from time 0. Written
/// `RATExSECONDS,...`: `2x60,8x120,2x60` is 2 req/s for a minute, 8 for two minutes,
/// then 2 for one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RateSchedule {
    steps: Vec<RateStep>,
}

impl RateSchedule {
    /// Every rate finite and `>= 0` (0 is a pause), every duration finite and `> 0`, and
    /// some rate above 0 (a schedule sends something).
    pub fn new(steps: Vec<RateStep>) -> Result<Self, String> {
        if steps.is_empty() {
            return Err("a rate schedule needs at least one step".into());
        }
        for (i, s) in steps.iter().enumerate() {
            if !(s.rate.is_finite() && s.rate >= 0.0) {
                return Err(format!(
                    "step {}: the rate {} must be a number of requests/s >= 0",
                    i + 1,
                    s.rate
                ));
            }
            if !(s.duration_s.is_finite() && s.duration_s > 0.0) {
                return Err(format!(
                    "step {}: the duration {} must be a number of seconds > 0",
                    i + 1,
                    s.duration_s
                ));
            }
        }
        if steps.iter().all(|s| s.rate == 0.0) {
            return Err("every step of the rate schedule has rate 0: nothing would be sent".into());
        }
        Ok(Self { steps })
    }

    /// Parses `RATExSECONDS[,RATExSECONDS...]`, e.g. `2x60,8x120,2x60`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let shape = |part: &str, why: &str| {
            format!(
                "{part:?} in {s:?}: {why}; a rate schedule is RATExSECONDS steps, comma-separated (requests/s x seconds), e.g. 2x60,8x120,2x60"
            )
        };
        let mut steps = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (rate, duration) = part
                .split_once(['x', 'X'])
                .ok_or_else(|| shape(part, "no 'x' between the rate and the duration"))?;
            let number = |text: &str, what: &str| -> Result<f64, String> {
                let text = text.trim();
                if text.is_empty() {
                    return Err(shape(part, &format!("the {what} is missing")));
                }
                text.parse::<f64>()
                    .map_err(|_| shape(part, &format!("the {what} {text:?} is not a number")))
            };
            let step = RateStep {
                rate: number(rate, "rate")?,
                duration_s: number(duration, "duration")?,
            };
            if !(step.rate.is_finite() && step.rate >= 0.0) {
                return Err(shape(
                    part,
                    "the rate must be a finite number >= 0 (requests/s)",
                ));
            }
            if !(step.duration_s.is_finite() && step.duration_s > 0.0) {
                return Err(shape(
                    part,
                    "the duration must be a finite number > 0 (seconds)",
                ));
            }
            steps.push(step);
        }
        Self::new(steps)
    }

    pub fn steps(&self) -> &[RateStep] {
        &self.steps
    }

    /// Seconds from the first step's start to the last one's end.
    pub fn duration_s(&self) -> f64 {
        self.steps.iter().map(|s| s.duration_s).sum()
    }

    /// The highest rate of any step.
    pub fn peak_rate(&self) -> f64 {
        self.steps.iter().map(|s| s.rate).fold(0.0, f64::max)
    }

    /// The rate at `t_s` seconds from the start (0 outside the schedule).
    pub fn rate_at(&self, t_s: f64) -> f64 {
        let mut start = 0.0;
        for s in &self.steps {
            if t_s >= start && t_s < start + s.duration_s {
                return s.rate;
            }
            start += s.duration_s;
        }
        0.0
    }

    /// Requests the schedule sends on average: the sum of rate x duration.
    pub fn expected_requests(&self) -> f64 {
        self.steps.iter().map(|s| s.rate * s.duration_s).sum()
    }

    /// Each step with its start and end, in ms.
    fn spans_ms(&self) -> impl Iterator<Item = (f64, f64, f64)> + '_ {
        let mut start = 0.0;
        self.steps.iter().map(move |s| {
            let span = (start, start + s.duration_s * 1000.0, s.rate);
            start += s.duration_s * 1000.0;
            span
        })
    }
}

impl FromStr for RateSchedule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

impl fmt::Display for RateSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}x{}", s.rate, s.duration_s)?;
        }
        Ok(())
    }
}

/// Arrivals of a Poisson process whose rate follows `schedule`: within each step,
/// exponential gaps of mean `1/rate` from the step's start (the process is memoryless,
/// so restarting it at a step's start is exact), none past the step's end; a pause
/// sends nothing. One generator seeded with `seed` draws every step. Times in ms from
/// the schedule's start, increasing.
pub fn poisson_schedule(schedule: &RateSchedule, seed: u64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut times = Vec::with_capacity(schedule.expected_requests().ceil() as usize + 16);
    for (start, end, rate) in schedule.spans_ms() {
        if rate == 0.0 {
            continue;
        }
        let mut t = start;
        loop {
            t += exponential_gap_ms(&mut rng, rate);
            if t >= end {
                break;
            }
            times.push(t);
        }
    }
    times
}

/// Arrivals evenly `1/rate` apart within each step of `schedule`, the first at the step's
/// start.
pub fn fixed_schedule(schedule: &RateSchedule) -> Vec<f64> {
    let mut times = Vec::new();
    for (start, end, rate) in schedule.spans_ms() {
        if rate == 0.0 {
            continue;
        }
        let gap = 1000.0 / rate;
        times.extend(
            (0..)
                .map(|k| start + k as f64 * gap)
                .take_while(|&t| t < end),
        );
    }
    times
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_gaps_have_the_rate_and_the_seed_fixes_them() {
        let t = poisson(20_001, 50.0, 3);
        assert_eq!(t[0], 0.0);
        assert!(t.windows(2).all(|w| w[1] >= w[0]));
        // 20,000 gaps of mean 20 ms: the mean is within a few percent of it.
        let mean = t[20_000] / 20_000.0;
        assert!((mean - 20.0).abs() < 0.6, "{mean}");
        // Exponential: about e^-1 of the gaps exceed the mean.
        let long = t.windows(2).filter(|w| w[1] - w[0] > 20.0).count() as f64 / 20_000.0;
        assert!((long - (-1.0f64).exp()).abs() < 0.02, "{long}");
        assert_eq!(poisson(10, 50.0, 3), t[..10]);
        assert_ne!(poisson(10, 50.0, 4), t[..10]);
    }

    #[test]
    fn fixed_and_scaled_times() {
        assert_eq!(fixed(4, 4.0), [0.0, 250.0, 500.0, 750.0]);
        assert_eq!(scaled(&[0.0, 40.0, 100.0], 0.5), [0.0, 20.0, 50.0]);
    }

    #[test]
    fn a_schedule_parses_prints_and_answers_its_rate() {
        let s = RateSchedule::parse("2x60, 8x120,2X60").unwrap();
        assert_eq!(
            s.steps(),
            [
                RateStep {
                    rate: 2.0,
                    duration_s: 60.0
                },
                RateStep {
                    rate: 8.0,
                    duration_s: 120.0
                },
                RateStep {
                    rate: 2.0,
                    duration_s: 60.0
                },
            ]
        );
        assert_eq!(s.to_string(), "2x60,8x120,2x60");
        assert_eq!(
            "0.5x10".parse::<RateSchedule>().unwrap().to_string(),
            "0.5x10"
        );
        assert_eq!((s.duration_s(), s.peak_rate()), (240.0, 8.0));
        assert_eq!(s.expected_requests(), 120.0 + 960.0 + 120.0);
        assert_eq!(
            (s.rate_at(0.0), s.rate_at(60.0), s.rate_at(179.9)),
            (2.0, 8.0, 8.0)
        );
        assert_eq!((s.rate_at(180.0), s.rate_at(240.0)), (2.0, 0.0));
        // A pause between two steps is a step of rate 0.
        assert!(RateSchedule::parse("4x10,0x5,4x10").is_ok());
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        for (bad, says) in [
            ("2x", "the duration is missing"),
            ("x60", "the rate is missing"),
            ("-1x5", "the rate must be a finite number >= 0"),
            ("0x0", "the duration must be a finite number > 0"),
            ("2x-3", "the duration must be a finite number > 0"),
            ("2", "no 'x'"),
            ("2x60,", "no 'x'"),
            ("twox60", "is not a number"),
            ("2x60,8xten", "is not a number"),
            ("infx60", "the rate must be a finite number"),
            ("0x60", "nothing would be sent"),
            ("", "no 'x'"),
        ] {
            let err = RateSchedule::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        assert!(RateSchedule::new(vec![]).is_err());
    }

    #[test]
    fn schedule_arrivals_follow_each_step_and_the_seed_fixes_them() {
        let s = RateSchedule::parse("20x100,80x100,0x50,20x100").unwrap();
        let t = poisson_schedule(&s, 7);
        assert!(t.windows(2).all(|w| w[1] > w[0]));
        assert!(t.iter().all(|&x| (0.0..350_000.0).contains(&x)));
        // Requests per step: Poisson with mean 2,000 / 8,000 / 0 / 2,000, standard
        // deviations 45 and 89: within 5 of them.
        let count = |a: f64, b: f64| {
            t.iter()
                .filter(|&&x| x >= a * 1000.0 && x < b * 1000.0)
                .count() as f64
        };
        for (a, b, mean) in [
            (0.0, 100.0, 2000.0),
            (100.0, 200.0, 8000.0),
            (250.0, 350.0, 2000.0),
        ] {
            let n = count(a, b);
            assert!(
                (n - mean).abs() < 5.0 * mean.sqrt(),
                "{a}..{b}: {n} vs {mean}"
            );
        }
        assert_eq!(count(200.0, 250.0), 0.0, "the pause sends nothing");
        // Within a step the gaps are exponential: about e^-1 exceed the mean (12.5 ms).
        let step2: Vec<f64> = t
            .iter()
            .copied()
            .filter(|&x| (100_000.0..200_000.0).contains(&x))
            .collect();
        let long = step2.windows(2).filter(|w| w[1] - w[0] > 12.5).count() as f64
            / (step2.len() - 1) as f64;
        assert!((long - (-1.0f64).exp()).abs() < 0.03, "{long}");
        assert_eq!(poisson_schedule(&s, 7), t);
        assert_ne!(poisson_schedule(&s, 8), t);
    }

    #[test]
    fn fixed_schedule_arrivals_are_evenly_spaced_per_step() {
        let s = RateSchedule::parse("2x2,4x1").unwrap();
        assert_eq!(
            fixed_schedule(&s),
            [0.0, 500.0, 1000.0, 1500.0, 2000.0, 2250.0, 2500.0, 2750.0]
        );
    }
}
