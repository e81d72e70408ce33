//! Every way the proxy fails a request ([`ProxyError`]), and the one place each becomes
//! the client's answer: [`ProxyError::api_error`], an OpenAI-style error, which the
//! outermost layer of the stack ([`ErrorMapLayer`]) answers with.

use std::convert::Infallible;
use std::error::Error;
use std::task::{Context, Poll, ready};

use axum::BoxError;
use axum::body::{Body, Bytes, HttpBody};
use axum::http::StatusCode;
use axum::http::uri::InvalidUri;
use axum::response::{IntoResponse, Response};
use dynamo_llm::ApiError;
use futures::FutureExt;
use futures::future::{self, Either, Map, Ready};
use tower::{Layer, Service};

use dynamo_server::upstream::UpstreamError;

#[derive(Debug)]
pub enum ProxyError {
    /// The path is not one `--proxy-paths` passes on; it never reaches the engine.
    PathNotProxied(String),
    /// The request's path and query make no request target for the engine.
    BadTarget { path: String, reason: InvalidUri },
    /// The client went away mid-upload (or stalled past the body timeout): whatever the
    /// engine made of the cut body, the failure is the client's, not the engine's.
    ClientAborted,
    /// The request's body, refused before the engine saw it (too large to check for
    /// transfer parameters, or unreadable where it may carry them).
    BodyRefused(ApiError),
    /// No answer came from the engine at `url`.
    Engine { url: String, source: UpstreamError },
    /// The engine answered an error whose body is not JSON (its HTTP server's own 413 or
    /// 502 page, say); `quoted` is the start of that body.
    EngineErrorPage { status: StatusCode, quoted: String },
}

impl ProxyError {
    /// The client's answer to the failed request.
    pub fn api_error(&self) -> ApiError {
        match self {
            Self::PathNotProxied(path) => ApiError {
                status: StatusCode::NOT_FOUND,
                code: Some("path_not_proxied"),
                ..ApiError::bad_request(
                    format!(
                        "the sidecar does not pass {path} to the engine (see its --proxy-paths)"
                    ),
                    None,
                )
            },
            Self::BadTarget { path, reason } => {
                ApiError::bad_request(format!("{path:?} is not a request path: {reason}"), None)
            }
            Self::ClientAborted => {
                ApiError::bad_request("the request body was not received whole", None)
            }
            Self::BodyRefused(error) => error.clone(),
            Self::Engine { url, source } => engine_error(url, source),
            Self::EngineErrorPage { status, quoted } => ApiError {
                status: *status,
                message: format!("the engine answered {status}: {quoted}"),
                kind: if status.is_client_error() {
                    "invalid_request_error"
                } else {
                    "server_error"
                },
                param: None,
                code: Some("engine_error"),
            },
        }
    }
}

/// 503 `engine_unreachable` when the engine gave no answer at all: it could not be
/// reached (not started, restarting), or it closed or reset the connection before a
/// status line (it died with the request). Nothing reached the client, so the picker
/// may send the request to another pod. 502 for the rest (a timeout, a malformed answer):
/// the engine took the request and may still be working on it.
fn engine_error(url: &str, e: &UpstreamError) -> ApiError {
    let mut message = format!("engine request to {url} failed");
    // `Http` is transparent: its chain starts at hyper's error, which tells a closed
    // connection.
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

/// Answers every [`ProxyError`] of the stack below with its [`ProxyError::api_error`],
/// and boxes the answer's body (once, here) into the server's body type.
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrorMapLayer;

impl<S> Layer<S> for ErrorMapLayer {
    type Service = ErrorMap<S>;

    fn layer(&self, inner: S) -> ErrorMap<S> {
        ErrorMap {
            inner,
            unready: None,
        }
    }
}

pub struct ErrorMap<S> {
    inner: S,
    /// Why the service below could not take a request: the next call's answer.
    unready: Option<ProxyError>,
}

/// A clone is polled ready on its own.
impl<S: Clone> Clone for ErrorMap<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            unready: None,
        }
    }
}

type Answered<B> = Result<http::Response<B>, ProxyError>;

impl<S, R, B> Service<R> for ErrorMap<S>
where
    S: Service<R, Response = http::Response<B>, Error = ProxyError>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future =
        Map<Either<Ready<Answered<B>>, S::Future>, fn(Answered<B>) -> Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.unready.is_none()
            && let Err(e) = ready!(self.inner.poll_ready(cx))
        {
            self.unready = Some(e);
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        let answered = match self.unready.take() {
            Some(e) => Either::Left(future::ready(Err(e))),
            None => Either::Right(self.inner.call(request)),
        };
        answered.map(respond::<B>)
    }
}

fn respond<B>(answered: Answered<B>) -> Result<Response, Infallible>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    Ok(match answered {
        Ok(response) => response.map(Body::new),
        Err(e) => e.api_error().into_response(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use tower::ServiceExt;

    /// The answer the error map gives for `error`: status and OpenAI error object.
    async fn answer(error: ProxyError) -> (StatusCode, Value) {
        let mut error = Some(error);
        let failing = tower::service_fn(move |_: ()| {
            let error = error.take().expect("called once");
            async move { Err::<http::Response<Body>, _>(error) }
        });
        let response = ErrorMapLayer.layer(failing).oneshot(()).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let json: Value = serde_json::from_slice(&body).unwrap();
        (status, json["error"].clone())
    }

    #[tokio::test]
    async fn a_refused_path_is_a_404_path_not_proxied() {
        let (status, error) = answer(ProxyError::PathNotProxied("/sleep".into())).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(error["code"], "path_not_proxied");
        assert!(error["message"].as_str().unwrap().contains("/sleep"));
    }

    #[tokio::test]
    async fn a_cut_upload_is_a_400() {
        let (status, error) = answer(ProxyError::ClientAborted).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(error["type"], "invalid_request_error");
    }

    #[tokio::test]
    async fn an_unreachable_engine_is_a_503_and_a_slow_one_a_502() {
        let refused = UpstreamError::Connect {
            authority: "127.0.0.1:1".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        let url = "http://127.0.0.1:1/v1/completions".to_owned();
        let (status, error) = answer(ProxyError::Engine {
            url: url.clone(),
            source: refused,
        })
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(error["code"], dynamo_llm::error::ENGINE_UNREACHABLE);
        let message = error["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("engine request to {url} failed: ")));

        let slow = UpstreamError::ConnectTimeout("127.0.0.1:1".into());
        let (status, error) = answer(ProxyError::Engine { url, source: slow }).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert_eq!(error["code"], "engine_error");
    }

    #[tokio::test]
    async fn an_engine_error_page_keeps_its_status_and_is_quoted() {
        let (status, error) = answer(ProxyError::EngineErrorPage {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            quoted: "Request Entity Too Large".into(),
        })
        .await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(error["type"], "invalid_request_error");
        assert_eq!(error["code"], "engine_error");
        assert_eq!(
            error["message"],
            "the engine answered 413 Payload Too Large: Request Entity Too Large"
        );
        let (_, error) = answer(ProxyError::EngineErrorPage {
            status: StatusCode::BAD_GATEWAY,
            quoted: String::new(),
        })
        .await;
        assert_eq!(error["type"], "server_error");
    }

    /// A service that fails to become ready.
    struct Unready;

    impl Service<()> for Unready {
        type Response = http::Response<Body>;
        type Error = ProxyError;
        type Future = Ready<Answered<Body>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
            Poll::Ready(Err(ProxyError::PathNotProxied("/".into())))
        }

        fn call(&mut self, (): ()) -> Self::Future {
            unreachable!("called while not ready")
        }
    }

    #[tokio::test]
    async fn a_service_that_cannot_take_the_request_is_answered_with_why() {
        let response = ErrorMapLayer.layer(Unready).oneshot(()).await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn answers_pass_with_their_status_headers_and_body() {
        let engine = tower::service_fn(|_: ()| async {
            let mut response = http::Response::new(Body::from("data: 1\n\n"));
            *response.status_mut() = StatusCode::ACCEPTED;
            response
                .headers_mut()
                .insert("x-engine", http::HeaderValue::from_static("yes"));
            Ok::<_, ProxyError>(response)
        });
        let response = ErrorMapLayer.layer(engine).oneshot(()).await.unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        assert_eq!(response.headers()["x-engine"], "yes");
        let body = axum::body::to_bytes(response.into_body(), 64)
            .await
            .unwrap();
        assert_eq!(body, "data: 1\n\n");
    }
}
