//! Label keys the operator writes and reads, and the spec hash that drives rollouts.

use std::collections::BTreeMap;

use serde::Serialize;

/// Graph a pod or object belongs to.
pub const GRAPH: &str = "nvidia.com/dynamo-graph-deployment-name";
/// Service (as written in `spec.services`) the pod belongs to.
pub const COMPONENT: &str = "nvidia.com/dynamo-component";
/// `componentType` of the service.
pub const COMPONENT_TYPE: &str = "nvidia.com/dynamo-component-type";
/// `subComponentType` of the service, when set.
pub const SUB_COMPONENT_TYPE: &str = "nvidia.com/dynamo-sub-component-type";
/// Engine role the endpoint picker routes by: `aggregated`, `prefill` or `decode`.
pub const ROLE: &str = "nvidia.com/dynamo-role";
/// Put on pods that serve inference traffic (single-node pods, gang leaders); the
/// InferencePool and the per-service Services select it.
pub const INFERENCE_POOL: &str = "nvidia.com/dynamo-inference-pool";
/// Hash of the replica-independent pod template; a different value means "roll me".
pub const SPEC_HASH: &str = "nvidia.com/dynamo-spec-hash";
/// Replica index within the service.
pub const REPLICA: &str = "nvidia.com/dynamo-replica";
/// Gang (multinode replica) the pod belongs to.
pub const GANG: &str = "nvidia.com/dynamo-gang";
/// Rank of the pod within its gang (0 is the leader).
pub const GANG_RANK: &str = "nvidia.com/dynamo-gang-rank";

/// Scheduling gate holding every pod of a gang until the whole gang has a placement.
pub const GANG_GATE: &str = "nvidia.com/dynamo-gang";

/// Annotation on the DGD naming the Gateway to route from: `<namespace>/<name>` or `<name>`.
pub const GATEWAY_ANNOTATION: &str = "nvidia.com/dynamo-gateway";

/// Stable, short hash of anything serializable (xxh3 of its JSON; maps are ordered, so
/// equal values always give equal hashes).
pub fn spec_hash<T: Serialize>(value: &T) -> String {
    let json = serde_json::to_vec(value).expect("k8s objects always serialize to JSON");
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&json))
}

/// `k=v,k=v` form of a selector, for command-line flags.
pub fn selector_string(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
