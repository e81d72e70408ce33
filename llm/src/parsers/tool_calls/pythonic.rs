//! Pythonic (Llama 3.2 and 4, ToolACE): the answer opens with a Python list of calls with
//! keyword arguments, `[get_weather(city="Paris", days=3), ping()]`, whose values are
//! literals: strings, numbers, `True`/`False`/`None`, lists and dicts: vLLM
//! `pythonic_tool_parser.py` (output starting with `[`; literal arguments only, as
//! `ast.literal_eval` would take them) and `examples/tool_chat_template_llama3.2_pythonic.jinja`.
//! Text after the list is content. Not read: positional arguments, expressions,
//! triple-quoted or prefixed (`r""`) strings, tuples, sets.

use serde_json::{Map, Number, Value};

use super::{Call, Scan, Stop};

/// Nesting deeper than this is not a model's call (and would only grow the stack).
const MAX_DEPTH: usize = 32;

pub(super) fn scan(text: &str) -> Scan {
    let mut p = Cursor { text, at: 0 };
    p.eat(b'[')?;
    let mut calls = Vec::new();
    p.list(b']', |p| {
        calls.push(p.call()?);
        Ok(())
    })?;
    if calls.is_empty() {
        return Err(Stop::Text);
    }
    Ok((calls, p.at))
}

/// Calls as a Python list of keyword calls, their arguments as Python literals.
pub(super) fn render(calls: &[(String, Value)]) -> String {
    let calls: Vec<String> = calls
        .iter()
        .map(|(name, arguments)| {
            let keywords: Vec<String> = arguments
                .as_object()
                .into_iter()
                .flatten()
                .map(|(key, value)| format!("{key}={}", literal(value)))
                .collect();
            format!("{name}({})", keywords.join(", "))
        })
        .collect();
    format!("[{}]", calls.join(", "))
}

/// `value` as the Python literal `ast.literal_eval` reads back to it.
fn literal(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => quoted(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(literal).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", quoted(k), literal(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

/// A double-quoted Python string; control characters as escapes.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Result<u8, Stop> {
        self.text.as_bytes().get(self.at).copied().ok_or(Stop::More)
    }

    fn eat(&mut self, byte: u8) -> Result<(), Stop> {
        if self.peek()? != byte {
            return Err(Stop::Text);
        }
        self.at += 1;
        Ok(())
    }

    fn ws(&mut self) {
        self.at += self.text.as_bytes()[self.at..]
            .iter()
            .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            .count();
    }

    /// Comma-separated items up to `close`; Python allows none and a trailing comma.
    fn list(
        &mut self,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Result<(), Stop>,
    ) -> Result<(), Stop> {
        loop {
            self.ws();
            if self.peek()? == close {
                self.at += 1;
                return Ok(());
            }
            item(self)?;
            self.ws();
            match self.peek()? {
                b',' => self.at += 1,
                b if b == close => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(Stop::Text),
            }
        }
    }

    fn call(&mut self) -> Result<Call, Stop> {
        let name = self.ident()?;
        self.ws();
        self.eat(b'(')?;
        let mut arguments = Map::new();
        self.list(b')', |p| {
            let key = p.ident()?;
            p.ws();
            p.eat(b'=')?;
            p.ws();
            arguments.insert(key, p.value(0)?);
            Ok(())
        })?;
        Ok(Call {
            name,
            arguments: Value::Object(arguments).to_string(),
        })
    }

    /// A Python identifier (ASCII ones); `More` while it may go on.
    fn ident(&mut self) -> Result<String, Stop> {
        let rest = &self.text.as_bytes()[self.at..];
        match rest.first() {
            None => return Err(Stop::More),
            Some(b) if !(b.is_ascii_alphabetic() || *b == b'_') => return Err(Stop::Text),
            _ => {}
        }
        let len = rest
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
            .count();
        if len == rest.len() {
            return Err(Stop::More);
        }
        self.at += len;
        Ok(self.text[self.at - len..self.at].to_owned())
    }

    fn value(&mut self, depth: usize) -> Result<Value, Stop> {
        if depth > MAX_DEPTH {
            return Err(Stop::Text);
        }
        match self.peek()? {
            b'"' | b'\'' => self.string().map(Value::String),
            b'-' | b'.' | b'0'..=b'9' => self.number(),
            b'[' => {
                self.at += 1;
                let mut items = Vec::new();
                self.list(b']', |p| {
                    items.push(p.value(depth + 1)?);
                    Ok(())
                })?;
                Ok(Value::Array(items))
            }
            b'{' => {
                self.at += 1;
                let mut fields = Map::new();
                self.list(b'}', |p| {
                    // JSON keys are strings; Python's other literal keys are not taken.
                    if !matches!(p.peek()?, b'"' | b'\'') {
                        return Err(Stop::Text);
                    }
                    let key = p.string()?;
                    p.ws();
                    p.eat(b':')?;
                    p.ws();
                    fields.insert(key, p.value(depth + 1)?);
                    Ok(())
                })?;
                Ok(Value::Object(fields))
            }
            _ => match self.ident()?.as_str() {
                "True" => Ok(Value::Bool(true)),
                "False" => Ok(Value::Bool(false)),
                "None" => Ok(Value::Null),
                _ => Err(Stop::Text),
            },
        }
    }

    /// An int or a float; `More` while digits may follow.
    fn number(&mut self) -> Result<Value, Stop> {
        let rest = &self.text[self.at..];
        let len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
            .count();
        if len == rest.len() {
            return Err(Stop::More);
        }
        self.at += len;
        let literal = &rest[..len];
        let number = match literal.parse::<i64>() {
            Ok(int) => Number::from(int),
            Err(_) => literal
                .parse::<f64>()
                .ok()
                .and_then(Number::from_f64)
                .ok_or(Stop::Text)?,
        };
        Ok(Value::Number(number))
    }

    /// A single- or double-quoted string with Python's escapes.
    fn string(&mut self) -> Result<String, Stop> {
        let quote = self.next_char()?;
        let mut out = String::new();
        loop {
            match self.next_char()? {
                c if c == quote => return Ok(out),
                // A one-line string may not span lines.
                '\n' => return Err(Stop::Text),
                '\\' => match self.next_char()? {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'r' => out.push('\r'),
                    '0' => out.push('\0'),
                    'x' => out.push(self.hex(2)?),
                    'u' => out.push(self.hex(4)?),
                    'U' => out.push(self.hex(8)?),
                    // A backslash before a newline continues the line.
                    '\n' => {}
                    c @ ('\\' | '\'' | '"') => out.push(c),
                    // Python keeps unknown escapes as written.
                    c => {
                        out.push('\\');
                        out.push(c);
                    }
                },
                c => out.push(c),
            }
        }
    }

    fn next_char(&mut self) -> Result<char, Stop> {
        let c = self.text[self.at..].chars().next().ok_or(Stop::More)?;
        self.at += c.len_utf8();
        Ok(c)
    }

    /// The character of an escape's `digits` hex digits.
    fn hex(&mut self, digits: usize) -> Result<char, Stop> {
        let rest = &self.text.as_bytes()[self.at..];
        let len = rest
            .iter()
            .take(digits)
            .take_while(|b| b.is_ascii_hexdigit())
            .count();
        if len < digits {
            return Err(if len == rest.len() {
                Stop::More
            } else {
                Stop::Text
            });
        }
        let code = u32::from_str_radix(&self.text[self.at..self.at + digits], 16)
            .map_err(|_| Stop::Text)?;
        self.at += digits;
        char::from_u32(code).ok_or(Stop::Text)
    }
}

#[cfg(test)]
mod tests {
    use crate::parsers::ToolCallParser;
    use crate::parsers::tool_calls::tests::{assert_calls, parse};

    #[test]
    fn a_list_of_calls_with_literal_arguments() {
        let text = r#"[get_weather(city="Paris", days=3), search(q='it\'s "x"\n', limit=-2.5e1, exact=True, tags=["a", 'b'], opts={"k": None, 'n': [1, {}]},), ping()]"#;
        let parsed = parse(ToolCallParser::Pythonic, text);
        assert_eq!(parsed.content, None);
        assert_calls(
            &parsed,
            &[
                ("get_weather", r#"{"city":"Paris","days":3}"#),
                (
                    "search",
                    r#"{"exact":true,"limit":-25.0,"opts":{"k":null,"n":[1,{}]},"q":"it's \"x\"\n","tags":["a","b"]}"#,
                ),
                ("ping", "{}"),
            ],
        );
    }

    #[test]
    fn escapes_and_text_after_the_list() {
        let text = "\n[f(s=\"\\u00e9\\x41\\d\")]\nThat is all.";
        let parsed = parse(ToolCallParser::Pythonic, text);
        assert_eq!(parsed.content.as_deref(), Some("That is all."));
        assert_calls(&parsed, &[("f", r#"{"s":"éA\\d"}"#)]);
    }

    #[test]
    fn what_is_not_a_list_of_literal_calls_stays_text() {
        for text in [
            "[1] Introduction",
            "[]",
            "[f(1)]",
            "[f(x)]",
            "[f(x=y)]",
            "[f(x=1+2)]",
            "[f(x=(1, 2))]",
            "[f(x={1: 2})]",
            "[f(x=\"a\nb\")]",
            "[f(x=1e999)]",
            "[f(x=\"\\uZZZZ\")]",
            "[f(x=1)",
            "[f(x=1) g()]",
            "See [f(x=1)]",
            "[a(b=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]])]",
        ] {
            let parsed = parse(ToolCallParser::Pythonic, text);
            assert_eq!(
                (parsed.content.as_deref(), parsed.tool_calls.len()),
                (Some(text), 0),
                "{text}"
            );
        }
    }
}
