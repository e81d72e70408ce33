//! From an OpenAI request to what an engine or router acts on: checked parameters and
//! the prompt's token ids. Every client mistake becomes a 4xx naming the field.

use serde_json::Value;

use crate::agent_hints::AgentHints;
use crate::openai::{ChatCompletionRequest, CompletionRequest, Prompt, SamplingParams};
use crate::{ApiError, ModelDir};

/// Which API the request came through; it decides the shape of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// A request that passed every check, tokenized.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedRequest {
    pub endpoint: Endpoint,
    pub token_ids: Vec<u32>,
    /// Output tokens at most; the rest of the context when the client gave no limit
    /// (vLLM's default).
    pub max_tokens: u64,
    pub min_tokens: u64,
    pub stream: bool,
    pub include_usage: bool,
    pub seed: Option<u64>,
    pub ignore_eos: bool,
    /// Independent answers to the prompt (`n`), each `max_tokens` long at most.
    pub n: u32,
    /// `nvext.agent_hints` and `nvext.cache_control`.
    pub hints: AgentHints,
}

/// vLLM's chat options: render the conversation with the assistant turn opened for the
/// answer (default), or leave the final message open so that the model continues it (a
/// prefilled answer; request migration sends the answer so far this way).
pub const ADD_GENERATION_PROMPT: &str = "add_generation_prompt";
pub const CONTINUE_FINAL_MESSAGE: &str = "continue_final_message";

/// The most answers one request may ask for: OpenAI's bound on `n` (its API reference,
/// chat `create`: "minimum 1, maximum 128"; vLLM's own, `VLLM_MAX_N_SEQUENCES`, is far
/// higher and meant for offline sampling).
pub const MAX_N: i64 = 128;

/// The `nvext` field of a chat request's pre-tokenized prompt (Dynamo's name).
pub const TOKEN_DATA: &str = "token_data";

/// Roles a chat template is written for (OpenAI's message roles).
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

impl ModelDir {
    /// Checks a chat request, renders the chat template and tokenizes the result.
    pub fn prepare_chat(&self, req: &ChatCompletionRequest) -> Result<PreparedRequest, ApiError> {
        self.check_model(&req.model)?;
        if req.messages.is_empty() {
            return Err(ApiError::bad_request(
                "messages must hold at least one message",
                Some("messages"),
            ));
        }
        let template = self.chat_template.as_ref().ok_or_else(|| {
            ApiError::bad_request(
                format!(
                    "The model `{}` has no chat template; use /v1/completions",
                    self.name
                ),
                None,
            )
        })?;
        let mut messages = Vec::with_capacity(req.messages.len());
        for (i, message) in req.messages.iter().enumerate() {
            if !ROLES.contains(&message.role.as_str()) {
                return Err(ApiError::bad_request(
                    format!(
                        "messages[{i}].role `{}` is not one of {}",
                        message.role,
                        ROLES.join(", ")
                    ),
                    Some("messages"),
                ));
            }
            let mut rendered = serde_json::to_value(message).expect("messages serialize");
            rendered["content"] = text_content(&message.content, i)?;
            messages.push(rendered);
        }
        let continue_final = chat_flag(req, CONTINUE_FINAL_MESSAGE, false)?;
        // vLLM's defaults, and its refusal of both (a client must turn the first off).
        let add_generation_prompt = chat_flag(req, ADD_GENERATION_PROMPT, true)?;
        if continue_final && add_generation_prompt {
            return Err(ApiError::bad_request(
                format!("{CONTINUE_FINAL_MESSAGE} and {ADD_GENERATION_PROMPT} cannot both be true"),
                Some(CONTINUE_FINAL_MESSAGE),
            ));
        }
        if let Some(token_ids) = self.token_data(&req.params)? {
            return self.finish(Endpoint::Chat, token_ids, &req.params, true);
        }
        let mut prompt = template.render(&messages, req.tools.as_ref(), add_generation_prompt)?;
        if continue_final {
            open_final_message(&mut prompt, &messages[messages.len() - 1]["content"])?;
        }
        let token_ids = self.tokenize_prompt(&prompt, &req.params, "messages")?;
        self.finish(Endpoint::Chat, token_ids, &req.params, true)
    }

    /// Dynamo's `nvext.token_data`: the prompt's token ids, rendered and tokenized by
    /// whoever sent them (the endpoint picker, which did it to route the request), used
    /// instead of rendering and tokenizing the messages again. Checked against the
    /// vocabulary; `None` when absent.
    fn token_data(&self, params: &SamplingParams) -> Result<Option<Vec<u32>>, ApiError> {
        let Some(data) = params.nvext.as_ref().and_then(|n| n.get(TOKEN_DATA)) else {
            return Ok(None);
        };
        let vocab = self.vocab_size() as u64;
        let ids = data.as_array().and_then(|ids| {
            ids.iter()
                .map(|id| id.as_u64().filter(|&id| id < vocab).map(|id| id as u32))
                .collect::<Option<Vec<u32>>>()
        });
        match ids {
            Some(ids) => Ok(Some(ids)),
            None => Err(ApiError::bad_request(
                format!(
                    "nvext.{TOKEN_DATA} must be a list of token ids from 0 to {}",
                    vocab - 1
                ),
                Some("nvext"),
            )),
        }
    }

    /// Checks a completion request and tokenizes its prompt.
    pub fn prepare_completion(&self, req: &CompletionRequest) -> Result<PreparedRequest, ApiError> {
        self.check_model(&req.model)?;
        let token_ids = match &req.prompt {
            Prompt::Text(text) => self.tokenize_prompt(text, &req.params, "prompt")?,
            Prompt::Tokens(ids) => {
                let vocab = self.vocab_size();
                if let Some((i, bad)) = ids
                    .iter()
                    .enumerate()
                    .find(|(_, id)| **id as usize >= vocab)
                {
                    return Err(token_id_error(i, bad, vocab));
                }
                ids.clone()
            }
            // Numbers that are not all u32: negative, fractional or too large token ids.
            Prompt::Batch(items) if items.iter().all(Value::is_number) => {
                let vocab = self.vocab_size();
                let (i, bad) = items
                    .iter()
                    .enumerate()
                    .find(|(_, id)| id.as_u64().is_none_or(|id| id >= vocab as u64))
                    .expect("numbers that all fit a u32 parse as token ids");
                return Err(token_id_error(i, bad, vocab));
            }
            Prompt::Batch(_) => {
                return Err(ApiError::bad_request(
                    "batched prompts are not supported; send one prompt per request",
                    Some("prompt"),
                ));
            }
        };
        self.finish(Endpoint::Completions, token_ids, &req.params, false)
    }

    /// Tokenizes a prompt text, first refusing a long one that cannot fit the context
    /// whatever it tokenizes to ([`ModelDir::min_tokens`]), at a fraction of tokenizing's
    /// cost. A short one is tokenized at once, so that its error gives the exact count.
    fn tokenize_prompt(
        &self,
        text: &str,
        params: &SamplingParams,
        param: &str,
    ) -> Result<Vec<u32>, ApiError> {
        // The output takes at least one token of the context.
        let output = output_limit(params).1.map_or(1, |n| n.max(1) as u64);
        let room = self.max_context.saturating_sub(output as usize);
        let at_least = if text.len() > room {
            self.min_tokens(text, room)
        } else {
            0
        };
        if at_least > room {
            let prompt = format!(
                "at least {at_least} prompt tokens (its {} bytes of text)",
                text.len()
            );
            return Err(ApiError::context_length_exceeded(
                &prompt,
                output,
                self.max_context,
                param,
            ));
        }
        Ok(self.encode(text))
    }

    fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if model == self.name {
            Ok(())
        } else {
            Err(ApiError::model_not_found(model))
        }
    }

    fn finish(
        &self,
        endpoint: Endpoint,
        token_ids: Vec<u32>,
        params: &SamplingParams,
        chat: bool,
    ) -> Result<PreparedRequest, ApiError> {
        let prompt_param = if chat { "messages" } else { "prompt" };
        if token_ids.is_empty() {
            return Err(ApiError::bad_request(
                "the prompt is empty",
                Some(prompt_param),
            ));
        }
        let n = match params.n {
            None => 1,
            Some(n) if (1..=MAX_N).contains(&n) => n as u32,
            Some(n) => {
                return Err(ApiError::bad_request(
                    format!("n must be between 1 and {MAX_N}, got {n}"),
                    Some("n"),
                ));
            }
        };
        if let Some(t) = params.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
            return Err(ApiError::bad_request(
                format!("temperature must be between 0 and 2, got {t}"),
                Some("temperature"),
            ));
        }
        if let Some(p) = params.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(ApiError::bad_request(
                format!("top_p must be in (0, 1], got {p}"),
                Some("top_p"),
            ));
        }
        let (limit_name, limit) = output_limit(params);
        let room = self.max_context.saturating_sub(token_ids.len()) as u64;
        let max_tokens = match limit {
            Some(n) if n < 1 => {
                return Err(ApiError::bad_request(
                    format!("{limit_name} must be at least 1, got {n}"),
                    Some(limit_name),
                ));
            }
            Some(n) => n as u64,
            None => room,
        };
        if max_tokens == 0 || max_tokens > room {
            return Err(ApiError::context_length_exceeded(
                &format!("{} prompt tokens", token_ids.len()),
                max_tokens.max(1),
                self.max_context,
                prompt_param,
            ));
        }
        let min_tokens = match params.min_tokens {
            None => 0,
            Some(n) if n < 0 || n as u64 > max_tokens => {
                return Err(ApiError::bad_request(
                    format!("min_tokens must be between 0 and {max_tokens}, got {n}"),
                    Some("min_tokens"),
                ));
            }
            Some(n) => n as u64,
        };
        let hints = AgentHints::from_nvext(params.nvext.as_ref())?;
        Ok(PreparedRequest {
            endpoint,
            token_ids,
            max_tokens,
            min_tokens,
            stream: params.stream,
            include_usage: params
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            seed: params.seed,
            ignore_eos: params.ignore_eos,
            n,
            hints,
        })
    }
}

/// A boolean chat option of vLLM's, `default` when absent.
fn chat_flag(req: &ChatCompletionRequest, name: &str, default: bool) -> Result<bool, ApiError> {
    match req.other.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(
            format!("{name} must be true or false"),
            Some(name),
        )),
    }
}

/// Cuts the rendered conversation right after the final message's text, dropping what the
/// template closes the turn with, as `transformers`' `apply_chat_template` does for
/// `continue_final_message` (templates that strip the text are matched stripped).
fn open_final_message(prompt: &mut String, content: &Value) -> Result<(), ApiError> {
    let text = content.as_str().unwrap_or_default();
    let end = [text, text.trim()]
        .into_iter()
        .find_map(|t| prompt.rfind(t).map(|at| at + t.len()))
        .ok_or_else(|| {
            ApiError::bad_request(
                "the chat template does not keep the final message's text, so it cannot \
                 be continued (continue_final_message)",
                Some(CONTINUE_FINAL_MESSAGE),
            )
        })?;
    prompt.truncate(end);
    Ok(())
}

/// 400 for `prompt[index]`, which is not a token id of a vocabulary of `vocab`.
fn token_id_error(index: usize, id: &dyn std::fmt::Display, vocab: usize) -> ApiError {
    ApiError::bad_request(
        format!(
            "prompt token ids must be integers from 0 to {} (the vocabulary size is \
             {vocab}); prompt[{index}] is {id}",
            vocab - 1
        ),
        Some("prompt"),
    )
}

/// The output limit the client set and its field: `max_completion_tokens` wins over
/// `max_tokens`.
fn output_limit(params: &SamplingParams) -> (&'static str, Option<i64>) {
    match (params.max_completion_tokens, params.max_tokens) {
        (Some(n), _) => ("max_completion_tokens", Some(n)),
        (None, n) => ("max_tokens", n),
    }
}

/// Message content as the text a chat template expects: a string as is, the text parts
/// of an array joined, null as empty (an assistant turn that only called tools).
fn text_content(content: &Value, index: usize) -> Result<Value, ApiError> {
    match content {
        Value::String(_) => Ok(content.clone()),
        Value::Null => Ok(Value::String(String::new())),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match (part["type"].as_str(), part["text"].as_str()) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::bad_request(
                            format!(
                                "messages[{index}].content: only text parts are supported, got {}",
                                kind.unwrap_or("a part without a type")
                            ),
                            Some("messages"),
                        ));
                    }
                }
            }
            Ok(Value::String(text))
        }
        _ => Err(ApiError::bad_request(
            format!("messages[{index}].content must be a string or an array of parts"),
            Some("messages"),
        )),
    }
}
