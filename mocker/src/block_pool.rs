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
//! is listed at most once per stay in the pool, and never when it came from the sidecar.

use std::collections::HashMap;

use dynamo_kvcache::SeqHash;
use dynamo_kvcache::vllm_events::{KvEvent, MEDIUM_GPU};
use thiserror::Error;

use crate::kv_blocks::OffloadMode;

pub type BlockId = u32;

const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Block {
    ref_count: u32,
    hash: Option<SeqHash>,
    /// The hash of the block before it in its chain, kept for offloading.
    parent: Option<SeqHash>,
    /// The sidecar holds (or was handed) this block already.
    offloaded: bool,
    prev: u32,
    next: u32,
    in_free_queue: bool,
}

/// A registered block to copy into the sidecar's tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffloadBlock {
    pub hash: SeqHash,
    pub parent: Option<SeqHash>,
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
    head: u32,
    tail: u32,
    num_free: usize,
    events: Vec<KvEvent>,
    emit_events: bool,
    offload: Option<OffloadMode>,
    offloads: Vec<OffloadBlock>,
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
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == num_blocks as u32 {
                    NIL
                } else {
                    i + 1
                },
                in_free_queue: true,
            })
            .collect();
        Self {
            blocks,
            block_size,
            cached: HashMap::new(),
            head: 0,
            tail: num_blocks as u32 - 1,
            num_free: num_blocks,
            events: Vec::new(),
            emit_events: true,
            offload: None,
            offloads: Vec::new(),
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

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks that allocation may take: never used, or cached but unreferenced.
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

    /// Takes a reference on the cached block for `hash`.
    pub fn touch(&mut self, hash: SeqHash) -> Option<BlockId> {
        let id = *self.cached.get(&hash)?;
        if self.blocks[id as usize].ref_count == 0 {
            self.unlink(id);
        }
        self.blocks[id as usize].ref_count += 1;
        Some(id)
    }

    /// Allocates `n` blocks from the head of the free queue, evicting the cached ones
    /// among them. All or nothing.
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
            let id = self.head;
            self.unlink(id);
            let b = &mut self.blocks[id as usize];
            b.ref_count = 1;
            if let Some(h) = b.hash.take() {
                self.cached.remove(&h);
                evicted.push(h.0);
                if self.offload == Some(OffloadMode::Evicted) && !b.offloaded {
                    self.offloads.push(OffloadBlock {
                        hash: h,
                        parent: b.parent,
                    });
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
    pub fn free(&mut self, ids: impl IntoIterator<Item = BlockId>) {
        for id in ids {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.ref_count > 0, "double free of block {id}");
            b.ref_count -= 1;
            if b.ref_count == 0 {
                self.push_tail(id);
            }
        }
    }

    /// Forgets every cached block, as vLLM's `reset_prefix_cache`; refused (false)
    /// while any block is referenced.
    pub fn reset(&mut self) -> bool {
        if self.num_free != self.blocks.len() {
            return false;
        }
        for b in &mut self.blocks {
            b.hash = None;
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

    fn unlink(&mut self, id: BlockId) {
        let (prev, next) = {
            let b = &self.blocks[id as usize];
            debug_assert!(b.in_free_queue);
            (b.prev, b.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = NIL;
        b.next = NIL;
        b.in_free_queue = false;
        self.num_free -= 1;
    }

    fn push_tail(&mut self, id: BlockId) {
        let tail = self.tail;
        {
            let b = &mut self.blocks[id as usize];
            debug_assert!(!b.in_free_queue);
            b.prev = tail;
            b.next = NIL;
            b.in_free_queue = true;
        }
        if tail == NIL {
            self.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.tail = id;
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
        assert_eq!(pool.touch(h(1)), Some(a[0]));
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
    fn reset_needs_an_idle_pool() {
        let mut pool = BlockPool::new(2, 1);
        let a = pool.allocate(1).unwrap();
        assert!(!pool.reset());
        pool.free(a);
        assert!(pool.reset());
        assert_eq!(pool.take_events(), vec![KvEvent::AllBlocksCleared]);
    }
}
