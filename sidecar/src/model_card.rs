//! The engine's model card on the metrics port ([`dynamo_llm::model_card`]): the endpoint
//! picker loads its tokenizer and chat template from here and checks that every pod of
//! its pool serves the same model with the same KV block size.
//!
//! The files come from the engine's model directory, which the sidecar sees on a volume
//! shared with the engine: a directory the engine was given, or the engine's download of
//! a Hugging Face id in its hub cache (`--hf-home`). Until the engine has it, the card is
//! 503 and the picker waits.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use dynamo_llm::ApiError;
use dynamo_llm::model_card::{CARD_PATH, ModelCard, resolve_dir};
use tokio::sync::OnceCell;

use crate::engine;

#[derive(Clone)]
pub struct CardSource {
    /// What the engine loads: a model directory or a Hugging Face id.
    pub model_source: String,
    pub hf_home: Option<PathBuf>,
    /// The served name, if the flags say; else the engine's `/v1/models`.
    pub name: Option<String>,
    /// Tokens per KV block, if the flags say; the engine's metrics win when they say.
    pub block_size: Option<u32>,
    pub client: reqwest::Client,
    pub engine: reqwest::Url,
    /// The card once made: the model's files do not change under a running engine.
    card: Arc<OnceCell<ModelCard>>,
}

impl CardSource {
    pub fn new(
        model_source: String,
        hf_home: Option<PathBuf>,
        name: Option<String>,
        block_size: Option<u32>,
        client: reqwest::Client,
        engine: reqwest::Url,
    ) -> Self {
        Self {
            model_source,
            hf_home,
            name,
            block_size,
            client,
            engine,
            card: Arc::default(),
        }
    }

    /// `/model_card` and `/model_card/files/{name}`.
    pub fn routes<S>(self) -> Router<S> {
        Router::new()
            .route(CARD_PATH, get(card))
            .route(&format!("{CARD_PATH}/files/{{name}}"), get(file))
            .with_state(self)
    }

    fn dir(&self) -> Result<PathBuf, ApiError> {
        resolve_dir(&self.model_source, self.hf_home.as_deref()).ok_or_else(|| {
            ApiError::unavailable(format!(
                "the model files of {:?} are not here (yet): the engine may still be \
                 downloading them, or its model directory is not shared with the sidecar",
                self.model_source
            ))
        })
    }

    async fn make(&self) -> Result<ModelCard, ApiError> {
        let dir = self.dir()?;
        let name = match &self.name {
            Some(name) => name.clone(),
            None => engine::first_model(&self.client, &self.engine)
                .await
                .map_err(|e| ApiError::unavailable(format!("the engine's model name: {e}")))?,
        };
        let block_size = engine::block_size(&self.client, &self.engine)
            .await
            .or(self.block_size);
        tokio::task::spawn_blocking(move || ModelCard::read(&dir, &name, block_size))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| ApiError::unavailable(format!("reading the model files: {e}")))
    }
}

async fn card(State(source): State<CardSource>) -> Response {
    match source.card.get_or_try_init(|| source.make()).await {
        Ok(card) => axum::Json(card).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn file(State(source): State<CardSource>, Path(name): Path<String>) -> Response {
    if !ModelCard::is_card_file(&name) {
        let message = format!("{name:?} is not a model card file");
        return ApiError {
            status: StatusCode::NOT_FOUND,
            ..ApiError::bad_request(message, None)
        }
        .into_response();
    }
    let path = match source.dir() {
        Ok(dir) => dir.join(&name),
        Err(e) => return e.into_response(),
    };
    match tokio::fs::read(&path).await {
        Ok(bytes) => bytes.into_response(),
        Err(e) => ApiError {
            status: StatusCode::NOT_FOUND,
            ..ApiError::bad_request(format!("{name}: {e}"), None)
        }
        .into_response(),
    }
}
