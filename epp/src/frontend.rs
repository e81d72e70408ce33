//! The OpenAI HTTP frontend: checks and tokenizes each request as the engine would, asks
//! the router for a pod, and proxies the request body to `http://{pod}{path}`, streaming
//! the answer back unchanged. A client that leaves drops the proxied stream, which closes
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

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router as HttpRouter;
use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use bytes::BytesMut;
use dynamo_llm::ApiError;
use dynamo_llm::disagg::PREFILLER_HEADER;
use dynamo_llm::error::ENGINE_UNREACHABLE;
use dynamo_llm::openai::ModelList;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use crate::meter::ResponseMeter;
use crate::metrics::Metrics;
use crate::model_source::ModelSource;
use crate::request::{self, Api};
use crate::router::{Assignment, RouteError, Router};

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
    pub client: reqwest::Client,
    /// Unix seconds of start, for `/v1/models`.
    pub created: u64,
    /// Pods one request is tried on at most.
    pub max_attempts: usize,
}

impl Frontend {
    pub fn new(
        model: ModelSource,
        router: Arc<Router>,
        metrics: Arc<Metrics>,
        client: reqwest::Client,
        max_attempts: usize,
    ) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            model,
            router,
            metrics,
            client,
            created,
            max_attempts,
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
    HttpRouter::new()
        .route(
            Api::Chat.path(),
            post(
                |State(f): State<Arc<Frontend>>, headers: HeaderMap, body: Body| async move {
                    f.serve(Api::Chat, headers, body).await
                },
            ),
        )
        .route(
            Api::Completions.path(),
            post(
                |State(f): State<Arc<Frontend>>, headers: HeaderMap, body: Body| async move {
                    f.serve(Api::Completions, headers, body).await
                },
            ),
        )
        .route("/v1/models", get(models))
        .merge(ops_routes())
        .fallback(|| async {
            ApiError {
                status: StatusCode::NOT_FOUND,
                message: "Not found: the frontend serves /v1/chat/completions, \
                          /v1/completions and /v1/models"
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
    Stream(reqwest::Response),
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
        let response = match self.model.get() {
            Ok(loaded) => match read_body(&headers, body, loaded.body_limit).await {
                Ok(body) => match self.proxy(api, &headers, body, started).await {
                    Ok(response) => response,
                    Err(e) => e.into_response(),
                },
                Err(e) => e.into_response(),
            },
            Err(e) => e.into_response(),
        };
        self.metrics
            .requests
            .get_or_create(&vec![
                ("model", self.model.name().to_owned()),
                ("route", api.path().to_owned()),
                ("status", response.status().as_u16().to_string()),
            ])
            .inc();
        response
    }

    async fn proxy(
        &self,
        api: Api,
        headers: &HeaderMap,
        body: Bytes,
        started: Instant,
    ) -> Result<Response, ApiError> {
        let model = self.model.get()?.model.clone();
        let prepared = request::prepare_async(model, api, body.clone()).await?;
        let body = request::without_transfer_params(body);
        let mut route = request::route_request(&prepared);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let queued = self.metrics.queued(self.model.name());
            let assignment = self
                .router
                .route(route.clone())
                .await
                .map_err(route_error)?;
            drop(queued);
            let address = assignment.address;
            let failure = match self.attempt(api, headers, &body, &assignment).await {
                Ok(answer) => {
                    let meter = ResponseMeter::start(
                        self.metrics.clone(),
                        self.model.name(),
                        prepared.token_ids.len(),
                        started,
                    );
                    return Ok(relay(answer, assignment, meter));
                }
                Err(failure) => failure,
            };
            tracing::warn!(%address, %failure, attempt, "endpoint failed before answering");
            self.router.mark_unhealthy(address);
            drop(assignment);
            if attempt >= self.max_attempts {
                return Err(ApiError::unavailable(format!(
                    "endpoint {address} failed before answering ({failure}); \
                     {attempt} endpoints tried"
                )));
            }
            route.exclude.push(address);
        }
    }

    /// Sends the request to the assigned pod; `Err` says why the pod failed before
    /// answering.
    async fn attempt(
        &self,
        api: Api,
        headers: &HeaderMap,
        body: &Bytes,
        assignment: &Assignment,
    ) -> Result<Answer, String> {
        let mut upstream = self
            .client
            .post(format!("http://{}{}", assignment.address, api.path()))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        for name in FORWARDED_HEADERS {
            for value in headers.get_all(name) {
                upstream = upstream.header(name, value);
            }
        }
        if let Some(prefill) = assignment.prefill {
            upstream = upstream.header(PREFILLER_HEADER, prefill.to_string());
        }
        // Refused, reset or closed before a status line: nothing came back.
        let answer = upstream.send().await.map_err(|e| e.to_string())?;
        self.metrics.prefill_hop(|name| {
            let value = answer.headers().get(name)?;
            value.to_str().ok().map(str::to_owned)
        });
        let small = answer
            .content_length()
            .is_some_and(|n| n <= ERROR_BODY_BYTES);
        if answer.status() != StatusCode::SERVICE_UNAVAILABLE || !small {
            return Ok(Answer::Stream(answer));
        }
        let status = answer.status();
        let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
        let body = answer.bytes().await.map_err(|e| e.to_string())?;
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

/// The upstream answer as the client's response: same status, content type and bytes.
fn relay(answer: Answer, assignment: Assignment, mut meter: ResponseMeter) -> Response {
    let (status, content_type, upstream): (_, _, ByteStream) = match answer {
        Answer::Stream(answer) => (
            answer.status(),
            answer.headers().get(header::CONTENT_TYPE).cloned(),
            Box::pin(answer.bytes_stream()),
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
    meter.set_content_type(content_type.as_ref().and_then(|v| v.to_str().ok()));
    let body = MeteredBody {
        upstream,
        assignment: Some(assignment),
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

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// The upstream body passed through, measuring it and holding the request's load until
/// it ends or the client goes away (which drops it).
struct MeteredBody {
    upstream: ByteStream,
    assignment: Option<Assignment>,
    meter: Option<ResponseMeter>,
}

impl Stream for MeteredBody {
    type Item = reqwest::Result<Bytes>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let item = futures::ready!(this.upstream.as_mut().poll_next(cx));
        match &item {
            Some(Ok(chunk)) => {
                if let Some(a) = this.assignment.as_mut() {
                    a.first_token();
                }
                if let Some(m) = this.meter.as_mut() {
                    m.on_data(chunk);
                }
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "upstream stream failed");
                this.meter = None;
                this.assignment = None;
            }
            None => {
                if let Some(m) = this.meter.take() {
                    m.finish();
                }
                this.assignment = None;
            }
        }
        Poll::Ready(item)
    }
}
