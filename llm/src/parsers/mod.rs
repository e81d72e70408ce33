//! Turning an engine's raw text into the OpenAI fields a chat answer carries:
//! `tool_calls` (per model format, [`ToolCallParser`]) and `reasoning_content`
//! ([`ReasoningParser`]), for a whole answer or streamed delta by delta.
//!
//! Pure text in, text out: no tokenizer, no I/O. Model output that does not parse never
//! panics and is never dropped: it stays plain content. The names are vLLM's
//! `--tool-call-parser` and `--reasoning-parser` values, so a deployment's flags carry over.
//! `docs/parsers.md` lists the formats and their sources.

pub mod reasoning;
pub mod tool_calls;

pub use reasoning::{ReasoningParser, ReasoningText, StreamingReasoningParser};
pub use tool_calls::{ParsedText, StreamDelta, StreamingToolParser, ToolCallParser};

/// A parser name that is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown parser `{name}`; expected one of: {}", .known.join(", "))]
pub struct UnknownParser {
    pub name: String,
    pub known: &'static [&'static str],
}

/// Where the text a stream may pass on now ends: before the longest suffix of `buf` that
/// could be the start of one of `markers` once more text arrives.
fn before_partial_marker(buf: &str, markers: &[&str]) -> usize {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    let from = buf.len().saturating_sub(longest.saturating_sub(1));
    (from..buf.len())
        .filter(|&i| buf.is_char_boundary(i))
        .find(|&i| markers.iter().any(|m| m.starts_with(&buf[i..])))
        .unwrap_or(buf.len())
}

/// `text` cut at the byte offsets `cuts` (modulo its length) that fall between
/// characters: a stream's deltas for property tests.
#[cfg(test)]
fn chunked(text: &str, cuts: &[usize]) -> Vec<String> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|c| c % (text.len() + 1))
        .filter(|&c| text.is_char_boundary(c))
        .collect();
    at.extend([0, text.len()]);
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| text[w[0]..w[1]].to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_only_what_could_start_a_marker() {
        assert_eq!(before_partial_marker("abc<tool", &["<tool_call>"]), 3);
        assert_eq!(
            before_partial_marker("abc<tool_call>", &["<tool_call>"]),
            14
        );
        assert_eq!(before_partial_marker("abc<", &["<tool_call>", "<x>"]), 3);
        assert_eq!(before_partial_marker("abc", &["<tool_call>"]), 3);
        assert_eq!(
            before_partial_marker("a<｜tool", &["<｜tool▁calls▁begin｜>"]),
            1
        );
        assert_eq!(before_partial_marker("ab", &[]), 2);
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = ToolCallParser::from_name("nope").unwrap_err();
        assert!(err.to_string().contains("hermes"), "{err}");
        let err = ReasoningParser::from_name("nope").unwrap_err();
        assert!(err.to_string().contains("deepseek_r1"), "{err}");
    }
}
