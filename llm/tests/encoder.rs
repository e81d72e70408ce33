//! The fast prompt encoder (fastokens) gives exactly the ids of Hugging Face's `tokenizers`,
//! which remains the reference: on texts that stress every step of Qwen's pipeline and on
//! generated ones.

use std::sync::LazyLock;

use dynamo_llm::ModelDir;
use proptest::prelude::*;

mod common;
use common::{hard_texts, load};

static MODEL: LazyLock<ModelDir> = LazyLock::new(load);

fn reference(model: &ModelDir, text: &str) -> Vec<u32> {
    model
        .tokenizer
        .encode_fast(text, false)
        .expect("tokenizers encodes any text")
        .get_ids()
        .to_vec()
}

#[test]
fn qwen_prompts_are_encoded_by_fastokens_with_the_reference_ids() {
    let model = &*MODEL;
    assert_eq!(model.encoder(), "fastokens");
    for text in hard_texts() {
        let (fast, slow) = (model.encode(&text), reference(model, &text));
        assert!(!fast.is_empty());
        assert_eq!(
            fast,
            slow,
            "{}...",
            text.chars().take(60).collect::<String>()
        );
    }
}

/// Pieces whose joins stress the pre-tokenizer (contractions, digit runs, whitespace before
/// text, punctuation runs, newlines), NFC (marks that join the character before), added
/// tokens (in and beside text) and multi-byte characters.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "<|im_start|>",
            "<|im_end|>",
            "<|endoftext|>",
            "<think>",
            "'s",
            "'LL",
            "'d ",
            "\u{301}",
            "\u{338}",
            "\u{1161}",
            "\r\n",
            "\n\n",
            "   ",
            "\t",
            "..."
        ])
        .prop_map(str::to_owned),
        "[a-zA-Z]{1,12}",
        "[0-9]{1,7}",
        "[ \\n]{0,3}[!-/:-@]{1,4}",
        "\\PC{1,6}",
        any::<char>().prop_map(String::from),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn generated_text_gets_the_reference_ids(pieces in prop::collection::vec(piece(), 0..40)) {
        let text = pieces.concat();
        prop_assert_eq!(MODEL.encode(&text), reference(&MODEL, &text));
    }
}
