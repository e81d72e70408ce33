//! One streamed OpenAI request, timed chunk by chunk.
//!
//! Completions send the prompt as token ids (OpenAI's `prompt` accepts an array of
//! integers; vLLM and the mocker take it as the prompt's tokens, so the engine sees
//! exactly the wanted tokens). Chat sends text: each token id becomes one of the model's
//! single-token words (a space and lower-case letters), which its tokenizer maps back to
//! one token each, plus the chat template's own tokens.
//!
//! Every request asks for vLLM's `ignore_eos`, so the answer has exactly `max_tokens`
//! tokens. [`send`] streams (`stream: true`, with `stream_options.include_usage`: the
//! last chunk carries `usage`, with `prompt_tokens_details.cached_tokens` when the engine
//! reports prefix-cache hits); [`send_whole`] asks for the whole answer at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use dynamo_llm::ModelDir;
use dynamo_llm::openai::Usage;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::workload::WorkItem;

/// Which OpenAI API to call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Api {
    /// `/v1/completions` with token-id prompts.
    Completions,
    /// `/v1/chat/completions` with word prompts.
    Chat,
}

/// The model's tokens that decode to a space and a lower-case word, e.g. `" cat"`.
#[derive(Clone, Debug)]
pub struct Words(Vec<String>);

impl Words {
    pub fn from_model(model: &ModelDir) -> anyhow::Result<Self> {
        let words: Vec<String> = (0..model.tokenizer.get_vocab_size(false) as u32)
            .map(|id| model.decode(&[id]))
            .filter(|piece| {
                piece
                    .strip_prefix(' ')
                    .is_some_and(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase()))
            })
            .collect();
        anyhow::ensure!(
            !words.is_empty(),
            "the tokenizer of {} has no word-like token",
            model.path.display()
        );
        Ok(Self(words))
    }

    /// The text standing for `token_ids`, one word per id.
    pub fn text(&self, token_ids: &[u32]) -> String {
        token_ids
            .iter()
            .map(|&t| self.0[t as usize % self.0.len()].as_str())
            .collect()
    }
}

/// Where and how requests go.
#[derive(Clone, Debug)]
pub struct Target {
    /// Base URL, e.g. `http://127.0.0.1:8000` (the `/v1/...` path is added).
    pub base_url: String,
    pub model: String,
    pub api: Api,
    /// Needed for [`Api::Chat`].
    pub words: Option<Arc<Words>>,
}

impl Target {
    fn url(&self) -> String {
        let path = match self.api {
            Api::Completions => "/v1/completions",
            Api::Chat => "/v1/chat/completions",
        };
        format!("{}{path}", self.base_url.trim_end_matches('/'))
    }

    fn body(&self, item: &WorkItem, stream: bool) -> anyhow::Result<Value> {
        let mut body = json!({
            "model": self.model,
            "max_tokens": item.max_tokens,
            "stream": stream,
            "ignore_eos": true,
        });
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        match self.api {
            Api::Completions => body["prompt"] = json!(item.token_ids),
            Api::Chat => {
                let words = self
                    .words
                    .as_ref()
                    .context("chat prompts need a tokenizer")?;
                body["messages"] =
                    json!([{"role": "user", "content": words.text(&item.token_ids)}]);
            }
        }
        Ok(body)
    }
}

/// What one request measured. Times are in ms.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestRecord {
    /// When it was sent, from the start of the run.
    pub sent_ms: f64,
    /// Sending to the first chunk with text.
    pub ttft_ms: Option<f64>,
    /// Gaps between successive chunks with text.
    pub itl_ms: Vec<f64>,
    /// Sending to the end of the stream.
    pub e2e_ms: f64,
    /// `usage.completion_tokens`, else the chunks with text.
    pub output_tokens: u64,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// Why the request failed (HTTP status and message, a broken stream, a timeout).
    pub error: Option<String>,
    /// Session and turn (0-based) of a conversation workload's request.
    pub session: Option<usize>,
    pub turn: Option<usize>,
}

impl RequestRecord {
    /// The mean gap between its chunks with text; `None` with fewer than two.
    pub fn mean_itl_ms(&self) -> Option<f64> {
        (!self.itl_ms.is_empty())
            .then(|| self.itl_ms.iter().sum::<f64>() / self.itl_ms.len() as f64)
    }
}

/// Sends `item` and reads its stream to the end; `run_start` dates `sent_ms`.
pub async fn send(
    http: &reqwest::Client,
    target: &Target,
    item: &WorkItem,
    run_start: Instant,
) -> RequestRecord {
    send_as(http, target, item, run_start, true).await
}

/// Sends `item` unstreamed and reads the whole answer: the record has no TTFT nor gaps,
/// and its output tokens are the answer's `usage.completion_tokens`.
pub async fn send_whole(
    http: &reqwest::Client,
    target: &Target,
    item: &WorkItem,
    run_start: Instant,
) -> RequestRecord {
    send_as(http, target, item, run_start, false).await
}

async fn send_as(
    http: &reqwest::Client,
    target: &Target,
    item: &WorkItem,
    run_start: Instant,
    stream: bool,
) -> RequestRecord {
    let sent = Instant::now();
    let mut record = RequestRecord {
        sent_ms: ms(sent - run_start),
        ..RequestRecord::default()
    };
    let exchanged = if stream {
        exchange(http, target, item, sent, &mut record).await
    } else {
        exchange_whole(http, target, item, &mut record).await
    };
    if let Err(e) = exchanged {
        record.error = Some(format!("{e:#}"));
    }
    record.e2e_ms = ms(sent.elapsed());
    record
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn exchange(
    http: &reqwest::Client,
    target: &Target,
    item: &WorkItem,
    sent: Instant,
    record: &mut RequestRecord,
) -> anyhow::Result<()> {
    let response = post(http, target, item, true).await?;
    let mut lines = SseLines::default();
    let mut body = response.bytes_stream();
    let (mut chunks, mut last, mut usage) = (0u64, None::<Instant>, None::<Usage>);
    while let Some(bytes) = body.next().await {
        lines.push(&bytes?);
        while let Some(line) = lines.next_line() {
            let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                continue; // comments, `event:` and `id:` fields, blank separators
            };
            if data == "[DONE]" {
                record.output_tokens = chunks;
                if let Some(usage) = usage {
                    record.output_tokens = usage.completion_tokens;
                    record.prompt_tokens = Some(usage.prompt_tokens);
                    record.cached_tokens = usage.prompt_tokens_details.map(|d| d.cached_tokens);
                }
                // Read on to the body's end (it ends right after `[DONE]`): a body
                // dropped before its end closes the connection, so every request would
                // pay for a new one, here and in the server measured.
                while let Some(Ok(_)) = body.next().await {}
                return Ok(());
            }
            let chunk: Value = serde_json::from_str(data)
                .with_context(|| format!("a stream chunk is not JSON: {data}"))?;
            if let Some(error) = chunk.get("error") {
                anyhow::bail!("error in the stream: {}", error_message(&error.to_string()));
            }
            if chunk_text(&chunk).is_some_and(|t| !t.is_empty()) {
                let now = Instant::now();
                match last {
                    None => record.ttft_ms = Some(ms(now - sent)),
                    Some(prev) => record.itl_ms.push(ms(now - prev)),
                }
                last = Some(now);
                chunks += 1;
            }
            if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
                usage = Some(
                    serde_json::from_value(u.clone())
                        .with_context(|| format!("bad usage in {data}"))?,
                );
            }
        }
    }
    anyhow::bail!("the stream ended without [DONE]")
}

/// Posts `item`; an answer other than 2xx is an error with its message.
async fn post(
    http: &reqwest::Client,
    target: &Target,
    item: &WorkItem,
    stream: bool,
) -> anyhow::Result<reqwest::Response> {
    let response = http
        .post(target.url())
        .json(&target.body(item, stream)?)
        .send()
        .await?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        anyhow::bail!("HTTP {}: {}", status.as_u16(), error_message(&body));
    }
    Ok(response)
}

async fn exchange_whole(
    http: &reqwest::Client,
    target: &Target,
    item: &WorkItem,
    record: &mut RequestRecord,
) -> anyhow::Result<()> {
    let body = post(http, target, item, false).await?.bytes().await?;
    #[derive(serde::Deserialize)]
    struct Whole {
        usage: Usage,
    }
    let whole: Whole = serde_json::from_slice(&body).with_context(|| {
        format!(
            "the answer has no usage: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )
    })?;
    record.output_tokens = whole.usage.completion_tokens;
    record.prompt_tokens = Some(whole.usage.prompt_tokens);
    record.cached_tokens = whole.usage.prompt_tokens_details.map(|d| d.cached_tokens);
    Ok(())
}

/// The text of a completion chunk (`choices[0].text`) or chat chunk
/// (`choices[0].delta.content`).
fn chunk_text(chunk: &Value) -> Option<&str> {
    let choice = chunk.get("choices")?.get(0)?;
    choice
        .get("text")
        .or_else(|| choice.get("delta")?.get("content"))?
        .as_str()
}

/// `error.message` of an OpenAI-style error body, else the body itself (shortened).
fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        let e = v.get("error").unwrap_or(v);
        e.get("message")?.as_str().map(str::to_owned)
    });
    message.unwrap_or_else(|| body.chars().take(200).collect())
}

/// Splits a byte stream into lines (SSE: `\n`, `\r\n` or `\r` end a line; chunks may
/// cut anywhere, even inside a UTF-8 character).
#[derive(Default)]
struct SseLines {
    buf: Vec<u8>,
}

impl SseLines {
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    fn next_line(&mut self) -> Option<String> {
        let end = self.buf.iter().position(|&b| b == b'\n' || b == b'\r')?;
        // A `\r` at the end of the buffer may be the first half of `\r\n`: wait.
        if self.buf[end] == b'\r' && end + 1 == self.buf.len() {
            return None;
        }
        let skip = if self.buf[end] == b'\r' && self.buf[end + 1] == b'\n' {
            2
        } else {
            1
        };
        let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end + skip);
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_lines_survive_any_split() {
        let stream = "data: {\"a\": \"é\"}\r\n\r\n: comment\rdata: [DONE]\n\n";
        let expected = ["data: {\"a\": \"é\"}", "", ": comment", "data: [DONE]", ""];
        let bytes = stream.as_bytes();
        for cut in 0..bytes.len() {
            let mut lines = SseLines::default();
            let mut got = Vec::new();
            for part in [&bytes[..cut], &bytes[cut..]] {
                lines.push(part);
                while let Some(l) = lines.next_line() {
                    got.push(l);
                }
            }
            assert_eq!(got, expected, "cut at {cut}");
        }
    }

    #[test]
    fn chunk_text_and_error_messages() {
        let completion = json!({"choices": [{"index": 0, "text": " hi"}]});
        let chat = json!({"choices": [{"delta": {"content": " yo"}}]});
        let role = json!({"choices": [{"delta": {"role": "assistant"}}]});
        let usage = json!({"choices": [], "usage": {}});
        assert_eq!(chunk_text(&completion), Some(" hi"));
        assert_eq!(chunk_text(&chat), Some(" yo"));
        assert_eq!((chunk_text(&role), chunk_text(&usage)), (None, None));
        let body = r#"{"error": {"message": "model x not found", "type": "NotFoundError"}}"#;
        assert_eq!(error_message(body), "model x not found");
        assert_eq!(error_message("Bad Gateway"), "Bad Gateway");
    }

    #[test]
    fn request_bodies() {
        let item = WorkItem {
            token_ids: vec![3, 1],
            max_tokens: 5,
        };
        let mut target = Target {
            base_url: "http://h:1/".into(),
            model: "m".into(),
            api: Api::Completions,
            words: None,
        };
        assert_eq!(target.url(), "http://h:1/v1/completions");
        let whole = target.body(&item, false).unwrap();
        assert_eq!(whole["stream"], json!(false));
        assert!(whole.get("stream_options").is_none(), "{whole}");
        let body = target.body(&item, true).unwrap();
        assert_eq!(body["stream"], json!(true));
        assert_eq!(body["prompt"], json!([3, 1]));
        assert_eq!(
            (body["max_tokens"].as_u64(), body["ignore_eos"].as_bool()),
            (Some(5), Some(true))
        );
        assert_eq!(body["stream_options"]["include_usage"], json!(true));
        target.api = Api::Chat;
        assert!(
            target.body(&item, true).is_err(),
            "chat needs the word list"
        );
        target.words = Some(Arc::new(Words(vec![" a".into(), " b".into(), " c".into()])));
        let body = target.body(&item, true).unwrap();
        assert_eq!(target.url(), "http://h:1/v1/chat/completions");
        assert_eq!(body["messages"][0]["content"], " a b");
    }
}
