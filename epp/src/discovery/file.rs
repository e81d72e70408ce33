//! Endpoints from the local runner's endpoints file (its format's one home is
//! [`dynamo_server::endpoints_file`]), re-read when its content changes (the runner
//! rewrites it when it scales).
//!
//! `kv_events` defaults to the address's IP on `--kv-events-port`, `role` to `aggregated`;
//! `sidecar_metrics` (where the pod's model card is) to the address's IP on
//! `--model-card-port`.
//! Polling (not inotify) keeps it portable and catches writers that replace the file by
//! rename.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use dynamo_llm::model_card::CARD_PATH;
use dynamo_server::endpoints_file::EndpointsFile;
use tokio::sync::watch;

use super::{EndpointSet, EndpointSpec, normalize};

/// Parses the file's content; the message names what is wrong.
pub fn parse(text: &str, kv_events_port: u16) -> Result<EndpointSet, String> {
    let file = EndpointsFile::parse(text)?;
    let mut set = Vec::with_capacity(file.endpoints.len());
    for (i, entry) in file.endpoints.into_iter().enumerate() {
        let address: SocketAddr = entry
            .address
            .parse()
            .map_err(|e| format!("endpoints[{i}].address {:?}: {e}", entry.address))?;
        let mut spec = EndpointSpec::new(address, kv_events_port, entry.role.unwrap_or_default());
        if let Some(url) = entry.kv_events {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "endpoints[{i}].kv_events {url:?} must be an http:// or https:// URL"
                ));
            }
            spec.kv_events = url;
        }
        spec.model_card = entry
            .sidecar_metrics
            .map(|base| format!("{}{CARD_PATH}", base.trim_end_matches('/')));
        set.push(spec);
    }
    Ok(normalize(set))
}

/// Publishes the file's endpoints on `tx` now and after each change, until every
/// receiver is gone. A missing file is an empty set; a file that does not parse is
/// reported and the previous set kept, so a half-written file never drops live pods.
pub async fn watch(
    path: PathBuf,
    poll: Duration,
    kv_events_port: u16,
    tx: watch::Sender<EndpointSet>,
) {
    let mut last: Option<Vec<u8>> = None;
    loop {
        let content = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the endpoints file");
                last.clone().unwrap_or_default()
            }
        };
        if last.as_ref() != Some(&content) {
            let parsed = if content.is_empty() {
                tracing::warn!(path = %path.display(), "endpoints file missing or empty: no endpoints");
                Ok(EndpointSet::new())
            } else {
                parse(&String::from_utf8_lossy(&content), kv_events_port)
            };
            match parsed {
                Ok(set) => {
                    tracing::info!(path = %path.display(), endpoints = set.len(), "endpoints file read");
                    tx.send_if_modified(|current| {
                        let changed = *current != set;
                        *current = set;
                        changed
                    });
                }
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "invalid endpoints file; keeping the previous endpoints")
                }
            }
            last = Some(content);
        }
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use dynamo_names::Role;

    use super::*;

    #[test]
    fn entries_get_defaults_and_are_sorted() {
        let set = parse(
            r#"{"endpoints": [
                {"address": "127.0.0.1:18001", "role": "decode", "name": "ignored",
                 "sidecar_metrics": "http://127.0.0.1:19090"},
                {"address": "127.0.0.1:18000", "kv_events": "http://127.0.0.1:19000"}
            ]}"#,
            9100,
        )
        .unwrap();
        assert_eq!(
            set,
            vec![
                EndpointSpec {
                    address: "127.0.0.1:18000".parse().unwrap(),
                    kv_events: "http://127.0.0.1:19000".into(),
                    role: Role::Aggregated,
                    model_card: None,
                },
                EndpointSpec {
                    address: "127.0.0.1:18001".parse().unwrap(),
                    kv_events: "http://127.0.0.1:9100".into(),
                    role: Role::Decode,
                    model_card: Some("http://127.0.0.1:19090/model_card".into()),
                },
            ]
        );
    }

    #[test]
    fn what_the_local_runner_writes_reads_back_with_its_roles() {
        use dynamo_server::endpoints_file::EndpointEntry;
        let entry = |port: u16, role: Role| EndpointEntry {
            address: format!("127.0.0.1:{port}"),
            kv_events: None,
            role: Some(role),
            sidecar_metrics: None,
        };
        let written = EndpointsFile {
            endpoints: vec![
                entry(1, Role::Aggregated),
                entry(2, Role::Prefill),
                entry(3, Role::Decode),
            ],
        };
        let text = serde_json::to_string(&written).unwrap();
        let roles: Vec<Role> = parse(&text, 9100).unwrap().iter().map(|e| e.role).collect();
        assert_eq!(roles, [Role::Aggregated, Role::Prefill, Role::Decode]);
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let e = parse(r#"{"endpoints": [{"address": "localhost"}]}"#, 9100).unwrap_err();
        assert!(
            e.starts_with("endpoints[0].address \"localhost\": invalid socket address"),
            "{e}"
        );
        let e = parse(
            r#"{"endpoints": [{"address": "1.2.3.4:5", "role": "boss"}]}"#,
            9100,
        )
        .unwrap_err();
        assert!(e.starts_with("unknown variant `boss`"), "{e}");
        let e = parse(
            r#"{"endpoints": [{"address": "1.2.3.4:5", "kv_events": "1.2.3.4:9100"}]}"#,
            9100,
        )
        .unwrap_err();
        assert!(e.contains("endpoints[0].kv_events"), "{e}");
        assert!(parse("[]", 9100).is_err());
    }
}
