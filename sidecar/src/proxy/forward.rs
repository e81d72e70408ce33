//! The innermost service of the proxy: the request on to the engine, its headers (less
//! hop-by-hop ones) and body streamed as they arrive, and the engine's answer back with
//! its body as it comes ([`UpstreamBody`]). Every way this fails is a [`ProxyError`].

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Version, header};
use futures::future::BoxFuture;
use http_body::{Frame, SizeHint};
use tower::Service;

use super::error::ProxyError;
use dynamo_server::upstream::{Upstream, UpstreamBody};

use crate::engine;

/// The most of a non-JSON engine error body quoted back to the client.
const QUOTED_ERROR_BYTES: usize = 1024;

#[derive(Clone)]
pub struct Forward {
    engine: Arc<Upstream>,
    /// The engine's base URL, as errors name it.
    engine_url: Arc<reqwest::Url>,
}

impl Forward {
    /// Requests on to the engine at `engine`, an `http://` URL.
    pub fn new(engine: &reqwest::Url) -> Result<Self, String> {
        let upstream = Upstream::new(engine.as_str(), super::ENGINE_TIMEOUTS).map_err(|e| {
            format!("the engine is reached over plain HTTP (in the pod or on loopback): {e}")
        })?;
        Ok(Self {
            engine: Arc::new(upstream),
            engine_url: Arc::new(engine.clone()),
        })
    }

    async fn forward(self, request: Request) -> Result<http::Response<UpstreamBody>, ProxyError> {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let mut headers = end_to_end(parts.headers, true);
        let authority = HeaderValue::from_str(self.engine.authority());
        headers.insert(
            header::HOST,
            authority.expect("a URL's authority is a header value"),
        );
        let client_body_failed = Arc::new(AtomicBool::new(false));
        let body = Body::new(Watched {
            body,
            failed: client_body_failed.clone(),
        });
        let mut request = http::Request::new(body);
        *request.method_mut() = parts.method;
        *request.version_mut() = Version::HTTP_11;
        *request.headers_mut() = headers;
        *request.uri_mut() =
            self.engine
                .target(path)
                .parse()
                .map_err(|reason| ProxyError::BadTarget {
                    path: path.to_owned(),
                    reason,
                })?;
        let sent = self.engine.send(request).await;
        if client_body_failed.load(Ordering::Relaxed) {
            return Err(ProxyError::ClientAborted);
        }
        let answer = sent.map_err(|source| ProxyError::Engine {
            url: engine::url(&self.engine_url, path),
            source,
        })?;
        let (parts, body) = answer.into_parts();
        let status = parts.status;
        if (status.is_client_error() || status.is_server_error()) && !is_json(&parts.headers) {
            let quoted = quote(body).await;
            return Err(ProxyError::EngineErrorPage { status, quoted });
        }
        let mut response = http::Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = end_to_end(parts.headers, false);
        Ok(response)
    }
}

impl Service<Request> for Forward {
    type Response = http::Response<UpstreamBody>;
    type Error = ProxyError;
    type Future = BoxFuture<'static, Result<http::Response<UpstreamBody>, ProxyError>>;

    /// Always ready: each request takes an idle connection or makes one.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        Box::pin(self.clone().forward(request))
    }
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

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// The start of an engine's error body, as text.
async fn quote(mut answer: UpstreamBody) -> String {
    let mut quoted = Vec::new();
    while quoted.len() < QUOTED_ERROR_BYTES {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut answer).poll_frame(cx)).await;
        match frame.map(|f| f.map(Frame::into_data)) {
            Some(Ok(Ok(data))) => quoted.extend_from_slice(&data),
            _ => break,
        }
    }
    quoted.truncate(QUOTED_ERROR_BYTES);
    String::from_utf8_lossy(&quoted).trim().to_owned()
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

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

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

    #[tokio::test]
    async fn an_engine_that_refuses_the_connection_is_an_engine_error_naming_its_url() {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let engine: reqwest::Url = format!("http://{addr}/base/").parse().unwrap();
        let request = http::Request::post("/v1/completions?x=1")
            .body(Body::from("{}"))
            .unwrap();
        match Forward::new(&engine).unwrap().oneshot(request).await {
            Err(ProxyError::Engine { url, .. }) => {
                assert_eq!(url, format!("http://{addr}/base/v1/completions?x=1"));
            }
            other => panic!("not an engine error: {:?}", other.map(|r| r.status())),
        }
    }
}
