//! Library side of the `dynamo` binary: the pure reconcile function with gang placement,
//! the controllers that apply it to a cluster, and the local runner.

pub mod controller;
pub mod local;
pub mod reconcile;
