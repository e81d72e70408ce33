//! The block store: carries out [`Placement`]'s decisions with real bytes (host memory),
//! files ([`DiskTier`]) and objects ([`ObjectTier`]), and tells the pod's KV event hub
//! what each tier holds, so the endpoint picker credits a prefix by its tier.
//!
//! The engine never waits on a tier: an offload takes the block into host memory (or
//! hands it to a bounded number of background writes) and returns; a write that finds
//! no free slot is dropped and counted. Reads verify every block before it is served.

use super::admission::Admission;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dynamo_kvblocks::placement::{Action, Offered, Placement, PlacementConfig, TIERS};
use dynamo_kvblocks::{Block, record};
use dynamo_kvcache::{KvEvent, RemovedBlock, SeqHash, StoredBlock, Tier};
use dynamo_kvstream::KvEventHub;
use dynamo_server::Throttled;
use tokio::sync::Semaphore;

use super::disk::DiskTier;
use super::metrics::BlockMetrics;
use super::object::ObjectTier;

/// Write slots are counted in KiB (a semaphore's permits are `u32`).
const SLOT_UNIT: u64 = 1024;
/// Disk writes run on at most this many threads at once; the rest wait their turn off
/// the thread pool. Unbounded, a burst of demotions would put hundreds of writing
/// threads between an onboard's disk read and the CPU.
const DISK_WRITERS: usize = 2;
/// Object records listed at start to re-index the object tier.
const OBJECT_LIST_LIMIT: usize = 1_000_000;

/// A full disk or a failing object store fails every block: one line per interval each.
const WARN_EVERY: Duration = Duration::from_secs(10);
static DISK_WRITE: Throttled = Throttled::new(WARN_EVERY);
static DISK_READ: Throttled = Throttled::new(WARN_EVERY);
static DISK_DELETE: Throttled = Throttled::new(WARN_EVERY);
static OBJECT_WRITE: Throttled = Throttled::new(WARN_EVERY);
static OBJECT_READ: Throttled = Throttled::new(WARN_EVERY);
static OBJECT_DELETE: Throttled = Throttled::new(WARN_EVERY);

/// What a block of `record_bytes` counts against a tier: whole 4 KiB filesystem blocks,
/// the least a file takes, so that a disk tier of many small blocks stays within its
/// volume (and host memory is counted the same way, by one rule).
fn accounted(record_bytes: u64) -> u64 {
    record_bytes.next_multiple_of(4096)
}

/// What an offload did, as the block API's reply counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffloadCounts {
    pub stored: u64,
    pub duplicates: u64,
    pub dropped: u64,
    pub corrupt: u64,
}

/// Cheap to clone: clones share the store.
#[derive(Clone)]
pub struct BlockStore {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    disk: Option<LowerTier<DiskTier>>,
    object: Option<LowerTier<ObjectTier>>,
    /// Disk writes running at once (reads never wait for one).
    disk_writers: Arc<Semaphore>,
    hub: KvEventHub,
    metrics: Arc<BlockMetrics>,
    /// What a copy read back from disk or the object store must pass to be served.
    admission: Arc<Admission>,
}

/// A lower tier and its write slots (KiB of writes in flight).
struct LowerTier<T> {
    tier: Arc<T>,
    slots: Arc<Semaphore>,
}

struct State {
    placement: Placement,
    /// The host tier's bytes.
    host: HashMap<SeqHash, Block>,
}

impl BlockStore {
    /// A store with the tiers given; what the disk holds from a previous run is indexed
    /// (and published) before this returns, the object store's in the background.
    /// `write_buffer`: bytes of writes each lower tier may have in flight.
    pub fn open(
        placement: PlacementConfig,
        disk: Option<DiskTier>,
        object: Option<ObjectTier>,
        write_buffer: u64,
        hub: KvEventHub,
        metrics: Arc<BlockMetrics>,
        admission: Arc<Admission>,
    ) -> Self {
        let slots = || {
            let units = (write_buffer / SLOT_UNIT).clamp(1, Semaphore::MAX_PERMITS as u64);
            Arc::new(Semaphore::new(units as usize))
        };
        let store = Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    placement: Placement::new(placement),
                    host: HashMap::new(),
                }),
                disk: disk.map(|d| LowerTier {
                    tier: Arc::new(d),
                    slots: slots(),
                }),
                disk_writers: Arc::new(Semaphore::new(DISK_WRITERS)),
                object: object.map(|o| LowerTier {
                    tier: Arc::new(o),
                    slots: slots(),
                }),
                hub,
                metrics,
                admission,
            }),
        };
        store.reindex_disk();
        if store.inner.object.is_some() {
            let store = store.clone();
            tokio::spawn(async move { store.reindex_object().await });
        }
        store
    }

    /// Takes a block the engine offloads; `corrupt` when its payload does not match its
    /// checksum.
    pub fn offload(&self, block: Block) -> Outcome {
        if !block.verify() {
            return self.refuse_corrupt();
        }
        self.offload_verified(block)
    }

    /// Counts an offered block that is not what its writer wrote.
    pub fn refuse_corrupt(&self) -> Outcome {
        let m = &self.inner.metrics;
        m.offered.get_or_create(&[("outcome", "corrupt")]).inc();
        Outcome::Corrupt
    }

    /// Takes a block whose payload was checked against its checksum on the way in.
    pub fn offload_verified(&self, block: Block) -> Outcome {
        let m = &self.inner.metrics;
        let bytes = accounted(record::encoded_len(&block));
        let mut state = self.state();
        let (offered, actions) = state.placement.offload(block.hash, block.parent, bytes);
        self.execute(&mut state, actions, Some(&block), Source::Engine);
        let outcome = match offered {
            Offered::Stored => Outcome::Stored,
            Offered::Duplicate => Outcome::Duplicate,
            Offered::Refused => {
                m.dropped.get_or_create(&[("reason", "no_room")]).inc();
                Outcome::Dropped
            }
        };
        if outcome == Outcome::Stored {
            m.bytes
                .get_or_create(&[("direction", "offload")])
                .inc_by(block.payload.len() as u64);
        }
        m.offered
            .get_or_create(&[("outcome", outcome.as_str())])
            .inc();
        self.publish_usage(&state);
        outcome
    }

    /// The longest prefix of `chain` held, with each block's best tier.
    pub fn lookup(&self, chain: &[SeqHash]) -> Vec<(SeqHash, Tier)> {
        let held = self.state().placement.lookup(chain);
        self.inner
            .metrics
            .lookup(chain.len(), held.iter().map(|(_, t)| *t));
        held
    }

    /// Reads `hash` back for the engine, verified; `None` when no tier holds it (any
    /// more) or its copy is corrupt (which is then deleted and counted).
    pub async fn onboard(&self, hash: SeqHash) -> Option<Block> {
        let (tier, parent, host) = {
            let state = self.state();
            let tier = state.placement.best(hash)?;
            (
                tier,
                state.placement.parent(hash),
                state.host.get(&hash).cloned(),
            )
        };
        let read = match tier {
            Tier::Host => host.map_or(Read::Missing, Read::Found),
            Tier::Disk => self.read_disk(hash, parent).await,
            Tier::Object => self.read_object(hash, parent).await,
            Tier::Gpu => Read::Missing,
        };
        let m = &self.inner.metrics;
        // Host memory holds what was admitted on the way in, and the client verifies
        // what it receives; copies from files and objects are admitted again here (a
        // file may have been altered, a shared bucket written by another graph), before
        // they are trusted with a place in host memory.
        let admitted = |b: &Block| self.inner.admission.check(b).is_ok();
        let block = match read {
            Read::Found(b) if b.hash == hash && (tier == Tier::Host || admitted(&b)) => b,
            Read::Unavailable => return None,
            bad => {
                if !matches!(bad, Read::Missing) {
                    m.corrupt.get_or_create(&[("tier", tier.as_str())]).inc();
                }
                let mut state = self.state();
                self.lose(&mut state, hash, tier);
                self.publish_usage(&state);
                return None;
            }
        };
        match tier {
            Tier::Host => {
                m.onboard_h2d.inc();
            }
            Tier::Disk => {
                m.onboard_d2d.inc();
            }
            _ => {
                m.onboard_o2d.inc();
                m.onboard_bytes_object.inc_by(block.payload.len() as u64);
            }
        }
        m.matched_tokens.inc_by(block.tokens.into());
        m.bytes
            .get_or_create(&[("direction", "onboard")])
            .inc_by(block.payload.len() as u64);
        let mut state = self.state();
        let actions = state.placement.onboarded(hash, tier);
        self.execute(&mut state, actions, Some(&block), Source::Promoted);
        self.publish_usage(&state);
        Some(block)
    }

    /// Publishes every block the tiers hold, e.g. after the engine's events cleared
    /// the pod's view.
    pub fn republish(&self) {
        let state = self.state();
        for tier in TIERS {
            for hash in state.placement.held(tier) {
                self.stored(&state, hash, tier);
            }
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Carries out `actions`; `block` has the bytes of the block a `Write` names, which
    /// comes from `source`.
    fn execute(
        &self,
        state: &mut State,
        actions: Vec<Action>,
        block: Option<&Block>,
        source: Source,
    ) {
        for action in actions {
            match action {
                Action::Write { hash, tier } => {
                    let block = block
                        .filter(|b| b.hash == hash)
                        .expect("a write names the block at hand")
                        .clone();
                    self.write(state, block, tier, source);
                }
                Action::Move { hash, from, to } => match from {
                    // The host copy stays readable until the write below it ends.
                    Tier::Host => {
                        let block = state.host.get(&hash).expect("host holds its blocks");
                        self.write(state, block.clone(), to, Source::Demoted(from));
                    }
                    _ => self.move_down(state, hash, from, to),
                },
                Action::Delete { hash, tier } => {
                    self.removed(hash, tier);
                    let parent = state.placement.parent(hash);
                    self.delete(state, hash, parent, tier);
                }
            }
        }
    }

    /// Writes `block` to `tier`: at once for host memory, in the background below it.
    fn write(&self, state: &mut State, block: Block, tier: Tier, source: Source) {
        let hash = block.hash;
        match tier {
            Tier::Host => {
                if source == Source::Engine {
                    self.inner.metrics.offload_d2h.inc();
                }
                state.host.insert(hash, block);
                state.placement.written(hash, tier);
                self.stored(state, hash, tier);
            }
            Tier::Disk => {
                let Some(permit) = self.slot(&self.inner.disk, &block) else {
                    return self.no_slot(state, &block, tier, source, "disk_busy");
                };
                let disk = self.inner.disk.as_ref().map(|d| d.tier.clone());
                let disk = disk.expect("disk writes need a disk tier");
                let writers = self.inner.disk_writers.clone();
                let store = self.clone();
                tokio::spawn(async move {
                    let writer = writers.acquire_owned().await;
                    let written = {
                        let block = block.clone();
                        tokio::task::spawn_blocking(move || disk.put(&block)).await
                    };
                    drop((writer, permit));
                    let ok = match written {
                        Ok(Ok(())) => true,
                        Ok(Err(e)) => {
                            DISK_WRITE.log(|skipped| {
                                tracing::warn!(error = %e, skipped, "a KV block could not be written to disk")
                            });
                            false
                        }
                        Err(_) => false,
                    };
                    store.finish(block, tier, source, ok, "disk_error");
                });
            }
            Tier::Object => {
                let Some(permit) = self.slot(&self.inner.object, &block) else {
                    return self.no_slot(state, &block, tier, source, "object_busy");
                };
                let object = self.inner.object.as_ref().map(|o| o.tier.clone());
                let object = object.expect("object writes need an object tier");
                let store = self.clone();
                tokio::spawn(async move {
                    let written = object.put(&block).await;
                    drop(permit);
                    if let Err(e) = &written {
                        store.inner.metrics.object_write_failures.inc();
                        OBJECT_WRITE.log(|skipped| {
                            tracing::warn!(error = %e, skipped, "a KV block could not be written to the object store")
                        });
                    }
                    store.finish(block, tier, source, written.is_ok(), "object_error");
                });
            }
            Tier::Gpu => unreachable!("the store holds no GPU blocks"),
        }
    }

    /// A block leaves a lower tier for the one below it: read, written, then deleted.
    fn move_down(&self, state: &mut State, hash: SeqHash, from: Tier, to: Tier) {
        let parent = state.placement.parent(hash);
        let store = self.clone();
        tokio::spawn(async move {
            let block = match from {
                Tier::Disk => store.read_disk(hash, parent).await,
                _ => Read::Missing,
            };
            let mut state = store.state();
            match block {
                Read::Found(block) if store.inner.admission.check(&block).is_ok() => {
                    store.write(&mut state, block, to, Source::Demoted(from))
                }
                bad => {
                    if !matches!(bad, Read::Missing) {
                        let tier = [("tier", from.as_str())];
                        store.inner.metrics.corrupt.get_or_create(&tier).inc();
                    }
                    state.placement.failed(hash, to);
                    store.left(&mut state, hash, parent, Source::Demoted(from));
                }
            }
            store.publish_usage(&state);
        });
    }

    /// A background write ended. A block that moved down kept its old copy until now,
    /// so that it was readable all along.
    fn finish(&self, block: Block, tier: Tier, source: Source, ok: bool, why: &'static str) {
        let m = &self.inner.metrics;
        let mut state = self.state();
        let hash = block.hash;
        if ok {
            state.placement.written(hash, tier);
            match (tier, source) {
                (Tier::Disk, Source::Demoted(_)) => {
                    m.offload_h2d.inc();
                }
                (Tier::Disk, _) => {
                    m.offload_d2d.inc();
                }
                _ => {
                    m.offload_d2o.inc();
                    m.offload_bytes_object.inc_by(block.payload.len() as u64);
                }
            }
            self.stored(&state, hash, tier);
        } else {
            state.placement.failed(hash, tier);
            m.dropped.get_or_create(&[("reason", why)]).inc();
        }
        self.left(&mut state, hash, block.parent, source);
        self.publish_usage(&state);
    }

    /// A move from `source` ended (either way): the copy it left behind goes.
    fn left(&self, state: &mut State, hash: SeqHash, parent: Option<SeqHash>, source: Source) {
        if let Source::Demoted(from) = source {
            self.removed(hash, from);
            self.delete(state, hash, parent, from);
        }
    }

    /// Room for `block`'s write in `tier`, unless the tier is that far behind.
    fn slot<T>(
        &self,
        tier: &Option<LowerTier<T>>,
        block: &Block,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let kib = (block.payload.len() as u64).div_ceil(SLOT_UNIT).max(1);
        let kib = u32::try_from(kib).ok()?;
        tier.as_ref()?
            .slots
            .clone()
            .try_acquire_many_owned(kib)
            .ok()
    }

    fn no_slot(
        &self,
        state: &mut State,
        block: &Block,
        tier: Tier,
        source: Source,
        why: &'static str,
    ) {
        state.placement.failed(block.hash, tier);
        self.inner
            .metrics
            .dropped
            .get_or_create(&[("reason", why)])
            .inc();
        self.left(state, block.hash, block.parent, source);
    }

    /// Deletes `tier`'s copy (disk at once, so that a later write of the same block
    /// cannot race it; the object store in the background).
    fn delete(&self, state: &mut State, hash: SeqHash, parent: Option<SeqHash>, tier: Tier) {
        match tier {
            Tier::Host => {
                state.host.remove(&hash);
            }
            Tier::Disk => {
                if let Some(disk) = &self.inner.disk
                    && let Err(e) = disk.tier.delete(hash, parent)
                {
                    DISK_DELETE.log(|skipped| {
                        tracing::warn!(error = %e, skipped, "a KV block file could not be deleted")
                    });
                }
            }
            Tier::Object => {
                if let Some(object) = &self.inner.object {
                    let object = object.tier.clone();
                    tokio::spawn(async move {
                        if let Err(e) = object.delete(hash, parent).await {
                            OBJECT_DELETE.log(|skipped| {
                                tracing::warn!(error = %e, skipped, "a KV block object could not be deleted")
                            });
                        }
                    });
                }
            }
            Tier::Gpu => {}
        }
    }

    /// `tier`'s copy of `hash` is missing or corrupt: forget and delete it.
    fn lose(&self, state: &mut State, hash: SeqHash, tier: Tier) {
        let parent = state.placement.parent(hash);
        if state.placement.lost(hash, tier) {
            self.removed(hash, tier);
            self.delete(state, hash, parent, tier);
        }
    }

    async fn read_disk(&self, hash: SeqHash, parent: Option<SeqHash>) -> Read {
        let Some(disk) = &self.inner.disk else {
            return Read::Missing;
        };
        let disk = disk.tier.clone();
        match tokio::task::spawn_blocking(move || disk.get(hash, parent)).await {
            Ok(Ok(Some(block))) => Read::Found(block),
            Ok(Ok(None)) | Err(_) => Read::Missing,
            Ok(Err(e)) => {
                DISK_READ.log(|skipped| {
                    tracing::warn!(error = %e, skipped, "a KV block could not be read from disk")
                });
                Read::Corrupt
            }
        }
    }

    async fn read_object(&self, hash: SeqHash, parent: Option<SeqHash>) -> Read {
        let Some(object) = &self.inner.object else {
            return Read::Missing;
        };
        match object.tier.get(hash, parent).await {
            Ok(Some(block)) => Read::Found(block),
            Ok(None) => Read::Missing,
            Err(e) if e.is_corrupt() => {
                OBJECT_READ.log(|skipped| {
                    tracing::warn!(error = %e, skipped, "a KV block object is not a block record")
                });
                Read::Corrupt
            }
            Err(e) => {
                self.inner.metrics.object_read_failures.inc();
                OBJECT_READ.log(|skipped| {
                    tracing::warn!(error = %e, skipped, "a KV block could not be read from the object store")
                });
                Read::Unavailable
            }
        }
    }

    fn reindex_disk(&self) {
        let Some(disk) = &self.inner.disk else { return };
        let found = match disk.tier.scan() {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "the disk tier could not be re-indexed; it starts empty");
                return;
            }
        };
        let mut state = self.state();
        for f in &found {
            let actions = state
                .placement
                .restore(f.hash, f.parent, accounted(f.bytes), Tier::Disk);
            self.execute(&mut state, actions, None, Source::Engine);
        }
        for f in &found {
            if state.placement.best(f.hash) == Some(Tier::Disk) {
                self.stored(&state, f.hash, Tier::Disk);
            }
        }
        tracing::info!(
            blocks = state.placement.usage(Tier::Disk).blocks,
            "disk tier re-indexed"
        );
        self.publish_usage(&state);
    }

    async fn reindex_object(&self) {
        let Some(object) = &self.inner.object else {
            return;
        };
        let listed = match object.tier.list(OBJECT_LIST_LIMIT).await {
            Ok(listed) => listed,
            Err(e) => {
                self.inner.metrics.object_read_failures.inc();
                tracing::warn!(error = %e, "the object tier could not be re-indexed; it starts empty");
                return;
            }
        };
        let mut state = self.state();
        for l in &listed {
            let actions =
                state
                    .placement
                    .restore(l.hash, l.parent, accounted(l.bytes), Tier::Object);
            self.execute(&mut state, actions, None, Source::Engine);
            if state.placement.best(l.hash) == Some(Tier::Object) {
                self.stored(&state, l.hash, Tier::Object);
            }
        }
        self.publish_usage(&state);
    }

    fn stored(&self, state: &State, hash: SeqHash, tier: Tier) {
        self.inner.hub.publish(&KvEvent::Stored {
            parent: state.placement.parent(hash),
            blocks: vec![StoredBlock {
                seq_hash: hash,
                engine_hash: hash.0,
                tier,
            }],
        });
    }

    fn removed(&self, hash: SeqHash, tier: Tier) {
        self.inner.hub.publish(&KvEvent::Removed {
            blocks: vec![RemovedBlock {
                seq_hash: hash,
                engine_hash: hash.0,
            }],
            tier,
        });
    }

    fn publish_usage(&self, state: &State) {
        let m = &self.inner.metrics;
        for tier in TIERS {
            let usage = state.placement.usage(tier);
            let label = [("tier", tier.as_str())];
            m.tier_bytes.get_or_create(&label).set(usage.bytes as i64);
            m.tier_blocks.get_or_create(&label).set(usage.blocks as i64);
        }
    }
}

/// Where the bytes of a write come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// Offloaded by the engine.
    Engine,
    /// Read back from a lower tier for the engine, and copied up.
    Promoted,
    /// Evicted from the tier above (whose copy the write then deletes, below host).
    Demoted(Tier),
}

/// A read of one tier's copy.
enum Read {
    Found(Block),
    /// No such copy (any more).
    Missing,
    /// A copy that is not a block record.
    Corrupt,
    /// The tier did not answer; its copy may be fine.
    Unavailable,
}

/// What became of one offloaded block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Stored,
    Duplicate,
    Dropped,
    Corrupt,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Stored => "stored",
            Outcome::Duplicate => "duplicate",
            Outcome::Dropped => "dropped",
            Outcome::Corrupt => "corrupt",
        }
    }
}

impl OffloadCounts {
    pub fn count(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Stored => self.stored += 1,
            Outcome::Duplicate => self.duplicates += 1,
            Outcome::Dropped => self.dropped += 1,
            Outcome::Corrupt => self.corrupt += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use dynamo_kvblocks::Layout;
    use dynamo_kvblocks::placement::TierLimits;
    use dynamo_kvstream::HubConfig;

    const KIB_64: usize = 64 << 10;

    fn block(i: u64) -> Block {
        let layout = Layout {
            block_bytes: KIB_64 as u64,
            block_size: 16,
            layers: 1,
            dtype: "bfloat16".into(),
        };
        let parent = i.checked_sub(1).map(|p| SeqHash(p + 1));
        let payload = Bytes::from(vec![i as u8; KIB_64]);
        Block::new(SeqHash(i + 1), parent, 16, layout, payload)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_burst_past_the_write_buffer_is_dropped_without_waiting_for_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let disk = DiskTier::open(dir.path(), 1 << 20).unwrap();
        let placement = PlacementConfig {
            host: None,
            disk: Some(TierLimits {
                capacity_bytes: 64 << 20,
                min_reuse: 2,
            }),
            object: None,
        };
        let metrics = Arc::new(BlockMetrics::default());
        let hub = KvEventHub::new(HubConfig::default());
        // Room for four 64 KiB writes (and their record headers) in flight.
        let buffer = 4 * (KIB_64 as u64 + SLOT_UNIT);
        let store = BlockStore::open(
            placement,
            Some(disk),
            None,
            buffer,
            hub,
            metrics.clone(),
            Arc::default(),
        );
        // No await between offloads: on this one thread no write can finish and give its
        // room back, so exactly the buffer's worth is written and the rest dropped.
        for i in 0..16 {
            store.offload_verified(block(i));
        }
        let busy = metrics.dropped.get_or_create(&[("reason", "disk_busy")]);
        assert_eq!(busy.get(), 12);
        for _ in 0..1000 {
            if metrics.offload_d2d.get() == 4 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(metrics.offload_d2d.get(), 4, "the writes in flight land");
        for i in 0..16 {
            let back = store.onboard(SeqHash(i + 1)).await;
            assert_eq!(back.is_some(), i < 4, "block {i}");
        }
    }
}
