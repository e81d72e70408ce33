//! A Responses request as the chat completion request that answers it, or the 400 that
//! refuses it.

use axum::body::Bytes;
use dynamo_llm::ApiError;
use dynamo_llm::openai::parse_body;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use utoipa::ToSchema;

/// Fields that need state the picker does not keep (stored responses, conversations,
/// prompt templates, compaction), refused whenever set.
const REFUSED: [&str; 4] = [
    "previous_response_id",
    "conversation",
    "prompt",
    "context_management",
];

/// Responses fields that do not reach the chat request: translated (`text`), allowed only
/// at their default (`store`, `background`, `truncation`, `top_logprobs`), or without
/// effect here (caching and tier hints, `include`, `reasoning` options: the model reasons
/// as its chat template makes it).
const NOT_FORWARDED: [&str; 13] = [
    "text",
    "store",
    "background",
    "truncation",
    "top_logprobs",
    "include",
    "reasoning",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "stream_options",
    "max_tool_calls",
];

/// `POST /v1/responses`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ResponsesRequest {
    pub model: String,
    /// A user message's text, or a list of input items: messages (`role`, `content` as
    /// text or `input_text` parts) and an earlier turn's `function_call`,
    /// `function_call_output` and `reasoning` items.
    pub input: Value,
    /// A system message before the input.
    pub instructions: Option<String>,
    /// `function` tools, in the Responses API's flat shape (`name`, `description`,
    /// `parameters` at the top level).
    pub tools: Option<Vec<Value>>,
    /// `auto`, `none`, `required`, or `{"type": "function", "name": ...}`.
    pub tool_choice: Option<Value>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    #[serde(default)]
    pub stream: bool,
    pub parallel_tool_calls: Option<bool>,
    /// Echoed in the response.
    pub metadata: Option<Value>,
    /// Everything else: refused, dropped, or passed to the chat request.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// A Responses request as the chat request that answers it.
#[derive(Debug, Clone)]
pub struct Translation {
    /// The chat completion request's body.
    pub chat: Bytes,
    /// The request's settings the response repeats (`instructions`, `tools`, ...).
    pub(super) settings: Map<String, Value>,
}

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

/// The chat completion request for a Responses request's `body`, or the 400 that refuses it.
pub fn translate(body: &[u8]) -> Result<Translation, ApiError> {
    let request: ResponsesRequest = parse_body(body)?;
    let other = &request.other;
    let set = |field: &str| other.get(field).filter(|v| !v.is_null());
    if let Some(field) = REFUSED.into_iter().find(|f| set(f).is_some()) {
        return Err(bad(
            format!(
                "`{field}` is not supported: this server keeps no responses, conversations \
                 or prompts; send the whole conversation in `input`"
            ),
            field,
        ));
    }
    if set("store") == Some(&Value::Bool(true)) {
        return Err(bad(
            "`store: true` is not supported: this server keeps no responses",
            "store",
        ));
    }
    if set("background") == Some(&Value::Bool(true)) {
        return Err(bad(
            "`background: true` is not supported: responses are answered while the client waits",
            "background",
        ));
    }
    if set("truncation").is_some_and(|t| t != "disabled") {
        return Err(bad(
            "only `truncation: \"disabled\"` is supported: an input over the context is refused",
            "truncation",
        ));
    }
    if set("top_logprobs").is_some_and(|n| n != 0) {
        return Err(bad(
            "`top_logprobs` is not supported on /v1/responses; use /v1/chat/completions",
            "top_logprobs",
        ));
    }
    let response_format = response_format(set("text"))?;

    let mut chat = request.other.clone();
    for field in NOT_FORWARDED {
        chat.remove(field);
    }
    let messages = messages(request.instructions.as_deref(), &request.input)?;
    chat.insert("model".into(), request.model.clone().into());
    chat.insert("messages".into(), messages.into());
    let tools = request.tools.clone().unwrap_or_default();
    if !tools.is_empty() {
        let tools = tools.iter().enumerate().map(|(i, t)| chat_tool(t, i));
        chat.insert("tools".into(), tools.collect::<Result<Vec<_>, _>>()?.into());
    }
    if let Some(choice) = &request.tool_choice {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    if let Some(format) = response_format {
        chat.insert("response_format".into(), format);
    }
    let copied = [
        ("max_tokens", request.max_output_tokens.map(Value::from)),
        ("temperature", request.temperature.map(Value::from)),
        ("top_p", request.top_p.map(Value::from)),
        (
            "parallel_tool_calls",
            request.parallel_tool_calls.map(Value::from),
        ),
    ];
    for (field, value) in copied {
        if let Some(value) = value {
            chat.insert(field.into(), value);
        }
    }
    if request.stream {
        chat.insert("stream".into(), true.into());
        // The last event carries the usage.
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let settings = json!({
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "tools": tools,
        "tool_choice": request.tool_choice.clone().unwrap_or("auto".into()),
        "parallel_tool_calls": request.parallel_tool_calls.unwrap_or(true),
        "metadata": request.metadata.clone().unwrap_or(json!({})),
        "text": set("text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
    });
    let Value::Object(settings) = settings else {
        unreachable!("an object literal")
    };
    Ok(Translation {
        chat: Bytes::from(serde_json::to_vec(&chat).expect("JSON serializes")),
        settings,
    })
}

/// The chat `messages` for `instructions` and `input`.
fn messages(instructions: Option<&str>, input: &Value) -> Result<Vec<Value>, ApiError> {
    let mut messages = Vec::new();
    if let Some(text) = instructions {
        messages.push(json!({"role": "system", "content": text}));
    }
    match input {
        Value::String(text) => messages.push(json!({"role": "user", "content": text})),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                add_item(&mut messages, item, &format!("input[{i}]"))?;
            }
        }
        _ => {
            return Err(bad(
                "`input` must be a string or a list of input items",
                "input",
            ));
        }
    }
    Ok(messages)
}

/// Adds input item `item` (at `at`) to the chat `messages`.
fn add_item(messages: &mut Vec<Value>, item: &Value, at: &str) -> Result<(), ApiError> {
    let text_field = |field: &str| {
        item[field].as_str().ok_or_else(|| {
            bad(
                format!("{at}.{field} is required and must be a string"),
                &format!("{at}.{field}"),
            )
        })
    };
    // A message may leave out its `type` (OpenAI's "easy input message").
    match item.get("type").map_or(Some("message"), Value::as_str) {
        Some("message") => {
            let role = match item["role"].as_str() {
                Some(role @ ("user" | "assistant" | "system")) => role,
                // Chat templates know the system role; OpenAI's developer is that.
                Some("developer") => "system",
                _ => {
                    return Err(bad(
                        format!("{at}.role must be user, assistant, system or developer"),
                        &format!("{at}.role"),
                    ));
                }
            };
            let content = content(&item["content"], &format!("{at}.content"))?;
            messages.push(json!({"role": role, "content": content}));
        }
        Some("function_call") => {
            let call = json!({"id": text_field("call_id")?, "type": "function",
                "function": {"name": text_field("name")?, "arguments": text_field("arguments")?}});
            // Calls after an assistant's text, or after one another, are one chat turn.
            match messages.last_mut() {
                Some(last) if last["role"] == "assistant" => match &mut last["tool_calls"] {
                    Value::Array(calls) => calls.push(call),
                    absent => *absent = json!([call]),
                },
                _ => messages
                    .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        Some("function_call_output") => {
            let output = content(&item["output"], &format!("{at}.output"))?;
            messages.push(
                json!({"role": "tool", "tool_call_id": text_field("call_id")?,
                                 "content": output}),
            );
        }
        // An earlier turn's thinking: chat templates leave it out of later prompts.
        Some("reasoning") => {}
        Some("item_reference") => {
            return Err(bad(
                format!("{at}: item references are not supported: this server keeps no items"),
                &format!("{at}.type"),
            ));
        }
        other => {
            return Err(bad(
                format!(
                    "{at}.type {} is not supported: only message, function_call, \
                     function_call_output and reasoning items are",
                    other.map_or("(not a string)".to_owned(), |t| format!("`{t}`"))
                ),
                &format!("{at}.type"),
            ));
        }
    }
    Ok(())
}

/// Message content (at `at`) as chat content: text as it is, text parts as chat's.
fn content(content: &Value, at: &str) -> Result<Value, ApiError> {
    let parts = match content {
        Value::String(_) => return Ok(content.clone()),
        Value::Array(parts) => parts,
        _ => {
            return Err(bad(
                format!("{at} must be a string or a list of content parts"),
                at,
            ));
        }
    };
    let text = |(j, part): (usize, &Value)| {
        let field = match part["type"].as_str() {
            Some("input_text" | "output_text") => "text",
            Some("refusal") => "refusal",
            kind => {
                return Err(bad(
                    format!(
                        "{at}[{j}]: only text parts are supported, got {}",
                        kind.unwrap_or("a part without a type")
                    ),
                    &format!("{at}[{j}].type"),
                ));
            }
        };
        match part[field].as_str() {
            Some(text) => Ok(json!({"type": "text", "text": text})),
            None => Err(bad(
                format!("{at}[{j}].{field} must be a string"),
                &format!("{at}[{j}].{field}"),
            )),
        }
    };
    Ok(Value::Array(
        parts
            .iter()
            .enumerate()
            .map(text)
            .collect::<Result<_, _>>()?,
    ))
}

/// A Responses `function` tool (flat) as a chat tool (`function` nested).
fn chat_tool(tool: &Value, i: usize) -> Result<Value, ApiError> {
    match tool["type"].as_str() {
        Some("function") => {
            let Some(name) = tool["name"].as_str() else {
                return Err(bad(
                    format!("tools[{i}].name is required"),
                    &format!("tools[{i}].name"),
                ));
            };
            let mut function = json!({"name": name});
            for field in ["description", "parameters", "strict"] {
                if let Some(value) = tool.get(field).filter(|v| !v.is_null()) {
                    function[field] = value.clone();
                }
            }
            Ok(json!({"type": "function", "function": function}))
        }
        kind => Err(bad(
            format!(
                "tools[{i}].type {} is not supported: this server runs no built-in tools, \
                 only `function` tools are offered to the model",
                kind.map_or("(missing)".to_owned(), |k| format!("`{k}`"))
            ),
            &format!("tools[{i}].type"),
        )),
    }
}

/// A Responses `tool_choice` as chat's.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(mode) if ["auto", "none", "required"].contains(&mode.as_str()) => {
            Ok(choice.clone())
        }
        Value::Object(named) if named.get("type") == Some(&json!("function")) => {
            match named.get("name").and_then(Value::as_str) {
                Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
                None => Err(bad("tool_choice.name is required", "tool_choice.name")),
            }
        }
        _ => Err(bad(
            "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}",
            "tool_choice",
        )),
    }
}

/// Chat's `response_format` for the Responses `text` setting; `None` for plain text.
fn response_format(text: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(format) = text.and_then(|t| t.get("format")).filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for field in ["name", "schema", "description", "strict"] {
                if let Some(value) = format.get(field).filter(|v| !v.is_null()) {
                    schema.insert(field.into(), value.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(bad(
            "text.format.type must be text, json_object or json_schema",
            "text.format.type",
        )),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;
    use crate::responses::fixtures::weather;

    fn chat(request: Value) -> Result<Value, ApiError> {
        let translation = translate(request.to_string().as_bytes())?;
        Ok(serde_json::from_slice(&translation.chat).unwrap())
    }

    #[test]
    fn a_request_becomes_the_chat_request_of_its_conversation() {
        let plain = chat(
            json!({"model": "m", "input": "Hi", "instructions": "Be brief",
            "max_output_tokens": 9, "temperature": 0.5, "top_p": 0.9, "store": false,
            "metadata": {"k": "v"}, "include": ["reasoning.encrypted_content"],
            "nvext": {"agent_hints": {"osl": 5}}}),
        )
        .unwrap();
        // `metadata` is echoed in the response, `include` has no effect: neither goes on.
        assert_eq!(
            plain,
            json!({"model": "m", "messages": [{"role": "system", "content": "Be brief"},
                {"role": "user", "content": "Hi"}], "max_tokens": 9, "temperature": 0.5,
                "top_p": 0.9, "nvext": {"agent_hints": {"osl": 5}}})
        );

        // An agent's second turn: its call, the call's output, tools in the flat shape.
        let turn = chat(json!({"model": "m", "stream": true, "tools": [weather()],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "Rules"}]},
            {"type": "message", "role": "user", "content": "Weather in Oslo?"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "I should look."}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather",
             "arguments": "{\"city\":\"Bergen\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
            {"type": "function_call_output", "call_id": "call_2",
             "output": [{"type": "input_text", "text": "Rain"}]},
        ]}))
        .unwrap();
        assert_eq!(turn["stream"], true);
        assert_eq!(turn["stream_options"], json!({"include_usage": true}));
        assert_eq!(
            turn["tools"],
            json!([{"type": "function", "function": {"name": "get_weather",
                "description": "The weather", "parameters": {"type": "object"}}}])
        );
        assert_eq!(
            turn["tool_choice"],
            json!({"type": "function", "function": {"name": "get_weather"}})
        );
        let call = |id: &str, city: &str| {
            json!({"id": id, "type": "function", "function": {"name": "get_weather",
                "arguments": format!("{{\"city\":\"{city}\"}}")}})
        };
        assert_eq!(
            turn["messages"],
            json!([
                {"role": "system", "content": [{"type": "text", "text": "Rules"}]},
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."}],
                 "tool_calls": [call("call_1", "Oslo"), call("call_2", "Bergen")]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
                {"role": "tool", "tool_call_id": "call_2",
                 "content": [{"type": "text", "text": "Rain"}]},
            ])
        );

        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let structured = chat(json!({"model": "m", "input": "x", "text": {"format":
            {"type": "json_schema", "name": "thing", "schema": schema, "strict": true}}}))
        .unwrap();
        assert_eq!(
            structured["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "thing", "schema": schema,
                "strict": true}})
        );
        assert!(structured.get("text").is_none(), "{structured}");
    }

    #[test]
    fn what_needs_state_or_built_in_tools_is_refused_by_name() {
        let refused = [
            (
                json!({"previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (json!({"conversation": "conv_1"}), "conversation"),
            (json!({"prompt": {"id": "pmpt_1"}}), "prompt"),
            (json!({"store": true}), "store"),
            (json!({"background": true}), "background"),
            (json!({"truncation": "auto"}), "truncation"),
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (
                json!({"tools": [weather(), {"type": "web_search"}]}),
                "tools[1].type",
            ),
            (json!({"tools": [{"type": "function"}]}), "tools[0].name"),
            (
                json!({"tool_choice": {"type": "web_search"}}),
                "tool_choice",
            ),
            (
                json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
                "input[0].type",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"},
                {"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[1].type",
            ),
            (
                json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
                "input[0].call_id",
            ),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                "input[0].role",
            ),
            (json!({"input": 3}), "input"),
            (
                json!({"text": {"format": {"type": "yaml"}}}),
                "text.format.type",
            ),
        ];
        for (fields, param) in refused {
            let mut request = json!({"model": "m", "input": "x"});
            request
                .as_object_mut()
                .unwrap()
                .extend(fields.as_object().unwrap().clone());
            let error = chat(request).expect_err(param);
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{param}");
            let body = error.body();
            assert_eq!(body["error"]["param"], param, "{body}");
            assert_eq!(body["error"]["type"], "invalid_request_error");
        }
        // Their defaults are fine.
        let defaults = json!({"model": "m", "input": "x", "store": false, "background": false,
            "truncation": "disabled", "top_logprobs": 0, "previous_response_id": null});
        assert!(chat(defaults).is_ok());
        // Not JSON or not a request: the chat path's 400.
        assert!(translate(b"{").is_err());
        assert!(
            translate(br#"{"input": "x"}"#)
                .unwrap_err()
                .message
                .contains("model")
        );
    }
}
