//! OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.
//!
//! The body shape is the one OpenAI's API returns and its official clients parse
//! (`openai-python`, `_exceptions.py`: the `error` object's `message`, `type`, `param`,
//! `code`), so a client sees a client mistake as a 4xx it can act on, never a 500.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// OpenAI's `code` for a request longer than the model's context.
pub const CONTEXT_LENGTH_EXCEEDED: &str = "context_length_exceeded";

/// The `code` of a sidecar's 503 when its engine does not accept connections: the pod,
/// not the request, failed, so a router may send the request to another pod.
pub const ENGINE_UNREACHABLE: &str = "engine_unreachable";

/// An error to send back to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`, e.g. `invalid_request_error`.
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is malformed or asks for something impossible.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// 404: the request names a model this server does not serve.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist."),
            kind: "invalid_request_error",
            param: Some("model".to_owned()),
            code: Some("model_not_found"),
        }
    }

    /// 400: prompt plus requested output exceed the model's context; `prompt` says how
    /// long the prompt is (e.g. "5000 prompt tokens"), `param` is its field
    /// (`messages` or `prompt`).
    pub fn context_length_exceeded(
        prompt: &str,
        max_tokens: u64,
        limit: usize,
        param: &str,
    ) -> Self {
        Self {
            code: Some(CONTEXT_LENGTH_EXCEEDED),
            ..Self::bad_request(
                format!(
                    "The model's context is {limit} tokens, but the request needs {prompt} \
                     plus {max_tokens} output tokens. Shorten the prompt or lower max_tokens."
                ),
                Some(param),
            )
        }
    }

    /// 413: the request body is larger than the server accepts.
    pub fn body_too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..Self::bad_request(
                format!(
                    "The request body is larger than {limit} bytes, the most this server \
                     accepts: a prompt that long cannot fit the model's context."
                ),
                None,
            )
        }
    }

    /// 429: the server sheds load; the client should retry later.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            kind: "rate_limit_error",
            param: None,
            code: None,
        }
    }

    /// 503: nothing can serve the request right now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "service_unavailable",
            param: None,
            code: None,
        }
    }

    /// 500: our fault, not the client's.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body OpenAI clients expect.
    pub fn body(&self) -> serde_json::Value {
        let body = ErrorBody {
            error: ErrorObject {
                message: self.message.clone(),
                kind: self.kind.to_owned(),
                param: self.param.clone(),
                code: self.code.map(str::to_owned),
            },
        };
        serde_json::to_value(body).expect("an error body serializes")
    }
}

/// An error answer's body (for the API description; [`ApiError::body`] writes it).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ErrorObject {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn body_has_the_openai_error_shape() {
        let err = ApiError::bad_request("max_tokens must be at least 1", Some("max_tokens"));
        assert_eq!(
            err.body(),
            json!({"error": {
                "message": "max_tokens must be at least 1",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": null,
            }})
        );
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn context_error_is_a_client_error_with_the_numbers() {
        let err = ApiError::context_length_exceeded("5000 prompt tokens", 100, 4096, "prompt");
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert_eq!(err.param.as_deref(), Some("prompt"));
        assert_eq!(err.code, Some("context_length_exceeded"));
        assert!(err.message.contains("4096") && err.message.contains("5000"));
    }
}
