//! The sidecar's side of the stream: numbers the pod's events, keeps the pod's current
//! block set for snapshots and a window of recent events for resuming subscribers, and
//! fans events out to every subscriber.
//!
//! Back-pressure is explicit: each subscriber has a bounded queue; one that falls more
//! than [`HubConfig::live_buffer`] events behind is not allowed to slow the others down,
//! it is sent a fresh snapshot instead of the events it missed.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use dynamo_kvcache::{IndexError, KvEvent, KvIndex, WorkerId};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::convert::{event_to_body, stored_to_pb};
use crate::pb;
use crate::pb::event_message::Body;
use crate::pb::kv_event_stream_server::{KvEventStream, KvEventStreamServer};

/// The pod itself, as the one worker of the hub's own index.
const POD: WorkerId = WorkerId(0);

#[derive(Clone, Debug)]
pub struct HubConfig {
    /// Recent events kept so that a subscriber that reconnects resumes without a snapshot.
    pub retain: usize,
    /// Events a subscriber may fall behind the live stream before it is resynced.
    pub live_buffer: usize,
    /// Bound on the pod's own block index (distinct blocks).
    pub max_blocks: usize,
}

impl Default for HubConfig {
    fn default() -> Self {
        Self {
            retain: 65_536,
            live_buffer: 4_096,
            max_blocks: 10_000_000,
        }
    }
}

/// Counters for the sidecar's `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HubStats {
    pub instance_id: u64,
    pub last_event_id: u64,
    pub blocks: u64,
    pub subscribers: u64,
    pub snapshots_sent: u64,
    pub last_snapshot_blocks: u64,
    pub lagged_resyncs: u64,
    pub unindexed_blocks: u64,
}

#[derive(Default)]
struct Counters {
    subscribers: AtomicU64,
    snapshots_sent: AtomicU64,
    last_snapshot_blocks: AtomicU64,
    lagged_resyncs: AtomicU64,
    unindexed_blocks: AtomicU64,
}

struct State {
    view: KvIndex,
    last_event_id: u64,
    retained: VecDeque<Arc<pb::EventMessage>>,
}

struct Inner {
    instance_id: u64,
    config: HubConfig,
    state: Mutex<State>,
    live: broadcast::Sender<Arc<pb::EventMessage>>,
    counters: Counters,
}

/// One pod's event log. Cheap to clone; every clone is the same hub.
#[derive(Clone)]
pub struct KvEventHub {
    inner: Arc<Inner>,
}

impl KvEventHub {
    /// A hub with a fresh `instance_id`, so that subscribers of an earlier start of this
    /// sidecar notice the restart.
    pub fn new(config: HubConfig) -> Self {
        Self::with_instance_id(config, fresh_instance_id())
    }

    pub fn with_instance_id(config: HubConfig, instance_id: u64) -> Self {
        let (live, _) = broadcast::channel(config.live_buffer.max(1));
        let state = State {
            view: KvIndex::new(config.max_blocks),
            last_event_id: 0,
            retained: VecDeque::new(),
        };
        Self {
            inner: Arc::new(Inner {
                instance_id,
                config,
                state: Mutex::new(state),
                live,
                counters: Counters::default(),
            }),
        }
    }

    pub fn instance_id(&self) -> u64 {
        self.inner.instance_id
    }

    /// Numbers `event`, applies it to the pod's block set and sends it to every
    /// subscriber; returns its `event_id`. Past [`HubConfig::max_blocks`] the event is
    /// still sent (live subscribers index what they can) but later snapshots lack the
    /// blocks that did not fit; [`HubStats::unindexed_blocks`] counts them.
    pub fn publish(&self, event: &KvEvent) -> u64 {
        let mut state = self.state();
        if let Err(IndexError::Full { dropped, .. }) = state.view.apply(POD, event) {
            self.inner
                .counters
                .unindexed_blocks
                .fetch_add(dropped as u64, Ordering::Relaxed);
        }
        state.last_event_id += 1;
        let message = Arc::new(pb::EventMessage {
            instance_id: self.inner.instance_id,
            event_id: state.last_event_id,
            body: Some(event_to_body(event)),
            published_unix_micros: unix_micros_now(),
        });
        state.retained.push_back(message.clone());
        if state.retained.len() > self.inner.config.retain {
            state.retained.pop_front();
        }
        // No receiver is fine: nobody subscribes yet.
        let _ = self.inner.live.send(message);
        state.last_event_id
    }

    /// The pod's whole block set, as the snapshot message a new subscriber gets first.
    pub fn snapshot(&self) -> pb::EventMessage {
        self.snapshot_locked(&self.state())
    }

    pub fn stats(&self) -> HubStats {
        let (last_event_id, blocks) = {
            let state = self.state();
            (state.last_event_id, state.view.worker_blocks(POD) as u64)
        };
        let c = &self.inner.counters;
        HubStats {
            instance_id: self.inner.instance_id,
            last_event_id,
            blocks,
            subscribers: c.subscribers.load(Ordering::Relaxed),
            snapshots_sent: c.snapshots_sent.load(Ordering::Relaxed),
            last_snapshot_blocks: c.last_snapshot_blocks.load(Ordering::Relaxed),
            lagged_resyncs: c.lagged_resyncs.load(Ordering::Relaxed),
            unindexed_blocks: c.unindexed_blocks.load(Ordering::Relaxed),
        }
    }

    /// The gRPC service to mount on the sidecar's server.
    pub fn service(&self) -> KvEventStreamServer<Self> {
        KvEventStreamServer::new(self.clone())
    }

    /// Starts a subscription: what the subscriber must see first (the events it missed,
    /// or a snapshot) and the live feed from right after it, taken under one lock so no
    /// event falls between them.
    fn open(
        &self,
        request: &pb::SubscribeRequest,
    ) -> (
        Vec<Arc<pb::EventMessage>>,
        broadcast::Receiver<Arc<pb::EventMessage>>,
    ) {
        let state = self.state();
        let first = match self.missed_events(&state, request) {
            Some(missed) => missed,
            None => vec![Arc::new(self.snapshot_locked(&state))],
        };
        (first, self.inner.live.subscribe())
    }

    /// The retained events after the subscriber's last one, if it resumes this instance
    /// inside the retained window.
    fn missed_events(
        &self,
        state: &State,
        request: &pb::SubscribeRequest,
    ) -> Option<Vec<Arc<pb::EventMessage>>> {
        if request.instance_id != self.inner.instance_id
            || request.after_event_id > state.last_event_id
        {
            return None;
        }
        let oldest = state
            .retained
            .front()
            .map_or(state.last_event_id + 1, |m| m.event_id);
        if request.after_event_id + 1 < oldest {
            return None;
        }
        let skip = (request.after_event_id + 1 - oldest) as usize;
        Some(state.retained.iter().skip(skip).cloned().collect())
    }

    fn snapshot_locked(&self, state: &State) -> pb::EventMessage {
        let chains: Vec<pb::Stored> = state
            .view
            .snapshot(POD)
            .iter()
            .filter_map(|event| match event {
                KvEvent::Stored { parent, blocks } => Some(stored_to_pb(*parent, blocks)),
                KvEvent::Removed { .. } | KvEvent::Cleared => None,
            })
            .collect();
        let c = &self.inner.counters;
        c.snapshots_sent.fetch_add(1, Ordering::Relaxed);
        c.last_snapshot_blocks.store(
            chains.iter().map(|s| s.blocks.len() as u64).sum(),
            Ordering::Relaxed,
        );
        pb::EventMessage {
            instance_id: self.inner.instance_id,
            event_id: state.last_event_id,
            body: Some(Body::Snapshot(pb::Snapshot { chains })),
            published_unix_micros: unix_micros_now(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves no half-applied state worth refusing.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Feeds one subscriber until it hangs up or the hub goes away.
    async fn forward(
        self,
        first: Vec<Arc<pb::EventMessage>>,
        mut live: broadcast::Receiver<Arc<pb::EventMessage>>,
        out: mpsc::Sender<Result<pb::EventMessage, Status>>,
    ) {
        let _gauge = SubscriberGauge::new(&self.inner.counters.subscribers);
        for message in first {
            if out.send(Ok((*message).clone())).await.is_err() {
                return;
            }
        }
        loop {
            let message = match live.recv().await {
                Ok(message) => (*message).clone(),
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.inner
                        .counters
                        .lagged_resyncs
                        .fetch_add(1, Ordering::Relaxed);
                    let state = self.state();
                    live = self.inner.live.subscribe();
                    self.snapshot_locked(&state)
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if out.send(Ok(message)).await.is_err() {
                return;
            }
        }
    }
}

struct SubscriberGauge<'a>(&'a AtomicU64);

impl<'a> SubscriberGauge<'a> {
    fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl Drop for SubscriberGauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::EventMessage, Status>> + Send>>;

#[tonic::async_trait]
impl KvEventStream for KvEventHub {
    type SubscribeStream = EventStream;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let (first, live) = self.open(request.get_ref());
        // A small queue: the broadcast buffer is where a slow subscriber's backlog lives.
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(self.clone().forward(first, live, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Distinct per hub and process start: wall-clock nanoseconds mixed with the process id
/// and a counter, never 0 (0 is what a new subscriber sends).
fn fresh_instance_id() -> u64 {
    static HUBS: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let id = (nanos ^ (u64::from(std::process::id()) << 32))
        .wrapping_add(HUBS.fetch_add(1, Ordering::Relaxed));
    id.max(1)
}

/// The wall clock for `published_unix_micros`; 0 (unknown) before 1970.
fn unix_micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_kvcache::{SeqHash, StoredBlock, Tier};

    fn stored(parent: Option<u64>, hashes: &[u64]) -> KvEvent {
        KvEvent::Stored {
            parent: parent.map(SeqHash),
            blocks: hashes
                .iter()
                .map(|&h| StoredBlock {
                    seq_hash: SeqHash(h),
                    engine_hash: h + 1000,
                    tier: Tier::Gpu,
                })
                .collect(),
        }
    }

    fn request(instance_id: u64, after_event_id: u64) -> pb::SubscribeRequest {
        pb::SubscribeRequest {
            instance_id,
            after_event_id,
        }
    }

    fn snapshot_blocks(message: &pb::EventMessage) -> Vec<u64> {
        match &message.body {
            Some(Body::Snapshot(s)) => s
                .chains
                .iter()
                .flat_map(|c| c.blocks.iter().map(|b| b.seq_hash))
                .collect(),
            other => panic!("expected a snapshot, got {other:?}"),
        }
    }

    #[test]
    fn events_are_numbered_from_one_without_holes() {
        let hub = KvEventHub::with_instance_id(HubConfig::default(), 5);
        assert_eq!(hub.publish(&stored(None, &[1, 2])), 1);
        assert_eq!(hub.publish(&KvEvent::Cleared), 2);
        assert_eq!(hub.stats().last_event_id, 2);
        assert_eq!(hub.stats().blocks, 0);
    }

    #[test]
    fn a_new_subscriber_gets_a_snapshot_of_the_current_blocks() {
        let hub = KvEventHub::with_instance_id(HubConfig::default(), 5);
        hub.publish(&stored(None, &[1, 2, 3]));
        hub.publish(&KvEvent::Removed {
            blocks: vec![dynamo_kvcache::RemovedBlock {
                seq_hash: SeqHash(3),
                engine_hash: 1003,
            }],
            tier: Tier::Gpu,
        });
        let (first, _) = hub.open(&request(0, 0));
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].event_id, 2);
        assert_eq!(first[0].instance_id, 5);
        assert_eq!(snapshot_blocks(&first[0]), vec![1, 2]);
    }

    #[test]
    fn a_subscriber_inside_the_window_gets_only_what_it_missed() {
        let config = HubConfig {
            retain: 3,
            ..HubConfig::default()
        };
        let hub = KvEventHub::with_instance_id(config, 5);
        for h in 1..=5 {
            hub.publish(&stored(None, &[h]));
        }
        // Retained: events 3, 4, 5.
        let ids = |first: Vec<Arc<pb::EventMessage>>| -> Vec<u64> {
            first.iter().map(|m| m.event_id).collect()
        };
        assert_eq!(ids(hub.open(&request(5, 3)).0), vec![4, 5]);
        assert_eq!(ids(hub.open(&request(5, 2)).0), vec![3, 4, 5]);
        assert_eq!(ids(hub.open(&request(5, 5)).0), Vec::<u64>::new());
        // Behind the window, ahead of the log, or another instance: a snapshot.
        for stale in [request(5, 1), request(5, 9), request(4, 4)] {
            let (first, _) = hub.open(&stale);
            assert_eq!(snapshot_blocks(&first[0]).len(), 5, "{stale:?}");
        }
    }

    #[test]
    fn blocks_past_the_bound_are_sent_live_and_counted() {
        let config = HubConfig {
            max_blocks: 2,
            ..HubConfig::default()
        };
        let hub = KvEventHub::with_instance_id(config, 5);
        let (_, mut live) = hub.open(&request(0, 0));
        hub.publish(&stored(None, &[1, 2, 3, 4]));
        let sent = live.try_recv().unwrap();
        assert!(matches!(&sent.body, Some(Body::Stored(s)) if s.blocks.len() == 4));
        assert_eq!(hub.stats().unindexed_blocks, 2);
        assert_eq!(hub.stats().blocks, 2);
    }

    #[test]
    fn instance_ids_differ_between_hubs_and_are_never_zero() {
        let a = KvEventHub::new(HubConfig::default());
        let b = KvEventHub::new(HubConfig::default());
        assert_ne!(a.instance_id(), 0);
        assert_ne!(a.instance_id(), b.instance_id());
    }
}
