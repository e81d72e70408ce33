//! Publishes the engine's KV events on a ZMQ PUB socket in vLLM's wire format
//! (`[topic, 8-byte big-endian sequence, msgpack batch]`, see
//! `dynamo_kvcache::vllm_events`), so a sidecar subscribes to the mock engine exactly as
//! to vLLM.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use dynamo_kvcache::vllm_events::{KvEvent, KvEventEncoder};
use dynamo_zmtp::{Endpoint, Options, Pub};
use tokio::sync::mpsc;

/// A bound PUB socket; `endpoint` is the resolved address (a port 0 gets its real port).
pub struct KvPublisher {
    socket: Pub,
    pub endpoint: String,
    encoder: KvEventEncoder,
}

impl KvPublisher {
    pub async fn bind(endpoint: &str, topic: String) -> anyhow::Result<Self> {
        let parsed: Endpoint = endpoint
            .parse()
            .with_context(|| format!("KV event endpoint {endpoint:?}"))?;
        let socket = Pub::bind(&parsed, Options::default())
            .await
            .with_context(|| format!("binding the KV event socket {endpoint}"))?;
        Ok(Self {
            endpoint: socket.endpoint().to_string(),
            socket,
            encoder: KvEventEncoder::new(topic, None),
        })
    }

    /// Sends each batch as one message until the engine stops. A subscriber too slow to
    /// take them misses messages, as with vLLM's PUB socket; its sequence shows the gap.
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
            self.socket.send(&frames);
        }
    }
}
