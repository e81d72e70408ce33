//! Llama 3.1 to 4 JSON calls: the answer is a JSON object
//! `{"name": ..., "parameters": {...}}` (Meta's templates say `parameters`; vLLM also takes
//! `arguments`), perhaps after `<|python_tag|>`, several separated by `;`: vLLM
//! `llama_tool_parser.py` (`llama3_json`, `llama4_json`) and
//! `examples/tool_chat_template_llama3.1_json.jinja`. A bare object only counts where it
//! opens the answer, as vLLM's streaming parser has it, so JSON quoted in prose stays prose.

use super::{Scan, Stop, json_call, ws};

pub(super) const START: &str = "<|python_tag|>";

pub(super) fn scan(text: &str, eof: bool) -> Scan {
    let mut at = if text.starts_with(START) {
        START.len()
    } else {
        0
    };
    let mut calls = Vec::new();
    loop {
        at += ws(&text[at..]);
        if eof && at == text.len() && !calls.is_empty() {
            return Ok((calls, at));
        }
        let (call, len) = json_call(&text[at..])?;
        calls.push(call);
        at += len;
        let next = at + ws(&text[at..]);
        match text[next..].bytes().next() {
            Some(b';') => at = next + 1,
            None if !eof => return Err(Stop::More),
            _ => return Ok((calls, at)),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::parsers::ToolCallParser;
    use crate::parsers::tool_calls::tests::{assert_calls, parse};

    #[test]
    fn a_bare_object_opening_the_answer() {
        let text = "\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        let parsed = parse(ToolCallParser::Llama3Json, text);
        assert_eq!(parsed.content, None);
        assert_calls(&parsed, &[("get_weather", r#"{"city":"Paris"}"#)]);
    }

    #[test]
    fn after_the_python_tag_and_separated_by_semicolons() {
        let text = "<|python_tag|>{\"name\": \"a\", \"arguments\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}};";
        let parsed = parse(ToolCallParser::Llama3Json, text);
        assert_eq!(parsed.content, None);
        assert_calls(&parsed, &[("a", r#"{"x":1}"#), ("b", "{}")]);
    }

    #[test]
    fn text_before_and_after() {
        let text = "Calling.<|python_tag|>{\"name\": \"a\", \"parameters\": {}} then more";
        let parsed = parse(ToolCallParser::Llama3Json, text);
        assert_eq!(parsed.content.as_deref(), Some("Calling.then more"));
        assert_eq!(parsed.tool_calls.len(), 1);
    }

    #[test]
    fn json_that_is_not_a_call_or_not_first_stays_text() {
        for text in [
            "{\"answer\": 42}",
            "{\"name\": \"a\"}",
            "{\"name\": \"a\", \"parameters\": {}",
            "Here: {\"name\": \"a\", \"parameters\": {}}",
            "{\"name\": \"a\", \"parameters\": {}}; {\"oops\": 1}",
            "<|python_tag|>brave_search.call(query=\"x\")",
        ] {
            let parsed = parse(ToolCallParser::Llama3Json, text);
            assert_eq!(
                (parsed.content.as_deref(), parsed.tool_calls.len()),
                (Some(text), 0)
            );
        }
    }
}
