//! The KV event relay over real sockets: an engine publisher writing vLLM's ZMQ format,
//! the sidecar, and gRPC subscribers as the endpoint picker runs them.

mod common;

use bytes::Bytes;
use common::*;
use dynamo_kvcache::{BlockHasher, KvEvent, RemovedBlock, SeqHash, StoredBlock, Tier};
use dynamo_kvstream::PodUpdate;

fn hasher() -> BlockHasher {
    BlockHasher::new(4, MODEL, None)
}

fn gpu_blocks(seqs: &[SeqHash], engine: &[u64]) -> Vec<StoredBlock> {
    seqs.iter()
        .zip(engine)
        .map(|(&seq_hash, &engine_hash)| StoredBlock {
            seq_hash,
            engine_hash,
            tier: Tier::Gpu,
        })
        .collect()
}

/// An engine publisher and a sidecar subscribed to it, with a follower that has taken
/// its (empty) first snapshot.
async fn relay_setup(with_replay: bool) -> (EnginePublisher, dynamo_sidecar::Sidecar, Follower) {
    let mut engine = EnginePublisher::bind().await;
    let replay = with_replay.then_some(engine.replay_endpoint.clone());
    let sidecar = sidecar(
        "http://127.0.0.1:9",
        Some(&engine.endpoint),
        replay.as_deref(),
    )
    .await;
    engine.wait_subscriber().await;
    let mut follower = Follower::start(sidecar.grpc_addr);
    assert_eq!(follower.snapshot().await, vec![]);
    (engine, sidecar, follower)
}

#[tokio::test]
async fn events_arrive_in_order_under_our_hashes() {
    let (mut engine, _sidecar, mut follower) = relay_setup(false).await;
    let prompt = tokens(100, 3);
    let ours = hasher().seq_hashes(&prompt);
    // The engine stores a prompt's first two blocks, then the third under the second,
    // then evicts the tail.
    engine
        .publish(vec![stored(&[11, 12], None, prompt[..8].to_vec())])
        .await;
    engine
        .publish(vec![
            stored(&[13], Some(12), prompt[8..].to_vec()),
            removed(&[13]),
        ])
        .await;

    assert_eq!(
        follower.event().await,
        KvEvent::Stored {
            parent: None,
            blocks: gpu_blocks(&ours[..2], &[11, 12]),
        }
    );
    assert_eq!(
        follower.event().await,
        KvEvent::Stored {
            parent: Some(ours[1]),
            blocks: gpu_blocks(&ours[2..], &[13]),
        }
    );
    assert_eq!(
        follower.event().await,
        KvEvent::Removed {
            blocks: vec![RemovedBlock {
                seq_hash: ours[2],
                engine_hash: 13,
            }],
            tier: Tier::Gpu,
        }
    );
}

#[tokio::test]
async fn a_late_subscriber_gets_a_snapshot_equal_to_the_live_state() {
    let (mut engine, sidecar, mut early) = relay_setup(false).await;
    let mut live = View::new();
    // 40 prompts of 3 blocks sharing their first block, some evicted again.
    let shared = tokens(0, 1);
    engine
        .publish(vec![stored(&[1], None, shared.clone())])
        .await;
    let mut expected_events = 1;
    for p in 0..40u64 {
        let tail = tokens(1000 + 100 * p as u32, 2);
        let hashes = [100 + 2 * p, 101 + 2 * p];
        let mut batch = vec![stored(&hashes, Some(1), tail)];
        if p % 3 == 0 {
            batch.push(removed(&hashes[1..]));
        }
        expected_events += batch.len();
        engine.publish(batch).await;
    }
    for _ in 0..expected_events {
        live.apply(&PodUpdate::Event(early.event().await, None));
    }
    let mut late = Follower::start(sidecar.grpc_addr);
    let mut late_view = View::new();
    late_view.apply(&PodUpdate::Snapshot(late.snapshot().await));
    assert_eq!(late_view.chains(), live.chains());
    // 1 shared + 40 middles + 27 tails still held.
    let blocks: usize = live
        .chains()
        .iter()
        .map(|c| match c {
            KvEvent::Stored { blocks, .. } => blocks.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(blocks, 1 + 40 + 26);
    // Both keep following the same live stream.
    engine.publish(vec![removed(&[1])]).await;
    assert_eq!(early.event().await, late.event().await);
}

#[tokio::test]
async fn a_sidecar_restart_makes_subscribers_resync() {
    let (mut engine, first, mut follower) = relay_setup(false).await;
    let prompt = tokens(0, 2);
    engine
        .publish(vec![stored(&[1, 2], None, prompt.clone())])
        .await;
    assert!(matches!(follower.event().await, KvEvent::Stored { .. }));
    let old_instance = first.hub.instance_id();
    let grpc_port = first.grpc_addr.port().to_string();
    drop(first);

    // A new sidecar process on the same port, beside the same engine (the port is free
    // once the first one's tasks have wound down).
    let deadline = tokio::time::Instant::now() + WAIT;
    let second = loop {
        let flags = ["--grpc-port", grpc_port.as_str()];
        match try_sidecar_with("http://127.0.0.1:9", Some(&engine.endpoint), None, &flags).await {
            Ok(sidecar) => break sidecar,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("not yet: {e:#}");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e:#}"),
        }
    };
    assert_ne!(second.hub.instance_id(), old_instance);
    engine.wait_subscriber().await;
    // The follower drops what it knew (the new instance's snapshot does not have the
    // blocks stored before it started), then follows the new instance.
    let snapshot = loop {
        match follower.next().await {
            PodUpdate::Snapshot(chains) => break chains,
            PodUpdate::Lost => continue,
            PodUpdate::Event(e, _) => panic!("an event before the new snapshot: {e:?}"),
        }
    };
    assert_eq!(snapshot, vec![]);
    let more = tokens(500, 1);
    engine.publish(vec![stored(&[3], None, more.clone())]).await;
    assert_eq!(
        follower.event().await,
        KvEvent::Stored {
            parent: None,
            blocks: gpu_blocks(&hasher().seq_hashes(&more), &[3]),
        }
    );
}

#[tokio::test]
async fn malformed_messages_are_counted_and_skipped() {
    let (mut engine, sidecar, mut follower) = relay_setup(false).await;
    let seq = |n: u64| Bytes::copy_from_slice(&n.to_be_bytes());
    // Not msgpack; a batch with an event of an unknown kind next to a good one; two frames;
    // a short sequence frame.
    engine
        .send_frames(vec![
            Bytes::new(),
            seq(0),
            Bytes::from_static(b"\xc1\xff\x00"),
        ])
        .await;
    // [0.0, [["BlockMigrated", 5], ["AllBlocksCleared"]]]
    let mut unknown = vec![0x92, 0xcb];
    unknown.extend(0f64.to_be_bytes());
    unknown.extend([0x92, 0x92, 0xad]);
    unknown.extend(b"BlockMigrated");
    unknown.extend([0x05, 0x91, 0xb0]);
    unknown.extend(b"AllBlocksCleared");
    engine
        .send_frames(vec![Bytes::new(), seq(1), Bytes::from(unknown)])
        .await;
    engine.send_frames(vec![Bytes::new(), seq(2)]).await;
    engine
        .send_frames(vec![
            Bytes::new(),
            Bytes::from_static(b"\x03"),
            Bytes::new(),
        ])
        .await;
    // A good event afterwards still flows, without a gap: the messages numbered 0 and 1
    // were counted, the others carry no number.
    engine.send(2, vec![stored(&[7], None, tokens(0, 1))]).await;
    assert_eq!(follower.event().await, KvEvent::Cleared);
    assert!(matches!(follower.event().await, KvEvent::Stored { .. }));
    assert_eq!(
        metric(&sidecar, "dynamo_sidecar_decode_errors_total", "").await,
        3.0
    );
    assert_eq!(
        metric(&sidecar, "dynamo_sidecar_unknown_event_kinds_total", "").await,
        1.0
    );
    assert_eq!(
        metric(&sidecar, "dynamo_sidecar_zmq_gaps_total", "").await,
        0.0
    );
    assert_eq!(
        metric(
            &sidecar,
            "dynamo_sidecar_engine_events_total",
            "kind=\"stored\""
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn a_sequence_gap_without_replay_resets_the_view() {
    let (mut engine, sidecar, mut follower) = relay_setup(false).await;
    engine.publish(vec![stored(&[1], None, tokens(0, 1))]).await;
    assert!(matches!(follower.event().await, KvEvent::Stored { .. }));
    engine.lose(vec![removed(&[1])]);
    let after = tokens(40, 1);
    engine
        .publish(vec![stored(&[2], None, after.clone())])
        .await;
    // Block 1 may or may not still be held: the view is dropped, then rebuilt.
    assert_eq!(follower.event().await, KvEvent::Cleared);
    assert_eq!(
        follower.event().await,
        KvEvent::Stored {
            parent: None,
            blocks: gpu_blocks(&hasher().seq_hashes(&after), &[2]),
        }
    );
    assert_eq!(
        metric(
            &sidecar,
            "dynamo_sidecar_zmq_gaps_total",
            "outcome=\"reset\""
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn a_sequence_gap_is_repaired_from_the_replay_socket() {
    let (mut engine, sidecar, mut follower) = relay_setup(true).await;
    let prompt = tokens(0, 3);
    let ours = hasher().seq_hashes(&prompt);
    engine
        .publish(vec![stored(&[1], None, prompt[..4].to_vec())])
        .await;
    engine.lose(vec![stored(&[2], Some(1), prompt[4..8].to_vec())]);
    engine
        .publish(vec![stored(&[3], Some(2), prompt[8..].to_vec())])
        .await;
    for i in 0..3usize {
        assert_eq!(
            follower.event().await,
            KvEvent::Stored {
                parent: i.checked_sub(1).map(|p| ours[p]),
                blocks: gpu_blocks(&ours[i..=i], &[i as u64 + 1]),
            }
        );
    }
    assert_eq!(
        metric(
            &sidecar,
            "dynamo_sidecar_zmq_gaps_total",
            "outcome=\"replayed\""
        )
        .await,
        1.0
    );

    // When the engine's buffer no longer holds the lost message, the view is reset.
    engine.lose(vec![removed(&[3])]);
    engine.forget_history();
    engine.publish(vec![removed(&[2])]).await;
    assert_eq!(follower.event().await, KvEvent::Cleared);
    assert_eq!(
        metric(
            &sidecar,
            "dynamo_sidecar_zmq_gaps_total",
            "outcome=\"reset\""
        )
        .await,
        1.0
    );
    // Block 2 was dropped with the view, so its removal has nothing to remove.
    assert_eq!(
        metric(
            &sidecar,
            "dynamo_sidecar_skipped_total",
            "reason=\"unknown_block\""
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn an_engine_restart_clears_the_view() {
    let (mut engine, sidecar, mut follower) = relay_setup(false).await;
    engine.publish(vec![stored(&[1], None, tokens(0, 1))]).await;
    engine
        .publish(vec![stored(&[2], Some(1), tokens(4, 1))])
        .await;
    follower.event().await;
    follower.event().await;
    // A new engine process numbers its messages from 0 again.
    engine.send(0, vec![stored(&[9], None, tokens(0, 1))]).await;
    assert_eq!(follower.event().await, KvEvent::Cleared);
    assert!(matches!(
        follower.event().await,
        KvEvent::Stored { parent: None, .. }
    ));
    assert_eq!(
        metric(&sidecar, "dynamo_sidecar_engine_restarts_total", "").await,
        1.0
    );
}
