//! The sidecar's NIXL agent (UCX backend): exposes host memory holding a lease's
//! payloads for peers to READ, and READs a peer's into its own.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use dynamo_kvblocks::described::Slice;
use nixl_sys::{
    Agent, AgentConfig, MemType, NixlError, RegistrationHandle, ThreadSync, XferDescList, XferOp,
    XferStatus,
};

use super::arena::{Arena, ArenaError, Slot};
use super::memory::HostMemory;

/// Microseconds NIXL's progress thread pauses between polls (see `NixlAgent::start`).
const PROGRESS_PAUSE_US: u64 = 1000;
/// Peers whose metadata stays loaded; past this they are all forgotten (an xPyD graph
/// has a handful of prefill pods).
const MAX_LOADED_PEERS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("NIXL: {0}")]
    Nixl(#[from] NixlError),
    #[error("host memory for the read: {0}")]
    Memory(#[from] std::io::Error),
    #[error("the peer's metadata is agent {0:?}, not the {1:?} it described")]
    OtherAgent(String, String),
    #[error("the read did not finish by its deadline")]
    Timeout,
}

pub struct NixlAgent {
    agent: Agent,
    name: String,
    /// Bytes of each arena (made on first use): what this sidecar exposes, and what it
    /// reads into.
    arena_bytes: usize,
    exposing: OnceLock<Option<Arena>>,
    landing: OnceLock<Option<Arena>>,
    /// The peers loaded, with the metadata loaded for each. One read at a time: a read
    /// must not see its peer reloaded half-way.
    reading: Mutex<HashMap<String, Vec<u8>>>,
}

/// Where a read landed: a slot of the agent's arena, or (the arena full) memory
/// registered for that read only. Payloads become `Bytes` of it without a copy.
#[derive(Debug)]
pub enum Landed {
    Slot(Slot),
    Fresh(HostMemory),
}

impl Landed {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Landed::Slot(slot) => slot.as_slice(),
            Landed::Fresh(memory) => memory.as_slice(),
        }
    }
}

impl AsRef<[u8]> for Landed {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl NixlAgent {
    /// An agent named `name` with the UCX backend, its arenas `arena_bytes` each. NIXL's
    /// library must be loaded (`super::library::load`): every nixl-sys call aborts
    /// otherwise.
    pub fn start(name: &str, arena_bytes: u64) -> Result<Self, NixlError> {
        let config = AgentConfig {
            // Requests from the block API's tasks and the transfer's blocking threads.
            thread_sync: ThreadSync::Strict,
            // NIXL's progress thread drives the side that is read (UCX over TCP emulates
            // a READ with messages the target must handle). Its default, no pause
            // between polls, spun an idle sidecar at 75-90% of a core; a reader polls
            // its own transfer (`read`), so a pause here delays only the peer's answers.
            pthr_delay_us: PROGRESS_PAUSE_US,
            ..AgentConfig::default()
        };
        let agent = Agent::new_configured(name, &config)?;
        let (_memory_types, params) = agent.get_plugin_params("UCX")?;
        agent.create_backend("UCX", &params)?;
        Ok(Self {
            agent,
            name: name.to_owned(),
            arena_bytes: usize::try_from(arena_bytes).unwrap_or(usize::MAX),
            exposing: OnceLock::new(),
            landing: OnceLock::new(),
            reading: Mutex::new(HashMap::new()),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The metadata peers load to read what is exposed now.
    pub fn metadata(&self) -> Result<Vec<u8>, NixlError> {
        self.agent.get_local_md()
    }

    pub(super) fn register(&self, memory: &HostMemory) -> Result<RegistrationHandle, NixlError> {
        self.agent.register_memory(memory, None)
    }

    /// The arena `which` holds, made on first use (`None` if it could not be).
    fn arena<'a>(&'a self, which: &'a OnceLock<Option<Arena>>) -> Option<&'a Arena> {
        which
            .get_or_init(|| match Arena::new(self, self.arena_bytes) {
                Ok(arena) => Some(arena),
                Err(e) => {
                    tracing::warn!(error = %e, bytes = self.arena_bytes, "no NIXL arena");
                    None
                }
            })
            .as_ref()
    }

    /// `len` bytes of registered memory for peers to read, until dropped; `None` while
    /// the arena has no room.
    pub fn expose(&self, len: usize) -> Result<Option<Slot>, ArenaError> {
        match self.arena(&self.exposing) {
            Some(arena) => Ok(arena.take(len)),
            None => Err(ArenaError::Memory(std::io::Error::other("no arena"))),
        }
    }

    /// Reads `slices` of the memory of `peer` (whose `metadata` it is) back to back into
    /// this agent's registered memory, giving up at `deadline`. Blocks the thread.
    pub fn read(
        &self,
        peer: &str,
        metadata: &[u8],
        slices: &[Slice],
        deadline: Instant,
    ) -> Result<Landed, ReadError> {
        let total = slices.iter().map(|s| s.len).sum::<u64>() as usize;
        let mut loaded = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        self.load(&mut loaded, peer, metadata)?;
        let landed = match self.arena(&self.landing).and_then(|a| a.take(total)) {
            Some(slot) => {
                let addr = slot.addr();
                self.read_into(peer, addr, slices, deadline)
                    .map(|()| Landed::Slot(slot))
            }
            None => HostMemory::new(total)
                .map_err(ReadError::from)
                .and_then(|memory| {
                    let registration = self.agent.register_memory(&memory, None)?;
                    self.read_into(peer, memory.addr(), slices, deadline)?;
                    drop(registration);
                    Ok(Landed::Fresh(memory))
                }),
        };
        if landed.is_err() {
            // A peer that failed a read is loaded afresh next time.
            self.forget(&mut loaded, peer);
        }
        landed
    }

    /// Loads `peer`'s `metadata` unless it is what is loaded for it already (a peer's
    /// metadata changes when it registers more memory).
    fn load(
        &self,
        loaded: &mut HashMap<String, Vec<u8>>,
        peer: &str,
        metadata: &[u8],
    ) -> Result<(), ReadError> {
        if loaded.get(peer).is_some_and(|md| md == metadata) {
            return Ok(());
        }
        if let Some((other, _)) = loaded.iter().find(|(_, md)| *md == metadata) {
            return Err(ReadError::OtherAgent(other.clone(), peer.to_owned()));
        }
        self.forget(loaded, peer);
        if loaded.len() >= MAX_LOADED_PEERS {
            let all: Vec<String> = loaded.keys().cloned().collect();
            for name in all {
                self.forget(loaded, &name);
            }
        }
        let name = self.agent.load_remote_md(metadata)?;
        if name != peer {
            if let Err(e) = self.agent.invalidate_remote_md(&name) {
                tracing::debug!(peer = %name, error = %e, "forgetting a NIXL peer");
            }
            loaded.remove(&name);
            return Err(ReadError::OtherAgent(name, peer.to_owned()));
        }
        loaded.insert(name, metadata.to_vec());
        Ok(())
    }

    fn forget(&self, loaded: &mut HashMap<String, Vec<u8>>, peer: &str) {
        if loaded.remove(peer).is_some()
            && let Err(e) = self.agent.invalidate_remote_md(peer)
        {
            tracing::debug!(%peer, error = %e, "forgetting a NIXL peer");
        }
    }

    /// Reads `slices` of `peer` back to back into registered memory at `addr`.
    fn read_into(
        &self,
        peer: &str,
        addr: u64,
        slices: &[Slice],
        deadline: Instant,
    ) -> Result<(), ReadError> {
        let (mut here, mut there) = (
            XferDescList::new(MemType::Dram)?,
            XferDescList::new(MemType::Dram)?,
        );
        let mut offset = addr;
        for slice in slices.iter().filter(|s| s.len > 0) {
            here.add_desc(offset as usize, slice.len as usize, 0);
            there.add_desc(slice.addr as usize, slice.len as usize, 0);
            offset += slice.len;
        }
        if here.is_empty()? {
            return Ok(());
        }
        let request = self
            .agent
            .create_xfer_req(XferOp::Read, &here, &there, peer, None)?;
        let mut pending = self.agent.post_xfer_req(&request, None)?;
        // Each status call progresses the transfer (CMA copies in this thread): poll
        // without sleeping, yielding the core to others between polls.
        while pending {
            pending = self.agent.get_xfer_status(&request)? == XferStatus::InProgress;
            if pending {
                if Instant::now() >= deadline {
                    return Err(ReadError::Timeout);
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Two agents in one process: what one exposes, the other reads, within the
    /// exposed memory only. Skips where NIXL is not installed.
    #[test]
    fn an_agent_reads_what_another_exposed_and_nothing_past_it() {
        let dir = std::env::var_os("NIXL_LIB_DIR").map(std::path::PathBuf::from);
        if !super::super::library::load(dir.as_deref()) {
            eprintln!("SKIPPED: NIXL is not installed (set NIXL_LIB_DIR)");
            return;
        }
        // The prefill's arena is the slot exposed: nothing registered past it.
        let (prefill, decode) = (
            NixlAgent::start("test-prefill", 8192).unwrap(),
            NixlAgent::start("test-decode", 1 << 20).unwrap(),
        );
        let mut exposed = prefill.expose(8192).unwrap().expect("room");
        for (i, byte) in exposed.as_mut_slice().iter_mut().enumerate() {
            *byte = i as u8;
        }
        assert!(prefill.expose(1).unwrap().is_none(), "the arena is full");
        let metadata = prefill.metadata().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let slices = [
            Slice {
                addr: exposed.addr() + 4096,
                len: 16,
            },
            Slice {
                addr: exposed.addr() + 1,
                len: 3,
            },
        ];
        let read = decode
            .read("test-prefill", &metadata, &slices, deadline)
            .unwrap();
        let expected: Vec<u8> = (4096..4112).chain(1..4).map(|i| i as u8).collect();
        assert_eq!(read.as_slice(), &expected[..]);
        // Twice: the peer stays loaded, and what is read next lands in the slot the
        // first read gave back.
        drop(read);
        let again = decode
            .read("test-prefill", &metadata, &slices, deadline)
            .unwrap();
        assert!(matches!(again, Landed::Slot(_)));
        assert_eq!(again.as_slice(), &expected[..]);
        let past = [Slice {
            addr: exposed.addr() + 8000,
            len: 400,
        }];
        assert!(
            decode
                .read("test-prefill", &metadata, &past, deadline)
                .is_err()
        );
        let named = decode.read("someone-else", &metadata, &slices, deadline);
        assert!(matches!(named, Err(ReadError::OtherAgent(..))), "{named:?}");
    }
}
