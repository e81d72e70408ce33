//! `<think>...</think>` reasoning, split into `reasoning_content` and `content`.
//!
//! DeepSeek-R1 and Qwen3 think first, between `<think>` and `</think>`. Their newer chat
//! templates put the opening `<think>` in the prompt, so the output starts inside the
//! reasoning and only `</think>` appears; older ones let the model write `<think>` itself.
//! As vLLM's `deepseek_r1` and `qwen3` reasoning parsers (`vllm/reasoning/`,
//! `deepseek_r1_reasoning_parser.py`, `qwen3_reasoning_parser.py`) do: a `<think>` that
//! opens the output is dropped, text up to `</think>` is reasoning, the rest content, and
//! an output without `</think>` is all reasoning (generation stopped while thinking).
//! Unlike them, a `<think>` later in the text stays text rather than dropping what came
//! before it, and a second `</think>` is content.

use super::{UnknownParser, before_partial_marker};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

const NAMES: &[&str] = &["deepseek_r1", "qwen3"];

/// Whitespace an opening `<think>` may follow; a longer run is held no longer (it would
/// be searched again on every delta) and the output opens without the tag.
const MAX_LEADING_WS: usize = 32;

/// How a model's output opens: inside reasoning, or as content unless it starts with
/// `<think>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningParser {
    starts_in_reasoning: bool,
}

/// Reasoning and answer text of a whole output or of one streamed delta; `None` where
/// there is none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasoningText {
    pub reasoning_content: Option<String>,
    pub content: Option<String>,
}

impl ReasoningParser {
    /// vLLM's `--reasoning-parser` names: `deepseek_r1`, `qwen3`; both start in reasoning.
    pub fn from_name(name: &str) -> Result<Self, UnknownParser> {
        if NAMES.contains(&name) {
            Ok(Self::new(true))
        } else {
            Err(UnknownParser {
                name: name.to_owned(),
                known: NAMES,
            })
        }
    }

    /// `starts_in_reasoning: false` where the prompt did not open a `<think>` (Qwen3 with
    /// `enable_thinking: false` closes it in the prompt): the output is content unless it
    /// opens with `<think>` itself.
    pub fn new(starts_in_reasoning: bool) -> Self {
        Self {
            starts_in_reasoning,
        }
    }

    /// Splits a whole output.
    pub fn parse(&self, text: &str) -> ReasoningText {
        let mut stream = self.streaming();
        let mut all = stream.push(text);
        let rest = stream.finish();
        for (whole, more) in [
            (&mut all.reasoning_content, rest.reasoning_content),
            (&mut all.content, rest.content),
        ] {
            if let Some(more) = more {
                whole.get_or_insert_default().push_str(&more);
            }
        }
        all
    }

    /// A parser for one streamed output, delta by delta.
    pub fn streaming(&self) -> StreamingReasoningParser {
        StreamingReasoningParser {
            state: State::Opening,
            starts_in_reasoning: self.starts_in_reasoning,
            buf: String::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: an opening `<think>` may still come.
    Opening,
    Reasoning,
    Content,
}

/// Splits a streamed output as it arrives, holding back only text that could be part of
/// a `<think>` or `</think>` tag.
#[derive(Debug, Clone)]
pub struct StreamingReasoningParser {
    state: State,
    starts_in_reasoning: bool,
    buf: String,
}

impl StreamingReasoningParser {
    /// Takes the next piece of output; returns what can be told apart now.
    pub fn push(&mut self, delta: &str) -> ReasoningText {
        self.buf.push_str(delta);
        self.drain(false)
    }

    /// The output ended: returns whatever was still held back.
    pub fn finish(&mut self) -> ReasoningText {
        self.drain(true)
    }

    fn drain(&mut self, eof: bool) -> ReasoningText {
        let mut out = ReasoningText::default();
        if self.state == State::Opening {
            let start = self.buf.len() - self.buf.trim_start().len();
            let head = &self.buf[start..];
            if start <= MAX_LEADING_WS && head.starts_with(OPEN) {
                self.buf.drain(..start + OPEN.len());
                self.state = State::Reasoning;
            } else if OPEN.starts_with(head) && start <= MAX_LEADING_WS && !eof {
                return out;
            } else if self.starts_in_reasoning {
                self.state = State::Reasoning;
            } else {
                self.state = State::Content;
            }
        }
        if self.state == State::Reasoning {
            let (reasoning, content) = match self.buf.find(CLOSE) {
                Some(at) => {
                    self.state = State::Content;
                    (at, at + CLOSE.len())
                }
                None if eof => (self.buf.len(), self.buf.len()),
                None => {
                    let keep = before_partial_marker(&self.buf, &[CLOSE]);
                    (keep, keep)
                }
            };
            out.reasoning_content = non_empty(&self.buf[..reasoning]);
            self.buf.drain(..content);
        }
        if self.state == State::Content {
            out.content = non_empty(&self.buf);
            self.buf.clear();
        }
        out
    }
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsers::chunked;
    use proptest::prelude::*;

    fn split(reasoning: Option<&str>, content: Option<&str>) -> ReasoningText {
        ReasoningText {
            reasoning_content: reasoning.map(str::to_owned),
            content: content.map(str::to_owned),
        }
    }

    #[test]
    fn both_names_start_in_reasoning() {
        for name in NAMES {
            let parser = ReasoningParser::from_name(name).unwrap();
            // The prompt opened `<think>`: only the closing tag is generated.
            assert_eq!(
                parser.parse("Let me think.\n</think>\n\nIt is 4."),
                split(Some("Let me think.\n"), Some("\n\nIt is 4."))
            );
        }
    }

    #[test]
    fn an_opening_tag_the_model_wrote_is_dropped() {
        let parser = ReasoningParser::from_name("deepseek_r1").unwrap();
        assert_eq!(
            parser.parse("<think>\nhmm\n</think>answer"),
            split(Some("\nhmm\n"), Some("answer"))
        );
        assert_eq!(parser.parse("  <think>x</think>"), split(Some("x"), None));
    }

    #[test]
    fn without_a_closing_tag_everything_is_reasoning() {
        let parser = ReasoningParser::from_name("qwen3").unwrap();
        assert_eq!(
            parser.parse("still thinking"),
            split(Some("still thinking"), None)
        );
        assert_eq!(parser.parse(""), split(None, None));
    }

    #[test]
    fn an_opening_tag_after_a_long_run_of_whitespace_is_text() {
        let text = format!("{}<think>x</think>y", " ".repeat(MAX_LEADING_WS + 1));
        let parser = ReasoningParser::new(false);
        assert_eq!(parser.parse(&text), split(None, Some(&text)));
    }

    #[test]
    fn later_tags_are_text() {
        let parser = ReasoningParser::from_name("qwen3").unwrap();
        assert_eq!(
            parser.parse("a <think> b</think>c</think>d"),
            split(Some("a <think> b"), Some("c</think>d"))
        );
    }

    #[test]
    fn thinking_off_is_content_unless_the_output_opens_a_think() {
        let parser = ReasoningParser::new(false);
        assert_eq!(parser.parse("Just 4."), split(None, Some("Just 4.")));
        assert_eq!(
            parser.parse("4 </think> x"),
            split(None, Some("4 </think> x"))
        );
        assert_eq!(
            parser.parse("<think>r</think>c"),
            split(Some("r"), Some("c"))
        );
        assert_eq!(parser.parse("<thin"), split(None, Some("<thin")));
    }

    #[test]
    fn streaming_holds_back_only_a_possible_tag() {
        let mut stream = ReasoningParser::from_name("qwen3").unwrap().streaming();
        assert_eq!(stream.push("<thi"), split(None, None));
        assert_eq!(stream.push("nk>abc</th"), split(Some("abc"), None));
        assert_eq!(stream.push("x"), split(Some("</thx"), None));
        assert_eq!(stream.push("</"), split(None, None));
        assert_eq!(stream.push("think>ok"), split(None, Some("ok")));
        assert_eq!(stream.push(" more"), split(None, Some(" more")));
        assert_eq!(stream.finish(), split(None, None));

        let mut stream = ReasoningParser::from_name("qwen3").unwrap().streaming();
        assert_eq!(stream.push("a</thi"), split(Some("a"), None));
        assert_eq!(stream.finish(), split(Some("</thi"), None));
    }

    fn piece() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "<think>",
            "</think>",
            "<thi",
            "</th",
            "<",
            ">",
            "think",
            " ",
            "\n",
            "a",
            "é",
            "中",
            "          ",
        ])
    }

    proptest! {
        #[test]
        fn any_chunking_splits_like_the_whole(
            pieces in prop::collection::vec(piece(), 0..16),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
            starts_in_reasoning: bool,
        ) {
            let text = pieces.concat();
            let parser = ReasoningParser::new(starts_in_reasoning);
            let whole = parser.parse(&text);
            let mut stream = parser.streaming();
            let (mut reasoning, mut content) = (String::new(), String::new());
            for chunk in chunked(&text, &cuts).iter().map(String::as_str) {
                let out = stream.push(chunk);
                reasoning += out.reasoning_content.as_deref().unwrap_or("");
                content += out.content.as_deref().unwrap_or("");
            }
            let out = stream.finish();
            reasoning += out.reasoning_content.as_deref().unwrap_or("");
            content += out.content.as_deref().unwrap_or("");
            prop_assert_eq!(reasoning.as_str(), whole.reasoning_content.as_deref().unwrap_or(""));
            prop_assert_eq!(content.as_str(), whole.content.as_deref().unwrap_or(""));
            // Without tags nothing is lost: the text is all reasoning or all content.
            if !text.contains("<think>") && !text.contains("</think>") {
                prop_assert_eq!(reasoning + &content, text);
            }
        }
    }
}
