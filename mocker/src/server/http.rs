//! vLLM's OpenAI-compatible HTTP surface: `/v1/chat/completions`, `/v1/completions`
//! (whole or streamed as SSE), `/v1/models`, `/health`, `/metrics`, and
//! `/reset_prefix_cache`; either role of a disaggregated request (`super::disagg`).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use dynamo_llm::embeddings::{
    self, Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage, Vector,
};
use dynamo_llm::openai::{ChatCompletionRequest, CompletionRequest, ModelList, parse_body};
use dynamo_llm::{ApiError, Endpoint, ModelDir, PreparedRequest};
use serde_json::Value;
use tokio::sync::mpsc;

use super::answer::{Answer, ChoicePlan};
use super::disagg::{Asked, Disagg};
use super::engine_loop::{EngineHandle, GenEvent, SubmitError};
use super::kv_blocks::Onboarded;
use super::metrics::EngineMetricsExporter;
use super::model_output::{ModelBehaviour, Script};
use super::output_vocab::OutputVocab;
use super::sampling::Sampling;
use crate::{EngineConfig, Rejected, RequestId, tokens::splitmix64};

/// Answers stop "naturally" after this many tokens at most when the client sets no
/// limit: the mock has no EOS to sample, and vLLM's default (the rest of the context)
/// would make a bare `curl` stream for minutes.
const NATURAL_LENGTH: std::ops::RangeInclusive<u64> = 16..=256;

pub struct AppState {
    pub model: ModelDir,
    pub vocab: OutputVocab,
    pub engine: EngineHandle,
    pub kv_pool: KvPool,
    /// The kind of model the engine plays (its answers' reasoning and tool calls).
    pub behaviour: ModelBehaviour,
    pub disagg: Disagg,
    pub metrics: Arc<EngineMetricsExporter>,
    pub created: u64,
    /// Mixed into response ids, so that engines numbering their requests alike still
    /// answer with ids unique across a pool.
    pub id_salt: u64,
}

/// The engine's KV block pool, as far as whether a request's `n` answers fit it goes.
#[derive(Debug, Clone, Copy)]
pub struct KvPool {
    block_size: usize,
    blocks: usize,
    prefix_caching: bool,
}

impl KvPool {
    pub fn of(engine: &EngineConfig) -> Self {
        Self {
            block_size: engine.block_size,
            blocks: engine.num_gpu_blocks,
            prefix_caching: engine.enable_prefix_caching,
        }
    }

    /// Refuses `n > 1` answers whose KV cannot be held at once, as the engine refuses
    /// one answer that cannot (`Rejected::TooLong`): the prompt's full blocks are shared
    /// (the later answers find them cached), the rest each answer holds for itself.
    fn check_fits(&self, prompt: usize, plans: &[ChoicePlan]) -> Result<(), ApiError> {
        // At most `len - 1` prompt tokens are taken from the cache (the scheduler's rule).
        let shared = if self.prefix_caching {
            (prompt - 1) / self.block_size
        } else {
            0
        };
        let needed = shared
            + plans
                .iter()
                .map(|p| (prompt + p.max_tokens - 1).div_ceil(self.block_size) - shared)
                .sum::<usize>();
        if needed <= self.blocks {
            return Ok(());
        }
        let longest = plans.iter().map(|p| p.max_tokens).max().unwrap_or(0);
        Err(ApiError {
            code: Some(dynamo_llm::error::CONTEXT_LENGTH_EXCEEDED),
            ..ApiError::bad_request(
                format!(
                    "The request does not fit in the KV cache: n = {} answers to a prompt of \
                     {prompt} tokens, of up to {longest} output tokens each, need {needed} KV \
                     blocks, the pool has {}",
                    plans.len(),
                    self.blocks
                ),
                Some("n"),
            )
        })
    }
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
pub(super) fn response_id(prefix: &str, salt: u64, id: u64) -> String {
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
    let calls_tools = state.behaviour.tool_calls.is_some();
    refuse_unimplemented(&req.other, calls_tools)?;
    let sampling = Sampling::from_request(Endpoint::Chat, &req.other)?;
    let prepared = state.model.prepare_chat(&req)?;
    let limited = req.params.max_tokens.is_some() || req.params.max_completion_tokens.is_some();
    let asked = asked(&state, req.params.kv_transfer_params.as_ref(), &headers);
    let key = prepared.seed.unwrap_or(prepared.token_ids.len() as u64);
    let script = state
        .behaviour
        .script(&req, &state.model, &state.vocab, key);
    generate(state, prepared, sampling, limited, asked, script).await
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_body(&body)?;
    refuse_unimplemented(&req.other, false)?;
    let sampling = Sampling::from_request(Endpoint::Completions, &req.other)?;
    let prepared = state.model.prepare_completion(&req)?;
    let limited = req.params.max_tokens.is_some();
    let asked = asked(&state, req.params.kv_transfer_params.as_ref(), &headers);
    generate(state, prepared, sampling, limited, asked, Script::default()).await
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
            embedding: Vector::encode(&req, bag_of_tokens(ids, dims)),
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
/// constrained one (a real vLLM behind the same picker honours them). A forced
/// `tool_choice` is served when the engine plays a tool-calling model (`calls_tools`).
fn refuse_unimplemented(
    other: &serde_json::Map<String, Value>,
    calls_tools: bool,
) -> Result<(), ApiError> {
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
    if set("response_format").is_some_and(|f| f.get("type").and_then(Value::as_str) != Some("text"))
    {
        return refuse("response_format", "structured output");
    }
    // `auto` and `none` leave the choice to the model, which calls a tool only when it
    // plays a tool-calling model.
    let forced = set("tool_choice").is_some_and(|c| !matches!(c.as_str(), Some("auto" | "none")));
    if forced && !calls_tools {
        return refuse("tool_choice", "tool calls");
    }
    Ok(())
}

/// Runs a prepared request; `limited` says whether the client set a token limit.
async fn generate(
    state: Arc<AppState>,
    req: PreparedRequest,
    sampling: Sampling,
    limited: bool,
    asked: Asked,
    script: Script,
) -> Result<Response, ApiError> {
    if req.n > 1 && (asked.lend_as.is_some() || asked.remote_prefill.is_some()) {
        return Err(ApiError::bad_request(
            "n > 1 is not supported with kv_transfer_params (a disaggregated request)",
            Some("n"),
        ));
    }
    let plans: Vec<ChoicePlan> = (0..req.n)
        .map(|choice| choice_plan(&req, limited, choice, &script))
        .collect();
    if req.n > 1 {
        state.kv_pool.check_fits(req.token_ids.len(), &plans)?;
    }
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
    let lend = asked.lend_as.filter(|_| !req.stream);
    let mut submitted = vec![submit(&state, req.token_ids.clone(), &plans[0], onboarded).await?];
    // The other choices share the first's prompt blocks, which the engine caches as it
    // schedules them: vLLM serves parallel samples from one prefill the same way.
    for plan in &plans[1..] {
        submitted.push(submit(&state, req.token_ids.clone(), plan, None).await?);
    }
    let stream = req.stream;
    let answer = Answer::new(state, req, sampling, plans, submitted, lend, script);
    if stream {
        Ok(answer.stream())
    } else {
        answer.whole().await
    }
}

/// Choice `choice`'s seed: the request's for the first (so `n = 1` answers as before),
/// one derived from it for the others.
fn choice_seed(seed: u64, choice: u32) -> u64 {
    match choice {
        0 => seed,
        _ => splitmix64(seed ^ splitmix64(u64::from(choice))),
    }
}

fn choice_plan(req: &PreparedRequest, limited: bool, choice: u32, script: &Script) -> ChoicePlan {
    // Without a limit (and unless told to ignore EOS) an answer ends "naturally" after a
    // length fixed by the prompt and its seed, reported as `stop` like a real EOS, or
    // where its script says (after a tool call; some words after its reasoning).
    let natural = (!limited && !req.ignore_eos).then(|| {
        let seed = choice_seed(req.seed.unwrap_or(0), choice);
        let key = splitmix64(req.token_ids.len() as u64 ^ seed);
        let span = NATURAL_LENGTH.end() - NATURAL_LENGTH.start() + 1;
        let length = NATURAL_LENGTH.start() + key % span;
        script
            .len()
            .map_or(length + script.opening.len() as u64, |n| n as u64)
    });
    // A call is the end of the answer, even within a limit the client set.
    let natural = natural.or_else(|| {
        let call = script.len().map(|n| n as u64);
        call.filter(|&n| !req.ignore_eos && n <= req.max_tokens)
    });
    ChoicePlan {
        seed: req.seed.map(|seed| choice_seed(seed, choice)),
        max_tokens: natural.map_or(req.max_tokens, |n| n.min(req.max_tokens)) as usize,
        natural_stop: natural.is_some(),
        pin_ttl: req.hints.pin_ttl,
    }
}

/// Queues one choice of a request in the engine; its tokens arrive on the receiver.
async fn submit(
    state: &AppState,
    tokens: Vec<u32>,
    plan: &ChoicePlan,
    onboarded: Option<Onboarded>,
) -> Result<(RequestId, mpsc::UnboundedReceiver<GenEvent>), ApiError> {
    state
        .engine
        .submit(tokens, plan.max_tokens, plan.seed, plan.pin_ttl, onboarded)
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
        })
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
