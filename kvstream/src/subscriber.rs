//! The picker's side of the stream: follows one pod's sidecar for as long as the caller
//! wants, and turns whatever happens on the wire (snapshots, events, gaps, restarts,
//! disconnects) into [`PodUpdate`]s that keep the caller's view of the pod exact or mark it
//! lost, never silently stale.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dynamo_kvblocks::Credential;
use dynamo_kvcache::{Continuity, KvEvent, KvEventEnvelope, StreamCursor};
use tonic::transport::Endpoint;

use crate::convert::{removed_from_pb, snapshot_from_pb, stored_from_pb};
use crate::pb;
use crate::pb::event_message::Body;
use crate::pb::kv_event_stream_client::KvEventStreamClient;

/// What the caller must do to its view of the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodUpdate {
    /// Forget everything known of the pod, then apply these stored chains.
    Snapshot(Vec<KvEvent>),
    /// Apply the pod's next event; the time the sidecar published it, when it says.
    Event(KvEvent, Option<SystemTime>),
    /// The stream is gone and the sidecar does not answer: the pod's blocks are unknown
    /// until the next `Snapshot`.
    Lost,
}

#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    /// First wait before reconnecting; doubles per failed attempt up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
    pub connect_timeout: Duration,
    /// The graph's credential, sent with every subscription: a sidecar given one serves
    /// its stream to holders only (`docs/sidecar.md`, "Security").
    pub credential: Option<Credential>,
}

impl Default for SubscriberConfig {
    fn default() -> Self {
        Self {
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            credential: None,
        }
    }
}

/// Why one subscription ended.
#[derive(Debug, thiserror::Error)]
enum Break {
    #[error("cannot connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("stream failed: {0}")]
    Stream(#[from] tonic::Status),
    #[error("stream ended")]
    Ended,
    #[error("events {expected}..{got} missing")]
    Gap { expected: u64, got: u64 },
    #[error("live event from a new instance without a snapshot")]
    UnannouncedRestart,
    #[error("invalid message: {0}")]
    Invalid(#[from] crate::InvalidMessage),
}

/// Follows the sidecar at `endpoint` (`http://ip:9100`) forever, calling `on_update` for
/// each change of the pod's view; run it in a task and abort the task to stop.
///
/// A broken stream is resumed where it stopped when the same sidecar answers again (the
/// sidecar replays the missed events or sends a snapshot); when it does not answer,
/// `Lost` is reported once and the next successful subscription starts from a snapshot.
pub async fn follow(
    endpoint: String,
    config: SubscriberConfig,
    mut on_update: impl FnMut(PodUpdate) + Send,
) {
    let mut cursor = StreamCursor::default();
    let mut lost = false;
    let mut retry = config.retry_min;
    loop {
        let mut delivered = false;
        let broke = subscribe_once(&endpoint, &config, &mut cursor, &mut |update| {
            delivered = true;
            on_update(update);
        })
        .await;
        if delivered {
            lost = false;
            retry = config.retry_min;
        }
        match &broke {
            Break::Connect(_) if !lost => {
                lost = true;
                cursor.reset();
                on_update(PodUpdate::Lost);
            }
            Break::Gap { .. } | Break::UnannouncedRestart | Break::Invalid(_) => {
                cursor.reset();
            }
            _ => {}
        }
        tracing::debug!(%endpoint, error = %broke, "kv event subscription broke");
        // Resume at once after a gap or a clean break; back off while nothing answers.
        if matches!(broke, Break::Connect(_)) {
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(config.retry_max);
        }
    }
}

async fn subscribe_once(
    endpoint: &str,
    config: &SubscriberConfig,
    cursor: &mut StreamCursor,
    on_update: &mut (impl FnMut(PodUpdate) + Send),
) -> Break {
    let channel = match Endpoint::from_shared(endpoint.to_owned()) {
        Ok(e) => e.connect_timeout(config.connect_timeout),
        Err(e) => return Break::Connect(e),
    };
    let channel = match channel.connect().await {
        Ok(c) => c,
        Err(e) => return Break::Connect(e),
    };
    let (instance_id, after_event_id) = cursor.last().unwrap_or((0, 0));
    let mut request = tonic::Request::new(pb::SubscribeRequest {
        instance_id,
        after_event_id,
    });
    if let Some(credential) = &config.credential {
        credential.attach(request.metadata_mut());
    }
    let mut stream = match KvEventStreamClient::new(channel).subscribe(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return Break::Stream(status),
    };
    loop {
        let message = match stream.message().await {
            Ok(Some(message)) => message,
            Ok(None) => return Break::Ended,
            Err(status) => return Break::Stream(status),
        };
        if let Err(broke) = receive(message, cursor, on_update) {
            return broke;
        }
    }
}

fn receive(
    message: pb::EventMessage,
    cursor: &mut StreamCursor,
    on_update: &mut impl FnMut(PodUpdate),
) -> Result<(), Break> {
    let event = match message.body.ok_or(crate::InvalidMessage::NoBody)? {
        Body::Snapshot(snapshot) => {
            let chains = snapshot_from_pb(snapshot)?;
            cursor.restart_at(message.instance_id, message.event_id);
            on_update(PodUpdate::Snapshot(chains));
            return Ok(());
        }
        Body::Stored(stored) => stored_from_pb(stored)?,
        Body::Removed(removed) => removed_from_pb(removed)?,
        Body::Cleared(_) => KvEvent::Cleared,
    };
    let envelope = KvEventEnvelope {
        instance_id: message.instance_id,
        event_id: message.event_id,
        event,
    };
    match cursor.advance(&envelope) {
        Continuity::Next => {
            let published = (message.published_unix_micros > 0)
                .then(|| UNIX_EPOCH + Duration::from_micros(message.published_unix_micros));
            on_update(PodUpdate::Event(envelope.event, published))
        }
        Continuity::Duplicate => {}
        Continuity::Gap { expected, got } => return Err(Break::Gap { expected, got }),
        Continuity::NewInstance => return Err(Break::UnannouncedRestart),
    }
    Ok(())
}
