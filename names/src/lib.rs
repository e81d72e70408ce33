//! The words the parts share, each defined once: what an engine does in a graph
//! ([`Role`]) and the names of the metrics one part exports and another reads
//! ([`metrics`]). Nothing here does anything; it keeps a rename in one place.

pub mod metrics;
mod role;

pub use role::{Role, UnknownRole};
