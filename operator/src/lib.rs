//! Library side of the `dynamo` operator: the pure reconcile function and gang placement
//! that the controller loop (to come) calls.

pub mod reconcile;
