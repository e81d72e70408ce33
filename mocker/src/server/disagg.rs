//! Both roles of vLLM's `kv_transfer_params` protocol (NixlConnector; `DESIGN.md`,
//! "Disaggregated request") over the sidecar's leases instead of NIXL.
//!
//! Prefill: a request with `do_remote_decode: true` runs as usual; once it has finished
//! (not aborted) its prompt's full blocks are lent to this engine's sidecar under the
//! request's id, and only then does it answer, with the parameters a decode needs
//! (`request_finished`'s shape plus `remote_transport`). With no blocks lent the
//! answer carries `kv_transfer_params: null`, as vLLM's does after an abort.
//!
//! Decode: a request with `do_remote_prefill: true` and our transport takes its prompt's
//! blocks from this engine's own sidecar (never from `remote_host`, which a client can
//! forge) by the lease `remote_request_id`, and keeps the leading ones that are its own
//! prompt's. Anything else recomputes the prompt, counted by reason; the answer is the
//! same either way.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::http::Uri;
use dynamo_kvcache::SeqHash;
use dynamo_llm::disagg::{KVBLOCKS_TRANSPORT, KvTransferParams};
use serde_json::{Map, Value};

use super::engine_loop::EngineHandle;
use super::kv_blocks::lease::LeaseError;
use super::kv_blocks::{KvBlocks, Onboarded};
use super::metrics::DisaggMetrics;
use crate::PromptKv;

/// What a request's `kv_transfer_params` ask of this engine.
#[derive(Debug, Default, PartialEq)]
pub struct Asked {
    /// Lend the prompt's blocks once prefilled, under this lease (`do_remote_decode`).
    pub lend_as: Option<String>,
    /// Take the prompt's blocks from a remote prefill (`do_remote_prefill`): where from,
    /// or why they cannot be taken.
    pub remote_prefill: Option<Result<Lease, Fallback>>,
}

/// A remote prefill's lease, as a decode reads it from the parameters.
#[derive(Debug, PartialEq, Eq)]
pub struct Lease {
    pub name: String,
    /// How many blocks the prefill lent (`remote_block_ids`).
    pub blocks: usize,
}

/// Why a decode recomputed what a remote prefill computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// No `--kv-blocks-url`: no sidecar to take blocks from.
    NoSidecar,
    /// Not our transport (vLLM's NIXL parameters): the engines were to move the blocks.
    ForeignTransport,
    /// Parameters without a lease name or block list, or not vLLM's shape at all.
    Invalid,
    /// The lease is gone: expired, already fetched, or never lent.
    Gone,
    Error,
    Timeout,
    /// Fewer blocks checked out than asked for: the lease holds another prompt's blocks,
    /// or some are corrupt. Those that did are used.
    Mismatch,
}

impl Fallback {
    pub const fn as_str(self) -> &'static str {
        match self {
            Fallback::NoSidecar => "no_sidecar",
            Fallback::ForeignTransport => "foreign_transport",
            Fallback::Invalid => "invalid",
            Fallback::Gone => "gone",
            Fallback::Error => "error",
            Fallback::Timeout => "timeout",
            Fallback::Mismatch => "mismatch",
        }
    }

    /// Whether a transfer was tried and failed (vLLM's `nixl_num_failed_transfers`).
    const fn is_failed_transfer(self) -> bool {
        matches!(
            self,
            Fallback::Gone | Fallback::Error | Fallback::Timeout | Fallback::Mismatch
        )
    }
}

/// The lease a decode is told to take, from `params` (a request's `kv_transfer_params`
/// with `do_remote_prefill`): vLLM's `update_state_after_alloc` also requires
/// `remote_block_ids` and `remote_request_id`.
fn lease_of(params: &Value) -> Result<Lease, Fallback> {
    let params: KvTransferParams =
        serde_json::from_value(params.clone()).map_err(|_| Fallback::Invalid)?;
    if !params.via_sidecars() {
        return Err(Fallback::ForeignTransport);
    }
    match (params.remote_request_id, params.remote_block_ids) {
        (Some(name), Some(ids)) if !name.is_empty() => Ok(Lease {
            name,
            blocks: ids.len(),
        }),
        _ => Err(Fallback::Invalid),
    }
}

/// A random id shaped as vLLM's default `engine_id` (`uuid.uuid4()`).
fn random_engine_id() -> String {
    let random = |i| {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(i);
        h.finish()
    };
    let (a, b) = (random(0), random(1));
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff,
    )
}

/// Host and port of the sidecar's block API URL, the `remote_host` and `remote_port` a
/// prefill answers with (the scheme's port when the URL has none).
fn host_port(url: &str) -> anyhow::Result<(String, u16)> {
    let uri: Uri = url.parse()?;
    let host = uri
        .host()
        .ok_or_else(|| anyhow::anyhow!("{url:?} names no host"))?;
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    Ok((host.trim_matches(['[', ']']).to_owned(), port))
}

/// This engine's side of disaggregated serving.
pub struct Disagg {
    kv: Option<Arc<KvBlocks>>,
    engine_id: String,
    /// Where this engine's sidecar serves the block API.
    host: String,
    port: u16,
    metrics: DisaggMetrics,
    next_lease: AtomicU64,
}

impl Disagg {
    pub fn new(kv: Option<Arc<KvBlocks>>, metrics: DisaggMetrics) -> anyhow::Result<Self> {
        let (host, port) = match &kv {
            Some(kv) => host_port(&kv.config().url)?,
            None => (String::new(), 0),
        };
        let engine_id = kv
            .as_ref()
            .and_then(|kv| kv.config().engine_id.clone())
            .unwrap_or_else(random_engine_id);
        Ok(Self {
            kv,
            engine_id,
            host,
            port,
            metrics,
            next_lease: AtomicU64::new(1),
        })
    }

    /// What `params` (a request's `kv_transfer_params`) ask; a prefill's lease is named
    /// `request_id` (the client's `x-request-id`, the id vLLM's proxies send to both
    /// legs), else one made unique by this engine's id.
    pub fn asked(&self, params: Option<&Value>, request_id: Option<&str>) -> Asked {
        let Some(params) = params.filter(|p| p.is_object()) else {
            return Asked::default();
        };
        let flag = |name| params.get(name) == Some(&Value::Bool(true));
        let lend_as = flag("do_remote_decode").then(|| match request_id {
            Some(id) if !id.is_empty() => id.to_owned(),
            _ => {
                let n = self.next_lease.fetch_add(1, Ordering::Relaxed);
                format!("{}-{n}", self.engine_id)
            }
        });
        let remote_prefill = flag("do_remote_prefill").then(|| lease_of(params));
        Asked {
            lend_as,
            remote_prefill,
        }
    }

    /// Prefill role, after the request finished: lends the prompt's full blocks under
    /// `lease` and returns the answer's `kv_transfer_params`; `null` when none were lent.
    pub async fn lend(&self, lease: &str, tokens: &[u32]) -> Value {
        let Some(kv) = &self.kv else {
            return self.not_lent("no_sidecar");
        };
        let chain = kv.prompt_chain(tokens);
        if chain.is_empty() {
            return self.not_lent("empty");
        }
        match kv.lend(lease, &chain).await {
            Ok(()) => {
                self.metrics.lend("lent");
                self.params(lease, &chain)
            }
            Err(e) => {
                tracing::warn!(lease, error = %e, "lending the prompt's KV blocks failed; the decode will recompute");
                match e {
                    LeaseError::Refused(_) => self.not_lent("refused"),
                    _ => self.not_lent("failed"),
                }
            }
        }
    }

    fn not_lent(&self, outcome: &'static str) -> Value {
        self.metrics.lend(outcome);
        Value::Null
    }

    /// vLLM's `request_finished` parameters (connector version 2) for blocks lent as
    /// `lease`, with our transport.
    fn params(&self, lease: &str, chain: &[SeqHash]) -> Value {
        let params = KvTransferParams {
            do_remote_prefill: true,
            do_remote_decode: false,
            remote_block_ids: Some(chain.iter().map(|h| h.0).collect()),
            remote_engine_id: Some(self.engine_id.clone()),
            remote_request_id: Some(lease.to_owned()),
            remote_host: Some(self.host.clone()),
            remote_port: Some(self.port),
            tp_size: Some(1),
            remote_transport: Some(KVBLOCKS_TRANSPORT.to_owned()),
            other: Map::new(),
        };
        serde_json::to_value(params).expect("parameters serialize")
    }

    /// Decode role, before the request is queued: the prompt's leading blocks taken
    /// from `lease`, or none (and the reason counted). Never fails the request.
    pub async fn onboard(
        &self,
        engine: &EngineHandle,
        lease: &Result<Lease, Fallback>,
        tokens: &[u32],
    ) -> Onboarded {
        let arrived = Instant::now();
        let kv = match self.take(engine, lease, tokens).await {
            Ok(blocks) => PromptKv::from_prefill(0..blocks),
            Err(reason) => {
                self.metrics.fallback(reason.as_str());
                if reason.is_failed_transfer() {
                    self.metrics.failed_transfers.inc();
                }
                PromptKv::default()
            }
        };
        Onboarded { arrived, kv }
    }

    async fn take(
        &self,
        engine: &EngineHandle,
        lease: &Result<Lease, Fallback>,
        tokens: &[u32],
    ) -> Result<usize, Fallback> {
        let lease = lease.as_ref().map_err(|&reason| reason)?;
        let kv = self.kv.as_ref().ok_or(Fallback::NoSidecar)?;
        let mut chain = kv.prompt_chain(tokens);
        chain.truncate(lease.blocks);
        let started = Instant::now();
        let taken = kv
            .take_lease(engine, &lease.name, &chain)
            .await
            .map_err(|e| {
                tracing::warn!(lease = %lease.name, error = %e, "taking a remote prefill's KV blocks failed; recomputing");
                match e {
                    LeaseError::Client(e) if e.is_gone() => Fallback::Gone,
                    LeaseError::Timeout(_) => Fallback::Timeout,
                    LeaseError::Client(_) | LeaseError::Refused(_) => Fallback::Error,
                }
            })?;
        self.metrics.lease_blocks.inc_by(taken.blocks as u64);
        if taken.moved_bytes > 0 {
            self.metrics
                .xfer_time
                .observe(started.elapsed().as_secs_f64());
            self.metrics
                .bytes_transferred
                .observe(taken.moved_bytes as f64);
        }
        if taken.blocks < chain.len() {
            // Counted, yet the blocks that checked out are used.
            self.metrics.fallback(Fallback::Mismatch.as_str());
            self.metrics.failed_transfers.inc();
        }
        Ok(taken.blocks)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn disagg() -> Disagg {
        let mut exporter = super::super::metrics::EngineMetricsExporter::new("m", 16, 8);
        Disagg::new(None, exporter.register_disagg()).unwrap()
    }

    #[test]
    fn a_remote_decode_lends_under_the_clients_request_id_or_a_unique_one() {
        let d = disagg();
        let prefill = json!({"do_remote_decode": true, "do_remote_prefill": false});
        assert_eq!(
            d.asked(Some(&prefill), Some("req-7")).lend_as.unwrap(),
            "req-7"
        );
        let (a, b) = (
            d.asked(Some(&prefill), None),
            d.asked(Some(&prefill), Some("")),
        );
        let (a, b) = (a.lend_as.unwrap(), b.lend_as.unwrap());
        assert!(a.starts_with(&d.engine_id) && a != b, "{a} {b}");
        for nothing in [None, Some(json!(null)), Some(json!({})), Some(json!("x"))] {
            assert_eq!(d.asked(nothing.as_ref(), Some("r")), Asked::default());
        }
    }

    #[test]
    fn a_remote_prefill_needs_our_transport_a_lease_and_block_ids() {
        let ours = json!({
            "do_remote_prefill": true, "remote_block_ids": [1, 2, 3],
            "remote_request_id": "r-1", "remote_engine_id": "e", "remote_host": "10.0.0.1",
            "remote_port": 9100, "tp_size": 1, "remote_transport": KVBLOCKS_TRANSPORT,
        });
        let lease = Lease {
            name: "r-1".into(),
            blocks: 3,
        };
        assert_eq!(lease_of(&ours), Ok(lease));
        // vLLM's NixlConnector parameters: the engines were to move the blocks.
        let mut nixl = ours.clone();
        nixl.as_object_mut().unwrap().remove("remote_transport");
        assert_eq!(lease_of(&nixl), Err(Fallback::ForeignTransport));
        for field in ["remote_request_id", "remote_block_ids"] {
            let mut partial = ours.clone();
            partial.as_object_mut().unwrap().remove(field);
            assert_eq!(lease_of(&partial), Err(Fallback::Invalid), "{field}");
        }
        let mut malformed = ours.clone();
        malformed["remote_block_ids"] = json!(["a"]);
        assert_eq!(lease_of(&malformed), Err(Fallback::Invalid));
        let asked = disagg().asked(Some(&ours), None);
        assert_eq!(asked.lend_as, None);
        assert!(matches!(asked.remote_prefill, Some(Ok(_))));
    }

    #[test]
    fn engine_ids_are_random_uuids_and_urls_give_host_and_port() {
        let (a, b) = (random_engine_id(), random_engine_id());
        assert_ne!(a, b);
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{a}");
        assert_eq!(&a[14..15], "4", "version 4: {a}");
        assert_eq!(
            host_port("http://10.1.2.3:9100").unwrap(),
            ("10.1.2.3".into(), 9100)
        );
        assert_eq!(host_port("http://[::1]:9").unwrap(), ("::1".into(), 9));
        assert_eq!(
            host_port("https://sidecar.ns.svc").unwrap(),
            ("sidecar.ns.svc".into(), 443)
        );
        assert!(host_port("/no/host").is_err());
    }
}
