//! The relay's CPU cost without sockets: decoding vLLM batches, re-hashing their blocks
//! and publishing into the hub; and the hub's snapshot of a pod with 100,000 blocks.
//! End to end over ZMQ and gRPC: `examples/relay_throughput.rs`.

use std::sync::Arc;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use dynamo_kvcache::vllm_events::{KvEvent as EngineEvent, KvEventBatch, encode_message};
use dynamo_kvcache::{BlockHasher, KvEvent, StoredBlock, Tier};
use dynamo_kvstream::{HubConfig, KvEventHub};
use dynamo_sidecar::metrics::Metrics;
use dynamo_sidecar::relay::Relay;

const BLOCK_SIZE: u32 = 16;
const BLOCKS_PER_EVENT: u64 = 8;
const MESSAGES: u64 = 1000;

/// `MESSAGES` messages of one event each, numbered from 0: every even message stores a
/// new 8-block prompt, the odd one after it evicts that prompt again.
fn messages() -> Vec<Vec<Bytes>> {
    (0..MESSAGES)
        .map(|seq| {
            let prompt = seq / 2;
            let hashes: Vec<u64> = (0..BLOCKS_PER_EVENT)
                .map(|b| prompt * BLOCKS_PER_EVENT + b + 1)
                .collect();
            let event = if seq % 2 == 0 {
                let first = (prompt * 1000) as u32;
                EngineEvent::BlockStored {
                    block_hashes: hashes,
                    parent_hash: None,
                    token_ids: (first..first + BLOCK_SIZE * BLOCKS_PER_EVENT as u32).collect(),
                    block_size: BLOCK_SIZE,
                    lora_id: None,
                    medium: Some("GPU".into()),
                    lora_name: None,
                }
            } else {
                EngineEvent::BlockRemoved {
                    block_hashes: hashes,
                    medium: Some("GPU".into()),
                }
            };
            let batch = KvEventBatch {
                ts: 0.0,
                events: vec![event],
                dp_rank: Some(0),
            };
            encode_message(b"", seq, &batch)
                .into_iter()
                .map(Bytes::from)
                .collect()
        })
        .collect()
}

fn relay(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let messages = messages();
    let mut group = c.benchmark_group("relay");
    group.throughput(Throughput::Elements(MESSAGES));
    group.bench_function("decode_rehash_publish_1000_events_of_8_blocks", |b| {
        b.iter_batched(
            || {
                let hub = KvEventHub::new(HubConfig::default());
                Relay::new("bench-model".into(), None, hub, Arc::new(Metrics::new()))
            },
            |mut relay| {
                rt.block_on(async {
                    for frames in &messages {
                        relay.handle(frames).await;
                    }
                })
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

/// A hub holding 1,000 prompts of 100 blocks each.
fn hub_with_100k_blocks() -> KvEventHub {
    let hub = KvEventHub::new(HubConfig::default());
    let hasher = BlockHasher::new(16, "bench-model", None);
    for prompt in 0..1000u32 {
        let tokens: Vec<u32> = (prompt * 10_000..prompt * 10_000 + 1600).collect();
        let blocks = hasher
            .seq_hashes(&tokens)
            .into_iter()
            .map(|seq_hash| StoredBlock {
                seq_hash,
                engine_hash: seq_hash.0 ^ 0x5555,
                tier: Tier::Gpu,
            })
            .collect();
        hub.publish(&KvEvent::Stored {
            parent: None,
            blocks,
        });
    }
    assert_eq!(hub.stats().blocks, 100_000);
    hub
}

fn snapshot(c: &mut Criterion) {
    let hub = hub_with_100k_blocks();
    let bytes = prost::Message::encoded_len(&hub.snapshot());
    eprintln!("snapshot of 100000 blocks: {bytes} bytes encoded");
    c.bench_function("hub/snapshot_100k_blocks", |b| b.iter(|| hub.snapshot()));
}

criterion_group!(benches, relay, snapshot);
criterion_main!(benches);
