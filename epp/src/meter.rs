//! Measures a response as it streams past, without changing it: TTFT and the gaps
//! between tokens from the Server-Sent Events frames (one frame per token, as vLLM and
//! the mocker stream), OSL from the final `usage` when the engine sends one (else the
//! count of token frames), ISL from the router's own tokenization. A stream that ends
//! with an error event (the engine's, or the frontend's when a migration was not
//! possible) is counted as abandoned, like one cut off.
//!
//! Every frame of every streamed answer is read here and in [`crate::migration`], so a
//! frame is read into [`Chunk`]: the few fields they need, strings borrowed from the
//! frame, everything else skipped unparsed (a `serde_json::Value` would allocate a map
//! and a string for every field of every frame).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::metrics::histogram::Histogram;
use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::metrics::Metrics;

/// Bytes of a whole (non-streamed) answer kept to read its `usage`.
const MAX_KEPT_BODY: usize = 8 << 20;

/// One response's measurements; dropping it without [`ResponseMeter::finish`] counts the
/// request as abandoned (no duration, no OSL).
pub struct ResponseMeter {
    metrics: Arc<Metrics>,
    model: Vec<(&'static str, String)>,
    /// The model's TTFT and ITL histograms, looked up once rather than per token.
    ttft: Histogram,
    roundtrip_ttft: Histogram,
    itl: Histogram,
    started: Instant,
    /// When the request left for its pod.
    sent: Instant,
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
    /// A request of `prompt_tokens` tokens for `model` that arrived at `started` and left
    /// for its pod at `sent`.
    pub fn start(
        metrics: Arc<Metrics>,
        model: &str,
        prompt_tokens: usize,
        started: Instant,
        sent: Instant,
    ) -> Self {
        metrics.objective_started(model, prompt_tokens);
        let model = vec![("model", model.to_owned())];
        metrics
            .isl
            .get_or_create(&model)
            .observe(prompt_tokens as f64);
        metrics.inflight.get_or_create(&model).inc();
        let ttft = metrics.ttft.get_or_create(&model).clone();
        let roundtrip_ttft = metrics.roundtrip_ttft.get_or_create(&model).clone();
        let itl = metrics.itl.get_or_create(&model).clone();
        Self {
            ttft,
            roundtrip_ttft,
            itl,
            metrics,
            model,
            started,
            sent,
            sse: false,
            buffer: Vec::new(),
            last_token: None,
            token_frames: 0,
            usage_tokens: None,
            failed: false,
        }
    }

    fn model_name(&self) -> &str {
        &self.model[0].1
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
        // A chunk usually holds whole frames: read in place, only a cut frame is kept.
        if self.buffer.is_empty() {
            let read = self.frames(chunk);
            self.buffer.extend_from_slice(&chunk[read..]);
            return;
        }
        let mut buffer = std::mem::take(&mut self.buffer);
        buffer.extend_from_slice(chunk);
        let read = self.frames(&buffer);
        buffer.drain(..read);
        self.buffer = buffer;
    }

    /// Reads the whole frames at the start of `bytes`; how many bytes they took.
    fn frames(&mut self, bytes: &[u8]) -> usize {
        let mut start = 0;
        while let Some(len) = find_frame_end(&bytes[start..]) {
            self.on_frame(&bytes[start..start + len]);
            start += len;
        }
        start
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
            let read = read_chunk(data, |chunk| {
                let tokens = chunk.usage.0.as_ref().and_then(|u| u.completion_tokens.0);
                (chunk.error, chunk.choices.output, tokens)
            });
            let Some((error, output, usage_tokens)) = read else {
                continue;
            };
            self.failed |= error;
            if output {
                self.on_token(Instant::now());
            }
            if let Some(n) = usage_tokens {
                self.usage_tokens = Some(n);
            }
        }
    }

    fn on_token(&mut self, now: Instant) {
        match self.last_token {
            None => {
                self.ttft.observe((now - self.started).as_secs_f64());
                self.roundtrip_ttft.observe((now - self.sent).as_secs_f64());
            }
            Some(last) => self.itl.observe((now - last).as_secs_f64()),
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
        let seconds = self.started.elapsed().as_secs_f64();
        m.duration.get_or_create(&self.model).observe(seconds);
        m.objective_finished(self.model_name(), seconds, osl);
    }
}

impl Drop for ResponseMeter {
    fn drop(&mut self) {
        self.metrics.inflight.get_or_create(&self.model).dec();
        self.metrics.objective_ended(self.model_name());
    }
}

/// Length up to and including the blank line that ends the first frame (`\n\n` or
/// `\r\n\r\n`, whichever ends first), found in one pass.
pub(crate) fn find_frame_end(bytes: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = bytes[from..].iter().position(|&b| b == b'\n') {
        let lf = from + at;
        match &bytes[lf + 1..] {
            [b'\n', ..] => return Some(lf + 2),
            [b'\r', b'\n', ..] if lf > 0 && bytes[lf - 1] == b'\r' => return Some(lf + 3),
            _ => from = lf + 1,
        }
    }
    None
}

/// What the meter and migration read of an event (a chunk of an OpenAI stream, or an
/// error event), with the meaning `serde_json::Value`'s accessors give it: a field of
/// another JSON type than expected reads as absent, and of a key given twice the last
/// value counts. Anything else is skipped unparsed.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Chunk<'a> {
    /// An `error` key, whatever its value.
    #[serde(deserialize_with = "present")]
    pub error: bool,
    /// An `id` key, whatever its value.
    #[serde(deserialize_with = "present")]
    pub id: bool,
    #[serde(borrow)]
    pub choices: Choices<'a>,
    pub usage: Object<Usage>,
}

/// `choices` as far as they are read: the first choice (migration follows one), and
/// whether any carries output (the meter's token frames).
#[derive(Debug, Default)]
pub(crate) struct Choices<'a> {
    /// `None` when `choices` is not an array or is empty; a choice that is not an object
    /// reads as one with no field.
    pub first: Option<Choice<'a>>,
    /// Some choice has text (`delta.content` in chat, `text` in completions), reasoning
    /// or tool calls; vLLM's opening chunk with only the role does not.
    pub output: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Choice<'a> {
    #[serde(borrow)]
    pub text: Text<'a>,
    #[serde(borrow)]
    pub delta: Object<Delta<'a>>,
    /// Set and not `null`.
    #[serde(deserialize_with = "not_null")]
    pub finish_reason: bool,
}

impl Choice<'_> {
    fn carries_output(&self) -> bool {
        let delta = self.delta.0.as_ref();
        self.text.non_empty()
            || delta.is_some_and(|d| {
                d.content.non_empty() || d.reasoning_content.non_empty() || d.tool_calls.0.is_some()
            })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Delta<'a> {
    /// A `role` key, whatever its value.
    #[serde(deserialize_with = "present")]
    pub role: bool,
    #[serde(borrow)]
    pub content: Text<'a>,
    #[serde(borrow)]
    pub reasoning_content: Text<'a>,
    #[serde(borrow)]
    pub reasoning: Text<'a>,
    pub tool_calls: ArrayLen,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Usage {
    pub completion_tokens: Unsigned,
}

/// A string, borrowed from the frame unless it holds escapes; `None` for other types.
#[derive(Debug, Default)]
pub(crate) struct Text<'a>(pub Option<Cow<'a, str>>);

impl Text<'_> {
    pub fn non_empty(&self) -> bool {
        self.0.as_deref().is_some_and(|s| !s.is_empty())
    }
}

/// An object read as `T`; `None` for other types.
#[derive(Debug)]
pub(crate) struct Object<T>(pub Option<T>);

impl<T> Default for Object<T> {
    fn default() -> Self {
        Self(None)
    }
}

/// An array's length; `None` for other types.
#[derive(Debug, Default)]
pub(crate) struct ArrayLen(pub Option<usize>);

/// A non-negative integer; `None` for other types (`Value::as_u64`).
#[derive(Debug, Default)]
pub(crate) struct Unsigned(pub Option<u64>);

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    IgnoredAny::deserialize(d).map(|_| true)
}

fn not_null<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Option::<IgnoredAny>::deserialize(d).map(|v| v.is_some())
}

/// Visits any JSON value: what the type wants gives `Some`, anything else is skipped
/// and gives `None`. Each `visit_*` below is a type someone wants.
struct Lenient<T>(PhantomData<T>);

macro_rules! ignore_others {
    ($($visit:ident($t:ty)),*) => {
        $(fn $visit<E: de::Error>(self, _: $t) -> Result<Self::Value, E> {
            Ok(Default::default())
        })*
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
    };
}

impl<'de: 'a, 'a> Visitor<'de> for Lenient<Text<'a>> {
    type Value = Text<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'a>, E> {
        Ok(Text(Some(Cow::Borrowed(s))))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'a>, E> {
        Ok(Text(Some(Cow::Owned(s.to_owned()))))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Text<'a>, E> {
        Ok(Text(Some(Cow::Owned(s))))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Text<'a>, A::Error> {
        skip_seq(seq).map(|_| Text(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Text<'a>, A::Error> {
        skip_map(map).map(|_| Text(None))
    }
    ignore_others!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64)
    );
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Lenient<Object<T>> {
    type Value = Object<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(|t| Object(Some(t)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Object<T>, A::Error> {
        skip_seq(seq).map(|_| Object(None))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Object<T>, E> {
        Ok(Object(None))
    }
    ignore_others!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64)
    );
}

impl<'de> Visitor<'de> for Lenient<ArrayLen> {
    type Value = ArrayLen;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<ArrayLen, A::Error> {
        skip_seq(seq).map(|n| ArrayLen(Some(n)))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ArrayLen, A::Error> {
        skip_map(map).map(|_| ArrayLen(None))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<ArrayLen, E> {
        Ok(ArrayLen(None))
    }
    ignore_others!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64)
    );
}

impl<'de> Visitor<'de> for Lenient<Unsigned> {
    type Value = Unsigned;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Unsigned, E> {
        Ok(Unsigned(Some(n)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Unsigned, A::Error> {
        skip_seq(seq).map(|_| Unsigned(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Unsigned, A::Error> {
        skip_map(map).map(|_| Unsigned(None))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Unsigned, E> {
        Ok(Unsigned(None))
    }
    ignore_others!(visit_bool(bool), visit_i64(i64), visit_f64(f64));
}

impl<'de: 'a, 'a> Visitor<'de> for Lenient<Choices<'a>> {
    type Value = Choices<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Choices<'a>, A::Error> {
        let mut choices = Choices::default();
        while let Some(Object(choice)) = seq.next_element::<Object<Choice<'a>>>()? {
            let choice = choice.unwrap_or_default();
            choices.output |= choice.carries_output();
            choices.first.get_or_insert(choice);
        }
        Ok(choices)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Choices<'a>, A::Error> {
        skip_map(map).map(|_| Choices::default())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Choices<'a>, E> {
        Ok(Choices::default())
    }
    ignore_others!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64)
    );
}

fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<usize, A::Error> {
    let mut n = 0;
    while seq.next_element::<IgnoredAny>()?.is_some() {
        n += 1;
    }
    Ok(n)
}

fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

macro_rules! lenient {
    ($($t:ty),*) => {$(
        impl<'de: 'a, 'a> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(Lenient::<Self>(PhantomData))
            }
        }
    )*};
}

lenient!(Text<'a>, Choices<'a>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Self>(PhantomData))
    }
}

impl<'de> Deserialize<'de> for ArrayLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Self>(PhantomData))
    }
}

impl<'de> Deserialize<'de> for Unsigned {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Self>(PhantomData))
    }
}

/// Reads the event `data` (a frame's JSON) into a [`Chunk`] for `read`; `None` when it
/// is not a JSON object.
pub(crate) fn read_chunk<R>(data: &[u8], read: impl FnOnce(&Chunk<'_>) -> R) -> Option<R> {
    match serde_json::from_slice::<Object<Chunk>>(data) {
        Ok(Object(chunk)) => chunk.map(|chunk| read(&chunk)),
        // Not JSON, or a key given twice, which the derived reading refuses: through a
        // `Value` (where the last one counts) it reads as before.
        Err(_) => {
            let value: Value = serde_json::from_slice(data).ok()?;
            read_value(&value, read)
        }
    }
}

/// [`read_chunk`] of an event already parsed.
pub(crate) fn read_value<R>(event: &Value, read: impl FnOnce(&Chunk<'_>) -> R) -> Option<R> {
    match Object::<Chunk>::deserialize(event) {
        Ok(Object(chunk)) => chunk.map(|chunk| read(&chunk)),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn histogram_value<T: std::str::FromStr + Default>(text: &str, series: &str) -> T {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    }

    fn histogram_count(text: &str, name: &str) -> u64 {
        histogram_value(text, &format!("{name}_count"))
    }

    fn histogram_sum(text: &str, name: &str) -> f64 {
        histogram_value(text, &format!("{name}_sum"))
    }

    #[test]
    fn sse_frames_split_anywhere_are_counted_once() {
        let metrics = Arc::new(Metrics::new());
        // Arrived 300 ms before its first token, sent to its pod 30 ms before.
        let sent = Instant::now() - Duration::from_millis(30);
        let mut meter = ResponseMeter::start(
            metrics.clone(),
            "m",
            40,
            sent - Duration::from_millis(270),
            sent,
        );
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
        let ttft = histogram_sum(&text, "dynamo_frontend_time_to_first_token_seconds");
        let roundtrip = histogram_sum(&text, "dynamo_request_plane_roundtrip_ttft_seconds");
        assert!((0.3..0.5).contains(&ttft), "{ttft}");
        assert!((0.03..0.2).contains(&roundtrip), "{roundtrip}");
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
        let now = Instant::now();
        let mut meter = ResponseMeter::start(metrics.clone(), "m", 4, now, now);
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
    fn frame_ends_are_found_in_one_pass_as_by_two() {
        // The two-pass search this replaced: the first `\n\n` or `\r\n\r\n`.
        fn two_pass(bytes: &[u8]) -> Option<usize> {
            let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
            let crlf = bytes.windows(4).position(|w| w == b"\r\n\r\n");
            match (lf, crlf.map(|i| i + 4)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        // Every string of up to 8 bytes over `a`, `\r` and `\n`.
        let alphabet = [b'a', b'\r', b'\n'];
        let mut checked = 0;
        for len in 0..=8u32 {
            for mut n in 0..3usize.pow(len) {
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        let b = alphabet[n % 3];
                        n /= 3;
                        b
                    })
                    .collect();
                assert_eq!(find_frame_end(&bytes), two_pass(&bytes), "{bytes:?}");
                checked += 1;
            }
        }
        assert_eq!(checked, (0..=8).map(|l| 3usize.pow(l)).sum::<usize>());
    }

    /// Error, output, usage tokens, first choice's content, first choice finished.
    type Read = (bool, bool, Option<u64>, Option<String>, bool);

    /// What the meter read of an event before [`Chunk`]: through a `Value`.
    fn by_value(data: &str) -> Option<Read> {
        let event: Value = serde_json::from_str(data).ok()?;
        let non_empty = |v: &Value| v.as_str().is_some_and(|s| !s.is_empty());
        let output = event["choices"].as_array().is_some_and(|choices| {
            choices.iter().any(|c| {
                non_empty(&c["text"])
                    || non_empty(&c["delta"]["content"])
                    || non_empty(&c["delta"]["reasoning_content"])
                    || c["delta"]["tool_calls"].is_array()
            })
        });
        let first = event["choices"].as_array().and_then(|c| c.first());
        Some((
            event.get("error").is_some(),
            output,
            event["usage"]["completion_tokens"].as_u64(),
            first.and_then(|c| c["delta"]["content"].as_str().map(str::to_owned)),
            first.is_some_and(|c| !c["finish_reason"].is_null()),
        ))
    }

    fn by_chunk(data: &str) -> Option<Read> {
        read_chunk(data.as_bytes(), |c| {
            let first = c.choices.first.as_ref();
            (
                c.error,
                c.choices.output,
                c.usage.0.as_ref().and_then(|u| u.completion_tokens.0),
                first.and_then(|c| Some(c.delta.0.as_ref()?.content.0.as_deref()?.to_owned())),
                first.is_some_and(|c| c.finish_reason),
            )
        })
    }

    #[test]
    fn chunks_read_as_values_do_whatever_the_types() {
        let events = [
            r#"{"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"id":"a","choices":[{"index":0,"delta":{"content":" a\u00e9"},"logprobs":null}]}"#,
            r#"{"choices":[{"text":" c","finish_reason":"length"}],"usage":null}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":16}}"#,
            r#"{"error":{"message":"cut","code":502}}"#,
            r#"{"error":null}"#,
            r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":{}}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#,
            r#"{"choices":[{"delta":{"content":7}},{"text":" later"}]}"#,
            r#"{"choices":[5,{"delta":"x"},{"delta":null,"text":[1,{"a":2}]}]}"#,
            r#"{"choices":{"text":"x"},"usage":"many"}"#,
            r#"{"choices":"x","usage":{"completion_tokens":-1}}"#,
            r#"{"usage":{"completion_tokens":1.5}}"#,
            r#"{"usage":{"completion_tokens":[2]}}"#,
            r#"{"choices":[{"finish_reason":{}}]}"#,
            // A key given twice: the last one counts.
            r#"{"usage":{"completion_tokens":1},"usage":{"completion_tokens":2}}"#,
            r#"{"choices":[{"delta":{"content":" a","content":" b"}}]}"#,
            r#"[{"error":1}]"#,
            r#""data""#,
            "12",
            "null",
            "{not json",
        ];
        // An event that is not an object reads as nothing, as one with no field did.
        for event in events {
            let (chunk, value) = (by_chunk(event), by_value(event));
            assert_eq!(
                chunk.unwrap_or_default(),
                value.unwrap_or_default(),
                "{event}"
            );
        }
        // Without escapes the text is the frame's own bytes.
        let plain = r#"{"choices":[{"delta":{"content":" plain"}}]}"#;
        let borrowed = read_chunk(plain.as_bytes(), |c| {
            let delta = c.choices.first.as_ref().unwrap().delta.0.as_ref().unwrap();
            matches!(delta.content.0, Some(Cow::Borrowed(" plain")))
        });
        assert_eq!(borrowed, Some(true));
    }

    #[test]
    fn whole_answers_take_osl_from_usage() {
        let metrics = Arc::new(Metrics::new());
        let now = Instant::now();
        let mut meter = ResponseMeter::start(metrics.clone(), "m", 10, now, now);
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
