//! The mock engine playing a model that thinks and calls tools (`--reasoning`,
//! `--tool-call-format`), over its HTTP surface on real sockets: its answers carry the
//! markup such a model writes, which `dynamo-llm`'s parsers (the picker's) read back.

use common::{post, serve_playing, stream};
use dynamo_llm::parsers::{ReasoningParser, ToolCallParser};
use dynamo_mocker::EngineConfig;
use dynamo_mocker::server::{ModelBehaviour, RunningServer};
use serde_json::{Value, json};

mod common;

async fn chat(server: &RunningServer, body: Value) -> (u16, Value) {
    post(server, "/v1/chat/completions", &body).await
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "required": ["city"],
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])
}

fn request(extra: Value) -> Value {
    let mut body = json!({"model": "qwen", "seed": 3,
                          "messages": [{"role": "user", "content": "Weather in Oslo?"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test]
async fn a_reasoning_tool_calling_model_thinks_then_calls_and_stops() {
    let server = serve_playing(
        EngineConfig::default(),
        ModelBehaviour {
            reasoning: true,
            tool_calls: Some(ToolCallParser::Hermes),
        },
    )
    .await;
    let (status, answer) = chat(&server, request(json!({"tools": tools()}))).await;
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    let thinking = ReasoningParser::from_name("qwen3").unwrap().parse(text);
    assert!(thinking.reasoning_content.is_some(), "{text}");
    let parsed = ToolCallParser::Hermes.parse(&thinking.content.unwrap());
    assert_eq!(parsed.content, None, "{text}");
    assert_eq!(parsed.tool_calls[0].function.name, "get_weather");
    let args: Value = serde_json::from_str(&parsed.tool_calls[0].function.arguments).unwrap();
    assert!(
        args["city"].is_string() && args.get("days").is_none(),
        "{args}"
    );
    // The answer ends with its call, as a model's does, well within the default limit.
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    let tokens = answer["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((20..200).contains(&tokens), "{tokens}");
    // The same request streamed says the same, one token per chunk.
    let (_, again) = chat(&server, request(json!({"tools": tools()}))).await;
    assert_eq!(
        again["choices"][0]["message"],
        answer["choices"][0]["message"]
    );
    let chunks = stream(
        &server,
        "/v1/chat/completions",
        &request(json!({"tools": tools(), "stream": true})),
    )
    .await;
    let pieces: Vec<String> = chunks
        .iter()
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str())
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    assert_eq!(pieces.len() as u64, tokens);
    assert_eq!(pieces.concat(), text);

    // A limit shorter than the call cuts it: a `length` finish, the call unfinished.
    let (_, cut) = chat(
        &server,
        request(json!({"tools": tools(), "max_tokens": 30})),
    )
    .await;
    assert_eq!(cut["choices"][0]["finish_reason"], "length");
    let cut_text = cut["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with(cut_text) && cut_text.len() < text.len());
    // Thinking off and tools refused: plain words.
    let (_, plain) = chat(
        &server,
        request(
            json!({"tools": tools(), "tool_choice": "none", "max_tokens": 5,
                       "chat_template_kwargs": {"enable_thinking": false}}),
        ),
    )
    .await;
    let words = plain["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        !words.contains('<') && words.split_whitespace().count() == 5,
        "{words}"
    );
}

#[tokio::test]
async fn a_forced_tool_choice_is_served_only_by_a_tool_calling_model() {
    let named = json!({"tools": tools(),
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let server = serve_playing(EngineConfig::default(), ModelBehaviour::default()).await;
    let (status, error) = chat(&server, request(named.clone())).await;
    assert_eq!(
        (status, error["error"]["param"].as_str()),
        (400, Some("tool_choice"))
    );
    let server = serve_playing(
        EngineConfig::default(),
        ModelBehaviour {
            reasoning: false,
            tool_calls: Some(ToolCallParser::Pythonic),
        },
    )
    .await;
    let (status, answer) = chat(&server, request(named)).await;
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.starts_with("[get_weather(city="), "{text}");
}
