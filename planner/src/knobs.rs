//! The planner's headroom as flags: how full throughput mode sizes an engine and how long
//! a scale-down waits. One struct, flattened into `dynamo planner` and `dynamo-e2e planner`,
//! so the replay measures the same knobs, under the same names, that the service takes.

use std::time::Duration;

use dynamo_server::parse_duration;

use crate::decide::{DEFAULT_TARGET_UTILIZATION, valid_target_utilization};

#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct HeadroomKnobs {
    /// Throughput mode fills this share of an engine's profiled capacity (0 < u <= 1; 1 is
    /// Dynamo's formula).
    #[arg(long, env = "DYNAMO_PLANNER_TARGET_UTILIZATION", default_value_t = DEFAULT_TARGET_UTILIZATION)]
    pub target_utilization: f64,
    /// A role's replicas go down only to the most any decision within this window asked
    /// for (Kubernetes HPA's scale-down stabilization; 0s: at once).
    #[arg(long, env = "DYNAMO_PLANNER_SCALE_DOWN_WINDOW", default_value = "300s", value_parser = parse_duration)]
    pub scale_down_window: Duration,
}

impl HeadroomKnobs {
    /// The knobs' values, checked: a utilization outside (0, 1] is refused here, before
    /// any decision.
    pub fn check(&self) -> Result<(), String> {
        let u = self.target_utilization;
        if valid_target_utilization(u) {
            Ok(())
        } else {
            Err(format!(
                "--target-utilization must be above 0 and at most 1, not {u}"
            ))
        }
    }
}
