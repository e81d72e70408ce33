//! Exact index: event apply rate and `find_matches` over a 512-block prompt.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dynamo_kvcache::{KvEvent, KvIndex, RemovedBlock, SeqHash, StoredBlock, Tier, WorkerId};

fn stored(parent: Option<SeqHash>, hashes: &[SeqHash], tier: Tier) -> KvEvent {
    KvEvent::Stored {
        parent,
        blocks: hashes
            .iter()
            .map(|&seq_hash| StoredBlock {
                seq_hash,
                engine_hash: seq_hash.0,
                tier,
            })
            .collect(),
    }
}

/// A deterministic hash for (document, block), chained like real sequence hashes.
fn doc_hashes(doc: u64, len: usize) -> Vec<SeqHash> {
    (0..len as u64)
        .map(|i| SeqHash((doc << 20 | i).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1))
        .collect()
}

/// Events that store, then remove, chains on 64 pods: 32 shared 16-block documents,
/// each followed by a pod-private 4-block tail, stored in pieces of 1 to 8 blocks the
/// way an engine reports them during prefill and decode. Applying all of them leaves
/// the index empty, so one index serves every iteration.
fn event_cycle() -> Vec<(WorkerId, KvEvent)> {
    let mut stores = Vec::new();
    let mut removes = Vec::new();
    for round in 0..64u64 {
        for pod in 0..64u64 {
            let doc = (pod * 7 + round) % 32;
            let mut chain = doc_hashes(doc, 16);
            chain.extend(doc_hashes(1_000 + round * 64 + pod, 4));
            let mut parent = None;
            let mut at = 0;
            for piece in [8usize, 4, 4, 1, 1, 1, 1] {
                let part = &chain[at..at + piece];
                stores.push((WorkerId(pod), stored(parent, part, Tier::Gpu)));
                parent = part.last().copied();
                at += piece;
            }
            removes.push((
                WorkerId(pod),
                KvEvent::Removed {
                    blocks: chain
                        .iter()
                        .rev()
                        .map(|&seq_hash| RemovedBlock {
                            seq_hash,
                            engine_hash: seq_hash.0,
                        })
                        .collect(),
                    tier: Tier::Gpu,
                },
            ));
        }
    }
    stores.extend(removes);
    stores
}

fn apply_events(c: &mut Criterion) {
    let events = event_cycle();
    let blocks: usize = events
        .iter()
        .map(|(_, e)| match e {
            KvEvent::Stored { blocks, .. } => blocks.len(),
            KvEvent::Removed { blocks, .. } => blocks.len(),
            KvEvent::Cleared => 0,
        })
        .sum();
    let mut index = KvIndex::default();
    let mut group = c.benchmark_group("index/apply");
    group.throughput(Throughput::Elements(events.len() as u64));
    group.bench_function(
        format!("{}_events_{}_blocks_64_pods", events.len(), blocks),
        |b| {
            b.iter(|| {
                for (pod, e) in &events {
                    index.apply(*pod, e).unwrap();
                }
            })
        },
    );
    group.finish();
    assert!(index.is_empty());
}

/// `pods` pods hold staggered prefixes of one 512-block prompt (pod i holds the first
/// ceil(512*(i+1)/pods) blocks), every fourth pod with the second half of its prefix in host
/// memory: the set of matching pods shrinks all along the prompt and tiers are mixed.
fn staggered(pods: u64) -> (KvIndex, Vec<SeqHash>) {
    let prompt = doc_hashes(1, 512);
    let mut index = KvIndex::default();
    for pod in 0..pods {
        let len = (512 * (pod + 1)).div_ceil(pods) as usize;
        let (gpu, rest) = if pod % 4 == 0 {
            prompt[..len].split_at(len / 2)
        } else {
            (&prompt[..len], &[][..])
        };
        index
            .apply(WorkerId(pod), &stored(None, gpu, Tier::Gpu))
            .unwrap();
        if !rest.is_empty() {
            index
                .apply(
                    WorkerId(pod),
                    &stored(gpu.last().copied(), rest, Tier::Host),
                )
                .unwrap();
        }
        // Unrelated blocks, so the map is not tiny.
        index
            .apply(
                WorkerId(pod),
                &stored(None, &doc_hashes(100 + pod, 256), Tier::Gpu),
            )
            .unwrap();
    }
    (index, prompt)
}

/// Every pod holds the whole prompt on GPU (a shared system prompt): the fast path.
fn shared(pods: u64) -> (KvIndex, Vec<SeqHash>) {
    let prompt = doc_hashes(1, 512);
    let mut index = KvIndex::default();
    for pod in 0..pods {
        index
            .apply(WorkerId(pod), &stored(None, &prompt, Tier::Gpu))
            .unwrap();
    }
    (index, prompt)
}

fn find_matches(c: &mut Criterion) {
    let mut group = c.benchmark_group("index/find_matches_512_blocks");
    for pods in [64u64, 1024] {
        for (layout, (index, prompt)) in [("staggered", staggered(pods)), ("shared", shared(pods))]
        {
            let scores = index.find_matches(&prompt);
            assert_eq!(scores.len(), pods as usize);
            group.bench_with_input(
                BenchmarkId::new(layout, format!("{pods}_pods")),
                &prompt,
                |b, prompt| b.iter(|| black_box(index.find_matches(black_box(prompt)))),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, apply_events, find_matches);
criterion_main!(benches);
