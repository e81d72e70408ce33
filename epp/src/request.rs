//! From an OpenAI request body to what the router needs: the same checks and
//! tokenization an engine applies (`dynamo-llm`), so a bad request is refused here with
//! the engine's 4xx before any pod is bothered.

use std::sync::Arc;

use bytes::Bytes;
use dynamo_llm::disagg::KvTransferParams;
use dynamo_llm::openai::{ChatCompletionRequest, CompletionRequest, parse_body};
use dynamo_llm::{ApiError, ModelDir, PreparedRequest};

use crate::router::RouteRequest;

/// The OpenAI APIs the picker understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
}

impl Api {
    pub const fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
        }
    }

    /// The API a request path (query string allowed) addresses.
    pub fn from_path(path: &str) -> Option<Self> {
        let path = path.split('?').next().unwrap_or(path).trim_end_matches('/');
        [Api::Chat, Api::Completions]
            .into_iter()
            .find(|api| path == api.path())
    }
}

/// Room in a body for what surrounds the prompt text: JSON syntax and escapes, roles,
/// tools, parameters.
const BODY_FRAMING_BYTES: usize = 1 << 20;

/// The body limit when the tokenizer admits no prompt bound (what the frontend accepted
/// before bodies were bounded by the context).
const UNBOUNDED_BODY_BYTES: usize = 64 << 20;

/// The largest request body worth reading for `model`: one that could carry the longest
/// prompt text its context could hold ([`ModelDir::max_prompt_bytes`]).
pub fn default_body_limit(model: &ModelDir) -> usize {
    model.max_prompt_bytes().map_or(UNBOUNDED_BODY_BYTES, |b| {
        b.saturating_add(BODY_FRAMING_BYTES)
    })
}

/// Checks and tokenizes `body` for `api`.
pub fn prepare(model: &ModelDir, api: Api, body: &[u8]) -> Result<PreparedRequest, ApiError> {
    match api {
        Api::Chat => model.prepare_chat(&parse_body::<ChatCompletionRequest>(body)?),
        Api::Completions => model.prepare_completion(&parse_body::<CompletionRequest>(body)?),
    }
}

/// Bodies up to this size are prepared on the async worker itself: a few hundred tokens
/// take tens of microseconds, less than handing them to the blocking pool and back.
const INLINE_BODY_BYTES: usize = 1024;

/// [`prepare`] without holding an async worker for long: a long prompt's template and
/// tokenization take milliseconds (3 ms for 5k tokens), so larger bodies go to the
/// blocking pool.
pub async fn prepare_async(
    model: Arc<ModelDir>,
    api: Api,
    body: Bytes,
) -> Result<PreparedRequest, ApiError> {
    if body.len() <= INLINE_BODY_BYTES {
        return prepare(&model, api, &body);
    }
    tokio::task::spawn_blocking(move || prepare(&model, api, &body))
        .await
        .unwrap_or_else(|e| Err(ApiError::internal(format!("tokenization failed: {e}"))))
}

/// The body without the client's `kv_transfer_params`: only the prefill hop may hand
/// an engine transfer parameters (vLLM's NixlConnector connects to the `remote_host`
/// they name, so a client's own would make the engine connect where the client says).
pub fn without_transfer_params(body: Bytes) -> Bytes {
    let quoted = format!("\"{}\"", KvTransferParams::FIELD);
    if !body.windows(quoted.len()).any(|w| w == quoted.as_bytes()) {
        return body;
    }
    let Ok(serde_json::Value::Object(mut object)) = serde_json::from_slice(&body) else {
        return body;
    };
    match object.remove(KvTransferParams::FIELD) {
        Some(_) => Bytes::from(serde_json::to_vec(&object).expect("JSON serializes")),
        None => body,
    }
}

/// The routing inputs of a prepared request.
pub fn route_request(prepared: &PreparedRequest) -> RouteRequest {
    RouteRequest {
        tokens: prepared.token_ids.clone(),
        max_tokens: prepared.max_tokens,
        priority: prepared.priority,
        ..RouteRequest::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_apis() {
        assert_eq!(Api::from_path("/v1/chat/completions"), Some(Api::Chat));
        assert_eq!(
            Api::from_path("/v1/completions?x=1"),
            Some(Api::Completions)
        );
        assert_eq!(Api::from_path("/v1/completions/"), Some(Api::Completions));
        assert_eq!(Api::from_path("/v1/models"), None);
    }

    #[test]
    fn a_clients_transfer_parameters_are_removed_and_other_bodies_kept_byte_for_byte() {
        let forged =
            br#"{"model":"m","prompt":"p","kv_transfer_params":{"remote_host":"10.0.0.1"}}"#;
        let cleaned = without_transfer_params(Bytes::from_static(forged));
        let value: serde_json::Value = serde_json::from_slice(&cleaned).unwrap();
        assert_eq!(value, serde_json::json!({"model": "m", "prompt": "p"}));
        for kept in [
            &br#"{"model":"m",  "prompt":"kv_transfer_params"}"#[..],
            br#"{"prompt": "\"kv_transfer_params\""}"#,
            b"not json \"kv_transfer_params\"",
        ] {
            let body = Bytes::copy_from_slice(kept);
            assert_eq!(without_transfer_params(body.clone()), body);
        }
    }
}
