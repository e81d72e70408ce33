//! Which tier holds which block: the decisions of the KV block store, without its bytes
//! or its I/O (`DESIGN.md`, "KV blocks in the sidecar"). The sidecar's store carries
//! out the [`Action`]s with real memory, files and objects; a simulation can apply them
//! as they come. Keeping the policy pure keeps it testable against a model.
//!
//! - Tiers are host, disk and object, each optional with a byte capacity and LRU order.
//! - An offloaded block goes to the first tier configured (write-through host cache).
//! - A tier that needs room evicts its least recently used blocks; a victim moves one
//!   tier down when that tier is configured, does not hold it yet, and the block has been
//!   reused often enough (`min_reuse`; Dynamo offloads host -> disk only blocks seen
//!   twice, pillars.md 3.1), else it is dropped.
//! - A block being written counts against its tier's capacity but is not yet held:
//!   lookups do not see it and eviction cannot pick it. When nothing is left to evict,
//!   the write is refused: a full or slow tier drops blocks, never waits.
//! - A block read back from a lower tier is copied up to host memory (it is hot again).

use std::collections::{BTreeMap, HashMap};

use dynamo_kvcache::{SeqHash, Tier};

/// The tiers a store can have, best first.
pub const TIERS: [Tier; 3] = [Tier::Host, Tier::Disk, Tier::Object];

/// One tier's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierLimits {
    pub capacity_bytes: u64,
    /// Uses a block needs before it may move into this tier from the one above (1: any).
    pub min_reuse: u32,
}

/// The tiers configured; `None` is a tier that is off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlacementConfig {
    pub host: Option<TierLimits>,
    pub disk: Option<TierLimits>,
    pub object: Option<TierLimits>,
}

impl PlacementConfig {
    fn limits(&self, tier: Tier) -> Option<TierLimits> {
        match tier {
            Tier::Host => self.host,
            Tier::Disk => self.disk,
            Tier::Object => self.object,
            Tier::Gpu => None,
        }
    }

    /// Whether any tier is on.
    pub fn any(&self) -> bool {
        TIERS.iter().any(|&t| self.limits(t).is_some())
    }
}

/// What the store must do with bytes. Each `Write` and `Move` ends with
/// [`Placement::written`] or [`Placement::failed`]; a `Move`'s source copy stays
/// readable until then, and is deleted after either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write the block's bytes (which the caller has: offloaded or just read) to `tier`.
    Write { hash: SeqHash, tier: Tier },
    /// The block left `from` for `to`: take its bytes out of `from`, write them to `to`,
    /// then delete them from `from`.
    Move { hash: SeqHash, from: Tier, to: Tier },
    /// The block left `tier`: delete its bytes there.
    Delete { hash: SeqHash, tier: Tier },
}

/// What became of an offered block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// Taken: a `Write` among the actions stores it.
    Stored,
    /// Already held or being written; only its use was counted.
    Duplicate,
    /// No tier could take it (none configured, larger than the tier, or the tier is
    /// full of blocks still being written).
    Refused,
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// LRU stamp while held here.
    stamp: Option<u64>,
    /// Bytes reserved here for a write in flight.
    pending: bool,
    /// Evicted, and moving to a lower tier: no longer counted here, but still read from
    /// here until the move ends, so a block is never unreadable on its way down.
    leaving: bool,
}

#[derive(Clone, Debug)]
struct Entry {
    parent: Option<SeqHash>,
    bytes: u64,
    uses: u32,
    slots: [Slot; 3],
}

impl Entry {
    fn held(&self, tier: Tier) -> bool {
        self.slots[slot(tier)].stamp.is_some()
    }

    fn readable(&self, tier: Tier) -> bool {
        let s = self.slots[slot(tier)];
        s.stamp.is_some() || s.leaving
    }

    fn present(&self, tier: Tier) -> bool {
        let s = self.slots[slot(tier)];
        s.stamp.is_some() || s.pending || s.leaving
    }

    fn best(&self) -> Option<Tier> {
        TIERS.into_iter().find(|&t| self.readable(t))
    }

    /// A move ended: the copy it left behind is gone.
    fn arrived(&mut self) {
        for s in &mut self.slots {
            s.leaving = false;
        }
    }

    fn anywhere(&self) -> bool {
        TIERS.iter().any(|&t| self.present(t))
    }
}

fn slot(tier: Tier) -> usize {
    debug_assert!(tier != Tier::Gpu, "the store never holds GPU blocks");
    tier.index() - 1
}

#[derive(Debug, Default)]
struct TierState {
    used: u64,
    blocks: usize,
    lru: BTreeMap<u64, SeqHash>,
}

/// Bytes and blocks of one tier, held or being written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierUsage {
    pub bytes: u64,
    pub blocks: usize,
}

/// The store's block table. Not thread-safe by itself: the store keeps it under a lock.
#[derive(Debug)]
pub struct Placement {
    config: PlacementConfig,
    entries: HashMap<SeqHash, Entry>,
    tiers: [TierState; 3],
    clock: u64,
}

impl Placement {
    pub fn new(config: PlacementConfig) -> Self {
        Self {
            config,
            entries: HashMap::new(),
            tiers: Default::default(),
            clock: 0,
        }
    }

    pub fn config(&self) -> &PlacementConfig {
        &self.config
    }

    /// The engine offers a block of `bytes` bytes. The actions (evictions, and the
    /// write when it is taken) are to be carried out whatever the outcome.
    pub fn offload(
        &mut self,
        hash: SeqHash,
        parent: Option<SeqHash>,
        bytes: u64,
    ) -> (Offered, Vec<Action>) {
        let mut actions = Vec::new();
        if let Some(entry) = self.entries.get_mut(&hash) {
            entry.uses = entry.uses.saturating_add(1);
            self.touch(hash);
            return (Offered::Duplicate, actions);
        }
        let Some(tier) = TIERS.into_iter().find(|&t| self.config.limits(t).is_some()) else {
            return (Offered::Refused, actions);
        };
        self.entries.insert(
            hash,
            Entry {
                parent,
                bytes,
                uses: 1,
                slots: Default::default(),
            },
        );
        if self.reserve(hash, tier, &mut actions) {
            actions.push(Action::Write { hash, tier });
            (Offered::Stored, actions)
        } else {
            self.entries.remove(&hash);
            (Offered::Refused, actions)
        }
    }

    /// A write or move into `tier` finished: the block is held there (and no longer
    /// where it moved from).
    pub fn written(&mut self, hash: SeqHash, tier: Tier) {
        self.clock += 1;
        let stamp = self.clock;
        let Some(entry) = self.entries.get_mut(&hash) else {
            return;
        };
        if !entry.slots[slot(tier)].pending {
            return;
        }
        entry.arrived();
        entry.slots[slot(tier)] = Slot {
            stamp: Some(stamp),
            ..Slot::default()
        };
        self.tiers[slot(tier)].lru.insert(stamp, hash);
    }

    /// A write or move into `tier` failed: its reservation is released (and a move's
    /// source copy is gone all the same).
    pub fn failed(&mut self, hash: SeqHash, tier: Tier) {
        let Some(entry) = self.entries.get_mut(&hash) else {
            return;
        };
        if !entry.slots[slot(tier)].pending {
            return;
        }
        entry.arrived();
        entry.slots[slot(tier)].pending = false;
        let bytes = entry.bytes;
        let gone = !entry.anywhere();
        let t = &mut self.tiers[slot(tier)];
        t.used -= bytes;
        t.blocks -= 1;
        if gone {
            self.entries.remove(&hash);
        }
    }

    /// `tier`'s copy turned out missing or corrupt: forget it, and say whether it was
    /// held there (then the caller deletes it; a copy being moved is the move's to end).
    pub fn lost(&mut self, hash: SeqHash, tier: Tier) -> bool {
        let held = self.entries.get(&hash).is_some_and(|e| e.held(tier));
        if held {
            self.release(hash, tier);
            self.forget_if_gone(hash);
        }
        held
    }

    /// The longest prefix of `chain` that some tier holds, with the best tier of each.
    pub fn lookup(&self, chain: &[SeqHash]) -> Vec<(SeqHash, Tier)> {
        chain
            .iter()
            .map_while(|h| Some((*h, self.entries.get(h)?.best()?)))
            .collect()
    }

    /// The best tier holding `hash`.
    pub fn best(&self, hash: SeqHash) -> Option<Tier> {
        self.entries.get(&hash)?.best()
    }

    pub fn parent(&self, hash: SeqHash) -> Option<SeqHash> {
        self.entries.get(&hash)?.parent
    }

    /// The engine took `hash` back from `from`: it counts as a use, it is the most
    /// recently used in every tier, and a block from below host memory is copied up
    /// (the caller has its bytes): the actions say what that takes.
    pub fn onboarded(&mut self, hash: SeqHash, from: Tier) -> Vec<Action> {
        let Some(entry) = self.entries.get_mut(&hash) else {
            return Vec::new();
        };
        entry.uses = entry.uses.saturating_add(1);
        self.touch(hash);
        let mut actions = Vec::new();
        if from != Tier::Host
            && self.config.host.is_some()
            && !self.entries[&hash].present(Tier::Host)
            && self.reserve(hash, Tier::Host, &mut actions)
        {
            actions.push(Action::Write {
                hash,
                tier: Tier::Host,
            });
        }
        actions
    }

    /// A block found in `tier` at start (re-indexing what a previous run left on disk or
    /// in the object store), oldest first. The actions make room, as for a write.
    pub fn restore(
        &mut self,
        hash: SeqHash,
        parent: Option<SeqHash>,
        bytes: u64,
        tier: Tier,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let entry = self.entries.entry(hash).or_insert(Entry {
            parent,
            bytes,
            uses: 1,
            slots: Default::default(),
        });
        if entry.present(tier) {
            return actions;
        }
        if entry.bytes != bytes {
            // Another size under the same hash: not the block the index knows.
            actions.push(Action::Delete { hash, tier });
            return actions;
        }
        if self.reserve(hash, tier, &mut actions) {
            self.written(hash, tier);
        } else {
            if !self.entries[&hash].anywhere() {
                self.entries.remove(&hash);
            }
            actions.push(Action::Delete { hash, tier });
        }
        actions
    }

    /// The blocks `tier` holds, least recently used first.
    pub fn held(&self, tier: Tier) -> Vec<SeqHash> {
        self.tiers[slot(tier)].lru.values().copied().collect()
    }

    pub fn usage(&self, tier: Tier) -> TierUsage {
        let t = &self.tiers[slot(tier)];
        TierUsage {
            bytes: t.used,
            blocks: t.blocks,
        }
    }

    /// Distinct blocks held or being written anywhere.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn touch(&mut self, hash: SeqHash) {
        let entry = self.entries.get_mut(&hash).expect("touched blocks exist");
        for tier in TIERS {
            let s = &mut entry.slots[slot(tier)];
            if let Some(old) = s.stamp {
                self.clock += 1;
                let lru = &mut self.tiers[slot(tier)].lru;
                lru.remove(&old);
                lru.insert(self.clock, hash);
                s.stamp = Some(self.clock);
            }
        }
    }

    /// Reserves `hash`'s bytes in `tier`, evicting its least recently used blocks (and
    /// demoting them, which may make room further down) as needed.
    fn reserve(&mut self, hash: SeqHash, tier: Tier, actions: &mut Vec<Action>) -> bool {
        let Some(limits) = self.config.limits(tier) else {
            return false;
        };
        let bytes = self.entries[&hash].bytes;
        if bytes > limits.capacity_bytes {
            return false;
        }
        while self.tiers[slot(tier)].used + bytes > limits.capacity_bytes {
            let Some((_, victim)) = self.tiers[slot(tier)].lru.first_key_value() else {
                return false;
            };
            let victim = *victim;
            self.evict(victim, tier, actions);
        }
        let t = &mut self.tiers[slot(tier)];
        t.used += bytes;
        t.blocks += 1;
        self.entries
            .get_mut(&hash)
            .expect("reserved blocks exist")
            .slots[slot(tier)]
        .pending = true;
        true
    }

    fn evict(&mut self, victim: SeqHash, tier: Tier, actions: &mut Vec<Action>) {
        self.release(victim, tier);
        let entry = &self.entries[&victim];
        let below = TIERS
            .into_iter()
            .skip_while(|&t| t != tier)
            .skip(1)
            .find(|&t| self.config.limits(t).is_some());
        let demote = below.filter(|&to| {
            !entry.present(to) && entry.uses >= self.config.limits(to).map_or(1, |l| l.min_reuse)
        });
        if let Some(to) = demote
            && self.reserve(victim, to, actions)
        {
            self.entries.get_mut(&victim).expect("victims exist").slots[slot(tier)].leaving = true;
            actions.push(Action::Move {
                hash: victim,
                from: tier,
                to,
            });
            return;
        }
        actions.push(Action::Delete { hash: victim, tier });
        self.forget_if_gone(victim);
    }

    /// Takes `hash` out of `tier` (held), keeping its entry.
    fn release(&mut self, hash: SeqHash, tier: Tier) {
        let entry = self.entries.get_mut(&hash).expect("released blocks exist");
        let s = &mut entry.slots[slot(tier)];
        let stamp = s.stamp.take().expect("released blocks are held");
        let t = &mut self.tiers[slot(tier)];
        t.lru.remove(&stamp);
        t.used -= entry.bytes;
        t.blocks -= 1;
    }

    fn forget_if_gone(&mut self, hash: SeqHash) {
        if self.entries.get(&hash).is_some_and(|e| !e.anywhere()) {
            self.entries.remove(&hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KB: u64 = 1000;

    fn limits(capacity_bytes: u64, min_reuse: u32) -> Option<TierLimits> {
        Some(TierLimits {
            capacity_bytes,
            min_reuse,
        })
    }

    /// Carries out actions at once, as a store whose writes all succeed.
    fn apply(p: &mut Placement, actions: &[Action]) {
        for a in actions {
            match *a {
                Action::Write { hash, tier } | Action::Move { hash, to: tier, .. } => {
                    p.written(hash, tier)
                }
                Action::Delete { .. } => {}
            }
        }
    }

    fn offload(p: &mut Placement, h: u64) -> (Offered, Vec<Action>) {
        let (offered, actions) = p.offload(SeqHash(h), None, KB);
        apply(p, &actions);
        (offered, actions)
    }

    #[test]
    fn host_evicts_lru_and_demotes_only_reused_blocks() {
        let mut p = Placement::new(PlacementConfig {
            host: limits(2 * KB, 1),
            disk: limits(10 * KB, 2),
            object: None,
        });
        offload(&mut p, 1);
        offload(&mut p, 2);
        assert_eq!(
            offload(&mut p, 2).0,
            Offered::Duplicate,
            "2 is now used twice"
        );
        // Host is full: 1 is the least recently used, seen once: dropped.
        let (_, actions) = offload(&mut p, 3);
        assert_eq!(
            actions,
            [
                Action::Delete {
                    hash: SeqHash(1),
                    tier: Tier::Host
                },
                Action::Write {
                    hash: SeqHash(3),
                    tier: Tier::Host
                }
            ]
        );
        // Next out is 2, seen twice: it moves to disk.
        let (_, actions) = offload(&mut p, 4);
        assert!(actions.contains(&Action::Move {
            hash: SeqHash(2),
            from: Tier::Host,
            to: Tier::Disk
        }));
        assert_eq!(
            p.lookup(&[SeqHash(2), SeqHash(3), SeqHash(9), SeqHash(4)]),
            [(SeqHash(2), Tier::Disk), (SeqHash(3), Tier::Host)]
        );
        // Read back from disk, it is copied up to host again.
        let actions = p.onboarded(SeqHash(2), Tier::Disk);
        assert!(actions.contains(&Action::Write {
            hash: SeqHash(2),
            tier: Tier::Host
        }));
        apply(&mut p, &actions);
        assert_eq!(p.best(SeqHash(2)), Some(Tier::Host));
    }

    #[test]
    fn a_tier_full_of_writes_in_flight_refuses_instead_of_waiting() {
        let mut p = Placement::new(PlacementConfig {
            host: None,
            disk: limits(2 * KB, 2),
            object: None,
        });
        for h in [1, 2] {
            assert_eq!(p.offload(SeqHash(h), None, KB).0, Offered::Stored);
        }
        assert_eq!(p.offload(SeqHash(3), None, KB), (Offered::Refused, vec![]));
        assert_eq!(p.lookup(&[SeqHash(1)]), [], "not held until written");
        p.failed(SeqHash(1), Tier::Disk);
        p.written(SeqHash(2), Tier::Disk);
        assert_eq!(
            p.usage(Tier::Disk),
            TierUsage {
                bytes: KB,
                blocks: 1
            }
        );
        assert_eq!(p.offload(SeqHash(3), None, KB).0, Offered::Stored);
    }

    #[test]
    fn restore_keeps_what_fits_and_deletes_the_rest() {
        let mut p = Placement::new(PlacementConfig {
            disk: limits(2 * KB, 1),
            ..Default::default()
        });
        let mut deleted = Vec::new();
        for h in 1..=3 {
            deleted.extend(p.restore(SeqHash(h), None, KB, Tier::Disk));
        }
        assert_eq!(
            deleted,
            [Action::Delete {
                hash: SeqHash(1),
                tier: Tier::Disk
            }],
            "the oldest goes"
        );
        assert_eq!(p.lookup(&[SeqHash(2), SeqHash(3)]).len(), 2);
        p.lost(SeqHash(2), Tier::Disk);
        assert_eq!(p.lookup(&[SeqHash(2)]), []);
        assert_eq!(p.len(), 1);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Offload(u8, u64),
        Onboard(u8),
        Finish(u8, bool),
        Lost(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..24, 1u64..4).prop_map(|(h, kb)| Op::Offload(h, kb)),
            (0u8..24).prop_map(Op::Onboard),
            (0u8..24, any::<bool>()).prop_map(|(h, ok)| Op::Finish(h, ok)),
            (0u8..24).prop_map(Op::Lost),
        ]
    }

    proptest! {
        /// Against a model of what the executor holds: every tier's accounting matches
        /// the blocks in it and stays within capacity, a lookup names only blocks some
        /// tier holds, and every action is one the executor can carry out.
        #[test]
        fn accounting_matches_what_is_held(ops in proptest::collection::vec(op(), 1..200)) {
            let mut p = Placement::new(PlacementConfig {
                host: limits(4 * KB, 1),
                disk: limits(6 * KB, 2),
                object: limits(8 * KB, 2),
            });
            // (hash, tier) -> bytes, as the executor would hold them (copies a move is
            // leaving apart: readable, not counted); writes in flight with their source.
            let mut held: HashMap<(SeqHash, Tier), u64> = HashMap::new();
            let mut leaving: Vec<(SeqHash, Tier)> = Vec::new();
            let mut in_flight: Vec<(SeqHash, Tier, Option<Tier>)> = Vec::new();
            let mut sizes: HashMap<SeqHash, u64> = HashMap::new();
            let run = |actions: Vec<Action>,
                       held: &mut HashMap<(SeqHash, Tier), u64>,
                       leaving: &mut Vec<(SeqHash, Tier)>,
                       in_flight: &mut Vec<(SeqHash, Tier, Option<Tier>)>| {
                for a in actions {
                    match a {
                        Action::Write { hash, tier } => in_flight.push((hash, tier, None)),
                        Action::Move { hash, from, to } => {
                            prop_assert!(held.remove(&(hash, from)).is_some(), "move from a copy not held");
                            leaving.push((hash, from));
                            in_flight.push((hash, to, Some(from)));
                        }
                        Action::Delete { hash, tier } => {
                            prop_assert!(held.remove(&(hash, tier)).is_some(), "delete of a copy not held");
                        }
                    }
                }
                Ok(())
            };
            for op in ops {
                match op {
                    Op::Offload(h, kb) => {
                        let h = SeqHash(h.into());
                        let bytes = *sizes.entry(h).or_insert(kb * KB);
                        let (_, actions) = p.offload(h, None, bytes);
                        run(actions, &mut held, &mut leaving, &mut in_flight)?;
                    }
                    Op::Onboard(h) => {
                        let h = SeqHash(h.into());
                        if let Some(tier) = p.best(h) {
                            prop_assert!(held.contains_key(&(h, tier)) || leaving.contains(&(h, tier)));
                            let actions = p.onboarded(h, tier);
                            run(actions, &mut held, &mut leaving, &mut in_flight)?;
                        }
                    }
                    Op::Finish(h, ok) => {
                        let h = SeqHash(h.into());
                        if let Some(i) = in_flight.iter().position(|(x, _, _)| *x == h) {
                            let (hash, tier, from) = in_flight.remove(i);
                            if ok {
                                p.written(hash, tier);
                                held.insert((hash, tier), sizes[&hash]);
                            } else {
                                p.failed(hash, tier);
                            }
                            if let Some(from) = from {
                                leaving.retain(|l| *l != (hash, from));
                            }
                        }
                    }
                    Op::Lost(h) => {
                        let h = SeqHash(h.into());
                        if let Some(tier) = p.best(h).filter(|t| held.contains_key(&(h, *t))) {
                            p.lost(h, tier);
                            held.remove(&(h, tier));
                        }
                    }
                }
                for tier in TIERS {
                    let limits = p.config().limits(tier).unwrap();
                    let usage = p.usage(tier);
                    let model_bytes: u64 = held.iter().filter(|((_, t), _)| *t == tier).map(|(_, b)| b).sum::<u64>()
                        + in_flight.iter().filter(|(_, t, _)| *t == tier).map(|(h, _, _)| sizes[h]).sum::<u64>();
                    prop_assert_eq!(usage.bytes, model_bytes, "{:?}", tier);
                    prop_assert!(usage.bytes <= limits.capacity_bytes);
                }
                for h in 0..24u64 {
                    let h = SeqHash(h);
                    if let Some(tier) = p.best(h) {
                        prop_assert!(held.contains_key(&(h, tier)) || leaving.contains(&(h, tier)));
                    }
                }
            }
        }
    }
}
