//! The prefill pods a decode pod's sidecar may send a prefill leg to (`--prefill-peers`):
//! the allowlist that keeps `x-prefiller-host-port` from making the sidecar connect
//! anywhere a client names (SSRF; llm-d's sidecar keys its list on the IP alone,
//! llm-d-router#979: ours keys on IP and port).
//!
//! Members are re-read when the cached set is older than [`MAX_AGE`], and (at most every
//! [`MIN_REFRESH`]) when a request names an address not in it, so a prefill pod that
//! just scaled up is accepted on its first request; one that left is refused at most
//! [`MAX_AGE`] later.
//!
//! Each member comes with the port of its sidecar's block API, where the prompt's
//! blocks are fetched from: the one discovery announces (an endpoints file's
//! `kv_events`), else `--prefill-peer-grpc-port` (by default this sidecar's own: the
//! pods of a graph share one layout). A prefill's answer naming another port is not
//! followed, so a bad prefill peer cannot aim the fetch, and the graph's credential
//! with it, at any other port of its IP.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use dynamo_names::Role;
use dynamo_server::endpoints_file::EndpointsFile;
use tokio::sync::Mutex;

/// Oldest a member set is used.
const MAX_AGE: Duration = Duration::from_secs(10);
/// Closest two refreshes come: a client naming strangers cannot make the sidecar
/// resolve on every request.
const MIN_REFRESH: Duration = Duration::from_millis(250);

/// One `--prefill-peers` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerSource {
    Addr(SocketAddr),
    /// Every address `name` resolves to, at `port`.
    Dns {
        name: String,
        port: u16,
    },
    /// The prefill entries of an endpoints file.
    File(PathBuf),
}

impl std::str::FromStr for PeerSource {
    type Err = String;

    fn from_str(entry: &str) -> Result<Self, String> {
        let entry = entry.trim();
        if let Some(path) = entry.strip_prefix("file:") {
            return Ok(PeerSource::File(path.into()));
        }
        if let Some(target) = entry.strip_prefix("dns:") {
            let (name, port) = target
                .rsplit_once(':')
                .and_then(|(name, port)| Some((name, port.parse().ok()?)))
                .filter(|(name, _)| !name.is_empty())
                .ok_or_else(|| format!("prefill peer {entry:?}: expected dns:NAME:PORT"))?;
            return Ok(PeerSource::Dns {
                name: name.to_owned(),
                port,
            });
        }
        entry.parse().map(PeerSource::Addr).map_err(|_| {
            format!("prefill peer {entry:?}: expected ip:port, dns:NAME:PORT or file:PATH")
        })
    }
}

/// The allowlist of prefill pods.
pub struct PrefillPeers {
    sources: Vec<PeerSource>,
    /// The block API port of members whose discovery announces none.
    block_port: u16,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    /// Each member's block API port.
    members: HashMap<SocketAddr, u16>,
    refreshed: Option<Instant>,
}

impl PrefillPeers {
    /// The members of `sources`, whose block API is on `block_port` unless their
    /// discovery says otherwise.
    pub fn new(sources: Vec<PeerSource>, block_port: u16) -> Self {
        Self {
            sources,
            block_port,
            cache: Mutex::default(),
        }
    }

    /// Parses `--prefill-peers` entries (empty ones are skipped).
    pub fn parse(entries: &[String], block_port: u16) -> Result<Self, String> {
        let sources = entries
            .iter()
            .filter(|e| !e.trim().is_empty())
            .map(|e| e.parse())
            .collect::<Result<_, _>>()?;
        Ok(Self::new(sources, block_port))
    }

    /// The block API port of the prefill member at `addr`; `None` when `addr` is not a
    /// member now. An address not in the set waits for the next refresh the rate limit
    /// allows (at most [`MIN_REFRESH`]), so a prefill pod the picker learnt of a moment
    /// before this sidecar did is not refused.
    pub async fn block_api_port(&self, addr: SocketAddr) -> Option<u16> {
        if self.sources.is_empty() {
            return None;
        }
        loop {
            let mut cache = self.cache.lock().await;
            let age = cache.refreshed.map(|at| at.elapsed());
            let known = cache.members.get(&addr).copied();
            let stale = age.is_none_or(|age| age > MAX_AGE);
            if known.is_some() && !stale {
                return known;
            }
            match age {
                Some(age) if !stale && age < MIN_REFRESH => {
                    drop(cache);
                    tokio::time::sleep(MIN_REFRESH - age).await;
                }
                _ => {
                    cache.members = self.resolve().await;
                    cache.refreshed = Some(Instant::now());
                    return cache.members.get(&addr).copied();
                }
            }
        }
    }

    async fn resolve(&self) -> HashMap<SocketAddr, u16> {
        let mut members = HashMap::new();
        let port = self.block_port;
        for source in &self.sources {
            match source {
                PeerSource::Addr(addr) => {
                    members.insert(*addr, port);
                }
                PeerSource::Dns { name, port: http } => {
                    match tokio::net::lookup_host((name.as_str(), *http)).await {
                        Ok(addrs) => members.extend(addrs.map(|addr| (addr, port))),
                        // No ready prefill pod: the name has no address.
                        Err(e) => tracing::debug!(%name, error = %e, "prefill peers: no address"),
                    }
                }
                PeerSource::File(path) => match read_file(path, port).await {
                    Ok(found) => members.extend(found),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "prefill peers: cannot read the endpoints file")
                    }
                },
            }
        }
        members
    }
}

/// The prefill entries of the endpoints file at `path`, each with the port of its
/// `kv_events` (the sidecar's gRPC port, the block API's too), else `block_port`.
async fn read_file(path: &PathBuf, block_port: u16) -> Result<Vec<(SocketAddr, u16)>, String> {
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|e| e.to_string())?;
    let file = EndpointsFile::parse(&text)?;
    Ok(file
        .entries_of(Role::Prefill)
        .filter_map(|e| {
            let announced = e.kv_events.as_deref().and_then(|url| {
                let uri = url.parse::<http::Uri>().ok()?;
                uri.port_u16()
            });
            Some((e.address.parse().ok()?, announced.unwrap_or(block_port)))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_server::endpoints_file::EndpointEntry;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn entries_parse_or_say_what_is_expected() {
        assert_eq!(
            "10.0.0.7:8000".parse(),
            Ok(PeerSource::Addr(addr("10.0.0.7:8000")))
        );
        assert_eq!(
            "dns:g-prefill-peers.ns.svc.cluster.local:8000".parse(),
            Ok(PeerSource::Dns {
                name: "g-prefill-peers.ns.svc.cluster.local".into(),
                port: 8000
            })
        );
        assert_eq!(
            "file:/tmp/e.json".parse(),
            Ok(PeerSource::File("/tmp/e.json".into()))
        );
        for bad in ["10.0.0.7", "dns:name", "dns::80", "host:99999"] {
            let err = bad.parse::<PeerSource>().unwrap_err();
            assert!(err.contains("expected"), "{bad}: {err}");
        }
    }

    #[tokio::test]
    async fn only_listed_addresses_and_ports_are_members() {
        let entries = ["10.0.0.7:8000".into(), "dns:localhost:8100".into()];
        let peers = PrefillPeers::parse(&entries, 9100).unwrap();
        assert_eq!(
            peers.block_api_port(addr("10.0.0.7:8000")).await,
            Some(9100)
        );
        assert_eq!(peers.block_api_port(addr("10.0.0.7:8001")).await, None);
        assert_eq!(peers.block_api_port(addr("10.0.0.8:8000")).await, None);
        let resolved = peers.block_api_port(addr("127.0.0.1:8100")).await;
        assert_eq!(resolved, Some(9100));
        let none = PrefillPeers::parse(&[], 9100).unwrap();
        assert_eq!(none.block_api_port(addr("10.0.0.7:8000")).await, None);
    }

    #[tokio::test]
    async fn a_prefill_replica_added_to_the_file_is_a_member_on_its_first_request() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("endpoints.json");
        let entry = |address: &str, role: Role, kv_events: Option<&str>| EndpointEntry {
            address: address.into(),
            kv_events: kv_events.map(Into::into),
            role: Some(role),
            sidecar_metrics: None,
        };
        let mut file = EndpointsFile {
            endpoints: vec![
                entry(
                    "127.0.0.1:18000",
                    Role::Prefill,
                    Some("http://127.0.0.1:19000"),
                ),
                entry("127.0.0.1:18001", Role::Decode, None),
            ],
        };
        file.write(&path).unwrap();
        let peers = PrefillPeers::new(vec![PeerSource::File(path.clone())], 9100);
        let announced = peers.block_api_port(addr("127.0.0.1:18000")).await;
        assert_eq!(announced, Some(19000), "its kv_events port");
        assert_eq!(peers.block_api_port(addr("127.0.0.1:18001")).await, None);
        // Added right after a refresh: the miss waits for the next one allowed.
        file.endpoints
            .push(entry("127.0.0.1:18002", Role::Prefill, None));
        file.write(&path).unwrap();
        let unannounced = peers.block_api_port(addr("127.0.0.1:18002")).await;
        assert_eq!(unannounced, Some(9100));
    }
}
