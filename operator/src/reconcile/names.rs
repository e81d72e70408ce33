//! Stable object names. Every name is derived from the graph and service names alone, so a
//! reconcile pass finds the objects of the previous one without any stored state.

/// DNS-1123 label limit; pod hostnames and Service names must fit in it.
pub const MAX_DNS_LABEL: usize = 63;

/// Service names are compared case-insensitively (Dynamo uses `VllmDecodeWorker`); object
/// names use the lower-cased form.
pub fn service_slug(service: &str) -> String {
    service.to_ascii_lowercase()
}

/// Pod of a single-node replica: `{dgd}-{service}-{replica}`.
pub fn single_pod(dgd: &str, service: &str, replica: u32) -> String {
    format!("{}-{replica}", replica_base(dgd, service))
}

/// Prefix shared by every object of one replica: `{dgd}-{service}`.
pub fn replica_base(dgd: &str, service: &str) -> String {
    format!("{dgd}-{}", service_slug(service))
}

/// Name of the gang of a multinode replica; also its headless Service (the `subdomain`
/// of its pods, which gives the leader a stable DNS name).
pub fn gang(dgd: &str, service: &str, replica: u32) -> String {
    format!("{}-{replica}", replica_base(dgd, service))
}

/// Pod of rank `rank` of a gang: rank 0 is `{gang}-ldr`, the others `{gang}-wkr-{rank}`.
pub fn gang_pod(dgd: &str, service: &str, replica: u32, rank: u32) -> String {
    let gang = gang(dgd, service, replica);
    if rank == 0 {
        format!("{gang}-ldr")
    } else {
        format!("{gang}-wkr-{rank}")
    }
}

/// ClusterIP Service of one graph service (port 8000).
pub fn service(dgd: &str, service: &str) -> String {
    replica_base(dgd, service)
}

/// Scaling adapter of one graph service.
pub fn scaling_adapter(dgd: &str, service: &str) -> String {
    replica_base(dgd, service)
}

/// The endpoint picker's Deployment and Service.
pub fn epp(dgd: &str) -> String {
    format!("{dgd}-epp")
}

/// The graph's InferencePool (and the HTTPRoute to it).
pub fn inference_pool(dgd: &str) -> String {
    format!("{dgd}-pool")
}

/// The graph's HTTPRoute.
pub fn http_route(dgd: &str) -> String {
    dgd.to_string()
}

/// Whether `name` is a DNS-1123 label (lower-case alphanumerics and '-', at most 63).
pub fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_DNS_LABEL
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lower_cased_and_stable() {
        assert_eq!(single_pod("g", "VllmWorker", 1), "g-vllmworker-1");
        assert_eq!(gang_pod("g", "Decode", 0, 0), "g-decode-0-ldr");
        assert_eq!(gang_pod("g", "Decode", 2, 3), "g-decode-2-wkr-3");
        assert!(is_dns_label("g-decode-2-wkr-3"));
        assert!(!is_dns_label("-a") && !is_dns_label("A") && !is_dns_label(&"a".repeat(64)));
    }
}
