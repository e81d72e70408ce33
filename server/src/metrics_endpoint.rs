//! `/metrics` and `/healthz` on one HTTP port: the operator's and the planner's.

use axum::Router;
use axum::http::header;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::{Server, ServerLimits};

/// Where [`serve`] answers health checks (the operator's planner pods' probes use it).
pub const HEALTH_PATH: &str = "/healthz";

/// Serves `/metrics` (what `text` encodes at each scrape) and `/healthz` until the task
/// is dropped: the controller's and the planner's.
pub async fn serve<F>(listener: TcpListener, text: F) -> std::io::Result<()>
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    let metrics = move || {
        let body = text();
        async move {
            (
                [(
                    header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                body,
            )
        }
    };
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route(HEALTH_PATH, get(|| async { "ok\n" }));
    // The same limits as every other listener of ours (the defaults of `ServerLimits`),
    // as the processes serving only this (operator, planner) take no limit flags.
    Server::new(&ServerLimits::default())
        .serve_http(listener, app, std::future::pending())
        .await
}
