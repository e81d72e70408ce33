//! The exact index against a naive model: per pod, a map from block to the tiers it is
//! held in, matched by walking the prompt. Random sequences of events must give the same
//! `find_matches` answers, and a pod's snapshot must rebuild the same answers.

use std::collections::HashMap;

use dynamo_kvcache::{
    KvEvent, KvIndex, OverlapScores, RemovedBlock, SeqHash, StoredBlock, Tier, TierCounts, WorkerId,
};
use proptest::prelude::*;

/// A fixed forest of blocks: block `k`'s parent is `PARENTS[k]` (`None`: a root). Hash of
/// block k is `k + 1`, so hashes are unique and the chain is consistent.
const BLOCKS: usize = 24;
const PARENTS: [Option<usize>; BLOCKS] = [
    None,
    Some(0),
    Some(1),
    Some(2),
    Some(1),
    Some(4),
    Some(0),
    None,
    Some(7),
    Some(8),
    Some(9),
    Some(8),
    Some(3),
    Some(12),
    Some(13),
    Some(5),
    Some(15),
    None,
    Some(17),
    Some(18),
    Some(19),
    Some(20),
    Some(2),
    Some(22),
];
const PODS: u64 = 4;

fn hash(k: usize) -> SeqHash {
    SeqHash(k as u64 + 1)
}

/// Block indices from a root down to `k`.
fn path(k: usize) -> Vec<usize> {
    let mut p = vec![k];
    while let Some(parent) = PARENTS[*p.last().unwrap()] {
        p.push(parent);
    }
    p.reverse();
    p
}

/// Every root-to-block prompt, plus each with an unknown block after it.
fn prompts() -> Vec<Vec<SeqHash>> {
    let mut all = Vec::new();
    for k in 0..BLOCKS {
        let p: Vec<SeqHash> = path(k).into_iter().map(hash).collect();
        let mut longer = p.clone();
        longer.push(SeqHash(10_000 + k as u64));
        all.push(p);
        all.push(longer);
    }
    all
}

#[derive(Clone, Debug)]
enum Op {
    /// Store the path to `block` from its `skip`-th block on, in `tier`.
    Store {
        pod: u64,
        block: usize,
        skip: usize,
        tier: Tier,
    },
    Remove {
        pod: u64,
        blocks: Vec<usize>,
        tier: Tier,
    },
    Clear {
        pod: u64,
    },
    RemovePod {
        pod: u64,
    },
}

fn tier() -> impl Strategy<Value = Tier> {
    prop::sample::select(Tier::ALL.to_vec())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..PODS, 0..BLOCKS, 0..4usize, tier())
            .prop_map(|(pod, block, skip, tier)| Op::Store { pod, block, skip, tier }),
        4 => (0..PODS, prop::collection::vec(0..BLOCKS, 1..4), tier())
            .prop_map(|(pod, blocks, tier)| Op::Remove { pod, blocks, tier }),
        1 => (0..PODS).prop_map(|pod| Op::Clear { pod }),
        1 => (0..PODS).prop_map(|pod| Op::RemovePod { pod }),
    ]
}

/// The event an op sends, if it is one (removing a pod is a call, not an event).
fn event(op: &Op) -> Option<(WorkerId, KvEvent)> {
    match op {
        Op::Store {
            pod,
            block,
            skip,
            tier,
        } => {
            let p = path(*block);
            let skip = (*skip).min(p.len() - 1);
            let blocks = p[skip..]
                .iter()
                .map(|&k| StoredBlock {
                    seq_hash: hash(k),
                    engine_hash: k as u64 * 7,
                    tier: *tier,
                })
                .collect();
            let parent = skip.checked_sub(1).map(|i| hash(p[i]));
            Some((WorkerId(*pod), KvEvent::Stored { parent, blocks }))
        }
        Op::Remove { pod, blocks, tier } => {
            let blocks = blocks
                .iter()
                .map(|&k| RemovedBlock {
                    seq_hash: hash(k),
                    engine_hash: k as u64 * 7,
                })
                .collect();
            Some((
                WorkerId(*pod),
                KvEvent::Removed {
                    blocks,
                    tier: *tier,
                },
            ))
        }
        Op::Clear { pod } => Some((WorkerId(*pod), KvEvent::Cleared)),
        Op::RemovePod { .. } => None,
    }
}

/// The reference: per pod, per block, a bit set of tiers.
#[derive(Default)]
struct Model {
    pods: HashMap<WorkerId, HashMap<SeqHash, u8>>,
}

impl Model {
    fn apply(&mut self, op: &Op) {
        if let Op::RemovePod { pod } = op {
            self.pods.remove(&WorkerId(*pod));
            return;
        }
        let (pod, event) = event(op).unwrap();
        let blocks = self.pods.entry(pod).or_default();
        match event {
            KvEvent::Stored { blocks: stored, .. } => {
                for b in stored {
                    *blocks.entry(b.seq_hash).or_default() |= 1 << b.tier.index();
                }
            }
            KvEvent::Removed { blocks: gone, tier } => {
                for b in gone {
                    if let Some(t) = blocks.get_mut(&b.seq_hash) {
                        *t &= !(1 << tier.index());
                        if *t == 0 {
                            blocks.remove(&b.seq_hash);
                        }
                    }
                }
            }
            KvEvent::Cleared => blocks.clear(),
        }
    }

    fn find_matches(&self, prompt: &[SeqHash]) -> OverlapScores {
        let mut out = Vec::new();
        for (&pod, blocks) in &self.pods {
            let mut counts = TierCounts::default();
            for h in prompt {
                let Some(&tiers) = blocks.get(h) else { break };
                counts.add(Tier::ALL[tiers.trailing_zeros() as usize], 1);
            }
            if counts.total() > 0 {
                out.push((pod, counts));
            }
        }
        OverlapScores::from_entries(out)
    }
}

fn apply(index: &mut KvIndex, op: &Op) {
    match event(op) {
        Some((pod, e)) => index.apply(pod, &e).unwrap(),
        None => {
            let Op::RemovePod { pod } = op else {
                unreachable!()
            };
            index.remove_worker(WorkerId(*pod));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn index_agrees_with_the_naive_model(ops in prop::collection::vec(op(), 1..80)) {
        let mut index = KvIndex::default();
        let mut model = Model::default();
        for op in &ops {
            apply(&mut index, op);
            model.apply(op);
            for prompt in prompts() {
                prop_assert_eq!(index.find_matches(&prompt), model.find_matches(&prompt));
            }
        }
        for (pod, blocks) in &model.pods {
            prop_assert_eq!(index.worker_blocks(*pod), blocks.len());
        }
    }

    #[test]
    fn snapshots_rebuild_the_same_answers(ops in prop::collection::vec(op(), 1..80)) {
        let mut index = KvIndex::default();
        for op in &ops {
            apply(&mut index, op);
        }
        let mut rebuilt = KvIndex::default();
        let mut pods: Vec<WorkerId> = index.workers().collect();
        pods.sort();
        for pod in pods {
            for e in index.snapshot(pod) {
                // Parents come first: every chain starts under a block the pod does not
                // hold, or at a root.
                if let KvEvent::Stored { parent: Some(p), .. } = &e {
                    prop_assert!(
                        rebuilt.tiers_of(pod, *p).is_empty() == index.tiers_of(pod, *p).is_empty()
                    );
                }
                rebuilt.apply(pod, &e).unwrap();
            }
            prop_assert_eq!(rebuilt.worker_blocks(pod), index.worker_blocks(pod));
        }
        for prompt in prompts() {
            prop_assert_eq!(rebuilt.find_matches(&prompt), index.find_matches(&prompt));
        }
    }

    #[test]
    fn the_node_bound_holds_and_only_under_reports(
        ops in prop::collection::vec(op(), 1..80),
        max_nodes in 1usize..12,
    ) {
        let mut index = KvIndex::new(max_nodes);
        let mut model = Model::default();
        for op in &ops {
            match event(op) {
                Some((pod, e)) => {
                    // Full is an expected answer here.
                    let _ = index.apply(pod, &e);
                }
                None => apply(&mut index, op),
            }
            model.apply(op);
            prop_assert!(index.len() <= max_nodes);
            for prompt in prompts() {
                let exact = model.find_matches(&prompt);
                for (pod, counts) in index.find_matches(&prompt).iter() {
                    prop_assert!(counts.total() <= exact.get(pod).total());
                }
            }
        }
    }
}
