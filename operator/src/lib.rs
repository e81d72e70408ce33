//! The operator: the pure reconcile function with gang placement, the DGDR lifecycle, the
//! controllers that apply them to a cluster, and the offline commands that share their
//! rules (`dynamo crds`, `dynamo validate`).

pub mod controller;
pub mod crdgen;
pub mod dgdr;
pub mod reconcile;
pub mod validate;
