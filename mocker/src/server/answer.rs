//! One request's answer: its `n` choices, each an engine request with a token stream of
//! its own, formatted whole or streamed the way vLLM's OpenAI server shapes them
//! (`vllm/entrypoints/openai/serving_chat.py`, `serving_completion.py`): choices indexed
//! `0..n`, usage counting the prompt once and every choice's tokens, `stop_reason`
//! beside `finish_reason`, logprobs per token.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Json, Response};
use dynamo_llm::openai::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatLogprobs, ChatTokenLogprob, Completion, CompletionChoice, CompletionLogprobs, Delta,
    FinishReason, PromptTokensDetails, SSE_DONE, StopReason, TokenLogprobMap, TopLogprob, Usage,
    sse_data,
};
use dynamo_llm::{ApiError, Endpoint, PreparedRequest};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tokio_stream::{StreamExt, StreamMap};

use super::engine_loop::GenEvent;
use super::http::{AppState, response_id, unix_now};
use super::model_output::Script;
use super::output_vocab::OutputVocab;
use super::sampling::{ChoiceText, Piece, Sampling, position_logprobs};
use crate::{FinishedRequest, RequestId};

/// The text of output token `index`, sampled by the engine as `token`: the one place
/// that decides what the mock engine says: the answer's script where it has one (the
/// reasoning and tool calls of the model it plays), else a word of the output
/// vocabulary per sampled token.
fn token_text<'a>(vocab: &'a OutputVocab, script: &'a Script, index: usize, token: u32) -> &'a str {
    script.piece(index).unwrap_or_else(|| vocab.piece(token))
}

/// How one choice is generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ChoicePlan {
    /// Its token stream's seed (`None`: the engine seeds it with its request id).
    pub seed: Option<u64>,
    pub max_tokens: usize,
    /// Reaching `max_tokens` is the answer's natural end (reported `stop`), not the
    /// client's limit.
    pub natural_stop: bool,
    /// Pin the prompt's blocks this long (`nvext.cache_control`).
    pub pin_ttl: Option<Duration>,
}

/// One output token as handed out.
struct OutToken {
    text: String,
    /// When asked: the token's logprob, then the most likely tokens' texts and logprobs.
    logprobs: Option<(f64, Vec<(String, f64)>)>,
}

struct Choice {
    plan: ChoicePlan,
    /// Keys its logprobs: its seed, or the engine request id that seeds its tokens.
    key: u64,
    text: ChoiceText<OutToken>,
    /// What a whole answer has collected.
    collected: Piece<OutToken>,
    /// Characters of token text handed out (completions' `text_offset`).
    offset: u64,
    end: Option<End>,
}

struct End {
    reason: FinishReason,
    stop_reason: Option<StopReason>,
    completion_tokens: usize,
    /// Prompt tokens the engine served from its prefix cache. Unknown for a choice cut
    /// at a stop: its engine request is dropped before the engine reports.
    cached: Option<usize>,
    /// The engine generated all of `max_tokens` (a prefill lends its blocks only then).
    engine_finished: bool,
}

/// What one choice handed out, and whether that ended it.
struct Step {
    index: u32,
    piece: Piece<OutToken>,
    ended: bool,
}

pub(super) struct Answer {
    state: Arc<AppState>,
    endpoint: Endpoint,
    id: String,
    created: u64,
    include_usage: bool,
    sampling: Sampling,
    min_tokens: usize,
    prompt: Vec<u32>,
    /// The lease to lend the prompt's blocks under once prefilled.
    lend: Option<String>,
    choices: Vec<Choice>,
    events: StreamMap<u32, UnboundedReceiverStream<GenEvent>>,
    /// An event has come from the engine: the first one opens a stream even when its
    /// text is held back.
    heard: bool,
    /// A stream has sent its opening chunks.
    opened: bool,
    /// What every choice says first (the same for all).
    script: Script,
}

impl Answer {
    /// The answer to `req`, whose choices were submitted as `submitted`, in order.
    pub(super) fn new(
        state: Arc<AppState>,
        req: PreparedRequest,
        sampling: Sampling,
        plans: Vec<ChoicePlan>,
        submitted: Vec<(RequestId, mpsc::UnboundedReceiver<GenEvent>)>,
        lend: Option<String>,
        script: Script,
    ) -> Self {
        let choices = plans
            .into_iter()
            .zip(&submitted)
            .map(|(plan, &(id, _))| Choice {
                key: plan.seed.unwrap_or(id),
                plan,
                text: ChoiceText::default(),
                collected: Piece {
                    text: String::new(),
                    tokens: Vec::new(),
                },
                offset: 0,
                end: None,
            })
            .collect();
        let id = match req.endpoint {
            Endpoint::Chat => response_id("chatcmpl", state.id_salt, submitted[0].0),
            Endpoint::Completions => response_id("cmpl", state.id_salt, submitted[0].0),
        };
        let mut events = StreamMap::new();
        for (index, (_, receiver)) in submitted.into_iter().enumerate() {
            events.insert(index as u32, UnboundedReceiverStream::new(receiver));
        }
        Self {
            state,
            endpoint: req.endpoint,
            id,
            created: unix_now(),
            include_usage: req.include_usage,
            sampling,
            min_tokens: req.min_tokens as usize,
            prompt: req.token_ids,
            lend,
            choices,
            events,
            heard: false,
            opened: false,
            script,
        }
    }

    /// What a choice hands out next; `None` once every choice has ended.
    async fn next(&mut self) -> Option<Result<Step, ApiError>> {
        loop {
            let Some((index, event)) = self.events.next().await else {
                let complete = self.choices.iter().all(|c| c.end.is_some());
                return (!complete).then(|| {
                    Err(ApiError::unavailable(
                        "the engine stopped before the answer was complete",
                    ))
                });
            };
            let first = !std::mem::replace(&mut self.heard, true);
            let vocab = &self.state.vocab;
            let choice = &mut self.choices[index as usize];
            match event {
                GenEvent::Token(token) => {
                    let position = choice.text.generated();
                    let text = token_text(vocab, &self.script, position, token);
                    let logprobs = self.sampling.logprobs.map(|top| {
                        let p = position_logprobs(choice.key, position, token, top, vocab.len());
                        let top = p.top.into_iter().enumerate();
                        // The first is the sampled token, whose text is the answer's.
                        let top = top.map(|(i, (t, lp))| {
                            let t = if i == 0 { text } else { vocab.piece(t) };
                            (t.to_owned(), lp)
                        });
                        (p.logprob, top.collect())
                    });
                    let token_out = OutToken {
                        text: text.to_owned(),
                        logprobs,
                    };
                    let model_id = vocab.model_id(token);
                    let piece = choice.text.push(
                        &self.sampling,
                        self.min_tokens,
                        text,
                        model_id,
                        token_out,
                    );
                    if let Some(stop) = choice.text.stopped() {
                        choice.end = Some(End {
                            reason: FinishReason::Stop,
                            stop_reason: Some(stop.clone()),
                            completion_tokens: choice.text.generated(),
                            cached: None,
                            engine_finished: false,
                        });
                        // Its events dropped, the engine aborts the request when it next
                        // hands it a token, as for a client that left.
                        self.events.remove(&index);
                        return Some(Ok(Step {
                            index,
                            piece,
                            ended: true,
                        }));
                    }
                    // The first token opens a stream even when its text is held back.
                    if !piece.is_empty() || first {
                        return Some(Ok(Step {
                            index,
                            piece,
                            ended: false,
                        }));
                    }
                }
                GenEvent::Finished(done) => {
                    let piece = choice.text.finish();
                    choice.end = Some(End {
                        reason: finish_reason(&choice.plan, &done),
                        stop_reason: None,
                        completion_tokens: done.output_tokens,
                        cached: Some(done.cached_prompt_tokens),
                        engine_finished: done.reason == crate::FinishReason::Length,
                    });
                    return Some(Ok(Step {
                        index,
                        piece,
                        ended: true,
                    }));
                }
            }
        }
    }

    /// The prompt once, every choice's tokens; the cached part of the prompt is the most
    /// any choice found cached (the later choices find the first's blocks).
    fn usage(&self) -> Usage {
        let ends = self.choices.iter().filter_map(|c| c.end.as_ref());
        let completion_tokens = ends.clone().map(|e| e.completion_tokens as u64).sum();
        let prompt_tokens = self.prompt.len() as u64;
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: ends.filter_map(|e| e.cached).max().map(|c| {
                PromptTokensDetails {
                    cached_tokens: c as u64,
                }
            }),
        }
    }

    pub(super) async fn whole(mut self) -> Result<Response, ApiError> {
        while let Some(step) = self.next().await {
            let step = step?;
            let collected = &mut self.choices[step.index as usize].collected;
            collected.text.push_str(&step.piece.text);
            collected.tokens.extend(step.piece.tokens);
        }
        // Answered only once the blocks wait in the sidecar (or will not).
        let kv_transfer_params = match &self.lend {
            Some(lease)
                if self.choices[0]
                    .end
                    .as_ref()
                    .is_some_and(|e| e.engine_finished) =>
            {
                Some(self.state.disagg.lend(lease, &self.prompt).await)
            }
            Some(_) => Some(Value::Null),
            None => None,
        };
        let usage = self.usage();
        let model = self.state.model.name.clone();
        let asked_logprobs = self.sampling.logprobs.is_some();
        let choices = self.choices.into_iter().enumerate().map(|(index, c)| {
            let end = c.end.expect("every choice has ended");
            (index as u32, c.collected, end)
        });
        // Serialized as typed (a `Value` would sort the keys of completions' top maps).
        Ok(match self.endpoint {
            Endpoint::Chat => Json(ChatCompletion {
                id: self.id,
                object: "chat.completion".into(),
                created: self.created,
                model,
                choices: choices
                    .map(|(index, collected, end)| ChatChoice {
                        index,
                        message: AssistantMessage {
                            role: "assistant".into(),
                            content: Some(collected.text),
                            ..AssistantMessage::default()
                        },
                        logprobs: asked_logprobs.then(|| chat_logprobs(&collected.tokens)),
                        finish_reason: Some(end.reason),
                        stop_reason: end.stop_reason,
                    })
                    .collect(),
                usage,
                kv_transfer_params,
            })
            .into_response(),
            Endpoint::Completions => Json(Completion {
                id: self.id,
                object: "text_completion".into(),
                created: self.created,
                model,
                choices: choices
                    .map(|(index, collected, end)| CompletionChoice {
                        index,
                        text: collected.text,
                        logprobs: asked_logprobs
                            .then(|| completion_logprobs(&collected.tokens, &mut 0)),
                        finish_reason: Some(end.reason),
                        stop_reason: end.stop_reason,
                    })
                    .collect(),
                usage: Some(usage),
                kv_transfer_params,
            })
            .into_response(),
        })
    }

    /// SSE: chunks as the choices hand out text, interleaved, each naming its choice.
    /// A client that leaves closes the frames' channel; the task then drops the answer
    /// and with it the engine requests' receivers, and the engine aborts them.
    pub(super) fn stream(self) -> Response {
        let (frames, body) = mpsc::channel(16);
        tokio::spawn(self.send_frames(frames));
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from_stream(
                ReceiverStream::new(body).map(Ok::<String, Infallible>),
            ))
            .expect("static headers are valid")
    }

    async fn send_frames(mut self, frames: mpsc::Sender<String>) {
        loop {
            let step = tokio::select! {
                step = self.next() => step,
                () = frames.closed() => return,
            };
            let (out, last) = match step {
                Some(Ok(step)) => (self.step_frames(step), false),
                // vLLM's streams report a failure as a data frame, then end as usual.
                Some(Err(e)) => (format!("{}{SSE_DONE}", sse_data(&e.body())), true),
                None => {
                    let mut out = String::new();
                    if self.include_usage {
                        out.push_str(&self.usage_chunk(self.usage()));
                    }
                    out.push_str(SSE_DONE);
                    (out, true)
                }
            };
            if frames.send(out).await.is_err() || last {
                return;
            }
        }
    }

    fn step_frames(&mut self, step: Step) -> String {
        let mut out = String::new();
        if !self.opened {
            self.opened = true;
            // OpenAI (and vLLM, for each of the `n` choices) opens a chat stream with the
            // role alone.
            if self.endpoint == Endpoint::Chat {
                for index in 0..self.choices.len() as u32 {
                    out.push_str(&self.chat_frame(
                        vec![ChatChunkChoice {
                            index,
                            delta: Delta {
                                role: Some("assistant".into()),
                                content: Some(String::new()),
                                ..Delta::default()
                            },
                            ..ChatChunkChoice::default()
                        }],
                        None,
                    ));
                }
            }
        }
        if step.piece.is_empty() && !step.ended {
            return out;
        }
        let asked_logprobs = self.sampling.logprobs.is_some() && !step.piece.tokens.is_empty();
        let choice = &mut self.choices[step.index as usize];
        let (finish_reason, stop_reason) = match (&choice.end, step.ended) {
            (Some(end), true) => (Some(end.reason), end.stop_reason.clone()),
            _ => (None, None),
        };
        let text = step.piece.text;
        out.push_str(&match self.endpoint {
            Endpoint::Chat => {
                let logprobs = asked_logprobs.then(|| chat_logprobs(&step.piece.tokens));
                self.chat_frame(
                    vec![ChatChunkChoice {
                        index: step.index,
                        delta: Delta {
                            content: (!text.is_empty()).then_some(text),
                            ..Delta::default()
                        },
                        logprobs,
                        finish_reason,
                        stop_reason,
                    }],
                    None,
                )
            }
            Endpoint::Completions => {
                let logprobs = asked_logprobs
                    .then(|| completion_logprobs(&step.piece.tokens, &mut choice.offset));
                self.completion_frame(
                    vec![CompletionChoice {
                        index: step.index,
                        text,
                        logprobs,
                        finish_reason,
                        stop_reason,
                    }],
                    None,
                )
            }
        });
        out
    }

    /// OpenAI's last chunk when `stream_options.include_usage`: no choices, only usage.
    fn usage_chunk(&self, usage: Usage) -> String {
        match self.endpoint {
            Endpoint::Chat => self.chat_frame(vec![], Some(usage)),
            Endpoint::Completions => self.completion_frame(vec![], Some(usage)),
        }
    }

    fn chat_frame(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> String {
        sse_data(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.state.model.name.clone(),
            choices,
            usage,
        })
    }

    fn completion_frame(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> String {
        sse_data(&Completion {
            id: self.id.clone(),
            object: "text_completion".into(),
            created: self.created,
            model: self.state.model.name.clone(),
            choices,
            usage,
            kv_transfer_params: None,
        })
    }
}

fn finish_reason(plan: &ChoicePlan, done: &FinishedRequest) -> FinishReason {
    match done.reason {
        crate::FinishReason::Length if !plan.natural_stop => FinishReason::Length,
        _ => FinishReason::Stop,
    }
}

/// Chat's shape (vLLM `_create_chat_logprobs`): each token with its UTF-8 bytes and its
/// top list.
fn chat_logprobs(tokens: &[OutToken]) -> ChatLogprobs {
    let bytes = |t: &str| Some(t.as_bytes().to_vec());
    ChatLogprobs {
        content: tokens
            .iter()
            .filter_map(|t| {
                let (logprob, top) = t.logprobs.as_ref()?;
                Some(ChatTokenLogprob {
                    token: t.text.clone(),
                    logprob: *logprob,
                    bytes: bytes(&t.text),
                    top_logprobs: top
                        .iter()
                        .map(|(token, logprob)| TopLogprob {
                            token: token.clone(),
                            logprob: *logprob,
                            bytes: bytes(token),
                        })
                        .collect(),
                })
            })
            .collect(),
    }
}

/// Completions' shape (vLLM `_create_completion_logprobs`): parallel lists, each token's
/// `text_offset` counted in characters from `offset`, which moves past them.
fn completion_logprobs(tokens: &[OutToken], offset: &mut u64) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    for t in tokens {
        let Some((logprob, top)) = &t.logprobs else {
            continue;
        };
        out.tokens.push(t.text.clone());
        out.token_logprobs.push(*logprob);
        out.top_logprobs.push(TokenLogprobMap(top.clone()));
        out.text_offset.push(*offset);
        *offset += t.text.chars().count() as u64;
    }
    out
}
