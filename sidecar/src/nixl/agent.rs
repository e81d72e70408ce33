//! The sidecar's NIXL agent (UCX backend): exposes host memory holding a lease's
//! payloads for peers to READ, and READs a peer's into its own.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use dynamo_kvblocks::described::Slice;
use nixl_sys::{
    Agent, AgentConfig, MemType, NixlError, RegistrationHandle, ThreadSync, XferDescList, XferOp,
    XferStatus,
};

use super::memory::HostMemory;

/// Microseconds NIXL's progress thread pauses between polls (see `NixlAgent::start`).
const PROGRESS_PAUSE_US: u64 = 1000;

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
    /// One read at a time: each loads the peer's metadata, reads and forgets the peer,
    /// which another read of the same peer must not see half-done.
    reading: Mutex<()>,
}

/// Host memory registered with the agent (readable by peers that loaded the agent's
/// metadata) until dropped: deregistered, then unmapped.
pub struct Exposed {
    _registration: RegistrationHandle,
    memory: HostMemory,
}

impl Exposed {
    pub fn addr(&self) -> u64 {
        self.memory.addr()
    }
}

impl NixlAgent {
    /// An agent named `name` with the UCX backend. NIXL's library must be loaded
    /// (`super::library::load`): every nixl-sys call aborts otherwise.
    pub fn start(name: &str) -> Result<Self, NixlError> {
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
            reading: Mutex::new(()),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The metadata peers load to read what is exposed now.
    pub fn metadata(&self) -> Result<Vec<u8>, NixlError> {
        self.agent.get_local_md()
    }

    /// `memory`, registered for peers to read.
    pub fn expose(&self, memory: HostMemory) -> Result<Exposed, NixlError> {
        let registration = self.agent.register_memory(&memory, None)?;
        Ok(Exposed {
            _registration: registration,
            memory,
        })
    }

    /// Reads `slices` of the memory of `peer` (whose `metadata` it is) back to back into
    /// fresh host memory, giving up at `deadline`. Blocks the thread.
    pub fn read(
        &self,
        peer: &str,
        metadata: &[u8],
        slices: &[Slice],
        deadline: Instant,
    ) -> Result<HostMemory, ReadError> {
        let total: u64 = slices.iter().map(|s| s.len).sum();
        let mut local = HostMemory::new(total as usize)?;
        let _one = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        let loaded = self.agent.load_remote_md(metadata)?;
        let result = if loaded == peer {
            self.read_loaded(peer, &mut local, slices, deadline)
        } else {
            Err(ReadError::OtherAgent(loaded.clone(), peer.to_owned()))
        };
        if let Err(e) = self.agent.invalidate_remote_md(&loaded) {
            tracing::debug!(peer = %loaded, error = %e, "forgetting a NIXL peer");
        }
        result.map(|()| local)
    }

    fn read_loaded(
        &self,
        peer: &str,
        local: &mut HostMemory,
        slices: &[Slice],
        deadline: Instant,
    ) -> Result<(), ReadError> {
        let registration = self.agent.register_memory(local, None)?;
        let (mut here, mut there) = (
            XferDescList::new(MemType::Dram)?,
            XferDescList::new(MemType::Dram)?,
        );
        let mut offset = local.addr();
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
        while pending {
            pending = self.agent.get_xfer_status(&request)? == XferStatus::InProgress;
            if pending {
                if Instant::now() >= deadline {
                    return Err(ReadError::Timeout);
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        drop(request);
        drop(registration);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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
        let (prefill, decode) = (
            NixlAgent::start("test-prefill").unwrap(),
            NixlAgent::start("test-decode").unwrap(),
        );
        let mut memory = HostMemory::new(8192).unwrap();
        for (i, byte) in memory.as_mut_slice().iter_mut().enumerate() {
            *byte = i as u8;
        }
        let exposed = prefill.expose(memory).unwrap();
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
        // Twice: the peer is loaded again after it was forgotten.
        decode
            .read("test-prefill", &metadata, &slices, deadline)
            .unwrap();
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
