//! DeepSeek-V3 (and R1): one block of calls,
//! `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>`
//! and more calls after a newline, closed by `<｜tool▁calls▁end｜>`: vLLM
//! `deepseekv3_tool_parser.py` and `examples/tool_chat_template_deepseekv3.jinja`. As in
//! the model's special tokens, the bars are U+FF5C (fullwidth vertical line) and the `▁`
//! U+2581 (lower one eighth block, SentencePiece's space mark).

use serde_json::Value;

use super::{Call, Scan, Stop, arguments_at, expect, name_at, ws};

pub(super) const START: &str = "<｜tool▁calls▁begin｜>";
const END: &str = "<｜tool▁calls▁end｜>";
const CALL_START: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";

pub(super) fn scan(text: &str, eof: bool) -> Scan {
    let mut at = START.len();
    let mut calls = Vec::new();
    loop {
        let next = at + ws(&text[at..]);
        let rest = &text[next..];
        match expect(rest, CALL_START) {
            Ok(len) => {
                let (call, more) = call(&rest[len..])?;
                calls.push(call);
                at = next + len + more;
                continue;
            }
            Err(stop) if calls.is_empty() => return Err(stop),
            Err(_) => {}
        }
        return if rest.starts_with(END) {
            Ok((calls, next + END.len()))
        } else if CALL_START.starts_with(rest) || END.starts_with(rest) {
            // A cut-short closing tag still closes the block.
            if eof {
                Ok((calls, text.len()))
            } else {
                Err(Stop::More)
            }
        } else {
            // The block was not closed: the calls stand, what follows is text.
            Ok((calls, at))
        };
    }
}

/// One block of calls, each with its arguments in a JSON code fence.
pub(super) fn render(calls: &[(String, Value)]) -> String {
    let calls: Vec<String> = calls
        .iter()
        .map(|(name, arguments)| {
            format!("{CALL_START}function{SEP}{name}\n```json\n{arguments}\n```{CALL_END}")
        })
        .collect();
    format!("{START}{}{END}", calls.join("\n"))
}

/// One call after its `<｜tool▁call▁begin｜>`, through its `<｜tool▁call▁end｜>`.
fn call(text: &str) -> Result<(Call, usize), Stop> {
    // The tool type, which is always `function`.
    let mut at = expect(text, "function")?;
    at += expect(&text[at..], SEP)?;
    let name = name_at(&text[at..])?.to_owned();
    at += name.len();
    at += expect(&text[at..], "\n```json")?;
    at += ws(&text[at..]);
    let (arguments, len) = arguments_at(&text[at..])?;
    at += len;
    at += ws(&text[at..]);
    at += expect(&text[at..], "```")?;
    at += ws(&text[at..]);
    at += expect(&text[at..], CALL_END)?;
    Ok((Call { name, arguments }, at))
}

#[cfg(test)]
mod tests {
    use crate::parsers::ToolCallParser;
    use crate::parsers::tool_calls::tests::{assert_calls, parse};

    fn call(name: &str, arguments: &str) -> String {
        format!(
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```<｜tool▁call▁end｜>"
        )
    }

    #[test]
    fn the_markers_are_fullwidth_bars_and_lower_blocks() {
        assert!(
            super::START
                .chars()
                .eq("<\u{ff5c}tool\u{2581}calls\u{2581}begin\u{ff5c}>".chars())
        );
    }

    #[test]
    fn a_block_of_calls() {
        let text = format!(
            "<｜tool▁calls▁begin｜>{}\n{}<｜tool▁calls▁end｜>",
            call("get_weather", r#"{"location": "Beijing"}"#),
            call("time", "{}")
        );
        let parsed = parse(ToolCallParser::DeepseekV3, &text);
        assert_eq!(parsed.content, None);
        assert_calls(
            &parsed,
            &[("get_weather", r#"{"location":"Beijing"}"#), ("time", "{}")],
        );
    }

    #[test]
    fn text_before_and_an_unclosed_block() {
        let text = format!(
            "Let me look.<｜tool▁calls▁begin｜>{}<｜tool▁calls",
            call("f", "{}")
        );
        let parsed = parse(ToolCallParser::DeepseekV3, &text);
        assert_eq!(parsed.content.as_deref(), Some("Let me look."));
        assert_calls(&parsed, &[("f", "{}")]);

        let text = format!("<｜tool▁calls▁begin｜>{} and text", call("f", "{}"));
        let parsed = parse(ToolCallParser::DeepseekV3, &text);
        assert_eq!(parsed.content.as_deref(), Some("and text"));
        assert_eq!(parsed.tool_calls.len(), 1);
    }

    #[test]
    fn malformed_blocks_stay_text() {
        for text in [
            "<｜tool▁calls▁begin｜>".to_owned(),
            "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>".to_owned(),
            format!("<｜tool▁calls▁begin｜>{}", call("f", r#"{"a": }"#)),
            format!("<｜tool▁calls▁begin｜>{}", call("f", "[1]")),
            format!(
                "<｜tool▁calls▁begin｜>{}",
                call("f", "{}").replace("function", "other")
            ),
            format!(
                "<｜tool▁calls▁begin｜>{}",
                call("f", "{}").chars().take(20).collect::<String>()
            ),
        ] {
            let parsed = parse(ToolCallParser::DeepseekV3, &text);
            assert_eq!(
                (parsed.content.as_deref(), parsed.tool_calls.len()),
                (Some(text.as_str()), 0)
            );
        }
    }
}
