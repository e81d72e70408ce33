//! `POST /v1/embeddings`: the request and answer types (OpenAI's, as vLLM serves them for
//! pooling models) and the checks an engine makes before embedding.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::model_dir::ModelDir;

/// The path both the frontend and the engines serve.
pub const PATH: &str = "/v1/embeddings";

/// Inputs at most in one request (OpenAI's limit for an array input).
pub const MAX_INPUTS: usize = 2048;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingRequest {
    pub model: String,
    pub input: EmbeddingInput,
    /// `float` (the default) or `base64` ([`Vector`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding_format: Option<String>,
    /// Fewer dimensions than the model's (Matryoshka truncation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<i64>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// What to embed: one text, several, token ids, or several lists of token ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingList {
    pub object: String,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Embedding {
    pub object: String,
    pub index: usize,
    pub embedding: Vector,
}

/// An embedding as `encoding_format` asks: numbers (`float`), or the little-endian
/// float32 bytes in base64 (`base64`; OpenAI's Python client asks for it by default and
/// decodes it, as vLLM serves it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

impl Vector {
    /// `values` in the encoding `req` asked for (checked by `prepare_embeddings`).
    pub fn encode(req: &EmbeddingRequest, values: Vec<f32>) -> Self {
        use base64::Engine;
        match req.encoding_format.as_deref() {
            Some(BASE64) => {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                Self::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
            _ => Self::Float(values),
        }
    }
}

const FLOAT: &str = "float";
const BASE64: &str = "base64";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: u64,
    pub total_tokens: u64,
}

impl ModelDir {
    /// The token ids of each input of `req`, checked as an engine checks them: the model
    /// served, at least one non-empty input and at most [`MAX_INPUTS`], each within the
    /// context and the vocabulary, float encoding, and `dimensions` within `max_dims`.
    pub fn prepare_embeddings(
        &self,
        req: &EmbeddingRequest,
        max_dims: usize,
    ) -> Result<Vec<Vec<u32>>, ApiError> {
        if req.model != self.name {
            return Err(ApiError::model_not_found(&req.model));
        }
        if req
            .encoding_format
            .as_deref()
            .is_some_and(|f| f != FLOAT && f != BASE64)
        {
            return Err(ApiError::bad_request(
                "encoding_format must be float or base64",
                Some("encoding_format"),
            ));
        }
        if let Some(d) = req.dimensions.filter(|&d| d < 1 || d as usize > max_dims) {
            return Err(ApiError::bad_request(
                format!("dimensions must be between 1 and {max_dims}, got {d}"),
                Some("dimensions"),
            ));
        }
        let inputs: Vec<Vec<u32>> = match &req.input {
            EmbeddingInput::Text(t) => vec![self.encode(t)],
            EmbeddingInput::Texts(ts) => ts.iter().map(|t| self.encode(t)).collect(),
            EmbeddingInput::Tokens(ids) => vec![ids.clone()],
            EmbeddingInput::TokenLists(lists) => lists.clone(),
        };
        if inputs.is_empty() || inputs.len() > MAX_INPUTS {
            return Err(ApiError::bad_request(
                format!(
                    "input must hold 1 to {MAX_INPUTS} items, got {}",
                    inputs.len()
                ),
                Some("input"),
            ));
        }
        let vocab = self.vocab_size();
        for (i, ids) in inputs.iter().enumerate() {
            if ids.is_empty() {
                return Err(ApiError::bad_request(
                    format!("input {i} is empty"),
                    Some("input"),
                ));
            }
            if ids.len() > self.max_context {
                return Err(ApiError::bad_request(
                    format!(
                        "input {i} has {} tokens, more than the model's context of {}",
                        ids.len(),
                        self.max_context
                    ),
                    Some("input"),
                ));
            }
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::bad_request(
                    format!("input {i}: token id {bad} is outside the vocabulary of {vocab}"),
                    Some("input"),
                ));
            }
        }
        Ok(inputs)
    }
}
