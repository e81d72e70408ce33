//! The runner's admin API: `GET /graph` lists what runs, `POST /scale` with
//! `{"service": NAME, "replicas": N}` changes a worker service's replica count (the local
//! stand-in for the DGDSA scale subresource the planner uses on a cluster).

use std::sync::Arc;

use axum::extract::{State, rejection::JsonRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use tokio::sync::Mutex;

use super::{Runner, ScaleError};

/// Replica counts above this are refused: a typo should not fork thousands of processes.
const MAX_LOCAL_REPLICAS: u32 = 64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScaleRequest {
    service: String,
    replicas: u32,
}

pub(crate) async fn serve(listener: tokio::net::TcpListener, runner: Arc<Mutex<Runner>>) {
    let app = Router::new()
        .route("/graph", get(graph))
        .route("/scale", post(scale))
        .with_state(runner);
    if let Err(err) = axum::serve(listener, app).await {
        eprintln!("admin API stopped: {err}");
    }
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
    if request.replicas > MAX_LOCAL_REPLICAS {
        return error(
            StatusCode::BAD_REQUEST,
            format!("at most {MAX_LOCAL_REPLICAS} replicas per service run locally"),
        );
    }
    let mut runner = runner.lock().await;
    match runner.scale(&request.service, request.replicas).await {
        Ok(()) => Json(runner.status()).into_response(),
        Err(err @ ScaleError::UnknownService(..)) => error(StatusCode::NOT_FOUND, err.to_string()),
        Err(ScaleError::Start(err)) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("{err:#}")),
    }
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}
