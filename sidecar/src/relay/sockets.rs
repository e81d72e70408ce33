//! The engine's two ZMQ sockets as vLLM's `ZmqEventPublisher` offers them
//! (vllm-project/vllm `vllm/distributed/kv_events.py`): a PUB socket of
//! `[topic, seq, payload]` messages, and an optional ROUTER socket that replays buffered
//! messages from a requested sequence number. Both are spoken through `dynamo_zmtp`,
//! whose limits bound what the engine (or whatever holds its port) can make us hold.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use dynamo_zmtp::{Dealer, Endpoint, Event, Limits, Options, Sub};

use crate::metrics::Metrics;

/// Subscribes to every topic at `endpoint`, connecting (and reconnecting) in the
/// background, or with `listen` bound there for the engine's publisher to connect (vLLM
/// 0.33 connects its PUB to every endpoint but `tcp://*:PORT`). `connected` (and the
/// `relay_connected` gauge) follow the connection; a peer cut off for breaking the
/// protocol or the limits is counted by reason.
pub async fn subscribe(
    endpoint: Endpoint,
    listen: bool,
    limits: Limits,
    connected: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
) -> std::io::Result<Sub> {
    let monitor = move |event: &Event| {
        let up = match event {
            Event::Connected(_) => true,
            Event::Disconnected(_, error) => {
                if let Some(reason) = error.violation() {
                    metrics
                        .zmq_violations
                        .get_or_create(&[("reason", reason)])
                        .inc();
                }
                false
            }
        };
        connected.store(up, Ordering::Relaxed);
        metrics.relay_connected.set(i64::from(up));
    };
    let options = Options {
        limits,
        monitor: Some(Arc::new(monitor)),
    };
    // vLLM publishes on topic "" by default; a prefix of "" matches every topic.
    let every_topic = vec![Bytes::new()];
    if listen {
        Sub::listen(&endpoint, every_topic, options).await
    } else {
        Ok(Sub::connect(endpoint, every_topic, options))
    }
}

/// The sequence frame as vLLM writes it: 8 bytes, big-endian.
pub fn sequence(frame: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(frame.try_into().ok()?))
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("zmq: {0}")]
    Zmtp(#[from] dynamo_zmtp::Error),
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
    #[error("a reply is not [seq, payload]")]
    Malformed,
    #[error("the replay stops at {next}, short of {until}")]
    Incomplete { next: u64, until: u64 },
}

/// A client of the engine's replay socket. The protocol (`ZmqEventPublisher
/// ._service_replay`): the request is `[b"", start_seq (8-byte big-endian)]` (the empty
/// delimiter a REQ socket would add); the answer is one `[b"", seq, payload]` per buffered
/// message with `seq >= start_seq`, then `[b"", -1, b""]`.
#[derive(Clone, Debug)]
pub struct Replayer {
    endpoint: Endpoint,
    limits: Limits,
    timeout: Duration,
}

impl Replayer {
    pub fn new(endpoint: Endpoint, limits: Limits, timeout: Duration) -> Self {
        Self {
            endpoint,
            limits,
            timeout,
        }
    }

    /// Hands messages `from..until` to `apply` one by one as they arrive, in order, so
    /// a long gap never piles up here. An error (a hole, the end marker too early, a
    /// malformed reply, the time running out) may come after some were applied.
    pub async fn replay(
        &self,
        from: u64,
        until: u64,
        apply: impl FnMut(u64, &[u8]),
    ) -> Result<(), ReplayError> {
        let exchange = self.exchange(from, until, apply);
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or(Err(ReplayError::Timeout(self.timeout)))
    }

    /// One connection per replay: replays are rare, and dropping it afterwards means the
    /// rest of a long answer never mixes into the next one.
    async fn exchange(
        &self,
        from: u64,
        until: u64,
        mut apply: impl FnMut(u64, &[u8]),
    ) -> Result<(), ReplayError> {
        let mut socket = Dealer::connect(&self.endpoint, self.limits).await?;
        let request = [Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())];
        socket.send(&request).await?;
        let mut next = from;
        while next < until {
            let mut frames = socket.recv().await?;
            if frames.first().is_some_and(Bytes::is_empty) {
                frames.remove(0);
            }
            let [seq, payload] =
                <[Bytes; 2]>::try_from(frames).map_err(|_| ReplayError::Malformed)?;
            // Anything else is the end marker (-1) or a buffer that no longer holds
            // `next`.
            match sequence(&seq).ok_or(ReplayError::Malformed)? {
                seq if seq == next => apply(seq, &payload),
                _ => return Err(ReplayError::Incomplete { next, until }),
            }
            next += 1;
        }
        Ok(())
    }
}
