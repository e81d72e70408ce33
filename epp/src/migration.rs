//! Request migration, as Dynamo's frontend does it (`--migration-limit`; Dynamo's
//! `lib/llm/src/migration.rs` and its docs, "Request Migration"): when a pod dies or its
//! answer breaks off before the end, the request goes to another pod with the output
//! already sent appended to its prompt and its token limits lowered by as much, so the
//! engine continues the answer and the client's stream goes on without a gap or a
//! repeated token. Dynamo appends output token ids to a tokenized request; this frontend
//! proxies OpenAI bodies, so it appends the text: to a completion's prompt, or as a final
//! assistant message the engine continues (vLLM's `continue_final_message`).
//!
//! Not continued: structured output (the engine's grammar would restart at the schema's
//! root on the prefilled text, which is why Dynamo does not migrate guided decoding
//! either) and output the engine parsed into reasoning or tool calls (the raw text it
//! continues from is not in the stream).

use std::borrow::Cow;

use axum::http::StatusCode;
use dynamo_llm::ApiError;
use dynamo_llm::openai::SSE_DONE;
use dynamo_llm::prepare::{ADD_GENERATION_PROMPT, CONTINUE_FINAL_MESSAGE};
use serde_json::{Map, Value, json};

use crate::meter::{self, Chunk};
use crate::request::Api;

/// The `code` of the error a client gets when its answer broke off and was not continued.
pub const ANSWER_INTERRUPTED: &str = "answer_interrupted";

/// Request fields that constrain the output to a grammar (OpenAI's and vLLM's).
const STRUCTURED_OUTPUT: [&str; 5] = [
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
];

/// Token limits lowered by the output already sent (vLLM's `min_tokens` too).
const TOKEN_LIMITS: [&str; 3] = ["max_tokens", "max_completion_tokens", "min_tokens"];

/// The 502 (or, streamed, the error event) of an answer that broke off and was not
/// continued.
pub fn interrupted(message: String) -> ApiError {
    ApiError {
        status: StatusCode::BAD_GATEWAY,
        code: Some(ANSWER_INTERRUPTED),
        ..ApiError::internal(message)
    }
}

/// The end of a stream that failed: the error event OpenAI's clients raise on
/// (`{"error": {...}}`), then `[DONE]`.
pub fn error_frames(body: &Value) -> String {
    format!("data: {body}\n\n{SSE_DONE}")
}

/// Why a streamed answer to `request` cannot be continued from its text, if it cannot.
pub fn not_continuable(request: &Map<String, Value>) -> Option<&'static str> {
    let format = request
        .get("response_format")
        .and_then(|f| f["type"].as_str());
    let structured = format.is_some_and(|t| t != "text")
        || STRUCTURED_OUTPUT
            .iter()
            .any(|k| request.get(*k).is_some_and(|v| !v.is_null()));
    if structured {
        return Some("structured output cannot be continued");
    }
    // The stream's progress is followed for one choice.
    if request
        .get("n")
        .and_then(Value::as_u64)
        .is_some_and(|n| n > 1)
    {
        return Some("an answer of several choices (n > 1) cannot be continued");
    }
    // The stream's text starts with the prompt, not only the answer.
    (request.get("echo") == Some(&Value::Bool(true)))
        .then_some("an echoed prompt cannot be continued")
}

/// The output tokens `request` may still produce after `sent` of them; `None` without a
/// limit.
pub fn remaining(request: &Map<String, Value>, sent: u64) -> Option<u64> {
    ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| request.get(*k)?.as_u64())
        .map(|limit| limit.saturating_sub(sent))
}

/// The request that continues an answer whose first `text` (`text_tokens` tokens) the
/// client already has.
pub fn continuation(
    api: Api,
    request: &Map<String, Value>,
    text: &str,
    text_tokens: &[u32],
) -> Map<String, Value> {
    let mut next = request.clone();
    if text.is_empty() {
        return next;
    }
    let sent = text_tokens.len() as u64;
    for limit in TOKEN_LIMITS {
        if let Some(n) = next.get(limit).and_then(Value::as_u64) {
            next.insert(limit.to_owned(), n.saturating_sub(sent).into());
        }
    }
    match api {
        // Embeddings are whole answers: asked again, never continued.
        Api::Embeddings => {}
        Api::Completions => match next.get_mut("prompt") {
            Some(Value::String(prompt)) => prompt.push_str(text),
            Some(Value::Array(ids)) => ids.extend(text_tokens.iter().map(|&t| json!(t))),
            _ => {}
        },
        Api::Chat => {
            let continues = request.get(CONTINUE_FINAL_MESSAGE) == Some(&Value::Bool(true));
            if let Some(Value::Array(messages)) = next.get_mut("messages") {
                match messages.last_mut() {
                    // The client prefilled the answer itself: the output follows its text.
                    Some(last) if continues => match &mut last["content"] {
                        Value::String(content) => content.push_str(text),
                        Value::Array(parts) => parts.push(json!({"type": "text", "text": text})),
                        other => *other = text.into(),
                    },
                    _ => messages.push(json!({"role": "assistant", "content": text})),
                }
            }
            next.insert(ADD_GENERATION_PROMPT.to_owned(), false.into());
            next.insert(CONTINUE_FINAL_MESSAGE.to_owned(), true.into());
        }
    }
    next
}

/// The first chunk's `id`, `created` and `model`, which every later chunk carries so
/// that the client sees one stream.
struct Identity {
    id: Value,
    created: Value,
    model: Value,
}

impl Identity {
    fn of(event: &Value) -> Self {
        Self {
            id: event["id"].clone(),
            created: event["created"].clone(),
            model: event["model"].clone(),
        }
    }
}

/// What the client has been sent of one streamed answer (choice 0, the only one), and
/// the rewriting that makes a continued answer read as the same stream.
pub struct Progress {
    api: Api,
    /// Our count of the prompt's tokens, for the usage of a continued answer.
    prompt_tokens: u64,
    identity: Option<Identity>,
    text: String,
    role_sent: bool,
    /// A `finish_reason` or an error event was sent: only `[DONE]` may follow.
    answered: bool,
    done: bool,
    /// Reasoning or tool calls were sent: the raw text to continue from is unknown.
    opaque: bool,
    /// Since a migration: the output tokens sent before the current pod's answer, which
    /// its usage does not count. `None`: frames pass unchanged.
    earlier_tokens: Option<u64>,
}

impl Progress {
    pub fn new(api: Api, prompt_tokens: usize) -> Self {
        Self {
            api,
            prompt_tokens: prompt_tokens as u64,
            identity: None,
            text: String::new(),
            role_sent: false,
            answered: false,
            done: false,
            opaque: false,
            earlier_tokens: None,
        }
    }

    /// The answer's text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The answer is over but for `[DONE]`.
    pub fn answered(&self) -> bool {
        self.answered
    }

    /// `[DONE]` was sent.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Why the answer so far cannot be continued, if it cannot.
    pub fn not_continuable(&self) -> Option<&'static str> {
        self.opaque
            .then_some("the answer so far holds reasoning or tool calls")
    }

    /// The answer continues on another pod; `sent_tokens` is the output so far in tokens.
    pub fn migrated(&mut self, sent_tokens: u64) {
        self.earlier_tokens = Some(sent_tokens);
    }

    /// Takes one SSE frame of the current pod's answer and gives what the client gets of
    /// it: the frame itself until a migration, then the rewritten one (`None` drops it).
    pub fn on_frame<'a>(&mut self, frame: &'a [u8]) -> Option<Cow<'a, [u8]>> {
        let Some(data) = frame_data(frame) else {
            return Some(Cow::Borrowed(frame));
        };
        if data == b"[DONE]" {
            self.done = true;
            return Some(Cow::Borrowed(frame));
        }
        let Some(earlier) = self.earlier_tokens else {
            // Passed on as it is: only read, never built as a `Value` (but for the
            // identity, once).
            let identity = || serde_json::from_slice(data).ok().map(|v| Identity::of(&v));
            meter::read_chunk(data, |chunk| self.observe(chunk, identity));
            return Some(Cow::Borrowed(frame));
        };
        let Ok(mut event) = serde_json::from_slice::<Value>(data) else {
            return Some(Cow::Borrowed(frame));
        };
        let out = self
            .rewrite(&mut event, earlier)
            .then(|| Cow::Owned(format!("data: {event}\n\n").into_bytes()));
        meter::read_value(&event, |chunk| {
            self.observe(chunk, || Some(Identity::of(&event)))
        });
        out
    }

    /// Makes a continued answer's event read as the first answer's; false when nothing of
    /// it is left (a chat answer's opening chunk, with the role the client already has).
    fn rewrite(&self, event: &mut Value, earlier: u64) -> bool {
        if let Some(first) = &self.identity {
            event["id"] = first.id.clone();
            event["created"] = first.created.clone();
            event["model"] = first.model.clone();
        }
        if self.role_sent
            && let Some(choices) = event["choices"].as_array_mut()
        {
            for choice in choices {
                if let Some(delta) = choice["delta"].as_object_mut() {
                    delta.remove("role");
                }
            }
        }
        if let Some(usage) = event.get_mut("usage").filter(|u| u.is_object()) {
            let completion = usage["completion_tokens"].as_u64().unwrap_or(0) + earlier;
            let prompt = self.prompt_tokens;
            usage["prompt_tokens"] = prompt.into();
            usage["completion_tokens"] = completion.into();
            usage["total_tokens"] = (prompt + completion).into();
            if let Some(cached) = usage.pointer_mut("/prompt_tokens_details/cached_tokens") {
                *cached = cached.as_u64().unwrap_or(0).min(prompt).into();
            }
            return true;
        }
        let empty = |s: &Value| s.as_str().is_none_or(str::is_empty);
        let choices = event["choices"].as_array().map_or(&[][..], Vec::as_slice);
        choices.is_empty()
            || choices.iter().any(|c| {
                !c["finish_reason"].is_null()
                    || !c["logprobs"].is_null()
                    || !empty(&c["text"])
                    || c["delta"]
                        .as_object()
                        .is_some_and(|d| d.iter().any(|(k, v)| k != "content" && !v.is_null()))
                    || !empty(&c["delta"]["content"])
            })
    }

    /// Records what the client got of `event`; `identity` gives the event's `id`,
    /// `created` and `model` (asked once, of the first event with an `id`).
    fn observe(&mut self, event: &Chunk, identity: impl FnOnce() -> Option<Identity>) {
        if event.error {
            self.answered = true;
            return;
        }
        if self.identity.is_none() && event.id {
            self.identity = identity();
        }
        let Some(choice) = &event.choices.first else {
            return;
        };
        let piece = match self.api {
            Api::Completions | Api::Embeddings => &choice.text,
            Api::Chat => match &choice.delta.0 {
                Some(delta) => {
                    self.role_sent |= delta.role;
                    self.opaque |= delta.reasoning_content.non_empty()
                        || delta.reasoning.non_empty()
                        || delta.tool_calls.0.is_some_and(|n| n > 0);
                    &delta.content
                }
                None => &meter::Text(None),
            },
        };
        if let Some(piece) = &piece.0 {
            self.text.push_str(piece);
        }
        self.answered |= choice.finish_reason;
    }

    /// The end of an answer whose whole token budget was sent before its pod failed:
    /// the final chunk (`finish_reason: length`), the usage when asked, `[DONE]`.
    pub fn finish_frames(&self, include_usage: bool, sent_tokens: u64) -> String {
        let (id, created, model) = match &self.identity {
            Some(first) => (&first.id, &first.created, &first.model),
            None => (&Value::Null, &Value::Null, &Value::Null),
        };
        let (object, choice) = match self.api {
            Api::Chat => (
                "chat.completion.chunk",
                json!({"index": 0, "delta": {}, "finish_reason": "length"}),
            ),
            Api::Completions | Api::Embeddings => (
                "text_completion",
                json!({"index": 0, "text": "", "finish_reason": "length"}),
            ),
        };
        let chunk = |choices: Value| {
            json!({"id": id, "object": object, "created": created, "model": model,
                   "choices": choices})
        };
        let mut out = format!("data: {}\n\n", chunk(json!([choice])));
        if include_usage {
            let mut last = chunk(json!([]));
            last["usage"] = json!({
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": sent_tokens,
                "total_tokens": self.prompt_tokens + sent_tokens,
            });
            out.push_str(&format!("data: {last}\n\n"));
        }
        out.push_str(SSE_DONE);
        out
    }
}

/// The payload of a frame's single `data:` line.
pub(crate) fn frame_data(frame: &[u8]) -> Option<&[u8]> {
    let mut data = frame
        .split(|&b| b == b'\n')
        .filter_map(|line| line.strip_prefix(b"data:"));
    match (data.next(), data.next()) {
        (Some(one), None) => Some(one.trim_ascii()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn frame(event: Value) -> Vec<u8> {
        format!("data: {event}\n\n").into_bytes()
    }

    /// What the client gets of `frames`, as events.
    fn relay(progress: &mut Progress, frames: &[Value]) -> Vec<Value> {
        frames
            .iter()
            .filter_map(|f| {
                let bytes = frame(f.clone());
                let out = progress.on_frame(&bytes)?.into_owned();
                let text = String::from_utf8(out).unwrap();
                Some(serde_json::from_str(text.strip_prefix("data: ").unwrap().trim()).unwrap())
            })
            .collect()
    }

    fn chat_chunk(id: &str, delta: Value, finish: Option<&str>) -> Value {
        json!({"id": id, "object": "chat.completion.chunk", "created": 7, "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    }

    fn text_chunk(id: &str, text: &str, finish: Option<&str>) -> Value {
        json!({"id": id, "object": "text_completion", "created": 7, "model": "m",
               "choices": [{"index": 0, "text": text, "finish_reason": finish}]})
    }

    #[test]
    fn a_completion_continues_from_its_prompt_with_the_text_so_far() {
        let request = object(json!({"model": "m", "prompt": "Once", "max_tokens": 10,
            "min_tokens": 4, "seed": 3, "stream": true}));
        let next = continuation(Api::Completions, &request, " upon a", &[1, 2]);
        assert_eq!(
            Value::Object(next),
            json!({"model": "m", "prompt": "Once upon a", "max_tokens": 8, "min_tokens": 2,
                   "seed": 3, "stream": true})
        );
        let ids = object(json!({"model": "m", "prompt": [5, 6], "max_tokens": 3}));
        let next = continuation(Api::Completions, &ids, " upon a", &[1, 2]);
        assert_eq!(next["prompt"], json!([5, 6, 1, 2]));
        assert_eq!(next["max_tokens"], 1);
        // Nothing sent yet: the request as it was.
        assert_eq!(continuation(Api::Completions, &request, "", &[]), request);
    }

    #[test]
    fn a_chat_continues_an_open_assistant_message() {
        let request = object(json!({"model": "m", "max_completion_tokens": 6,
            "messages": [{"role": "user", "content": "Hi"}]}));
        let next = continuation(Api::Chat, &request, " hello there", &[1, 2]);
        assert_eq!(
            Value::Object(next),
            json!({"model": "m", "max_completion_tokens": 4,
                   "messages": [{"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": " hello there"}],
                   "add_generation_prompt": false, "continue_final_message": true})
        );
        // A client's own prefilled answer grows rather than gets a second message.
        let prefilled = object(json!({"model": "m",
            "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}],
            "add_generation_prompt": false, "continue_final_message": true}));
        let next = continuation(Api::Chat, &prefilled, " yes", &[1]);
        assert_eq!(
            next["messages"],
            json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well, yes"}])
        );
    }

    #[test]
    fn budgets_and_structured_output() {
        let request = object(json!({"max_tokens": 5, "max_completion_tokens": 3}));
        assert_eq!(remaining(&request, 2), Some(1));
        assert_eq!(remaining(&request, 4), Some(0));
        assert_eq!(remaining(&object(json!({})), 4), None);
        assert!(not_continuable(&object(json!({"response_format": {"type": "text"}}))).is_none());
        assert!(not_continuable(&object(json!({"n": 1}))).is_none());
        for structured in [
            json!({"response_format": {"type": "json_schema", "json_schema": {}}}),
            json!({"response_format": {"type": "json_object"}}),
            json!({"guided_regex": "a+"}),
            json!({"echo": true}),
            json!({"n": 2}),
        ] {
            assert!(not_continuable(&object(structured)).is_some());
        }
    }

    #[test]
    fn a_continued_chat_stream_reads_as_the_first_one() {
        let mut p = Progress::new(Api::Chat, 20);
        let first = [
            chat_chunk("a", json!({"role": "assistant", "content": ""}), None),
            chat_chunk("a", json!({"content": " one"}), None),
            chat_chunk("a", json!({"content": " two"}), None),
        ];
        // Unchanged, byte for byte, until a migration.
        for f in &first {
            let bytes = frame(f.clone());
            assert_eq!(p.on_frame(&bytes).unwrap(), &bytes[..]);
        }
        assert_eq!(p.text(), " one two");
        assert!(!p.answered());
        p.migrated(2);
        let mut second = chat_chunk("b", json!({"content": " three"}), None);
        second["created"] = json!(9);
        let mut usage = json!({"id": "b", "object": "chat.completion.chunk", "created": 9,
            "model": "m2", "choices": [],
            "usage": {"prompt_tokens": 23, "completion_tokens": 2, "total_tokens": 25,
                      "prompt_tokens_details": {"cached_tokens": 22}}});
        let out = relay(
            &mut p,
            &[
                chat_chunk("b", json!({"role": "assistant", "content": ""}), None),
                second,
                chat_chunk("b", json!({"role": "assistant", "content": " four"}), None),
                chat_chunk("b", json!({}), Some("length")),
                usage.clone(),
            ],
        );
        assert_eq!(out.len(), 4, "the second role chunk is dropped: {out:?}");
        for event in &out {
            assert_eq!(
                (&event["id"], &event["created"], &event["model"]),
                (&json!("a"), &json!(7), &json!("m"))
            );
        }
        assert_eq!(out[0]["choices"][0]["delta"], json!({"content": " three"}));
        assert_eq!(out[1]["choices"][0]["delta"], json!({"content": " four"}));
        assert_eq!(out[2]["choices"][0]["finish_reason"], "length");
        usage["usage"] = json!({"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24,
                                "prompt_tokens_details": {"cached_tokens": 20}});
        assert_eq!(out[3]["usage"], usage["usage"]);
        assert!(p.answered());
        assert!(!p.done());
        assert_eq!(
            p.on_frame(b"data: [DONE]\n\n").unwrap(),
            &b"data: [DONE]\n\n"[..]
        );
        assert!(p.done());
        assert_eq!(p.text(), " one two three four");
    }

    #[test]
    fn a_stream_migrated_before_its_first_chunk_keeps_the_new_ones_identity_and_role() {
        let mut p = Progress::new(Api::Chat, 5);
        p.migrated(0);
        let out = relay(
            &mut p,
            &[chat_chunk(
                "b",
                json!({"role": "assistant", "content": ""}),
                None,
            )],
        );
        assert_eq!(out[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(out[0]["id"], "b");
    }

    #[test]
    fn escaped_text_and_a_role_key_of_any_value_are_followed() {
        let mut p = Progress::new(Api::Chat, 3);
        let opening = json!({"role": null, "content": "\"hi\" \u{e9}\n"});
        relay(&mut p, &[chat_chunk("a", opening, None)]);
        assert_eq!(p.text(), "\"hi\" \u{e9}\n");
        // The role was sent (as null): a continuation's role is dropped.
        p.migrated(1);
        let next = chat_chunk("b", json!({"role": "assistant", "content": " x"}), None);
        let out = relay(&mut p, &[next]);
        assert_eq!(out[0]["choices"][0]["delta"], json!({"content": " x"}));
        assert_eq!(p.text(), "\"hi\" \u{e9}\n x");
    }

    #[test]
    fn completions_text_and_finish_are_followed() {
        let mut p = Progress::new(Api::Completions, 3);
        relay(
            &mut p,
            &[text_chunk("c", " x", None), text_chunk("c", " y", None)],
        );
        assert_eq!(p.text(), " x y");
        p.migrated(2);
        let out = relay(&mut p, &[text_chunk("d", " z", Some("length"))]);
        assert_eq!(
            (&out[0]["id"], &out[0]["choices"][0]["text"]),
            (&json!("c"), &json!(" z"))
        );
        assert!(p.answered());
    }

    #[test]
    fn reasoning_tool_calls_and_errors_are_noticed() {
        let mut p = Progress::new(Api::Chat, 3);
        relay(
            &mut p,
            &[chat_chunk("a", json!({"reasoning_content": "hm"}), None)],
        );
        assert!(p.not_continuable().is_some());
        let mut p = Progress::new(Api::Chat, 3);
        relay(
            &mut p,
            &[chat_chunk("a", json!({"tool_calls": [{"index": 0}]}), None)],
        );
        assert!(p.not_continuable().is_some());
        let mut p = Progress::new(Api::Chat, 3);
        relay(&mut p, &[json!({"error": {"message": "engine died"}})]);
        assert!(p.answered());
        // Comments and other frames pass as they are.
        assert_eq!(p.on_frame(b": ping\n\n").unwrap(), &b": ping\n\n"[..]);
    }

    #[test]
    fn synthesized_and_error_ends_are_valid_sse() {
        let mut p = Progress::new(Api::Completions, 3);
        relay(&mut p, &[text_chunk("c", " x", None)]);
        let end = p.finish_frames(true, 4);
        let frames: Vec<&str> = end.split("\n\n").filter(|f| !f.is_empty()).collect();
        assert_eq!(frames.len(), 3, "{end}");
        let last: Value = serde_json::from_str(&frames[0]["data: ".len()..]).unwrap();
        assert_eq!(
            (&last["id"], &last["choices"][0]["finish_reason"]),
            (&json!("c"), &json!("length"))
        );
        let usage: Value = serde_json::from_str(&frames[1]["data: ".len()..]).unwrap();
        assert_eq!(usage["usage"]["total_tokens"], 7);
        assert_eq!(frames[2], "data: [DONE]");
        let error = error_frames(&interrupted("cut".into()).body());
        assert!(error.starts_with("data: {\"error\":{"), "{error}");
        assert!(error.ends_with("data: [DONE]\n\n"), "{error}");
    }
}
