//! One mapping registered with the agent once and carved into slots, so that a transfer
//! neither maps, registers nor faults fresh memory (each cost about as much as the read
//! of a lease) and the agent's metadata, which peers cache, stays the same. A slot is
//! returned when dropped and reused; its old bytes stay until overwritten.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use nixl_sys::{NixlError, RegistrationHandle};

use super::agent::NixlAgent;
use super::memory::HostMemory;

/// Slots start on page boundaries.
const ALIGN: usize = 4096;

/// A registered mapping of a fixed size, carved first fit.
pub struct Arena {
    inner: Arc<Inner>,
}

struct Inner {
    // Deregistered before it is unmapped (fields drop in order).
    _registration: RegistrationHandle,
    memory: HostMemory,
    /// Free ranges, offset to length, merged with their neighbours on release.
    free: Mutex<BTreeMap<usize, usize>>,
}

/// `len` bytes of an arena, exclusively this slot's until dropped.
pub struct Slot {
    inner: Arc<Inner>,
    offset: usize,
    len: usize,
    /// Rounded up to `ALIGN`: what returns to the free ranges.
    span: usize,
}

impl Arena {
    /// `bytes` of fresh host memory registered with `agent`. Pages are faulted in by
    /// their first use and then stay.
    pub fn new(agent: &NixlAgent, bytes: usize) -> Result<Self, ArenaError> {
        let bytes = bytes.max(ALIGN).div_ceil(ALIGN) * ALIGN;
        let memory = HostMemory::new(bytes)?;
        let registration = agent.register(&memory)?;
        Ok(Self {
            inner: Arc::new(Inner {
                _registration: registration,
                memory,
                free: Mutex::new(BTreeMap::from([(0, bytes)])),
            }),
        })
    }

    pub fn bytes(&self) -> usize {
        self.inner.memory.as_slice().len()
    }

    /// A slot of `len` bytes, or `None` while the arena has no free range that large.
    pub fn take(&self, len: usize) -> Option<Slot> {
        let span = len.max(1).div_ceil(ALIGN) * ALIGN;
        let mut free = self.inner.free.lock().unwrap_or_else(|e| e.into_inner());
        let (&offset, &room) = free.iter().find(|&(_, &room)| room >= span)?;
        free.remove(&offset);
        if room > span {
            free.insert(offset + span, room - span);
        }
        Some(Slot {
            inner: self.inner.clone(),
            offset,
            len,
            span,
        })
    }

    /// Free bytes (in page-rounded ranges).
    pub fn free_bytes(&self) -> usize {
        let free = self.inner.free.lock().unwrap_or_else(|e| e.into_inner());
        free.values().sum()
    }
}

impl Slot {
    /// The slot's address in this process (where a peer reads it).
    pub fn addr(&self) -> u64 {
        self.inner.memory.addr() + self.offset as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: within the mapping, which lives as long as `inner`; no other slot
        // overlaps this range while it is taken.
        unsafe { std::slice::from_raw_parts(self.addr() as *const u8, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.addr() as *mut u8, self.len) }
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slot({:#x}, {} bytes)", self.addr(), self.len)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut free = self.inner.free.lock().unwrap_or_else(|e| e.into_inner());
        let (mut offset, mut span) = (self.offset, self.span);
        if let Some((&before, &room)) = free.range(..offset).next_back()
            && before + room == offset
        {
            free.remove(&before);
            offset = before;
            span += room;
        }
        if let Some(room) = free.remove(&(offset + span)) {
            span += room;
        }
        free.insert(offset, span);
    }
}

/// So that payloads read into a slot become `Bytes` without a copy (the slot returns
/// when the last of them drops).
impl AsRef<[u8]> for Slot {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    #[error("host memory: {0}")]
    Memory(#[from] std::io::Error),
    #[error("NIXL: {0}")]
    Nixl(#[from] NixlError),
}
