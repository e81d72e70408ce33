//! The KV event stream between a pod's sidecar and the endpoint pickers
//! (`DESIGN.md`, "Sidecar -> EPP: KV event stream"): the gRPC contract
//! (`proto/dynamo/kv/v1/kv_events.proto`), the sidecar's publishing [`KvEventHub`] and the
//! picker's resyncing [`follow`] loop.
//!
//! Both ends speak [`dynamo_kvcache::KvEvent`]; this crate only carries them, numbers
//! them and makes sure a subscriber's view of a pod is either exact or visibly stale.

mod convert;
mod hub;
mod subscriber;

/// Generated protobuf messages and the tonic client and server.
pub mod pb {
    tonic::include_proto!("dynamo.kv.v1");
}

/// The proto's descriptors (a `FileDescriptorSet` without source info), for the Python
/// connector's tests, which subscribe to a real sidecar.
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kv_events.binpb"));

pub use convert::InvalidMessage;
pub use hub::{HubConfig, HubStats, KvEventHub};
pub use subscriber::{PodUpdate, SubscriberConfig, follow};
