//! Tool calls and reasoning in chat answers, turned from the engine's raw text into
//! OpenAI's `tool_calls` and `reasoning_content` as the answer passes (`--tool-call-parser`,
//! `--reasoning-parser`; the parsers are `dynamo_llm::parsers`). This is what Dynamo's
//! frontend does for its workers: an engine that parses itself (vLLM with
//! `--enable-auto-tool-choice`) sends no markup, and its answers pass unchanged.
//!
//! A request's answer is parsed for reasoning whenever a reasoning parser is set (from
//! inside the reasoning, unless the client turned thinking off with
//! `chat_template_kwargs.enable_thinking: false`), and for tool calls when it offers
//! `tools` and does not say `tool_choice: "none"`. Reasoning is split off first; the
//! tool-call parser reads what is left. An answer that called tools finishes with
//! `finish_reason: "tool_calls"`, as vLLM's does.
//!
//! Request migration continues from the raw text the engine wrote (it sees the frames
//! before they are parsed), and the parsers carry on across the break.

use std::collections::BTreeMap;

use bytes::Bytes;
use dynamo_llm::openai::ToolCallDelta;
use dynamo_llm::parsers::{
    ReasoningParser, StreamDelta, StreamingReasoningParser, StreamingToolParser, ToolCallParser,
    UnknownParser,
};
use serde_json::{Map, Value, json};

/// The parsers the frontend is configured with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnswerParsers {
    pub tool_calls: Option<ToolCallParser>,
    pub reasoning: Option<ReasoningParser>,
}

impl AnswerParsers {
    /// From the flags' parser names.
    pub fn from_names(
        tool_calls: Option<&str>,
        reasoning: Option<&str>,
    ) -> Result<Self, UnknownParser> {
        Ok(Self {
            tool_calls: tool_calls.map(ToolCallParser::from_name).transpose()?,
            reasoning: reasoning.map(ReasoningParser::from_name).transpose()?,
        })
    }

    /// How the answer to chat `request` is parsed; `None` when it passes unchanged.
    pub fn for_request(&self, request: &Map<String, Value>) -> Option<RequestParsers> {
        let thinking_off = request
            .get("chat_template_kwargs")
            .and_then(|k| k.get("enable_thinking"))
            == Some(&Value::Bool(false));
        let reasoning = self.reasoning.map(|_| ReasoningParser::new(!thinking_off));
        let offers_tools = request
            .get("tools")
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty());
        let tool_calls = self
            .tool_calls
            .filter(|_| offers_tools && request.get("tool_choice") != Some(&json!("none")));
        (reasoning.is_some() || tool_calls.is_some()).then_some(RequestParsers {
            tool_calls,
            reasoning,
        })
    }
}

/// The parsers one request's answer goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestParsers {
    tool_calls: Option<ToolCallParser>,
    reasoning: Option<ReasoningParser>,
}

impl RequestParsers {
    /// A whole answer's body, its messages parsed; other bodies are returned as they are.
    pub fn whole(&self, body: Bytes) -> Bytes {
        let Ok(mut answer) = serde_json::from_slice::<Value>(&body) else {
            return body;
        };
        let Some(choices) = answer["choices"].as_array_mut() else {
            return body;
        };
        for choice in choices {
            let Some(text) = choice["message"]["content"].as_str().map(str::to_owned) else {
                continue;
            };
            let mut split = ChoiceState::new(self);
            let mut delta = Map::new();
            split.push(&text, &mut delta);
            split.finish(&mut delta);
            let message = &mut choice["message"];
            message["content"] = delta.remove("content").unwrap_or(Value::Null);
            if let Some(reasoning) = delta.remove("reasoning_content") {
                message["reasoning_content"] = reasoning;
            }
            if let Some(Value::Array(calls)) = delta.remove("tool_calls") {
                message["tool_calls"] = calls
                    .into_iter()
                    .map(|mut call| {
                        call.as_object_mut().map(|c| c.remove("index"));
                        call
                    })
                    .collect();
                choice["finish_reason"] = json!("tool_calls");
            }
        }
        Bytes::from(answer.to_string())
    }

    /// The parsing of one streamed answer.
    pub fn stream(self) -> StreamParsing {
        StreamParsing {
            parsers: self,
            choices: BTreeMap::new(),
        }
    }
}

/// A streamed answer being parsed, per choice.
#[derive(Debug)]
pub struct StreamParsing {
    parsers: RequestParsers,
    choices: BTreeMap<u64, ChoiceState>,
}

impl StreamParsing {
    /// One chunk of the answer as the client gets it; `None` when nothing of it is left
    /// to send yet (its text is held back until it can be told apart).
    pub fn on_event(&mut self, mut event: Value) -> Option<Value> {
        let Some(choices) = event["choices"].as_array_mut().filter(|c| !c.is_empty()) else {
            return Some(event);
        };
        let mut keep = false;
        for choice in choices.iter_mut() {
            let index = choice["index"].as_u64().unwrap_or(0);
            let state = self
                .choices
                .entry(index)
                .or_insert_with(|| ChoiceState::new(&self.parsers));
            let Some(delta) = choice["delta"].as_object_mut() else {
                keep = true;
                continue;
            };
            let text = match delta.remove("content") {
                Some(Value::String(text)) => text,
                Some(other) => {
                    delta.insert("content".into(), other);
                    String::new()
                }
                None => String::new(),
            };
            let role = delta.contains_key("role");
            state.push(&text, delta);
            let finished = !choice["finish_reason"].is_null();
            if finished {
                let delta = choice["delta"].as_object_mut().expect("checked");
                state.finish(delta);
                if state.called {
                    choice["finish_reason"] = json!("tool_calls");
                }
            }
            if role {
                // OpenAI opens a chat stream with the role and empty content.
                let delta = choice["delta"].as_object_mut().expect("checked");
                delta.entry("content").or_insert(json!(""));
            }
            let said = choice["delta"]
                .as_object()
                .is_some_and(|d| d.values().any(|v| !v.is_null()));
            keep |= said || finished || !choice["logprobs"].is_null();
        }
        (keep || event.get("usage").is_some_and(|u| !u.is_null())).then_some(event)
    }
}

impl StreamParsing {
    /// The first choice's message as the client has it so far: its content and tool
    /// calls (reasoning left out, as chat templates leave it out of earlier turns).
    pub fn message(&self) -> Value {
        let (content, calls) = match self.choices.first_key_value() {
            Some((_, state)) => (state.content.as_str(), state.calls.as_slice()),
            None => ("", &[][..]),
        };
        let mut message = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            message["tool_calls"] = calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                           "function": {"name": c.function.name, "arguments": c.function.arguments}})
                })
                .collect();
        }
        message
    }
}

/// One choice's parsers mid-answer.
#[derive(Debug)]
struct ChoiceState {
    reasoning: Option<StreamingReasoningParser>,
    tool_calls: Option<StreamingToolParser>,
    /// The content and the calls passed on.
    content: String,
    calls: Vec<ToolCallDelta>,
    /// A tool call was passed on.
    called: bool,
}

impl ChoiceState {
    fn new(parsers: &RequestParsers) -> Self {
        Self {
            reasoning: parsers.reasoning.map(|p| p.streaming()),
            tool_calls: parsers.tool_calls.map(|p| p.streaming()),
            content: String::new(),
            calls: Vec::new(),
            called: false,
        }
    }

    /// Takes the next raw `text` and adds what can be told apart to `delta`.
    fn push(&mut self, text: &str, delta: &mut Map<String, Value>) {
        let split = match &mut self.reasoning {
            Some(r) => r.push(text),
            None => dynamo_llm::parsers::ReasoningText {
                reasoning_content: None,
                content: Some(text.to_owned()),
            },
        };
        self.add(split, false, delta);
    }

    /// The answer ended: adds what was held back to `delta`.
    fn finish(&mut self, delta: &mut Map<String, Value>) {
        let split = match &mut self.reasoning {
            Some(r) => r.finish(),
            None => Default::default(),
        };
        self.add(split, true, delta);
    }

    fn add(
        &mut self,
        split: dynamo_llm::parsers::ReasoningText,
        end: bool,
        delta: &mut Map<String, Value>,
    ) {
        if let Some(reasoning) = split.reasoning_content {
            append(delta, "reasoning_content", &reasoning);
        }
        let content = split.content.unwrap_or_default();
        let Some(tools) = &mut self.tool_calls else {
            if !content.is_empty() {
                self.content.push_str(&content);
                append(delta, "content", &content);
            }
            return;
        };
        let mut pieces = tools.push(&content);
        if end {
            pieces.extend(tools.finish());
        }
        for piece in pieces {
            match piece {
                StreamDelta::Content(text) => {
                    self.content.push_str(&text);
                    append(delta, "content", &text);
                }
                StreamDelta::ToolCall(call) => {
                    self.called = true;
                    self.calls.push(call.clone());
                    add_call(delta, call);
                }
            }
        }
    }
}

fn append(delta: &mut Map<String, Value>, field: &str, text: &str) {
    match delta.get_mut(field) {
        Some(Value::String(existing)) => existing.push_str(text),
        _ => {
            delta.insert(field.to_owned(), text.into());
        }
    }
}

fn add_call(delta: &mut Map<String, Value>, call: ToolCallDelta) {
    let call = serde_json::to_value(call).expect("tool calls serialize");
    match delta.get_mut("tool_calls") {
        Some(Value::Array(calls)) => calls.push(call),
        _ => {
            delta.insert("tool_calls".into(), json!([call]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsers(tools: Option<&str>, reasoning: Option<&str>) -> AnswerParsers {
        AnswerParsers::from_names(tools, reasoning).unwrap()
    }

    fn request(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    const TOOLS: &str = r#"[{"type":"function","function":{"name":"get_weather"}}]"#;

    fn with_tools() -> Map<String, Value> {
        request(json!({"messages": [], "tools": serde_json::from_str::<Value>(TOOLS).unwrap()}))
    }

    /// The answer streamed in `pieces`, one content delta each, then the finish chunk.
    fn stream(parsing: &mut StreamParsing, pieces: &[&str]) -> Vec<Value> {
        let mut out = Vec::new();
        let chunk = |delta: Value, finish: Value| json!({"id": "x", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        out.extend(parsing.on_event(chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )));
        for piece in pieces {
            out.extend(parsing.on_event(chunk(json!({"content": piece}), Value::Null)));
        }
        out.extend(parsing.on_event(chunk(json!({}), json!("stop"))));
        out
    }

    fn field(events: &[Value], name: &str) -> String {
        events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"][name].as_str())
            .collect()
    }

    #[test]
    fn which_requests_are_parsed() {
        let both = parsers(Some("hermes"), Some("qwen3"));
        assert!(parsers(None, None).for_request(&with_tools()).is_none());
        // Tools only when offered and not refused.
        let only_tools = parsers(Some("hermes"), None);
        assert!(
            only_tools
                .for_request(&request(json!({"messages": []})))
                .is_none()
        );
        let mut refused = with_tools();
        refused.insert("tool_choice".into(), json!("none"));
        assert!(only_tools.for_request(&refused).is_none());
        assert!(only_tools.for_request(&with_tools()).is_some());
        // Thinking turned off: the answer is content unless it opens `<think>` itself.
        let mut off = with_tools();
        off.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": false}),
        );
        let body = Bytes::from(
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "plain"},
                   "finish_reason": "stop"}]})
            .to_string(),
        );
        let parsed: Value =
            serde_json::from_slice(&both.for_request(&off).unwrap().whole(body.clone())).unwrap();
        assert_eq!(parsed["choices"][0]["message"]["content"], "plain");
        let parsed: Value =
            serde_json::from_slice(&both.for_request(&with_tools()).unwrap().whole(body)).unwrap();
        assert_eq!(
            parsed["choices"][0]["message"]["reasoning_content"],
            "plain"
        );
        assert!(parsed["choices"][0]["message"]["content"].is_null());
    }

    #[test]
    fn a_whole_answer_gets_reasoning_calls_and_the_tool_calls_finish() {
        let p = parsers(Some("hermes"), Some("deepseek_r1"))
            .for_request(&with_tools())
            .unwrap();
        let text = "I should look.</think>\n<tool_call>\n{\"name\": \"get_weather\", \
                    \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let body = json!({"id": "c", "choices": [{"index": 0, "message":
            {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"completion_tokens": 30}});
        let parsed: Value =
            serde_json::from_slice(&p.whole(Bytes::from(body.to_string()))).unwrap();
        let choice = &parsed["choices"][0];
        assert_eq!(choice["message"]["reasoning_content"], "I should look.");
        assert!(choice["message"]["content"].is_null(), "{choice}");
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], r#"{"city":"Paris"}"#);
        assert_eq!(call["type"], "function");
        assert!(call.get("index").is_none(), "{call}");
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(parsed["usage"]["completion_tokens"], 30);
        // Not JSON, or not an answer: unchanged.
        assert_eq!(
            p.whole(Bytes::from_static(b"oops")),
            Bytes::from_static(b"oops")
        );
    }

    #[test]
    fn a_stream_is_split_whatever_its_pieces() {
        let text = "Hmm, weather.</think>Let me check.\n<tool_call>\n{\"name\": \
                    \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let p = parsers(Some("hermes"), Some("qwen3"))
            .for_request(&with_tools())
            .unwrap();
        for size in [1, 3, 7, 200] {
            let chars: Vec<char> = text.chars().collect();
            let pieces: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let mut parsing = p.stream();
            let events = stream(&mut parsing, &pieces);
            let message = parsing.message();
            assert_eq!(message["content"], "Let me check.");
            assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");
            assert_eq!(field(&events, "reasoning_content"), "Hmm, weather.");
            assert_eq!(field(&events, "content"), "Let me check.");
            let calls: Vec<&Value> = events
                .iter()
                .filter_map(|e| e["choices"][0]["delta"]["tool_calls"].as_array())
                .flatten()
                .collect();
            assert_eq!(calls.len(), 1, "size {size}");
            assert_eq!(calls[0]["index"], 0);
            assert_eq!(calls[0]["function"]["arguments"], r#"{"city":"Oslo"}"#);
            let last = events.last().unwrap();
            assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
            // The role chunk opens the stream; no chunk is empty.
            assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
            for e in &events[1..events.len() - 1] {
                let delta = e["choices"][0]["delta"].as_object().unwrap();
                assert!(!delta.is_empty(), "{e}");
            }
        }
    }

    #[test]
    fn plain_answers_and_usage_chunks_pass() {
        let p = parsers(Some("hermes"), None)
            .for_request(&with_tools())
            .unwrap();
        let mut parsing = p.stream();
        let events = stream(&mut parsing, &[" a", " b"]);
        assert_eq!(field(&events, "content"), " a b");
        assert_eq!(
            events.last().unwrap()["choices"][0]["finish_reason"],
            "stop"
        );
        let usage = json!({"choices": [], "usage": {"completion_tokens": 2}});
        assert_eq!(parsing.on_event(usage.clone()), Some(usage));
    }
}
