//! The sidecar's own Prometheus metrics (`dynamo_sidecar_*`), served on the metrics port.
//! The engine's `vllm:*` metrics are not here: `/metrics` on the proxy port reaches the
//! engine itself.

use std::fmt;
use std::sync::Arc;

use dynamo_kvstream::KvEventHub;
use dynamo_server::MessageStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// One label, e.g. `[("kind", "stored")]`.
pub type Label = [(&'static str, &'static str); 1];

pub struct Metrics {
    registry: Registry,
    /// Metrics named by another project's convention (Dynamo's `kvbm_*`).
    unprefixed: Registry,
    /// Proxied requests by the status class answered (`2xx` ... `5xx`).
    pub requests: Family<Label, Counter>,
    pub in_flight: Gauge,
    /// Engine KV events decoded, by `kind` (`stored`, `removed`, `cleared`).
    pub events_in: Family<Label, Counter>,
    /// Events published to subscribers, by `kind`.
    pub events_out: Family<Label, Counter>,
    /// ZMQ messages that were not a well-formed vLLM event batch.
    pub decode_errors: Counter,
    /// Well-formed engine events of a kind this sidecar does not know.
    pub unknown_kinds: Counter,
    /// Engine events (or blocks of a removal) left out of the stream, by `reason`.
    pub skipped: Family<Label, Counter>,
    /// Holes in the engine's message sequence, by `outcome` (`replayed`, `reset`).
    pub zmq_gaps: Family<Label, Counter>,
    /// The engine's sequence started over (it restarted); the pod's view was reset.
    pub engine_restarts: Counter,
    /// Seconds from the engine stamping a batch to its events being published.
    pub relay_lag: Histogram,
    /// 1 while the event subscription has a connected engine.
    pub relay_connected: Gauge,
    /// Engine ZMQ peers cut off for breaking the protocol or the size limits, by
    /// `reason` (`dynamo_zmtp::Error::violation`).
    pub zmq_violations: Family<Label, Counter>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix("dynamo_sidecar"),
            unprefixed: Registry::default(),
            requests: Family::default(),
            in_flight: Gauge::default(),
            events_in: Family::default(),
            events_out: Family::default(),
            decode_errors: Counter::default(),
            unknown_kinds: Counter::default(),
            skipped: Family::default(),
            zmq_gaps: Family::default(),
            engine_restarts: Counter::default(),
            // 100 µs to 26 s.
            relay_lag: Histogram::new(exponential_buckets(1e-4, 4.0, 10)),
            relay_connected: Gauge::default(),
            zmq_violations: Family::default(),
        };
        let r = &mut m.registry;
        r.register(
            "requests",
            "Proxied requests by answered status class",
            m.requests.clone(),
        );
        r.register(
            "requests_in_flight",
            "Proxied requests not yet finished",
            m.in_flight.clone(),
        );
        r.register(
            "engine_events",
            "Engine KV events decoded, by kind",
            m.events_in.clone(),
        );
        r.register(
            "published_events",
            "KV events published to subscribers, by kind",
            m.events_out.clone(),
        );
        r.register(
            "decode_errors",
            "Engine KV event messages that could not be decoded",
            m.decode_errors.clone(),
        );
        r.register(
            "unknown_event_kinds",
            "Engine KV events of unknown kinds, skipped",
            m.unknown_kinds.clone(),
        );
        r.register(
            "skipped",
            "Engine KV events (or removed blocks) left out of the stream, by reason",
            m.skipped.clone(),
        );
        r.register(
            "zmq_gaps",
            "Holes in the engine's KV event sequence, by outcome",
            m.zmq_gaps.clone(),
        );
        r.register(
            "engine_restarts",
            "Times the engine's KV event sequence started over",
            m.engine_restarts.clone(),
        );
        r.register(
            "relay_lag_seconds",
            "Seconds from the engine's batch timestamp to publishing its events",
            m.relay_lag.clone(),
        );
        r.register(
            "relay_connected",
            "1 while the KV event subscription is connected to the engine",
            m.relay_connected.clone(),
        );
        r.register(
            "kv_zmq_violations",
            "Engine ZMQ peers disconnected for breaking the protocol or the size limits, by reason",
            m.zmq_violations.clone(),
        );
        m
    }

    /// Adds the hub's own counters (subscribers, snapshots) to every scrape.
    pub fn watch_hub(&mut self, hub: KvEventHub) {
        self.registry
            .register_collector(Box::new(HubCollector(hub)));
    }

    /// `grpc_receiving_bytes` and `grpc_messages_refused_total{reason}`, read from
    /// `stats` at scrape time.
    pub fn watch_grpc_messages(&mut self, stats: Arc<MessageStats>) {
        self.registry
            .register_collector(Box::new(MessagesCollector(stats)));
    }

    /// Where metrics with their own prefix register (`dynamo_sidecar_` is added to
    /// anything registered with [`Metrics::registry`]).
    pub fn unprefixed(&mut self) -> &mut Registry {
        &mut self.unprefixed
    }

    pub fn registry(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        use prometheus_client::encoding::text;
        let mut out = String::new();
        text::encode_registry(&mut out, &self.registry)
            .and_then(|()| text::encode_registry(&mut out, &self.unprefixed))
            .and_then(|()| text::encode_eof(&mut out))
            .expect("writing to a String cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Metrics")
    }
}

/// Reads [`dynamo_kvstream::HubStats`] at scrape time.
#[derive(Debug)]
struct MessagesCollector(Arc<MessageStats>);

impl Collector for MessagesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let receiving =
            ConstGauge::new(i64::try_from(self.0.receiving_bytes()).unwrap_or(i64::MAX));
        receiving.encode(encoder.encode_descriptor(
            "grpc_receiving_bytes",
            "Declared bytes of the gRPC request messages being received",
            None,
            receiving.metric_type(),
        )?)?;
        let mut refused = encoder.encode_descriptor(
            "grpc_messages_refused",
            "gRPC calls failed for a request message too large, past its connection's bytes, or not whole in time, by reason",
            None,
            MetricType::Counter,
        )?;
        for (reason, n) in self.0.refused() {
            ConstCounter::new(n).encode(refused.encode_family(&[("reason", reason)])?)?;
        }
        Ok(())
    }
}

struct HubCollector(KvEventHub);

impl fmt::Debug for HubCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HubCollector")
    }
}

impl Collector for HubCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let s = self.0.stats();
        let gauges = [
            (
                "kv_subscribers",
                "Connected KV event subscribers",
                s.subscribers,
            ),
            ("kv_blocks", "Blocks in the pod's current view", s.blocks),
            (
                "kv_last_event_id",
                "Id of the last published KV event",
                s.last_event_id,
            ),
            (
                "kv_last_snapshot_blocks",
                "Blocks in the last snapshot sent",
                s.last_snapshot_blocks,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let counters = [
            (
                "kv_snapshots",
                "Snapshots sent to subscribers",
                s.snapshots_sent,
            ),
            (
                "kv_lagged_resyncs",
                "Subscribers resynced with a snapshot after falling behind",
                s.lagged_resyncs,
            ),
            (
                "kv_unindexed_blocks",
                "Stored blocks past the pod index's bound, missing from snapshots",
                s.unindexed_blocks,
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_kvcache::KvEvent;
    use dynamo_kvstream::HubConfig;

    #[test]
    fn names_carry_the_prefix_and_hub_stats_are_read_at_scrape_time() {
        let hub = KvEventHub::with_instance_id(HubConfig::default(), 3);
        let mut m = Metrics::new();
        m.watch_hub(hub.clone());
        m.watch_grpc_messages(Arc::default());
        m.requests.get_or_create(&[("status", "2xx")]).inc();
        m.skipped
            .get_or_create(&[("reason", "unknown_parent")])
            .inc();
        hub.publish(&KvEvent::Cleared);
        let text = m.encode();
        for line in [
            "dynamo_sidecar_requests_total{status=\"2xx\"} 1",
            "dynamo_sidecar_skipped_total{reason=\"unknown_parent\"} 1",
            "dynamo_sidecar_kv_last_event_id 1",
            "dynamo_sidecar_kv_snapshots_total 0",
            "dynamo_sidecar_relay_connected 0",
            "dynamo_sidecar_grpc_receiving_bytes 0",
            "dynamo_sidecar_grpc_messages_refused_total{reason=\"timeout\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
