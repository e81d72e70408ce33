//! A chat answer, whole or in chunks, as the response's output items and the numbered
//! events that tell a streaming client of each step.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::object::{
    InputTokensDetails, ItemStatus, OutputItem, OutputTokensDetails, Part, ResponseObject,
    ResponseUsage, Status,
};
use super::request::Translation;

/// Counts a text's tokens (the model's tokenizer).
pub type TokenCounter = Arc<dyn Fn(&str) -> u64 + Send + Sync>;

/// A response being built from a chat answer's chunks (a whole answer is one chunk),
/// with the events that tell a streaming client of each step.
pub struct Builder {
    settings: Map<String, Value>,
    count_tokens: TokenCounter,
    /// The chat answer's id, less OpenAI's `chatcmpl-` prefix: the ids' stem.
    stem: String,
    created_at: u64,
    model: String,
    started: bool,
    output: Vec<OutputItem>,
    /// The last item of `output` is still being written.
    open: bool,
    /// The chat `index` of the call being written.
    call_index: Option<u64>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    events: Vec<Value>,
    sequence: u64,
}

impl Builder {
    pub fn new(translation: &Translation, count_tokens: TokenCounter) -> Self {
        Self {
            settings: translation.settings.clone(),
            count_tokens,
            stem: String::new(),
            created_at: 0,
            model: String::new(),
            started: false,
            output: Vec::new(),
            open: false,
            call_index: None,
            finish_reason: None,
            usage: None,
            events: Vec::new(),
            sequence: 0,
        }
    }

    /// The events so far, each with its `type` and `sequence_number`.
    pub fn take_events(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.events)
    }

    fn event(&mut self, kind: &str, mut event: Value) {
        event["type"] = kind.into();
        event["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        self.events.push(event);
    }

    /// The response as it stands, with `status`.
    pub fn response(&self, status: Status) -> ResponseObject {
        let reasoning: String = self
            .output
            .iter()
            .filter_map(|item| match item {
                OutputItem::Reasoning { content, .. } => Some(content),
                _ => None,
            })
            .flatten()
            .map(|part| match part {
                Part::OutputText { text, .. } | Part::ReasoningText { text } => text.as_str(),
            })
            .collect();
        let usage = self.usage.as_ref().map(|u| {
            let count = |v: &Value| v.as_u64().unwrap_or(0);
            let (input, output) = (count(&u["prompt_tokens"]), count(&u["completion_tokens"]));
            let cached = count(&u["prompt_tokens_details"]["cached_tokens"]).min(input);
            ResponseUsage {
                input_tokens: input,
                input_tokens_details: InputTokensDetails {
                    cached_tokens: cached,
                    cache_write_tokens: input - cached,
                },
                output_tokens: output,
                output_tokens_details: OutputTokensDetails {
                    reasoning_tokens: if reasoning.is_empty() {
                        0
                    } else {
                        (self.count_tokens)(&reasoning)
                    },
                },
                total_tokens: input + output,
            }
        });
        ResponseObject {
            id: format!("resp_{}", self.stem),
            object: "response".into(),
            created_at: self.created_at,
            status,
            error: None,
            incomplete_details: (status == Status::Incomplete)
                .then(|| json!({"reason": "max_output_tokens"})),
            model: self.model.clone(),
            output: self.output.clone(),
            usage,
            settings: self.settings.clone(),
        }
    }

    fn snapshot(&self, status: Status) -> Value {
        serde_json::to_value(self.response(status)).expect("a response serializes")
    }

    /// Takes one chunk of a streamed chat answer (`chat.completion.chunk`), after the
    /// answer parsers.
    pub fn on_chunk(&mut self, chunk: &Value) {
        if !self.started {
            self.started = true;
            let id = chunk["id"].as_str().unwrap_or_default();
            self.stem = id.strip_prefix("chatcmpl-").unwrap_or(id).to_owned();
            self.created_at = chunk["created"].as_u64().unwrap_or(0);
            self.model = chunk["model"].as_str().unwrap_or_default().to_owned();
            let response = self.snapshot(Status::InProgress);
            self.event("response.created", json!({"response": response}));
            self.event("response.in_progress", json!({"response": response}));
        }
        // A response has one answer: the first choice.
        let choices = chunk["choices"].as_array().into_iter().flatten();
        for choice in choices.filter(|c| c["index"].as_u64().unwrap_or(0) == 0) {
            let delta = &choice["delta"];
            // Our parsers' field, and vLLM's newer name for it.
            for field in ["reasoning_content", "reasoning"] {
                if let Some(text) = delta[field].as_str().filter(|t| !t.is_empty()) {
                    self.reasoning(text);
                }
            }
            if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
                self.text(text);
            }
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                self.call(call);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.finish_reason = Some(reason.to_owned());
            }
        }
        if !chunk["usage"].is_null() {
            self.usage = Some(chunk["usage"].clone());
        }
    }

    /// Takes a whole chat answer (`chat.completion`), after the answer parsers.
    pub fn on_answer(&mut self, answer: &Value) {
        let choice = &answer["choices"][0];
        let message = &choice["message"];
        let calls: Vec<Value> = message["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, call)| {
                let mut call = call.clone();
                call["index"] = i.into();
                call
            })
            .collect();
        let delta = json!({"reasoning_content": message["reasoning_content"],
            "reasoning": message["reasoning"], "content": message["content"], "tool_calls": calls});
        self.on_chunk(&json!({"id": answer["id"], "created": answer["created"],
            "model": answer["model"], "usage": answer["usage"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": choice["finish_reason"]}]}));
    }

    /// Keeps writing the open item if `same` says it is the one to; else closes it and
    /// opens the item `make` gives for its id (`prefix`, the stem and its index).
    fn ensure(
        &mut self,
        same: impl Fn(&OutputItem) -> bool,
        prefix: &str,
        make: impl FnOnce(String) -> OutputItem,
    ) {
        if self.open && self.output.last().is_some_and(same) {
            return;
        }
        self.close(ItemStatus::Completed);
        let index = self.output.len();
        let mut item = make(format!("{prefix}_{}_{index}", self.stem));
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        let part = match &item {
            OutputItem::Reasoning { .. } => Part::ReasoningText {
                text: String::new(),
            },
            OutputItem::Message { .. } => Part::OutputText {
                text: String::new(),
                annotations: Vec::new(),
            },
            OutputItem::FunctionCall { .. } => {
                self.output.push(item);
                self.open = true;
                return;
            }
        };
        self.event(
            "response.content_part.added",
            json!({"item_id": item.id(), "output_index": index, "content_index": 0,
                   "part": part}),
        );
        if let OutputItem::Reasoning { content, .. } | OutputItem::Message { content, .. } =
            &mut item
        {
            content.push(part);
        }
        self.output.push(item);
        self.open = true;
    }

    /// Appends `delta` to the open item's text part; its index and id.
    fn append(&mut self, delta: &str) -> (usize, String) {
        let index = self.output.len() - 1;
        let item = &mut self.output[index];
        if let OutputItem::Reasoning { content, .. } | OutputItem::Message { content, .. } = item {
            content[0].text_mut().push_str(delta);
        }
        (index, item.id().to_owned())
    }

    fn reasoning(&mut self, text: &str) {
        self.ensure(
            |item| matches!(item, OutputItem::Reasoning { .. }),
            "rs",
            |id| OutputItem::Reasoning {
                id,
                summary: Vec::new(),
                content: Vec::new(),
                status: ItemStatus::InProgress,
            },
        );
        let (index, id) = self.append(text);
        self.event(
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text}),
        );
    }

    fn text(&mut self, text: &str) {
        self.ensure(
            |item| matches!(item, OutputItem::Message { .. }),
            "msg",
            |id| OutputItem::Message {
                id,
                role: "assistant".into(),
                status: ItemStatus::InProgress,
                content: Vec::new(),
            },
        );
        let (index, id) = self.append(text);
        self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text,
                   "logprobs": []}),
        );
    }

    /// A chat tool call delta: a new call (its first delta has a new `index`), or more
    /// of the open call's arguments.
    fn call(&mut self, delta: &Value) {
        let chat_index = delta["index"].as_u64().unwrap_or(0);
        let same = self.call_index == Some(chat_index);
        let stem = self.stem.clone();
        let output_index = self.output.len();
        self.ensure(
            |item| same && matches!(item, OutputItem::FunctionCall { .. }),
            "fc",
            |id| OutputItem::FunctionCall {
                id,
                call_id: delta["id"]
                    .as_str()
                    .map_or_else(|| format!("call_{stem}_{output_index}"), str::to_owned),
                name: delta["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                arguments: String::new(),
                status: ItemStatus::InProgress,
            },
        );
        self.call_index = Some(chat_index);
        let Some(more) = delta["function"]["arguments"]
            .as_str()
            .filter(|a| !a.is_empty())
        else {
            return;
        };
        let index = self.output.len() - 1;
        let item = &mut self.output[index];
        if let OutputItem::FunctionCall { arguments, .. } = item {
            arguments.push_str(more);
        }
        let id = item.id().to_owned();
        self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": more}),
        );
    }

    /// Closes the open item, if any, with its `done` events.
    fn close(&mut self, status: ItemStatus) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        self.call_index = None;
        let index = self.output.len() - 1;
        self.output[index].set_status(status);
        let item = self.output[index].clone();
        let id = item.id().to_owned();
        match &item {
            OutputItem::Reasoning { content, .. } | OutputItem::Message { content, .. } => {
                let part = &content[0];
                let (kind, text) = match part {
                    Part::ReasoningText { text } => ("response.reasoning_text.done", text),
                    Part::OutputText { text, .. } => ("response.output_text.done", text),
                };
                let mut done =
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text});
                if let Part::OutputText { .. } = part {
                    done["logprobs"] = json!([]);
                }
                self.event(kind, done);
                self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                );
            }
            OutputItem::FunctionCall {
                name, arguments, ..
            } => {
                self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "name": name,
                           "arguments": arguments}),
                );
            }
        }
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
    }

    /// The chat answer ended: closes the open item and gives the finished response,
    /// with its `response.completed` (or, at the output limit, `response.incomplete`)
    /// event.
    pub fn finish(&mut self) -> ResponseObject {
        let length = self.finish_reason.as_deref() == Some("length");
        let (item, status, kind) = match length {
            true => (
                ItemStatus::Incomplete,
                Status::Incomplete,
                "response.incomplete",
            ),
            false => (
                ItemStatus::Completed,
                Status::Completed,
                "response.completed",
            ),
        };
        self.close(item);
        let response = self.response(status);
        let snapshot = serde_json::to_value(&response).expect("a response serializes");
        self.event(kind, json!({"response": snapshot}));
        response
    }

    /// The chat answer broke off with OpenAI error `body` (`{"error": {...}}`): the
    /// `error` event and `response.failed`.
    pub fn fail(&mut self, body: &Value) {
        let error = &body["error"];
        let message = error["message"].as_str().unwrap_or("the answer failed");
        self.event(
            "error",
            json!({"code": error["code"], "message": message, "param": error["param"]}),
        );
        let mut response = self.snapshot(Status::Failed);
        response["error"] = json!({"code": "server_error", "message": message});
        self.event("response.failed", json!({"response": response}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responses::fixtures::{chunk, types, weather};
    use crate::responses::translate;

    fn builder(request: Value) -> Builder {
        let translation = translate(request.to_string().as_bytes()).unwrap();
        Builder::new(
            &translation,
            Arc::new(|text: &str| text.split_whitespace().count() as u64),
        )
    }

    #[test]
    fn a_whole_answer_becomes_a_response_with_reasoning_call_and_usage() {
        let mut b = builder(json!({"model": "m", "input": "x", "tools": [weather()],
            "instructions": "Be brief", "metadata": {"k": "v"}}));
        b.on_answer(&json!({"id": "chatcmpl-abc", "object": "chat.completion",
            "created": 1700000000, "model": "m", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": null,
                "reasoning_content": "I should look it up.",
                "tool_calls": [{"id": "call_9", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32,
                "prompt_tokens_details": {"cached_tokens": 16}}}));
        let response = serde_json::to_value(b.finish()).unwrap();
        assert_eq!(response["id"], "resp_abc");
        assert_eq!(response["object"], "response");
        assert_eq!(response["created_at"], 1700000000);
        assert_eq!(response["status"], "completed");
        assert!(response["incomplete_details"].is_null());
        assert_eq!(response["model"], "m");
        assert_eq!(
            response["output"],
            json!([
                {"type": "reasoning", "id": "rs_abc_0", "summary": [], "status": "completed",
                 "content": [{"type": "reasoning_text", "text": "I should look it up."}]},
                {"type": "function_call", "id": "fc_abc_1", "call_id": "call_9",
                 "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}",
                 "status": "completed"},
            ])
        );
        assert_eq!(
            response["usage"],
            json!({"input_tokens": 20,
                "input_tokens_details": {"cached_tokens": 16, "cache_write_tokens": 4},
                "output_tokens": 12, "output_tokens_details": {"reasoning_tokens": 5},
                "total_tokens": 32})
        );
        // The request's settings, as the API echoes them.
        assert_eq!(response["instructions"], "Be brief");
        assert_eq!(response["metadata"], json!({"k": "v"}));
        assert_eq!(response["tools"], json!([weather()]));
        assert_eq!(response["tool_choice"], "auto");
        assert_eq!(response["parallel_tool_calls"], true);

        // Cut at the output limit: incomplete, and says why.
        let mut b = builder(json!({"model": "m", "input": "x", "max_output_tokens": 3}));
        b.on_answer(
            &json!({"id": "c", "created": 1, "model": "m", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "One two three"},
            "finish_reason": "length"}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}}),
        );
        let response = serde_json::to_value(b.finish()).unwrap();
        assert_eq!(response["status"], "incomplete");
        assert_eq!(
            response["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(response["max_output_tokens"], 3);
        assert_eq!(
            response["output"],
            json!([{"type": "message", "id": "msg_c_0", "role": "assistant",
                "status": "incomplete",
                "content": [{"type": "output_text", "text": "One two three", "annotations": []}]}])
        );
        assert_eq!(
            response["usage"]["output_tokens_details"]["reasoning_tokens"],
            0
        );
    }

    #[test]
    fn a_stream_becomes_the_responses_events_in_order() {
        let mut b = builder(json!({"model": "m", "input": "x", "tools": [weather()]}));
        let mut events = Vec::new();
        let mut feed = |b: &mut Builder, chunk: Value| {
            b.on_chunk(&chunk);
            events.extend(b.take_events());
        };
        feed(
            &mut b,
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        );
        feed(
            &mut b,
            chunk(json!({"reasoning_content": "Hmm,"}), Value::Null),
        );
        feed(
            &mut b,
            chunk(json!({"reasoning_content": " weather."}), Value::Null),
        );
        feed(&mut b, chunk(json!({"content": "Let me"}), Value::Null));
        feed(&mut b, chunk(json!({"content": " check."}), Value::Null));
        feed(
            &mut b,
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_1",
            "type": "function", "function": {"name": "get_weather", "arguments": "{\"ci"}}]}),
                Value::Null,
            ),
        );
        feed(
            &mut b,
            chunk(
                json!({"tool_calls": [{"index": 0,
            "function": {"arguments": "ty\":\"Oslo\"}"}}]}),
                Value::Null,
            ),
        );
        feed(
            &mut b,
            chunk(
                json!({"tool_calls": [{"index": 1, "id": "call_2",
            "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}),
                Value::Null,
            ),
        );
        feed(&mut b, chunk(json!({}), json!("tool_calls")));
        let mut usage = chunk(json!({}), Value::Null);
        usage["choices"] = json!([]);
        usage["usage"] = json!({"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13});
        feed(&mut b, usage);
        let response = serde_json::to_value(b.finish()).unwrap();
        events.extend(b.take_events());

        assert_eq!(
            types(&events),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (n, event) in events.iter().enumerate() {
            assert_eq!(event["sequence_number"], n, "{event}");
        }
        assert_eq!(events[0]["response"]["status"], "in_progress");
        assert_eq!(events[0]["response"]["id"], "resp_s");
        assert_eq!(events[0]["response"]["output"], json!([]));
        let reasoning_done = &events[6];
        assert_eq!(reasoning_done["text"], "Hmm, weather.");
        assert_eq!(reasoning_done["item_id"], "rs_s_0");
        let text_done = &events[13];
        assert_eq!(text_done["text"], "Let me check.");
        assert_eq!(text_done["output_index"], 1);
        let arguments_done = &events[19];
        assert_eq!(arguments_done["arguments"], "{\"city\":\"Oslo\"}");
        assert_eq!(arguments_done["name"], "get_weather");
        assert_eq!(events[16]["item"]["call_id"], "call_1");
        assert_eq!(events[16]["item"]["status"], "in_progress");
        assert_eq!(events[20]["item"]["status"], "completed");
        assert_eq!(events[21]["output_index"], 3);

        // The last event carries the whole response, the same as a whole answer's.
        let completed = &events.last().unwrap()["response"];
        assert_eq!(completed, &response);
        assert_eq!(completed["status"], "completed");
        assert_eq!(completed["usage"]["output_tokens"], 9);
        assert_eq!(
            completed["usage"]["output_tokens_details"]["reasoning_tokens"],
            2
        );
        let output = completed["output"].as_array().unwrap();
        assert_eq!(output.len(), 4);
        assert_eq!(output[1]["content"][0]["text"], "Let me check.");
        assert_eq!(output[3]["arguments"], "{}");
    }
}
