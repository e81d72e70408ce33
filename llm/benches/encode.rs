//! Prompt encoding, the largest share of a router's CPU per request: the same chat prompts
//! (ChatML, prose with numbers and punctuation) through fastokens, which `ModelDir::encode`
//! uses, and through Hugging Face's `tokenizers`, which it falls back to. Each iteration
//! encodes a prompt not seen before, so neither library's caches of repeated words help
//! more than real traffic would let them.
//!
//! `cargo bench -p dynamo-llm --bench encode` (needs `make model`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// A ChatML prompt of about `words` words; `variant` changes its numbers.
fn chat_prompt(words: usize, variant: usize) -> String {
    let mut body = common::prose(words);
    for (i, at) in (0..body.len()).step_by(97).enumerate().rev() {
        if body.is_char_boundary(at) {
            body.insert_str(at, &format!(" {}", variant * 7919 + i));
        }
    }
    format!(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n"
    )
}

fn encode(c: &mut Criterion) {
    let model = common::load();
    let mut group = c.benchmark_group("encode");
    // About 2.3k and 7.5k tokens: the reference kit's shared-prefix prompts and its long ones.
    for words in [1_400, 4_600] {
        let prompts: Vec<String> = (0..64).map(|v| chat_prompt(words, v)).collect();
        let tokens = model.encode(&prompts[0]).len();
        group.throughput(Throughput::Elements(tokens as u64));
        let mut next = 0;
        group.bench_function(BenchmarkId::new("fastokens", tokens), |b| {
            b.iter(|| {
                next = (next + 1) % prompts.len();
                black_box(model.encode(&prompts[next]))
            })
        });
        group.bench_function(BenchmarkId::new("tokenizers", tokens), |b| {
            b.iter(|| {
                next = (next + 1) % prompts.len();
                black_box(model.tokenizer.encode_fast(prompts[next].as_str(), false))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, encode);
criterion_main!(benches);
