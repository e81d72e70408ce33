//! vLLM's OpenAI-compatible HTTP surface: `/v1/chat/completions`, `/v1/completions`
//! (whole or streamed as SSE), `/v1/models`, `/health`, `/metrics`, and
//! `/reset_prefix_cache`; either role of a disaggregated request (`super::disagg`).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use dynamo_llm::embeddings::{self, Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage};
use dynamo_llm::openai::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatCompletionRequest, Completion, CompletionChoice, CompletionRequest, Delta, FinishReason,
    ModelList, SSE_DONE, Usage, parse_body, sse_data,
};
use dynamo_llm::{ApiError, Endpoint, ModelDir, PreparedRequest};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::disagg::{Asked, Disagg};
use super::engine_loop::{EngineHandle, GenEvent, SubmitError};
use super::metrics::EngineMetricsExporter;
use super::output_vocab::OutputVocab;
use crate::{FinishedRequest, Rejected, tokens::splitmix64};

/// Answers stop "naturally" after this many tokens at most when the client sets no
/// limit: the mock has no EOS to sample, and vLLM's default (the rest of the context)
/// would make a bare `curl` stream for minutes.
const NATURAL_LENGTH: std::ops::RangeInclusive<u64> = 16..=256;

pub struct AppState {
    pub model: ModelDir,
    pub vocab: OutputVocab,
    pub engine: EngineHandle,
    pub disagg: Disagg,
    pub metrics: Arc<EngineMetricsExporter>,
    pub created: u64,
    /// Mixed into response ids, so that engines numbering their requests alike still
    /// answer with ids unique across a pool.
    pub id_salt: u64,
}

/// A value no other engine process is likely to draw: the start time and the process id,
/// mixed.
pub fn process_salt() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    splitmix64(nanos ^ (u64::from(std::process::id()) << 32))
}

/// A response id of 128 bits (vLLM's ids are random UUIDs) from engine request `id`.
fn response_id(prefix: &str, salt: u64, id: u64) -> String {
    format!("{prefix}-{salt:016x}{:016x}", splitmix64(salt ^ id))
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route(embeddings::PATH, post(embed))
        .route("/metrics", get(metrics))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .with_state(state)
}

async fn models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList::single(
        &state.model.name,
        state.created,
        state.model.max_context,
    ))
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}

async fn reset_prefix_cache(State(state): State<Arc<AppState>>) -> Result<StatusCode, ApiError> {
    match state.engine.reset_prefix_cache().await {
        Ok(true) => Ok(StatusCode::OK),
        Ok(false) => Err(ApiError::bad_request(
            "requests are running; the prefix cache can be reset only when idle",
            None,
        )),
        Err(e) => Err(ApiError::unavailable(e.to_string())),
    }
}

/// The request id vLLM's disaggregation proxies send to both legs.
const REQUEST_ID_HEADER: &str = "x-request-id";

/// What a request's `kv_transfer_params` ask, its lease named by its `x-request-id`.
fn asked(state: &AppState, params: Option<&Value>, headers: &HeaderMap) -> Asked {
    let request_id = headers.get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok());
    state.disagg.asked(params, request_id)
}

async fn chat(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse_body(&body)?;
    refuse_unimplemented(&req.other)?;
    let prepared = state.model.prepare_chat(&req)?;
    let limited = req.params.max_tokens.is_some() || req.params.max_completion_tokens.is_some();
    let asked = asked(&state, req.params.kv_transfer_params.as_ref(), &headers);
    generate(state, prepared, limited, asked).await
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_body(&body)?;
    refuse_unimplemented(&req.other)?;
    let prepared = state.model.prepare_completion(&req)?;
    let asked = asked(&state, req.params.kv_transfer_params.as_ref(), &headers);
    generate(state, prepared, req.params.max_tokens.is_some(), asked).await
}

/// Dimensions of the mock engine's embeddings (a small embedding model's, e.g. 384).
const EMBEDDING_DIMS: usize = 384;

/// `/v1/embeddings`, as vLLM serves a pooling model: each input's vector is the
/// normalised sum of a fixed pseudo-random vector per token, so equal texts embed
/// equally and texts sharing words lie closer than unrelated ones. Embedding is not
/// simulated in engine time (vLLM runs it as a prefill; the mock answers at once).
async fn embed(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Json<EmbeddingList>, ApiError> {
    let req: EmbeddingRequest = parse_body(&body)?;
    let inputs = state.model.prepare_embeddings(&req, EMBEDDING_DIMS)?;
    let dims = req.dimensions.map_or(EMBEDDING_DIMS, |d| d as usize);
    let tokens: u64 = inputs.iter().map(|ids| ids.len() as u64).sum();
    let data = inputs
        .iter()
        .enumerate()
        .map(|(index, ids)| Embedding {
            object: "embedding".into(),
            index,
            embedding: bag_of_tokens(ids, dims),
        })
        .collect();
    Ok(Json(EmbeddingList {
        object: "list".into(),
        data,
        model: state.model.name.clone(),
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    }))
}

/// The unit-length sum of each token's pseudo-random vector (components uniform in
/// [-1, 1], SplitMix64 of the token and the dimension).
fn bag_of_tokens(ids: &[u32], dims: usize) -> Vec<f32> {
    let mut v = vec![0f64; dims];
    for &id in ids {
        for (d, x) in v.iter_mut().enumerate() {
            let r = splitmix64((u64::from(id) << 16) ^ d as u64);
            *x += (r >> 11) as f64 / (1u64 << 52) as f64 - 1.0;
        }
    }
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    v.iter().map(|x| (x / norm) as f32).collect()
}

/// OpenAI parameters whose effect the mock engine cannot produce: refused with a 400 that
/// names them rather than ignored, so a client never takes a mock answer for a
/// constrained one (a real vLLM behind the same picker honours them).
fn refuse_unimplemented(other: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    let set = |name: &str| -> Option<&Value> {
        other.get(name).filter(|v| match v {
            Value::Null | Value::Bool(false) => false,
            Value::Array(a) => !a.is_empty(),
            Value::String(s) => !s.is_empty(),
            _ => true,
        })
    };
    let refuse = |name: &str, what: &str| {
        Err(ApiError::bad_request(
            format!("{name}: the mock engine does not implement {what}"),
            Some(name),
        ))
    };
    if set("stop").is_some() {
        return refuse("stop", "stop sequences");
    }
    if set("logprobs").is_some() || set("top_logprobs").is_some() {
        return refuse("logprobs", "log probabilities");
    }
    if set("response_format").is_some_and(|f| f.get("type").and_then(Value::as_str) != Some("text"))
    {
        return refuse("response_format", "structured output");
    }
    // `auto` and `none` leave the choice to the model, which here never calls a tool.
    if set("tool_choice").is_some_and(|c| !matches!(c.as_str(), Some("auto" | "none"))) {
        return refuse("tool_choice", "tool calls");
    }
    Ok(())
}

/// Runs a prepared request; `limited` says whether the client set a token limit.
async fn generate(
    state: Arc<AppState>,
    req: PreparedRequest,
    limited: bool,
    asked: Asked,
) -> Result<Response, ApiError> {
    let seed = req.seed;
    // Without a limit (and unless told to ignore EOS) the answer ends "naturally" after a
    // length fixed by the prompt and seed, reported as `stop` like a real EOS.
    let natural = (!limited && !req.ignore_eos).then(|| {
        let key = splitmix64(req.token_ids.len() as u64 ^ seed.unwrap_or(0));
        let span = NATURAL_LENGTH.end() - NATURAL_LENGTH.start() + 1;
        NATURAL_LENGTH.start() + key % span
    });
    let max_tokens = natural.map_or(req.max_tokens, |n| n.min(req.max_tokens));
    let onboarded = match &asked.remote_prefill {
        Some(lease) => Some(
            state
                .disagg
                .onboard(&state.engine, lease, &req.token_ids)
                .await,
        ),
        None => None,
    };
    // Only a whole answer can wait for the lend: vLLM's proxies ask `stream: false`.
    let lend = match asked.lend_as {
        Some(lease) if !req.stream => Some((lease, req.token_ids.clone())),
        _ => None,
    };
    let (id, events) = state
        .engine
        .submit(req.token_ids, max_tokens as usize, seed, onboarded)
        .await
        .map_err(|e| match e {
            SubmitError::Rejected(r @ Rejected::TooLong { .. }) => ApiError {
                code: Some(dynamo_llm::error::CONTEXT_LENGTH_EXCEEDED),
                ..ApiError::bad_request(
                    format!("The request does not fit in the KV cache: {r}"),
                    Some("max_tokens"),
                )
            },
            SubmitError::Rejected(r) => ApiError::bad_request(r.to_string(), None),
            SubmitError::Stopped => ApiError::unavailable("the engine has stopped"),
        })?;
    let id = match req.endpoint {
        Endpoint::Chat => response_id("chatcmpl", state.id_salt, id),
        Endpoint::Completions => response_id("cmpl", state.id_salt, id),
    };
    let answer = Answer {
        state,
        endpoint: req.endpoint,
        id,
        created: unix_now(),
        natural_stop: natural.is_some(),
        include_usage: req.include_usage,
        sent_role: false,
        lend,
    };
    if req.stream {
        Ok(answer.stream(events))
    } else {
        answer.whole(events).await
    }
}

/// Formats one request's answer.
struct Answer {
    state: Arc<AppState>,
    endpoint: Endpoint,
    id: String,
    created: u64,
    natural_stop: bool,
    include_usage: bool,
    sent_role: bool,
    /// The lease to lend the prompt's blocks under once prefilled, and the prompt.
    lend: Option<(String, Vec<u32>)>,
}

impl Answer {
    fn finish_reason(&self, done: &FinishedRequest) -> FinishReason {
        match done.reason {
            crate::FinishReason::Length if !self.natural_stop => FinishReason::Length,
            _ => FinishReason::Stop,
        }
    }

    fn usage(done: &FinishedRequest) -> Usage {
        Usage::new(
            done.prompt_tokens as u64,
            done.output_tokens as u64,
            done.cached_prompt_tokens as u64,
        )
    }

    async fn whole(
        self,
        mut events: mpsc::UnboundedReceiver<GenEvent>,
    ) -> Result<Response, ApiError> {
        let mut text = String::new();
        while let Some(event) = events.recv().await {
            match event {
                GenEvent::Token(token) => text.push_str(self.state.vocab.piece(token)),
                GenEvent::Finished(done) => {
                    let model = self.state.model.name.clone();
                    let (reason, usage) = (self.finish_reason(&done), Self::usage(&done));
                    // Answered only once the blocks wait in the sidecar (or will not).
                    let kv_transfer_params = match &self.lend {
                        Some((lease, tokens)) if done.reason == crate::FinishReason::Length => {
                            Some(self.state.disagg.lend(lease, tokens).await)
                        }
                        Some(_) => Some(Value::Null),
                        None => None,
                    };
                    let body = match self.endpoint {
                        Endpoint::Chat => serde_json::to_value(ChatCompletion {
                            id: self.id,
                            object: "chat.completion".into(),
                            created: self.created,
                            model,
                            choices: vec![ChatChoice {
                                index: 0,
                                message: AssistantMessage {
                                    role: "assistant".into(),
                                    content: text,
                                },
                                finish_reason: Some(reason),
                            }],
                            usage,
                            kv_transfer_params,
                        }),
                        Endpoint::Completions => serde_json::to_value(Completion {
                            id: self.id,
                            object: "text_completion".into(),
                            created: self.created,
                            model,
                            choices: vec![CompletionChoice {
                                index: 0,
                                text,
                                finish_reason: Some(reason),
                            }],
                            usage: Some(usage),
                            kv_transfer_params,
                        }),
                    }
                    .expect("answers serialize");
                    return Ok(Json(body).into_response());
                }
            }
        }
        Err(ApiError::unavailable(
            "the engine stopped before the answer was complete",
        ))
    }

    /// SSE, one chunk per token as the engine produces it. Dropping the body (the client
    /// left) drops the receiver, and the engine aborts the request.
    fn stream(mut self, events: mpsc::UnboundedReceiver<GenEvent>) -> Response {
        let frames = UnboundedReceiverStream::new(events)
            .map(move |event| Ok::<_, Infallible>(self.frames(event)));
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from_stream(frames))
            .expect("static headers are valid")
    }

    /// The SSE frames for one engine event (the last event also closes the stream).
    fn frames(&mut self, event: GenEvent) -> String {
        match event {
            GenEvent::Token(token) => {
                let piece = self.state.vocab.piece(token).to_owned();
                let mut out = String::new();
                if self.endpoint == Endpoint::Chat && !self.sent_role {
                    // OpenAI opens a chat stream with the role alone.
                    self.sent_role = true;
                    out.push_str(&self.chat_chunk(
                        Delta {
                            role: Some("assistant".into()),
                            content: Some(String::new()),
                        },
                        None,
                    ));
                }
                out.push_str(&match self.endpoint {
                    Endpoint::Chat => self.chat_chunk(
                        Delta {
                            role: None,
                            content: Some(piece),
                        },
                        None,
                    ),
                    Endpoint::Completions => self.completion_chunk(piece, None),
                });
                out
            }
            GenEvent::Finished(done) => {
                let reason = self.finish_reason(&done);
                let mut out = match self.endpoint {
                    Endpoint::Chat => self.chat_chunk(Delta::default(), Some(reason)),
                    Endpoint::Completions => self.completion_chunk(String::new(), Some(reason)),
                };
                if self.include_usage {
                    out.push_str(&self.usage_chunk(Self::usage(&done)));
                }
                out.push_str(SSE_DONE);
                out
            }
        }
    }

    fn chat_chunk(&self, delta: Delta, finish_reason: Option<FinishReason>) -> String {
        self.chat_frame(
            vec![ChatChunkChoice {
                index: 0,
                delta,
                finish_reason,
            }],
            None,
        )
    }

    fn completion_chunk(&self, text: String, finish_reason: Option<FinishReason>) -> String {
        self.completion_frame(
            vec![CompletionChoice {
                index: 0,
                text,
                finish_reason,
            }],
            None,
        )
    }

    /// OpenAI's last chunk when `stream_options.include_usage`: no choices, only usage.
    fn usage_chunk(&self, usage: Usage) -> String {
        match self.endpoint {
            Endpoint::Chat => self.chat_frame(vec![], Some(usage)),
            Endpoint::Completions => self.completion_frame(vec![], Some(usage)),
        }
    }

    fn chat_frame(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> String {
        sse_data(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.state.model.name.clone(),
            choices,
            usage,
        })
    }

    fn completion_frame(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> String {
        sse_data(&Completion {
            id: self.id.clone(),
            object: "text_completion".into(),
            created: self.created,
            model: self.state.model.name.clone(),
            choices,
            usage,
            kv_transfer_params: None,
        })
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
