//! Tool calls in a model's text, per model format, as OpenAI's `tool_calls`.
//!
//! Every format is a scanner over the text from where a call may start (a marker such as
//! `<tool_call>`, or for two formats the opening `{` or `[` of an output): it finds the
//! calls and how much text they take, or says the text cannot be calls, or that more text
//! is needed to tell. One loop ([`StreamingToolParser`]) drives the scanners for a whole
//! answer and for a stream alike, so both give the same content and calls whatever the
//! deltas; a scanner only answers "more text" while its answer could still change.
//!
//! Text that is not calls is passed on as content as soon as no marker can begin in it.
//! A call is passed on whole once its end is seen (a pending call is scanned again each
//! time the held text grew by an eighth, which keeps long calls linear). Whitespace next
//! to a call is dropped with it (the newlines around `<tool_call>` blocks), so an answer
//! of only calls has no content.

mod deepseek_v3;
mod hermes;
mod llama3_json;
mod mistral;
mod phi4;
mod pythonic;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use super::{UnknownParser, before_partial_marker};
use crate::openai::{FunctionCall, ToolCall, ToolCallDelta, ToolCallType};

/// A model family's tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallParser {
    Hermes,
    Mistral,
    Llama3Json,
    DeepseekV3,
    Pythonic,
    Phi4MiniJson,
}

impl ToolCallParser {
    /// Every format's main name, as [`ToolCallParser::from_name`] takes it.
    pub const NAMES: &[&str] = &[
        "hermes",
        "mistral",
        "llama3_json",
        "deepseek_v3",
        "pythonic",
        "phi4_mini_json",
    ];
}

/// The content and the calls of a whole answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedText {
    /// The text that is not calls; `None` when there is none.
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

/// One piece of a streamed answer, in the order of the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamDelta {
    Content(String),
    /// A whole call in one delta: index, id, type, name and all its arguments.
    ToolCall(ToolCallDelta),
}

impl ToolCallParser {
    /// vLLM's `--tool-call-parser` names: `hermes`, `mistral`, `llama3_json`,
    /// `deepseek_v3`, `pythonic`, `phi4_mini_json`; also vLLM's `llama4_json` (the same
    /// parser as `llama3_json`), its older `deepseekv3`, and `phi4`.
    pub fn from_name(name: &str) -> Result<Self, UnknownParser> {
        Ok(match name {
            "hermes" => Self::Hermes,
            "mistral" => Self::Mistral,
            "llama3_json" | "llama4_json" => Self::Llama3Json,
            "deepseek_v3" | "deepseekv3" => Self::DeepseekV3,
            "pythonic" => Self::Pythonic,
            "phi4_mini_json" | "phi4" => Self::Phi4MiniJson,
            _ => {
                return Err(UnknownParser {
                    name: name.to_owned(),
                    known: Self::NAMES,
                });
            }
        })
    }

    /// Splits a whole answer into content and calls.
    pub fn parse(&self, text: &str) -> ParsedText {
        let mut stream = self.streaming();
        stream.buf.push_str(text);
        let mut pieces = Vec::new();
        stream.drain(true, &mut pieces);
        let mut content = String::new();
        let mut tool_calls = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Text(text) => content.push_str(&text),
                Piece::Call(call) => tool_calls.push(self.with_id(call)),
            }
        }
        ParsedText {
            content: (!content.is_empty()).then_some(content),
            tool_calls,
        }
    }

    /// The calls as a model of this family writes them: each `(name, arguments)`, the
    /// arguments a JSON object. [`ToolCallParser::parse`] reads the text back to the same
    /// calls. The mock engine answers with it when it plays a tool-calling model.
    pub fn render(&self, calls: &[(String, Value)]) -> String {
        let object = |(name, arguments): &(String, Value), args: &str| {
            let mut call = serde_json::Map::new();
            call.insert("name".into(), name.clone().into());
            call.insert(args.into(), arguments.clone());
            Value::Object(call).to_string()
        };
        let each = |args: &'static str| calls.iter().map(move |c| object(c, args));
        match self {
            Self::Hermes => each("arguments")
                .map(|call| format!("{}\n{call}\n</tool_call>", hermes::START))
                .collect::<Vec<_>>()
                .join("\n"),
            Self::Mistral => format!(
                "{}[{}]",
                mistral::START,
                each("arguments").collect::<Vec<_>>().join(", ")
            ),
            Self::Llama3Json => each("parameters").collect::<Vec<_>>().join("; "),
            Self::DeepseekV3 => deepseek_v3::render(calls),
            Self::Pythonic => pythonic::render(calls),
            Self::Phi4MiniJson => format!(
                "{}[{}]",
                phi4::START,
                each("arguments").collect::<Vec<_>>().join(", ")
            ),
        }
    }

    /// A parser for one streamed answer, delta by delta.
    pub fn streaming(&self) -> StreamingToolParser {
        StreamingToolParser {
            format: *self,
            buf: String::new(),
            text_seen: false,
            after_call: false,
            calls: 0,
            rescan_at: 0,
        }
    }

    /// The literal markers a call may start at.
    fn markers(self) -> &'static [&'static str] {
        match self {
            Self::Hermes => &[hermes::START],
            Self::Mistral => &[mistral::START],
            Self::Llama3Json => &[llama3_json::START],
            Self::DeepseekV3 => &[deepseek_v3::START],
            Self::Pythonic => &[],
            Self::Phi4MiniJson => &[phi4::START],
        }
    }

    /// The character that starts calls when it opens the output.
    fn opening(self) -> Option<char> {
        match self {
            Self::Llama3Json => Some('{'),
            Self::Pythonic => Some('['),
            _ => None,
        }
    }

    /// Reads calls from `text`, which starts with a marker or the opening character.
    /// `eof`: no more text will come.
    fn scan(self, text: &str, eof: bool) -> Scan {
        match self {
            Self::Hermes => hermes::scan(text, eof),
            Self::Mistral => mistral::scan(text),
            Self::Llama3Json => llama3_json::scan(text, eof),
            Self::DeepseekV3 => deepseek_v3::scan(text, eof),
            Self::Pythonic => pythonic::scan(text),
            Self::Phi4MiniJson => phi4::scan(text),
        }
    }

    fn with_id(self, call: Call) -> ToolCall {
        let id = match self {
            // Mistral's chat templates refuse call ids other than 9 letters and digits when
            // the calls come back in the conversation (vLLM `MistralToolCall`).
            Self::Mistral => {
                const ALNUM: &[u8] =
                    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
                let mut n = random_u64();
                (0..9)
                    .map(|_| {
                        let c = ALNUM[(n % 62) as usize] as char;
                        n /= 62;
                        c
                    })
                    .collect()
            }
            _ => format!("call_{:016x}", random_u64()),
        };
        ToolCall {
            id,
            kind: ToolCallType::Function,
            function: FunctionCall {
                name: call.name,
                arguments: call.arguments,
            },
        }
    }
}

/// 64 unpredictable bits: std's per-process random hash keys over a counter, so call ids
/// differ across calls, threads and processes without a random-number crate.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Splits a streamed answer as it arrives; holds back only text that may still turn out
/// to be part of a call (a possible marker, a call not yet ended) and whitespace that a
/// call right after it would drop.
#[derive(Debug, Clone)]
pub struct StreamingToolParser {
    format: ToolCallParser,
    /// Text not yet passed on.
    buf: String,
    /// Content other than whitespace was passed on: calls can no longer open the output.
    text_seen: bool,
    /// A call just ended: whitespace after it goes with it.
    after_call: bool,
    /// Calls passed on so far: the next one's `index`.
    calls: u32,
    /// While a call is pending, the length `buf` must reach before it is scanned again.
    /// A scan reads the call from its start, so rescanning only once the held text grew
    /// by an eighth keeps a long call's cost linear in its length; its end is then seen
    /// up to that much text late, or when the answer ends.
    rescan_at: usize,
}

impl StreamingToolParser {
    /// Takes the next piece of the answer; returns what can be told apart now.
    pub fn push(&mut self, delta: &str) -> Vec<StreamDelta> {
        self.buf.push_str(delta);
        self.deltas(false)
    }

    /// The answer ended: returns what was still held back (a call that never ended is
    /// content).
    pub fn finish(&mut self) -> Vec<StreamDelta> {
        self.deltas(true)
    }

    fn deltas(&mut self, eof: bool) -> Vec<StreamDelta> {
        let mut pieces = Vec::new();
        self.drain(eof, &mut pieces);
        pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Text(text) => StreamDelta::Content(text),
                Piece::Call(call) => {
                    self.calls += 1;
                    StreamDelta::ToolCall(self.format.with_id(call).into_delta(self.calls - 1))
                }
            })
            .collect()
    }

    fn drain(&mut self, eof: bool, out: &mut Vec<Piece>) {
        loop {
            if self.after_call {
                self.buf
                    .drain(..self.buf.len() - self.buf.trim_start().len());
                if self.buf.is_empty() {
                    return;
                }
                self.after_call = false;
            }
            let Some((at, marker)) = self.find_start() else {
                let keep = if eof {
                    self.buf.len()
                } else {
                    let cut = before_partial_marker(&self.buf, self.format.markers());
                    cut - dropped_ws(&self.buf[..cut])
                };
                self.emit(keep, out);
                return;
            };
            // The whitespace before a call goes with it: hold it until the call parses.
            let text = at - dropped_ws(&self.buf[..at]);
            self.emit(text, out);
            let at = at - text;
            if !eof && self.buf.len() < self.rescan_at {
                return;
            }
            let scan = self.format.scan(&self.buf[at..], eof);
            self.rescan_at = 0;
            match scan {
                Ok((calls, len)) => {
                    out.extend(calls.into_iter().map(Piece::Call));
                    self.buf.drain(..at + len);
                    self.after_call = true;
                }
                Err(Stop::More) if !eof => {
                    self.rescan_at = self.buf.len() + (self.buf.len() / 8).max(16);
                    return;
                }
                // Not calls, or cut short: the marker is text, and the search goes on after it.
                Err(_) => self.emit(at + marker, out),
            }
        }
    }

    /// Where the first call may start in `buf`, and the length of its marker.
    fn find_start(&self) -> Option<(usize, usize)> {
        let marked = self
            .format
            .markers()
            .iter()
            .filter_map(|m| self.buf.find(m).map(|at| (at, m.len())))
            .min();
        let opening = self
            .format
            .opening()
            .filter(|_| !self.text_seen)
            .and_then(|open| {
                let at = self.buf.len() - self.buf.trim_start().len();
                self.buf[at..]
                    .starts_with(open)
                    .then_some((at, open.len_utf8()))
            });
        marked.into_iter().chain(opening).min()
    }

    /// Passes on the first `len` bytes of `buf` as content.
    fn emit(&mut self, len: usize, out: &mut Vec<Piece>) {
        if len == 0 {
            return;
        }
        let text: String = self.buf.drain(..len).collect();
        self.text_seen |= !text.trim_start().is_empty();
        match out.last_mut() {
            Some(Piece::Text(last)) => last.push_str(&text),
            _ => out.push(Piece::Text(text)),
        }
    }
}

enum Piece {
    Text(String),
    Call(Call),
}

/// A call as the model wrote it, before it gets an id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    name: String,
    /// Compact JSON text of an object.
    arguments: String,
}

/// A scanner's answer: the calls and the bytes of text they take.
type Scan = Result<(Vec<Call>, usize), Stop>;

/// Why a scanner found no calls (yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The text ends where calls could still go on.
    More,
    /// The text is not calls.
    Text,
}

/// The whitespace at the end of `text` that a call right after it takes along: ASCII
/// whitespace, at most 32 bytes, so a long run (a model repeating newlines) is passed on
/// rather than held and searched again on every delta.
fn dropped_ws(text: &str) -> usize {
    text.bytes()
        .rev()
        .take(32)
        .take_while(u8::is_ascii_whitespace)
        .count()
}

/// Bytes of whitespace `text` starts with.
fn ws(text: &str) -> usize {
    text.len() - text.trim_start().len()
}

/// The length of `token` if `text` starts with it.
fn expect(text: &str, token: &str) -> Result<usize, Stop> {
    if text.starts_with(token) {
        Ok(token.len())
    } else if token.starts_with(text) {
        Err(Stop::More)
    } else {
        Err(Stop::Text)
    }
}

/// The JSON object or array `text` starts with, and its length. Its end is found by
/// counting brackets outside strings, so a cut-short value is told from a bad one
/// exactly, whatever the JSON parser would say about a truncated number or escape.
fn json_at(text: &str) -> Result<(Value, usize), Stop> {
    match text.bytes().next() {
        Some(b'{' | b'[') => {}
        Some(_) => return Err(Stop::Text),
        None => return Err(Stop::More),
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, b) in text.bytes().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    let value = serde_json::from_str(&text[..=i]).map_err(|_| Stop::Text)?;
                    return Ok((value, i + 1));
                }
            }
            _ => {}
        }
    }
    Err(Stop::More)
}

/// A call written as a JSON object `{"name": ..., "arguments": {...}}` (or
/// `"parameters"`, Llama's word) at the start of `text`, and its length.
fn json_call(text: &str) -> Result<(Call, usize), Stop> {
    let (value, len) = json_at(text)?;
    Ok((call_of(value).ok_or(Stop::Text)?, len))
}

/// A JSON array of one or more call objects.
fn json_calls(text: &str) -> Result<(Vec<Call>, usize), Stop> {
    let (value, len) = json_at(text)?;
    match value {
        Value::Array(items) if !items.is_empty() => {
            let calls = items.into_iter().map(call_of).collect::<Option<_>>();
            Ok((calls.ok_or(Stop::Text)?, len))
        }
        _ => Err(Stop::Text),
    }
}

fn call_of(value: Value) -> Option<Call> {
    let Value::Object(mut fields) = value else {
        return None;
    };
    let Some(Value::String(name)) = fields.remove("name") else {
        return None;
    };
    let arguments = fields
        .remove("arguments")
        .or_else(|| fields.remove("parameters"))?;
    (!name.is_empty() && arguments.is_object()).then(|| Call {
        name,
        arguments: arguments.to_string(),
    })
}

/// A JSON object of arguments at the start of `text`, as compact JSON text, and its length.
fn arguments_at(text: &str) -> Result<(String, usize), Stop> {
    match json_at(text)? {
        (arguments @ Value::Object(_), len) => Ok((arguments.to_string(), len)),
        _ => Err(Stop::Text),
    }
}

/// A function name (OpenAI's `[a-zA-Z0-9_-]`) at the start of `text`: `More` if the text
/// ends inside it.
fn name_at(text: &str) -> Result<&str, Stop> {
    let len = text
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
        .count();
    match len {
        _ if len == text.len() => Err(Stop::More),
        0 => Err(Stop::Text),
        _ => Ok(&text[..len]),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::parsers::chunked;
    use proptest::prelude::*;

    /// The content and the calls (name and arguments, ids aside) a stream fed `chunks`
    /// gives.
    fn streamed(format: ToolCallParser, chunks: &[String]) -> (String, Vec<(String, Value)>) {
        let mut stream = format.streaming();
        let mut deltas: Vec<StreamDelta> = chunks.iter().flat_map(|c| stream.push(c)).collect();
        deltas.extend(stream.finish());
        let mut content = String::new();
        let mut calls = Vec::new();
        for delta in deltas {
            match delta {
                StreamDelta::Content(text) => content += &text,
                StreamDelta::ToolCall(call) => {
                    assert_eq!(call.index as usize, calls.len());
                    let function = call.function;
                    let arguments = serde_json::from_str(&function.arguments.unwrap()).unwrap();
                    calls.push((function.name.unwrap(), arguments));
                }
            }
        }
        (content, calls)
    }

    fn whole(parsed: &ParsedText) -> (String, Vec<(String, Value)>) {
        let calls = parsed.tool_calls.iter().map(|c| {
            (
                c.function.name.clone(),
                serde_json::from_str(&c.function.arguments).unwrap(),
            )
        });
        (parsed.content.clone().unwrap_or_default(), calls.collect())
    }

    /// Parses `text` whole, and checks that streaming it one character at a time gives
    /// the same.
    pub(crate) fn parse(format: ToolCallParser, text: &str) -> ParsedText {
        let parsed = format.parse(text);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        assert_eq!(streamed(format, &chars), whole(&parsed), "{text:?}");
        parsed
    }

    /// The calls' names and arguments are `expected`'s, arguments compared as JSON.
    pub(crate) fn assert_calls(parsed: &ParsedText, expected: &[(&str, &str)]) {
        let expected: Vec<(String, Value)> = expected
            .iter()
            .map(|(name, arguments)| (name.to_string(), serde_json::from_str(arguments).unwrap()))
            .collect();
        assert_eq!(whole(parsed).1, expected);
        for call in &parsed.tool_calls {
            assert_eq!(call.kind, ToolCallType::Function);
        }
    }

    #[test]
    fn names_are_vllms_and_the_issues() {
        for (name, format) in [
            ("hermes", ToolCallParser::Hermes),
            ("mistral", ToolCallParser::Mistral),
            ("llama3_json", ToolCallParser::Llama3Json),
            ("llama4_json", ToolCallParser::Llama3Json),
            ("deepseek_v3", ToolCallParser::DeepseekV3),
            ("deepseekv3", ToolCallParser::DeepseekV3),
            ("pythonic", ToolCallParser::Pythonic),
            ("phi4_mini_json", ToolCallParser::Phi4MiniJson),
            ("phi4", ToolCallParser::Phi4MiniJson),
        ] {
            assert_eq!(ToolCallParser::from_name(name), Ok(format));
        }
        assert!(ToolCallParser::from_name("Hermes").is_err());
    }

    #[test]
    fn content_streams_at_once_and_calls_come_whole_when_they_end() {
        let mut stream = ToolCallParser::Hermes.streaming();
        let content = |s: &str| vec![StreamDelta::Content(s.to_owned())];
        assert_eq!(stream.push("Hello"), content("Hello"));
        // A possible marker, and the whitespace before it, wait.
        assert_eq!(stream.push(" wor"), content(" wor"));
        assert_eq!(stream.push("ld \n<tool"), content("ld"));
        assert_eq!(stream.push("_call>{\"name\": \"f\", "), []);
        let deltas = stream.push("\"arguments\": {\"a\": 1}}\n</tool_call>");
        let [StreamDelta::ToolCall(f)] = &deltas[..] else {
            panic!("{deltas:?}")
        };
        let deltas = stream.push("\n<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>!");
        let [StreamDelta::ToolCall(g), StreamDelta::Content(bang)] = &deltas[..] else {
            panic!("{deltas:?}")
        };
        assert_eq!((f.index, g.index, bang.as_str()), (0, 1, "!"));
        assert_eq!(f.kind, Some(ToolCallType::Function));
        assert_eq!(f.function.name.as_deref(), Some("f"));
        assert_eq!(f.function.arguments.as_deref(), Some(r#"{"a":1}"#));
        let (f_id, g_id) = (f.id.as_deref().unwrap(), g.id.as_deref().unwrap());
        assert!(f_id.starts_with("call_") && g_id.starts_with("call_") && f_id != g_id);
        assert_eq!(stream.finish(), []);
    }

    #[test]
    fn a_stream_cut_inside_a_call_gives_it_back_as_content() {
        let mut stream = ToolCallParser::Hermes.streaming();
        assert_eq!(
            stream.push("ok <tool_call>{\"name\": \"f\""),
            [StreamDelta::Content("ok".into())]
        );
        assert_eq!(
            stream.finish(),
            [StreamDelta::Content(" <tool_call>{\"name\": \"f\"".into())]
        );
    }

    #[test]
    fn a_long_call_streams_in_small_deltas() {
        // Were every delta to rescan the call from its start, this would take minutes.
        let code = "fn main() { println!(\\\"{}\\\", [1, 2]); }\\n".repeat(5000);
        let text = format!(
            "<tool_call>{{\"name\": \"write\", \"arguments\": {{\"code\": \"{code}\"}}}}</tool_call>"
        );
        let chunks: Vec<String> = text
            .as_bytes()
            .chunks(4)
            .map(|c| String::from_utf8(c.to_vec()).unwrap())
            .collect();
        let (content, calls) = streamed(ToolCallParser::Hermes, &chunks);
        assert_eq!((content.as_str(), calls.len()), ("", 1));
        assert_eq!(
            calls[0].1["code"].as_str().unwrap().len(),
            code.len() - 3 * 5000
        );
    }

    #[test]
    fn a_long_run_of_whitespace_before_a_call_is_mostly_kept() {
        let text = format!(
            "a{}<tool_call>{{\"name\": \"f\", \"arguments\": {{}}}}</tool_call>",
            "\n".repeat(40)
        );
        let parsed = parse(ToolCallParser::Hermes, &text);
        assert_eq!(parsed.content, Some(format!("a{}", "\n".repeat(8))));
        assert_eq!(parsed.tool_calls.len(), 1);
    }

    const FORMATS: [ToolCallParser; 6] = [
        ToolCallParser::Hermes,
        ToolCallParser::Mistral,
        ToolCallParser::Llama3Json,
        ToolCallParser::DeepseekV3,
        ToolCallParser::Pythonic,
        ToolCallParser::Phi4MiniJson,
    ];

    /// Pieces of text for a format: whole calls, their markers and fragments, and plain
    /// text, so concatenations give calls, broken calls and prose.
    fn pieces(format: ToolCallParser) -> Vec<&'static str> {
        let mut pieces = match format {
            ToolCallParser::Hermes => vec![
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                "<tool_call>{\"name\":\"f\",\"arguments\":{\"s\":\"}\\\"\"}}</tool_call>",
                "<tool_call>",
                "</tool_call>",
                "<tool_",
                "{\"name\": \"g\", \"arguments\": {}}",
            ],
            ToolCallParser::Mistral => vec![
                "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": [1, \"]\"]}}]",
                "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
                "[TOOL_CALLS]f[CALL_ID]abc123XYZ[ARGS]{}",
                "[TOOL_CALLS]",
                "[ARGS]",
                "[CALL_ID]",
                "[TOOL_",
                "name",
                "{\"a\": 1}",
            ],
            ToolCallParser::Llama3Json => vec![
                "{\"name\": \"f\", \"parameters\": {\"a\": 1}}",
                "{\"name\": \"g\", \"arguments\": {}}",
                "<|python_tag|>",
                "<|py",
                ";",
                "{\"x\": 1}",
            ],
            ToolCallParser::DeepseekV3 => vec![
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>h\n```json\n{}\n```<｜tool▁call▁end｜>",
                "<｜tool▁calls▁begin｜>",
                "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜>",
                "<｜tool▁call▁begin｜>",
                "function<｜tool▁sep｜>g\n```json\n",
                "{}\n```",
                "<｜tool▁call▁end｜>",
                "<｜tool▁calls▁end｜>",
                "<｜tool",
            ],
            ToolCallParser::Pythonic => vec![
                "[f(a=1, b=\"x\")]",
                "[get(city='Paris', n=[1, 2.5, None], d={\"k\": True}), ping()]",
                "[",
                "]",
                "f(",
                ")",
                "a=",
                "'",
                "\\",
                "-1.5e3",
                "True",
            ],
            ToolCallParser::Phi4MiniJson => vec![
                "functools[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]",
                "functools",
                "func",
                "[{\"name\": \"g\", \"parameters\": {}}]",
                "[",
                "]",
            ],
        };
        pieces.extend([
            " ",
            "\n",
            "hello",
            "é中",
            "{",
            "}",
            ",",
            "\"",
            "\n\n\n\n\n\n\n\n\n\n",
        ]);
        pieces
    }

    fn case() -> impl Strategy<Value = (ToolCallParser, String, Vec<usize>)> {
        prop::sample::select(FORMATS.to_vec()).prop_flat_map(|format| {
            (
                Just(format),
                prop::collection::vec(prop::sample::select(pieces(format)), 0..10)
                    .prop_map(|pieces| pieces.concat()),
                prop::collection::vec(any::<usize>(), 0..10),
            )
        })
    }

    /// A JSON value of a call's arguments: literals, lists and objects, keys and
    /// strings with quotes, backslashes, newlines and non-ASCII.
    fn argument() -> impl Strategy<Value = Value> {
        let text = "[a-z\"\\\n é中']{0,6}";
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i32>().prop_map(Value::from),
            // Eighths are exact in binary: serde_json's float parsing is not correctly
            // rounded for every shortest form, so arbitrary floats would not compare.
            (-8_000_000i32..8_000_000).prop_map(|n| Value::from(f64::from(n) / 8.0)),
            text.prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[a-z_]{1,5}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn calls() -> impl Strategy<Value = Vec<(String, Value)>> {
        let call = (
            "[a-z_][a-z0-9_]{0,8}",
            prop::collection::btree_map("[a-z_]{1,6}", argument(), 0..4),
        )
            .prop_map(|(name, args)| (name, Value::Object(args.into_iter().collect())));
        prop::collection::vec(call, 1..4)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// What a model of the family would write parses back to the same calls,
        /// whole and streamed in any pieces, with no content left over.
        #[test]
        fn rendered_calls_parse_back(
            format in prop::sample::select(FORMATS.to_vec()),
            calls in calls(),
            cuts in prop::collection::vec(any::<usize>(), 0..10),
        ) {
            let text = format.render(&calls);
            let parsed = format.parse(&text);
            prop_assert_eq!(whole(&parsed), (String::new(), calls.clone()), "{}", text);
            prop_assert_eq!(streamed(format, &chunked(&text, &cuts)), (String::new(), calls));
        }

        /// Any split of the text into deltas gives the content and calls of the whole,
        /// and text with no calls in it comes back unchanged.
        #[test]
        fn any_chunking_parses_like_the_whole((format, text, cuts) in case()) {
            let parsed = format.parse(&text);
            prop_assert_eq!(streamed(format, &chunked(&text, &cuts)), whole(&parsed));
            if parsed.tool_calls.is_empty() {
                prop_assert_eq!(parsed.content.unwrap_or_default(), text);
            }
        }
    }
}
