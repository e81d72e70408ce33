//! The token-count lower bounds against the real tokenizer of the model directory `make
//! model` builds (Qwen's vocabulary: byte-level BPE, NFC, ChatML special tokens).

use std::collections::HashSet;

use dynamo_llm::ApiError;
use dynamo_llm::openai::{CompletionRequest, parse_body};
use dynamo_llm::prompt_bound::PromptBound;
use serde_json::json;

mod common;
use common::{hard_texts, load, prose};

#[test]
fn the_per_byte_bound_and_the_body_it_implies() {
    let model = load();
    // Qwen's longest token is 128 spaces; NFC may shrink text fourfold.
    let bound = PromptBound::of(&model.tokenizer).expect("byte-level BPE has a bound");
    assert_eq!(bound.bytes_per_token(), 512);
    assert_eq!(model.max_prompt_bytes(), Some(32768 * 512));
}

#[test]
fn the_segmentation_bound_never_exceeds_the_real_count_and_is_close_on_prose() {
    let model = load();
    let bound = PromptBound::of(&model.tokenizer).unwrap();
    for text in hard_texts() {
        let real = model.encode(&text).len();
        // A limit that makes the bound run its segmentation (the text is long for it).
        let at_least = bound.min_tokens(&model.tokenizer, &text, text.len() / 16);
        assert!(
            at_least <= real,
            "bound {at_least} above the real {real} for {:.60?}",
            text
        );
        assert!(at_least > 0, "{:.60?}", text);
    }
    let text = prose(20_000);
    let real = model.encode(&text).len();
    let at_least = bound.min_tokens(&model.tokenizer, &text, text.len() / 16);
    assert!(
        at_least * 100 >= real * 95,
        "prose: bound {at_least}, real {real}"
    );
}

/// The shortest spelling by brute force: every substring up to the longest entry
/// looked up in the vocabulary.
fn naive_fewest(vocab: &HashSet<Vec<u8>>, longest: usize, text: &[u8]) -> usize {
    let mut best = vec![usize::MAX; text.len() + 1];
    best[0] = 0;
    for end in 1..=text.len() {
        for start in end.saturating_sub(longest)..end {
            if best[start] != usize::MAX && vocab.contains(&text[start..end]) {
                best[end] = best[end].min(best[start] + 1);
            }
        }
    }
    best[text.len()]
}

#[test]
fn the_segmentation_is_the_shortest_spelling() {
    let model = load();
    let bound = PromptBound::of(&model.tokenizer).unwrap();
    // Byte-level characters back to bytes (GPT-2's table, built independently here:
    // a byte stands for itself when printable, else for U+0100 + its rank).
    let mut byte_of = std::collections::HashMap::new();
    let mut next = 0x100;
    for b in 0..=255u32 {
        let c = if matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF) {
            b
        } else {
            next += 1;
            next - 1
        };
        byte_of.insert(char::from_u32(c).unwrap(), b as u8);
    }
    let vocab: HashSet<Vec<u8>> = model
        .tokenizer
        .get_vocab(false)
        .into_keys()
        .filter_map(|t| t.chars().map(|c| byte_of.get(&c).copied()).collect())
        .collect();
    let longest = vocab.iter().map(Vec::len).max().unwrap();
    for text in [
        prose(300),
        "    x = [1, 2, 3]  # comment\n".repeat(40),
        "ünïcödé 文字 🚀 ".repeat(40),
    ] {
        let fewest = bound.min_tokens(&model.tokenizer, &text, text.len() / 16);
        assert_eq!(
            fewest,
            naive_fewest(&vocab, longest, text.as_bytes()),
            "{text:.40?}"
        );
    }
}

fn completion(prompt: &str, max_tokens: u64) -> CompletionRequest {
    parse_body(
        json!({"model": "qwen", "prompt": prompt, "max_tokens": max_tokens})
            .to_string()
            .as_bytes(),
    )
    .unwrap()
}

#[test]
fn a_prompt_that_cannot_fit_is_refused_with_the_numbers_and_one_that_fits_is_not() {
    let model = load();
    // 600 kB of prose: 120k tokens, refused by the bound (it says "at least").
    let long = prose(100_000);
    let err: ApiError = model
        .prepare_completion(&completion(&long, 16))
        .unwrap_err();
    assert_eq!(err.status.as_u16(), 400);
    assert_eq!(err.code, Some("context_length_exceeded"));
    assert_eq!(err.param.as_deref(), Some("prompt"));
    for number in ["32768", &long.len().to_string(), "at least", "16 output"] {
        assert!(err.message.contains(number), "{}", err.message);
    }
    // Dense text that fits: 2,500 tokens of 128 spaces each (320 kB) with room for
    // 2,768, far over the size where the bound is consulted, is accepted.
    let dense = format!("{}x", " ".repeat(128 * 2500));
    let prepared = model
        .prepare_completion(&completion(&dense, 30_000))
        .unwrap();
    assert!((2500..=2768).contains(&prepared.token_ids.len()));
}

#[test]
fn negative_token_ids_are_refused_naming_the_field_and_the_vocabulary() {
    let model = load();
    for (prompt, shown) in [
        (json!([-1, -5]), "prompt[0] is -1"),
        (json!([5, 1.5]), "prompt[1] is 1.5"),
        (json!([1, 99999999999u64]), "prompt[1] is 99999999999"),
        (json!([9707, 200000]), "prompt[1] is 200000"),
    ] {
        let req: CompletionRequest = parse_body(
            json!({"model": "qwen", "prompt": prompt})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        let err = model.prepare_completion(&req).unwrap_err();
        assert_eq!(err.status.as_u16(), 400, "{prompt}");
        assert_eq!(err.param.as_deref(), Some("prompt"));
        assert!(
            err.message.contains("integers from 0 to 151850") && err.message.contains(shown),
            "{}",
            err.message
        );
    }
}
