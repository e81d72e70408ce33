//! The planner's own metrics (`dynamo_planner_*`): what it saw, predicted and decided, so
//! a dashboard shows its decisions beside the traffic
//! (charts/dynamo-platform/files/monitoring/) and an advisory run can be read without
//! acting on it.

use std::sync::atomic::AtomicU64;

use dynamo_names::metrics::planner;
use dynamo_planner::decide::{Decision, Forecast, SlaTargets};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::cycle::Traffic;
use super::target::GraphView;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    service: String,
    role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

pub struct Metrics {
    registry: Registry,
    replicas: Family<ServiceLabels, Gauge>,
    desired: Family<ServiceLabels, Gauge>,
    decisions: Family<ReasonLabel, Counter>,
    writes: Family<ResultLabel, Counter>,
    capped: Gauge,
    predicted_requests: FloatGauge,
    predicted_isl: FloatGauge,
    predicted_osl: FloatGauge,
    observed_ttft: FloatGauge,
    observed_itl: FloatGauge,
}

impl Metrics {
    /// Registers every metric; the targets, mode and interval are constants of the run.
    pub fn new(targets: SlaTargets, advisory: bool, interval_s: f64) -> Self {
        let mut r = Registry::default();
        let m = Self {
            registry: Registry::default(),
            replicas: Family::default(),
            desired: Family::default(),
            decisions: Family::default(),
            writes: Family::default(),
            capped: Gauge::default(),
            predicted_requests: FloatGauge::default(),
            predicted_isl: FloatGauge::default(),
            predicted_osl: FloatGauge::default(),
            observed_ttft: FloatGauge::default(),
            observed_itl: FloatGauge::default(),
        };
        let constant = |r: &mut Registry, name: &str, help: &str, value: f64| {
            let g = FloatGauge::default();
            g.set(value);
            r.register(name, help, g);
        };
        constant(
            &mut r,
            planner::TARGET_TTFT,
            "The TTFT target the planner sizes for",
            targets.ttft_ms / 1000.0,
        );
        constant(
            &mut r,
            planner::TARGET_ITL,
            "The ITL target the planner sizes for",
            targets.itl_ms / 1000.0,
        );
        constant(
            &mut r,
            planner::INTERVAL,
            "Seconds between decisions",
            interval_s,
        );
        constant(
            &mut r,
            planner::ADVISORY,
            "1 when the planner only logs and exports its decisions, 0 when it applies them",
            f64::from(u8::from(advisory)),
        );
        r.register(
            planner::REPLICAS,
            "Replicas of each engine service as the planner last read them",
            m.replicas.clone(),
        );
        r.register(
            planner::DESIRED_REPLICAS,
            "Replicas the planner last decided for each engine service (applied unless advisory)",
            m.desired.clone(),
        );
        r.register(
            planner::DECISIONS,
            "Decisions, once per reason each gave (a hold names why it held)",
            m.decisions.clone(),
        );
        r.register(
            planner::SCALE_WRITES,
            "Replica writes, by result (ok, conflict, forbidden, not_found, error)",
            m.writes.clone(),
        );
        r.register(
            planner::CAPPED,
            "1 when the last decision wanted more than the GPU budget allows",
            m.capped.clone(),
        );
        r.register(
            planner::PREDICTED_REQUESTS,
            "Requests predicted for the next interval",
            m.predicted_requests.clone(),
        );
        r.register(
            planner::PREDICTED_ISL,
            "Mean input sequence length predicted for the next interval",
            m.predicted_isl.clone(),
        );
        r.register(
            planner::PREDICTED_OSL,
            "Mean output sequence length predicted for the next interval",
            m.predicted_osl.clone(),
        );
        r.register(
            planner::OBSERVED_TTFT,
            "Mean TTFT over the last interval, as read from Prometheus",
            m.observed_ttft.clone(),
        );
        r.register(
            planner::OBSERVED_ITL,
            "Mean ITL over the last interval, as read from Prometheus",
            m.observed_itl.clone(),
        );
        Self { registry: r, ..m }
    }

    /// Records one interval: the graph as read, what was observed and predicted, and the
    /// decision (its services' desired replicas and each of its reasons).
    pub fn record(
        &self,
        view: Option<&GraphView>,
        traffic: Option<&Traffic>,
        forecast: Option<&Forecast>,
        decision: &Decision,
    ) {
        if let Some(view) = view {
            for service in &view.services {
                let labels = ServiceLabels {
                    service: service.name.clone(),
                    role: service.role.as_str(),
                };
                self.replicas
                    .get_or_create(&labels)
                    .set(i64::from(service.replicas));
                if let Some(n) = decision.replicas.get(service.role) {
                    self.desired.get_or_create(&labels).set(i64::from(n));
                }
            }
        }
        for reason in &decision.reasons {
            self.decisions
                .get_or_create(&ReasonLabel {
                    reason: reason.label(),
                })
                .inc();
        }
        self.capped.set(i64::from(decision.capped));
        let set = |g: &FloatGauge, v: Option<f64>| {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                g.set(v);
            }
        };
        if let Some(f) = forecast {
            set(&self.predicted_requests, f.requests);
            set(&self.predicted_isl, f.isl);
            set(&self.predicted_osl, f.osl);
        }
        if let Some(t) = traffic {
            set(&self.observed_ttft, t.ttft_ms.map(|ms| ms / 1000.0));
            set(&self.observed_itl, t.itl_ms.map(|ms| ms / 1000.0));
        }
    }

    /// Counts one replica write by its result label.
    pub fn write(&self, result: &'static str) {
        self.writes.get_or_create(&ResultLabel { result }).inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
