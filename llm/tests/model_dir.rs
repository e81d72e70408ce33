//! A real model directory: the one `make model` derives from Qwen's vocabulary.

use dynamo_llm::openai::{ChatCompletionRequest, CompletionRequest, parse_body};
use dynamo_llm::{Endpoint, ModelDir};
use serde_json::json;

mod common;
use common::{load, model_dir};

fn chat(body: serde_json::Value) -> ChatCompletionRequest {
    parse_body(body.to_string().as_bytes()).unwrap()
}

#[test]
fn loads_tokenizer_template_context_and_eos() {
    let model = load();
    assert_eq!(model.name, "qwen");
    assert_eq!(model.max_context, 32768);
    assert_eq!(model.eos_token_ids, vec![151645, 151643]);
    assert_eq!(model.vocab_size(), 151851);
    let named_after_dir = ModelDir::load(&model_dir(), None).unwrap();
    assert_eq!(named_after_dir.name, "qwen-mock");
}

#[test]
fn tokenizes_like_qwen_and_round_trips_text() {
    let model = load();
    // "Hello world" is two tokens in Qwen's vocabulary: "Hello" and " world".
    assert_eq!(model.encode("Hello world"), vec![9707, 1879]);
    let text = "Ünïcödé 文字 🚀 and code: fn main() {}";
    assert_eq!(model.decode(&model.encode(text)), text);
}

#[test]
fn chat_renders_chatml_with_special_tokens() {
    let model = load();
    let req = chat(
        json!({"model": "qwen", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    );
    let prepared = model.prepare_chat(&req).unwrap();
    assert_eq!(prepared.endpoint, Endpoint::Chat);
    let text = model.tokenizer.decode(&prepared.token_ids, false).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        prepared.token_ids[0], 151644,
        "<|im_start|> is one special token"
    );
    assert_eq!(prepared.max_tokens, 4);
}

#[test]
fn a_final_message_left_open_is_continued_token_for_token() {
    let model = load();
    let user = json!({"role": "user", "content": "Tell a story"});
    let asked = chat(json!({"model": "qwen", "max_tokens": 8, "messages": [user]}));
    let prefilled = chat(json!({"model": "qwen", "max_tokens": 8,
        "messages": [user, {"role": "assistant", "content": " once upon"}],
        "add_generation_prompt": false, "continue_final_message": true}));
    // The open assistant turn is the opened one with the answer so far after it.
    let mut expected = model.prepare_chat(&asked).unwrap().token_ids;
    expected.extend(model.encode(" once upon"));
    assert_eq!(model.prepare_chat(&prefilled).unwrap().token_ids, expected);
    // vLLM's rule: a final message cannot be continued after a new turn is opened.
    let both = chat(json!({"model": "qwen",
        "messages": [user, {"role": "assistant", "content": "x"}],
        "continue_final_message": true}));
    let err = model.prepare_chat(&both).unwrap_err();
    assert_eq!(
        err.param.as_deref(),
        Some("continue_final_message"),
        "{err:?}"
    );
}

#[test]
fn a_prompt_tokenized_upstream_is_taken_as_it_is_and_checked() {
    let model = load();
    let body = json!({"model": "qwen", "messages": [{"role": "user", "content": "Hi"}],
                      "max_tokens": 4});
    let rendered = model.prepare_chat(&chat(body.clone())).unwrap();
    let mut forwarded = body.clone();
    forwarded["nvext"] = json!({"token_data": rendered.token_ids});
    assert_eq!(model.prepare_chat(&chat(forwarded)).unwrap(), rendered);
    // The ids are the prompt, whatever the messages say; the checks still apply.
    let mut other = body.clone();
    other["nvext"] = json!({"token_data": [9707, 1879]});
    assert_eq!(
        model.prepare_chat(&chat(other)).unwrap().token_ids,
        [9707, 1879]
    );
    for bad in [
        json!([-1]),
        json!([999_999_999]),
        json!("9707"),
        json!([1.5]),
    ] {
        let mut body = body.clone();
        body["nvext"] = json!({ "token_data": bad });
        let err = model.prepare_chat(&chat(body)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("nvext"), "{bad}");
    }
    let mut empty = body;
    empty["nvext"] = json!({"token_data": []});
    assert_eq!(
        model
            .prepare_chat(&chat(empty))
            .unwrap_err()
            .param
            .as_deref(),
        Some("messages")
    );
}

#[test]
fn content_parts_are_joined_and_images_refused() {
    let model = load();
    let parts = chat(
        json!({"model": "qwen", "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Hi"}]}]}),
    );
    let plain = chat(
        json!({"model": "qwen", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(
        model.prepare_chat(&parts).unwrap().token_ids,
        model.prepare_chat(&plain).unwrap().token_ids
    );
    let image = chat(
        json!({"model": "qwen", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}),
    );
    let err = model.prepare_chat(&image).unwrap_err();
    assert_eq!(err.status.as_u16(), 400);
    assert!(err.message.contains("image_url"), "{}", err.message);
}

#[test]
fn client_mistakes_are_4xx_naming_the_field() {
    let model = load();
    let cases = [
        (
            json!({"model": "other", "messages": [{"role": "user", "content": "x"}]}),
            404,
            "model",
        ),
        (json!({"model": "qwen", "messages": []}), 400, "messages"),
        (
            json!({"model": "qwen", "messages": [{"role": "wizard", "content": "x"}]}),
            400,
            "messages",
        ),
        (
            json!({"model": "qwen", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}),
            400,
            "max_tokens",
        ),
        (
            json!({"model": "qwen", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}),
            400,
            "max_completion_tokens",
        ),
        (
            json!({"model": "qwen", "messages": [{"role": "user", "content": "x"}], "n": 0}),
            400,
            "n",
        ),
        (
            json!({"model": "qwen", "messages": [{"role": "user", "content": "x"}], "n": 129}),
            400,
            "n",
        ),
        (
            json!({"model": "qwen", "messages": [{"role": "user", "content": "x"}], "temperature": 3.0}),
            400,
            "temperature",
        ),
        (
            json!({"model": "qwen", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "min_tokens": 5}),
            400,
            "min_tokens",
        ),
    ];
    for (body, status, param) in cases {
        let err = model.prepare_chat(&chat(body.clone())).unwrap_err();
        assert_eq!(err.status.as_u16(), status, "{body}");
        assert_eq!(err.param.as_deref(), Some(param), "{body}");
    }
}

#[test]
fn n_answers_are_let_through_up_to_openais_bound() {
    let model = load();
    let ask = |n: Option<i64>| {
        let mut body = json!({"model": "qwen", "messages": [{"role": "user", "content": "x"}]});
        if let Some(n) = n {
            body["n"] = json!(n);
        }
        model.prepare_chat(&chat(body)).map(|p| p.n)
    };
    assert_eq!(ask(None).unwrap(), 1);
    assert_eq!(ask(Some(3)).unwrap(), 3);
    assert_eq!(ask(Some(128)).unwrap(), 128);
    assert_eq!(ask(Some(-1)).unwrap_err().param.as_deref(), Some("n"));
}

#[test]
fn over_long_prompt_is_a_400_and_default_max_tokens_fills_the_context() {
    let model = load();
    let long = "word ".repeat(40_000);
    let err = model
        .prepare_chat(&chat(
            json!({"model": "qwen", "messages": [{"role": "user", "content": long}]}),
        ))
        .unwrap_err();
    assert_eq!(err.status.as_u16(), 400);
    assert_eq!(err.code, Some("context_length_exceeded"));

    let req: CompletionRequest = parse_body(br#"{"model":"qwen","prompt":"Hello world"}"#).unwrap();
    let prepared = model.prepare_completion(&req).unwrap();
    assert_eq!(prepared.token_ids, vec![9707, 1879]);
    assert_eq!(prepared.max_tokens, 32768 - 2);
}

#[test]
fn completion_prompts_as_tokens_are_checked_against_the_vocabulary() {
    let model = load();
    let ok: CompletionRequest = parse_body(
        br#"{"model":"qwen","prompt":[9707,1879],"max_tokens":3,"stream":true,
            "stream_options":{"include_usage":true},"nvext":{"agent_hints":{"priority":5}}}"#,
    )
    .unwrap();
    let prepared = model.prepare_completion(&ok).unwrap();
    assert!(prepared.stream && prepared.include_usage);
    assert_eq!(prepared.hints.priority, 5);
    let bad: CompletionRequest = parse_body(br#"{"model":"qwen","prompt":[999999999]}"#).unwrap();
    assert_eq!(
        model.prepare_completion(&bad).unwrap_err().param.as_deref(),
        Some("prompt")
    );
    let batch: CompletionRequest = parse_body(br#"{"model":"qwen","prompt":["a","b"]}"#).unwrap();
    assert_eq!(
        model
            .prepare_completion(&batch)
            .unwrap_err()
            .status
            .as_u16(),
        400
    );
}
