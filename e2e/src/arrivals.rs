//! When requests are sent: open loop (each at a planned time, whatever the server does)
//! or closed loop (a fixed number in flight).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
                // 1 - u lies in (0, 1], so the logarithm is finite.
                let u: f64 = rng.random();
                t += -(1.0 - u).ln() / rate * 1000.0;
            }
            t
        })
        .collect()
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
}
