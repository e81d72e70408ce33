//! The runner's admin API: `GET /graph` lists what runs, `POST /scale` with
//! `{"service": NAME, "replicas": N}` changes a worker service's replica count (the local
//! stand-in for the DGDSA scale subresource the planner uses on a cluster).
//!
//! It can start and stop processes, so it listens on loopback unless told otherwise, and
//! anywhere else only with a bearer token, which every request must then carry. Without a
//! token it answers only requests addressed to a loopback name, so a web page whose own
//! name was rebound to 127.0.0.1 (DNS rebinding) cannot drive it from a browser.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::{Context, bail};
use axum::extract::{Request, State, rejection::JsonRejection};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use dynamo_server::{Server, ServerLimits};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::Mutex;

use super::{Runner, ScaleError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScaleRequest {
    service: String,
    replicas: u32,
}

/// The admin API's socket and the token its requests must carry, if any.
pub(crate) struct Admin {
    listener: TcpListener,
    token: Option<Arc<str>>,
}

impl Admin {
    /// Binds `host:port`, refusing an address beyond loopback without a token (checked on
    /// the bound address, so a host name that resolves elsewhere is caught too).
    pub(crate) async fn bind(host: &str, port: u16, token: Option<String>) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((host, port))
            .await
            .with_context(|| format!("cannot bind the admin API on {host}:{port}"))?;
        let address = listener.local_addr()?;
        if !address.ip().is_loopback() && token.is_none() {
            bail!(
                "the admin API would listen on {address}, beyond this machine, without a token: \
                 set DYNAMO_ADMIN_TOKEN or --admin-token-file, or keep --admin-host on loopback"
            );
        }
        Ok(Self {
            listener,
            token: token.map(Arc::from),
        })
    }

    pub(crate) fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    pub(crate) fn needs_token(&self) -> bool {
        self.token.is_some()
    }

    /// Serves until the task is aborted.
    pub(crate) async fn serve(self, runner: Arc<Mutex<Runner>>) {
        let app = Router::new()
            .route("/graph", get(graph))
            .route("/scale", post(scale))
            .with_state(runner);
        let app = match self.token {
            Some(token) => app.layer(middleware::from_fn_with_state(token, require_token)),
            None => app.layer(middleware::from_fn(require_loopback_host)),
        };
        let server = Server::new(&ServerLimits::default());
        if let Err(err) = server
            .serve_http(self.listener, app, std::future::pending())
            .await
        {
            eprintln!("admin API stopped: {err}");
        }
    }
}

/// Lets a request through only with `Authorization: Bearer <token>`.
async fn require_token(
    State(token): State<Arc<str>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110, section 11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, credentials)| credentials.trim());
    match presented {
        Some(presented) if same_token(token.as_bytes(), presented.as_bytes()) => {
            next.run(request).await
        }
        Some(_) => unauthorized("wrong bearer token"),
        None => unauthorized("this admin API needs `Authorization: Bearer <token>`"),
    }
}

/// Lets a request through only if it names this machine: `localhost` or a loopback
/// address, with any port. A browser sends the page's own name, so a page of another site
/// that reaches the port through a rebound name is refused.
async fn require_loopback_host(request: Request, next: Next) -> Response {
    // An HTTP/2 request names its target in the URI (`:authority`), as does an HTTP/1.1
    // one in absolute form, whose `Host` is then ignored (RFC 9112, section 3.2.2).
    let named = match request.uri().authority() {
        Some(authority) => Some(authority.as_str()),
        None => request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok()),
    };
    if named.is_some_and(is_loopback_host) {
        return next.run(request).await;
    }
    error(
        StatusCode::FORBIDDEN,
        format!(
            "this admin API answers only requests with `Host: localhost` or a loopback \
             address (any name with its bearer token), not {}",
            named.map_or("none".into(), |host| format!("{host:?}"))
        ),
    )
}

/// `localhost` or a loopback IP address (IPv6 in brackets), with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let Ok(authority) = host.parse::<Authority>() else {
        return false;
    };
    let host = authority.host();
    let ip = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.eq_ignore_ascii_case("localhost") || ip.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Compares in time that depends only on the expected token's length, so the answer's
/// timing does not tell how much of a guess was right.
fn same_token(expected: &[u8], presented: &[u8]) -> bool {
    let mut difference = u8::from(expected.len() != presented.len());
    for (i, byte) in expected.iter().enumerate() {
        difference |= byte ^ presented.get(i).copied().unwrap_or(0);
    }
    std::hint::black_box(difference) == 0
}

fn unauthorized(message: &str) -> Response {
    let mut response = error(StatusCode::UNAUTHORIZED, message.to_string());
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

async fn graph(State(runner): State<Arc<Mutex<Runner>>>) -> Response {
    Json(runner.lock().await.status()).into_response()
}

async fn scale(
    State(runner): State<Arc<Mutex<Runner>>>,
    body: Result<Json<ScaleRequest>, JsonRejection>,
) -> Response {
    let Json(request) = match body {
        Ok(body) => body,
        Err(rejection) => return error(StatusCode::BAD_REQUEST, rejection.body_text()),
    };
    let mut runner = runner.lock().await;
    match runner.scale(&request.service, request.replicas).await {
        Ok(()) => Json(runner.status()).into_response(),
        Err(err @ ScaleError::UnknownService(..)) => error(StatusCode::NOT_FOUND, err.to_string()),
        Err(err @ ScaleError::OverCap(_)) => error(StatusCode::BAD_REQUEST, err.to_string()),
        Err(err @ (ScaleError::Start(_) | ScaleError::Record(_))) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, err.to_string())
        }
    }
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::{is_loopback_host, same_token};

    #[test]
    fn only_loopback_names_are_loopback_hosts() {
        for host in [
            "localhost",
            "LocalHost:8080",
            "127.0.0.1",
            "127.0.0.1:9",
            "127.1.2.3:9",
            "[::1]",
            "[::1]:9",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "",
            "evil.example",
            "evil.example:9",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "localhost@evil.example",
            "0.0.0.0",
            "10.0.0.1:9",
            "[::]:9",
            "[::1",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn only_the_exact_token_matches() {
        assert!(same_token(b"s3cret", b"s3cret"));
        for other in [&b""[..], b"s3cre", b"s3cret!", b"S3cret", b"s3cres"] {
            assert!(!same_token(b"s3cret", other), "{other:?}");
        }
    }
}
