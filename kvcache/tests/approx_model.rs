//! The approximate index against a model that remembers every record: with room to spare
//! it must agree exactly (TTL respected); under a small bound it stays within the bound
//! and never reports more than the model.

use std::collections::HashMap;
use std::time::Duration;

use dynamo_kvcache::{ApproxConfig, ApproxIndex, SeqHash, WorkerId};
use proptest::prelude::*;

const TTL: Duration = Duration::from_secs(10);

/// Prompts are prefixes of a few fixed chains of hashes.
fn prompt(chain: u64, len: usize) -> Vec<SeqHash> {
    (0..len as u64)
        .map(|i| SeqHash(chain * 100 + i + 1))
        .collect()
}

#[derive(Clone, Debug)]
struct Record {
    pod: u64,
    chain: u64,
    len: usize,
    /// Seconds after the previous record.
    gap: u64,
}

fn record() -> impl Strategy<Value = Record> {
    (0..4u64, 0..3u64, 1..8usize, 0..6u64).prop_map(|(pod, chain, len, gap)| Record {
        pod,
        chain,
        len,
        gap,
    })
}

fn model_depth(
    seen: &HashMap<(WorkerId, SeqHash), Duration>,
    pod: WorkerId,
    prompt: &[SeqHash],
    now: Duration,
) -> u32 {
    prompt
        .iter()
        .take_while(|h| seen.get(&(pod, **h)).is_some_and(|&t| now < t + TTL))
        .count() as u32
}

proptest! {
    #[test]
    fn approx_index_respects_ttl_and_bound(
        records in prop::collection::vec(record(), 1..60),
        max_entries in prop::sample::select(vec![3usize, 10, 1_000]),
    ) {
        let mut index = ApproxIndex::new(ApproxConfig { ttl: TTL, max_entries });
        let mut seen: HashMap<(WorkerId, SeqHash), Duration> = HashMap::new();
        let mut now = Duration::ZERO;
        for r in &records {
            now += Duration::from_secs(r.gap);
            let p = prompt(r.chain, r.len);
            index.record(WorkerId(r.pod), &p, now);
            for h in &p {
                seen.insert((WorkerId(r.pod), *h), now);
            }
            prop_assert!(index.len() <= max_entries);
            // Look a little into the future too, to cross TTL edges.
            for later in [now, now + Duration::from_secs(5), now + TTL] {
                for chain in 0..3 {
                    let q = prompt(chain, 8);
                    let got = index.find_matches(&q, later);
                    for pod in (0..4).map(WorkerId) {
                        let want = model_depth(&seen, pod, &q, later);
                        let have = got.get(pod).total();
                        if max_entries >= 1_000 {
                            prop_assert_eq!(have, want, "pod {} chain {} at {:?}", pod, chain, later);
                        } else {
                            prop_assert!(have <= want);
                        }
                    }
                }
            }
        }
    }
}
