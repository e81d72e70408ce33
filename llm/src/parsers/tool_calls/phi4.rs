//! Phi-4-mini: `functools` then a JSON array of `{"name": ..., "arguments": {...}}`, no
//! closing marker: vLLM `phi4mini_tool_parser.py` (`phi4_mini_json`) and
//! `examples/tool_chat_template_phi4_mini.jinja` ("prefix function calls with functools
//! marker (no closing marker required)").

use super::{Scan, json_calls};

pub(super) const START: &str = "functools";

pub(super) fn scan(text: &str) -> Scan {
    let (calls, len) = json_calls(&text[START.len()..])?;
    Ok((calls, START.len() + len))
}

#[cfg(test)]
mod tests {
    use crate::parsers::ToolCallParser;
    use crate::parsers::tool_calls::tests::{assert_calls, parse};

    #[test]
    fn calls_after_the_marker() {
        let text = r#"functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "time", "parameters": {}}]"#;
        let parsed = parse(ToolCallParser::Phi4MiniJson, text);
        assert_eq!(parsed.content, None);
        assert_calls(
            &parsed,
            &[("get_weather", r#"{"city":"Paris"}"#), ("time", "{}")],
        );
    }

    #[test]
    fn text_before_and_after() {
        let text = r#"Checking. functools[{"name": "f", "arguments": {"a": [1, "]"]}}] Done."#;
        let parsed = parse(ToolCallParser::Phi4MiniJson, text);
        assert_eq!(parsed.content.as_deref(), Some("Checking.Done."));
        assert_calls(&parsed, &[("f", r#"{"a":[1,"]"]}"#)]);
    }

    #[test]
    fn the_word_alone_or_broken_calls_stay_text() {
        for text in [
            "import functools.partial",
            "functools",
            "functools[]",
            "functools[{\"name\": \"f\"}]",
            "functools[{\"name\": \"f\", \"arguments\": {}}",
        ] {
            let parsed = parse(ToolCallParser::Phi4MiniJson, text);
            assert_eq!(
                (parsed.content.as_deref(), parsed.tool_calls.len()),
                (Some(text), 0)
            );
        }
    }
}
