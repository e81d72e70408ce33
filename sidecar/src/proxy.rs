//! The inference proxy: every request to an allowed path ([`PathAllowlist`]) goes to the
//! engine with its headers and body streamed as they arrive, and the answer streams back
//! the same way: SSE tokens pass as they come, those that came together in one write
//! (`upstream`). A client that leaves drops the response body, which drops the engine
//! connection and so cancels the request there. An engine error that is not JSON (a 413
//! from its HTTP server, say) reaches the client as an OpenAI-style error with the same
//! status.

mod upstream;

use std::error::Error;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use dynamo_llm::ApiError;
use http_body::{Frame, SizeHint};

use crate::engine;
use crate::metrics::Metrics;
use upstream::{EngineBody, Upstream, UpstreamError};

#[derive(Clone)]
pub struct Proxy {
    engine: Arc<Upstream>,
    /// The engine's base URL, as errors name it.
    engine_url: reqwest::Url,
    paths: Arc<PathAllowlist>,
    metrics: Arc<Metrics>,
}

impl Proxy {
    /// The proxy to the engine at `engine`, an `http://` URL.
    pub fn new(
        engine: &reqwest::Url,
        paths: PathAllowlist,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        Ok(Self {
            engine: Arc::new(Upstream::new(engine)?),
            engine_url: engine.clone(),
            paths: Arc::new(paths),
            metrics,
        })
    }

    pub fn router(self) -> Router {
        Router::new().fallback(forward).with_state(self)
    }
}

/// The paths the proxy passes on: exact paths, or prefixes written with a trailing `*`.
#[derive(Clone, Debug, PartialEq)]
pub struct PathAllowlist {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl PathAllowlist {
    pub fn new<S: AsRef<str>>(entries: &[S]) -> Self {
        let (mut exact, mut prefixes) = (Vec::new(), Vec::new());
        for entry in entries.iter().map(|e| e.as_ref().trim()) {
            match entry.strip_suffix('*') {
                Some(prefix) => prefixes.push(prefix.to_owned()),
                None => exact.push(entry.to_owned()),
            }
        }
        Self { exact, prefixes }
    }

    pub fn allows(&self, path: &str) -> bool {
        self.exact.iter().any(|p| p == path) || self.prefixes.iter().any(|p| path.starts_with(p))
    }
}

/// The HTTP client the sidecar asks its engine with (health, model, the prefill hop); the
/// proxied requests go through `upstream`.
pub fn engine_client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        // The engine is on loopback or in the pod: never through an HTTP proxy.
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .tcp_nodelay(true)
        .connect_timeout(upstream::CONNECT_TIMEOUT)
        .pool_idle_timeout(upstream::IDLE_TIMEOUT)
        .build()
}

/// The most of a non-JSON engine error body quoted back to the client.
const QUOTED_ERROR_BYTES: usize = 1024;

async fn forward(State(proxy): State<Proxy>, request: Request) -> Response {
    let (class, response) = answer(&proxy, request).await;
    proxy
        .metrics
        .requests
        .get_or_create(&[("status", class)])
        .inc();
    response
}

/// The client's response and the class it is counted under.
async fn answer(proxy: &Proxy, request: Request) -> (&'static str, Response) {
    let in_flight = InFlight::start(&proxy.metrics);
    let (parts, body) = request.into_parts();
    if !proxy.paths.allows(parts.uri.path()) {
        let refused = ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some("path_not_proxied"),
            ..ApiError::bad_request(
                format!(
                    "the sidecar does not pass {} to the engine (see its --proxy-paths)",
                    parts.uri.path()
                ),
                None,
            )
        };
        return ("4xx", refused.into_response());
    }
    let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let url = engine::url(&proxy.engine_url, path);
    let mut headers = end_to_end(parts.headers, true);
    let authority = HeaderValue::from_str(proxy.engine.authority());
    headers.insert(
        header::HOST,
        authority.expect("a URL's authority is a header value"),
    );
    let client_body_failed = Arc::new(AtomicBool::new(false));
    let body = Body::new(Watched {
        body,
        failed: client_body_failed.clone(),
    });
    let mut request = axum::http::Request::new(body);
    *request.method_mut() = parts.method;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    match proxy.engine.target(path).parse() {
        Ok(target) => *request.uri_mut() = target,
        Err(e) => {
            let error = ApiError::bad_request(format!("{path:?} is not a request path: {e}"), None);
            return ("4xx", error.into_response());
        }
    }
    let sent = proxy.engine.send(request).await;
    // The client went away mid-upload (or stalled past the body timeout): whatever the
    // engine made of the cut body, the failure is the client's, not the engine's.
    if client_body_failed.load(Ordering::Relaxed) {
        let error = ApiError::bad_request("the request body was not received whole", None);
        return ("client_aborted", error.into_response());
    }
    let answer = match sent {
        Ok(answer) => answer,
        Err(e) => return ("5xx", engine_error(&url, &e).into_response()),
    };
    let (parts, body) = answer.into_parts();
    let status = parts.status;
    let class = status_class(status);
    if (status.is_client_error() || status.is_server_error()) && !is_json(&parts.headers) {
        return (class, plain_error(status, body).await.into_response());
    }
    // The guard rides with the body: the request is in flight until it is sent.
    let body = Body::new(Guarded {
        body,
        _in_flight: in_flight,
    });
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = end_to_end(parts.headers, false);
    (class, response)
}

/// The client's request body on its way to the engine, noting whether it failed.
struct Watched {
    body: Body,
    failed: Arc<AtomicBool>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Err(_))) = &frame {
            self.failed.store(true, Ordering::Relaxed);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The engine's answer on its way to the client, in flight until sent or dropped.
struct Guarded {
    body: EngineBody,
    _in_flight: InFlight,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// An engine error whose body is not JSON (its HTTP server's own 413 or 502 page, say)
/// as an OpenAI-style error with the same status, quoting the start of the body.
async fn plain_error(status: StatusCode, mut answer: EngineBody) -> ApiError {
    let mut quoted = Vec::new();
    while quoted.len() < QUOTED_ERROR_BYTES {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut answer).poll_frame(cx)).await;
        match frame.map(|f| f.map(Frame::into_data)) {
            Some(Ok(Ok(data))) => quoted.extend_from_slice(&data),
            _ => break,
        }
    }
    quoted.truncate(QUOTED_ERROR_BYTES);
    let text = String::from_utf8_lossy(&quoted);
    let message = format!("the engine answered {status}: {}", text.trim());
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    ApiError {
        status,
        message,
        kind,
        param: None,
        code: Some("engine_error"),
    }
}

/// 503 `engine_unreachable` when the engine gave no answer at all: it could not be
/// reached (not started, restarting), or it closed or reset the connection before a
/// status line (it died with the request). Nothing reached the client, so the picker
/// may send the request to another pod. 502 for the rest (a timeout, a malformed answer):
/// the engine took the request and may still be working on it.
fn engine_error(url: &str, e: &UpstreamError) -> ApiError {
    let mut message = format!("engine request to {url} failed");
    let mut source: Option<&dyn Error> = match e {
        UpstreamError::Http(e) => Some(e),
        other => Some(other),
    };
    let mut went_away = matches!(e, UpstreamError::Connect { .. });
    while let Some(cause) = source {
        message = format!("{message}: {cause}");
        went_away |= closed_before_answer(cause);
        source = cause.source();
    }
    if went_away {
        ApiError {
            code: Some(dynamo_llm::error::ENGINE_UNREACHABLE),
            ..ApiError::unavailable(message)
        }
    } else {
        ApiError {
            status: StatusCode::BAD_GATEWAY,
            code: Some("engine_error"),
            ..ApiError::internal(message)
        }
    }
}

/// Whether an error of the request's transport says the connection ended before the
/// answer began: hyper's "connection closed before message completed", or a reset.
fn closed_before_answer(cause: &(dyn Error + 'static)) -> bool {
    if let Some(e) = cause.downcast_ref::<hyper::Error>() {
        return e.is_incomplete_message();
    }
    cause.downcast_ref::<std::io::Error>().is_some_and(|e| {
        matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof
        )
    })
}

/// `headers` without the hop-by-hop ones, which belong to one connection only
/// (RFC 9110 section 7.6.1: `Connection` and the fields it names, `Proxy-Connection`,
/// `Keep-Alive`, `TE`, `Transfer-Encoding`, `Upgrade`), nor `Host` on a request (the
/// client sets the engine's).
fn end_to_end(mut headers: HeaderMap, request: bool) -> HeaderMap {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("proxy-connection"),
        HeaderName::from_static("keep-alive"),
        header::TE,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TRAILER,
    ] {
        headers.remove(name);
    }
    if request {
        headers.remove(header::HOST);
    }
    headers
}

fn status_class(status: StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Counts one request in flight until dropped.
struct InFlight(Arc<Metrics>);

impl InFlight {
    fn start(metrics: &Arc<Metrics>) -> Self {
        metrics.in_flight.inc();
        Self(metrics.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("close, x-hop"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::HOST, HeaderValue::from_static("sidecar:8000"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        h.insert(
            "x-gateway-destination-endpoint",
            HeaderValue::from_static("a"),
        );
        let request = end_to_end(h.clone(), true);
        let names: Vec<&str> = request.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["authorization", "x-gateway-destination-endpoint"]);
        assert!(end_to_end(h, false).contains_key(header::HOST));
    }

    #[test]
    fn the_allowlist_takes_exact_paths_and_prefixes() {
        let paths = PathAllowlist::new(&["/v1/completions", "/v1/models/*", " /metrics "]);
        assert!(paths.allows("/v1/completions"));
        assert!(!paths.allows("/v1/completions/x"));
        assert!(paths.allows("/v1/models/qwen"));
        assert!(!paths.allows("/v1/models"));
        assert!(paths.allows("/metrics"));
        assert!(!paths.allows("/reset_prefix_cache"));
        assert!(PathAllowlist::new(&["*"]).allows("/reset_prefix_cache"));
    }

    #[test]
    fn statuses_fall_in_their_class() {
        assert_eq!(status_class(StatusCode::OK), "2xx");
        assert_eq!(status_class(StatusCode::NOT_FOUND), "4xx");
        assert_eq!(status_class(StatusCode::BAD_GATEWAY), "5xx");
    }
}
