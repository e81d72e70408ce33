//! The OpenAI HTTP frontend: checks and tokenizes each request as the engine would, asks
//! the router for a pod, and proxies the request body to `http://{pod}{path}` (over
//! [`PodConnections`]), streaming the answer back unchanged. A client that leaves drops the proxied stream, which closes
//! the upstream connection (the engine aborts the request) and ends its load.
//!
//! The body is read up to a limit derived from the model's context
//! ([`request::default_body_limit`]); a longer one is refused with 413 as soon as its
//! `Content-Length` or its streamed bytes say so.
//!
//! A pod that fails before answering (connection refused or reset, or its sidecar's 503
//! `engine_unreachable`: the sidecar is up, its engine is not) is marked unhealthy for a
//! while and the request goes to another pod, up to `max_attempts` pods: nothing has
//! reached the client yet and the body is still in hand. Any other answer, errors
//! included, goes to the client unchanged.
//!
//! An answer that breaks off after its status (the pod died mid-answer) migrates
//! ([`crate::migration`]) up to `migration_limit` times: a stream is relayed frame by
//! frame and continued on another pod from the text already sent; a whole answer, of which
//! nothing was sent yet, is asked again. When migration is off or used up, a stream ends
//! with an error event and `[DONE]` and a whole answer is a 502, never a silent cut.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router as HttpRouter;
use axum::body::{Body, BodyDataStream, Bytes, HttpBody};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use bytes::BytesMut;
use dynamo_llm::ApiError;
use dynamo_llm::disagg::PREFILLER_HEADER;
use dynamo_llm::error::ENGINE_UNREACHABLE;
use dynamo_llm::openai::ModelList;
use dynamo_llm::openai::SSE_DONE;
use futures::stream::Peekable;
use futures::{FutureExt, Stream, StreamExt};
use serde_json::{Map, Value, json};

use crate::answer_parsing::{AnswerParsers, RequestParsers, StreamParsing};
use crate::meter::{ResponseMeter, find_frame_end};
use crate::metrics::{Metrics, NEW_REQUEST, ONGOING_REQUEST, PREPROCESS};
use crate::migration::{self, Progress};
use crate::model_source::ModelSource;
use crate::openapi;
use crate::pod_connections::PodConnections;
use crate::request::{self, Api};
use crate::responses;
use crate::router::{Assignment, RouteError, RouteRequest, Router};
use crate::speculative;

/// Client headers passed on to the pod: credentials for an engine started with an API
/// key, and request ids and trace context for its logs. Everything else is the
/// picker's own connection's business.
const FORWARDED_HEADERS: [&str; 4] = ["authorization", "x-request-id", "traceparent", "tracestate"];

/// Largest error body read to tell a sidecar's `engine_unreachable` 503 from others.
pub const ERROR_BODY_BYTES: u64 = 64 << 10;

/// How long a refused body is still read (and dropped), so that the client reads the 413
/// rather than a reset: closing a connection with unread data sends RST (RFC 1122
/// 4.2.2.13), which can discard the response before the client reads it.
const DRAIN_FOR: Duration = Duration::from_secs(5);

pub struct Frontend {
    pub model: ModelSource,
    pub router: Arc<Router>,
    pub metrics: Arc<Metrics>,
    pub pods: PodConnections,
    /// Unix seconds of start, for `/v1/models`.
    pub created: u64,
    pub options: FrontendOptions,
}

/// How the frontend treats requests and answers (from the picker's flags).
#[derive(Debug, Clone, Copy)]
pub struct FrontendOptions {
    /// Pods one request is tried on at most.
    pub max_attempts: usize,
    /// Times one request may migrate mid-answer.
    pub migration_limit: u32,
    /// How long a request leaving a failed pod waits for another when none is listed.
    pub migration_wait: Duration,
    /// Tool-call and reasoning parsing of chat answers.
    pub parsers: AnswerParsers,
    /// Send chat prompts' token ids along (`nvext.token_data`) to engines that read them.
    pub forward_token_ids: bool,
}

impl Frontend {
    pub fn new(
        model: ModelSource,
        router: Arc<Router>,
        metrics: Arc<Metrics>,
        options: FrontendOptions,
    ) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            model,
            router,
            metrics,
            pods: PodConnections::default(),
            created,
            options,
        }
    }

    /// Ready to serve: the model is loaded and the router can route.
    pub fn readiness(&self) -> Result<(), String> {
        self.model.get().map_err(|e| e.message)?;
        self.router.readiness()
    }
}

/// Every route of the HTTP frontend.
pub fn routes(frontend: Arc<Frontend>) -> HttpRouter {
    let mut routes = HttpRouter::new();
    for api in Api::ALL {
        routes = routes.route(
            api.path(),
            post(
                move |State(f): State<Arc<Frontend>>, headers: HeaderMap, body: Body| async move {
                    f.serve(api, headers, body).await
                },
            ),
        );
    }
    routes
        .route(
            responses::PATH,
            post(
                |State(f): State<Arc<Frontend>>, headers: HeaderMap, body: Body| async move {
                    f.serve_responses(headers, body).await
                },
            ),
        )
        .route("/v1/models", get(models))
        .route(openapi::PATH, get(openapi::serve))
        .merge(ops_routes())
        .fallback(|| async {
            ApiError {
                status: StatusCode::NOT_FOUND,
                message: "Not found: the frontend serves /v1/chat/completions, \
                          /v1/completions, /v1/embeddings, /v1/responses, /v1/models \
                          and /openapi.json"
                    .into(),
                kind: "invalid_request_error",
                param: None,
                code: None,
            }
        })
        .with_state(frontend)
}

/// `/health`, `/live` and `/metrics`, also served alone on `--metrics-port`.
pub fn ops_routes() -> HttpRouter<Arc<Frontend>> {
    HttpRouter::new()
        .route("/health", get(health))
        .route("/live", get(|| async { Json(json!({"status": "live"})) }))
        .route("/metrics", get(metrics))
}

async fn health(State(f): State<Arc<Frontend>>) -> Response {
    match f.readiness() {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not_ready", "reason": reason})),
        )
            .into_response(),
    }
}

async fn metrics(State(f): State<Arc<Frontend>>) -> Response {
    f.router.publish_load();
    let context = f.model.get().ok().map(|l| l.model.max_context);
    f.metrics
        .model(f.model.name(), f.router.config().block_size, context);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        f.metrics.encode(),
    )
        .into_response()
}

async fn models(State(f): State<Arc<Frontend>>) -> Result<Json<ModelList>, ApiError> {
    let model = &f.model.get()?.model;
    Ok(Json(ModelList::single(
        &model.name,
        f.created,
        model.max_context,
    )))
}

/// The OpenAI error for a request the router could not place.
pub fn route_error(e: RouteError) -> ApiError {
    match e {
        RouteError::NoEndpoint(_) => ApiError::unavailable(e.to_string()),
        RouteError::Overloaded { .. } => ApiError::overloaded(e.to_string()),
    }
}

/// Whether an answer's body is a sidecar's `engine_unreachable` error (its engine is
/// down, the pod cannot serve).
pub fn engine_unreachable(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|v| v["error"]["code"] == ENGINE_UNREACHABLE)
}

/// The request body, refused with 413 as soon as it is known to be longer than `limit`:
/// at once from its `Content-Length`, else when the bytes streamed in pass it.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|n| n > limit as u64) {
        drain(stream);
        return Err(ApiError::body_too_large(limit));
    }
    let mut buffer = BytesMut::with_capacity(declared.map_or(0, |n| n as usize));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request(format!("reading the request body failed: {e}"), None)
        })?;
        if buffer.len() + chunk.len() > limit {
            drain(stream);
            return Err(ApiError::body_too_large(limit));
        }
        buffer.extend_from_slice(&chunk);
    }
    Ok(buffer.freeze())
}

/// Reads and drops the rest of a refused body for at most [`DRAIN_FOR`].
fn drain(mut stream: BodyDataStream) {
    tokio::spawn(tokio::time::timeout(DRAIN_FOR, async move {
        while let Some(Ok(_)) = stream.next().await {}
    }));
}

/// A pod's answer to one attempt.
enum Answer {
    /// Streamed on as it arrives.
    Stream(Response),
    /// A small error read whole to tell whether the pod failed (see [`engine_unreachable`]).
    Whole {
        status: StatusCode,
        content_type: Option<HeaderValue>,
        body: Bytes,
    },
}

impl Frontend {
    async fn serve(self: Arc<Self>, api: Api, headers: HeaderMap, body: Body) -> Response {
        let started = Instant::now();
        let response = match self.read(&headers, body).await {
            Ok(body) => self.proxy(api, &headers, body, started).await,
            Err(e) => Err(e),
        };
        let response = response.unwrap_or_else(IntoResponse::into_response);
        self.metrics
            .request(self.model.name(), api.path(), response.status().as_str());
        response
    }

    /// `/v1/responses`: the request, translated, goes the chat path; its answer is
    /// translated back ([`responses`]).
    async fn serve_responses(self: Arc<Self>, headers: HeaderMap, body: Body) -> Response {
        let started = Instant::now();
        let response = async {
            let body = self.read(&headers, body).await?;
            let translation = responses::translate(&body)?;
            let chat = self
                .proxy(Api::Chat, &headers, translation.chat.clone(), started)
                .await?;
            let model = self.model.get()?.model.clone();
            let count: responses::TokenCounter =
                Arc::new(move |text: &str| model.encode(text).len() as u64);
            Ok::<_, ApiError>(responses::answer(translation, chat, count).await)
        }
        .await
        .unwrap_or_else(IntoResponse::into_response);
        self.metrics.request(
            self.model.name(),
            responses::PATH,
            response.status().as_str(),
        );
        response
    }

    /// The request body, once the model is loaded (its context bounds the body).
    async fn read(&self, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
        let limit = self.model.get()?.body_limit;
        read_body(headers, body, limit).await
    }

    async fn proxy(
        self: &Arc<Self>,
        api: Api,
        headers: &HeaderMap,
        body: Bytes,
        started: Instant,
    ) -> Result<Response, ApiError> {
        let model = self.model.get()?.model.clone();
        let prepared = request::prepare_async(model, api, body.clone()).await?;
        self.metrics
            .stage(PREPROCESS, started.elapsed().as_secs_f64());
        let parsers = self.answer_parsers(api, &body);
        let request = request::without_transfer_params(body);
        let body = match api {
            Api::Chat if self.options.forward_token_ids => {
                request::with_token_data(request.clone(), &prepared.route.tokens)
            }
            _ => request.clone(),
        };
        self.metrics.hints(self.model.name(), &prepared.hints);
        let mut call = Call {
            api,
            headers: headers.clone(),
            request,
            body,
            route: prepared.route,
            prompt_tokens: prepared.prompt_tokens,
            migration_limit: self.options.migration_limit,
            migrations_left: self.options.migration_limit,
            speculative_prefill: prepared.hints.speculative_prefill,
        };
        let (mut answer, mut assignment, sent) = self.open(&mut call).await?;
        let meter = ResponseMeter::start(
            self.metrics.clone(),
            self.model.name(),
            call.prompt_tokens,
            started,
            sent,
        );
        loop {
            let reply = match answer {
                Answer::Stream(reply) if reply.status() == StatusCode::OK => reply,
                other => return Ok(relay(other, assignment, meter)),
            };
            let content_type = reply.headers().get(header::CONTENT_TYPE).cloned();
            if is_event_stream(content_type.as_ref()) {
                let streamed = Streamed {
                    progress: Progress::new(api, call.prompt_tokens),
                    parsing: parsers.map(RequestParsers::stream),
                    frontend: self.clone(),
                    call,
                    upstream: upstream(reply),
                    assignment: Some(assignment),
                    pending: BytesMut::new(),
                    broke_at: None,
                    ended: false,
                };
                return Ok(respond(
                    StatusCode::OK,
                    content_type,
                    streamed.into_stream(),
                    meter,
                ));
            }
            // A whole answer is read before any of it is sent, so that one cut short can
            // be asked again elsewhere.
            let failure = match body_bytes(reply).await {
                Ok(body) => {
                    let body = match parsers {
                        Some(parsers) => parsers.whole(body),
                        None => body,
                    };
                    if call.speculative_prefill {
                        let answer = serde_json::from_slice::<Value>(&body).ok().map(|v| {
                            let choice = &v["choices"][0];
                            match api {
                                Api::Chat => choice["message"].clone(),
                                _ => choice["text"].clone(),
                            }
                        });
                        if let Some(answer) = answer {
                            self.speculate(&call, answer);
                        }
                    }
                    let whole = Answer::Whole {
                        status: StatusCode::OK,
                        content_type,
                        body,
                    };
                    return Ok(relay(whole, assignment, meter));
                }
                Err(e) => e.to_string(),
            };
            let address = self.broken(assignment, &failure);
            if let Some(reason) = call.cannot_migrate() {
                return Err(migration::interrupted(format!(
                    "the answer from {address} broke off ({failure}); {reason}"
                )));
            }
            call.migrate(address);
            self.metrics.migration(self.model.name(), ONGOING_REQUEST);
            (answer, assignment, _) = self.open(&mut call).await?;
        }
    }

    /// Sends the next turn's prefix of `call`'s finished answer (`answer`: the assistant
    /// message, or the text) to be prefilled, in the background ([`speculative`]).
    fn speculate(self: &Arc<Self>, call: &Call, answer: Value) {
        let Ok(request) = serde_json::from_slice::<Map<String, Value>>(&call.request) else {
            return;
        };
        let Some(next) = speculative::next_turn(call.api, &request, answer) else {
            return;
        };
        let (api, headers) = (call.api, call.headers.clone());
        let frontend = self.clone();
        tokio::spawn(async move {
            let outcome = match frontend.prefill(api, headers, next).await {
                Ok(()) => "sent",
                Err(e) => {
                    tracing::debug!(error = %e.message, "speculative prefill failed");
                    "failed"
                }
            };
            frontend
                .metrics
                .speculative_prefill(frontend.model.name(), outcome);
        });
    }

    /// Routes and runs a one-token request whose answer no one reads.
    async fn prefill(
        &self,
        api: Api,
        headers: HeaderMap,
        request: Map<String, Value>,
    ) -> Result<(), ApiError> {
        let body = Bytes::from(serde_json::to_vec(&request).expect("JSON serializes"));
        let model = self.model.get()?.model.clone();
        let prepared = request::prepare_async(model, api, body.clone()).await?;
        let mut call = Call {
            api,
            headers,
            request: body.clone(),
            body,
            route: prepared.route,
            prompt_tokens: prepared.prompt_tokens,
            migration_limit: 0,
            migrations_left: 0,
            speculative_prefill: false,
        };
        let (answer, _assignment, _) = self.open(&mut call).await?;
        let status = match answer {
            Answer::Stream(reply) => {
                let status = reply.status();
                body_bytes(reply)
                    .await
                    .map_err(|e| ApiError::unavailable(e.to_string()))?;
                status
            }
            Answer::Whole { status, .. } => status,
        };
        if status.is_success() {
            Ok(())
        } else {
            Err(ApiError::unavailable(format!(
                "the endpoint answered {status}"
            )))
        }
    }

    /// How the answer to `body` is parsed, if it is.
    fn answer_parsers(&self, api: Api, body: &[u8]) -> Option<RequestParsers> {
        let parsers = self.options.parsers;
        if api != Api::Chat || parsers == AnswerParsers::default() {
            return None;
        }
        let request = serde_json::from_slice::<Map<String, Value>>(body).ok()?;
        parsers.for_request(&request)
    }

    /// Routes the request and sends it, to another pod each time one fails before
    /// answering, up to `max_attempts` pods; with the answer, when it was sent.
    async fn open(&self, call: &mut Call) -> Result<(Answer, Assignment, Instant), ApiError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            // A request leaving a pod that failed it may wait for another to be listed.
            let wait = match call.route.exclude.is_empty() {
                true => Duration::ZERO,
                false => self.options.migration_wait,
            };
            let assignment = self
                .router
                .route_within(call.route.clone(), wait)
                .await
                .map_err(route_error)?;
            let sent = Instant::now();
            let address = assignment.address;
            let failure = match self.attempt(call, &assignment).await {
                Ok(answer) => return Ok((answer, assignment, sent)),
                Err(failure) => failure,
            };
            tracing::warn!(%address, %failure, attempt, "endpoint failed before answering");
            self.router.mark_unhealthy(address);
            drop(assignment);
            if attempt >= self.options.max_attempts {
                return Err(ApiError::unavailable(format!(
                    "endpoint {address} failed before answering ({failure}); \
                     {attempt} endpoints tried"
                )));
            }
            self.metrics.migration(self.model.name(), NEW_REQUEST);
            call.route.exclude.push(address);
        }
    }

    /// A pod's answer broke off: the pod is avoided for a while and the request's load
    /// leaves it. Returns its address.
    fn broken(&self, assignment: Assignment, failure: &str) -> std::net::SocketAddr {
        let address = assignment.address;
        tracing::warn!(%address, %failure, "an answer broke off");
        self.router.mark_unhealthy(address);
        address
    }

    /// Sends the request to the assigned pod; `Err` says why the pod failed before
    /// answering.
    async fn attempt(&self, call: &Call, assignment: &Assignment) -> Result<Answer, String> {
        let pod = self.pods.to(assignment.address);
        let mut request = http::Request::post(pod.target(call.api.path()))
            .header(header::HOST, pod.authority())
            .header(header::CONTENT_TYPE, "application/json");
        for name in FORWARDED_HEADERS {
            for value in call.headers.get_all(name) {
                request = request.header(name, value);
            }
        }
        if let Some(prefill) = assignment.prefill {
            request = request.header(PREFILLER_HEADER, prefill.to_string());
        }
        let request = request
            .body(Body::from(call.body.clone()))
            .expect("a path, an address and headers already checked make a request");
        // Refused, reset or closed before a status line: nothing came back.
        let answer = pod.send(request).await.map_err(|e| reasons(&e))?;
        self.metrics.prefill_hop(|name| {
            let value = answer.headers().get(name)?;
            value.to_str().ok().map(str::to_owned)
        });
        let small = answer
            .body()
            .size_hint()
            .exact()
            .is_some_and(|n| n <= ERROR_BODY_BYTES);
        let answer = answer.map(Body::new);
        if answer.status() != StatusCode::SERVICE_UNAVAILABLE || !small {
            return Ok(Answer::Stream(answer));
        }
        let status = answer.status();
        let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
        let body = body_bytes(answer).await.map_err(|e| e.to_string())?;
        if engine_unreachable(&body) {
            return Err(ENGINE_UNREACHABLE.to_owned());
        }
        Ok(Answer::Whole {
            status,
            content_type,
            body,
        })
    }
}

/// One request as sent to the pods: what a migration changes and how often it may.
struct Call {
    api: Api,
    /// The client's headers (those in [`FORWARDED_HEADERS`] go on).
    headers: HeaderMap,
    /// The client's body (less its transfer parameters), which continuations extend.
    request: Bytes,
    /// What goes to the pods: the client's body, or since a migration its continuation.
    body: Bytes,
    route: RouteRequest,
    /// Our count of the prompt's tokens; `route.tokens` starts with them.
    prompt_tokens: usize,
    migration_limit: u32,
    migrations_left: u32,
    /// Prefill the next turn once the answer is complete (`agent_hints.speculative_prefill`).
    speculative_prefill: bool,
}

impl Call {
    /// Why the request cannot migrate (again), if it cannot.
    fn cannot_migrate(&self) -> Option<String> {
        (self.migrations_left == 0).then(|| match self.migration_limit {
            0 => "migration is off (--migration-limit 0)".to_owned(),
            n => format!("it migrated {n} times already (--migration-limit {n})"),
        })
    }

    /// The request leaves `failed` for another pod.
    fn migrate(&mut self, failed: std::net::SocketAddr) {
        self.migrations_left -= 1;
        self.route.exclude.push(failed);
    }
}

/// The upstream answer as the client's response: same status, content type and bytes.
fn relay(answer: Answer, mut assignment: Assignment, meter: ResponseMeter) -> Response {
    let (status, content_type, upstream): (_, _, ByteStream) = match answer {
        Answer::Stream(answer) => (
            answer.status(),
            answer.headers().get(header::CONTENT_TYPE).cloned(),
            Box::pin(answer.into_body().into_data_stream()),
        ),
        Answer::Whole {
            status,
            content_type,
            body,
        } => (
            status,
            content_type,
            Box::pin(futures::stream::iter([Ok(body)])),
        ),
    };
    // The request's load stays on the pod until the body ends or the client leaves.
    let upstream = upstream.inspect(move |chunk| {
        if chunk.is_ok() {
            assignment.first_token();
        }
    });
    respond(status, content_type, Box::pin(upstream), meter)
}

/// A response with `body`, measured by `meter`.
fn respond(
    status: StatusCode,
    content_type: Option<HeaderValue>,
    body: ByteStream,
    mut meter: ResponseMeter,
) -> Response {
    meter.set_content_type(content_type.as_ref().and_then(|v| v.to_str().ok()));
    let body = MeteredBody {
        upstream: body,
        meter: Some(meter),
    };
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        content_type.unwrap_or(HeaderValue::from_static("application/json")),
    );
    response
}

fn is_event_stream(content_type: Option<&HeaderValue>) -> bool {
    content_type
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, axum::Error>> + Send>>;

/// A pod's whole body.
async fn body_bytes(answer: Response) -> Result<Bytes, axum::Error> {
    axum::body::to_bytes(answer.into_body(), usize::MAX).await
}

/// `error` and its sources, as one line.
fn reasons(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        line = format!("{line}: {cause}");
        source = cause.source();
    }
    line
}

/// How long the end of a pod's body is awaited after its `[DONE]` (it follows at once).
const END_OF_BODY_WAIT: Duration = Duration::from_secs(5);

/// A pod's streamed answer, whose chunks already read can be taken without waiting.
type Upstream = Pin<Box<Peekable<ByteStream>>>;

fn upstream(reply: Response) -> Upstream {
    upstream_of(reply.into_body().into_data_stream())
}

fn upstream_of(
    stream: impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
) -> Upstream {
    let stream: ByteStream = Box::pin(stream);
    Box::pin(stream.peekable())
}

/// A streamed answer relayed whole frame by whole frame, so that when it breaks off the
/// client has had none of a cut frame and the answer can continue on another pod.
struct Streamed {
    frontend: Arc<Frontend>,
    call: Call,
    upstream: Upstream,
    /// The pod's load, until its answer ends or breaks off.
    assignment: Option<Assignment>,
    /// Bytes after the last whole frame.
    pending: BytesMut,
    progress: Progress,
    /// Tool calls and reasoning split from the text, after `progress` saw it raw.
    parsing: Option<StreamParsing>,
    /// When the answer broke off, until its continuation's first chunk is relayed.
    broke_at: Option<Instant>,
    ended: bool,
}

impl Streamed {
    fn into_stream(self) -> ByteStream {
        Box::pin(futures::stream::unfold(self, |mut s| async move {
            let bytes = s.next().await?;
            Some((Ok(bytes), s))
        }))
    }

    /// The next bytes for the client; `None` at the end.
    async fn next(&mut self) -> Option<Bytes> {
        while !self.ended {
            let failure = match self.upstream.next().await {
                Some(Ok(chunk)) => {
                    if let Some(a) = self.assignment.as_mut() {
                        a.first_token();
                    }
                    let mut out = BytesMut::new();
                    self.frames(&chunk, &mut out);
                    // What the pod has sent already goes to the client in the same write
                    // (an end or a failure waits for the next call).
                    while let Some(Some(more)) =
                        self.upstream.as_mut().next_if(Result::is_ok).now_or_never()
                    {
                        self.frames(&more.expect("only chunks are taken"), &mut out);
                    }
                    if self.progress.done() {
                        self.end();
                    }
                    if out.is_empty() {
                        continue;
                    }
                    if let Some(broke_at) = self.broke_at.take() {
                        let resumed = &self.frontend.metrics.migration_resume_seconds;
                        resumed.observe(broke_at.elapsed().as_secs_f64());
                    }
                    return Some(out.freeze());
                }
                Some(Err(e)) => e.to_string(),
                None => "the stream ended before [DONE]".to_owned(),
            };
            let end = self.recover(failure).await;
            if let Some(end) = end {
                self.ended = true;
                return Some(Bytes::from(end));
            }
        }
        self.ended = true;
        self.assignment = None;
        None
    }

    /// `[DONE]` was relayed: the client's answer ends with these bytes, without waiting
    /// for the end of the pod's body, which is read in the background (a body dropped
    /// before its end would close the pooled connection to the pod).
    fn end(&mut self) {
        self.ended = true;
        self.speculate();
        if let Some(None) = self.upstream.as_mut().peek().now_or_never() {
            return;
        }
        let mut rest = std::mem::replace(&mut self.upstream, upstream_of(futures::stream::empty()));
        let drain = async move { while let Some(Ok(_)) = rest.next().await {} };
        tokio::spawn(tokio::time::timeout(END_OF_BODY_WAIT, drain));
    }

    /// The answer is complete: prefills the next turn if asked (once).
    fn speculate(&mut self) {
        if !std::mem::take(&mut self.call.speculative_prefill) {
            return;
        }
        let answer = match (&self.parsing, self.call.api) {
            (Some(parsing), _) => parsing.message(),
            (None, Api::Chat) => json!({"role": "assistant", "content": self.progress.text()}),
            (None, _) => self.progress.text().into(),
        };
        self.frontend.speculate(&self.call, answer);
    }

    /// Adds to `out` the whole frames `chunk` completes, as the client gets them.
    fn frames(&mut self, chunk: &[u8], out: &mut BytesMut) {
        self.pending.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(len) = find_frame_end(&self.pending[start..]) {
            let frame = &self.pending[start..start + len];
            if let Some(relayed) = self.progress.on_frame(frame) {
                match &mut self.parsing {
                    Some(parsing) => parsed_frame(parsing, &relayed, out),
                    None => out.extend_from_slice(&relayed),
                }
            }
            start += len;
        }
        let _ = self.pending.split_to(start);
    }

    /// The answer broke off: continues it on another pod (`None`), or gives the end of
    /// the stream.
    async fn recover(&mut self, failure: String) -> Option<String> {
        let broke_at = Instant::now();
        let assignment = self.assignment.take().expect("an answer was being relayed");
        let address = self.frontend.broken(assignment, &failure);
        self.pending.clear();
        if self.progress.answered() {
            return Some(SSE_DONE.to_owned());
        }
        let request = serde_json::from_slice::<Map<String, Value>>(&self.call.request)
            .expect("the body parsed when it was prepared");
        let loaded = self.frontend.model.get();
        let sent = loaded
            .expect("loaded to prepare the request")
            .model
            .encode(self.progress.text());
        let why_not = self
            .call
            .cannot_migrate()
            .or_else(|| migration::not_continuable(&request).map(str::to_owned))
            .or_else(|| self.progress.not_continuable().map(str::to_owned));
        if let Some(reason) = why_not {
            let message = format!(
                "the answer from {address} broke off after {} tokens ({failure}); {reason}",
                sent.len()
            );
            return Some(migration::error_frames(
                &migration::interrupted(message).body(),
            ));
        }
        let remaining = migration::remaining(&request, sent.len() as u64);
        if remaining == Some(0) {
            let usage = request
                .get("stream_options")
                .is_some_and(|o| o["include_usage"] == true);
            return Some(self.progress.finish_frames(usage, sent.len() as u64));
        }
        let next = migration::continuation(self.call.api, &request, self.progress.text(), &sent);
        self.call.body = Bytes::from(serde_json::to_vec(&next).expect("JSON serializes"));
        let route = &mut self.call.route;
        route.tokens.truncate(self.call.prompt_tokens);
        route.tokens.extend_from_slice(&sent);
        route.max_tokens = remaining.unwrap_or(route.max_tokens);
        self.call.migrate(address);
        let model = self.frontend.model.name();
        self.frontend.metrics.migration(model, ONGOING_REQUEST);
        tracing::info!(%address, sent = sent.len(), "migrating an answer to another endpoint");
        let error = match self.frontend.open(&mut self.call).await {
            Ok((Answer::Stream(reply), assignment, _))
                if reply.status() == StatusCode::OK
                    && is_event_stream(reply.headers().get(header::CONTENT_TYPE)) =>
            {
                self.upstream = upstream(reply);
                self.assignment = Some(assignment);
                self.progress.migrated(sent.len() as u64);
                // A continuation that breaks before its first chunk keeps the first time.
                self.broke_at.get_or_insert(broke_at);
                return None;
            }
            Ok((answer, _, _)) => refusal(answer).await,
            Err(e) => e.body(),
        };
        Some(migration::error_frames(&error))
    }
}

/// `frame` as the client gets it once parsed (nothing while its text is held back).
fn parsed_frame(parsing: &mut StreamParsing, frame: &[u8], out: &mut BytesMut) {
    let event = migration::frame_data(frame)
        .filter(|data| *data != b"[DONE]")
        .and_then(|data| serde_json::from_slice::<Value>(data).ok());
    match event {
        Some(event) => {
            if let Some(parsed) = parsing.on_event(event) {
                out.extend_from_slice(format!("data: {parsed}\n\n").as_bytes());
            }
        }
        None => out.extend_from_slice(frame),
    }
}

/// The OpenAI error body of a pod's refusal of a continuation (its own when it sent one).
async fn refusal(answer: Answer) -> Value {
    let (status, body) = match answer {
        Answer::Whole { status, body, .. } => (status, body),
        Answer::Stream(reply) => {
            let status = reply.status();
            (status, body_bytes(reply).await.unwrap_or_default())
        }
    };
    match serde_json::from_slice::<Value>(&body) {
        Ok(error) if error.get("error").is_some() => error,
        _ => migration::interrupted(format!(
            "the endpoint that was to continue the answer answered {status}"
        ))
        .body(),
    }
}

/// The client's body, measuring it as it passes.
struct MeteredBody {
    upstream: ByteStream,
    meter: Option<ResponseMeter>,
}

impl Stream for MeteredBody {
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let item = futures::ready!(this.upstream.as_mut().poll_next(cx));
        match &item {
            Some(Ok(chunk)) => {
                if let Some(m) = this.meter.as_mut() {
                    m.on_data(chunk);
                }
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "upstream stream failed");
                this.meter = None;
            }
            None => {
                if let Some(m) = this.meter.take() {
                    m.finish();
                }
            }
        }
        Poll::Ready(item)
    }
}
