//! Approximate index for engines that publish no KV events.
//!
//! The router assumes that a pod it sent a prompt to now caches that prompt's blocks, and
//! forgets the assumption after a TTL, because the engine evicts blocks it cannot report.
//! Time is passed in (a monotonic `Duration` since any origin the caller picks), so the
//! index never reads a clock and tests are deterministic.

use std::collections::VecDeque;
use std::time::Duration;

use crate::fast_map::FastMap;
use crate::{OverlapScores, SeqHash, Tier, TierCounts, WorkerId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApproxConfig {
    /// How long a recorded block is believed to stay cached.
    pub ttl: Duration,
    /// Most (pod, block) entries kept; the least recently recorded go first.
    pub max_entries: usize,
}

impl Default for ApproxConfig {
    /// 120 s and a million entries (~50 MB). The TTL is our choice: it spans the think
    /// time between turns of a chat, the main source of reuse, while a busy engine has
    /// likely recycled a block within a few minutes. Tune it to the engine's cache size.
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(120),
            max_entries: 1_000_000,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    worker: WorkerId,
    recorded_at: Duration,
    /// Position in the recency queue; an older queue item of this entry is stale.
    tick: u64,
}

/// (pod, block) pairs learnt from routing decisions, with TTL and LRU bounds.
#[derive(Debug)]
pub struct ApproxIndex {
    config: ApproxConfig,
    entries: FastMap<SeqHash, Vec<Entry>>,
    /// Recording order, oldest first; items whose tick no longer matches are stale.
    order: VecDeque<(u64, SeqHash, WorkerId)>,
    live: usize,
    next_tick: u64,
    /// Latest time seen; earlier times passed in are raised to it so order stays by time.
    now: Duration,
}

impl ApproxIndex {
    pub fn new(config: ApproxConfig) -> Self {
        Self {
            config,
            entries: FastMap::default(),
            order: VecDeque::new(),
            live: 0,
            next_tick: 0,
            now: Duration::ZERO,
        }
    }

    pub fn config(&self) -> ApproxConfig {
        self.config
    }

    /// Live (pod, block) entries, expired ones not yet purged included.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Remembers that `worker` was sent a prompt with these blocks at `now`.
    pub fn record(&mut self, worker: WorkerId, prompt: &[SeqHash], now: Duration) {
        let now = now.max(self.now);
        self.now = now;
        for &hash in prompt {
            let tick = self.next_tick;
            self.next_tick += 1;
            let list = self.entries.entry(hash).or_default();
            match list.iter_mut().find(|e| e.worker == worker) {
                Some(entry) => {
                    entry.recorded_at = now;
                    entry.tick = tick;
                }
                None => {
                    list.push(Entry {
                        worker,
                        recorded_at: now,
                        tick,
                    });
                    self.live += 1;
                }
            }
            self.order.push_back((tick, hash, worker));
        }
        self.expire(now);
        while self.live > self.config.max_entries {
            self.pop_oldest();
        }
        if self.order.len() > 2 * self.live + 1024 {
            self.compact();
        }
    }

    /// Drops every entry older than the TTL at `now`.
    pub fn expire(&mut self, now: Duration) {
        let now = now.max(self.now);
        self.now = now;
        while let Some(recorded_at) = self.oldest_recorded_at() {
            if !self.expired(recorded_at, now) {
                break;
            }
            self.pop_oldest();
        }
    }

    /// Forgets `worker` (pod gone). Scans every entry: pods leave rarely.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        let mut removed = 0;
        self.entries.retain(|_, list| {
            let before = list.len();
            list.retain(|e| e.worker != worker);
            removed += before - list.len();
            !list.is_empty()
        });
        self.live -= removed;
        self.compact();
    }

    /// Same answer shape as [`KvIndex::find_matches`](crate::KvIndex::find_matches),
    /// counting every believed block as a GPU block; entries expired at `now` do not match.
    pub fn find_matches(&self, prompt: &[SeqHash], now: Duration) -> OverlapScores {
        let mut active: Vec<WorkerId> = Vec::new();
        let mut done: Vec<(WorkerId, TierCounts)> = Vec::new();
        let finished = |worker, depth: usize| {
            let mut counts = TierCounts::default();
            counts.add(Tier::Gpu, u32::try_from(depth).unwrap_or(u32::MAX));
            (worker, counts)
        };
        for (depth, hash) in prompt.iter().enumerate() {
            let holders = self.entries.get(hash).map_or(&[][..], Vec::as_slice);
            let holds = |w: WorkerId| {
                holders
                    .iter()
                    .any(|e| e.worker == w && !self.expired(e.recorded_at, now))
            };
            if depth == 0 {
                active.extend(
                    holders
                        .iter()
                        .filter(|e| !self.expired(e.recorded_at, now))
                        .map(|e| e.worker),
                );
            } else {
                active.retain(|&w| {
                    let keep = holds(w);
                    if !keep {
                        done.push(finished(w, depth));
                    }
                    keep
                });
            }
            if active.is_empty() {
                break;
            }
        }
        done.extend(active.into_iter().map(|w| finished(w, prompt.len())));
        OverlapScores::from_entries(done)
    }

    fn expired(&self, recorded_at: Duration, now: Duration) -> bool {
        now >= recorded_at.saturating_add(self.config.ttl)
    }

    /// Recording time of the oldest live entry, dropping stale queue items on the way.
    fn oldest_recorded_at(&mut self) -> Option<Duration> {
        while let Some(&(tick, hash, worker)) = self.order.front() {
            match self.entry(hash, worker) {
                Some(e) if e.tick == tick => return Some(e.recorded_at),
                _ => {
                    self.order.pop_front();
                }
            }
        }
        None
    }

    fn pop_oldest(&mut self) {
        if self.oldest_recorded_at().is_none() {
            return;
        }
        let (_, hash, worker) = self.order.pop_front().expect("checked above");
        let list = self.entries.get_mut(&hash).expect("live entry");
        list.retain(|e| e.worker != worker);
        if list.is_empty() {
            self.entries.remove(&hash);
        }
        self.live -= 1;
    }

    fn entry(&self, hash: SeqHash, worker: WorkerId) -> Option<&Entry> {
        self.entries.get(&hash)?.iter().find(|e| e.worker == worker)
    }

    /// Drops stale queue items so the queue stays proportional to the live entries.
    fn compact(&mut self) {
        let entries = &self.entries;
        self.order.retain(|&(tick, hash, worker)| {
            entries
                .get(&hash)
                .and_then(|l| l.iter().find(|e| e.worker == worker))
                .is_some_and(|e| e.tick == tick)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(ids: &[u64]) -> Vec<SeqHash> {
        ids.iter().copied().map(SeqHash).collect()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn recorded_prefixes_match_until_the_ttl() {
        let mut idx = ApproxIndex::new(ApproxConfig {
            ttl: secs(10),
            max_entries: 100,
        });
        idx.record(WorkerId(1), &hashes(&[1, 2, 3]), secs(0));
        idx.record(WorkerId(2), &hashes(&[1, 2]), secs(5));
        let prompt = hashes(&[1, 2, 3, 4]);
        let s = idx.find_matches(&prompt, secs(9));
        assert_eq!(s.get(WorkerId(1)).get(Tier::Gpu), 3);
        assert_eq!(s.get(WorkerId(2)).get(Tier::Gpu), 2);
        // At 10 s worker 1's entries are exactly one TTL old: gone.
        let s = idx.find_matches(&prompt, secs(10));
        assert_eq!(s.get(WorkerId(1)).total(), 0);
        assert_eq!(s.get(WorkerId(2)).total(), 2);
        idx.expire(secs(10));
        assert_eq!(idx.len(), 2);
    }

    #[test]
    fn recording_again_refreshes_and_the_bound_evicts_the_least_recent() {
        let mut idx = ApproxIndex::new(ApproxConfig {
            ttl: secs(100),
            max_entries: 4,
        });
        idx.record(WorkerId(1), &hashes(&[1, 2]), secs(0));
        idx.record(WorkerId(2), &hashes(&[1, 2]), secs(1));
        idx.record(WorkerId(1), &hashes(&[1, 2]), secs(2)); // refresh worker 1
        idx.record(WorkerId(3), &hashes(&[1]), secs(3)); // 5 entries: evict (2, block 1)
        assert_eq!(idx.len(), 4);
        let s = idx.find_matches(&hashes(&[1, 2]), secs(3));
        assert_eq!(s.get(WorkerId(1)).total(), 2);
        assert_eq!(s.get(WorkerId(2)).total(), 0, "its first block was evicted");
        assert_eq!(s.get(WorkerId(3)).total(), 1);
    }

    #[test]
    fn removing_a_worker_forgets_it() {
        let mut idx = ApproxIndex::new(ApproxConfig::default());
        idx.record(WorkerId(1), &hashes(&[1, 2]), secs(0));
        idx.record(WorkerId(2), &hashes(&[1]), secs(0));
        idx.remove_worker(WorkerId(1));
        assert_eq!(idx.len(), 1);
        let s = idx.find_matches(&hashes(&[1, 2]), secs(1));
        assert_eq!(s.iter().map(|(w, _)| w).collect::<Vec<_>>(), [WorkerId(2)]);
    }
}
