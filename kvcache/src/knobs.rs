//! The router's cost knobs as command-line flags (feature `cli`), under one set of names
//! and variables for the picker and the replays (`dynamo-e2e replay`), so what a replay
//! measured is set the same way live. Names follow Dynamo's frontend
//! (`--router-temperature`; its other names are aliases, from
//! `components/src/dynamo/common/configuration/groups/kv_router_args.py`).

use std::time::Duration;

use dynamo_server::parse_duration;

use crate::{ApproxConfig, DEFAULT_PREFILL_LOAD_SCALE, SchedulerConfig};

#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct RouterKnobs {
    /// 0 picks the cheapest pod; above 0 samples a softmax over costs.
    #[arg(long, env = "DYNAMO_EPP_ROUTER_TEMPERATURE", default_value_t = 0.0)]
    pub router_temperature: f64,
    /// Weight of prefill work (uncached prompt blocks) against decode load.
    #[arg(
        long,
        // Dynamo's current, deprecated and older names of this weight.
        aliases = ["prefill-load-scale", "router-prefill-load-scale", "router-kv-overlap-score-weight", "kv-overlap-score-weight"],
        env = "DYNAMO_EPP_OVERLAP_SCORE_WEIGHT",
        default_value_t = DEFAULT_PREFILL_LOAD_SCALE
    )]
    pub overlap_score_weight: f64,
    /// approx mode: how long a routed prompt is believed cached on its pod.
    #[arg(long, alias = "router-ttl-secs", env = "DYNAMO_EPP_APPROX_TTL", default_value = "120s", value_parser = parse_duration)]
    pub approx_ttl: Duration,
}

impl Default for RouterKnobs {
    /// The flags' defaults.
    fn default() -> Self {
        Self {
            router_temperature: 0.0,
            overlap_score_weight: DEFAULT_PREFILL_LOAD_SCALE,
            approx_ttl: ApproxConfig::default().ttl,
        }
    }
}

impl RouterKnobs {
    /// The scheduler these knobs set (its other settings at their defaults).
    pub fn scheduler(&self) -> SchedulerConfig {
        SchedulerConfig {
            prefill_load_scale: self.overlap_score_weight,
            temperature: self.router_temperature,
            ..SchedulerConfig::default()
        }
    }

    /// The approximate index these knobs set.
    pub fn approx(&self) -> ApproxConfig {
        ApproxConfig {
            ttl: self.approx_ttl,
            ..ApproxConfig::default()
        }
    }

    /// The message names the flag out of range.
    pub fn check(&self) -> Result<(), String> {
        let non_negative = |v: f64| v.is_finite() && v >= 0.0;
        if !non_negative(self.router_temperature) {
            return Err(format!(
                "--router-temperature must be >= 0, got {}",
                self.router_temperature
            ));
        }
        if !non_negative(self.overlap_score_weight) {
            return Err(format!(
                "--overlap-score-weight must be >= 0, got {}",
                self.overlap_score_weight
            ));
        }
        Ok(())
    }
}
