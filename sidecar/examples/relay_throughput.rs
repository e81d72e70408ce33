//! The relay end to end: an engine publishing vLLM's ZMQ KV events as fast as it can,
//! the sidecar, and 4 gRPC subscribers; then the time a new subscriber waits for the
//! snapshot of a pod holding 100,000 blocks. The engine is the `zeromq` crate's XPUB, an
//! implementation independent of the sidecar's `dynamo_zmtp`.
//!
//! `cargo run --release -p dynamo-sidecar --example relay_throughput`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use dynamo_kvcache::vllm_events::{KvEvent as EngineEvent, KvEventBatch, encode_message};
use dynamo_kvstream::pb::SubscribeRequest;
use dynamo_kvstream::pb::event_message::Body;
use dynamo_kvstream::pb::kv_event_stream_client::KvEventStreamClient;
use dynamo_sidecar::{Config, Sidecar};
use zeromq::{Socket, SocketRecv, SocketSend, XPubSocket, ZmqMessage};

const SUBSCRIBERS: usize = 4;
const MESSAGES: u64 = 20_000;
const BLOCK_SIZE: u32 = 16;
const BLOCKS_PER_PROMPT: u64 = 8;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut engine = XPubSocket::new();
    let endpoint = engine.bind("tcp://127.0.0.1:0").await?.to_string();
    let sidecar = Sidecar::start(&Config::parse_from([
        "dynamo-sidecar",
        "--listen=127.0.0.1:0",
        "--host=127.0.0.1",
        "--grpc-port=0",
        "--metrics-port=0",
        "--model-name=bench",
        "--engine-kv-events",
        &endpoint,
    ]))
    .await?;
    engine.recv().await?; // the sidecar's subscription
    let grpc = format!("http://{}", sidecar.grpc_addr);

    // As fast as the engine can send; subscribers that fall behind the hub's live buffer
    // are resynced with a snapshot instead of the events they missed.
    let mut seq = 0;
    fan_out(&mut engine, &sidecar, &grpc, &mut seq, None).await?;
    // The engine kept at most 2,000 events ahead of the slowest subscriber, so every
    // subscriber receives every event.
    fan_out(&mut engine, &sidecar, &grpc, &mut seq, Some(2_000)).await?;

    // 1,000 prompts of 100 blocks, then new subscribers ask for a snapshot.
    engine
        .send(message(seq, vec![EngineEvent::AllBlocksCleared]))
        .await?;
    for i in 0..1000 {
        engine
            .send(message(seq + 1 + i, vec![prompt_of(i, 100)]))
            .await?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while sidecar.hub.stats().blocks < 100_000 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the pod never reached 100k blocks"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut times = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let first = KvEventStreamClient::connect(grpc.clone())
            .await?
            .max_decoding_message_size(64 << 20)
            .subscribe(SubscribeRequest::default())
            .await?
            .into_inner()
            .message()
            .await?;
        let elapsed = start.elapsed();
        let Some(Body::Snapshot(snapshot)) = first.and_then(|m| m.body) else {
            anyhow::bail!("the first message is not a snapshot");
        };
        let blocks: usize = snapshot.chains.iter().map(|c| c.blocks.len()).sum();
        anyhow::ensure!(blocks == 100_000, "snapshot of {blocks} blocks");
        times.push(elapsed);
    }
    times.sort();
    println!(
        "snapshot of 100000 blocks over gRPC (connect, build, encode, send, decode): \
         median {:.1} ms, min {:.1} ms",
        times[2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
    );
    Ok(())
}

/// Relays `MESSAGES` engine messages to `SUBSCRIBERS` new subscribers and reports the
/// rates; `window` bounds how far the engine may run ahead of the slowest subscriber.
async fn fan_out(
    engine: &mut XPubSocket,
    sidecar: &Sidecar,
    grpc: &str,
    seq: &mut u64,
    window: Option<u64>,
) -> anyhow::Result<()> {
    let first_id = sidecar.hub.stats().last_event_id;
    let resyncs_before = sidecar.hub.stats().lagged_resyncs;
    // Each message stores one prompt and evicts the one before: 2 events (the first
    // message 1), 8 blocks each.
    let events = 2 * MESSAGES - 1;
    let last_id = first_id + events;
    let mut progress = Vec::new();
    let mut subscribers = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let mut stream = KvEventStreamClient::connect(grpc.to_owned())
            .await?
            .subscribe(SubscribeRequest::default())
            .await?
            .into_inner();
        stream.message().await?; // the first snapshot
        let seen = Arc::new(AtomicU64::new(first_id));
        progress.push(seen.clone());
        subscribers.push(tokio::spawn(async move {
            let mut received = 0u64;
            // A resynced subscriber's snapshot carries the id of the last event it holds.
            while let Some(m) = stream.message().await.unwrap() {
                received += 1;
                seen.store(m.event_id, Ordering::Relaxed);
                if m.event_id >= last_id {
                    break;
                }
            }
            (Instant::now(), received)
        }));
    }
    let hub = sidecar.hub.clone();
    let relayed = tokio::spawn(async move {
        while hub.stats().last_event_id < last_id {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Instant::now()
    });
    let start = Instant::now();
    for prompt in 0..MESSAGES {
        if let Some(window) = window {
            let slowest = || progress.iter().map(|p| p.load(Ordering::Relaxed)).min();
            while slowest().unwrap_or(last_id) + window < first_id + 2 * prompt {
                tokio::task::yield_now().await;
            }
        }
        let mut batch = vec![stored(prompt)];
        if prompt > 0 {
            batch.push(removed(prompt - 1));
        }
        engine.send(message(*seq, batch)).await?;
        *seq += 1;
    }
    let sent = start.elapsed();
    let mut last = start;
    let mut received = Vec::new();
    for s in subscribers {
        let (done, count) = s.await?;
        last = last.max(done);
        received.push(count);
    }
    let elapsed = (last - start).as_secs_f64();
    let relayed = (relayed.await? - start).as_secs_f64();
    let mode = match window {
        None => "burst".to_owned(),
        Some(w) => format!("paced (window {w} events)"),
    };
    println!(
        "{mode}: {events} events ({} blocks); engine sent them in {:.3} s; relay published \
         them by {relayed:.3} s ({:.0} events/s); all {SUBSCRIBERS} subscribers were at the \
         last one by {elapsed:.3} s ({:.0} events/s fanned out); messages per subscriber \
         {received:?}; resyncs for falling behind: {}",
        events * BLOCKS_PER_PROMPT,
        sent.as_secs_f64(),
        events as f64 / relayed,
        events as f64 / elapsed,
        sidecar.hub.stats().lagged_resyncs - resyncs_before,
    );
    Ok(())
}

fn message(seq: u64, events: Vec<EngineEvent>) -> ZmqMessage {
    let batch = KvEventBatch {
        ts: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64(),
        events,
        dp_rank: Some(0),
    };
    let frames: Vec<Bytes> = encode_message(b"", seq, &batch)
        .into_iter()
        .map(Bytes::from)
        .collect();
    ZmqMessage::try_from(frames).expect("three frames")
}

fn hashes(prompt: u64, blocks: u64) -> Vec<u64> {
    (0..blocks).map(|b| prompt * 1000 + b + 1).collect()
}

fn stored(prompt: u64) -> EngineEvent {
    let first = (prompt * 1000) as u32;
    EngineEvent::BlockStored {
        block_hashes: hashes(prompt, BLOCKS_PER_PROMPT),
        parent_hash: None,
        token_ids: (first..first + BLOCK_SIZE * BLOCKS_PER_PROMPT as u32).collect(),
        block_size: BLOCK_SIZE,
        lora_id: None,
        medium: Some("GPU".into()),
        lora_name: None,
    }
}

fn removed(prompt: u64) -> EngineEvent {
    EngineEvent::BlockRemoved {
        block_hashes: hashes(prompt, BLOCKS_PER_PROMPT),
        medium: Some("GPU".into()),
    }
}

/// Prompt `i` of the snapshot phase: `blocks` blocks of its own tokens.
fn prompt_of(i: u64, blocks: u64) -> EngineEvent {
    let first = 1_000_000_000 + (i * 10_000) as u32;
    EngineEvent::BlockStored {
        block_hashes: (0..blocks).map(|b| (1 << 40) + i * 1000 + b).collect(),
        parent_hash: None,
        token_ids: (first..first + BLOCK_SIZE * blocks as u32).collect(),
        block_size: BLOCK_SIZE,
        lora_id: None,
        medium: Some("GPU".into()),
        lora_name: None,
    }
}
