//! The stream end to end: a real tonic server around a hub, real subscribers over TCP.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use dynamo_kvcache::{KvEvent, KvIndex, RemovedBlock, SeqHash, StoredBlock, Tier, WorkerId};
use dynamo_kvstream::pb::event_message::Body;
use dynamo_kvstream::pb::kv_event_stream_client::KvEventStreamClient;
use dynamo_kvstream::{HubConfig, KvEventHub, PodUpdate, SubscriberConfig, follow, pb};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

const POD: WorkerId = WorkerId(1);

fn stored(parent: Option<u64>, hashes: &[u64], tier: Tier) -> KvEvent {
    KvEvent::Stored {
        parent: parent.map(SeqHash),
        blocks: hashes
            .iter()
            .map(|&h| StoredBlock {
                seq_hash: SeqHash(h),
                engine_hash: h ^ 0xff,
                tier,
            })
            .collect(),
    }
}

fn removed(hashes: &[u64]) -> KvEvent {
    KvEvent::Removed {
        blocks: hashes
            .iter()
            .map(|&h| RemovedBlock {
                seq_hash: SeqHash(h),
                engine_hash: h ^ 0xff,
            })
            .collect(),
        tier: Tier::Gpu,
    }
}

/// A sidecar "process": the hub served on its own runtime, so that dropping it kills the
/// server, its connections and its subscriber tasks at once, as a process exit does.
struct Sidecar {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Sidecar {
    fn start(hub: &KvEventHub, addr: &str) -> (Self, std::net::SocketAddr) {
        let listener = std::net::TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        let local = listener.local_addr().unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let service = hub.service();
        runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).unwrap();
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .expect("server runs");
        });
        (
            Self {
                runtime: Some(runtime),
            },
            local,
        )
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A picker's view of one pod, kept the way the EPP keeps it.
#[derive(Default)]
struct View {
    index: KvIndex,
    updates: Vec<PodUpdate>,
}

impl View {
    fn apply(&mut self, update: PodUpdate) {
        match &update {
            PodUpdate::Snapshot(chains) => {
                self.index.remove_worker(POD);
                for chain in chains {
                    self.index.apply(POD, chain).unwrap();
                }
            }
            PodUpdate::Event(event, _) => self.index.apply(POD, event).unwrap(),
            PodUpdate::Lost => self.index.remove_worker(POD),
        }
        self.updates.push(update);
    }

    fn blocks(&self) -> Vec<(u64, Vec<Tier>)> {
        let mut blocks: Vec<_> = self
            .index
            .snapshot(POD)
            .into_iter()
            .flat_map(|e| match e {
                KvEvent::Stored { blocks, .. } => blocks,
                _ => vec![],
            })
            .map(|b| (b.seq_hash.0, self.index.tiers_of(POD, b.seq_hash)))
            .collect();
        blocks.sort();
        blocks.dedup();
        blocks
    }
}

fn hub_blocks(hub: &KvEventHub) -> Vec<(u64, Vec<Tier>)> {
    let mut mirror = View::default();
    match hub.snapshot().body {
        Some(Body::Snapshot(s)) => {
            for chain in s.chains {
                let tier = match chain.blocks.first().map(|b| b.tier()) {
                    Some(pb::Tier::Host) => Tier::Host,
                    Some(pb::Tier::Disk) => Tier::Disk,
                    Some(pb::Tier::Object) => Tier::Object,
                    _ => Tier::Gpu,
                };
                let hashes: Vec<u64> = chain.blocks.iter().map(|b| b.seq_hash).collect();
                mirror
                    .index
                    .apply(POD, &stored(chain.parent, &hashes, tier))
                    .unwrap();
            }
        }
        other => panic!("not a snapshot: {other:?}"),
    }
    mirror.blocks()
}

fn spawn_follower(addr: String) -> (Arc<Mutex<View>>, JoinHandle<()>) {
    let view = Arc::new(Mutex::new(View::default()));
    let sink = view.clone();
    let config = SubscriberConfig {
        retry_min: Duration::from_millis(20),
        retry_max: Duration::from_millis(200),
        ..SubscriberConfig::default()
    };
    let task = tokio::spawn(follow(format!("http://{addr}"), config, move |u| {
        sink.lock().unwrap().apply(u)
    }));
    (view, task)
}

/// Polls `cond` for up to 20 s (the machine may be busy).
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn a_late_subscriber_gets_the_live_state_then_events_in_order() {
    let hub = KvEventHub::new(HubConfig::default());
    let (sidecar, addr) = Sidecar::start(&hub, "127.0.0.1:0");

    hub.publish(&stored(None, &[1, 2, 3, 4], Tier::Gpu));
    hub.publish(&stored(Some(2), &[5, 6], Tier::Gpu));
    hub.publish(&removed(&[4]));
    hub.publish(&stored(Some(6), &[7], Tier::Host));

    let (view, follower) = spawn_follower(addr.to_string());
    eventually("the snapshot", || !view.lock().unwrap().updates.is_empty()).await;
    assert!(matches!(
        view.lock().unwrap().updates[0],
        PodUpdate::Snapshot(_)
    ));
    assert_eq!(view.lock().unwrap().blocks(), hub_blocks(&hub));

    // Live events follow, in publish order, each once.
    let live: Vec<KvEvent> = (10..60)
        .map(|h| stored(Some(h - 1), &[h], Tier::Gpu))
        .chain([
            removed(&[3]),
            KvEvent::Cleared,
            stored(None, &[99], Tier::Disk),
        ])
        .collect();
    let before = SystemTime::now();
    for event in &live {
        hub.publish(event);
    }
    eventually("every live event", || {
        view.lock().unwrap().updates.len() == 1 + live.len()
    })
    .await;
    let after = SystemTime::now();
    let got: Vec<KvEvent> = view.lock().unwrap().updates[1..]
        .iter()
        .map(|u| match u {
            PodUpdate::Event(e, Some(published)) => {
                // The microsecond wire format may round `before` down by under 1 µs.
                let earliest = before - Duration::from_micros(1);
                assert!(
                    (earliest..=after).contains(published),
                    "published {published:?} outside the publishing window"
                );
                e.clone()
            }
            other => panic!("expected a live event with its publish time, got {other:?}"),
        })
        .collect();
    assert_eq!(got, live);
    assert_eq!(view.lock().unwrap().blocks(), vec![(99, vec![Tier::Disk])]);
    assert_eq!(hub.stats().subscribers, 1);

    follower.abort();
    drop(sidecar);
}

#[tokio::test]
async fn a_sidecar_restart_makes_subscribers_resync() {
    let first = KvEventHub::new(HubConfig::default());
    first.publish(&stored(None, &[1, 2], Tier::Gpu));
    let (sidecar, addr) = Sidecar::start(&first, "127.0.0.1:0");

    let (view, follower) = spawn_follower(addr.to_string());
    eventually("the first snapshot", || {
        view.lock().unwrap().blocks() == hub_blocks(&first)
    })
    .await;

    // The sidecar dies; the pod comes back as a new instance with other blocks.
    drop(sidecar);
    eventually("the loss to be noticed", || {
        view.lock().unwrap().updates.contains(&PodUpdate::Lost)
    })
    .await;
    assert!(view.lock().unwrap().blocks().is_empty());

    let second = KvEventHub::new(HubConfig::default());
    assert_ne!(second.instance_id(), first.instance_id());
    second.publish(&stored(None, &[7, 8, 9], Tier::Gpu));
    let (sidecar, _) = Sidecar::start(&second, &addr.to_string());
    eventually("the new instance's snapshot", || {
        view.lock().unwrap().blocks() == hub_blocks(&second)
    })
    .await;
    second.publish(&removed(&[9]));
    eventually("live events of the new instance", || {
        view.lock().unwrap().blocks().len() == 2
    })
    .await;

    follower.abort();
    drop(sidecar);
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_gets_a_fresh_snapshot() {
    let config = HubConfig {
        live_buffer: 8,
        ..HubConfig::default()
    };
    let hub = KvEventHub::new(config);
    let (sidecar, addr) = Sidecar::start(&hub, "127.0.0.1:0");

    let mut client = KvEventStreamClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut stream = client
        .subscribe(pb::SubscribeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(first.body, Some(Body::Snapshot(_))));

    // Far more events than the subscriber's buffers hold, while it reads nothing.
    for h in 1..=5_000 {
        hub.publish(&stored(None, &[h], Tier::Gpu));
    }
    let mut next_id = first.event_id + 1;
    let resync = loop {
        let message = stream.message().await.unwrap().unwrap();
        match message.body {
            Some(Body::Snapshot(s)) => break (message.event_id, s),
            _ => {
                assert_eq!(
                    message.event_id, next_id,
                    "events before the resync are in order"
                );
                next_id += 1;
            }
        }
    };
    assert!(hub.stats().lagged_resyncs >= 1);
    // The snapshot holds every block stored up to its event id.
    let (snapshot_id, snapshot) = resync;
    let blocks: usize = snapshot.chains.iter().map(|c| c.blocks.len()).sum();
    assert_eq!(blocks as u64, snapshot_id);

    drop(sidecar);
}

#[tokio::test]
async fn a_resuming_subscriber_gets_only_the_events_it_missed() {
    let hub = KvEventHub::new(HubConfig::default());
    let (sidecar, addr) = Sidecar::start(&hub, "127.0.0.1:0");
    for h in 1..=10 {
        hub.publish(&stored(None, &[h], Tier::Gpu));
    }
    let mut client = KvEventStreamClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let request = pb::SubscribeRequest {
        instance_id: hub.instance_id(),
        after_event_id: 7,
    };
    let mut stream = client.subscribe(request).await.unwrap().into_inner();
    for expected in 8..=10 {
        let message = stream.message().await.unwrap().unwrap();
        assert_eq!(message.event_id, expected);
        assert!(matches!(message.body, Some(Body::Stored(_))));
    }
    drop(sidecar);
}
