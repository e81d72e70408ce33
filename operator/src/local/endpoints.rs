//! The endpoint picker's endpoints file: the runner's replicas, rewritten whenever they
//! change (the picker re-reads it). Format: `{"endpoints": [{"address": "ip:port",
//! "kv_events": "http://ip:port", "role": "aggregated|prefill|decode",
//! "sidecar_metrics": "http://ip:port"}]}` (docs/epp.md).

use std::io;
use std::path::Path;

use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    /// The replica's sidecar (inference traffic).
    pub address: String,
    /// The sidecar's KV event stream.
    pub kv_events: String,
    pub role: &'static str,
    /// The sidecar's metrics port, where the picker reads the replica's model card.
    pub sidecar_metrics: String,
}

#[derive(Serialize)]
struct File<'a> {
    endpoints: &'a [Endpoint],
}

/// Replaces the file in one step (write a sibling, then rename), so the picker never
/// reads half a list.
pub fn write(path: &Path, endpoints: &[Endpoint]) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(&File { endpoints })?;
    let partial = path.with_extension("json.partial");
    std::fs::write(&partial, json)?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_lists_every_endpoint_and_leaves_no_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("endpoints.json");
        let endpoints = [Endpoint {
            address: "127.0.0.1:4000".into(),
            kv_events: "http://127.0.0.1:4001".into(),
            role: "decode",
            sidecar_metrics: "http://127.0.0.1:4002".into(),
        }];
        write(&path, &endpoints).unwrap();
        write(&path, &endpoints).unwrap();
        let read: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            read,
            serde_json::json!({"endpoints": [
                {"address": "127.0.0.1:4000", "kv_events": "http://127.0.0.1:4001", "role": "decode",
                 "sidecar_metrics": "http://127.0.0.1:4002"}
            ]})
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["endpoints.json"]);
    }
}
