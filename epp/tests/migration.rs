//! Request migration over real sockets, against scripted pods whose answers break off
//! where the test says (a real engine dies at a random point; see
//! `e2e/tests/migration.rs`): a stream cut twice continues on a third pod as one stream
//! with every token once; a chat continues from an open assistant message until the
//! migration limit, then ends with an error event and `[DONE]`; a whole answer cut short
//! is asked again, or without migration is a 502.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use common::*;
use dynamo_epp::config::RouterConfig;
use dynamo_epp::{Epp, start};
use dynamo_kvcache::RouterMode;
use futures::StreamExt;
use serde_json::{Value, json};

/// One Qwen token each, so that the picker's count of the text sent is the pods' count.
const WORDS: [&str; 8] = [" the", " cat", " sat", " on", " a", " red", " mat", " and"];
/// Tokens a breaking answer sends before it breaks.
const BEFORE_BREAK: usize = 3;
const MAX_TOKENS: usize = 10;
const PROMPT: &str = "Tell a story:";

/// Pods that continue a prompt with [`WORDS`] from where it stops (the words after the
/// prompt, or in an assistant message left open), the first `breaks` answers of which
/// break off after [`BEFORE_BREAK`] tokens. They keep the bodies they got.
struct Script {
    breaks: AtomicUsize,
    answers: AtomicUsize,
    bodies: Mutex<Vec<Value>>,
}

fn word(position: usize) -> &'static str {
    WORDS[position % WORDS.len()]
}

fn words(from: usize, to: usize) -> String {
    (from..to).map(word).collect()
}

/// Where an answer to `body` starts: the words it already holds.
fn position(body: &Value) -> usize {
    let continued = match body["prompt"].as_str() {
        Some(prompt) => prompt.strip_prefix(PROMPT).unwrap(),
        None if body["continue_final_message"] == true => {
            let messages = body["messages"].as_array().unwrap();
            messages.last().unwrap()["content"].as_str().unwrap()
        }
        None => "",
    };
    continued.split_whitespace().count()
}

async fn answer(State(script): State<Arc<Script>>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap();
    script.bodies.lock().unwrap().push(body.clone());
    let n = script.answers.fetch_add(1, Ordering::SeqCst);
    let breaks = script
        .breaks
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(1))
        .is_ok();
    let chat = body.get("messages").is_some();
    let from = position(&body);
    let count = body["max_tokens"].as_u64().unwrap() as usize;
    let (id, object) = match chat {
        true => (format!("chatcmpl-{n}"), "chat.completion.chunk"),
        false => (format!("cmpl-{n}"), "text_completion"),
    };
    let event = |choices: Value, usage: Option<Value>| {
        let mut e = json!({"id": id, "object": object, "created": n, "model": MODEL,
                           "choices": choices});
        if let Some(usage) = usage {
            e["usage"] = usage;
        }
        format!("data: {e}\n\n")
    };
    let piece = |text: &str, finish: Option<&str>| match chat {
        true => json!([{"index": 0, "delta": {"content": text}, "finish_reason": finish}]),
        false => json!([{"index": 0, "text": text, "finish_reason": finish}]),
    };
    let sent = if breaks { BEFORE_BREAK } else { count };
    let mut frames = Vec::new();
    if body["stream"] == true {
        if chat {
            let role = json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                               "finish_reason": null}]);
            frames.push(event(role, None));
        }
        frames.extend((from..from + sent).map(|p| event(piece(word(p), None), None)));
        if !breaks {
            frames.push(event(piece("", Some("length")), None));
            let usage = json!({"prompt_tokens": 99, "completion_tokens": count,
                               "total_tokens": 99 + count});
            frames.push(event(json!([]), Some(usage)));
            frames.push("data: [DONE]\n\n".to_owned());
        }
    } else {
        let whole = json!({"id": id, "object": "text_completion", "created": n,
            "model": MODEL, "choices": [{"index": 0, "text": words(from, from + count),
            "finish_reason": "length"}], "usage": {"prompt_tokens": 99,
            "completion_tokens": count, "total_tokens": 99 + count}})
        .to_string();
        let cut = if breaks { whole.len() / 2 } else { whole.len() };
        frames.push(whole[..cut].to_owned());
    }
    let content_type = match body["stream"] == true {
        true => "text/event-stream",
        false => "application/json",
    };
    let frames = futures::stream::iter(frames.into_iter().map(|f| Ok(Bytes::from(f))));
    // A break: the connection closes mid-body once what came before is on its way.
    let cut = futures::stream::once(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Err(std::io::Error::other("the engine died"))
    })
    .filter(move |_| std::future::ready(breaks));
    Response::builder()
        .header("content-type", content_type)
        .body(Body::from_stream(frames.chain(cut)))
        .unwrap()
}

impl Script {
    fn new(breaks: usize) -> Arc<Self> {
        Arc::new(Script {
            breaks: AtomicUsize::new(breaks),
            answers: AtomicUsize::new(0),
            bodies: Mutex::new(Vec::new()),
        })
    }

    /// One more scripted pod serving this script: its endpoints file entry.
    async fn pod(self: &Arc<Self>) -> Value {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/v1/completions", post(answer))
            .route("/v1/chat/completions", post(answer))
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        // No KV stream: the pods are used in round-robin.
        json!({"address": address.to_string(), "kv_events": format!("http://{address}")})
    }

    /// `pods` scripted pods serving one script, in the endpoints file.
    async fn start(pods: usize, breaks: usize, file: &EndpointsFile) -> Arc<Self> {
        let script = Self::new(breaks);
        let mut entries = Vec::new();
        for _ in 0..pods {
            entries.push(script.pod().await);
        }
        file.write(&entries);
        script
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }
}

async fn picker(file: &EndpointsFile, pods: usize, migration_limit: u32) -> Epp {
    picker_waiting(file, pods, migration_limit, None).await
}

/// [`picker`] with `--migration-wait` other than its default.
async fn picker_waiting(
    file: &EndpointsFile,
    pods: usize,
    migration_limit: u32,
    migration_wait: Option<Duration>,
) -> Epp {
    let router = RouterConfig {
        mode: RouterMode::RoundRobin,
        ..RouterConfig::default()
    };
    let mut config = config(file, router);
    config.frontend.migration_limit = migration_limit;
    if let Some(wait) = migration_wait {
        config.frontend.migration_wait = wait;
    }
    let epp = start(config).await.expect("picker starts");
    eventually("the pods", || async {
        epp.router.endpoints().len() == pods
    })
    .await;
    epp
}

async fn send(epp: &Epp, path: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("http://{}{path}", epp.http_addr))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// The data payloads of an SSE body.
fn events(body: &str) -> Vec<&str> {
    body.split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .collect()
}

/// The parsed events of an SSE body that ends with `[DONE]`, less that.
fn events_before_done(body: &str) -> Vec<Value> {
    let frames = events(body);
    assert_eq!(frames.last(), Some(&"[DONE]"), "{body}");
    frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(f).unwrap())
        .collect()
}

fn text_of(events: &[Value]) -> String {
    events
        .iter()
        .flat_map(|e| e["choices"].as_array().into_iter().flatten())
        .filter_map(|c| c["text"].as_str().or(c["delta"]["content"].as_str()))
        .collect()
}

async fn metrics(epp: &Epp) -> String {
    reqwest::get(format!("http://{}/metrics", epp.http_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[test]
fn the_scripts_words_are_one_token_each() {
    let model = model();
    for w in WORDS {
        assert_eq!(model.encode(w).len(), 1, "{w:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_twice_continues_on_a_third_pod_as_one_stream() {
    let file = EndpointsFile::new();
    let script = Script::start(3, 2, &file).await;
    let epp = picker(&file, 3, 3).await;
    let request = json!({"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
        "stream": true, "stream_options": {"include_usage": true}, "seed": 1});
    let response = send(&epp, "/v1/completions", request).await;
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap();
    let parsed = events_before_done(&body);
    // Every token once, in order, under the first answer's id and creation time.
    assert_eq!(text_of(&parsed), words(0, MAX_TOKENS), "{body}");
    for event in &parsed {
        assert_eq!(
            (&event["id"], &event["created"]),
            (&json!("cmpl-0"), &json!(0))
        );
    }
    let usage = &parsed.last().unwrap()["usage"];
    let prompt_tokens = model().encode(PROMPT).len();
    assert_eq!(
        (&usage["prompt_tokens"], &usage["completion_tokens"]),
        (&json!(prompt_tokens), &json!(MAX_TOKENS)),
        "the usage counts the whole answer, and the prompt as the client sent it"
    );
    // Each pod was asked to continue where the previous one stopped.
    let bodies = script.bodies();
    assert_eq!(bodies.len(), 3);
    for (i, body) in bodies.iter().enumerate() {
        let sent = i * BEFORE_BREAK;
        assert_eq!(body["prompt"], format!("{PROMPT}{}", words(0, sent)));
        assert_eq!(body["max_tokens"], MAX_TOKENS - sent);
    }
    let metrics = metrics(&epp).await;
    assert!(
        metrics.contains(&format!(
            "dynamo_frontend_model_migration_total{{model=\"{MODEL}\",migration_type=\"ongoing_request\"}} 2"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("dynamo_epp_migration_resume_seconds_count 2"),
        "{metrics}"
    );
    epp.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_continues_from_an_open_assistant_message_until_the_limit() {
    let file = EndpointsFile::new();
    let script = Script::start(3, 2, &file).await;
    let epp = picker(&file, 3, 1).await;
    let request = json!({"model": MODEL, "max_tokens": MAX_TOKENS, "stream": true,
        "messages": [{"role": "user", "content": PROMPT}]});
    let body = send(&epp, "/v1/chat/completions", request)
        .await
        .text()
        .await
        .unwrap();
    let frames = events(&body);
    let (error, parsed): (Vec<Value>, Vec<Value>) = frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str::<Value>(f).unwrap())
        .partition(|e| e.get("error").is_some());
    // The first pod's three tokens, the second's three, then the limit: an error event
    // and [DONE], never a silent cut.
    assert_eq!(text_of(&parsed), words(0, 2 * BEFORE_BREAK), "{body}");
    let roles = parsed
        .iter()
        .filter(|e| e["choices"][0]["delta"].get("role").is_some())
        .count();
    assert_eq!(roles, 1, "one role, as one stream: {body}");
    assert!(parsed.iter().all(|e| e["id"] == "chatcmpl-0"), "{body}");
    assert_eq!(error.len(), 1, "{body}");
    assert_eq!(error[0]["error"]["code"], "answer_interrupted");
    let message = error[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains("--migration-limit 1"), "{message}");
    assert_eq!(frames.last(), Some(&"[DONE]"), "{body}");
    // vLLM's way to continue a message: the answer so far, left open.
    let continued = &script.bodies()[1];
    assert_eq!(
        continued["messages"],
        json!([{"role": "user", "content": PROMPT},
               {"role": "assistant", "content": words(0, BEFORE_BREAK)}])
    );
    assert_eq!(
        (
            &continued["add_generation_prompt"],
            &continued["continue_final_message"]
        ),
        (&json!(false), &json!(true))
    );
    assert_eq!(continued["max_tokens"], MAX_TOKENS - BEFORE_BREAK);
    epp.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_cut_short_is_asked_again_or_without_migration_is_a_502() {
    let request = json!({"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS});
    for (limit, status) in [(1, 200), (0, 502)] {
        let file = EndpointsFile::new();
        let script = Script::start(2, 1, &file).await;
        let epp = picker(&file, 2, limit).await;
        let response = send(&epp, "/v1/completions", request.clone()).await;
        assert_eq!(response.status(), status, "migration limit {limit}");
        let body: Value = response.json().await.unwrap();
        if limit == 0 {
            assert_eq!(body["error"]["code"], "answer_interrupted", "{body}");
            assert_eq!(script.bodies().len(), 1);
        } else {
            // Nothing had reached the client: asked again, as it was.
            assert_eq!(body["choices"][0]["text"], words(0, MAX_TOKENS), "{body}");
            assert_eq!(script.bodies(), vec![request.clone(), request.clone()]);
        }
        epp.shutdown().await.unwrap();
    }
}

/// The only pod breaks off with the other replica not listed yet: the stream waits
/// (within `--migration-wait`) and continues on the replica once it is listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_with_no_pod_left_waits_for_one_to_be_listed() {
    let file = EndpointsFile::new();
    let script = Script::new(1);
    let first = script.pod().await;
    file.write(std::slice::from_ref(&first));
    let epp = picker(&file, 1, 3).await;
    let request = json!({"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
        "stream": true});
    let answer = tokio::spawn({
        let url = format!("http://{}/v1/completions", epp.http_addr);
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .json(&request)
                .send()
                .await
                .unwrap();
            response.text().await.unwrap()
        }
    });
    // The first pod's answer broke off, and the picker found no pod to continue on.
    let failed = format!(
        "dynamo_epp_upstream_failures_total{{pod=\"{}\"}} 1",
        first["address"].as_str().unwrap()
    );
    eventually("the break", || async {
        metrics(&epp).await.contains(&failed)
    })
    .await;
    let second = script.pod().await;
    file.write(&[first, second]);
    let body = answer.await.unwrap();
    let parsed = events_before_done(&body);
    assert!(parsed.iter().all(|e| e.get("error").is_none()), "{body}");
    assert_eq!(text_of(&parsed), words(0, MAX_TOKENS), "{body}");
    let bodies = script.bodies();
    assert_eq!(bodies.len(), 2);
    assert_eq!(
        bodies[1]["prompt"],
        format!("{PROMPT}{}", words(0, BEFORE_BREAK))
    );
    epp.shutdown().await.unwrap();
}

/// No pod listed within `--migration-wait`: the stream ends with an error event that
/// says so, and `[DONE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_that_finds_no_pod_within_the_wait_ends_the_stream_saying_so() {
    let file = EndpointsFile::new();
    let script = Script::start(1, 1, &file).await;
    let epp = picker_waiting(&file, 1, 3, Some(Duration::from_millis(300))).await;
    let request = json!({"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
        "stream": true});
    let body = send(&epp, "/v1/completions", request)
        .await
        .text()
        .await
        .unwrap();
    let frames = events(&body);
    assert_eq!(frames.last(), Some(&"[DONE]"), "{body}");
    let error: Value = serde_json::from_str(frames[frames.len() - 2]).unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("none was listed within 300ms"),
        "{message}"
    );
    assert_eq!(script.bodies().len(), 1);
    epp.shutdown().await.unwrap();
}
