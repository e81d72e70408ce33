//! `stop`, `logprobs` and `n` through the mock engine's HTTP surface, on real sockets:
//! honoured as vLLM's OpenAI server honours them, or refused with a 400 naming them.

use std::path::PathBuf;
use std::time::Duration;

use common::{ROOT, metric, post, serve, stream};
use dynamo_mocker::EngineConfig;
use dynamo_mocker::server::RunningServer;
use serde_json::{Value, json};

mod common;

fn chat(extra: Value) -> Value {
    let mut body =
        json!({"model": "qwen", "messages": [{"role": "user", "content": "Tell me a story"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn completion(extra: Value) -> Value {
    let mut body = json!({"model": "qwen", "prompt": "Once upon a time"});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The output tokens of a text the mock engine wrote: each is a space and a word.
fn tokens(text: &str) -> Vec<String> {
    text.split(' ').skip(1).map(|w| format!(" {w}")).collect()
}

/// How many of `text`'s tokens it takes to hold its first `bytes` bytes.
fn tokens_to_cover(text: &str, bytes: usize) -> usize {
    let mut end = 0;
    tokens(text)
        .iter()
        .take_while(|t| {
            let covered = end >= bytes;
            end += t.len();
            !covered
        })
        .count()
}

async fn wait_for_metric(server: &RunningServer, name: &str, value: f64) {
    for _ in 0..200 {
        if metric(server, name).await == value {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{name} never reached {value}: {}",
        metric(server, name).await
    );
}

const ABORTED: &str = "vllm:request_success_total{model_name=\"qwen\",finished_reason=\"abort\"}";

#[tokio::test]
async fn an_answer_ends_before_its_stop_string_whole_and_streamed() {
    let server = serve(EngineConfig::default()).await;
    let max_tokens = 60;
    let (status, full) = post(
        &server,
        "/v1/chat/completions",
        &chat(json!({"seed": 7, "max_tokens": max_tokens})),
    )
    .await;
    assert_eq!(status, 200, "{full}");
    let full_text = full["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    // A stop string across two tokens of the middle of the answer: the last letter of
    // one word, the space and first letter of the next. Streamed, the first word waits
    // until the next shows whether the stop string follows. It may occur earlier too:
    // the answer ends at its first occurrence.
    let words = tokens(&full_text);
    let stop = format!("{}{}", &words[12][words[12].len() - 1..], &words[13][..2]);
    let at = full_text.find(&stop).unwrap();
    let generated = tokens_to_cover(&full_text, at + stop.len());
    assert!(generated < max_tokens, "{full_text:?} {stop}");

    let before = metric(&server, "vllm:generation_tokens_total").await;
    let body =
        chat(json!({"seed": 7, "max_tokens": max_tokens, "stop": [stop.as_str(), "no such text"]}));
    let (status, stopped) = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{stopped}");
    let choice = &stopped["choices"][0];
    assert_eq!(choice["message"]["content"], full_text[..at], "{stopped}");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["stop_reason"], stop.as_str());
    assert_eq!(stopped["usage"]["completion_tokens"], generated);
    // The engine dropped the request at once: at most one more step ran it.
    wait_for_metric(&server, ABORTED, 1.0).await;
    let spent = metric(&server, "vllm:generation_tokens_total").await - before;
    assert!(
        spent <= (generated + 1) as f64,
        "{spent} tokens generated for {generated}"
    );
    assert_eq!(metric(&server, "vllm:num_requests_running").await, 0.0);

    // Streamed: the same text, and no chunk carries what the stop string cuts.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = stream(&server, "/v1/chat/completions", &streamed).await;
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, full_text[..at]);
    let finish = chunks
        .iter()
        .find(|c| !c["choices"][0]["finish_reason"].is_null())
        .unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert_eq!(finish["choices"][0]["stop_reason"], stop.as_str());
    assert_eq!(
        chunks.last().unwrap()["usage"]["completion_tokens"],
        generated
    );

    // Kept in the output, and through completions.
    let (_, full) = post(
        &server,
        "/v1/completions",
        &completion(json!({"seed": 3, "max_tokens": max_tokens})),
    )
    .await;
    let full_text = full["choices"][0]["text"].as_str().unwrap().to_owned();
    let stop = tokens(&full_text)[20].clone(); // with its space
    let at = full_text.find(&stop).unwrap();
    let (_, kept) = post(
        &server,
        "/v1/completions",
        &completion(json!({"seed": 3, "max_tokens": max_tokens, "stop": stop, "include_stop_str_in_output": true})),
    )
    .await;
    assert_eq!(kept["choices"][0]["text"], full_text[..at + stop.len()]);
    assert_eq!(kept["choices"][0]["stop_reason"], stop.as_str());
    assert_eq!(
        kept["usage"]["completion_tokens"],
        tokens_to_cover(&full_text, at + stop.len())
    );
}

#[tokio::test]
async fn a_stop_token_id_ends_the_answer_with_its_text() {
    let server = serve(EngineConfig::default()).await;
    let model = dynamo_llm::ModelDir::load(
        &PathBuf::from(ROOT).join(".cache/models/qwen-mock"),
        Some("qwen"),
    )
    .unwrap();
    let (_, full) = post(
        &server,
        "/v1/completions",
        &completion(json!({"seed": 11, "max_tokens": 30})),
    )
    .await;
    let full_text = full["choices"][0]["text"].as_str().unwrap().to_owned();
    let words = tokens(&full_text);
    let first = words.iter().position(|w| *w == words[9]).unwrap();
    let id = model
        .tokenizer
        .token_to_id(&words[9].replace(' ', "Ġ"))
        .unwrap();
    let (status, stopped) = post(
        &server,
        "/v1/completions",
        &completion(json!({"seed": 11, "max_tokens": 30, "stop_token_ids": [id]})),
    )
    .await;
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(
        stopped["choices"][0]["text"],
        words[..=first].concat(),
        "{stopped}"
    );
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    assert_eq!(stopped["choices"][0]["stop_reason"], id);
    assert_eq!(stopped["usage"]["completion_tokens"], first + 1);
}

#[tokio::test]
async fn malformed_stop_and_logprobs_are_400s_naming_the_field() {
    let server = serve(EngineConfig::default()).await;
    for (path, body, param) in [
        ("/v1/chat/completions", chat(json!({"stop": 5})), "stop"),
        ("/v1/chat/completions", chat(json!({"stop": ""})), "stop"),
        (
            "/v1/chat/completions",
            chat(json!({"stop": ["a", "b", "c", "d", "e"]})),
            "stop",
        ),
        (
            "/v1/completions",
            completion(json!({"stop": [["a"]]})),
            "stop",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stop_token_ids": "7"})),
            "stop_token_ids",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_logprobs": 2})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 21})),
            "top_logprobs",
        ),
        (
            "/v1/completions",
            completion(json!({"logprobs": 21})),
            "logprobs",
        ),
        (
            "/v1/completions",
            completion(json!({"logprobs": true})),
            "logprobs",
        ),
        ("/v1/chat/completions", chat(json!({"n": 0})), "n"),
        ("/v1/completions", completion(json!({"n": -2})), "n"),
        ("/v1/chat/completions", chat(json!({"n": 129})), "n"),
    ] {
        let (status, answer) = post(&server, path, &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{answer}");
    }
}

/// Checks one chat token's logprobs: the sampled token first and most likely, then
/// `top - 1` distinct vocabulary words, descending; its bytes its UTF-8.
fn check_chat_token(entry: &Value, top: usize) {
    let token = entry["token"].as_str().unwrap();
    let logprob = entry["logprob"].as_f64().unwrap();
    assert!(logprob <= 0.0, "{entry}");
    assert_eq!(entry["bytes"], json!(token.as_bytes()));
    let list = entry["top_logprobs"].as_array().unwrap();
    assert_eq!(list.len(), top, "{entry}");
    if top > 0 {
        assert_eq!(
            (list[0]["token"].as_str(), list[0]["logprob"].as_f64()),
            (Some(token), Some(logprob))
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, alt) in list.iter().enumerate() {
        let word = alt["token"].as_str().unwrap();
        assert!(
            word.starts_with(' ') && word[1..].chars().all(|c| c.is_ascii_lowercase()),
            "{word:?}"
        );
        assert!(seen.insert(word), "{word:?} twice in {entry}");
        assert_eq!(alt["bytes"], json!(word.as_bytes()));
        if i > 0 {
            assert!(
                alt["logprob"].as_f64() < list[i - 1]["logprob"].as_f64(),
                "{entry}"
            );
        }
    }
}

#[tokio::test]
async fn logprobs_have_openais_shapes_and_are_a_function_of_the_token_stream() {
    let server = serve(EngineConfig::default()).await;
    let body = chat(json!({"seed": 5, "max_tokens": 12, "logprobs": true, "top_logprobs": 4}));
    let (status, whole) = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    let content = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 12);
    let text: String = content
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert_eq!(whole["choices"][0]["message"]["content"], text);
    content.iter().for_each(|e| check_chat_token(e, 4));
    // The same request, the same values; another seed, others.
    let (_, again) = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(
        again["choices"][0]["logprobs"],
        whole["choices"][0]["logprobs"]
    );
    let mut other = body.clone();
    other["seed"] = json!(6);
    let (_, other) = post(&server, "/v1/chat/completions", &other).await;
    assert_ne!(
        other["choices"][0]["logprobs"],
        whole["choices"][0]["logprobs"]
    );

    // Streamed, each chunk carries its own tokens' logprobs.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = stream(&server, "/v1/chat/completions", &streamed).await;
    let mut all = Vec::new();
    for chunk in &chunks {
        let choice = &chunk["choices"][0];
        let Some(entries) = choice["logprobs"]["content"].as_array() else {
            continue;
        };
        let tokens: String = entries
            .iter()
            .map(|e| e["token"].as_str().unwrap())
            .collect();
        assert_eq!(choice["delta"]["content"], tokens, "{chunk}");
        all.extend(entries.iter().cloned());
    }
    assert_eq!(
        Value::Array(all),
        whole["choices"][0]["logprobs"]["content"]
    );

    // logprobs without alternatives; none asked, none given.
    let (_, bare) = post(
        &server,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 3, "logprobs": true})),
    )
    .await;
    let content = bare["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    content.iter().for_each(|e| check_chat_token(e, 0));
    let (_, none) = post(
        &server,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 3})),
    )
    .await;
    assert!(
        none["choices"][0]
            .get("logprobs")
            .is_none_or(Value::is_null),
        "{none}"
    );

    // Completions: parallel lists, one map of alternatives per token.
    let (status, legacy) = post(
        &server,
        "/v1/completions",
        &completion(json!({"seed": 5, "max_tokens": 6, "logprobs": 3})),
    )
    .await;
    assert_eq!(status, 200, "{legacy}");
    let lp = &legacy["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), 6);
    assert_eq!(legacy["choices"][0]["text"], tokens.concat());
    let mut offset = 0;
    for (i, token) in tokens.iter().enumerate() {
        assert_eq!(lp["text_offset"][i], offset);
        offset += token.chars().count();
        let logprob = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(logprob <= 0.0);
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[*token].as_f64(), Some(logprob));
        assert!(top.values().all(|v| v.as_f64().unwrap() <= logprob));
    }
    // Streamed completions continue the offsets across chunks.
    let chunks = stream(
        &server,
        "/v1/completions",
        &completion(json!({"seed": 5, "max_tokens": 6, "logprobs": 3, "stream": true})),
    )
    .await;
    let offsets: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["text_offset"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(Value::Array(offsets), lp["text_offset"]);
}

#[tokio::test]
async fn n_answers_are_distinct_share_the_prompts_blocks_and_sum_their_tokens() {
    let server = serve(EngineConfig {
        block_size: 16,
        ..EngineConfig::default()
    })
    .await;
    let prompt: String = (0..120).map(|i| format!("w{i} ")).collect();
    let body = |extra: Value| {
        let mut body = json!({"model": "qwen", "messages": [{"role": "user", "content": prompt}], "seed": 9, "max_tokens": 8});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let hits_before = metric(&server, "vllm:prefix_cache_hits_total").await;
    let (status, three) = post(&server, "/v1/chat/completions", &body(json!({"n": 3}))).await;
    assert_eq!(status, 200, "{three}");
    let choices = three["choices"].as_array().unwrap();
    let texts: Vec<&str> = choices
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        choices
            .iter()
            .map(|c| c["index"].clone())
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert!(
        texts[0] != texts[1] && texts[1] != texts[2] && texts[0] != texts[2],
        "{texts:?}"
    );
    assert!(choices.iter().all(|c| c["finish_reason"] == "length"));
    let prompt_tokens = three["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(three["usage"]["completion_tokens"], 24);
    assert_eq!(three["usage"]["total_tokens"], prompt_tokens + 24);
    // The later two answers found the first one's full prompt blocks cached.
    let shared = (prompt_tokens - 1) / 16 * 16;
    assert_eq!(
        three["usage"]["prompt_tokens_details"]["cached_tokens"],
        shared
    );
    assert_eq!(
        metric(&server, "vllm:prefix_cache_hits_total").await - hits_before,
        (2 * shared) as f64
    );

    // The first choice is the answer the seed gives alone.
    let (_, one) = post(&server, "/v1/chat/completions", &body(json!({}))).await;
    assert_eq!(one["choices"][0]["message"]["content"], texts[0]);
    assert_eq!(one["usage"]["prompt_tokens"], prompt_tokens);

    // Streamed: a role and a finish chunk per choice, interleaved, one [DONE].
    let chunks = stream(
        &server,
        "/v1/chat/completions",
        &body(json!({"n": 3, "stream": true, "stream_options": {"include_usage": true}})),
    )
    .await;
    for (index, text) in texts.iter().enumerate() {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].as_array()?.first())
            .filter(|c| c["index"] == index)
            .collect();
        assert_eq!(mine[0]["delta"]["role"], "assistant");
        assert_eq!(
            mine.iter()
                .filter(|c| !c["delta"]["role"].is_null())
                .count(),
            1
        );
        let content: String = mine
            .iter()
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, *text);
        assert_eq!(
            mine.iter()
                .filter(|c| !c["finish_reason"].is_null())
                .map(|c| c["finish_reason"].clone())
                .collect::<Vec<_>>(),
            ["length"]
        );
    }
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 24);
    assert_eq!(usage["prompt_tokens"], prompt_tokens);

    // Completions too, and each choice ends at the stop string on its own.
    let body = json!({"model": "qwen", "prompt": prompt, "n": 2, "max_tokens": 10, "seed": 1});
    let (status, two) = post(&server, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{two}");
    assert_eq!(two["usage"]["completion_tokens"], 20);
    let full: Vec<String> = (0..2)
        .map(|i| two["choices"][i]["text"].as_str().unwrap().to_owned())
        .collect();
    let stop = tokens(&full[1])[4].trim().to_owned();
    let mut stopped = body.clone();
    stopped["stop"] = json!(stop);
    let (_, stopped) = post(&server, "/v1/completions", &stopped).await;
    let mut completion_tokens = 0;
    for (i, full) in full.iter().enumerate() {
        let choice = &stopped["choices"][i];
        match full.find(&stop) {
            Some(at) => {
                assert_eq!(choice["text"], full[..at], "{stopped}");
                assert_eq!(choice["stop_reason"], stop.as_str());
                completion_tokens += tokens_to_cover(full, at + stop.len());
            }
            None => {
                assert_eq!(choice["text"], *full, "{stopped}");
                completion_tokens += 10;
            }
        }
    }
    assert_eq!(stopped["choices"][1]["finish_reason"], "stop");
    assert_eq!(stopped["usage"]["completion_tokens"], completion_tokens);
}

#[tokio::test]
async fn n_answers_that_cannot_share_the_kv_pool_are_refused() {
    let server = serve(EngineConfig {
        num_gpu_blocks: 8,
        block_size: 16,
        ..EngineConfig::default()
    })
    .await;
    // One answer fits (4 blocks of 16); three cannot be held at once.
    let body = completion(json!({"max_tokens": 50}));
    let (status, one) = post(&server, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{one}");
    let mut three = body.clone();
    three["n"] = json!(3);
    let (status, refused) = post(&server, "/v1/completions", &three).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "n");
    assert_eq!(refused["error"]["code"], "context_length_exceeded");
}
