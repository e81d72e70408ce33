//! Identity of a worker (one engine pod) as the router knows it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A small opaque id for one worker pod. The EPP assigns it (for example from the pod's
/// UID or its position in the pool); this crate only compares and orders it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(pub u64);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker-{}", self.0)
    }
}

impl From<u64> for WorkerId {
    fn from(id: u64) -> Self {
        Self(id)
    }
}
