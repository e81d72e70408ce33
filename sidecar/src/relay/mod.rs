//! The KV event relay: subscribes to the engine's KV events (vLLM's ZMQ wire format),
//! turns them into our events (our block hashes, tiers) and publishes them into the
//! pod's [`KvEventHub`], which numbers them and serves them to the endpoint pickers.
//!
//! Nothing the engine sends can stop the relay: a peer that breaks ZMTP or the size
//! limits is cut off before it can make the sidecar hold more than the limits allow
//! (`dynamo_zmtp`), a message that does not decode is counted and skipped, and lost
//! messages are fetched again from the engine's replay socket when it has one, or else
//! the pod's view is reset (subscribers see `Cleared`) so it under-reports rather than
//! claims blocks that may be gone.

mod sequence;
pub(crate) mod sockets;
mod translate;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use dynamo_kvcache::KvEvent;
use dynamo_kvcache::vllm_events::{KvEvent as EngineEvent, decode_batch};
use dynamo_kvstream::KvEventHub;
use dynamo_zmtp::{Endpoint, Limits, Sub};

use crate::Config;
use crate::blocks::BlockStore;
use crate::metrics::Metrics;
use sequence::{Continuity, SequenceTracker};
use sockets::sequence;
pub use sockets::{ReplayError, Replayer};
pub use translate::{Skip, Translator};

/// How long the engine gets to answer a replay request before the view is reset instead.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);

/// What the engine's sockets may send (`--kv-events-max-message-bytes` and `-frames`).
/// A frame may be as large as a whole message: vLLM sends its batch as one frame.
pub fn limits(config: &Config) -> Limits {
    let bytes = usize::try_from(config.kv_events_max_message_bytes).unwrap_or(usize::MAX);
    Limits {
        max_frame_bytes: bytes,
        max_message_frames: usize::try_from(config.kv_events_max_message_frames)
            .unwrap_or(usize::MAX),
        max_message_bytes: bytes,
    }
}

/// Follows the engine's publisher on `socket` ([`sockets::subscribe`]) forever, relaying
/// every message through `relay`; the subscription reconnects by itself.
pub async fn run(mut relay: Relay, mut socket: Sub, replay: Option<Endpoint>, limits: Limits) {
    tracing::info!(
        model = relay.translator.model(),
        "relaying the engine's KV events"
    );
    relay.replayer = replay.map(|endpoint| Replayer::new(endpoint, limits, REPLAY_TIMEOUT));
    loop {
        let message = socket.recv().await;
        relay.handle(&message).await;
    }
}

/// The relay's state between messages.
pub struct Relay {
    hub: KvEventHub,
    metrics: Arc<Metrics>,
    translator: Translator,
    tracker: SequenceTracker,
    replayer: Option<Replayer>,
    /// The pod's block tiers, published again whenever the engine's events clear the
    /// pod's view (a `Cleared` drops every tier, and the sidecar's outlive the engine).
    store: Option<BlockStore>,
}

impl Relay {
    /// `model` salts our block hashes; `replayer` reaches the engine's replay socket, if
    /// it has one.
    pub fn new(
        model: String,
        replayer: Option<Replayer>,
        hub: KvEventHub,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            hub,
            metrics,
            translator: Translator::new(model),
            tracker: SequenceTracker::default(),
            replayer,
            store: None,
        }
    }

    pub fn with_store(mut self, store: Option<BlockStore>) -> Self {
        self.store = store;
        self
    }

    /// Handles one ZMQ message, `[topic, seq, payload]`.
    pub async fn handle(&mut self, frames: &[Bytes]) {
        let Some(seq) = frames
            .get(1)
            .and_then(|f| sequence(f))
            .filter(|_| frames.len() == 3)
        else {
            self.metrics.decode_errors.inc();
            tracing::debug!(frames = frames.len(), "not a KV event message");
            return;
        };
        let mut continuity = self.tracker.classify(seq);
        if continuity == Continuity::Restarted {
            tracing::info!(seq, "the engine's KV event sequence started over");
            self.metrics.engine_restarts.inc();
            self.reset();
            self.tracker.restart();
            continuity = self.tracker.classify(seq);
        }
        if let Continuity::Missed { from } = continuity {
            self.recover(from, seq).await;
        }
        self.apply(seq, &frames[2], true);
    }

    /// Replays messages `from..until`, or resets the view when they cannot all be had
    /// (subscribers may then see some replayed events just before `Cleared`).
    async fn recover(&mut self, from: u64, until: u64) {
        let replayed = match self.replayer.clone() {
            // Later messages come through the subscription as usual.
            Some(replayer) => replayer
                .replay(from, until, |seq, payload| self.apply(seq, payload, false))
                .await
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "KV event replay failed");
                    if let ReplayError::Zmtp(e) = e
                        && let Some(reason) = e.violation()
                    {
                        self.metrics
                            .zmq_violations
                            .get_or_create(&[("reason", reason)])
                            .inc();
                    }
                })
                .is_ok(),
            None => false,
        };
        let outcome = if replayed {
            "replayed"
        } else {
            self.reset();
            "reset"
        };
        tracing::info!(from, until, outcome, "KV event messages were lost");
        self.metrics
            .zmq_gaps
            .get_or_create(&[("outcome", outcome)])
            .inc();
    }

    /// Decodes and publishes one message's events; `live` ones also measure the lag.
    fn apply(&mut self, seq: u64, payload: &[u8], live: bool) {
        self.tracker.accept(seq);
        let decoded = match decode_batch(payload) {
            Ok(decoded) => decoded,
            Err(e) => {
                self.metrics.decode_errors.inc();
                tracing::debug!(seq, error = %e, "undecodable KV event batch skipped");
                return;
            }
        };
        let metrics = &self.metrics;
        metrics.unknown_kinds.inc_by(decoded.skipped_unknown as u64);
        for event in decoded.batch.events {
            metrics
                .events_in
                .get_or_create(&[("kind", engine_kind(&event))])
                .inc();
            let mut skip = |reason: Skip| {
                metrics
                    .skipped
                    .get_or_create(&[("reason", reason.as_str())])
                    .inc();
            };
            if let Some(ours) = self.translator.translate(event, &mut skip) {
                publish(&self.hub, metrics, &ours);
                if ours == KvEvent::Cleared {
                    self.republish_tiers();
                }
            }
        }
        if live {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            metrics.relay_lag.observe((now - decoded.batch.ts).max(0.0));
        }
    }

    /// Drops the pod's view: subscribers see `Cleared` (unless there was nothing to drop).
    fn reset(&mut self) {
        if !self.translator.is_empty() {
            self.translator.clear();
            publish(&self.hub, &self.metrics, &KvEvent::Cleared);
            self.republish_tiers();
        }
    }

    fn republish_tiers(&self) {
        if let Some(store) = &self.store {
            store.republish();
        }
    }
}

fn publish(hub: &KvEventHub, metrics: &Metrics, event: &KvEvent) {
    hub.publish(event);
    let kind = match event {
        KvEvent::Stored { .. } => "stored",
        KvEvent::Removed { .. } => "removed",
        KvEvent::Cleared => "cleared",
    };
    metrics.events_out.get_or_create(&[("kind", kind)]).inc();
}

fn engine_kind(event: &EngineEvent) -> &'static str {
    match event {
        EngineEvent::BlockStored { .. } => "stored",
        EngineEvent::BlockRemoved { .. } => "removed",
        EngineEvent::AllBlocksCleared => "cleared",
    }
}
