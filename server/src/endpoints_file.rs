//! The local runner's endpoints file: its replicas, rewritten whenever they change, and
//! read by the endpoint picker (its pods) and by decode sidecars (their prefill peers).
//! Format (docs/epp.md):
//!
//! ```json
//! {"endpoints": [{"address": "127.0.0.1:18000", "kv_events": "http://127.0.0.1:19100",
//!   "role": "aggregated|worker|prefill|decode", "sidecar_metrics": "http://127.0.0.1:19090"}]}
//! ```
//!
//! Only `address` is required; readers ignore fields they do not know, so the writer may
//! add its own.

use std::io;
use std::path::Path;

use dynamo_names::Role;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointsFile {
    pub endpoints: Vec<EndpointEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointEntry {
    /// The replica's sidecar, `ip:port` (inference traffic).
    pub address: String,
    /// The sidecar's KV event stream, `http://ip:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events: Option<String>,
    /// `aggregated` (or `worker`), `prefill` or `decode`; absent: aggregated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// The sidecar's metrics port, where the replica's model card is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar_metrics: Option<String>,
}

impl EndpointsFile {
    /// Parses the file's content; the message names what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// Replaces the file at `path` in one step (write a sibling, then rename), so a
    /// reader never sees half a list.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let json = serde_json::to_vec_pretty(self)?;
        let partial = path.with_extension("json.partial");
        std::fs::write(&partial, json)?;
        std::fs::rename(&partial, path)
    }

    /// The entries whose role is `role`.
    pub fn entries_of(&self, role: Role) -> impl Iterator<Item = &EndpointEntry> {
        self.endpoints
            .iter()
            .filter(move |e| e.role.unwrap_or_default() == role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_parses_back_and_leaves_no_partial_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("endpoints.json");
        let file = EndpointsFile {
            endpoints: vec![EndpointEntry {
                address: "127.0.0.1:4000".into(),
                kv_events: Some("http://127.0.0.1:4001".into()),
                role: Some(Role::Prefill),
                sidecar_metrics: None,
            }],
        };
        file.write(&path).unwrap();
        file.write(&path).unwrap();
        let read = EndpointsFile::parse(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(read, file);
        assert_eq!(
            read.entries_of(Role::Prefill).collect::<Vec<_>>(),
            [&file.endpoints[0]]
        );
        assert_eq!(read.entries_of(Role::Decode).count(), 0);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["endpoints.json"]);
    }

    #[test]
    fn unknown_fields_are_ignored_and_a_missing_address_is_named() {
        let read = EndpointsFile::parse(r#"{"endpoints": [{"address": "a:1", "name": "x"}]}"#);
        assert_eq!(read.unwrap().endpoints[0].role, None);
        let err = EndpointsFile::parse(r#"{"endpoints": [{"role": "decode"}]}"#).unwrap_err();
        assert!(err.contains("address"), "{err}");
    }
}
