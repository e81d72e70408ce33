//! Replays the Mooncake-style synthetic trace through the picker's routing step
//! (`RoutingCore`): for each request the overlap, a pick over 16 workers with its load
//! accounting, then the KV events the chosen worker would send (its new blocks stored,
//! its least recently used blocks evicted past a per-worker capacity).
//! One op = one request routed, events included (applied to the exact index in `kv`
//! mode only; `approx` learns from its own decisions instead). Before the criterion runs,
//! one pass per mode times each decision (overlap + pick + bookkeeping, what the picker
//! does under its lock and before it) and each event applied on its own and prints their
//! p50 and p99.
//!
//! Trace format, one JSON object per line: `timestamp` (ms), `input_length`,
//! `output_length`, `hash_ids` (ids of 512-token blocks, equal ids = equal prefix block).
//! The file lives beside the repository (`../shared/data/`); without it the bench says
//! so and measures nothing.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dynamo_kvcache::{
    ApproxConfig, BlockHasher, KvEvent, KvIndex, LocalHash, RemovedBlock, RequestId, RouterMode,
    RoutingCore, SchedulerConfig, SeqHash, Side, StoredBlock, Tier, WorkerId,
};
use serde::Deserialize;

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/data/mooncake_synthetic_trace.jsonl"
);
const WORKERS: u64 = 16;
/// Blocks of 512 tokens each worker keeps (1M tokens), below the trace's ~44k distinct
/// blocks in all, so routing decides the hit rate.
const CAPACITY: usize = 2048;
/// Requests in prefill, then in decode, at once: a crude stand-in for time.
const PREFILL_WINDOW: usize = 16;
const DECODE_WINDOW: usize = 64;

#[derive(Deserialize)]
struct Line {
    timestamp: u64,
    #[allow(dead_code)]
    input_length: u64,
    #[allow(dead_code)]
    output_length: u64,
    hash_ids: Vec<u64>,
}

struct Request {
    at: Duration,
    prompt: Vec<SeqHash>,
}

fn load_trace() -> Option<Vec<Request>> {
    let text = match std::fs::read_to_string(TRACE) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("trace_replay: skipped, cannot read {TRACE}: {e}");
            return None;
        }
    };
    let hasher = BlockHasher::unsalted(512);
    let requests = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let line: Line = serde_json::from_str(l).expect("trace line is JSON");
            let mut parent = None;
            let prompt = line
                .hash_ids
                .iter()
                .map(|&id| {
                    // The id stands for the block's tokens; chain it like real blocks.
                    let local = LocalHash(hasher.local_hash(&[id as u32, (id >> 32) as u32]).0);
                    let seq = hasher.chain(parent, local);
                    parent = Some(seq);
                    seq
                })
                .collect();
            Request {
                at: Duration::from_millis(line.timestamp),
                prompt,
            }
        })
        .collect();
    Some(requests)
}

/// A worker's GPU cache: LRU over blocks, where each request touches its blocks last to
/// first, as vLLM frees a finished request's blocks tail first: a prompt's tail is
/// evicted before its head, as in a real engine.
#[derive(Default)]
struct WorkerCache {
    /// (block, stamp) in touch order; an item whose stamp is not the block's latest is stale.
    order: VecDeque<(SeqHash, u64)>,
    held: HashMap<SeqHash, u64>,
    stamp: u64,
}

impl WorkerCache {
    fn touch(&mut self, prompt: &[SeqHash]) {
        for &h in prompt.iter().rev() {
            self.stamp += 1;
            self.held.insert(h, self.stamp);
            self.order.push_back((h, self.stamp));
        }
    }

    fn evict(&mut self) -> Vec<RemovedBlock> {
        let mut evicted = Vec::new();
        while self.held.len() > CAPACITY {
            let (h, stamp) = self.order.pop_front().expect("held blocks are queued");
            if self.held.get(&h) == Some(&stamp) {
                self.held.remove(&h);
                evicted.push(RemovedBlock {
                    seq_hash: h,
                    engine_hash: h.0,
                });
            }
        }
        evicted
    }
}

#[derive(Default, Debug)]
struct Stats {
    requests: u64,
    prompt_blocks: u64,
    hit_blocks: u64,
    events: u64,
}

/// Durations of single operations, when a pass measures them.
#[derive(Default)]
struct OpTimes {
    decisions: Vec<Duration>,
    applies: Vec<Duration>,
}

/// Runs `op`, adding its duration to `into` when there is one.
fn timed<T>(into: Option<&mut Vec<Duration>>, op: impl FnOnce() -> T) -> T {
    match into {
        Some(times) => {
            let start = Instant::now();
            let out = op();
            times.push(start.elapsed());
            out
        }
        None => op(),
    }
}

fn replay(mode: RouterMode, trace: &[Request], mut times: Option<&mut OpTimes>) -> Stats {
    let mut index = KvIndex::default();
    let mut core = RoutingCore::new(mode, SchedulerConfig::default(), ApproxConfig::default(), 7);
    let workers: Vec<WorkerId> = (0..WORKERS).map(WorkerId).collect();
    for &w in &workers {
        core.add_worker(w);
    }
    let mut caches: Vec<WorkerCache> = (0..WORKERS).map(|_| WorkerCache::default()).collect();
    let (mut prefilling, mut decoding) = (VecDeque::new(), VecDeque::new());
    let mut stats = Stats::default();

    for (i, req) in trace.iter().enumerate() {
        let prompt = &req.prompt;
        let id = RequestId(i as u64);
        let d = timed(times.as_mut().map(|t| &mut t.decisions), || {
            let scores = core.overlap(Side::Aggregated, prompt, req.at, |p| index.find_matches(p));
            core.pick(Side::Aggregated, &scores, &workers, id, prompt, req.at)
                .expect("workers exist and ids are fresh")
        });
        let worker = d.worker;
        let cache = &mut caches[worker.0 as usize];
        let hit = prompt
            .iter()
            .take_while(|h| cache.held.contains_key(h))
            .count();

        let new = &prompt[hit..];
        if !new.is_empty() {
            let event = KvEvent::Stored {
                parent: hit.checked_sub(1).map(|i| prompt[i]),
                blocks: new
                    .iter()
                    .map(|&seq_hash| StoredBlock {
                        seq_hash,
                        engine_hash: seq_hash.0,
                        tier: Tier::Gpu,
                    })
                    .collect(),
            };
            if mode == RouterMode::Kv {
                timed(times.as_mut().map(|t| &mut t.applies), || {
                    index.apply(worker, &event)
                })
                .expect("room");
            }
            stats.events += 1;
        }
        cache.touch(prompt);
        let evicted = cache.evict();
        if !evicted.is_empty() {
            let event = KvEvent::Removed {
                blocks: evicted,
                tier: Tier::Gpu,
            };
            if mode == RouterMode::Kv {
                timed(times.as_mut().map(|t| &mut t.applies), || {
                    index.apply(worker, &event)
                })
                .expect("removal");
            }
            stats.events += 1;
        }
        prefilling.push_back(id);
        if prefilling.len() > PREFILL_WINDOW {
            let id = prefilling.pop_front().expect("non-empty");
            core.first_token(id);
            decoding.push_back(id);
        }
        if decoding.len() > DECODE_WINDOW {
            core.finished(decoding.pop_front().expect("non-empty"));
        }
        stats.requests += 1;
        stats.prompt_blocks += prompt.len() as u64;
        stats.hit_blocks += hit as u64;
    }
    stats
}

fn trace_replay(c: &mut Criterion) {
    let Some(trace) = load_trace() else {
        return;
    };
    for mode in RouterMode::ALL {
        let mut times = OpTimes::default();
        let s = replay(mode, &trace, Some(&mut times));
        eprintln!(
            "trace_replay {mode:>11}: {} requests, {} events, cache hit {:.1}% of {} prompt blocks; \
             decision p50 {} p99 {}; event apply p50 {} p99 {}",
            s.requests,
            s.events,
            100.0 * s.hit_blocks as f64 / s.prompt_blocks as f64,
            s.prompt_blocks,
            percentile(&mut times.decisions, 0.50),
            percentile(&mut times.decisions, 0.99),
            percentile(&mut times.applies, 0.50),
            percentile(&mut times.applies, 0.99),
        );
    }
    let mut group = c.benchmark_group("trace_replay");
    group.sample_size(10);
    group.throughput(Throughput::Elements(trace.len() as u64));
    for mode in [RouterMode::Kv, RouterMode::Approx] {
        group.bench_function(format!("{mode}_{WORKERS}_workers"), |b| {
            b.iter(|| replay(mode, &trace, None))
        });
    }
    group.finish();
}

/// Nearest-rank percentile, formatted; `-` when nothing was timed.
fn percentile(times: &mut [Duration], q: f64) -> String {
    if times.is_empty() {
        return "-".into();
    }
    times.sort_unstable();
    let rank = ((q * times.len() as f64).ceil() as usize).clamp(1, times.len());
    format!("{:.1} µs", times[rank - 1].as_secs_f64() * 1e6)
}

criterion_group!(benches, trace_replay);
criterion_main!(benches);
