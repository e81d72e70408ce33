//! Raw bytes as an engine's answer through the tool-call parsers
//! (`dynamo_llm::parsers::ToolCallParser`): the first byte picks the format, the second
//! how the text is cut into deltas, the rest (UTF-8) is the text. Nothing may panic; the
//! stream gives the content and calls of the whole answer, whatever the cuts; every call's
//! arguments are a JSON object; an answer without calls comes back unchanged as content.
#![no_main]

use dynamo_llm::parsers::{StreamDelta, ToolCallParser};
use libfuzzer_sys::fuzz_target;

mod deltas;
use deltas::deltas;

fuzz_target!(|data: &[u8]| {
    let [format, seed, rest @ ..] = data else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let names = ToolCallParser::NAMES;
    let parser = ToolCallParser::from_name(names[usize::from(*format) % names.len()]).unwrap();
    let whole = parser.parse(text);

    let mut stream = parser.streaming();
    let mut streamed: Vec<StreamDelta> = deltas(text, *seed)
        .into_iter()
        .flat_map(|d| stream.push(d))
        .collect();
    streamed.extend(stream.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for delta in streamed {
        match delta {
            StreamDelta::Content(text) => content.push_str(&text),
            StreamDelta::ToolCall(call) => {
                assert_eq!(call.index as usize, calls.len());
                calls.push((
                    call.function.name.unwrap(),
                    call.function.arguments.unwrap(),
                ));
            }
        }
    }
    assert_eq!(content, whole.content.clone().unwrap_or_default());
    let whole_calls: Vec<_> = whole
        .tool_calls
        .iter()
        .map(|c| (c.function.name.clone(), c.function.arguments.clone()))
        .collect();
    assert_eq!(calls, whole_calls);
    for (_, arguments) in &calls {
        let arguments: serde_json::Value =
            serde_json::from_str(arguments).expect("arguments are JSON");
        assert!(arguments.is_object());
    }
    if calls.is_empty() {
        assert_eq!(content, text);
    }
});
