//! NIXL between sidecars (`DESIGN.md`, "KV blocks in the sidecar"): a lease's payloads
//! move from the prefill pod's sidecar to the decode pod's by NIXL READ over UCX when
//! both sidecars have an agent, and over the block API's gRPC `Onboard` otherwise.
//!
//! - [`library`]: finding `libnixl_capi.so` at run time (nixl-sys `stub-api`);
//! - [`agent`]: the agent, exposing host memory and reading a peer's;
//! - [`arena`]: the memory it registers once and carves per lease and per read;
//! - [`memory`]: the host memory behind it.

pub mod agent;
pub mod arena;
pub mod library;
pub mod memory;

use std::path::Path;
use std::sync::Arc;

pub use agent::{Landed, NixlAgent, ReadError};
pub use arena::{ArenaError, Slot};
pub use memory::HostMemory;

/// `--nixl-lib-dir`'s value that turns NIXL off.
pub const OFF: &str = "none";

/// This sidecar's agent, if NIXL's library loads (from `lib_dir`, else the loader's
/// path) and the UCX backend starts; says once which way KV blocks will move. Each of
/// its arenas (what it exposes, what it reads into) is `arena_bytes`, mapped and
/// registered on first use.
pub fn start(lib_dir: Option<&Path>, arena_bytes: u64) -> Option<Arc<NixlAgent>> {
    if lib_dir == Some(Path::new(OFF)) {
        tracing::info!("--nixl-lib-dir none: KV blocks move between sidecars over gRPC");
        return None;
    }
    if !library::load(lib_dir) {
        tracing::info!(
            "NIXL is not loaded (no libnixl_capi.so; see --nixl-lib-dir): \
             KV blocks move between sidecars over gRPC"
        );
        return None;
    }
    let name = format!(
        "dynamo-sidecar-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    );
    match NixlAgent::start(&name, arena_bytes) {
        Ok(agent) => {
            tracing::info!(agent = %name, "NIXL agent with the UCX backend: KV blocks move over NIXL to and from peers that have one");
            Some(Arc::new(agent))
        }
        Err(e) => {
            tracing::warn!(error = %e, "NIXL loaded but its UCX agent did not start: KV blocks move between sidecars over gRPC");
            None
        }
    }
}
