//! Mistral: `[TOOL_CALLS]` then, by tokenizer version (mistral-common
//! `tokens/tokenizers/instruct.py`, `_encode_tool_calls_in_assistant_message`):
//! - v2 to v7 (Mistral-7B-Instruct-v0.3, Mixtral, Nemo): a JSON array of
//!   `{"name", "arguments", "id"?}`, once for all calls;
//! - v11 (Mistral-Small-3.2): `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}` per call;
//! - v13 (Magistral-2509, Ministral-3, Devstral-2): `[TOOL_CALLS]NAME[ARGS]{...}` per call.
//!
//! vLLM `mistral_tool_parser.py` reads the same, and also `NAME{...}` without `[ARGS]`.
//! The engine must keep special tokens in its text (vLLM sets `skip_special_tokens=False`
//! for this parser), or the markers are gone.

use super::{Call, Scan, Stop, arguments_at, expect, json_calls, name_at, ws};

pub(super) const START: &str = "[TOOL_CALLS]";
const CALL_ID: &str = "[CALL_ID]";
const ARGS: &str = "[ARGS]";

pub(super) fn scan(text: &str) -> Scan {
    let mut at = START.len();
    at += ws(&text[at..]);
    if text[at..].starts_with('[') {
        let (calls, len) = json_calls(&text[at..])?;
        return Ok((calls, at + len));
    }
    let name = name_at(&text[at..])?.to_owned();
    at += name.len();
    if let Some(len) = optional(&text[at..], CALL_ID)? {
        at += len;
        // The model's id is not kept: ids are ours to make unique.
        let id = text[at..]
            .bytes()
            .take_while(u8::is_ascii_alphanumeric)
            .count();
        if at + id == text.len() {
            return Err(Stop::More);
        }
        at += id;
    }
    at += optional(&text[at..], ARGS)?.unwrap_or(0);
    let (arguments, len) = arguments_at(&text[at..])?;
    Ok((vec![Call { name, arguments }], at + len))
}

/// The length of `token` if `text` starts with it, `None` if it cannot.
fn optional(text: &str, token: &str) -> Result<Option<usize>, Stop> {
    match expect(text, token) {
        Ok(len) => Ok(Some(len)),
        Err(Stop::More) => Err(Stop::More),
        Err(Stop::Text) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use crate::parsers::ToolCallParser;
    use crate::parsers::tool_calls::tests::{assert_calls, parse};

    #[test]
    fn the_json_array_of_older_tokenizers() {
        let text = r#"[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Zürich"}, "id": "abcDEF123"}, {"name": "time", "arguments": {}}]"#;
        let parsed = parse(ToolCallParser::Mistral, text);
        assert_eq!(parsed.content, None);
        assert_calls(
            &parsed,
            &[("get_weather", r#"{"city":"Zürich"}"#), ("time", "{}")],
        );
    }

    #[test]
    fn one_marker_per_call_in_v11_and_v13() {
        let text = "Sure.[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{\"city\": \"Bern\"}\
                    [TOOL_CALLS]search[ARGS]{\"q\": \"café \\\"best\\\"\"}[TOOL_CALLS]ping{}";
        let parsed = parse(ToolCallParser::Mistral, text);
        assert_eq!(parsed.content.as_deref(), Some("Sure."));
        assert_calls(
            &parsed,
            &[
                ("get_weather", r#"{"city":"Bern"}"#),
                ("search", r#"{"q":"café \"best\""}"#),
                ("ping", "{}"),
            ],
        );
    }

    #[test]
    fn ids_are_nine_letters_or_digits() {
        let parsed = parse(
            ToolCallParser::Mistral,
            "[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]f[ARGS]{}",
        );
        let ids: Vec<&str> = parsed.tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert!(
            ids.iter()
                .all(|id| id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()))
        );
        assert_ne!(ids[0], ids[1]);
    }

    #[test]
    fn malformed_calls_stay_text() {
        for text in [
            "[TOOL_CALLS]",
            "[TOOL_CALLS][]",
            "[TOOL_CALLS][{\"name\": \"f\"}]",
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}",
            "[TOOL_CALLS]get weather[ARGS]{}",
            "[TOOL_CALLS]f[ARGS][1]",
            "[TOOL_CALLS]f[ARGS]{\"a\": ",
            "[TOOL_CALLS]f[CALL_ID]x-y[ARGS]{}",
            "text [ARGS] more",
        ] {
            let parsed = parse(ToolCallParser::Mistral, text);
            assert_eq!(
                (parsed.content.as_deref(), parsed.tool_calls.len()),
                (Some(text), 0)
            );
        }
    }
}
