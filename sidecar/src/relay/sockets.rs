//! The engine's two ZMQ sockets as vLLM's `ZmqEventPublisher` offers them
//! (vllm-project/vllm `vllm/distributed/kv_events.py`): a PUB socket of
//! `[topic, seq, payload]` messages, and an optional ROUTER socket that replays buffered
//! messages from a requested sequence number.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use zeromq::{
    DealerSocket, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage,
};

use crate::metrics::Metrics;

/// Subscribes to every topic at `endpoint`, waiting for the engine to bind it. The socket
/// reconnects by itself when the engine goes away; `connected` (and the
/// `relay_connected` gauge) follow it.
pub async fn subscribe(
    endpoint: &str,
    connected: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
) -> zeromq::ZmqResult<SubSocket> {
    let mut options = SocketOptions::default();
    options.no_connect_timeout();
    let mut socket = SubSocket::with_options(options);
    let mut events = socket.monitor();
    tokio::spawn(async move {
        while let Some(event) = events.next().await {
            let up = match event {
                SocketEvent::Connected(..) => true,
                SocketEvent::Disconnected(_) => false,
                _ => continue,
            };
            connected.store(up, Ordering::Relaxed);
            metrics.relay_connected.set(i64::from(up));
        }
    });
    // vLLM publishes on topic "" by default; a prefix of "" matches every topic.
    socket.subscribe("").await?;
    socket.connect(endpoint).await?;
    Ok(socket)
}

/// The sequence frame as vLLM writes it: 8 bytes, big-endian.
pub fn sequence(frame: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(frame.try_into().ok()?))
}

/// vLLM's end-of-replay marker: sequence -1 as a signed 8-byte big-endian integer.
const END_OF_REPLAY: u64 = u64::MAX;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("zmq: {0}")]
    Zmq(#[from] zeromq::ZmqError),
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
    #[error("a reply is not [seq, payload]")]
    Malformed,
}

/// A client of the engine's replay socket. The protocol (`ZmqEventPublisher
/// ._service_replay`): the request is `[b"", start_seq (8-byte big-endian)]` (the empty
/// delimiter a REQ socket would add); the answer is one `[b"", seq, payload]` per buffered
/// message with `seq >= start_seq`, then `[b"", -1, b""]`.
pub struct Replayer {
    endpoint: String,
    timeout: Duration,
    /// Dropped after a failure, so a late answer never mixes into the next request.
    socket: Option<DealerSocket>,
}

impl Replayer {
    pub fn new(endpoint: impl Into<String>, timeout: Duration) -> Self {
        Self {
            endpoint: endpoint.into(),
            timeout,
            socket: None,
        }
    }

    /// The buffered messages from `start` on, as `(seq, payload)`, in the engine's order.
    pub async fn fetch(&mut self, start: u64) -> Result<Vec<(u64, Bytes)>, ReplayError> {
        let result = tokio::time::timeout(self.timeout, self.exchange(start)).await;
        let result = result.unwrap_or(Err(ReplayError::Timeout(self.timeout)));
        if result.is_err() {
            self.socket = None;
        }
        result
    }

    async fn exchange(&mut self, start: u64) -> Result<Vec<(u64, Bytes)>, ReplayError> {
        let socket = match &mut self.socket {
            Some(socket) => socket,
            None => {
                let mut socket = DealerSocket::new();
                socket.connect(&self.endpoint).await?;
                self.socket.insert(socket)
            }
        };
        let request = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&start.to_be_bytes()),
        ])
        .expect("two frames are not empty");
        socket.send(request).await?;
        let mut messages = Vec::new();
        loop {
            let mut frames = socket.recv().await?.into_vec();
            if frames.first().is_some_and(Bytes::is_empty) {
                frames.remove(0);
            }
            let [seq, payload] =
                <[Bytes; 2]>::try_from(frames).map_err(|_| ReplayError::Malformed)?;
            match sequence(&seq).ok_or(ReplayError::Malformed)? {
                END_OF_REPLAY => return Ok(messages),
                seq => messages.push((seq, payload)),
            }
        }
    }
}
