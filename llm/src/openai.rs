//! OpenAI-compatible request and response bodies (`/v1/chat/completions`,
//! `/v1/completions`, `/v1/models`), with the vLLM extensions engines accept
//! (`ignore_eos`, `min_tokens`, `kv_transfer_params`) and Dynamo's `nvext`.
//!
//! Field names follow OpenAI's API reference. Fields we do not interpret are kept in
//! `other`, so a router that re-serializes a request loses nothing.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::ApiError;

/// Parses a request body, turning every JSON or shape mistake into a 400 that says what
/// is wrong (axum's own extractor would answer 422 in plain text).
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}"), None))
}

/// Options of a streamed answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk carrying `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// Generation parameters common to chat and completions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SamplingParams {
    #[serde(default)]
    pub stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Signed so a negative value gets a clear 400 rather than a parse error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
    /// OpenAI's newer name for `max_tokens` in chat; wins when both are set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// vLLM: generate exactly `max_tokens`, whatever the model would stop on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_eos: bool,
    /// vLLM's disaggregation handshake, passed through untouched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_transfer_params: Option<Value>,
    /// Dynamo's extensions, e.g. `nvext.agent_hints.priority`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvext: Option<Value>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Value>,
    #[serde(flatten)]
    pub params: SamplingParams,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatMessage {
    pub role: String,
    /// A string, an array of content parts, or null (an assistant turn with tool calls).
    #[serde(default)]
    pub content: Value,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    #[serde(flatten)]
    pub params: SamplingParams,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// A completion prompt: text, or token ids (a batch of prompts is refused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Batch(Vec<Value>),
}

/// Token counts of one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// How much of the prompt came from the prefix cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: u64,
}

impl Usage {
    pub fn new(prompt_tokens: u64, completion_tokens: u64, cached_tokens: u64) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens }),
        }
    }
}

/// Why generation stopped: `stop` (end of sequence or a stop string), `length`, or
/// `tool_calls` (the answer ended with calls for the client to run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
}

/// A whole chat answer (`object: chat.completion`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_transfer_params: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<FinishReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
}

/// The answer's message. `content` is null when the answer is only tool calls (OpenAI's
/// shape); `reasoning_content` is vLLM's and DeepSeek's field for a reasoning model's
/// thinking, apart from the answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AssistantMessage {
    pub role: String,
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One streamed piece of a chat answer (`object: chat.completion.chunk`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One choice of a streamed chunk; `logprobs` are those of this chunk's own tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: Delta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<FinishReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// One call of an assistant message's `tool_calls`: `{id, type: "function", function:
/// {name, arguments}}`, `arguments` being JSON text, as OpenAI sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: ToolCallType,
    pub function: FunctionCall,
}

/// The only tool type OpenAI's chat API defines for calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolCallType {
    Function,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

/// One entry of a streamed delta's `tool_calls`. The first delta of a call carries its
/// `index`, `id`, `type` and `function.name`; later ones the same `index` and more
/// `function.arguments` text, which the client appends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ToolCallType>,
    pub function: FunctionCallDelta,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FunctionCallDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

impl ToolCall {
    /// The whole call as one streamed delta, the `index`-th call of the answer.
    pub fn into_delta(self, index: u32) -> ToolCallDelta {
        ToolCallDelta {
            index,
            id: Some(self.id),
            kind: Some(self.kind),
            function: FunctionCallDelta {
                name: Some(self.function.name),
                arguments: Some(self.function.arguments),
            },
        }
    }
}

/// A whole or streamed completion answer (`object: text_completion`; OpenAI uses the
/// same object name for both).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Completion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_transfer_params: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<FinishReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
}

/// vLLM's `stop_reason` beside `finish_reason: stop`: the stop string or the stop token
/// id that ended the answer (vLLM `vllm/entrypoints/openai/protocol.py`,
/// `CompletionResponseChoice.stop_reason`; absent when the answer ended otherwise).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopReason {
    TokenId(u32),
    Text(String),
}

/// A chat choice's `logprobs` (OpenAI's `ChatCompletionTokenLogprob` list; vLLM
/// `ChatCompletionLogProbs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

/// One output token: its text, log probability, UTF-8 bytes, and the most likely tokens
/// at its position (`top_logprobs` of the request), most likely first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Option<Vec<u8>>,
}

/// A completion choice's `logprobs`, the legacy shape: parallel lists, one entry per
/// output token (vLLM `CompletionLogProbs`). `text_offset` is where each token starts in
/// the choice's text, in characters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f64>,
    #[schema(value_type = Vec<Object>)]
    pub top_logprobs: Vec<TokenLogprobMap>,
    pub text_offset: Vec<u64>,
}

/// `{token: logprob}` for the most likely tokens at one position, kept in the order
/// written (most likely first) where a JSON map would sort its keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenLogprobMap(pub Vec<(String, f64)>);

impl Serialize for TokenLogprobMap {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (token, logprob) in &self.0 {
            map.serialize_entry(token, logprob)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for TokenLogprobMap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = TokenLogprobMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of tokens to log probabilities")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(TokenLogprobMap(entries))
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelCard {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    /// vLLM reports the context length here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
}

impl ModelList {
    pub fn single(id: &str, created: u64, max_model_len: usize) -> Self {
        Self {
            object: "list".to_owned(),
            data: vec![ModelCard {
                id: id.to_owned(),
                object: "model".to_owned(),
                created,
                owned_by: "dynamo".to_owned(),
                max_model_len: Some(max_model_len as u64),
            }],
        }
    }
}

/// One Server-Sent Events frame as OpenAI streams them: `data: <json>\n\n`.
pub fn sse_data(json: &impl Serialize) -> String {
    let body = serde_json::to_string(json).expect("API types serialize");
    format!("data: {body}\n\n")
}

/// The frame that ends an OpenAI stream.
pub const SSE_DONE: &str = "data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_request_keeps_fields_it_does_not_interpret() {
        let body = json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi", "name": "ann"}],
            "max_tokens": 8,
            "stream": true,
            "stream_options": {"include_usage": true},
            "logprobs": true,
            "nvext": {"agent_hints": {"priority": 2}},
        });
        let req: ChatCompletionRequest = parse_body(body.to_string().as_bytes()).unwrap();
        assert_eq!(req.params.max_tokens, Some(8));
        assert!(req.params.stream);
        assert_eq!(req.other.get("logprobs"), Some(&json!(true)));
        assert_eq!(req.messages[0].other.get("name"), Some(&json!("ann")));
        assert_eq!(serde_json::to_value(&req).unwrap(), body);
    }

    #[test]
    fn completion_prompt_is_text_tokens_or_a_batch() {
        let text: CompletionRequest = parse_body(br#"{"model":"m","prompt":"hello"}"#).unwrap();
        assert_eq!(text.prompt, Prompt::Text("hello".into()));
        let tokens: CompletionRequest = parse_body(br#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(tokens.prompt, Prompt::Tokens(vec![1, 2, 3]));
        let batch: CompletionRequest = parse_body(br#"{"model":"m","prompt":["a","b"]}"#).unwrap();
        assert!(matches!(batch.prompt, Prompt::Batch(_)));
    }

    #[test]
    fn malformed_json_and_missing_fields_are_400s() {
        let err = parse_body::<ChatCompletionRequest>(b"{not json").unwrap_err();
        assert_eq!(err.status.as_u16(), 400);
        let err = parse_body::<ChatCompletionRequest>(br#"{"model":"m"}"#).unwrap_err();
        assert!(err.message.contains("messages"), "{}", err.message);
    }

    #[test]
    fn tool_calls_have_openai_shapes() {
        let call = ToolCall {
            id: "call_1".into(),
            kind: ToolCallType::Function,
            function: FunctionCall {
                name: "f".into(),
                arguments: r#"{"a":1}"#.into(),
            },
        };
        assert_eq!(
            serde_json::to_value(&call).unwrap(),
            json!({"id": "call_1", "type": "function",
                   "function": {"name": "f", "arguments": "{\"a\":1}"}})
        );
        assert_eq!(
            serde_json::to_value(call.into_delta(2)).unwrap(),
            json!({"index": 2, "id": "call_1", "type": "function",
                   "function": {"name": "f", "arguments": "{\"a\":1}"}})
        );
        // A later delta of a call: only the index and more arguments.
        let more: ToolCallDelta =
            serde_json::from_value(json!({"index": 0, "function": {"arguments": "}"}})).unwrap();
        assert_eq!((more.id, more.kind, more.function.name), (None, None, None));
        assert_eq!(more.function.arguments.as_deref(), Some("}"));
    }

    #[test]
    fn logprobs_and_stop_reasons_have_vllms_shapes() {
        let top = TokenLogprobMap(vec![(" b".into(), -0.5), (" a".into(), -1.0)]);
        // Written in order, most likely first, though a JSON map would sort the keys.
        assert_eq!(
            serde_json::to_string(&top).unwrap(),
            r#"{" b":-0.5," a":-1.0}"#
        );
        let back: TokenLogprobMap = serde_json::from_str(r#"{" b":-0.5," a":-1.0}"#).unwrap();
        assert_eq!(back, top);
        let choice = CompletionChoice {
            text: " b".into(),
            logprobs: Some(CompletionLogprobs {
                tokens: vec![" b".into()],
                token_logprobs: vec![-0.5],
                top_logprobs: vec![top],
                text_offset: vec![0],
            }),
            finish_reason: Some(FinishReason::Stop),
            stop_reason: Some(StopReason::TokenId(7)),
            ..CompletionChoice::default()
        };
        let value = serde_json::to_value(&choice).unwrap();
        assert_eq!(value["stop_reason"], json!(7));
        assert_eq!(value["logprobs"]["text_offset"], json!([0]));
        let text = serde_json::to_string(&choice).unwrap();
        assert_eq!(
            serde_json::from_str::<CompletionChoice>(&text).unwrap(),
            choice
        );
        let text: StopReason = serde_json::from_value(json!("\n\n")).unwrap();
        assert_eq!(text, StopReason::Text("\n\n".into()));
        // Absent unless asked for or set.
        let plain = serde_json::to_value(ChatChunkChoice::default()).unwrap();
        assert!(plain.get("logprobs").is_none() && plain.get("stop_reason").is_none());
    }

    #[test]
    fn sse_frames_are_data_lines() {
        assert_eq!(sse_data(&json!({"a": 1})), "data: {\"a\":1}\n\n");
        assert_eq!(SSE_DONE, "data: [DONE]\n\n");
    }
}
