//! The mock engine as a client meets it: real HTTP, SSE and ZMQ sockets on loopback.

use std::time::Duration;

use common::{metric, serve};
use dynamo_kvcache::vllm_events::{KvEvent, decode_message};
use dynamo_mocker::EngineConfig;
use dynamo_mocker::server::RunningServer;
use dynamo_zmtp::{Event, Options, Sub};
use serde_json::{Value, json};

mod common;

fn url(server: &RunningServer, path: &str) -> String {
    format!("http://{}{path}", server.http_addr)
}

async fn post(server: &RunningServer, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(url(server, path))
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

fn prompt(words: usize) -> String {
    (0..words)
        .map(|i| format!("word{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn chat_answers_whole_with_usage() {
    let server = serve(EngineConfig::default()).await;
    let (status, body) = post(
        &server,
        "/v1/chat/completions",
        json!({"model": "qwen", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content.split_whitespace().count(), 5, "{content:?}");
    assert_eq!(body["usage"]["completion_tokens"], 5);
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 5);

    let (_, models) = reqwest::get(url(&server, "/v1/models"))
        .await
        .map(|r| (r.status(), r))
        .unwrap();
    let models: Value = models.json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "qwen");
}

#[tokio::test]
async fn response_ids_are_unique_across_requests_and_engines() {
    let engines = [
        serve(EngineConfig::default()).await,
        serve(EngineConfig::default()).await,
    ];
    let mut ids = std::collections::BTreeSet::new();
    for server in &engines {
        for (path, body) in [
            (
                "/v1/chat/completions",
                json!({"model": "qwen", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
            ),
            (
                "/v1/completions",
                json!({"model": "qwen", "prompt": "Hi", "max_tokens": 1}),
            ),
        ] {
            for _ in 0..2 {
                let (status, answer) = post(server, path, body.clone()).await;
                assert_eq!(status, 200, "{answer}");
                let id = answer["id"].as_str().unwrap().to_string();
                let prefix = if path.contains("chat") {
                    "chatcmpl-"
                } else {
                    "cmpl-"
                };
                assert!(
                    id.starts_with(prefix) && id.len() == prefix.len() + 32,
                    "{id}"
                );
                ids.insert(id);
            }
        }
    }
    // Both engines number their requests from the same start: the ids still differ.
    assert_eq!(ids.len(), 8, "{ids:?}");
}

#[tokio::test]
async fn parameters_the_mock_engine_cannot_honour_are_refused_by_name() {
    let server = serve(EngineConfig::default()).await;
    let chat = |extra: Value| {
        let mut body = json!({"model": "qwen", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    for (path, body, param) in [
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_object"}})),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tool_choice": "required"})),
            "tool_choice",
        ),
    ] {
        let (status, answer) = post(&server, path, body).await;
        assert_eq!(status, 400, "{param}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("does not implement"), "{message}");
    }
    // Their neutral values are no request for anything.
    for extra in [
        json!({"stop": null, "logprobs": false, "response_format": {"type": "text"}}),
        json!({"stop": [], "tool_choice": "auto"}),
    ] {
        let (status, answer) = post(&server, "/v1/chat/completions", chat(extra)).await;
        assert_eq!(status, 200, "{answer}");
    }
}

#[tokio::test]
async fn embeddings_are_unit_vectors_equal_for_equal_texts_and_bad_input_is_refused() {
    let server = serve(EngineConfig::default()).await;
    let (status, answer) = post(
        &server,
        "/v1/embeddings",
        json!({"model": "qwen", "input": ["the cat sat", "the cat sat", "quantum chromodynamics"]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "list");
    let vectors: Vec<Vec<f64>> = answer["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(vectors[0].len(), 384);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    assert!((dot(&vectors[0], &vectors[0]) - 1.0).abs() < 1e-4);
    assert_eq!(vectors[0], vectors[1]);
    assert!(dot(&vectors[0], &vectors[2]) < 0.9);
    assert!(answer["usage"]["prompt_tokens"].as_u64().unwrap() >= 6);

    let (_, short) = post(
        &server,
        "/v1/embeddings",
        json!({"model": "qwen", "input": "the cat sat", "dimensions": 64}),
    )
    .await;
    assert_eq!(short["data"][0]["embedding"].as_array().unwrap().len(), 64);
    // Base64: the same numbers as little-endian float32 bytes.
    let (_, encoded) = post(
        &server,
        "/v1/embeddings",
        json!({"model": "qwen", "input": "the cat sat", "encoding_format": "base64"}),
    )
    .await;
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let floats: Vec<f32> = vectors[0].iter().map(|&x| x as f32).collect();
    assert_eq!(decoded, floats);

    for (body, status, param) in [
        (json!({"model": "other", "input": "x"}), 404, None),
        (json!({"model": "qwen", "input": []}), 400, Some("input")),
        (json!({"model": "qwen", "input": ""}), 400, Some("input")),
        (
            json!({"model": "qwen", "input": [999999999]}),
            400,
            Some("input"),
        ),
        (
            json!({"model": "qwen", "input": "x", "encoding_format": "binary"}),
            400,
            Some("encoding_format"),
        ),
        (
            json!({"model": "qwen", "input": "x", "dimensions": 0}),
            400,
            Some("dimensions"),
        ),
    ] {
        let (got, answer) = post(&server, "/v1/embeddings", body.clone()).await;
        assert_eq!(got, status, "{body}: {answer}");
        if let Some(param) = param {
            assert_eq!(answer["error"]["param"], param, "{answer}");
        }
    }
}

#[tokio::test]
async fn streams_one_sse_chunk_per_token_then_usage_and_done() {
    let server = serve(EngineConfig::default()).await;
    let mut resp = reqwest::Client::new()
        .post(url(&server, "/v1/chat/completions"))
        .json(
            &json!({"model": "qwen", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    // Chunks arrive as the engine steps (each decode step is several ms), not at once.
    let mut reads = 0;
    let mut text = String::new();
    while let Some(bytes) = resp.chunk().await.unwrap() {
        reads += 1;
        text.push_str(std::str::from_utf8(&bytes).unwrap());
    }
    assert!(reads >= 4, "the body came in {reads} reads");
    let frames: Vec<&str> = text
        .split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| f.strip_prefix("data: ").unwrap())
        .collect();
    // role, 4 tokens, finish, usage, [DONE]
    assert_eq!(frames.len(), 8, "{text}");
    let chunk = |i: usize| serde_json::from_str::<Value>(frames[i]).unwrap();
    assert_eq!(chunk(0)["choices"][0]["delta"]["role"], "assistant");
    assert!(
        chunk(1)["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap()
            .starts_with(' ')
    );
    assert_eq!(chunk(5)["choices"][0]["finish_reason"], "length");
    assert_eq!(chunk(6)["usage"]["completion_tokens"], 4);
    assert_eq!(frames[7], "[DONE]");
}

#[tokio::test]
async fn a_repeated_prompt_hits_the_prefix_cache_and_publishes_only_new_blocks() {
    let server = serve(EngineConfig {
        block_size: 16,
        ..EngineConfig::default()
    })
    .await;
    let (connected, mut handshake) = tokio::sync::watch::channel(false);
    let options = Options {
        monitor: Some(std::sync::Arc::new(move |event: &Event| {
            connected.send_replace(matches!(event, Event::Connected(_)));
        })),
        ..Options::default()
    };
    let endpoint = server.kv_events_endpoint.as_deref().unwrap();
    let mut sub = Sub::connect(
        endpoint.parse().unwrap(),
        vec![bytes::Bytes::new()],
        options,
    );
    // A Sub connects and reads only while asked for a message: keep it asking.
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move { while tx.send(sub.recv().await).is_ok() {} });
    tokio::time::timeout(Duration::from_secs(10), handshake.wait_for(|up| *up))
        .await
        .expect("the subscriber connects")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await; // let the subscription reach the publisher

    let body = json!({"model": "qwen", "prompt": prompt(100), "max_tokens": 1});
    let (status, first) = post(&server, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{first}");
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    // The first request stores every full block of its prompt.
    let message = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("a KV event arrives")
        .unwrap();
    let frames: Vec<&[u8]> = message.iter().map(|f| f.as_ref()).collect();
    let decoded = decode_message(&frames).unwrap();
    assert!(String::from_utf8_lossy(&decoded.topic).ends_with("@qwen"));
    let stored: usize = decoded
        .batch
        .batch
        .events
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored { block_hashes, .. } => block_hashes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(stored as u64, prompt_tokens / 16);

    let (_, second) = post(&server, "/v1/completions", body).await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(cached, prompt_tokens / 16 * 16, "{second}");
    assert_eq!(
        metric(&server, "vllm:prefix_cache_hits_total").await,
        cached as f64
    );
    // Nothing new to store: no further event within a few steps.
    let more = tokio::time::timeout(Duration::from_millis(300), events.recv()).await;
    assert!(more.is_err(), "a repeated prompt published {more:?}");
}

#[tokio::test]
async fn client_mistakes_get_openai_errors() {
    let server = serve(EngineConfig {
        num_gpu_blocks: 8,
        block_size: 16,
        ..EngineConfig::default()
    })
    .await;
    let cases = [
        (json!({"model": "nope", "prompt": "hi"}), 404, "model"),
        (
            json!({"model": "qwen", "prompt": "hi", "max_tokens": -3}),
            400,
            "max_tokens",
        ),
        // 8 blocks of 16 tokens cannot hold 300 prompt tokens.
        (
            json!({"model": "qwen", "prompt": prompt(300), "max_tokens": 1}),
            400,
            "max_tokens",
        ),
    ];
    for (body, status, param) in cases {
        let (got, err) = post(&server, "/v1/completions", body.clone()).await;
        assert_eq!(got, status, "{body}: {err}");
        assert_eq!(err["error"]["param"], param, "{err}");
        assert_eq!(err["error"]["type"], "invalid_request_error");
    }
    let resp = reqwest::Client::new()
        .post(url(&server, "/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let err: Value = resp.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Invalid request body")
    );
}

#[tokio::test]
async fn a_client_that_leaves_cancels_its_request() {
    let server = serve(EngineConfig::default()).await;
    let mut resp = reqwest::Client::new()
        .post(url(&server, "/v1/completions"))
        .json(&json!({"model": "qwen", "prompt": "Hi", "max_tokens": 5000, "stream": true}))
        .send()
        .await
        .unwrap();
    resp.chunk().await.unwrap().expect("a first chunk");
    assert_eq!(metric(&server, "vllm:num_requests_running").await, 1.0);
    drop(resp);
    let mut aborted = 0.0;
    for _ in 0..100 {
        aborted = metric(
            &server,
            "vllm:request_success_total{model_name=\"qwen\",finished_reason=\"abort\"}",
        )
        .await;
        if aborted == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(aborted, 1.0, "the engine aborted the request");
    assert_eq!(metric(&server, "vllm:num_requests_running").await, 0.0);
}

/// A request that reaches the engine while a step runs waits for the step to end, and its
/// TTFT counts the wait, as vLLM's does (it stamps `arrival_time` on receipt). At a tenth
/// of the modelled GPU's speed a 7,000-token prompt (token ids: nothing to tokenize, so it
/// reaches the engine at once) is one prefill step of about 1.4 s; a short prompt sent
/// 300 ms later waits for the rest of that step, then takes one short step of about
/// 0.17 s. Counted from the long step's end its TTFT would be that 0.17 s; counted from
/// its arrival it is about 1.2 s, and over 0.5 s unless the long prompt took more than
/// 0.9 s to reach the engine.
#[tokio::test]
async fn a_request_arriving_mid_step_counts_the_wait_in_its_ttft() {
    let server = serve(EngineConfig {
        speedup_ratio: 0.1,
        ..EngineConfig::default()
    })
    .await;
    let tokens: Vec<u32> = (0..7000).map(|i| 1000 + i % 5000).collect();
    let long = post(
        &server,
        "/v1/completions",
        json!({"model": "qwen", "prompt": tokens, "max_tokens": 1}),
    );
    let short = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        post(
            &server,
            "/v1/completions",
            json!({"model": "qwen", "prompt": "Hello there", "max_tokens": 1}),
        )
        .await
    };
    let ((long, _), (short, _)) = tokio::join!(long, short);
    assert_eq!((long, short), (200, 200));

    let text = reqwest::get(url(&server, "/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let bucket = |le: &str| -> f64 {
        text.lines()
            .find(|l| {
                l.starts_with("vllm:time_to_first_token_seconds_bucket")
                    && l.contains(&format!("le=\"{le}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no TTFT bucket {le} in {text}"))
    };
    assert_eq!(bucket("0.5"), 0.0, "{text}");
    assert_eq!(bucket("+Inf"), 2.0, "{text}");
}
