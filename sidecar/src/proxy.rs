//! The inference proxy: every request, whatever its path and method, goes to the engine
//! with its headers and body streamed as they arrive, and the answer streams back the
//! same way, so SSE tokens pass one chunk at a time. A client that leaves drops the
//! response body, which drops the engine connection and so cancels the request there.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use dynamo_llm::ApiError;
use futures::StreamExt;

use crate::engine;
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct Proxy {
    client: reqwest::Client,
    engine: reqwest::Url,
    metrics: Arc<Metrics>,
}

impl Proxy {
    pub fn new(client: reqwest::Client, engine: &reqwest::Url, metrics: Arc<Metrics>) -> Self {
        Self {
            client,
            engine: engine.clone(),
            metrics,
        }
    }

    pub fn router(self) -> Router {
        Router::new().fallback(forward).with_state(self)
    }
}

/// The HTTP client the sidecar talks to its engine with.
pub fn engine_client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        // The engine is on loopback or in the pod: never through an HTTP proxy.
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .build()
}

async fn forward(State(proxy): State<Proxy>, request: Request) -> Response {
    let in_flight = InFlight::start(&proxy.metrics);
    let (parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let url = engine::url(&proxy.engine, path);
    let mut upstream = proxy
        .client
        .request(parts.method, &url)
        .headers(end_to_end(parts.headers, true));
    // A body-less request stays body-less (a stream would make it chunked).
    if body.size_hint().exact() != Some(0) {
        upstream = upstream.body(reqwest::Body::wrap_stream(body.into_data_stream()));
    }
    let response = match upstream.send().await {
        Ok(answer) => {
            let status = answer.status();
            let headers = end_to_end(answer.headers().clone(), false);
            // The guard rides with the body: the request is in flight until it is sent.
            let body = Body::from_stream(answer.bytes_stream().map(move |chunk| {
                let _ = &in_flight;
                chunk
            }));
            let mut response = Response::new(body);
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
        }
        Err(e) => engine_error(&url, &e).into_response(),
    };
    proxy
        .metrics
        .requests
        .get_or_create(&[("status", status_class(response.status()))])
        .inc();
    response
}

/// 503 when the engine cannot be reached (not started, restarting), 502 when it was
/// reached but did not answer properly.
fn engine_error(url: &str, e: &reqwest::Error) -> ApiError {
    let mut message = format!("engine request to {url} failed");
    let mut source: Option<&dyn Error> = e.source();
    while let Some(cause) = source {
        message = format!("{message}: {cause}");
        source = cause.source();
    }
    if e.is_connect() {
        ApiError {
            code: Some("engine_unreachable"),
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
    fn statuses_fall_in_their_class() {
        assert_eq!(status_class(StatusCode::OK), "2xx");
        assert_eq!(status_class(StatusCode::NOT_FOUND), "4xx");
        assert_eq!(status_class(StatusCode::BAD_GATEWAY), "5xx");
    }
}
