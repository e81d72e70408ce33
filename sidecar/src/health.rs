//! Health, readiness and metrics on the metrics port: `/health` says the process is up;
//! `/ready` that the pod can take traffic (the engine answers, the KV event
//! subscription is live or disabled, and the sidecar is not shutting down); `/metrics`
//! is the sidecar's own Prometheus text; `/model_card` is the engine's model card
//! ([`crate::model_card`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;

use crate::engine;
use crate::metrics::Metrics;
use crate::model_card::CardSource;

#[derive(Clone)]
pub struct Health {
    pub client: reqwest::Client,
    pub engine: reqwest::Url,
    pub metrics: Arc<Metrics>,
    /// `None` when the relay is disabled; otherwise whether its subscription is live.
    pub relay_connected: Option<Arc<AtomicBool>>,
    pub draining: Arc<AtomicBool>,
}

impl Health {
    /// `/health`, `/ready`, `/metrics`, and the model card when there is one.
    pub fn router(self, card: Option<CardSource>) -> Router {
        let router = Router::new()
            .route("/health", get(|| async { "ok" }))
            .route("/ready", get(ready))
            .route("/metrics", get(metrics))
            .with_state(self);
        match card {
            Some(card) => router.merge(card.routes()),
            None => router,
        }
    }
}

async fn ready(State(health): State<Health>) -> impl IntoResponse {
    let engine = engine::check_health(&health.client, &health.engine).await;
    let kv_events = match &health.relay_connected {
        None => "disabled",
        Some(up) if up.load(Ordering::Relaxed) => "connected",
        Some(_) => "not connected",
    };
    let draining = health.draining.load(Ordering::Relaxed);
    let ready = engine.is_ok() && kv_events != "not connected" && !draining;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "ready": ready,
        "engine": engine.err().unwrap_or_else(|| "ok".to_owned()),
        "kv_events": kv_events,
        "draining": draining,
    });
    (status, axum::Json(body))
}

async fn metrics(State(health): State<Health>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        health.metrics.encode(),
    )
}
