//! Raw bytes (UTF-8) as a prompt's text through the prompt encoder the frontend and the
//! mock engine use (`dynamo_llm::ModelDir::encode`: fastokens for Qwen's vocabulary),
//! against Hugging Face's `tokenizers` as the reference, on the model directory `make
//! model` builds (or `DYNAMO_MODEL_DIR`). Nothing may panic; the ids are the reference's.
#![no_main]

use std::sync::LazyLock;

use dynamo_llm::ModelDir;
use libfuzzer_sys::fuzz_target;

#[path = "../../llm/tests/common/mod.rs"]
mod common;

static MODEL: LazyLock<ModelDir> = LazyLock::new(|| {
    let model = common::load();
    assert_eq!(model.encoder(), "fastokens");
    model
});

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let reference = MODEL
        .tokenizer
        .encode_fast(text, false)
        .expect("tokenizers encodes any text");
    assert_eq!(MODEL.encode(text), reference.get_ids());
});
