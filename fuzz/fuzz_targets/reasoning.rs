//! Raw bytes as a thinking model's output through the reasoning parser
//! (`dynamo_llm::parsers::ReasoningParser`): bit 0 of the first byte says whether the
//! output starts inside reasoning, the second byte how the text is cut into deltas, the
//! rest (UTF-8) is the text. Nothing may panic; the stream gives the reasoning and content
//! of the whole output, whatever the cuts; text without think tags loses nothing.
#![no_main]

use dynamo_llm::parsers::ReasoningParser;
use libfuzzer_sys::fuzz_target;

mod deltas;
use deltas::deltas;

fuzz_target!(|data: &[u8]| {
    let [mode, seed, rest @ ..] = data else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let parser = ReasoningParser::new(mode & 1 == 1);
    let whole = parser.parse(text);

    let mut stream = parser.streaming();
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut outs: Vec<_> = deltas(text, *seed)
        .into_iter()
        .map(|d| stream.push(d))
        .collect();
    outs.push(stream.finish());
    for out in outs {
        reasoning += out.reasoning_content.as_deref().unwrap_or("");
        content += out.content.as_deref().unwrap_or("");
    }
    assert_eq!(reasoning, whole.reasoning_content.unwrap_or_default());
    assert_eq!(content, whole.content.unwrap_or_default());
    if !text.contains("<think>") && !text.contains("</think>") {
        assert_eq!(reasoning + &content, text);
    }
});
