//! The response object and its output items, as the API returns them (and `utoipa`
//! describes them).

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// A response's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    InProgress,
    Completed,
    /// The output limit was reached (`incomplete_details.reason: max_output_tokens`).
    Incomplete,
    /// The answer broke off (`error` says why).
    Failed,
}

/// An output item's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    InProgress,
    Completed,
    Incomplete,
}

/// One item of a response's `output`.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The model's thinking, as the reasoning parser split it off (one `reasoning_text`
    /// part; no summary).
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<Part>,
        status: ItemStatus,
    },
    /// The answer's text (one `output_text` part).
    Message {
        id: String,
        role: String,
        status: ItemStatus,
        content: Vec<Part>,
    },
    /// A call for the client to run; it sends the result back as `function_call_output`.
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        /// JSON text.
        arguments: String,
        status: ItemStatus,
    },
}

/// A content part of an output item.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    OutputText {
        text: String,
        annotations: Vec<Value>,
    },
    ReasoningText {
        text: String,
    },
}

impl Part {
    pub(super) fn text_mut(&mut self) -> &mut String {
        match self {
            Part::OutputText { text, .. } | Part::ReasoningText { text } => text,
        }
    }
}

impl OutputItem {
    pub(super) fn id(&self) -> &str {
        match self {
            OutputItem::Reasoning { id, .. }
            | OutputItem::Message { id, .. }
            | OutputItem::FunctionCall { id, .. } => id,
        }
    }

    pub(super) fn set_status(&mut self, to: ItemStatus) {
        match self {
            OutputItem::Reasoning { status, .. }
            | OutputItem::Message { status, .. }
            | OutputItem::FunctionCall { status, .. } => *status = to,
        }
    }
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: u64,
    pub input_tokens_details: InputTokensDetails,
    /// Reasoning included.
    pub output_tokens: u64,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct InputTokensDetails {
    /// Prompt tokens the engine found in its prefix cache (0 when it does not say).
    pub cached_tokens: u64,
    /// The others: an engine with prefix caching (vLLM's default) computes them and
    /// keeps them in its cache.
    pub cache_write_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct OutputTokensDetails {
    /// The reasoning text's tokens, by the model's tokenizer.
    pub reasoning_tokens: u64,
}

/// A response (`object: response`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ResponseObject {
    /// `resp_` and the chat answer's id.
    pub id: String,
    pub object: String,
    /// Unix seconds.
    pub created_at: u64,
    pub status: Status,
    /// `{code, message}` of a failed response.
    pub error: Option<Value>,
    /// `{reason: "max_output_tokens"}` of an incomplete one.
    pub incomplete_details: Option<Value>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub usage: Option<ResponseUsage>,
    /// The request's `instructions`, `tools`, `tool_choice`, `max_output_tokens`,
    /// `temperature`, `top_p`, `parallel_tool_calls`, `metadata` and `text`.
    #[serde(flatten)]
    pub settings: Map<String, Value>,
}
