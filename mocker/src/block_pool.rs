//! The GPU KV block pool with prefix caching, after vLLM v1's `BlockPool`
//! (vllm/v1/core/block_pool.py) and `FreeKVCacheBlockQueue` (kv_cache_utils.py):
//!
//! - a full block whose tokens are known is registered under its chained sequence hash
//!   and can be shared by any sequence with the same prefix (reference counted);
//! - a block whose count drops to 0 joins the tail of the free queue but *stays cached*
//!   until allocation takes it from the head (LRU eviction), which is when it is
//!   removed from the cache and reported with `BlockRemoved`;
//! - a cache hit on a free block takes it out of the queue again;
//! - a partial (not yet full) block has no hash and belongs to one sequence.
//!
//! One deliberate difference: vLLM lets two blocks carry the same hash when two
//! sequences compute the same block at once; here the second copy stays unregistered,
//! so each hash is stored (and reported) once.
//!
//! With an [`OffloadMode`] set, the pool also lists the blocks to hand to the sidecar's
//! tiers (`take_offloads`): those it evicts, or every block as it is registered. A block
//! is listed at most once per stay in the pool, and never when it came from the sidecar,
//! except a pinned block evicted under pressure (below).
//!
//! Pins (Dynamo's `nvext.cache_control`, prefix pinning): a cached block may carry a pin,
//! an expiry in engine time ([`BlockPool::set_now`]; simulated or wall milliseconds, so
//! replays and the server pin alike). Allocation passes over free blocks with a live pin
//! while any other free block remains: the first time the LRU walk meets one, it moves
//! it to a second queue ("parked"), so later allocations do not walk it again. Every
//! parked block is older than every block of the free queue (it was the free queue's
//! head when parked), so a block whose pin runs out goes back to the free queue's head
//! and is evicted in its LRU turn. When only pinned blocks are free, allocation takes
//! them, least recently used first, and their pins are lost (counted): a pin is a
//! preference against eviction, never a reservation that would refuse or preempt a
//! request that fits. A pinned block evicted so is demoted to the KV tier when the
//! engine has one, whatever the offload mode does with other blocks.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};

use dynamo_kvcache::SeqHash;
use dynamo_kvcache::vllm_events::{KvEvent, MEDIUM_GPU};
use thiserror::Error;

use crate::kv_blocks::OffloadMode;

pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// Where an unreferenced block waits; a referenced one is in neither queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    InUse,
    Free,
    Parked,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Pin {
    until_ms: f64,
    /// What a hit renews the pin for.
    ttl_ms: f64,
}

#[derive(Clone, Debug)]
struct Block {
    ref_count: u32,
    hash: Option<SeqHash>,
    /// The hash of the block before it in its chain, kept for offloading.
    parent: Option<SeqHash>,
    /// The sidecar holds (or was handed) this block already.
    offloaded: bool,
    /// A live pin; cleared when it runs out or the block is evicted.
    pin: Option<Pin>,
    prev: u32,
    next: u32,
    queue: Queue,
}

#[derive(Clone, Copy, Debug)]
struct List {
    head: u32,
    tail: u32,
}

/// A pin's expiry, ordered (engine times are finite).
#[derive(Clone, Copy, Debug)]
struct Expiry(f64);

impl PartialEq for Expiry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Expiry {}

impl PartialOrd for Expiry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Expiry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A registered block to copy into the sidecar's tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadBlock {
    pub hash: SeqHash,
    pub parent: Option<SeqHash>,
}

/// Running totals of pinning, in blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinCounters {
    /// Pins put on blocks that had none.
    pub set: u64,
    /// Live pins pushed later by a hit or by a request pinning the block again.
    pub renewed: u64,
    /// Pinned blocks evicted because only pinned blocks were free, handed to the KV tier.
    pub evicted_offloaded: u64,
    /// The same, dropped (no KV tier).
    pub evicted_dropped: u64,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("{requested} blocks requested, {free} free")]
pub struct OutOfBlocks {
    pub requested: usize,
    pub free: usize,
}

#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    block_size: usize,
    cached: HashMap<SeqHash, BlockId>,
    /// Unreferenced blocks, least recently used first.
    free: List,
    /// Unreferenced blocks with a live pin that allocation has passed over, LRU first.
    parked: List,
    /// Blocks in either queue.
    num_free: usize,
    events: Vec<KvEvent>,
    emit_events: bool,
    offload: Option<OffloadMode>,
    offloads: Vec<OffloadBlock>,
    /// Engine time, ms.
    now_ms: f64,
    /// Every live pin, by expiry.
    pins: BTreeSet<(Expiry, BlockId)>,
    pin_counters: PinCounters,
}

impl BlockPool {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(num_blocks > 0 && num_blocks < NIL as usize, "pool size");
        let blocks = (0..num_blocks as u32)
            .map(|i| Block {
                ref_count: 0,
                hash: None,
                parent: None,
                offloaded: false,
                pin: None,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == num_blocks as u32 {
                    NIL
                } else {
                    i + 1
                },
                queue: Queue::Free,
            })
            .collect();
        Self {
            blocks,
            block_size,
            cached: HashMap::new(),
            free: List {
                head: 0,
                tail: num_blocks as u32 - 1,
            },
            parked: List {
                head: NIL,
                tail: NIL,
            },
            num_free: num_blocks,
            events: Vec::new(),
            emit_events: true,
            offload: None,
            offloads: Vec::new(),
            now_ms: 0.0,
            pins: BTreeSet::new(),
            pin_counters: PinCounters::default(),
        }
    }

    /// Which blocks to list for the sidecar; `None` (the default) lists none.
    pub fn set_offload(&mut self, mode: Option<OffloadMode>) {
        self.offload = mode;
    }

    /// Stops recording events (for replays that do not read them).
    pub fn set_emit_events(&mut self, on: bool) {
        self.emit_events = on;
    }

    /// Moves the pool's time (engine milliseconds) forward to `now_ms`; pins that have
    /// run out by then stop counting. The engine calls it as its clock moves.
    pub fn set_now(&mut self, now_ms: f64) {
        self.now_ms = self.now_ms.max(now_ms);
        let mut unparked = false;
        while let Some(&(Expiry(until_ms), id)) = self.pins.first() {
            if until_ms > self.now_ms {
                break;
            }
            self.pins.pop_first();
            let b = &mut self.blocks[id as usize];
            b.pin = None;
            unparked |= b.queue == Queue::Parked;
        }
        if unparked {
            // Walking back from the tail keeps their order at the free queue's head.
            let mut id = self.parked.tail;
            while id != NIL {
                let prev = self.blocks[id as usize].prev;
                if self.blocks[id as usize].pin.is_none() {
                    self.unlink(id);
                    self.push_front(Queue::Free, id);
                }
                id = prev;
            }
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks that allocation may take: never used, or cached but unreferenced (pinned
    /// ones included: pressure takes them last).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Fraction of blocks referenced by a sequence, as vLLM's `get_usage`
    /// (cached-but-free blocks count as free).
    pub fn usage(&self) -> f64 {
        1.0 - self.num_free as f64 / self.blocks.len() as f64
    }

    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Blocks with a live pin, referenced or free.
    pub fn num_pinned(&self) -> usize {
        self.pins.len()
    }

    pub fn pin_counters(&self) -> PinCounters {
        self.pin_counters
    }

    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_count
    }

    pub fn is_cached(&self, hash: &SeqHash) -> bool {
        self.cached.contains_key(hash)
    }

    /// Number of leading `hashes` that are cached; does not touch anything.
    pub fn cached_prefix_len(&self, hashes: &[SeqHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// How many of the cached blocks for `hashes` sit in the free queue (and would
    /// leave it if touched).
    pub fn free_among_cached(&self, hashes: &[SeqHash]) -> usize {
        hashes
            .iter()
            .filter_map(|h| self.cached.get(h))
            .filter(|&&id| self.blocks[id as usize].ref_count == 0)
            .count()
    }

    /// Takes a reference on the cached block for `hash`. The hit renews the block's
    /// live pin for its TTL (Dynamo's refresh-on-hit: "each cache hit resets the TTL",
    /// with or without `cache_control` on the hitting request); `pin_ttl_ms` (the
    /// request pins this block) pins it for at least that long.
    pub fn touch(&mut self, hash: SeqHash, pin_ttl_ms: Option<f64>) -> Option<BlockId> {
        let id = *self.cached.get(&hash)?;
        if self.blocks[id as usize].ref_count == 0 {
            self.unlink(id);
        }
        let b = &mut self.blocks[id as usize];
        b.ref_count += 1;
        let renew = b.pin.map(|p| p.ttl_ms);
        if let Some(ttl_ms) = renew.into_iter().chain(pin_ttl_ms).reduce(f64::max) {
            self.pin_block(id, ttl_ms);
        }
        Some(id)
    }

    /// Pins the cached blocks of `hashes` for `ttl_ms` from now; a pin that already
    /// lasts longer is kept (requests sharing a prefix never shorten each other's pins).
    pub fn pin(&mut self, hashes: &[SeqHash], ttl_ms: f64) {
        for h in hashes {
            if let Some(&id) = self.cached.get(h) {
                self.pin_block(id, ttl_ms);
            }
        }
    }

    fn pin_block(&mut self, id: BlockId, ttl_ms: f64) {
        let until_ms = self.now_ms + ttl_ms;
        let b = &mut self.blocks[id as usize];
        match b.pin {
            Some(p) if p.until_ms >= until_ms => return,
            Some(p) => {
                self.pins.remove(&(Expiry(p.until_ms), id));
                self.pin_counters.renewed += 1;
            }
            None => self.pin_counters.set += 1,
        }
        b.pin = Some(Pin { until_ms, ttl_ms });
        self.pins.insert((Expiry(until_ms), id));
    }

    /// Allocates `n` blocks, evicting the cached ones among them, least recently used
    /// first and pinned ones last. All or nothing.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>, OutOfBlocks> {
        if n > self.num_free {
            return Err(OutOfBlocks {
                requested: n,
                free: self.num_free,
            });
        }
        let mut out = Vec::with_capacity(n);
        let mut evicted = Vec::new();
        for _ in 0..n {
            let (id, lost_pin) = self.take_lru();
            let b = &mut self.blocks[id as usize];
            b.ref_count = 1;
            if let Some(h) = b.hash.take() {
                self.cached.remove(&h);
                evicted.push(h.0);
                // A pinned block is demoted to the tier rather than dropped, even one the
                // sidecar was handed before: it may have dropped it since, and a copy it
                // still holds is refreshed there.
                let offload = match self.offload {
                    None => false,
                    Some(_) if lost_pin => true,
                    Some(mode) => mode == OffloadMode::Evicted && !b.offloaded,
                };
                if offload {
                    self.offloads.push(OffloadBlock {
                        hash: h,
                        parent: b.parent,
                    });
                }
                match (lost_pin, offload) {
                    (true, true) => self.pin_counters.evicted_offloaded += 1,
                    (true, false) => self.pin_counters.evicted_dropped += 1,
                    (false, _) => {}
                }
            }
            out.push(id);
        }
        if !evicted.is_empty() && self.emit_events {
            self.events.push(KvEvent::BlockRemoved {
                block_hashes: evicted,
                medium: Some(MEDIUM_GPU.into()),
            });
        }
        Ok(out)
    }

    /// Takes the block allocation uses next: the least recently used free block without
    /// a live pin (parking the pinned ones met on the way), else the least recently used
    /// parked one, whose pin is lost (`true`). Needs a free block.
    fn take_lru(&mut self) -> (BlockId, bool) {
        while self.free.head != NIL {
            let id = self.free.head;
            self.unlink(id);
            if self.blocks[id as usize].pin.is_none() {
                return (id, false);
            }
            self.push_back(Queue::Parked, id);
        }
        let id = self.parked.head;
        assert_ne!(id, NIL, "no free block to take");
        self.unlink(id);
        let pin = self.blocks[id as usize]
            .pin
            .take()
            .expect("parked blocks are pinned");
        self.pins.remove(&(Expiry(pin.until_ms), id));
        (id, true)
    }

    /// Registers full blocks `ids[i]` under `hashes[i]`, `parent` being the hash of the
    /// block before `ids[0]`; `tokens` holds their `ids.len() * block_size` tokens.
    /// Emits one `BlockStored` per run of newly cached blocks.
    pub fn commit_full(
        &mut self,
        ids: &[BlockId],
        hashes: &[SeqHash],
        parent: Option<SeqHash>,
        tokens: &[u32],
    ) {
        self.register(ids, hashes, parent, tokens, false);
    }

    /// As [`Self::commit_full`], for blocks whose KV was onboarded from the sidecar:
    /// they are cached like computed ones but never offloaded back.
    pub fn commit_onboarded(
        &mut self,
        ids: &[BlockId],
        hashes: &[SeqHash],
        parent: Option<SeqHash>,
        tokens: &[u32],
    ) {
        self.register(ids, hashes, parent, tokens, true);
    }

    fn register(
        &mut self,
        ids: &[BlockId],
        hashes: &[SeqHash],
        parent: Option<SeqHash>,
        tokens: &[u32],
        from_sidecar: bool,
    ) {
        debug_assert_eq!(ids.len(), hashes.len());
        debug_assert_eq!(tokens.len(), ids.len() * self.block_size);
        let write_through = self.offload == Some(OffloadMode::All) && !from_sidecar;
        let mut run_start: Option<usize> = None;
        for i in 0..ids.len() {
            let (id, h) = (ids[i], hashes[i]);
            let newly = self.blocks[id as usize].hash.is_none() && !self.cached.contains_key(&h);
            if newly {
                let block_parent = if i == 0 { parent } else { Some(hashes[i - 1]) };
                let b = &mut self.blocks[id as usize];
                b.hash = Some(h);
                b.parent = block_parent;
                b.offloaded = from_sidecar || write_through;
                if write_through {
                    self.offloads.push(OffloadBlock {
                        hash: h,
                        parent: block_parent,
                    });
                }
                self.cached.insert(h, id);
                run_start.get_or_insert(i);
            } else if let Some(s) = run_start.take() {
                self.emit_stored(s, i, hashes, parent, tokens);
            }
        }
        if let Some(s) = run_start {
            self.emit_stored(s, ids.len(), hashes, parent, tokens);
        }
    }

    fn emit_stored(
        &mut self,
        from: usize,
        to: usize,
        hashes: &[SeqHash],
        parent: Option<SeqHash>,
        tokens: &[u32],
    ) {
        if !self.emit_events {
            return;
        }
        let parent = if from == 0 {
            parent
        } else {
            Some(hashes[from - 1])
        };
        self.events.push(KvEvent::BlockStored {
            block_hashes: hashes[from..to].iter().map(|h| h.0).collect(),
            parent_hash: parent.map(|h| h.0),
            token_ids: tokens[from * self.block_size..to * self.block_size].to_vec(),
            block_size: self.block_size as u32,
            lora_id: None,
            medium: Some(MEDIUM_GPU.into()),
            lora_name: None,
        });
    }

    /// Drops one reference on each block. Callers pass a sequence's blocks in reverse
    /// order (as vLLM's `KVCacheManager.free`) so its tail is evicted before its head.
    /// A block keeps its pin.
    pub fn free(&mut self, ids: impl IntoIterator<Item = BlockId>) {
        for id in ids {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.ref_count > 0, "double free of block {id}");
            b.ref_count -= 1;
            if b.ref_count == 0 {
                self.push_back(Queue::Free, id);
            }
        }
    }

    /// Forgets every cached block and every pin, as vLLM's `reset_prefix_cache`;
    /// refused (false) while any block is referenced.
    pub fn reset(&mut self) -> bool {
        if self.num_free != self.blocks.len() {
            return false;
        }
        for b in &mut self.blocks {
            b.hash = None;
            b.pin = None;
        }
        self.pins.clear();
        while self.parked.head != NIL {
            let id = self.parked.head;
            self.unlink(id);
            self.push_back(Queue::Free, id);
        }
        self.cached.clear();
        if self.emit_events {
            self.events.push(KvEvent::AllBlocksCleared);
        }
        true
    }

    /// Events since the last call, in order.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Blocks to offload listed since the last call, in order.
    pub fn take_offloads(&mut self) -> Vec<OffloadBlock> {
        std::mem::take(&mut self.offloads)
    }

    fn list_mut(&mut self, queue: Queue) -> &mut List {
        match queue {
            Queue::Free => &mut self.free,
            Queue::Parked => &mut self.parked,
            Queue::InUse => unreachable!("a referenced block is in no queue"),
        }
    }

    fn unlink(&mut self, id: BlockId) {
        let (queue, prev, next) = {
            let b = &self.blocks[id as usize];
            (b.queue, b.prev, b.next)
        };
        if prev == NIL {
            self.list_mut(queue).head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.list_mut(queue).tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = NIL;
        b.next = NIL;
        b.queue = Queue::InUse;
        self.num_free -= 1;
    }

    fn push_back(&mut self, queue: Queue, id: BlockId) {
        let tail = self.list_mut(queue).tail;
        {
            let b = &mut self.blocks[id as usize];
            debug_assert_eq!(b.queue, Queue::InUse);
            b.prev = tail;
            b.next = NIL;
            b.queue = queue;
        }
        if tail == NIL {
            self.list_mut(queue).head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.list_mut(queue).tail = id;
        self.num_free += 1;
    }

    fn push_front(&mut self, queue: Queue, id: BlockId) {
        let head = self.list_mut(queue).head;
        {
            let b = &mut self.blocks[id as usize];
            debug_assert_eq!(b.queue, Queue::InUse);
            b.prev = NIL;
            b.next = head;
            b.queue = queue;
        }
        if head == NIL {
            self.list_mut(queue).tail = id;
        } else {
            self.blocks[head as usize].prev = id;
        }
        self.list_mut(queue).head = id;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: u64) -> SeqHash {
        SeqHash(x)
    }

    #[test]
    fn freed_full_block_stays_cached_until_evicted_lru_first() {
        let mut pool = BlockPool::new(3, 2);
        let a = pool.allocate(1).unwrap();
        pool.commit_full(&a, &[h(10)], None, &[1, 2]);
        let b = pool.allocate(1).unwrap();
        pool.commit_full(&b, &[h(20)], None, &[3, 4]);
        pool.free(a.clone());
        pool.free(b.clone());
        assert_eq!(pool.num_free(), 3);
        assert_eq!(
            pool.cached_prefix_len(&[h(10)]),
            1,
            "still cached when free"
        );

        // The never-used block goes first, then the least recently freed (10).
        let _ = pool.take_events();
        pool.allocate(2).unwrap();
        assert_eq!(
            pool.take_events(),
            vec![KvEvent::BlockRemoved {
                block_hashes: vec![10],
                medium: Some("GPU".into())
            }]
        );
        assert_eq!(pool.cached_prefix_len(&[h(20)]), 1);
        assert_eq!(pool.cached_prefix_len(&[h(10)]), 0);
    }

    #[test]
    fn touching_a_free_cached_block_protects_it_from_eviction() {
        let mut pool = BlockPool::new(2, 1);
        let a = pool.allocate(1).unwrap();
        pool.commit_full(&a, &[h(1)], None, &[7]);
        pool.free(a.clone());
        assert_eq!(pool.touch(h(1), None), Some(a[0]));
        assert_eq!(pool.num_free(), 1);
        assert!(pool.allocate(2).is_err());
        pool.allocate(1).unwrap();
        assert_eq!(pool.cached_prefix_len(&[h(1)]), 1);
    }

    #[test]
    fn duplicate_hash_is_stored_once_and_events_split_runs() {
        let mut pool = BlockPool::new(4, 1);
        let a = pool.allocate(1).unwrap();
        pool.commit_full(&a, &[h(2)], Some(h(1)), &[5]);
        let ids = pool.allocate(3).unwrap();
        let _ = pool.take_events();
        pool.commit_full(&ids, &[h(1), h(2), h(3)], None, &[4, 5, 6]);
        let ev = pool.take_events();
        assert_eq!(ev.len(), 2);
        assert!(matches!(&ev[1],
            KvEvent::BlockStored { block_hashes, parent_hash: Some(2), token_ids, .. }
            if block_hashes == &vec![3] && token_ids == &vec![6]));
    }

    #[test]
    fn reset_needs_an_idle_pool_and_drops_pins() {
        let mut pool = BlockPool::new(2, 1);
        let a = pool.allocate(1).unwrap();
        pool.commit_full(&a, &[h(1)], None, &[1]);
        pool.pin(&[h(1)], 1000.0);
        assert!(!pool.reset());
        pool.free(a);
        // The second allocation parks the pinned block: the reset empties both queues.
        for _ in 0..2 {
            let b = pool.allocate(1).unwrap();
            pool.free(b);
        }
        let _ = pool.take_events();
        assert!(pool.reset());
        assert_eq!(pool.take_events(), vec![KvEvent::AllBlocksCleared]);
        assert_eq!((pool.num_pinned(), pool.num_free()), (0, 2));
        pool.allocate(2).unwrap();
        assert_eq!(pool.pin_counters().evicted_dropped, 0);
    }

    /// A pool of `n` one-token blocks holding hashes `1..=n`, all freed in that order
    /// (1 least recently used), with `pinned` of them pinned for `ttl_ms` at time 0.
    fn freed_pool(n: u64, pinned: &[u64], ttl_ms: f64) -> BlockPool {
        let mut pool = BlockPool::new(n as usize, 1);
        let ids = pool.allocate(n as usize).unwrap();
        let hashes: Vec<SeqHash> = (1..=n).map(h).collect();
        let tokens: Vec<u32> = (1..=n as u32).collect();
        pool.commit_full(&ids, &hashes, None, &tokens);
        let pins: Vec<SeqHash> = pinned.iter().copied().map(h).collect();
        pool.pin(&pins, ttl_ms);
        pool.free(ids);
        let _ = pool.take_events();
        pool
    }

    fn removed(pool: &mut BlockPool) -> Vec<u64> {
        pool.take_events()
            .into_iter()
            .flat_map(|e| match e {
                KvEvent::BlockRemoved { block_hashes, .. } => block_hashes,
                _ => vec![],
            })
            .collect()
    }

    #[test]
    fn a_pinned_block_outlives_pressure_that_evicts_an_unpinned_one_of_the_same_age() {
        // 1 and 2 were committed together; 1 is the least recently used.
        let mut pool = freed_pool(3, &[1], 60_000.0);
        assert_eq!(pool.num_pinned(), 1);
        pool.set_now(1000.0);
        pool.allocate(1).unwrap();
        assert_eq!(removed(&mut pool), vec![2]);
        assert!(pool.is_cached(&h(1)) && pool.is_cached(&h(3)));
        // Without the pin, 1 would have gone first.
        let mut unpinned = freed_pool(3, &[], 0.0);
        unpinned.allocate(1).unwrap();
        assert_eq!(removed(&mut unpinned), vec![1]);
    }

    #[test]
    fn an_expired_pin_leaves_the_block_to_its_lru_turn() {
        let mut pool = freed_pool(3, &[1], 100.0);
        pool.set_now(10.0);
        let b = pool.allocate(1).unwrap(); // passes over 1, takes 2
        pool.free(b);
        assert_eq!(removed(&mut pool), vec![2]);
        pool.set_now(99.9);
        assert_eq!(pool.num_pinned(), 1);
        pool.set_now(100.0);
        assert_eq!(pool.num_pinned(), 0);
        // 1 is older than 3 (and than the empty block): its turn comes first.
        pool.allocate(1).unwrap();
        assert_eq!(removed(&mut pool), vec![1]);
        assert!(pool.is_cached(&h(3)));
        assert_eq!(pool.pin_counters().evicted_dropped, 0, "it was not pinned");
    }

    #[test]
    fn a_hit_renews_the_pin_for_its_ttl_or_the_hitting_requests() {
        let mut pool = freed_pool(3, &[1], 100.0);
        pool.set_now(80.0);
        // One hit on each, in LRU order: 1 stays the least recently used.
        for x in 1..=3 {
            let id = pool.touch(h(x), None).unwrap();
            pool.free([id]);
        }
        assert_eq!(pool.pin_counters().renewed, 1);
        pool.set_now(170.0);
        assert_eq!(pool.num_pinned(), 1, "renewed until 180");
        pool.allocate(1).unwrap();
        assert_eq!(removed(&mut pool), vec![2]);
        pool.set_now(180.0);
        assert_eq!(pool.num_pinned(), 0);

        // A hit without a pin pins nothing; a request that pins does, for its TTL.
        let mut pool = freed_pool(2, &[], 0.0);
        let a = pool.touch(h(1), None).unwrap();
        assert_eq!(pool.num_pinned(), 0);
        pool.free([a]);
        let a = pool.touch(h(1), Some(500.0)).unwrap();
        pool.free([a]);
        assert_eq!(pool.pin_counters().set, 1);
        // A shorter pin never cuts a longer one short.
        pool.pin(&[h(1)], 10.0);
        pool.set_now(499.0);
        assert_eq!(pool.num_pinned(), 1);
        pool.set_now(500.0);
        assert_eq!(pool.num_pinned(), 0);
    }

    #[test]
    fn pressure_with_only_pinned_blocks_left_takes_them_least_recent_first() {
        let mut pool = freed_pool(3, &[1, 2, 3], 60_000.0);
        let got = pool
            .allocate(2)
            .expect("pinned blocks never refuse an allocation");
        assert_eq!(got.len(), 2);
        assert_eq!(removed(&mut pool), vec![1, 2]);
        assert!(pool.is_cached(&h(3)));
        assert_eq!(pool.num_pinned(), 1);
        let c = pool.pin_counters();
        assert_eq!((c.evicted_dropped, c.evicted_offloaded), (2, 0));
        assert!(pool.take_offloads().is_empty(), "no KV tier");
    }

    #[test]
    fn an_evicted_pinned_block_is_demoted_whatever_the_offload_mode() {
        // Write-through lists a block once, when registered; evictions list nothing.
        let mut pool = BlockPool::new(2, 1);
        pool.set_offload(Some(OffloadMode::All));
        let ids = pool.allocate(2).unwrap();
        pool.commit_full(&ids, &[h(1), h(2)], None, &[1, 2]);
        pool.pin(&[h(1)], 60_000.0);
        pool.free(ids.iter().rev().copied());
        assert_eq!(pool.take_offloads().len(), 2);
        pool.allocate(2).unwrap();
        assert_eq!(
            pool.take_offloads(),
            vec![OffloadBlock {
                hash: h(1),
                parent: None
            }],
            "the pinned block again, not the unpinned one"
        );
        assert_eq!(pool.pin_counters().evicted_offloaded, 1);

        // Blocks that came from the sidecar are never offloaded back, unless pinned.
        let mut pool = BlockPool::new(2, 1);
        pool.set_offload(Some(OffloadMode::Evicted));
        let ids = pool.allocate(2).unwrap();
        pool.commit_onboarded(&ids, &[h(1), h(2)], Some(h(9)), &[1, 2]);
        pool.pin(&[h(2)], 60_000.0);
        pool.free(ids);
        pool.allocate(2).unwrap();
        assert_eq!(
            pool.take_offloads(),
            vec![OffloadBlock {
                hash: h(2),
                parent: Some(h(1))
            }]
        );
    }
}
