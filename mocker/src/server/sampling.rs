//! What a request asks of its answers' text besides their length: stop strings and stop
//! token ids (an answer ends at one), and log probabilities. [`ChoiceText`] applies them
//! to one choice as its tokens arrive.

use dynamo_llm::openai::StopReason;
use dynamo_llm::{ApiError, Endpoint};
use serde_json::{Map, Value};

use crate::tokens::{splitmix64, token_at};

/// OpenAI's bound on `stop` (API reference, chat and completions: "Up to 4 sequences").
const MAX_STOP: usize = 4;

/// The most alternatives a token's logprobs list: vLLM's default `--max-logprobs` (20,
/// `ModelConfig.max_logprobs`, checked by the engine's `_validate_logprobs` for chat's
/// `top_logprobs` and completions' `logprobs` alike). OpenAI allows 20 in chat, 5 in
/// completions; the mock serves what vLLM serves.
const MAX_LOGPROBS: u64 = 20;

/// The request's `stop`, `stop_token_ids`, `include_stop_str_in_output` and logprobs
/// options, checked (vLLM `vllm/entrypoints/openai/protocol.py`, the requests'
/// `to_sampling_params`, and `vllm/sampling_params.py`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    pub stop: Vec<String>,
    /// Model token ids that end an answer (vLLM's extension).
    pub stop_token_ids: Vec<u32>,
    /// Keep the stop string at the end of the text (vLLM's extension; default false).
    pub include_stop_str_in_output: bool,
    /// Logprobs asked for: how many of the most likely tokens to list per token.
    pub logprobs: Option<usize>,
}

impl Sampling {
    /// Reads the options from the fields the OpenAI request types keep as `other`.
    pub fn from_request(endpoint: Endpoint, other: &Map<String, Value>) -> Result<Self, ApiError> {
        let get = |name: &str| other.get(name).filter(|v| !v.is_null());
        let stop = match get("stop") {
            None => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) if items.len() <= MAX_STOP => items
                .iter()
                .map(|s| s.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| stop_error("a list of strings"))?,
            Some(Value::Array(items)) => {
                return Err(stop_error(&format!(
                    "up to {MAX_STOP} strings, got {}",
                    items.len()
                )));
            }
            Some(_) => return Err(stop_error("a string or a list of strings")),
        };
        // vLLM's SamplingParams._verify_args: "stop cannot contain an empty string".
        if stop.iter().any(String::is_empty) {
            return Err(stop_error("non-empty strings"));
        }
        let stop_token_ids = match get("stop_token_ids") {
            None => Vec::new(),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "stop_token_ids must be a list of token ids",
                        Some("stop_token_ids"),
                    )
                })?,
            Some(_) => {
                return Err(ApiError::bad_request(
                    "stop_token_ids must be a list of token ids",
                    Some("stop_token_ids"),
                ));
            }
        };
        let include_stop_str_in_output = match get("include_stop_str_in_output") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::bad_request(
                    "include_stop_str_in_output must be true or false",
                    Some("include_stop_str_in_output"),
                ));
            }
        };
        let logprobs = match endpoint {
            Endpoint::Chat => chat_logprobs(get("logprobs"), get("top_logprobs"))?,
            // The sampled token is listed even with `logprobs: 0` (vLLM's
            // `_create_completion_logprobs` keeps the top `logprobs + 1` entries, the
            // sampled token's among them; here it is the most likely one).
            Endpoint::Completions => count("logprobs", get("logprobs"))?.map(|k| k.max(1)),
        };
        Ok(Self {
            stop,
            stop_token_ids,
            include_stop_str_in_output,
            logprobs,
        })
    }
}

fn stop_error(what: &str) -> ApiError {
    ApiError::bad_request(format!("stop must be {what}"), Some("stop"))
}

/// Chat: `logprobs: true`, and optionally `top_logprobs` alternatives per token, which
/// OpenAI accepts only with `logprobs: true` (vLLM `ChatCompletionRequest.check_logprobs`).
fn chat_logprobs(
    logprobs: Option<&Value>,
    top_logprobs: Option<&Value>,
) -> Result<Option<usize>, ApiError> {
    let on = match logprobs {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::bad_request(
                "logprobs must be true or false",
                Some("logprobs"),
            ));
        }
    };
    let top = count("top_logprobs", top_logprobs)?;
    match (on, top) {
        (false, Some(_)) => Err(ApiError::bad_request(
            "top_logprobs requires logprobs to be true",
            Some("top_logprobs"),
        )),
        (false, None) => Ok(None),
        (true, top) => Ok(Some(top.unwrap_or(0))),
    }
}

/// A count of logprobs, `0..=MAX_LOGPROBS`.
fn count(name: &str, value: Option<&Value>) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) => match v.as_u64().filter(|&k| k <= MAX_LOGPROBS) {
            Some(k) => Ok(Some(k as usize)),
            None => Err(ApiError::bad_request(
                format!("{name} must be an integer from 0 to {MAX_LOGPROBS}, got {v}"),
                Some(name),
            )),
        },
    }
}

/// The log probabilities at one output position.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionLogprobs {
    /// The sampled token's.
    pub logprob: f64,
    /// The most likely tokens (output vocabulary indices), most likely first: the sampled
    /// token, then distinct others, each less likely than the one before.
    pub top: Vec<(u32, f64)>,
}

/// Logprobs of output token `index`, sampled as `token`, of the choice whose token stream
/// is keyed `key`: SplitMix64 of the three (so a repeated request gets the same values),
/// the sampled token in (-1.5, 0], each alternative 0.05 to 2.05 below the one before,
/// `top` entries at most (the vocabulary permitting).
pub fn position_logprobs(
    key: u64,
    index: usize,
    token: u32,
    top: usize,
    vocab_size: u32,
) -> PositionLogprobs {
    let unit = |x: u64| (x >> 11) as f64 / (1u64 << 53) as f64;
    let h = splitmix64(key ^ splitmix64(((index as u64) << 32) | u64::from(token)));
    let logprob = -1.5 * unit(h);
    let want = top.min(vocab_size as usize);
    let mut list = Vec::with_capacity(want);
    if want > 0 {
        list.push((token, logprob));
    }
    let (mut last, mut draw) = (logprob, 0u64);
    while list.len() < want {
        draw += 1;
        let alt = token_at(h, draw, vocab_size);
        if list.iter().all(|&(t, _)| t != alt) {
            last -= 0.05 + 2.0 * unit(splitmix64(h ^ draw));
            list.push((alt, last));
        }
    }
    PositionLogprobs { logprob, top: list }
}

/// Text and tokens a choice hands out at once.
#[derive(Debug, PartialEq)]
pub struct Piece<T> {
    pub text: String,
    pub tokens: Vec<T>,
}

impl<T> Piece<T> {
    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.tokens.is_empty()
    }
}

/// One choice's text as its tokens arrive. After each token it looks for a stop token
/// or a stop string (vLLM's detokenizer: `StopChecker.check_stop_strings`, searching
/// only where the new text can complete one, once more than `min_tokens` tokens were
/// generated); at one the text is cut before the stop string (or after it, with
/// `include_stop_str_in_output`) and the choice ends. Otherwise it hands out the tokens
/// whose text no stop string can still cut: a suffix that may begin one is held back
/// until the next tokens say whether it does (vLLM holds back the longest stop string's
/// length less one character; holding only a true prefix streams sooner and never more).
/// Where several stop strings appear in the new text, the earliest ends the answer.
/// `T` is what the caller keeps of each token (its logprobs).
#[derive(Debug)]
pub struct ChoiceText<T> {
    text: String,
    /// Bytes of `text` handed out.
    sent: usize,
    /// Tokens not handed out yet, each with where its text ends in `text`.
    pending: Vec<(usize, T)>,
    generated: usize,
    stopped: Option<StopReason>,
}

impl<T> Default for ChoiceText<T> {
    fn default() -> Self {
        Self {
            text: String::new(),
            sent: 0,
            pending: Vec::new(),
            generated: 0,
            stopped: None,
        }
    }
}

impl<T> ChoiceText<T> {
    /// Tokens received.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// What ended the choice, once a stop string or token did.
    pub fn stopped(&self) -> Option<&StopReason> {
        self.stopped.as_ref()
    }

    /// Takes the next token: `piece` is its text, `model_id` its id in the model's
    /// vocabulary. Returns what may be handed out now (everything left once stopped).
    pub fn push(
        &mut self,
        rules: &Sampling,
        min_tokens: usize,
        piece: &str,
        model_id: u32,
        token: T,
    ) -> Piece<T> {
        debug_assert!(self.stopped.is_none(), "a stopped choice takes no token");
        let before = self.text.len();
        self.text.push_str(piece);
        self.generated += 1;
        self.pending.push((self.text.len(), token));
        if self.generated > min_tokens {
            if rules.stop_token_ids.contains(&model_id) {
                // Its text stays: vLLM drops only special stop tokens' text
                // (`SamplingParams.stop_token_ids`), and output tokens are words here.
                self.stopped = Some(StopReason::TokenId(model_id));
            } else if let Some((at, stop)) = find_stop(&self.text, before, &rules.stop) {
                let end = if rules.include_stop_str_in_output {
                    at + stop.len()
                } else {
                    at
                };
                // What was handed out held no start of a stop string.
                debug_assert!(end >= self.sent, "a stop string cuts handed-out text");
                self.text.truncate(end);
                self.stopped = Some(StopReason::Text(stop.to_owned()));
            }
        }
        if self.stopped.is_some() {
            return self.finish();
        }
        // Included, a stop string's start can stream: the cut would fall after it.
        let held = if rules.include_stop_str_in_output {
            0
        } else {
            held_back(&self.text[self.sent..], &rules.stop)
        };
        let safe = self.text.len() - held;
        let ready = self
            .pending
            .iter()
            .take_while(|(end, _)| *end <= safe)
            .count();
        let Some(&(upto, _)) = ready.checked_sub(1).and_then(|last| self.pending.get(last)) else {
            return Piece {
                text: String::new(),
                tokens: Vec::new(),
            };
        };
        let text = self.text[self.sent..upto].to_owned();
        self.sent = upto;
        Piece {
            text,
            tokens: self.pending.drain(..ready).map(|(_, t)| t).collect(),
        }
    }

    /// Everything not handed out yet (the choice has ended).
    pub fn finish(&mut self) -> Piece<T> {
        let text = self.text[self.sent..].to_owned();
        self.sent = self.text.len();
        Piece {
            text,
            tokens: self.pending.drain(..).map(|(_, t)| t).collect(),
        }
    }
}

/// The earliest stop string in `text` that ends after byte `before` (where the new text
/// starts: one that ended before was either found then or came before `min_tokens`),
/// and where it starts.
fn find_stop<'s>(text: &str, before: usize, stops: &'s [String]) -> Option<(usize, &'s str)> {
    stops
        .iter()
        .filter_map(|stop| {
            // A match starts on a character boundary, so rounding up loses none.
            let mut from = before.saturating_sub(stop.len() - 1);
            while !text.is_char_boundary(from) {
                from += 1;
            }
            let at = from + text[from..].find(stop.as_str())?;
            Some((at, stop.as_str()))
        })
        .min_by_key(|&(at, _)| at)
}

/// Bytes at the end of `unsent` that may be the start of a stop string.
fn held_back(unsent: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .filter_map(|stop| {
            (1..stop.len().min(unsent.len() + 1))
                .rev()
                .find(|&k| stop.is_char_boundary(k) && unsent.ends_with(&stop[..k]))
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(stop: &[&str], include: bool) -> Sampling {
        Sampling {
            stop: stop.iter().map(|s| s.to_string()).collect(),
            include_stop_str_in_output: include,
            ..Sampling::default()
        }
    }

    /// Pushes `pieces` (token ids 0, 1, ...) and returns what each push handed out.
    fn feed(rules: &Sampling, pieces: &[&str]) -> (Vec<Piece<usize>>, ChoiceText<usize>) {
        let mut text = ChoiceText::default();
        let mut out = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            if text.stopped().is_some() {
                break;
            }
            out.push(text.push(rules, 0, p, 1000 + i as u32, i));
        }
        (out, text)
    }

    #[test]
    fn the_text_ends_before_the_stop_string_and_never_streams_what_is_cut() {
        let r = rules(&["cat sat"], false);
        let (out, text) = feed(&r, &[" the", " cat", " sat", " down"]);
        assert_eq!(out[0].text, " the");
        // " cat" may start the stop string: held back.
        assert_eq!(
            out[1],
            Piece {
                text: String::new(),
                tokens: vec![]
            }
        );
        // Completed: cut before it; the held token is handed out with the last one.
        assert_eq!(out[2].text, " ");
        assert_eq!(out[2].tokens, vec![1, 2]);
        assert_eq!(out.len(), 3, "no token after the stop");
        assert_eq!(text.stopped(), Some(&StopReason::Text("cat sat".into())));
        assert_eq!(text.generated(), 3);
    }

    #[test]
    fn a_held_prefix_that_turns_out_not_to_be_a_stop_string_is_released() {
        let r = rules(&["cat sat"], false);
        let (out, text) = feed(&r, &[" the", " cat", " ran"]);
        assert_eq!(out[1].text, "");
        assert_eq!(out[2].text, " cat ran");
        assert_eq!(out[2].tokens, vec![1, 2]);
        assert_eq!(text.stopped(), None);
    }

    #[test]
    fn include_stop_str_keeps_the_stop_string_and_cuts_after_it() {
        let r = rules(&["at"], true);
        let (out, text) = feed(&r, &[" the", " cattle", " x"]);
        assert_eq!(out[0].text, " the");
        assert_eq!(out[1].text, " cat");
        assert_eq!(out.len(), 2);
        assert_eq!(text.stopped(), Some(&StopReason::Text("at".into())));
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins_and_stop_tokens_end_too() {
        let r = rules(&["zebra", "b"], false);
        let (out, _) = feed(&r, &[" a", " b zebra"]);
        assert_eq!(out[1].text, " ");
        let r = Sampling {
            stop_token_ids: vec![1001],
            ..Sampling::default()
        };
        let (out, text) = feed(&r, &[" a", " b", " c"]);
        assert_eq!(out[1].text, " b", "a stop token's text stays");
        assert_eq!(text.stopped(), Some(&StopReason::TokenId(1001)));
    }

    #[test]
    fn no_stop_before_min_tokens() {
        let r = rules(&["b"], false);
        let mut text = ChoiceText::default();
        text.push(&r, 2, " b", 0, 0);
        assert_eq!(text.stopped(), None);
        text.push(&r, 2, " a", 0, 1);
        let last = text.push(&r, 2, " b", 0, 2);
        assert_eq!(text.stopped(), Some(&StopReason::Text("b".into())));
        assert_eq!(last.text, " ", "cut before the second b");
    }

    #[test]
    fn a_stop_string_written_before_min_tokens_does_not_end_the_answer_later() {
        let r = rules(&["b", "xxxxx"], false);
        let mut text = ChoiceText::default();
        assert_eq!(text.push(&r, 1, " b", 0, 0).text, " b");
        assert_eq!(text.push(&r, 1, " q", 0, 1).text, " q");
        assert_eq!(text.stopped(), None);
        assert_eq!(text.push(&r, 1, " ab", 0, 2).text, " a");
        assert_eq!(text.stopped(), Some(&StopReason::Text("b".into())));
    }

    #[test]
    fn logprobs_are_deterministic_negative_and_descending_over_distinct_tokens() {
        let a = position_logprobs(7, 3, 42, 5, 1000);
        assert_eq!(a, position_logprobs(7, 3, 42, 5, 1000));
        assert_ne!(a, position_logprobs(8, 3, 42, 5, 1000));
        assert!(a.logprob <= 0.0);
        assert_eq!(a.top[0], (42, a.logprob));
        assert_eq!(a.top.len(), 5);
        assert!(
            a.top
                .windows(2)
                .all(|w| w[0].1 > w[1].1 && w[0].0 != w[1].0)
        );
        let ids: std::collections::BTreeSet<u32> = a.top.iter().map(|t| t.0).collect();
        assert_eq!(ids.len(), 5);
        assert!(position_logprobs(7, 3, 42, 0, 1000).top.is_empty());
        assert_eq!(position_logprobs(7, 3, 1, 20, 3).top.len(), 3);
    }

    #[test]
    fn options_are_checked_with_the_field_named() {
        let parse =
            |endpoint, body: Value| Sampling::from_request(endpoint, body.as_object().unwrap());
        let param = |endpoint, body: Value| parse(endpoint, body).unwrap_err().param.unwrap();
        for bad in [
            json!({"stop": 3}),
            json!({"stop": ""}),
            json!({"stop": ["a", ""]}),
            json!({"stop": ["a", "b", "c", "d", "e"]}),
            json!({"stop": [1]}),
        ] {
            assert_eq!(param(Endpoint::Chat, bad), "stop");
        }
        assert_eq!(
            param(Endpoint::Chat, json!({"top_logprobs": 2})),
            "top_logprobs"
        );
        assert_eq!(
            param(
                Endpoint::Chat,
                json!({"logprobs": true, "top_logprobs": 21})
            ),
            "top_logprobs"
        );
        assert_eq!(param(Endpoint::Chat, json!({"logprobs": 2})), "logprobs");
        assert_eq!(
            param(Endpoint::Completions, json!({"logprobs": true})),
            "logprobs"
        );
        assert_eq!(
            param(Endpoint::Completions, json!({"logprobs": -1})),
            "logprobs"
        );
        assert_eq!(
            param(Endpoint::Chat, json!({"stop_token_ids": [-1]})),
            "stop_token_ids"
        );

        let ok = parse(
            Endpoint::Chat,
            json!({"stop": "x", "logprobs": true, "stop_token_ids": [5]}),
        )
        .unwrap();
        assert_eq!(
            (ok.stop, ok.logprobs, ok.stop_token_ids),
            (vec!["x".into()], Some(0), vec![5])
        );
        let neutral = parse(
            Endpoint::Chat,
            json!({"stop": [], "logprobs": false, "top_logprobs": null}),
        );
        assert_eq!(neutral.unwrap(), Sampling::default());
        assert_eq!(
            parse(Endpoint::Completions, json!({"logprobs": 0}))
                .unwrap()
                .logprobs,
            Some(1)
        );
        assert_eq!(
            parse(Endpoint::Completions, json!({"logprobs": 3}))
                .unwrap()
                .logprobs,
            Some(3)
        );
    }
}
