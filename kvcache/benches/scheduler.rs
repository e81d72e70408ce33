//! One routing decision for a 4k-token prompt (64 blocks of 64 tokens) over 64 pods.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use dynamo_kvcache::{
    BlockHasher, KvEvent, KvIndex, SchedulerConfig, StoredBlock, Tier, WorkerId, WorkerLoad,
    pick_by_cost,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;

fn decision(c: &mut Criterion) {
    let hasher = BlockHasher::new(64, "bench-model", None);
    let tokens: Vec<u32> = (0..4096u32)
        .map(|t| t.wrapping_mul(2_654_435_761))
        .collect();
    let prompt = hasher.seq_hashes(&tokens);
    assert_eq!(prompt.len(), 64);

    // Pod i caches the first i blocks; loads vary so no two costs are trivially equal.
    let mut index = KvIndex::default();
    let mut loads = Vec::new();
    for pod in 0..64u64 {
        let blocks = prompt[..pod as usize]
            .iter()
            .map(|&seq_hash| StoredBlock {
                seq_hash,
                engine_hash: seq_hash.0,
                tier: if pod % 3 == 0 { Tier::Host } else { Tier::Gpu },
            })
            .collect();
        index
            .apply(
                WorkerId(pod),
                &KvEvent::Stored {
                    parent: None,
                    blocks,
                },
            )
            .unwrap();
        loads.push(WorkerLoad {
            worker: WorkerId(pod),
            prefill_blocks: (pod * 37) % 50,
            decode_blocks: (pod * 101) % 400,
            shared_prefix_blocks: 0,
        });
    }
    let config = SchedulerConfig::default();
    let sampled = SchedulerConfig {
        temperature: 0.5,
        ..config
    };
    let mut rng = SmallRng::seed_from_u64(1);
    let scores = index.find_matches(&prompt);

    let mut group = c.benchmark_group("scheduler/4k_tokens_64_pods");
    group.bench_function("pick", |b| {
        b.iter(|| pick_by_cost(black_box(&scores), &loads, 64, &config, &mut rng).unwrap())
    });
    group.bench_function("pick_softmax", |b| {
        b.iter(|| pick_by_cost(black_box(&scores), &loads, 64, &sampled, &mut rng).unwrap())
    });
    group.bench_function("hash_only", |b| {
        b.iter(|| hasher.seq_hashes(black_box(&tokens)))
    });
    group.bench_function("hash_match_pick", |b| {
        b.iter(|| {
            let prompt = hasher.seq_hashes(black_box(&tokens));
            let scores = index.find_matches(&prompt);
            pick_by_cost(&scores, &loads, prompt.len() as u64, &config, &mut rng).unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, decision);
criterion_main!(benches);
