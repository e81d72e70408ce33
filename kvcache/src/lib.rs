//! KV cache core shared by the endpoint picker, the sidecar and the mock engine.
//!
//! No I/O lives here: only the contracts and data structures every part must agree on
//! (see `DESIGN.md`, "Block hashing").

pub mod hash;

pub use hash::{BlockHasher, LocalHash, SeqHash};
