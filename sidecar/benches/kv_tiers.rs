//! Throughput of the KV block tiers through the block API, each against its baseline in
//! the same run (issue 14): host-memory offload and onboard over loopback gRPC against a
//! plain memcpy of the same bytes; the disk tier's writes and reads against one
//! sequential `dd`-style write and read of a file of the same size; and a lookup's
//! latency (p50, p99) while an engine keeps the offload path full and host memory
//! spills to disk, on its own connection and on the offloads' one.
//!
//! 64 blocks of 2 MiB (a Llama-3-8B block of 16 tokens in bfloat16 is 2 MiB:
//! 32 layers x 8 KV heads x 128 x K and V x 2 bytes x 16).

use std::io::{Read, Write};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dynamo_kvblocks::{Block, BlockClient, Layout};
use dynamo_kvcache::SeqHash;
use dynamo_sidecar::{Config, Sidecar};

use clap::Parser;

const BLOCK_BYTES: usize = 2 << 20;
const BLOCKS: u64 = 64;
const TOTAL: u64 = BLOCK_BYTES as u64 * BLOCKS;

fn blocks() -> Vec<Block> {
    let layout = Layout {
        block_bytes: BLOCK_BYTES as u64,
        block_size: 16,
        layers: 32,
        dtype: "bfloat16".into(),
    };
    (0..BLOCKS)
        .map(|h| {
            let payload: Vec<u8> = (0..BLOCK_BYTES).map(|i| (i as u64 ^ h) as u8).collect();
            let parent = h.checked_sub(1).map(SeqHash);
            Block::new(
                SeqHash(h + 1),
                parent.map(|p| SeqHash(p.0 + 1)),
                16,
                layout.clone(),
                Bytes::from(payload),
            )
        })
        .collect()
}

async fn sidecar(extra: &[&str]) -> (Sidecar, BlockClient) {
    let mut args = vec![
        "dynamo-sidecar",
        "--listen=127.0.0.1:0",
        "--host=127.0.0.1",
        "--grpc-port=0",
        "--metrics-port=0",
        "--engine-kv-events=none",
        "--model-name=bench",
    ];
    args.extend(extra);
    let sidecar = Sidecar::start(&Config::parse_from(args)).await.unwrap();
    let client = BlockClient::new(&format!("http://{}", sidecar.grpc_addr)).unwrap();
    (sidecar, client)
}

fn host_tier(c: &mut Criterion) {
    // As the binary does when it has a host tier.
    dynamo_sidecar::keep_freed_blocks();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let blocks = blocks();
    let hashes: Vec<SeqHash> = blocks.iter().map(|b| b.hash).collect();
    let mut group = c.benchmark_group("host_tier");
    group.throughput(Throughput::Bytes(TOTAL)).sample_size(10);

    group.bench_function("memcpy", |b| {
        let mut dst = vec![0u8; BLOCK_BYTES];
        b.iter(|| {
            for block in &blocks {
                dst.copy_from_slice(&block.payload);
            }
            std::hint::black_box(&dst);
        })
    });
    let (_sidecar, inline) = rt.block_on(sidecar(&["--kv-host-bytes=256MiB"]));
    let regions = tempfile::tempdir().unwrap();
    let region_flag = format!("--kv-region-dir={}", regions.path().display());
    let (_shm_sidecar, mut shm) = rt.block_on(sidecar(&["--kv-host-bytes=256MiB", &region_flag]));
    assert!(rt.block_on(shm.share_memory(TOTAL)).unwrap());
    let mut round = 0u64;
    for (path, client) in [("", inline), ("_shm", shm)] {
        // Each offload round lands in an emptied tier: a fresh chain of hashes every time.
        group.bench_function(format!("offload{path}"), |b| {
            b.iter(|| {
                round += 1;
                let fresh: Vec<Block> = blocks
                    .iter()
                    .map(|b| Block {
                        hash: SeqHash(b.hash.0 + round * 1000),
                        ..b.clone()
                    })
                    .collect();
                let reply = rt.block_on(client.clone().offload(fresh)).unwrap();
                assert_eq!(reply.stored, BLOCKS);
            })
        });
        rt.block_on(client.clone().offload(blocks.clone())).unwrap();
        group.bench_function(format!("onboard{path}"), |b| {
            b.iter(|| {
                let back = rt.block_on(client.clone().onboard(&hashes)).unwrap();
                assert_eq!(back.len() as u64, BLOCKS);
            })
        });
    }
    group.finish();
}

fn disk_tier(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let blocks = blocks();
    let hashes: Vec<SeqHash> = blocks.iter().map(|b| b.hash).collect();
    let dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("disk_tier");
    group.throughput(Throughput::Bytes(TOTAL)).sample_size(10);

    let file = dir.path().join("dd");
    group.bench_function("dd_write", |b| {
        b.iter(|| {
            let mut f = std::fs::File::create(&file).unwrap();
            for block in &blocks {
                f.write_all(&block.payload).unwrap();
            }
        })
    });
    group.bench_function("dd_read", |b| {
        let mut buf = vec![0u8; BLOCK_BYTES];
        b.iter(|| {
            let mut f = std::fs::File::open(&file).unwrap();
            while f.read(&mut buf).unwrap() > 0 {}
        })
    });
    // Absent when a filter skipped `dd_write`.
    let _ = std::fs::remove_file(&file);

    let tier_dir = dir.path().join("tier");
    let flags = [
        "--kv-disk-dir".to_owned(),
        tier_dir.display().to_string(),
        "--kv-disk-bytes=1GiB".to_owned(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (_sidecar, client) = rt.block_on(sidecar(&flags));
    let mut round = 0u64;
    group.bench_function("offload_and_write", |b| {
        b.iter(|| {
            round += 1;
            let fresh: Vec<SeqHash> = hashes.iter().map(|h| SeqHash(h.0 + round * 1000)).collect();
            let blocks: Vec<Block> = blocks
                .iter()
                .zip(&fresh)
                .map(|(b, h)| Block {
                    hash: *h,
                    parent: None,
                    ..b.clone()
                })
                .collect();
            rt.block_on(async {
                let mut client = client.clone();
                client.offload(blocks).await.unwrap();
                // Until every block is on disk.
                while client.lookup(&fresh).await.unwrap().len() < fresh.len() {
                    tokio::task::yield_now().await;
                }
            });
        })
    });
    let last: Vec<SeqHash> = hashes.iter().map(|h| SeqHash(h.0 + round * 1000)).collect();
    group.bench_function("read_and_onboard", |b| {
        b.iter(|| {
            let back = rt.block_on(client.clone().onboard(&last)).unwrap();
            assert_eq!(back.len() as u64, BLOCKS);
        })
    });
    group.finish();
}

/// Lookups while one task offloads fresh 2 MiB blocks back to back into 64 MiB of host
/// memory that spills every block to disk: the engine's offload queue never empties.
fn lookup_under_offload(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let disk = tempfile::tempdir().unwrap();
    let disk_flag = format!("--kv-disk-dir={}", disk.path().display());
    let (sidecar, offloads) = rt.block_on(sidecar(&[
        "--kv-host-bytes=64MiB",
        &disk_flag,
        "--kv-disk-bytes=4GiB",
        "--kv-disk-min-reuse=1",
    ]));
    let blocks = blocks();
    let chain: Vec<SeqHash> = blocks.iter().map(|b| b.hash).collect();
    rt.block_on(offloads.clone().offload(blocks[..8].to_vec()))
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let offloader = {
        let (stop, mut client) = (stop.clone(), offloads.clone());
        rt.spawn(async move {
            let mut round = 1u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                round += 1;
                // The looked-up chain again (a duplicate is a use: it stays in host
                // memory), then 16 new blocks that push older ones to disk.
                let fresh: Vec<Block> = blocks[..8]
                    .iter()
                    .cloned()
                    .chain(blocks[..16].iter().map(|b| Block {
                        hash: SeqHash(b.hash.0 + round * 1000),
                        ..b.clone()
                    }))
                    .collect();
                client.offload(fresh).await.unwrap();
            }
        })
    };
    // A tonic channel spawns its connection task: made inside the runtime.
    let own = {
        let _inside = rt.enter();
        BlockClient::new(&format!("http://{}", sidecar.grpc_addr)).unwrap()
    };
    let lookup = |client: &BlockClient| {
        let started = std::time::Instant::now();
        let held = rt.block_on(client.clone().lookup(&chain)).unwrap();
        assert_eq!(held.len(), 8);
        started.elapsed()
    };
    let mut group = c.benchmark_group("lookup_under_offload");
    group.sample_size(50);
    group.bench_function("own_connection", |b| b.iter(|| lookup(&own)));
    group.bench_function("offload_connection", |b| b.iter(|| lookup(&offloads)));
    group.finish();
    for (name, client) in [("own_connection", &own), ("offload_connection", &offloads)] {
        let mut took: Vec<_> = (0..500).map(|_| lookup(client)).collect();
        took.sort();
        let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
        println!(
            "lookup_under_offload/{name}: p50 {:?}, p99 {:?}",
            at(0.5),
            at(0.99)
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    rt.block_on(offloader).unwrap();
}

criterion_group!(benches, host_tier, disk_tier, lookup_under_offload);
criterion_main!(benches);
