//! Engine throughput on simulated time at speedup 1000: steps/s of a full decode batch,
//! and small requests/s from submission to completion (target: >= 2,000 on one core).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dynamo_mocker::{Engine, EngineConfig, Request};

fn config() -> EngineConfig {
    EngineConfig {
        speedup_ratio: 1000.0,
        ..EngineConfig::default()
    }
}

fn prompt(id: u64, len: usize) -> Vec<u32> {
    (0..len as u64)
        .map(|i| ((id * 7919 + i) % 32000) as u32)
        .collect()
}

fn decode_steps(c: &mut Criterion) {
    let mut e = Engine::simulated(config()).unwrap();
    e.set_emit_kv_events(false);
    let mut next_id = 0u64;
    let mut refill = |e: &mut Engine| {
        while e.metrics().num_requests_running + e.metrics().num_requests_waiting < 256 {
            let r = Request {
                id: next_id,
                token_ids: prompt(next_id, 128),
                max_tokens: 1000,
                seed: None,
                pin_ttl: None,
            };
            e.submit(r).unwrap();
            next_id += 1;
        }
    };
    refill(&mut e);
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(1));
    g.bench_function("step_256_running", |b| {
        b.iter(|| {
            let o = e.step();
            if !o.finished.is_empty() {
                refill(&mut e);
            }
            black_box(o.outputs.len())
        })
    });
    g.finish();
}

fn small_requests(c: &mut Criterion) {
    const N: u64 = 1000;
    // Simulated capacity, for the record: how long the modelled GPU takes for N.
    let mut e = Engine::simulated(config()).unwrap();
    for id in 0..N {
        let token_ids = prompt(id + 1_000_000, 128);
        e.submit(Request {
            id,
            token_ids,
            max_tokens: 16,
            seed: None,
            pin_ttl: None,
        })
        .unwrap();
    }
    let mut end = 0.0;
    while e.has_work() {
        end = e.step().ended_ms();
    }
    println!(
        "{N} small requests take {end:.1} simulated ms at speedup 1000 ({:.0} req/s simulated)",
        N as f64 * 1000.0 / end
    );

    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(N));
    g.sample_size(20);
    let mut base = 0u64;
    g.bench_function("small_requests_128in_16out", |b| {
        b.iter(|| {
            let mut e = Engine::simulated(config()).unwrap();
            for id in base..base + N {
                let r = Request {
                    id,
                    token_ids: prompt(id, 128),
                    max_tokens: 16,
                    seed: None,
                    pin_ttl: None,
                };
                e.submit(r).unwrap();
            }
            base += N;
            let mut events = 0;
            while e.has_work() {
                events += e.step().kv_events.len();
            }
            black_box(events)
        })
    });
    g.finish();
}

criterion_group!(benches, decode_steps, small_requests);
criterion_main!(benches);
