//! The operator's metrics, served (Prometheus text format) with `/healthz` on its HTTP
//! port by [`dynamo_server::metrics_endpoint`].

use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: &'static str,
    error: &'static str,
}

type HistogramFamily = Family<ControllerLabel, Histogram, fn() -> Histogram>;

/// Reconcile counts, durations and errors per controller (`dgd`, `dgdsa`), and leadership.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ControllerLabel, Counter>,
    errors: Family<ErrorLabels, Counter>,
    duration: HistogramFamily,
    leader: Gauge<i64, AtomicI64>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("dynamo_operator");
        let reconciles = Family::default();
        let errors = Family::default();
        // 1 ms .. ~33 s.
        let duration: HistogramFamily =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 16)));
        let leader = Gauge::default();
        registry.register(
            "reconciles",
            "Reconcile passes, by controller",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconcile passes that failed, by controller and error kind",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconcile pass, API writes included",
            duration.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease (or runs without leader election)",
            leader.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            duration,
            leader,
        }
    }
}

impl Metrics {
    /// Records one reconcile pass of `controller`.
    pub fn observe(&self, controller: &'static str, took: Duration, error: Option<&'static str>) {
        let label = ControllerLabel { controller };
        self.reconciles.get_or_create(&label).inc();
        self.duration
            .get_or_create(&label)
            .observe(took.as_secs_f64());
        if let Some(error) = error {
            self.errors
                .get_or_create(&ErrorLabels { controller, error })
                .inc();
        }
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
