//! The disaggregated KV transfer (issue 15): a 4k-token prompt's blocks moved from a
//! prefill pod's sidecar to a decode pod's with the transport the decode sidecar runs
//! (`Transfer::fetch`: the block API's `Onboard` with the prefill's lease, gRPC over
//! loopback TCP, every block checksummed), against a plain TCP copy of the same bytes
//! in the same run. Prints GB/s and p50/p99 latency of each.
//!
//! 4096 tokens of Llama-3-8B in bfloat16: 256 blocks of 16 tokens, 2 MiB each (32 layers
//! x 8 KV heads x 128 x K and V x 2 bytes x 16), 512 MiB in all.
//!
//! Then, where NIXL loads (`NIXL_LIB_DIR`, the wheel's library directory), 64 of those
//! blocks by NIXL READ (UCX; `Describe`, read, checks, end of lease) against gRPC.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use dynamo_kvblocks::{Block, BlockClient, Layout};
use dynamo_kvcache::SeqHash;
use dynamo_sidecar::disagg::transfer::{Transfer, Transport};
use dynamo_sidecar::{Config, Sidecar};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BLOCK_BYTES: usize = 2 << 20;
const BLOCKS: u64 = 256;
const TOTAL: u64 = BLOCK_BYTES as u64 * BLOCKS;
const ROUNDS: usize = 20;
/// Blocks of the NIXL against gRPC comparison.
const NIXL_BLOCKS: usize = 64;

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
            let parent = h.checked_sub(1).map(|p| SeqHash(p + 1));
            Block::new(
                SeqHash(h + 1),
                parent,
                16,
                layout.clone(),
                Bytes::from(payload),
            )
        })
        .collect()
}

async fn prefill_sidecar(nixl: &str) -> Sidecar {
    let args = [
        "--nixl-lib-dir",
        nixl,
        "--listen",
        "127.0.0.1:0",
        "--host",
        "127.0.0.1",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        "--engine-kv-events",
        "none",
        "--kv-region-dir",
        "none",
        "--kv-lease-bytes",
        "2GiB",
        "--model-name",
        "m",
    ];
    let args = std::iter::once("dynamo-sidecar").chain(args);
    Sidecar::start(&Config::parse_from(args)).await.unwrap()
}

/// A server that sends `TOTAL` bytes to each connection.
async fn tcp_source() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let chunk = vec![7u8; BLOCK_BYTES];
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            socket.set_nodelay(true).unwrap();
            let chunk = chunk.clone();
            tokio::spawn(async move {
                for _ in 0..BLOCKS {
                    socket.write_all(&chunk).await.unwrap();
                }
            });
        }
    });
    addr
}

async fn tcp_copy(from: SocketAddr) -> u64 {
    let mut socket = tokio::net::TcpStream::connect(from).await.unwrap();
    let mut buffer = vec![0u8; 1 << 20];
    let mut read = 0u64;
    while read < TOTAL {
        read += socket.read(&mut buffer).await.unwrap() as u64;
    }
    read
}

/// Fetches `blocks` leased on `prefill` with `transfer` `ROUNDS` times (after a first,
/// warming round), checking each came over `transport`.
async fn fetch_rounds(
    prefill: &Sidecar,
    transfer: &Transfer,
    blocks: &[Block],
    transport: Transport,
) -> Vec<Duration> {
    let mut lender = BlockClient::new(&format!("http://{}", prefill.grpc_addr)).unwrap();
    let hashes: Vec<SeqHash> = blocks.iter().map(|b| b.hash).collect();
    let mut times = Vec::new();
    for round in 0..ROUNDS + 1 {
        let lease = format!("{}-{round}", transport.as_str());
        let reply = lender.lend(&lease, blocks.to_vec()).await.unwrap();
        assert_eq!(reply.lent, blocks.len() as u64, "{:?}", reply.refused);
        let started = Instant::now();
        let (fetched, how) = transfer
            .fetch(prefill.grpc_addr, &lease, &hashes)
            .await
            .unwrap();
        let took = started.elapsed();
        assert_eq!((fetched.len(), how), (blocks.len(), transport));
        if round > 0 {
            times.push(took);
        }
    }
    times
}

fn report(name: &str, times: Vec<Duration>) {
    report_bytes(name, times, TOTAL);
}

fn report_bytes(name: &str, mut times: Vec<Duration>, bytes: u64) {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    let (p50, p99) = (at(0.5), at(0.99));
    let gbps = bytes as f64 / p50.as_secs_f64() / 1e9;
    println!(
        "{name:<34} p50 {:>8.1} ms  p99 {:>8.1} ms  {gbps:>6.2} GB/s at p50",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
}

fn main() {
    // As the sidecar binary does.
    dynamo_sidecar::keep_freed_blocks();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let nixl_dir = std::env::var("NIXL_LIB_DIR").unwrap_or_else(|_| "none".into());
        let prefill = prefill_sidecar(&nixl_dir).await;
        let source = blocks();
        let hashes: Vec<SeqHash> = source.iter().map(|b| b.hash).collect();
        let mut lender = BlockClient::new(&format!("http://{}", prefill.grpc_addr)).unwrap();
        let transfer = Transfer::new(Duration::from_secs(60), None);
        let tcp = tcp_source().await;
        let (mut grpc_times, mut tcp_times) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS + 1 {
            let lease = format!("bench-{round}");
            let reply = lender.lend(&lease, source.clone()).await.unwrap();
            assert_eq!(reply.lent, BLOCKS, "{:?}", reply.refused);
            let started = Instant::now();
            let (fetched, _) = transfer
                .fetch(prefill.grpc_addr, &lease, &hashes)
                .await
                .unwrap();
            let took = started.elapsed();
            assert_eq!(fetched.len() as u64, BLOCKS);
            let started = Instant::now();
            assert_eq!(tcp_copy(tcp).await, TOTAL);
            let plain = started.elapsed();
            // The first round warms the connections up.
            if round > 0 {
                grpc_times.push(took);
                tcp_times.push(plain);
            }
        }
        println!(
            "KV transfer of {BLOCKS} blocks x {} MiB ({} MiB), {ROUNDS} rounds",
            BLOCK_BYTES >> 20,
            TOTAL >> 20
        );
        report("sidecar -> sidecar (gRPC, leased)", grpc_times);
        report("plain TCP copy", tcp_times);

        let Some(agent) = dynamo_sidecar::nixl::start(Some(std::path::Path::new(&nixl_dir))) else {
            println!("NIXL not loaded (set NIXL_LIB_DIR): no NIXL figure");
            return;
        };
        let few = &source[..NIXL_BLOCKS];
        let bytes = (NIXL_BLOCKS * BLOCK_BYTES) as u64;
        let over_nixl =
            Transfer::new(Duration::from_secs(60), None).with_nixl(Some(agent), 2 << 30);
        let nixl_times = fetch_rounds(&prefill, &over_nixl, few, Transport::Nixl).await;
        let grpc_times = fetch_rounds(&prefill, &transfer, few, Transport::Grpc).await;
        println!(
            "KV transfer of {NIXL_BLOCKS} blocks x {} MiB ({} MiB), {ROUNDS} rounds",
            BLOCK_BYTES >> 20,
            bytes >> 20
        );
        report_bytes("sidecar -> sidecar (NIXL, UCX)", nixl_times, bytes);
        report_bytes("sidecar -> sidecar (gRPC)", grpc_times, bytes);
    });
}
