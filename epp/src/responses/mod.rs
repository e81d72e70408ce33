//! `POST /v1/responses`: OpenAI's Responses API as a translation over the chat path. A
//! request becomes a chat completion request that is checked, routed, forwarded, parsed
//! (tool calls, reasoning) and migrated as one sent to `/v1/chat/completions`; the chat
//! answer, whole or streamed, becomes a `response` object or the Responses API's events.
//! The shapes are those of OpenAI's API reference ("Responses", "Streaming events") as the
//! official client's types spell them (`openai/types/responses/`, openai-python 2.x).
//!
//! The picker keeps no state and runs no tools, so a request that needs stored responses
//! or built-in tools is refused with a 400 naming the field (`request::REFUSED`,
//! `store: true`, `background: true`, non-`function` tools, `item_reference` inputs).
//! Fields the Responses API does not define go to the chat request as they are, so vLLM's
//! and Dynamo's extensions (`nvext`, `chat_template_kwargs`, `seed`) work here too.
//!
//! The reasoning the reasoning parser splits off is the model's own text, which the API
//! calls a reasoning item's `content` (`reasoning_text`, streamed as
//! `response.reasoning_text.delta`); its `summary`, a summary the model writes on request,
//! stays empty.
//!
//! - `request`: the request as a chat request, and the 400s;
//! - `object`: the response object and its items;
//! - `build`: the chat answer as items and events; `stream`: the streamed relay.

mod build;
mod object;
mod request;
mod stream;

#[cfg(test)]
mod fixtures;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use dynamo_llm::ApiError;
use serde_json::Value;

use build::Builder;
pub use build::TokenCounter;
pub use object::ResponseObject;
pub use request::{ResponsesRequest, Translation, translate};

pub const PATH: &str = "/v1/responses";

/// The chat path's answer (`chat`) to `translation` as the Responses API's: an error
/// unchanged, a whole answer as a response object, a stream as the Responses events.
pub async fn answer(
    translation: Translation,
    chat: Response,
    count_tokens: TokenCounter,
) -> Response {
    if chat.status() != StatusCode::OK {
        return chat;
    }
    let streamed = chat
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut builder = Builder::new(&translation, count_tokens);
    if !streamed {
        let body = match axum::body::to_bytes(chat.into_body(), usize::MAX).await {
            Ok(body) => body,
            Err(e) => {
                return ApiError::unavailable(format!("reading the answer failed: {e}"))
                    .into_response();
            }
        };
        return match serde_json::from_slice::<Value>(&body) {
            Ok(answer) if answer["choices"].is_array() => {
                builder.on_answer(&answer);
                Json(builder.finish()).into_response()
            }
            _ => ApiError::internal("the engine's answer is not a chat completion").into_response(),
        };
    }
    stream::relay(chat.into_body(), builder)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn errors_pass_unchanged() {
        let translation = translate(br#"{"model": "m", "input": "x"}"#).unwrap();
        let refused = ApiError::bad_request("max_tokens too large", Some("max_tokens"));
        let response = answer(
            translation,
            refused.clone().into_response(),
            Arc::new(|_: &str| 0),
        )
        .await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            refused.body()
        );
    }
}
