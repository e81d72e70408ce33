//! The mock engine playing a model that thinks and calls tools (`--reasoning`,
//! `--tool-call-format`), so that the picker's parsers and an agent's loop can be
//! exercised end to end without a GPU. Its answers are then what such a model writes:
//!
//! - **Reasoning** (DeepSeek-R1 and Qwen3 style): the answer opens with thinking words
//!   closed by `</think>`, the opening `<think>` being the chat template's, unless the
//!   request turns thinking off (`chat_template_kwargs.enable_thinking: false`).
//! - **Tool calls:** a chat request that offers `tools` (and does not say `tool_choice:
//!   "none"`) is answered with one call, in the format of the model family, of the tool
//!   `tool_choice` names, else the first; its arguments fill the function's required
//!   parameters (all of them if it names none) with values of their JSON-schema types.
//!   The answer ends after the call, as a model's does when it waits for the result.
//!
//! The scripted text is cut into pieces at the model tokenizer's token boundaries, one
//! piece per output token, so the answer streams as a model's would.

use dynamo_llm::ModelDir;
use dynamo_llm::openai::ChatCompletionRequest;
use dynamo_llm::parsers::ToolCallParser;
use serde_json::{Map, Value, json};

use super::output_vocab::OutputVocab;
use crate::tokens::splitmix64;

/// Closes a reasoning block (DeepSeek-R1's and Qwen3's tag).
const THINK_END: &str = "</think>\n\n";

/// Thinking words before the answer proper.
const REASONING_WORDS: std::ops::RangeInclusive<u64> = 8..=24;

/// What kind of model the engine plays.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelBehaviour {
    pub reasoning: bool,
    pub tool_calls: Option<ToolCallParser>,
}

/// The scripted part of one answer, one piece of text per output token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Script {
    /// Opens the answer (the reasoning).
    pub opening: Vec<String>,
    /// Ends the answer when present (the call): nothing follows it.
    pub call: Option<Vec<String>>,
}

impl Script {
    /// Output tokens of an answer that ends with its call; `None` when the answer goes
    /// on after the opening.
    pub fn len(&self) -> Option<usize> {
        self.call.as_ref().map(|c| self.opening.len() + c.len())
    }

    /// The scripted piece at output position `index`, if any.
    pub fn piece(&self, index: usize) -> Option<&str> {
        let call = self.call.as_deref().unwrap_or_default();
        self.opening
            .iter()
            .chain(call)
            .nth(index)
            .map(String::as_str)
    }
}

impl ModelBehaviour {
    /// The script of the answer to `req`; `key` varies it per request.
    pub fn script(
        &self,
        req: &ChatCompletionRequest,
        model: &ModelDir,
        vocab: &OutputVocab,
        key: u64,
    ) -> Script {
        let mut script = Script::default();
        let thinking_off = req
            .other
            .get("chat_template_kwargs")
            .and_then(|k| k.get("enable_thinking"))
            == Some(&Value::Bool(false));
        if self.reasoning && !thinking_off {
            let span = REASONING_WORDS.end() - REASONING_WORDS.start() + 1;
            let words = REASONING_WORDS.start() + splitmix64(key) % span;
            script.opening = (0..words)
                .map(|i| vocab.piece(splitmix64(key ^ (i + 1)) as u32).to_owned())
                .collect();
            script.opening.extend(pieces(model, THINK_END));
        }
        if let (Some(format), Some(tool)) = (self.tool_calls, chosen_tool(req)) {
            let name = tool["name"].as_str().unwrap_or_default().to_owned();
            let arguments = arguments(&tool["parameters"], vocab, key);
            script.call = Some(pieces(model, &format.render(&[(name, arguments)])));
        }
        script
    }
}

/// The function a request's answer calls: the one `tool_choice` names, else the first
/// offered; none when no tool is offered or `tool_choice` is `none`.
fn chosen_tool(req: &ChatCompletionRequest) -> Option<&Value> {
    let tools = req.tools.as_ref()?.as_array()?;
    fn function(tool: &Value) -> Option<&Value> {
        tool.get("function").filter(|f| f["name"].is_string())
    }
    match req.other.get("tool_choice") {
        Some(Value::String(none)) if none == "none" => None,
        Some(Value::Object(choice)) => {
            let name = choice.get("function")?.get("name")?;
            tools
                .iter()
                .filter_map(function)
                .find(|f| &f["name"] == name)
        }
        _ => tools.iter().find_map(function),
    }
}

/// Arguments for a function's JSON-schema `parameters`: its required properties (all
/// of them when it lists none), each a value of its type.
fn arguments(parameters: &Value, vocab: &OutputVocab, key: u64) -> Value {
    let properties = parameters["properties"].as_object();
    let required: Option<Vec<&str>> = parameters["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect());
    let mut out = Map::new();
    for (i, (name, schema)) in properties.into_iter().flatten().enumerate() {
        if required
            .as_ref()
            .is_some_and(|r| !r.contains(&name.as_str()))
        {
            continue;
        }
        let key = splitmix64(key ^ (i as u64 + 1));
        out.insert(name.clone(), value_of(schema, vocab, key));
    }
    Value::Object(out)
}

/// A value matching `schema`: its first `enum` value, else one of its `type`.
fn value_of(schema: &Value, vocab: &OutputVocab, key: u64) -> Value {
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    let kind = match &schema["type"] {
        Value::Array(kinds) => kinds.iter().find_map(Value::as_str).unwrap_or("string"),
        kind => kind.as_str().unwrap_or("string"),
    };
    match kind {
        "integer" => json!(key % 100),
        "number" => json!((key % 1000) as f64 / 8.0),
        "boolean" => json!(key.is_multiple_of(2)),
        "array" => json!([value_of(&schema["items"], vocab, splitmix64(key))]),
        "object" => arguments(schema, vocab, key),
        "null" => Value::Null,
        _ => json!(vocab.piece(key as u32).trim()),
    }
}

/// `text` cut where the model's tokenizer cuts it.
fn pieces(model: &ModelDir, text: &str) -> Vec<String> {
    let Ok(encoding) = model.tokenizer.encode(text, false) else {
        return vec![text.to_owned()];
    };
    let mut cuts: Vec<usize> = encoding
        .get_offsets()
        .iter()
        .map(|&(start, _)| start)
        .filter(|&at| at > 0 && at < text.len() && text.is_char_boundary(at))
        .collect();
    cuts.dedup();
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut from = 0;
    for at in cuts.into_iter().chain([text.len()]) {
        if at > from {
            out.push(text[from..at].to_owned());
            from = at;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_llm::openai::parse_body;
    use dynamo_llm::parsers::ReasoningParser;

    fn model() -> ModelDir {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/qwen-mock");
        ModelDir::load(&dir, None).expect("run `make model` first")
    }

    fn request(body: Value) -> ChatCompletionRequest {
        parse_body(body.to_string().as_bytes()).unwrap()
    }

    const WEATHER: &str = r#"[{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "required": ["city", "days"], "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["c", "f"]}}}}},
        {"type": "function", "function": {"name": "ping"}}]"#;

    fn text(script: &Script) -> String {
        (0..).map_while(|i| script.piece(i)).collect()
    }

    #[test]
    fn a_tool_calling_model_calls_the_chosen_tool_with_its_required_arguments() {
        let model = model();
        let vocab = OutputVocab::from_model(&model);
        let tools: Value = serde_json::from_str(WEATHER).unwrap();
        for format in ToolCallParser::NAMES {
            let format = ToolCallParser::from_name(format).unwrap();
            let behaviour = ModelBehaviour {
                reasoning: false,
                tool_calls: Some(format),
            };
            let req = request(json!({"model": "m", "messages": [], "tools": tools}));
            let script = behaviour.script(&req, &model, &vocab, 7);
            let call = script.call.as_ref().unwrap();
            assert!(call.len() > 5, "streamed in token-sized pieces: {call:?}");
            let parsed = format.parse(&text(&script));
            assert_eq!(parsed.content, None, "{format:?}");
            let function = &parsed.tool_calls[0].function;
            assert_eq!(function.name, "get_weather");
            let args: Value = serde_json::from_str(&function.arguments).unwrap();
            assert!(args["city"].is_string() && args["days"].is_u64(), "{args}");
            assert!(args.get("unit").is_none(), "not required: {args}");
            // A named tool is the one called.
            let named = request(json!({"model": "m", "messages": [], "tools": tools,
                "tool_choice": {"type": "function", "function": {"name": "ping"}}}));
            let parsed = format.parse(&text(&behaviour.script(&named, &model, &vocab, 7)));
            assert_eq!(parsed.tool_calls[0].function.name, "ping");
        }
        let behaviour = ModelBehaviour {
            reasoning: false,
            tool_calls: Some(ToolCallParser::Hermes),
        };
        for req in [
            json!({"model": "m", "messages": []}),
            json!({"model": "m", "messages": [], "tools": tools, "tool_choice": "none"}),
        ] {
            assert_eq!(
                behaviour.script(&request(req), &model, &vocab, 1),
                Script::default()
            );
        }
    }

    #[test]
    fn a_reasoning_model_thinks_first_unless_told_not_to() {
        let model = model();
        let vocab = OutputVocab::from_model(&model);
        let behaviour = ModelBehaviour {
            reasoning: true,
            tool_calls: None,
        };
        let script = behaviour.script(
            &request(json!({"model": "m", "messages": []})),
            &model,
            &vocab,
            3,
        );
        assert_eq!(script.len(), None, "the answer goes on after the reasoning");
        let split = ReasoningParser::from_name("qwen3")
            .unwrap()
            .parse(&text(&script));
        let thought = split.reasoning_content.unwrap();
        assert!(thought.split_whitespace().count() >= 8, "{thought}");
        assert_eq!(split.content.as_deref(), Some("\n\n"));
        let off = request(json!({"model": "m", "messages": [],
            "chat_template_kwargs": {"enable_thinking": false}}));
        assert_eq!(behaviour.script(&off, &model, &vocab, 3), Script::default());
    }
}
