//! How far the model's latencies have been below real engines' measurements: what a
//! prediction is worth without a calibration, and the headroom the DGDR profiler keeps
//! for it (`docs/perfmodel.md`, "Uncertainty").

/// Bounds on a real engine's latencies from the model's predictions: measured at most
/// `prefill` x the predicted TTFT plus `admission_steps` predicted ITLs, and `itl` x the
/// predicted ITL.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Uncertainty {
    /// Measured / predicted ITL, at most.
    pub itl: f64,
    /// Measured / predicted TTFT of a lone request (one prefill), at most.
    pub prefill: f64,
    /// What a loaded engine's TTFT adds beyond `prefill` x the predicted TTFT, in predicted
    /// ITLs: the simulated engine takes a new prompt into its next step, NIM's scheduler
    /// some steps later (60-140 ms more from 1 to 5 in flight at any prompt length).
    pub admission_steps: f64,
}

impl Uncertainty {
    /// Predictions taken as they are: the mock engine, which runs the model itself, or
    /// factors calibrated on the deployment's own measurements.
    pub const NONE: Self = Self {
        itl: 1.0,
        prefill: 1.0,
        admission_steps: 0.0,
    };

    /// The built-in factors' ([`crate::Efficiency::default`]), against every latency the
    /// model was compared with: NIM's Llama-3.3-70B on 2 x H100 at 1 to 150 in flight
    /// (`profiler/tests/calibrate.rs` recomputes each bound from them) and the published
    /// table of `tests/published.rs`. ITL at 150 in flight was 1.42x the prediction,
    /// a lone prompt's TTFT 1.15x, and TTFT under load up to 8.5 predicted ITLs more.
    pub const UNCALIBRATED: Self = Self {
        itl: 1.42,
        prefill: 1.15,
        admission_steps: 8.5,
    };

    /// The most a measured TTFT has been, for a predicted `ttft_ms` and `itl_ms`.
    pub fn ttft_ms(&self, ttft_ms: f64, itl_ms: f64) -> f64 {
        self.prefill * ttft_ms + self.admission_steps * itl_ms
    }

    /// The most a measured ITL has been, for a predicted `itl_ms`.
    pub fn itl_ms(&self, itl_ms: f64) -> f64 {
        self.itl * itl_ms
    }

    /// The most a measured end-to-end time has been, for a prediction of `ttft_ms` to the
    /// first token, `itl_ms` between tokens and `e2e_ms` in all.
    pub fn e2e_ms(&self, ttft_ms: f64, itl_ms: f64, e2e_ms: f64) -> f64 {
        self.ttft_ms(ttft_ms, itl_ms) + self.itl * (e2e_ms - ttft_ms).max(0.0)
    }

    pub fn is_none(&self) -> bool {
        *self == Self::NONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_leaves_a_prediction_as_it_is_and_the_bounds_grow_with_it() {
        let n = Uncertainty::NONE;
        assert_eq!((n.ttft_ms(200.0, 10.0), n.itl_ms(10.0)), (200.0, 10.0));
        assert_eq!(n.e2e_ms(200.0, 10.0, 1190.0), 1190.0);
        let u = Uncertainty::UNCALIBRATED;
        assert!(!u.is_none());
        assert_eq!(u.ttft_ms(200.0, 10.0), 1.15 * 200.0 + 8.5 * 10.0);
        assert_eq!(u.itl_ms(10.0), 1.42 * 10.0);
        // The first token's bound, then every later token's.
        assert_eq!(
            u.e2e_ms(200.0, 10.0, 1190.0),
            u.ttft_ms(200.0, 10.0) + 1.42 * 990.0
        );
    }
}
