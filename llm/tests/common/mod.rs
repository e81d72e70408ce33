//! What the model directory tests share: the directory `make model` builds (Qwen's
//! vocabulary: byte-level BPE, NFC, ChatML special tokens) and texts that stress a tokenizer.
#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;

use dynamo_llm::ModelDir;

pub fn model_dir() -> PathBuf {
    let dir = std::env::var_os("DYNAMO_MODEL_DIR").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../.cache/models/qwen-mock"
            ))
        },
        PathBuf::from,
    );
    assert!(
        dir.join("tokenizer.json").exists(),
        "no model directory at {}: run `make model`",
        dir.display()
    );
    dir
}

pub fn load() -> ModelDir {
    ModelDir::load(&model_dir(), Some("qwen")).expect("the model directory loads")
}

/// English-like text of `words` words.
pub fn prose(words: usize) -> String {
    const WORDS: [&str; 12] = [
        "the",
        "river",
        "carried",
        "stones",
        "past",
        "a",
        "quiet",
        "village,",
        "where",
        "people",
        "listened.",
        "Then",
    ];
    (0..words)
        .map(|i| WORDS[(i * 7 + i / 5) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Texts that stress each step: long tokens, CJK, emoji, text NFC changes (combining
/// marks, Hangul jamo, compatibility characters), special tokens in the text, special
/// tokens followed by a mark that NFC would join to them, bytes of every kind.
pub fn hard_texts() -> Vec<String> {
    let mut texts = vec![
        prose(3000),
        " ".repeat(5000),
        "-".repeat(4000) + &"=".repeat(3000),
        "\n\n\t  \r\n".repeat(700),
        "文字の処理と東京の天気、한국어 문장입니다. ".repeat(200),
        "🚀🌍👩‍👩‍👧‍👦 ".repeat(400),
        "e\u{301}a\u{30A}\u{323} \u{1100}\u{1161}\u{11A8} \u{212B}\u{2126}".repeat(300),
        "<|im_start|>user\nhi<|im_end|>\u{338} <|endoftext|>\u{301}x".repeat(200),
        "\u{FF21}\u{1D400}\u{FB03} \u{1FBE}\u{308}\u{301}".repeat(300),
        (0..20_000u32)
            .filter_map(|i| char::from_u32(i.wrapping_mul(2_654_435_761) % 0x2FFFF))
            .collect(),
    ];
    texts.push(texts.concat());
    texts
}
