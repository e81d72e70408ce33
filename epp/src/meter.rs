//! Measures a response as it streams past, without changing it: TTFT and the gaps
//! between tokens from the Server-Sent Events frames (one frame per token, as vLLM and
//! the mocker stream), OSL from the final `usage` when the engine sends one (else the
//! count of token frames), ISL from the router's own tokenization. A stream that ends
//! with an error event (the engine's, or the frontend's when a migration was not
//! possible) is counted as abandoned, like one cut off.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use crate::metrics::Metrics;

/// Bytes of a whole (non-streamed) answer kept to read its `usage`.
const MAX_KEPT_BODY: usize = 8 << 20;

/// One response's measurements; dropping it without [`ResponseMeter::finish`] counts the
/// request as abandoned (no duration, no OSL).
pub struct ResponseMeter {
    metrics: Arc<Metrics>,
    model: Vec<(&'static str, String)>,
    started: Instant,
    sse: bool,
    /// SSE: bytes after the last complete frame. Otherwise: the body so far.
    buffer: Vec<u8>,
    last_token: Option<Instant>,
    token_frames: u64,
    usage_tokens: Option<u64>,
    /// An error event ended the stream.
    failed: bool,
}

impl ResponseMeter {
    /// A request of `prompt_tokens` tokens for `model` that arrived at `started`.
    pub fn start(
        metrics: Arc<Metrics>,
        model: &str,
        prompt_tokens: usize,
        started: Instant,
    ) -> Self {
        let model = vec![("model", model.to_owned())];
        metrics
            .isl
            .get_or_create(&model)
            .observe(prompt_tokens as f64);
        metrics.inflight.get_or_create(&model).inc();
        Self {
            metrics,
            model,
            started,
            sse: false,
            buffer: Vec::new(),
            last_token: None,
            token_frames: 0,
            usage_tokens: None,
            failed: false,
        }
    }

    /// Whether the answer is an event stream (from its `content-type`).
    pub fn set_content_type(&mut self, content_type: Option<&str>) {
        self.sse = content_type.is_some_and(|c| c.starts_with("text/event-stream"));
    }

    pub fn on_data(&mut self, chunk: &[u8]) {
        if !self.sse {
            if self.buffer.len() + chunk.len() <= MAX_KEPT_BODY {
                self.buffer.extend_from_slice(chunk);
            }
            return;
        }
        self.buffer.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(end) = find_frame_end(&self.buffer[start..]) {
            let frame = self.buffer[start..start + end].to_vec();
            self.on_frame(&frame);
            start += end;
        }
        self.buffer.drain(..start);
    }

    fn on_frame(&mut self, frame: &[u8]) {
        for line in frame.split(|&b| b == b'\n') {
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            let data = data.trim_ascii();
            if data == b"[DONE]" {
                continue;
            }
            let Ok(event) = serde_json::from_slice::<Value>(data) else {
                continue;
            };
            self.failed |= event.get("error").is_some();
            if carries_token(&event) {
                self.on_token(Instant::now());
            }
            if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
                self.usage_tokens = Some(n);
            }
        }
    }

    fn on_token(&mut self, now: Instant) {
        match self.last_token {
            None => self
                .metrics
                .ttft
                .get_or_create(&self.model)
                .observe((now - self.started).as_secs_f64()),
            Some(last) => self
                .metrics
                .itl
                .get_or_create(&self.model)
                .observe((now - last).as_secs_f64()),
        }
        self.last_token = Some(now);
        self.token_frames += 1;
    }

    /// The response ended: record its length and duration, unless an error event ended it.
    pub fn finish(mut self) {
        if self.failed {
            return;
        }
        if !self.sse {
            self.usage_tokens = serde_json::from_slice::<Value>(&self.buffer)
                .ok()
                .and_then(|v| v["usage"]["completion_tokens"].as_u64());
        }
        let osl = self.usage_tokens.unwrap_or(self.token_frames);
        let m = &self.metrics;
        m.osl.get_or_create(&self.model).observe(osl as f64);
        m.duration
            .get_or_create(&self.model)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for ResponseMeter {
    fn drop(&mut self) {
        self.metrics.inflight.get_or_create(&self.model).dec();
    }
}

/// Length up to and including the blank line that ends the first frame.
pub(crate) fn find_frame_end(bytes: &[u8]) -> Option<usize> {
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A chunk carries output when some choice has text (`delta.content` in chat, `text` in
/// completions), reasoning or tool calls; vLLM's opening chunk with only the role does not.
fn carries_token(event: &Value) -> bool {
    let non_empty = |v: &Value| v.as_str().is_some_and(|s| !s.is_empty());
    event["choices"].as_array().is_some_and(|choices| {
        choices.iter().any(|c| {
            non_empty(&c["text"])
                || non_empty(&c["delta"]["content"])
                || non_empty(&c["delta"]["reasoning_content"])
                || c["delta"]["tool_calls"].is_array()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram_count(text: &str, name: &str) -> u64 {
        text.lines()
            .find(|l| l.starts_with(&format!("{name}_count")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn sse_frames_split_anywhere_are_counted_once() {
        let metrics = Arc::new(Metrics::new());
        let mut meter = ResponseMeter::start(metrics.clone(), "m", 40, Instant::now());
        meter.set_content_type(Some("text/event-stream; charset=utf-8"));
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\" a\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\" b\"}}]}\n\n",
            "data: {\"choices\":[{\"text\":\" c\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\n",
            "data: [DONE]\n\n"
        );
        for piece in stream.as_bytes().chunks(7) {
            meter.on_data(piece);
        }
        assert_eq!(meter.token_frames, 3);
        meter.finish();
        let text = metrics.encode();
        assert_eq!(
            histogram_count(&text, "dynamo_frontend_time_to_first_token_seconds"),
            1
        );
        assert_eq!(
            histogram_count(&text, "dynamo_frontend_inter_token_latency_seconds"),
            2
        );
        assert!(
            text.contains("dynamo_frontend_output_sequence_tokens_sum{model=\"m\"} 3.0"),
            "{text}"
        );
        assert!(
            text.contains("dynamo_frontend_inflight_requests{model=\"m\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn a_stream_ended_by_an_error_event_is_not_counted_as_complete() {
        let metrics = Arc::new(Metrics::new());
        let mut meter = ResponseMeter::start(metrics.clone(), "m", 4, Instant::now());
        meter.set_content_type(Some("text/event-stream"));
        meter.on_data(b"data: {\"choices\":[{\"text\":\" a\"}]}\n\n");
        meter.on_data(b"data: {\"error\":{\"message\":\"cut\"}}\n\ndata: [DONE]\n\n");
        meter.finish();
        let text = metrics.encode();
        assert_eq!(
            histogram_count(&text, "dynamo_frontend_request_duration_seconds"),
            0
        );
        assert_eq!(
            histogram_count(&text, "dynamo_frontend_output_sequence_tokens"),
            0
        );
    }

    #[test]
    fn whole_answers_take_osl_from_usage() {
        let metrics = Arc::new(Metrics::new());
        let mut meter = ResponseMeter::start(metrics.clone(), "m", 10, Instant::now());
        meter.set_content_type(Some("application/json"));
        meter.on_data(br#"{"choices":[{"text":"x"}],"usage":{"completion_tokens":"#);
        meter.on_data(b"12}}");
        meter.finish();
        let text = metrics.encode();
        assert!(
            text.contains("dynamo_frontend_output_sequence_tokens_sum{model=\"m\"} 12.0"),
            "{text}"
        );
        assert_eq!(
            histogram_count(&text, "dynamo_frontend_time_to_first_token_seconds"),
            0
        );
    }
}
