//! `dynamo_sidecar_requests_total{status}`: every request the proxy served, counted once
//! its answer's head is decided, by the class of that answer (`1xx`..`5xx`). A client
//! that went away mid-upload is its own class, `client_aborted`, whatever the engine made
//! of the cut body.

use std::task::{Context, Poll};

use axum::http::StatusCode;
use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tower::{Layer, Service};

use super::error::ProxyError;
use crate::metrics::Label;

#[derive(Clone)]
pub struct StatusMetricsLayer {
    requests: Family<Label, Counter>,
}

impl StatusMetricsLayer {
    pub fn new(requests: Family<Label, Counter>) -> Self {
        Self { requests }
    }
}

impl<S> Layer<S> for StatusMetricsLayer {
    type Service = StatusMetrics<S>;

    fn layer(&self, inner: S) -> StatusMetrics<S> {
        StatusMetrics {
            inner,
            requests: self.requests.clone(),
        }
    }
}

#[derive(Clone)]
pub struct StatusMetrics<S> {
    inner: S,
    requests: Family<Label, Counter>,
}

impl<S, R, B> Service<R> for StatusMetrics<S>
where
    S: Service<R, Response = http::Response<B>, Error = ProxyError>,
    S::Future: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = ProxyError;
    type Future = BoxFuture<'static, Result<http::Response<B>, ProxyError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let requests = self.requests.clone();
        let answered = self.inner.call(request);
        Box::pin(async move {
            let answered = answered.await;
            let class = match &answered {
                Ok(response) => status_class(response.status()),
                Err(ProxyError::ClientAborted) => "client_aborted",
                // The status the error map answers it with.
                Err(e) => status_class(e.api_error().status),
            };
            requests.get_or_create(&[("status", class)]).inc();
            answered
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    /// `requests` after one request answered `answered`.
    async fn count(answered: Result<StatusCode, ProxyError>) -> Family<Label, Counter> {
        let requests = Family::<Label, Counter>::default();
        let mut answered = Some(answered);
        let inner = tower::service_fn(move |_: ()| {
            let answered = answered.take().expect("called once");
            async move {
                answered.map(|status| {
                    let mut response = http::Response::new(());
                    *response.status_mut() = status;
                    response
                })
            }
        });
        let service = StatusMetricsLayer::new(requests.clone()).layer(inner);
        let _ = service.oneshot(()).await;
        requests
    }

    fn counted(requests: &Family<Label, Counter>, class: &'static str) -> u64 {
        requests.get_or_create(&[("status", class)]).get()
    }

    #[tokio::test]
    async fn an_answer_counts_under_its_status_class() {
        let requests = count(Ok(StatusCode::OK)).await;
        assert_eq!(counted(&requests, "2xx"), 1);
        let requests = count(Ok(StatusCode::BAD_REQUEST)).await;
        assert_eq!(counted(&requests, "4xx"), 1);
        assert_eq!(counted(&requests, "2xx"), 0);
    }

    #[tokio::test]
    async fn an_error_counts_under_the_class_of_its_answer() {
        let requests = count(Err(ProxyError::PathNotProxied("/sleep".into()))).await;
        assert_eq!(counted(&requests, "4xx"), 1);
        let page = ProxyError::EngineErrorPage {
            status: StatusCode::BAD_GATEWAY,
            quoted: String::new(),
        };
        let requests = count(Err(page)).await;
        assert_eq!(counted(&requests, "5xx"), 1);
    }

    #[tokio::test]
    async fn a_cut_upload_counts_as_the_clients() {
        let requests = count(Err(ProxyError::ClientAborted)).await;
        assert_eq!(counted(&requests, "client_aborted"), 1);
        assert_eq!(counted(&requests, "4xx"), 0);
    }

    #[test]
    fn statuses_fall_in_their_class() {
        assert_eq!(status_class(StatusCode::OK), "2xx");
        assert_eq!(status_class(StatusCode::NOT_FOUND), "4xx");
        assert_eq!(status_class(StatusCode::BAD_GATEWAY), "5xx");
    }
}
