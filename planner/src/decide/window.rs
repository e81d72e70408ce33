//! The scale-down window: a role's replicas go down only to the most that any decision in
//! the last `window_s` asked for, as Kubernetes' HorizontalPodAutoscaler stabilises
//! scale-down (`behavior.scaleDown.stabilizationWindowSeconds`). Scale-ups pass at once.
//! It is throughput mode's: load mode moves one replica at a time and has its own
//! guard against a scale-down the load would undo (consolidation, `load.rs`).
//!
//! Why: an interval whose forecast dips asks for fewer replicas than the next needs again;
//! a replica removed then costs a pod start (and the breaches while it starts) when it
//! comes back, while one kept costs only its GPU time. A backlog is the opposite: it is
//! served once, so throughput mode's asks are recorded without it
//! ([`ScaleDownWindow::decide_throughput`]) and the replicas added to serve it go as soon
//! as it is served.

use std::collections::VecDeque;

use super::{Decision, Reason, Replicas, ThroughputConfig, ThroughputInputs, decide_throughput};

#[derive(Clone, Debug)]
pub struct ScaleDownWindow {
    window_s: f64,
    /// What each decision within the window asked for, oldest first.
    recent: VecDeque<(f64, Replicas)>,
}

impl ScaleDownWindow {
    /// A window of `window_s` seconds; 0 (or less) lets every scale-down through.
    pub fn new(window_s: f64) -> Self {
        Self {
            window_s: window_s.max(0.0),
            recent: VecDeque::new(),
        }
    }

    /// [`decide_throughput`] through the window, which records what the forecast alone
    /// asks for (no backlog, as if nothing were rolling out).
    pub fn decide_throughput(
        &mut self,
        now_s: f64,
        config: &ThroughputConfig<'_>,
        inputs: &ThroughputInputs,
    ) -> Decision {
        let d = decide_throughput(config, inputs);
        let steady = ThroughputInputs {
            backlog: 0.0,
            rolling_out: false,
            ..*inputs
        };
        let asked = decide_throughput(config, &steady).replicas;
        self.keep(now_s, d, asked)
    }

    /// Records `asked`, what decision `d` taken at `now_s` asks for, and lowers each role
    /// no further than the most asked for within the window (never below what `d` asked,
    /// and never above the current replicas). A hold is passed through and not recorded:
    /// it computed nothing.
    fn keep(&mut self, now_s: f64, mut d: Decision, asked: Replicas) -> Decision {
        if d.is_hold() {
            return d;
        }
        self.recent.push_back((now_s, asked));
        while let Some(&(t, _)) = self.recent.front() {
            if now_s - t < self.window_s {
                break;
            }
            self.recent.pop_front();
        }
        let kept = d.current.zip(&d.replicas, |role, current, wanted| {
            if wanted >= current {
                return wanted;
            }
            let most = self
                .recent
                .iter()
                .filter_map(|(_, r)| r.get(role))
                .max()
                .unwrap_or(wanted);
            let kept = most.clamp(wanted, current);
            if kept != wanted {
                d.reasons.push(Reason::ScaleDownWindow { role, wanted });
            }
            kept
        });
        if let Some(kept) = kept {
            d.replicas = kept;
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use dynamo_names::Role;

    use super::*;
    use crate::decide::PerRole;

    fn worker(n: u32) -> Replicas {
        PerRole::Aggregated { worker: n }
    }

    /// Records and applies `d`'s own ask, as [`ScaleDownWindow::decide_throughput`] does
    /// with the forecast's.
    fn keep(w: &mut ScaleDownWindow, now_s: f64, d: Decision) -> Decision {
        let asked = d.replicas;
        w.keep(now_s, d, asked)
    }

    fn asks(current: u32, wanted: u32) -> Decision {
        Decision {
            current: worker(current),
            replicas: worker(wanted),
            reasons: vec![Reason::Throughput {
                role: Role::Aggregated,
                wanted,
            }],
            capped: false,
            wanted: worker(wanted),
        }
    }

    #[test]
    fn a_scale_down_waits_until_the_higher_asks_leave_the_window() {
        let mut w = ScaleDownWindow::new(180.0);
        assert_eq!(
            keep(&mut w, 0.0, asks(2, 9)).replicas,
            worker(9),
            "up at once"
        );
        let d = keep(&mut w, 60.0, asks(9, 7));
        assert_eq!(d.replicas, worker(9), "9 was asked 60 s ago");
        assert!(d.reasons.contains(&Reason::ScaleDownWindow {
            role: Role::Aggregated,
            wanted: 7
        }));
        assert_eq!(keep(&mut w, 120.0, asks(9, 8)).replicas, worker(9));
        // At 180 s the ask for 9 is out; the most within the window is 8 (at 120 s).
        assert_eq!(keep(&mut w, 180.0, asks(9, 7)).replicas, worker(8));
        assert_eq!(keep(&mut w, 300.0, asks(8, 7)).replicas, worker(7));
    }

    #[test]
    fn the_window_never_raises_above_the_current_replicas_nor_keeps_holds() {
        let mut w = ScaleDownWindow::new(300.0);
        keep(&mut w, 0.0, asks(4, 12));
        // The budget or an operator brought the graph to 5 since: 12 is not restored.
        assert_eq!(keep(&mut w, 10.0, asks(5, 3)).replicas, worker(5));
        let held = Decision::hold(worker(5), Reason::RollingOut);
        assert_eq!(keep(&mut w, 20.0, held.clone()), held);
    }

    #[test]
    fn replicas_sized_for_a_backlog_go_once_it_is_served() {
        use crate::decide::{Forecast, Limits, Observed, SlaTargets};
        use crate::profile::tests::sample;
        let p = sample();
        let config = ThroughputConfig {
            targets: SlaTargets::default(),
            prefill_profile: &p,
            decode_profile: &p,
            gpus: PerRole::Aggregated { worker: 1 },
            correction: false,
            target_utilization: 1.0,
            limits: Limits {
                max_gpu_budget: 1000,
                ..Limits::default()
            },
        };
        // decide/tests.rs: 900 requests per 180 s are 3.85 engines' worth, 4 workers;
        // 900 more waiting double it, 8.
        let inputs = |current, backlog| ThroughputInputs {
            forecast: Forecast {
                requests: Some(900.0),
                isl: Some(3000.0),
                osl: Some(2000.0),
            },
            observed: Observed::default(),
            interval_s: 180.0,
            current: worker(current),
            rolling_out: false,
            backlog,
        };
        let mut w = ScaleDownWindow::new(600.0);
        let d = w.decide_throughput(0.0, &config, &inputs(4, 900.0));
        assert_eq!(d.replicas, worker(8));
        // Served: back to 4 at once, though 8 were asked for within the window.
        let d = w.decide_throughput(180.0, &config, &inputs(8, 0.0));
        assert_eq!(d.replicas, worker(4));
        // A forecast dip is held by the window: 4 were asked without a backlog.
        let mut dip = inputs(4, 0.0);
        dip.forecast.requests = Some(450.0);
        let d = w.decide_throughput(360.0, &config, &dip);
        assert_eq!(d.replicas, worker(4));
    }

    #[test]
    fn a_zero_window_lets_a_scale_down_through() {
        let mut w = ScaleDownWindow::new(0.0);
        keep(&mut w, 0.0, asks(2, 9));
        let d = keep(&mut w, 0.0, asks(9, 3));
        assert_eq!(d.replicas, worker(3));
        assert_eq!(d.reasons.len(), 1);
    }

    #[test]
    fn roles_are_kept_each_on_its_own_asks() {
        let mut w = ScaleDownWindow::new(100.0);
        let disagg = |p, d| PerRole::Disaggregated {
            prefill: p,
            decode: d,
        };
        let mut up = asks(1, 1);
        up.current = disagg(2, 2);
        up.replicas = disagg(4, 2);
        keep(&mut w, 0.0, up);
        let mut down = asks(1, 1);
        down.current = disagg(4, 3);
        down.replicas = disagg(2, 1);
        let d = keep(&mut w, 50.0, down);
        // Prefill asked 4 within the window; decode asked at most 2 there.
        assert_eq!(d.replicas, disagg(4, 2));
    }
}
