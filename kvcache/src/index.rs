//! Exact index of which pod holds which block, fed by KV events.
//!
//! Sequence hashes are chained, so a hash names its whole prefix and a flat map from hash
//! to node is already a radix tree: each node records its parent hash and its number of
//! children, and each pod records which of its blocks hang under which parent.
//! Per node we keep the pods that hold the block split in two sorted lists: *reachable*
//! (the pod also holds every ancestor) and *cut off* (some ancestor is missing). Only
//! reachable blocks can match, because matching walks a prompt from its first block and
//! stops at the first block a pod lacks.
//!
//! Reachable lists shrink (or stay equal) from parent to child. `find_matches` exploits
//! that twice: a list as long as its parent's is the same set of pods (nothing to do),
//! and a shorter one differs from its parent's only by the pods that stop there, found by
//! binary search in O(log n) each. A query therefore costs O(prompt blocks + pods ×
//! log pods + off-GPU hits), not O(prompt blocks × pods).

use crate::fast_map::{FastMap, FastSet};
use crate::{KvEvent, OverlapScores, SeqHash, StoredBlock, Tier, TierCounts, WorkerId};

/// Default bound on nodes. A node costs about 120 bytes and each (pod, block) pair about
/// 70 more (holder entry, the pod's block set and child list), so the bound means 1-3 GB
/// for a pool of pods that share little; size it to the pool's total block count.
pub const DEFAULT_MAX_NODES: usize = 10_000_000;

/// Why an event was not (fully) applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// The node bound was reached. The blocks of the event before the bound were applied;
    /// the rest (`dropped`, the chain's tail) were not, so the index under-reports that
    /// pod's overlap, which costs cache hits but never routes to a pod for a block it lacks.
    #[error("index full at {max_nodes} nodes: {dropped} stored blocks not indexed")]
    Full { max_nodes: usize, dropped: usize },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parent {
    /// The first block of a sequence.
    Root,
    Child(SeqHash),
    /// A placeholder created only because a child names it; nobody stored it yet.
    Unknown,
}

impl Parent {
    fn as_option(self) -> Option<SeqHash> {
        match self {
            Parent::Child(p) => Some(p),
            Parent::Root | Parent::Unknown => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Holder {
    slot: u32,
    /// Bit `t.index()` set when the pod holds the block in tier `t`.
    tiers: u8,
    engine_hash: u64,
}

impl Holder {
    /// Index of the pod's best (fastest) tier for the block.
    fn best(&self) -> usize {
        debug_assert!(self.tiers != 0);
        self.tiers.trailing_zeros() as usize
    }
}

#[derive(Debug)]
struct Node {
    parent: Parent,
    /// Nodes linked under this one; a node is deleted once unheld and childless.
    children: u32,
    /// Pods holding this block and all its ancestors, sorted by slot.
    reachable: Vec<Holder>,
    /// Pods holding this block but not all its ancestors, sorted by slot.
    cut_off: Vec<Holder>,
    /// Reachable pods whose best tier here is below GPU, with that tier's index.
    off_gpu: Vec<(u32, u8)>,
}

impl Node {
    fn new(parent: Parent) -> Self {
        Self {
            parent,
            children: 0,
            reachable: Vec::new(),
            cut_off: Vec::new(),
            off_gpu: Vec::new(),
        }
    }

    fn is_unheld(&self) -> bool {
        self.reachable.is_empty() && self.cut_off.is_empty()
    }

    /// The pod's holder entry and whether it is reachable.
    fn holder(&self, slot: u32) -> Option<(&Holder, bool)> {
        for (list, reachable) in [(&self.reachable, true), (&self.cut_off, false)] {
            if let Ok(i) = list.binary_search_by_key(&slot, |h| h.slot) {
                return Some((&list[i], reachable));
            }
        }
        None
    }

    /// Adds a holder the node does not have yet.
    fn insert(&mut self, holder: Holder, reachable: bool) {
        let list = if reachable {
            &mut self.reachable
        } else {
            &mut self.cut_off
        };
        let i = list
            .binary_search_by_key(&holder.slot, |h| h.slot)
            .expect_err("one entry per pod");
        list.insert(i, holder);
        if reachable && holder.best() != Tier::Gpu.index() {
            self.off_gpu.push((holder.slot, holder.best() as u8));
        }
    }

    /// Takes the pod's holder entry out, with whether it was reachable.
    fn take(&mut self, slot: u32) -> Option<(Holder, bool)> {
        if let Ok(i) = self.reachable.binary_search_by_key(&slot, |h| h.slot) {
            let holder = self.reachable.remove(i);
            if holder.best() != Tier::Gpu.index() {
                let pos = self.off_gpu.iter().position(|(s, _)| *s == slot);
                self.off_gpu
                    .swap_remove(pos.expect("off-GPU holders are listed"));
            }
            return Some((holder, true));
        }
        let i = self.cut_off.binary_search_by_key(&slot, |h| h.slot).ok()?;
        Some((self.cut_off.remove(i), false))
    }
}

#[derive(Debug)]
struct Pod {
    worker: WorkerId,
    blocks: FastSet<SeqHash>,
    /// Parent hash -> the pod's blocks under it (whether or not it holds the parent), so
    /// reachability changes walk only this pod's blocks, not every pod's children of a
    /// shared prefix.
    kids: FastMap<SeqHash, Vec<SeqHash>>,
}

impl Pod {
    fn add(&mut self, parent: Parent, hash: SeqHash) {
        self.blocks.insert(hash);
        if let Parent::Child(p) = parent {
            self.kids.entry(p).or_default().push(hash);
        }
    }

    fn remove(&mut self, parent: Parent, hash: SeqHash) {
        self.blocks.remove(&hash);
        if let Parent::Child(p) = parent
            && let Some(kids) = self.kids.get_mut(&p)
        {
            if let Some(pos) = kids.iter().position(|k| *k == hash) {
                kids.swap_remove(pos);
            }
            if kids.is_empty() {
                self.kids.remove(&p);
            }
        }
    }

    fn kids_of(&self, hash: SeqHash) -> &[SeqHash] {
        self.kids.get(&hash).map_or(&[], Vec::as_slice)
    }
}

/// Which pods hold which blocks, for thousands of pods. See the module documentation.
#[derive(Debug)]
pub struct KvIndex {
    nodes: FastMap<SeqHash, Node>,
    max_nodes: usize,
    /// Pods are numbered by dense slots so holder lists stay small and sortable.
    slots: FastMap<WorkerId, u32>,
    pods: Vec<Option<Pod>>,
    free_slots: Vec<u32>,
}

impl Default for KvIndex {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_NODES)
    }
}

impl KvIndex {
    /// An empty index that holds at most `max_nodes` blocks (placeholders included).
    pub fn new(max_nodes: usize) -> Self {
        Self {
            nodes: FastMap::default(),
            max_nodes,
            slots: FastMap::default(),
            pods: Vec::new(),
            free_slots: Vec::new(),
        }
    }

    /// Number of nodes (distinct blocks, plus parents only named by a child).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn max_nodes(&self) -> usize {
        self.max_nodes
    }

    /// Pods with an entry (one that sent an event and was not removed since).
    pub fn workers(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.pods.iter().flatten().map(|p| p.worker)
    }

    /// Number of distinct blocks `worker` holds in any tier.
    pub fn worker_blocks(&self, worker: WorkerId) -> usize {
        self.pod(worker).map_or(0, |p| p.blocks.len())
    }

    /// The tiers in which `worker` holds `block`, best first.
    pub fn tiers_of(&self, worker: WorkerId, block: SeqHash) -> Vec<Tier> {
        let Some(&slot) = self.slots.get(&worker) else {
            return Vec::new();
        };
        let tiers = self
            .nodes
            .get(&block)
            .and_then(|n| n.holder(slot))
            .map_or(0, |(h, _)| h.tiers);
        Tier::ALL
            .into_iter()
            .filter(|t| tiers & (1 << t.index()) != 0)
            .collect()
    }

    /// Applies one event of `worker`'s stream.
    pub fn apply(&mut self, worker: WorkerId, event: &KvEvent) -> Result<(), IndexError> {
        match event {
            KvEvent::Stored { parent, blocks } => {
                let slot = self.slot_or_insert(worker);
                self.store(slot, *parent, blocks)
            }
            KvEvent::Removed { blocks, tier } => {
                if let Some(&slot) = self.slots.get(&worker) {
                    for b in blocks {
                        self.remove_block(slot, b.seq_hash, *tier);
                    }
                }
                Ok(())
            }
            KvEvent::Cleared => {
                if let Some(&slot) = self.slots.get(&worker) {
                    self.clear_slot(slot);
                }
                Ok(())
            }
        }
    }

    /// Drops `worker` and all its blocks (pod deleted, stream lost for good).
    pub fn remove_worker(&mut self, worker: WorkerId) {
        if let Some(slot) = self.slots.remove(&worker) {
            self.clear_slot(slot);
            self.pods[slot as usize] = None;
            self.free_slots.push(slot);
        }
    }

    /// For each pod, how many leading blocks of `prompt` (sequence hashes from the
    /// prompt's first block on) it holds, each counted at its best tier.
    pub fn find_matches(&self, prompt: &[SeqHash]) -> OverlapScores {
        // (slot, matched blocks) of pods that stopped matching.
        let mut depths: Vec<(u32, u32)> = Vec::new();
        // Pods still matching: the previous node's reachable list.
        let mut active: &[Holder] = &[];
        // Per slot, matched blocks per tier below GPU; allocated at the first such hit.
        let mut off_gpu: Vec<[u32; 4]> = Vec::new();
        let mut matched = 0u32;
        let mut prev: Option<SeqHash> = None;

        for hash in prompt {
            let Some(node) = self.nodes.get(hash) else {
                break;
            };
            // The chain must be the prompt's own: a root first, then each block's parent
            // is the block before it. Anything else is a hash collision; stop there.
            let chained = match node.parent {
                Parent::Root => prev.is_none(),
                Parent::Child(p) => prev == Some(p),
                Parent::Unknown => false,
            };
            let here = node.reachable.as_slice();
            if !chained || here.is_empty() {
                break;
            }
            if prev.is_some() && here.len() < active.len() {
                for_each_missing(active, here, |slot| depths.push((slot, matched)));
            }
            debug_assert!(prev.is_none() || here.len() <= active.len());
            if !node.off_gpu.is_empty() {
                if off_gpu.is_empty() {
                    off_gpu = vec![[0; 4]; self.pods.len()];
                }
                for &(slot, tier) in &node.off_gpu {
                    off_gpu[slot as usize][tier as usize] += 1;
                }
            }
            active = here;
            matched += 1;
            prev = Some(*hash);
        }
        depths.extend(active.iter().map(|h| (h.slot, matched)));

        let scores = depths
            .into_iter()
            .map(|(slot, depth)| {
                let mut counts = off_gpu.get(slot as usize).copied().unwrap_or_default();
                counts[Tier::Gpu.index()] = depth - counts.iter().sum::<u32>();
                (self.worker_at(slot), TierCounts(counts))
            })
            .collect();
        OverlapScores::from_unique(scores)
    }

    /// `worker`'s blocks as `Stored` events, parents before children, that rebuild the
    /// same state for that pod when applied to an index that lacks it. Children are
    /// visited in hash order so the output is deterministic.
    pub fn snapshot(&self, worker: WorkerId) -> Vec<KvEvent> {
        let (Some(&slot), Some(pod)) = (self.slots.get(&worker), self.pod(worker)) else {
            return Vec::new();
        };
        let mut roots: Vec<SeqHash> = pod
            .blocks
            .iter()
            .copied()
            .filter(|h| match self.nodes[h].parent {
                Parent::Child(p) => !pod.blocks.contains(&p),
                Parent::Root | Parent::Unknown => true,
            })
            .collect();
        roots.sort_unstable_by(|a, b| b.cmp(a)); // popped from the end: smallest first
        let mut stack = roots;
        let mut events: Vec<KvEvent> = Vec::new();
        while let Some(hash) = stack.pop() {
            let node = &self.nodes[&hash];
            let (holder, _) = node.holder(slot).expect("a pod's block lists the pod");
            for tier in Tier::ALL {
                if holder.tiers & (1 << tier.index()) != 0 {
                    let block = StoredBlock {
                        seq_hash: hash,
                        engine_hash: holder.engine_hash,
                        tier,
                    };
                    push_chained(&mut events, node.parent.as_option(), block);
                }
            }
            let mut children = pod.kids_of(hash).to_vec();
            children.sort_unstable_by(|a, b| b.cmp(a));
            stack.extend(children);
        }
        events
    }

    fn pod(&self, worker: WorkerId) -> Option<&Pod> {
        let slot = *self.slots.get(&worker)?;
        self.pods[slot as usize].as_ref()
    }

    fn worker_at(&self, slot: u32) -> WorkerId {
        self.pods[slot as usize]
            .as_ref()
            .expect("holders name live slots")
            .worker
    }

    fn slot_or_insert(&mut self, worker: WorkerId) -> u32 {
        if let Some(&slot) = self.slots.get(&worker) {
            return slot;
        }
        let pod = Pod {
            worker,
            blocks: FastSet::default(),
            kids: FastMap::default(),
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.pods[slot as usize] = Some(pod);
                slot
            }
            None => {
                self.pods.push(Some(pod));
                u32::try_from(self.pods.len() - 1).expect("fewer than 2^32 pods")
            }
        };
        self.slots.insert(worker, slot);
        slot
    }

    fn store(
        &mut self,
        slot: u32,
        parent: Option<SeqHash>,
        blocks: &[StoredBlock],
    ) -> Result<(), IndexError> {
        let mut parent = parent;
        // Whether the pod holds `parent` reachably, once the chain has told us.
        let mut parent_reachable: Option<bool> = None;
        for (i, block) in blocks.iter().enumerate() {
            let hash = block.seq_hash;
            let link = match self.nodes.get(&hash).map(|n| n.parent) {
                Some(known @ (Parent::Root | Parent::Child(_))) => known,
                // New, or a placeholder: it takes the parent this event gives it. (A known
                // node keeps its parent: the hash chain fixes it, and a different one here
                // could only come from a collision.)
                _ => {
                    if !self.link(hash, parent) {
                        return Err(IndexError::Full {
                            max_nodes: self.max_nodes,
                            dropped: blocks.len() - i,
                        });
                    }
                    parent.map_or(Parent::Root, Parent::Child)
                }
            };
            let reachable_above = match (link, parent_reachable) {
                (Parent::Child(p), Some(known)) if Some(p) == parent => known,
                _ => self.parent_reachable(slot, link),
            };
            parent_reachable = Some(self.add_holder(slot, block, reachable_above));
            parent = Some(hash);
        }
        Ok(())
    }

    /// Creates (or completes) `hash`'s node under `parent`; false when the bound forbids.
    fn link(&mut self, hash: SeqHash, parent: Option<SeqHash>) -> bool {
        if self.nodes.len() + 2 > self.max_nodes {
            let new_nodes = usize::from(!self.nodes.contains_key(&hash))
                + usize::from(parent.is_some_and(|p| p != hash && !self.nodes.contains_key(&p)));
            if self.nodes.len() + new_nodes > self.max_nodes {
                return false;
            }
        }
        let link = match parent {
            None => Parent::Root,
            Some(p) => {
                self.nodes
                    .entry(p)
                    .or_insert_with(|| Node::new(Parent::Unknown))
                    .children += 1;
                Parent::Child(p)
            }
        };
        self.nodes
            .entry(hash)
            .or_insert_with(|| Node::new(link))
            .parent = link;
        true
    }

    /// Whether the pod holds `parent` and all its ancestors.
    fn parent_reachable(&self, slot: u32, parent: Parent) -> bool {
        match parent {
            Parent::Root => true,
            Parent::Unknown => false,
            Parent::Child(p) => self
                .nodes
                .get(&p)
                .and_then(|n| n.holder(slot))
                .is_some_and(|(_, reachable)| reachable),
        }
    }

    /// Records that the pod holds `block` (its node exists); returns whether the pod's
    /// copy is reachable, given whether its parent is.
    fn add_holder(&mut self, slot: u32, block: &StoredBlock, parent_reachable: bool) -> bool {
        let bit = 1u8 << block.tier.index();
        let node = self.nodes.get_mut(&block.seq_hash).expect("linked");
        if let Some((mut holder, reachable)) = node.take(slot) {
            // Another tier of a block the pod has: reachability is unchanged.
            holder.tiers |= bit;
            holder.engine_hash = block.engine_hash;
            node.insert(holder, reachable);
            return reachable;
        }
        let holder = Holder {
            slot,
            tiers: bit,
            engine_hash: block.engine_hash,
        };
        node.insert(holder, parent_reachable);
        let parent = node.parent;
        let pod = self.pods[slot as usize].as_mut().expect("live slot");
        pod.add(parent, block.seq_hash);
        if parent_reachable && !pod.kids_of(block.seq_hash).is_empty() {
            // The pod already held blocks under this one, cut off until now.
            self.set_reachable_below(slot, block.seq_hash, true);
        }
        parent_reachable
    }

    fn remove_block(&mut self, slot: u32, hash: SeqHash, tier: Tier) {
        let bit = 1u8 << tier.index();
        let Some(node) = self.nodes.get_mut(&hash) else {
            return; // never stored, or already gone: nothing to undo
        };
        let Some((mut holder, reachable)) = node.take(slot) else {
            return;
        };
        holder.tiers &= !bit;
        if holder.tiers != 0 {
            node.insert(holder, reachable);
            return;
        }
        let parent = node.parent;
        let pod = self.pods[slot as usize].as_mut().expect("live slot");
        pod.remove(parent, hash);
        if reachable && !pod.kids_of(hash).is_empty() {
            self.set_reachable_below(slot, hash, false);
        }
        self.collect_garbage(hash);
    }

    /// Marks the pod's blocks under `hash` reachable (or not), down to where its chain of
    /// held blocks ends. Walks only this pod's blocks.
    fn set_reachable_below(&mut self, slot: u32, hash: SeqHash, reachable: bool) {
        let pod = self.pods[slot as usize].as_ref().expect("live slot");
        let mut stack: Vec<SeqHash> = pod.kids_of(hash).to_vec();
        while let Some(child) = stack.pop() {
            let node = self
                .nodes
                .get_mut(&child)
                .expect("a pod's blocks are nodes");
            let (holder, was) = node.take(slot).expect("a pod's blocks list the pod");
            node.insert(holder, reachable);
            if was != reachable {
                stack.extend_from_slice(pod.kids_of(child));
            }
        }
    }

    /// Deletes `hash` if nobody holds it and nothing hangs below it, then its parent if
    /// that leaves the parent in the same state.
    fn collect_garbage(&mut self, hash: SeqHash) {
        let mut hash = hash;
        loop {
            let Some(node) = self.nodes.get(&hash) else {
                return;
            };
            if !node.is_unheld() || node.children > 0 {
                return;
            }
            let parent = node.parent;
            self.nodes.remove(&hash);
            let Parent::Child(p) = parent else {
                return;
            };
            self.nodes
                .get_mut(&p)
                .expect("parents outlive children")
                .children -= 1;
            hash = p;
        }
    }

    fn clear_slot(&mut self, slot: u32) {
        let Some(pod) = self.pods[slot as usize].as_mut() else {
            return;
        };
        let blocks = std::mem::take(&mut pod.blocks);
        pod.kids.clear();
        // Every block of the pod goes, so no reachability needs to be recomputed below.
        for hash in &blocks {
            let node = self.nodes.get_mut(hash).expect("a pod's blocks are nodes");
            node.take(slot);
        }
        for hash in blocks {
            self.collect_garbage(hash);
        }
    }
}

/// Calls `missing` with the slot of each holder of `outer` that `inner` lacks, given that
/// `inner` is a subset of `outer` and both are sorted by slot.
///
/// With `s` holders missing before position `j`, `inner[j] == outer[j + s]` holds exactly
/// up to the next missing one, so each is found by a binary search: O(missing × log n).
fn for_each_missing(outer: &[Holder], inner: &[Holder], mut missing: impl FnMut(u32)) {
    let mut skipped = 0;
    let mut from = 0;
    while skipped < outer.len() - inner.len() {
        let (mut lo, mut hi) = (from, inner.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if inner[mid].slot == outer[mid + skipped].slot {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        missing(outer[lo + skipped].slot);
        skipped += 1;
        from = lo;
    }
}

/// Appends `block` to the last event when it continues that event's chain at the same
/// tier, else starts a new `Stored` event under `parent`.
fn push_chained(events: &mut Vec<KvEvent>, parent: Option<SeqHash>, block: StoredBlock) {
    if let Some(KvEvent::Stored { blocks, .. }) = events.last_mut()
        && let Some(last) = blocks.last()
        && Some(last.seq_hash) == parent
        && last.tier == block.tier
    {
        blocks.push(block);
        return;
    }
    events.push(KvEvent::Stored {
        parent,
        blocks: vec![block],
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RemovedBlock;

    const A: WorkerId = WorkerId(1);
    const B: WorkerId = WorkerId(2);

    fn h(ids: &[u64]) -> Vec<SeqHash> {
        ids.iter().copied().map(SeqHash).collect()
    }

    fn stored(parent: Option<u64>, ids: &[u64], tier: Tier) -> KvEvent {
        KvEvent::Stored {
            parent: parent.map(SeqHash),
            blocks: ids
                .iter()
                .map(|&id| StoredBlock {
                    seq_hash: SeqHash(id),
                    engine_hash: id + 1000,
                    tier,
                })
                .collect(),
        }
    }

    fn removed(ids: &[u64], tier: Tier) -> KvEvent {
        KvEvent::Removed {
            blocks: ids
                .iter()
                .map(|&id| RemovedBlock {
                    seq_hash: SeqHash(id),
                    engine_hash: id + 1000,
                })
                .collect(),
            tier,
        }
    }

    proptest::proptest! {
        #[test]
        fn missing_holders_are_the_set_difference(
            outer in proptest::collection::btree_set(0u32..200, 0..60),
            keep in proptest::collection::vec(proptest::bool::ANY, 60),
        ) {
            let holder = |slot| Holder { slot, tiers: 1, engine_hash: 0 };
            let outer: Vec<Holder> = outer.into_iter().map(holder).collect();
            let inner: Vec<Holder> = outer
                .iter()
                .zip(&keep)
                .filter(|(_, k)| **k)
                .map(|(h, _)| *h)
                .collect();
            let mut found = Vec::new();
            for_each_missing(&outer, &inner, |s| found.push(s));
            let expected: Vec<u32> = outer
                .iter()
                .zip(&keep)
                .filter(|(_, k)| !**k)
                .map(|(h, _)| h.slot)
                .collect();
            proptest::prop_assert_eq!(found, expected);
        }
    }

    #[test]
    fn pods_match_their_leading_blocks_at_their_best_tier() {
        let mut idx = KvIndex::default();
        idx.apply(A, &stored(None, &[1, 2, 3], Tier::Gpu)).unwrap();
        idx.apply(B, &stored(None, &[1, 2], Tier::Host)).unwrap();
        idx.apply(B, &stored(Some(1), &[2], Tier::Gpu)).unwrap(); // gpu beats host
        let s = idx.find_matches(&h(&[1, 2, 3, 4]));
        assert_eq!(s.get(A), TierCounts([3, 0, 0, 0]));
        assert_eq!(s.get(B), TierCounts([1, 1, 0, 0]));
        assert_eq!(idx.tiers_of(B, SeqHash(2)), [Tier::Gpu, Tier::Host]);
    }

    #[test]
    fn a_missing_block_ends_the_match_until_it_comes_back() {
        let mut idx = KvIndex::default();
        idx.apply(A, &stored(None, &[1, 2, 3, 4], Tier::Gpu))
            .unwrap();
        idx.apply(A, &removed(&[2], Tier::Gpu)).unwrap();
        assert_eq!(idx.find_matches(&h(&[1, 2, 3, 4])).get(A).total(), 1);
        // Blocks 3 and 4 are still held, only unreachable; storing 2 again restores them.
        idx.apply(A, &stored(Some(1), &[2], Tier::Disk)).unwrap();
        assert_eq!(
            idx.find_matches(&h(&[1, 2, 3, 4])).get(A),
            TierCounts([3, 0, 1, 0])
        );
    }

    #[test]
    fn removing_one_tier_keeps_the_others() {
        let mut idx = KvIndex::default();
        idx.apply(A, &stored(None, &[1], Tier::Gpu)).unwrap();
        idx.apply(A, &stored(None, &[1], Tier::Host)).unwrap();
        idx.apply(A, &removed(&[1], Tier::Gpu)).unwrap();
        assert_eq!(idx.find_matches(&h(&[1])).get(A), TierCounts([0, 1, 0, 0]));
        idx.apply(A, &removed(&[1], Tier::Host)).unwrap();
        assert!(idx.find_matches(&h(&[1])).is_empty());
        assert!(idx.is_empty(), "unheld nodes are collected");
    }

    #[test]
    fn clear_and_remove_worker_drop_only_that_pod() {
        let mut idx = KvIndex::default();
        idx.apply(A, &stored(None, &[1, 2], Tier::Gpu)).unwrap();
        idx.apply(B, &stored(None, &[1, 2, 3], Tier::Gpu)).unwrap();
        idx.apply(B, &KvEvent::Cleared).unwrap();
        assert_eq!(idx.worker_blocks(B), 0);
        assert_eq!(idx.len(), 2);
        idx.apply(B, &stored(None, &[1], Tier::Gpu)).unwrap();
        idx.remove_worker(A);
        let s = idx.find_matches(&h(&[1, 2]));
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            [(B, TierCounts([1, 0, 0, 0]))]
        );
        assert_eq!(idx.workers().collect::<Vec<_>>(), [B]);
    }

    #[test]
    fn the_node_bound_refuses_the_tail_of_a_chain() {
        let mut idx = KvIndex::new(3);
        let err = idx
            .apply(A, &stored(None, &[1, 2, 3, 4, 5], Tier::Gpu))
            .unwrap_err();
        assert_eq!(
            err,
            IndexError::Full {
                max_nodes: 3,
                dropped: 2
            }
        );
        assert_eq!(idx.find_matches(&h(&[1, 2, 3, 4, 5])).get(A).total(), 3);
        // Freed room is usable again.
        idx.apply(A, &removed(&[3], Tier::Gpu)).unwrap();
        idx.apply(B, &stored(None, &[9], Tier::Gpu)).unwrap();
        assert_eq!(idx.len(), 3);
    }

    #[test]
    fn a_block_stored_before_its_parent_waits_for_it() {
        let mut idx = KvIndex::default();
        idx.apply(A, &stored(Some(1), &[2], Tier::Gpu)).unwrap();
        assert!(idx.find_matches(&h(&[1, 2])).is_empty());
        idx.apply(A, &stored(None, &[1], Tier::Gpu)).unwrap();
        assert_eq!(idx.find_matches(&h(&[1, 2])).get(A).total(), 2);
    }

    #[test]
    fn a_prompt_whose_chain_differs_does_not_match_past_it() {
        let mut idx = KvIndex::default();
        idx.apply(A, &stored(None, &[1, 2], Tier::Gpu)).unwrap();
        // Block 2 exists, but under 1, not at the start of a prompt.
        assert!(idx.find_matches(&h(&[2])).is_empty());
    }

    #[test]
    fn snapshot_rebuilds_the_pod_parents_first() {
        let mut idx = KvIndex::default();
        idx.apply(A, &stored(None, &[1, 2, 3], Tier::Gpu)).unwrap();
        idx.apply(A, &stored(Some(2), &[4], Tier::Host)).unwrap();
        idx.apply(A, &stored(None, &[2], Tier::Disk)).unwrap_or(()); // ignored parent
        idx.apply(A, &stored(Some(7), &[8], Tier::Gpu)).unwrap(); // orphan
        let events = idx.snapshot(A);
        let mut copy = KvIndex::default();
        for e in &events {
            copy.apply(B, e).unwrap();
        }
        for prompt in [h(&[1, 2, 3]), h(&[1, 2, 4]), h(&[7, 8])] {
            assert_eq!(
                idx.find_matches(&prompt).get(A),
                copy.find_matches(&prompt).get(B)
            );
        }
        assert_eq!(copy.worker_blocks(B), idx.worker_blocks(A));
        assert_eq!(copy.tiers_of(B, SeqHash(2)), [Tier::Gpu, Tier::Disk]);
    }
}
