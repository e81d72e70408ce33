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
//! blocks by NIXL READ (UCX; `Describe`, read, checks, end of lease) against gRPC, with
//! the CPU time each side spent per GB moved.
//!
//! The prefill sidecar is the `dynamo-sidecar` binary in a process of its own, as
//! deployed; this process is the decode side (its `Transfer`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dynamo_kvblocks::{Block, BlockClient, Layout};
use dynamo_kvcache::SeqHash;
use dynamo_sidecar::disagg::transfer::{Transfer, Transport};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
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

/// The prefill sidecar: the binary, killed when dropped.
struct Prefill {
    child: Child,
    grpc_addr: SocketAddr,
}

impl Drop for Prefill {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prefill {
    fn start(nixl: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dynamo-sidecar"))
            .args(["--nixl-lib-dir", nixl, "--listen", "127.0.0.1:0"])
            .args([
                "--host",
                "127.0.0.1",
                "--grpc-port",
                "0",
                "--metrics-port",
                "0",
            ])
            .args(["--engine-kv-events", "none", "--kv-region-dir", "none"])
            .args(["--kv-lease-bytes", "2GiB", "--model-name", "m"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .spawn()
            .expect("the dynamo-sidecar binary starts");
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let line = lines
            .by_ref()
            .map_while(Result::ok)
            .find(|l| l.contains("dynamo-sidecar serving"))
            .expect("the sidecar logs its ports");
        // Keeps reading, so the sidecar never blocks on a full pipe.
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        let grpc: String = line
            .split("grpc=")
            .nth(1)
            .expect("grpc=")
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
            .collect();
        Self {
            grpc_addr: grpc.parse().unwrap(),
            child,
        }
    }

    /// CPU seconds the prefill process spent so far (user and system).
    fn cpu(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // After the command's name in parentheses: utime and stime are fields 14, 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }
}

/// CPU seconds this (the decode) process spent so far.
fn own_cpu() -> f64 {
    // SAFETY: getrusage writes the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
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
/// warming round), checking each came over `transport`; with the CPU seconds the
/// fetches took in the decode and the prefill process.
async fn fetch_rounds(
    prefill: &Prefill,
    transfer: &Transfer,
    blocks: &[Block],
    transport: Transport,
) -> (Vec<Duration>, (f64, f64)) {
    let mut lender = BlockClient::new(&format!("http://{}", prefill.grpc_addr)).unwrap();
    let hashes: Vec<SeqHash> = blocks.iter().map(|b| b.hash).collect();
    let (mut times, mut cpu) = (Vec::new(), (0.0, 0.0));
    for round in 0..ROUNDS + 1 {
        let lease = format!("{}-{round}", transport.as_str());
        let reply = lender.lend(&lease, blocks.to_vec()).await.unwrap();
        assert_eq!(reply.lent, blocks.len() as u64, "{:?}", reply.refused);
        let (decode_cpu, prefill_cpu) = (own_cpu(), prefill.cpu());
        let started = Instant::now();
        let (fetched, how) = transfer
            .fetch(prefill.grpc_addr, &lease, &hashes)
            .await
            .unwrap();
        let took = started.elapsed();
        assert_eq!((fetched.len(), how), (blocks.len(), transport));
        // The read's slot goes back to the arena, as once the engine took the blocks.
        drop(fetched);
        if round > 0 {
            times.push(took);
            cpu.0 += own_cpu() - decode_cpu;
            cpu.1 += prefill.cpu() - prefill_cpu;
        }
    }
    (times, cpu)
}

/// CPU seconds per GB moved, decode and prefill side.
fn report_cpu((decode, prefill): (f64, f64), bytes: u64) {
    let gb = (bytes * ROUNDS as u64) as f64 / 1e9;
    println!(
        "{:<34} decode {:.3} s/GB  prefill {:.3} s/GB",
        "  CPU",
        decode / gb,
        prefill / gb
    );
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
        let prefill = Prefill::start(&nixl_dir);
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

        let Some(agent) =
            dynamo_sidecar::nixl::start(Some(std::path::Path::new(&nixl_dir)), 2 << 30)
        else {
            println!("NIXL not loaded (set NIXL_LIB_DIR): no NIXL figure");
            return;
        };
        let few = &source[..NIXL_BLOCKS];
        let bytes = (NIXL_BLOCKS * BLOCK_BYTES) as u64;
        let over_nixl =
            Transfer::new(Duration::from_secs(60), None).with_nixl(Some(agent), 2 << 30);
        let (nixl_times, nixl_cpu) = fetch_rounds(&prefill, &over_nixl, few, Transport::Nixl).await;
        let (grpc_times, grpc_cpu) = fetch_rounds(&prefill, &transfer, few, Transport::Grpc).await;
        println!(
            "KV transfer of {NIXL_BLOCKS} blocks x {} MiB ({} MiB), {ROUNDS} rounds",
            BLOCK_BYTES >> 20,
            bytes >> 20
        );
        report_bytes("sidecar -> sidecar (NIXL, UCX)", nixl_times, bytes);
        report_cpu(nixl_cpu, bytes);
        report_bytes("sidecar -> sidecar (gRPC)", grpc_times, bytes);
        report_cpu(grpc_cpu, bytes);
    });
}
