//! A streamed chat answer relayed as the Responses API's Server-Sent Events.

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::BytesMut;
use dynamo_llm::ApiError;
use futures::StreamExt;
use serde_json::Value;

use super::build::Builder;
use crate::meter::find_frame_end;
use crate::migration::frame_data;

/// An event as a Server-Sent Event, named by its type as OpenAI sends them.
fn sse(event: &Value) -> String {
    let kind = event["type"].as_str().unwrap_or_default();
    format!("event: {kind}\ndata: {event}\n\n")
}

/// The chat answer's SSE `body` as the Responses events `builder` makes of it.
pub(super) fn relay(body: Body, builder: Builder) -> Response {
    let state = Relay {
        upstream: body.into_data_stream(),
        pending: BytesMut::new(),
        builder,
        ended: false,
    };
    let events = futures::stream::unfold(state, |mut relay| async move {
        let out = relay.next().await?;
        Some((Ok::<_, std::convert::Infallible>(out), relay))
    });
    let mut response = Response::new(Body::from_stream(events));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response
}

/// A streamed chat answer relayed as Responses events.
struct Relay {
    upstream: axum::body::BodyDataStream,
    /// Bytes after the last whole frame.
    pending: BytesMut,
    builder: Builder,
    ended: bool,
}

impl Relay {
    /// The next events for the client; `None` at the end.
    async fn next(&mut self) -> Option<Bytes> {
        while !self.ended {
            match self.upstream.next().await {
                Some(Ok(chunk)) => {
                    self.pending.extend_from_slice(&chunk);
                    self.frames();
                }
                Some(Err(_)) | None => {
                    // The chat path ends every stream with `[DONE]`, errors included;
                    // this one was cut.
                    self.ended = true;
                    self.builder.fail(
                        &ApiError::unavailable("the answer ended before it was complete").body(),
                    );
                }
            }
            let events = self.builder.take_events();
            if !events.is_empty() {
                return Some(Bytes::from(events.iter().map(sse).collect::<String>()));
            }
        }
        None
    }

    /// Reads the whole frames in `pending`.
    fn frames(&mut self) {
        let mut start = 0;
        while let Some(len) = find_frame_end(&self.pending[start..]) {
            let frame = &self.pending[start..start + len];
            start += len;
            if self.ended {
                continue;
            }
            match frame_data(frame) {
                Some(b"[DONE]") => {
                    self.ended = true;
                    self.builder.finish();
                }
                Some(data) => match serde_json::from_slice::<Value>(data) {
                    Ok(event) if event.get("error").is_some() => {
                        self.ended = true;
                        self.builder.fail(&event);
                    }
                    Ok(chunk) => self.builder.on_chunk(&chunk),
                    Err(_) => {}
                },
                None => {}
            }
        }
        let _ = self.pending.split_to(start);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::http::StatusCode;
    use serde_json::json;

    use super::*;
    use crate::responses::fixtures::{chunk, types};
    use crate::responses::{answer, translate};

    #[tokio::test]
    async fn a_streamed_answer_that_breaks_off_fails_with_its_error() {
        let translation = translate(br#"{"model": "m", "input": "x", "stream": true}"#).unwrap();
        let frames = format!(
            "data: {}\n\ndata: {}\n\n{}",
            chunk(json!({"role": "assistant", "content": "Once"}), Value::Null),
            json!({"error": {"message": "the answer broke off", "type": "server_error",
                "param": null, "code": "answer_interrupted"}}),
            dynamo_llm::openai::SSE_DONE,
        );
        // Cut mid-frame, as bytes arrive.
        let (a, b) = frames.split_at(17);
        let body = Body::from_stream(futures::stream::iter([
            Ok::<_, std::io::Error>(Bytes::from(a.to_owned())),
            Ok(Bytes::from(b.to_owned())),
        ]));
        let mut chat = Response::new(body);
        chat.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        let response = answer(translation, chat, Arc::new(|_: &str| 0)).await;
        assert_eq!(response.status(), StatusCode::OK);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        let events: Vec<Value> = text
            .split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (event, data) = f.split_once('\n').unwrap();
                let value: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(event, format!("event: {}", value["type"].as_str().unwrap()));
                value
            })
            .collect();
        assert_eq!(
            types(&events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "error",
                "response.failed",
            ]
        );
        assert_eq!(events[5]["code"], "answer_interrupted");
        let failed = &events[6]["response"];
        assert_eq!(failed["status"], "failed");
        assert_eq!(failed["error"]["message"], "the answer broke off");
        assert_eq!(failed["output"][0]["content"][0]["text"], "Once");
    }
}
