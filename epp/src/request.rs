//! From an OpenAI request body to what the router needs: the same checks and
//! tokenization an engine applies (`dynamo-llm`), so a bad request is refused here with
//! the engine's 4xx before any pod is bothered.

use std::sync::Arc;

use bytes::Bytes;
use dynamo_llm::agent_hints::AgentHints;
use dynamo_llm::disagg::KvTransferParams;
use dynamo_llm::embeddings::{self, EmbeddingRequest};
use dynamo_llm::openai::{ChatCompletionRequest, CompletionRequest, parse_body};
use dynamo_llm::prepare::TOKEN_DATA;
use dynamo_llm::{ApiError, ModelDir, PreparedRequest};

use crate::router::RouteRequest;

/// The OpenAI APIs the picker understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
    /// Answered whole, never streamed: no migration mid-answer, only failover.
    Embeddings,
}

impl Api {
    pub const ALL: [Api; 3] = [Api::Chat, Api::Completions, Api::Embeddings];

    pub const fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::Embeddings => embeddings::PATH,
        }
    }

    /// The API a request path (query string allowed) addresses.
    pub fn from_path(path: &str) -> Option<Self> {
        let path = path.split('?').next().unwrap_or(path).trim_end_matches('/');
        Api::ALL.into_iter().find(|api| path == api.path())
    }
}

/// What the picker learnt of a request by checking and tokenizing it.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub route: RouteRequest,
    /// Our count of the prompt's tokens (all inputs of an embedding request).
    pub prompt_tokens: usize,
    pub hints: AgentHints,
}

impl From<PreparedRequest> for Prepared {
    fn from(prepared: PreparedRequest) -> Self {
        Self {
            prompt_tokens: prepared.token_ids.len(),
            route: RouteRequest {
                tokens: prepared.token_ids,
                max_tokens: prepared.max_tokens,
                priority: prepared.hints.priority,
                osl: prepared.hints.osl,
                ..RouteRequest::default()
            },
            hints: prepared.hints,
        }
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
pub fn prepare(model: &ModelDir, api: Api, body: &[u8]) -> Result<Prepared, ApiError> {
    Ok(match api {
        Api::Chat => model
            .prepare_chat(&parse_body::<ChatCompletionRequest>(body)?)?
            .into(),
        Api::Completions => model
            .prepare_completion(&parse_body::<CompletionRequest>(body)?)?
            .into(),
        Api::Embeddings => {
            // The engine knows its dimensions and checks them; the inputs, concatenated,
            // are the prefill work the request brings its pod.
            let inputs =
                model.prepare_embeddings(&parse_body::<EmbeddingRequest>(body)?, usize::MAX)?;
            let tokens: Vec<u32> = inputs.concat();
            Prepared {
                prompt_tokens: tokens.len(),
                route: RouteRequest {
                    tokens,
                    ..RouteRequest::default()
                },
                hints: AgentHints::default(),
            }
        }
    })
}

/// Bodies up to this size are prepared on the async worker itself: fastokens encodes
/// 7k tokens in about 60 µs (`llm/benches/encode.rs`), so 256 KiB take about a
/// millisecond, less than a thread of the blocking pool costs the first time it encodes
/// (fastokens seeds a cache of several MiB per thread), and that pool's threads come and go.
const INLINE_BODY_BYTES: usize = 256 << 10;

/// [`prepare`] without holding an async worker for long: only a body over
/// [`INLINE_BODY_BYTES`] goes to the blocking pool.
pub async fn prepare_async(
    model: Arc<ModelDir>,
    api: Api,
    body: Bytes,
) -> Result<Prepared, ApiError> {
    if body.len() <= INLINE_BODY_BYTES {
        return prepare(&model, api, &body);
    }
    tokio::task::spawn_blocking(move || prepare(&model, api, &body))
        .await
        .unwrap_or_else(|e| Err(ApiError::internal(format!("tokenization failed: {e}"))))
}

/// A chat body with the prompt's token ids in `nvext.token_data` (Dynamo's field, which
/// `dynamo-llm`'s preparation takes instead of rendering and tokenizing the messages
/// again), for engines that read it (`--forward-token-ids`). A body without `nvext` gets
/// the field spliced before its closing brace; one with it is rewritten.
pub fn with_token_data(body: Bytes, tokens: &[u32]) -> Bytes {
    use std::fmt::Write;
    let mut ids = String::with_capacity(tokens.len() * 7 + 2);
    ids.push('[');
    for (i, id) in tokens.iter().enumerate() {
        if i > 0 {
            ids.push(',');
        }
        write!(ids, "{id}").expect("writing to a String");
    }
    ids.push(']');
    let field = format!("\"{TOKEN_DATA}\":{ids}");
    let text = body.trim_ascii_end();
    let inner = text.strip_suffix(b"}").map(<[u8]>::trim_ascii_end);
    let names_nvext = body.windows(7).any(|w| w == b"\"nvext\"");
    match inner {
        Some(inner) if !names_nvext && inner.len() > 1 => {
            let mut out = Vec::with_capacity(body.len() + field.len() + 16);
            out.extend_from_slice(inner);
            out.extend_from_slice(format!(",\"nvext\":{{{field}}}}}").as_bytes());
            Bytes::from(out)
        }
        _ => {
            let Ok(serde_json::Value::Object(mut object)) = serde_json::from_slice(&body) else {
                return body;
            };
            let nvext = object
                .entry("nvext")
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            let Some(nvext) = nvext.as_object_mut() else {
                return body;
            };
            let ids: serde_json::Value = tokens.iter().map(|&t| serde_json::json!(t)).collect();
            nvext.insert(TOKEN_DATA.to_owned(), ids);
            Bytes::from(serde_json::to_vec(&object).expect("JSON serializes"))
        }
    }
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
        assert_eq!(Api::from_path("/v1/embeddings"), Some(Api::Embeddings));
        assert_eq!(Api::from_path("/v1/models"), None);
    }

    #[test]
    fn token_ids_are_added_to_the_nvext_of_any_body() {
        let parse = |b: &Bytes| serde_json::from_slice::<serde_json::Value>(b).unwrap();
        let plain = Bytes::from_static(br#"{"model":"m","messages":[]} "#);
        let spliced = with_token_data(plain, &[1, 22, 333]);
        assert_eq!(
            parse(&spliced),
            serde_json::json!({"model": "m", "messages": [], "nvext": {"token_data": [1, 22, 333]}})
        );
        let hinted = Bytes::from_static(br#"{"model":"m","nvext":{"agent_hints":{"osl":5}}}"#);
        assert_eq!(
            parse(&with_token_data(hinted, &[7]))["nvext"],
            serde_json::json!({"agent_hints": {"osl": 5}, "token_data": [7]})
        );
        // Not a JSON object, or an `nvext` that is not one: left alone.
        for kept in [&b"[1]"[..], br#"{"nvext":3}"#] {
            let body = Bytes::copy_from_slice(kept);
            assert_eq!(with_token_data(body.clone(), &[1]), body);
        }
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
