//! Test data the modules' tests share.

use serde_json::{Value, json};

const WEATHER: &str = r#"{"type": "function", "name": "get_weather",
    "description": "The weather", "parameters": {"type": "object"}}"#;

pub(super) fn weather() -> Value {
    serde_json::from_str(WEATHER).unwrap()
}

pub(super) fn chunk(delta: Value, finish: Value) -> Value {
    json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 5,
        "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

pub(super) fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}
