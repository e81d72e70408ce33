//! Publishes the engine's KV events on a ZMQ PUB socket in vLLM's wire format
//! (`[topic, 8-byte big-endian sequence, msgpack batch]`, see
//! `dynamo_kvcache::vllm_events`), so a sidecar subscribes to the mock engine exactly as
//! to vLLM.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use dynamo_kvcache::vllm_events::{KvEvent, KvEventEncoder};
use tokio::sync::mpsc;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

/// A bound PUB socket; `endpoint` is the resolved address (a port 0 gets its real port).
pub struct KvPublisher {
    socket: PubSocket,
    pub endpoint: String,
    encoder: KvEventEncoder,
}

impl KvPublisher {
    pub async fn bind(endpoint: &str, topic: String) -> anyhow::Result<Self> {
        let mut socket = PubSocket::new();
        let bound = socket
            .bind(endpoint)
            .await
            .map_err(|e| anyhow::anyhow!("binding the KV event socket {endpoint}: {e}"))?;
        Ok(Self {
            socket,
            endpoint: bound.to_string(),
            encoder: KvEventEncoder::new(topic, None),
        })
    }

    /// Sends each batch as one message until the engine stops.
    pub async fn run(mut self, mut batches: mpsc::UnboundedReceiver<Vec<KvEvent>>) {
        while let Some(events) = batches.recv().await {
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let frames: Vec<Bytes> = self
                .encoder
                .encode(ts, events)
                .into_iter()
                .map(Bytes::from)
                .collect();
            let message = ZmqMessage::try_from(frames).expect("three frames are never empty");
            if let Err(e) = self.socket.send(message).await {
                tracing::warn!("KV event publish failed: {e}");
            }
        }
    }
}
