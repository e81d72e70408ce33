//! Disaggregated prefill/decode (`DESIGN.md`, "Disaggregated request"): the header the
//! picker names a prefill pod with, vLLM's `kv_transfer_params`, and the body of the
//! prefill leg. The endpoint picker, the sidecar's prefill hop and the mock engine all
//! speak through this module.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Header naming the prefill pod (`ip:port` of its sidecar) of a disaggregated request,
/// the name llm-d's routing sidecar reads. Only the picker sets it; it strips the
/// header from client requests, and a sidecar accepts it only for a pool member.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";

/// Response header in which a decode pod's sidecar says how the prefill hop went (one
/// of [`HopOutcome`]'s names), for the picker's metrics.
pub const PREFILL_HOP_HEADER: &str = "x-dynamo-prefill-hop";

/// Response header with the milliseconds the KV blocks took to move between the pods'
/// sidecars (only when they moved through the sidecars).
pub const KV_TRANSFER_MS_HEADER: &str = "x-dynamo-kv-transfer-ms";

/// `remote_transport` of the `kv_transfer_params` a block-API engine answers a prefill
/// with: its prompt blocks wait in its sidecar under the lease `remote_request_id`, to
/// be fetched from that sidecar's gRPC port `remote_port`. Without it (vLLM's
/// NixlConnector) the engines move the blocks themselves and the sidecars pass the
/// parameters through untouched.
pub const KVBLOCKS_TRANSPORT: &str = "dynamo-kvblocks";

/// How a decode pod's prefill hop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HopOutcome {
    /// The prefill pod prefilled and its blocks moved to this pod's sidecar.
    Remote,
    /// The prefill pod prefilled; its `kv_transfer_params` went to the engine untouched
    /// (the engines move the blocks themselves).
    Passthrough,
    /// The prefill pod refused the request (4xx): the client gets that answer.
    ClientError,
    /// The prefill pod failed, or answered without `kv_transfer_params`: local prefill.
    FallbackPrefillFailed,
    /// The prefill pod did not answer in time: local prefill.
    FallbackTimeout,
    /// The blocks could not be fetched (gone, corrupt, the pod died): local prefill.
    FallbackTransferFailed,
    /// The header named a pod that is not a prefill member of the pool: refused (403).
    Refused,
}

impl HopOutcome {
    pub const ALL: [HopOutcome; 7] = [
        HopOutcome::Remote,
        HopOutcome::Passthrough,
        HopOutcome::ClientError,
        HopOutcome::FallbackPrefillFailed,
        HopOutcome::FallbackTimeout,
        HopOutcome::FallbackTransferFailed,
        HopOutcome::Refused,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            HopOutcome::Remote => "remote",
            HopOutcome::Passthrough => "passthrough",
            HopOutcome::ClientError => "client_error",
            HopOutcome::FallbackPrefillFailed => "fallback_prefill_failed",
            HopOutcome::FallbackTimeout => "fallback_timeout",
            HopOutcome::FallbackTransferFailed => "fallback_transfer_failed",
            HopOutcome::Refused => "refused",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == name)
    }

    /// Whether the request fell back to prefill on its decode pod.
    pub const fn is_fallback(self) -> bool {
        matches!(
            self,
            HopOutcome::FallbackPrefillFailed
                | HopOutcome::FallbackTimeout
                | HopOutcome::FallbackTransferFailed
        )
    }
}

/// vLLM's `kv_transfer_params` (NixlConnector, `nixl_connector.py` `request_finished` and
/// `update_state_after_alloc`), with our `remote_transport`. Fields we do not know are
/// kept, so parameters of a newer connector pass through whole.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KvTransferParams {
    #[serde(default)]
    pub do_remote_decode: bool,
    #[serde(default)]
    pub do_remote_prefill: bool,
    /// vLLM: the prefill engine's block ids; block-API engines: our sequence hashes of
    /// the prompt's full blocks, first block first.
    #[serde(default)]
    pub remote_block_ids: Option<Vec<u64>>,
    #[serde(default)]
    pub remote_engine_id: Option<String>,
    /// The prefill's request id; for block-API engines also the name of the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_request_id: Option<String>,
    #[serde(default)]
    pub remote_host: Option<String>,
    #[serde(default)]
    pub remote_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_size: Option<u32>,
    /// [`KVBLOCKS_TRANSPORT`] when the blocks wait in the prefill pod's sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_transport: Option<String>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl KvTransferParams {
    /// The field of a request or answer body that holds them.
    pub const FIELD: &str = "kv_transfer_params";

    /// What the prefill leg asks for: prefill, keep the blocks for a remote decode (the
    /// null template of vLLM's `toy_proxy_server.py` and llm-d's `nixlv2` connector).
    pub fn remote_decode() -> Self {
        Self {
            do_remote_decode: true,
            ..Self::default()
        }
    }

    /// Whether the blocks wait in the prefill pod's sidecar (block-API engines).
    pub fn via_sidecars(&self) -> bool {
        self.remote_transport.as_deref() == Some(KVBLOCKS_TRANSPORT)
    }

    /// `kv_transfer_params` of a request or answer body, if it has well-formed ones.
    pub fn of(body: &Map<String, Value>) -> Option<Self> {
        body.get(Self::FIELD)
            .filter(|v| !v.is_null())
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// Sets them as `body`'s `kv_transfer_params`.
    pub fn put(&self, body: &mut Map<String, Value>) {
        let value = serde_json::to_value(self).expect("parameters serialize");
        body.insert(Self::FIELD.into(), value);
    }
}

/// The body of the prefill leg from the client's: one token, not streamed, and asking
/// the prefill engine to keep its blocks for a remote decode. Token floors and stream
/// options go (a one-token answer cannot honour them; vLLM's proxy drops them too).
pub fn prefill_body(client: &Map<String, Value>) -> Map<String, Value> {
    let mut body = client.clone();
    body.insert("stream".into(), Value::Bool(false));
    body.insert("max_tokens".into(), 1.into());
    if body.contains_key("max_completion_tokens") {
        body.insert("max_completion_tokens".into(), 1.into());
    }
    for field in ["stream_options", "min_tokens", "min_completion_tokens"] {
        body.remove(field);
    }
    KvTransferParams::remote_decode().put(&mut body);
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_prefill_leg_asks_for_one_whole_token_and_a_remote_decode() {
        let client = object(json!({
            "model": "m", "prompt": "hi", "stream": true, "max_tokens": 200,
            "max_completion_tokens": 200, "min_tokens": 5,
            "stream_options": {"include_usage": true}, "seed": 7,
        }));
        let body = prefill_body(&client);
        assert_eq!(
            Value::Object(body),
            json!({
                "model": "m", "prompt": "hi", "stream": false, "max_tokens": 1,
                "max_completion_tokens": 1, "seed": 7,
                "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
                    "remote_block_ids": null, "remote_engine_id": null,
                    "remote_host": null, "remote_port": null},
            })
        );
        assert_eq!(client["max_tokens"], 200, "the client's body is untouched");
    }

    #[test]
    fn vllm_parameters_round_trip_with_fields_we_do_not_know() {
        // The shape NixlConnectorScheduler.request_finished returns (connector v2), plus
        // a newer connector's field.
        let vllm = json!({
            "do_remote_prefill": true, "do_remote_decode": false,
            "remote_block_ids": [3, 4, 5], "remote_engine_id": "e-1",
            "remote_request_id": "cmpl-1", "remote_host": "10.0.0.7",
            "remote_port": 5600, "tp_size": 1, "remote_num_tokens": 47,
        });
        let params = KvTransferParams::of(&object(json!({"kv_transfer_params": vllm}))).unwrap();
        assert!(params.do_remote_prefill && !params.via_sidecars());
        assert_eq!(params.remote_block_ids, Some(vec![3, 4, 5]));
        let mut body = Map::new();
        params.put(&mut body);
        assert_eq!(body["kv_transfer_params"], vllm);
    }

    #[test]
    fn malformed_or_null_parameters_are_none() {
        for body in [
            json!({}),
            json!({"kv_transfer_params": null}),
            json!({"kv_transfer_params": "yes"}),
            json!({"kv_transfer_params": {"remote_port": 70000}}),
            json!({"kv_transfer_params": {"remote_block_ids": [-1]}}),
        ] {
            assert_eq!(KvTransferParams::of(&object(body.clone())), None, "{body}");
        }
    }

    #[test]
    fn outcomes_parse_back_from_their_names() {
        for outcome in HopOutcome::ALL {
            assert_eq!(HopOutcome::parse(outcome.as_str()), Some(outcome));
        }
        assert_eq!(HopOutcome::parse("other"), None);
        assert!(HopOutcome::FallbackTimeout.is_fallback() && !HopOutcome::Remote.is_fallback());
    }
}
