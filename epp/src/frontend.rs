//! The OpenAI HTTP frontend: checks and tokenizes each request as the engine would, asks
//! the router for a pod, and proxies the request body to `http://{pod}{path}`, streaming
//! the answer back unchanged. A client that leaves drops the proxied stream, which closes
//! the upstream connection (the engine aborts the request) and ends its load.
//!
//! A pod that refuses the connection (nothing was sent, nothing returned) is marked
//! unhealthy for a while and the request is retried once on another pod.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router as HttpRouter;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use dynamo_llm::openai::ModelList;
use dynamo_llm::{ApiError, ModelDir};
use futures::Stream;
use serde_json::json;

use crate::meter::ResponseMeter;
use crate::metrics::Metrics;
use crate::request::{self, Api};
use crate::router::{Assignment, RouteError, Router};

/// Header naming the prefill pod of a disaggregated request (`DESIGN.md`, "The request
/// path"), the name llm-d's routing sidecar reads.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";

/// Client headers passed on to the pod: credentials for an engine started with an API
/// key, and request ids and trace context for its logs. Everything else is the
/// picker's own connection's business.
const FORWARDED_HEADERS: [&str; 4] = ["authorization", "x-request-id", "traceparent", "tracestate"];

/// Largest request body accepted (long prompts are a few MB of JSON at most).
const MAX_BODY: usize = 64 << 20;

pub struct Frontend {
    pub model: Arc<ModelDir>,
    pub router: Arc<Router>,
    pub metrics: Arc<Metrics>,
    pub client: reqwest::Client,
    /// Unix seconds of start, for `/v1/models`.
    pub created: u64,
}

impl Frontend {
    pub fn new(
        model: Arc<ModelDir>,
        router: Arc<Router>,
        metrics: Arc<Metrics>,
        client: reqwest::Client,
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
        }
    }
}

/// Every route of the HTTP frontend.
pub fn routes(frontend: Arc<Frontend>) -> HttpRouter {
    HttpRouter::new()
        .route(
            Api::Chat.path(),
            post(
                |State(f): State<Arc<Frontend>>, headers: HeaderMap, body: Bytes| async move {
                    f.serve(Api::Chat, headers, body).await
                },
            ),
        )
        .route(
            Api::Completions.path(),
            post(
                |State(f): State<Arc<Frontend>>, headers: HeaderMap, body: Bytes| async move {
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
        .layer(DefaultBodyLimit::max(MAX_BODY))
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
    match f.router.readiness() {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not_ready", "reason": reason})),
        )
            .into_response(),
    }
}

async fn metrics(State(f): State<Arc<Frontend>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        f.metrics.encode(),
    )
        .into_response()
}

async fn models(State(f): State<Arc<Frontend>>) -> Json<ModelList> {
    Json(ModelList::single(
        &f.model.name,
        f.created,
        f.model.max_context,
    ))
}

/// The OpenAI error for a request the router could not place.
pub fn route_error(e: RouteError) -> ApiError {
    match e {
        RouteError::NoEndpoint(_) => ApiError::unavailable(e.to_string()),
        RouteError::Overloaded { .. } => ApiError::overloaded(e.to_string()),
    }
}

impl Frontend {
    async fn serve(self: Arc<Self>, api: Api, headers: HeaderMap, body: Bytes) -> Response {
        let started = Instant::now();
        let response = match self.proxy(api, &headers, body, started).await {
            Ok(response) => response,
            Err(e) => e.into_response(),
        };
        self.metrics
            .requests
            .get_or_create(&vec![
                ("model", self.model.name.clone()),
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
        let prepared = request::prepare_async(self.model.clone(), api, body.clone()).await?;
        let mut route = request::route_request(&prepared);
        let mut attempts_left = 2;
        loop {
            attempts_left -= 1;
            let assignment = self
                .router
                .route(route.clone())
                .await
                .map_err(route_error)?;
            let address = assignment.address;
            let mut upstream = self
                .client
                .post(format!("http://{address}{}", api.path()))
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
            match upstream.send().await {
                Ok(answer) => {
                    let meter = ResponseMeter::start(
                        self.metrics.clone(),
                        &self.model.name,
                        prepared.token_ids.len(),
                        started,
                    );
                    return Ok(relay(answer, assignment, meter));
                }
                Err(e) if e.is_connect() => {
                    tracing::warn!(%address, error = %e, "endpoint refused the request");
                    self.router.mark_unhealthy(address);
                    drop(assignment);
                    if attempts_left == 0 {
                        return Err(ApiError::unavailable(format!(
                            "endpoint {address} refused the connection"
                        )));
                    }
                    route.exclude.push(address);
                }
                Err(e) => {
                    return Err(ApiError {
                        status: StatusCode::BAD_GATEWAY,
                        message: format!("endpoint {address} failed: {e}"),
                        kind: "server_error",
                        param: None,
                        code: None,
                    });
                }
            }
        }
    }
}

/// The upstream answer as the client's response: same status, content type and bytes.
fn relay(answer: reqwest::Response, assignment: Assignment, mut meter: ResponseMeter) -> Response {
    let status = answer.status();
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    meter.set_content_type(content_type.as_ref().and_then(|v| v.to_str().ok()));
    let body = MeteredBody {
        upstream: Box::pin(answer.bytes_stream()),
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
