//! Hermes (Hermes 2 Pro and 3, Qwen2.5 and Qwen3 instruct models): each call is a JSON
//! object `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`,
//! on lines of their own, one block per call: vLLM `hermes_tool_parser.py` and
//! `examples/tool_chat_template_hermes.jinja`. As vLLM's pattern
//! `<tool_call>(.*?)</tool_call>|<tool_call>(.*)` does, a last call whose closing tag never
//! came still counts.

use super::{Scan, Stop, expect, json_call, ws};

pub(super) const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

pub(super) fn scan(text: &str, eof: bool) -> Scan {
    let mut at = START.len();
    at += ws(&text[at..]);
    let (call, len) = json_call(&text[at..])?;
    at += len;
    at += ws(&text[at..]);
    match expect(&text[at..], END) {
        Ok(end) => Ok((vec![call], at + end)),
        Err(Stop::More) if eof => Ok((vec![call], text.len())),
        Err(stop) => Err(stop),
    }
}

#[cfg(test)]
mod tests {
    use crate::parsers::ToolCallParser;
    use crate::parsers::tool_calls::tests::{assert_calls, parse};

    const WEATHER: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

    #[test]
    fn one_call_is_all_calls_no_content() {
        let parsed = parse(ToolCallParser::Hermes, WEATHER);
        assert_eq!(parsed.content, None);
        assert_calls(&parsed, &[("get_weather", r#"{"city":"Paris"}"#)]);
    }

    #[test]
    fn several_calls_with_text_around_them() {
        let text = format!(
            "Let me check.\n\n{WEATHER}\n<tool_call>{{\"name\":\"time\",\"arguments\":{{}}}}</tool_call>\nDone."
        );
        let parsed = parse(ToolCallParser::Hermes, &text);
        assert_eq!(parsed.content.as_deref(), Some("Let me check.Done."));
        assert_calls(
            &parsed,
            &[("get_weather", r#"{"city":"Paris"}"#), ("time", "{}")],
        );
    }

    #[test]
    fn an_unclosed_last_call_counts() {
        let parsed = parse(ToolCallParser::Hermes, &WEATHER[..WEATHER.len() - 5]);
        assert_eq!((parsed.content, parsed.tool_calls.len()), (None, 1));
    }

    #[test]
    fn malformed_calls_stay_text() {
        for text in [
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1\n</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": {}} trailing</tool_call>",
            "<tool_call>not json</tool_call>",
            "<tool_call>",
            "a </tool_call> b",
        ] {
            let parsed = parse(ToolCallParser::Hermes, text);
            assert_eq!(
                (parsed.content.as_deref(), parsed.tool_calls.len()),
                (Some(text), 0)
            );
        }
    }

    #[test]
    fn a_bad_block_does_not_hide_a_good_one() {
        let text = format!("<tool_call>oops {WEATHER}");
        let parsed = parse(ToolCallParser::Hermes, &text);
        assert_eq!(parsed.content.as_deref(), Some("<tool_call>oops"));
        assert_eq!(parsed.tool_calls.len(), 1);
    }
}
