//! The HTTP frontend against real mock engines and real KV event streams, over real
//! sockets: routing by announced prefix, round-robin, SSE passthrough, OpenAI errors,
//! 503/429, lost streams, file discovery changes, retries and client disconnects.

mod common;

use std::time::Duration;

use common::*;
use dynamo_epp::config::RouterConfig;
use dynamo_epp::{Epp, start};
use dynamo_kvcache::{RouterMode, SaturationThreshold};
use dynamo_llm::ApiError;
use dynamo_llm::error::ENGINE_UNREACHABLE;
use dynamo_llm::openai::ChatCompletionRequest;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Picker {
    epp: Epp,
    base: String,
    http: reqwest::Client,
}

impl Picker {
    async fn start(file: &EndpointsFile, router: RouterConfig) -> Self {
        Self::start_with(config(file, router)).await
    }

    async fn start_with(config: dynamo_epp::Config) -> Self {
        let epp = start(config).await.expect("picker starts");
        let base = format!("http://{}", epp.http_addr);
        Self {
            epp,
            base,
            http: reqwest::Client::new(),
        }
    }

    async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    async fn chat(&self, body: &Value) -> reqwest::Response {
        self.post("/v1/chat/completions", body.to_string()).await
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    async fn wait_healthy(&self) {
        eventually("/health to answer 200", || async {
            self.get("/health").await.status() == 200
        })
        .await;
    }

    async fn wait_endpoints(&self, n: usize) {
        eventually(&format!("{n} endpoints"), || async {
            self.epp.router.endpoints().len() == n
        })
        .await;
    }

    async fn metrics(&self) -> String {
        self.get("/metrics").await.text().await.unwrap()
    }
}

/// Which pods served a request since `before`, by index.
async fn served_by(pods: &[Pod], before: &[u64]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        if pod.served().await > before[i] {
            out.push(i);
        }
    }
    out
}

async fn served_counts(pods: &[Pod]) -> Vec<u64> {
    let mut out = Vec::new();
    for pod in pods {
        out.push(pod.served().await);
    }
    out
}

fn chat_tokens(body: &Value) -> Vec<u32> {
    let request: ChatCompletionRequest = serde_json::from_value(body.clone()).unwrap();
    model().prepare_chat(&request).unwrap().token_ids
}

/// A pod serving `app` on a free port, in an endpoints file, and round-robin routing.
async fn scripted_pod(app: axum::Router) -> (EndpointsFile, RouterConfig) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let file = EndpointsFile::new();
    file.write(&[
        json!({"address": address.to_string(), "kv_events": format!("http://{address}")}),
    ]);
    let router = RouterConfig {
        mode: RouterMode::RoundRobin,
        ..kv()
    };
    (file, router)
}

fn kv() -> RouterConfig {
    RouterConfig::default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sharing_a_long_prefix_goes_to_the_pod_that_announced_it() {
    let pods = vec![Pod::start().await, Pod::start().await, Pod::start().await];
    let file = EndpointsFile::new();
    file.write(&pods.iter().map(Pod::entry).collect::<Vec<_>>());
    let picker = Picker::start(&file, kv()).await;
    picker.wait_endpoints(3).await;
    picker.wait_healthy().await;

    // Pod 1 cached an earlier conversation with the same long system-like preamble.
    let preamble = text(400, 1);
    let earlier = chat(&format!("{preamble} first question"), 2, false);
    let announced = pods[1].announce(&chat_tokens(&earlier));
    assert!(announced > 20, "a long prefix: {announced} blocks");
    let holder = pods[1].address;
    eventually("the index to hold pod 1's blocks", || async {
        picker
            .epp
            .router
            .endpoints()
            .iter()
            .any(|e| e.spec.address == holder && e.blocks == announced)
    })
    .await;

    for (i, question) in ["second question", "a third one", "and a fourth"]
        .iter()
        .enumerate()
    {
        let before = served_counts(&pods).await;
        let response = picker
            .chat(&chat(&format!("{preamble} {question}"), 2, false))
            .await;
        assert_eq!(response.status(), 200);
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["object"], "chat.completion");
        assert_eq!(served_by(&pods, &before).await, [1], "request {i}");
    }
    let metrics = picker.metrics().await;
    assert!(
        metrics.contains(&format!(
            "dynamo_epp_picks_total{{pod=\"{holder}\",role=\"aggregated\"}} 3"
        )),
        "{metrics}"
    );
    let matched = sum_metric(&metrics, "dynamo_epp_matched_blocks_total");
    let prompt = sum_metric(&metrics, "dynamo_epp_prompt_blocks_total");
    assert!(
        matched * 10 >= prompt * 8,
        "most blocks hit: {matched} of {prompt}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_alternates_between_pods() {
    let pods = vec![Pod::start().await, Pod::start().await];
    let file = EndpointsFile::new();
    file.write(&pods.iter().map(Pod::entry).collect::<Vec<_>>());
    let picker = Picker::start(
        &file,
        RouterConfig {
            mode: RouterMode::RoundRobin,
            ..kv()
        },
    )
    .await;
    picker.wait_endpoints(2).await;
    let mut order = Vec::new();
    for i in 0..4 {
        let before = served_counts(&pods).await;
        let response = picker.chat(&chat(&format!("hello {i}"), 2, false)).await;
        assert_eq!(response.status(), 200);
        let by = served_by(&pods, &before).await;
        assert_eq!(by.len(), 1, "{by:?}");
        order.push(by[0]);
    }
    assert_ne!(order[0], order[1]);
    assert_eq!((order[0], order[1]), (order[2], order[3]), "{order:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_passes_the_engines_sse_through_unchanged_and_is_measured() {
    let pod = Pod::start().await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry()]);
    let picker = Picker::start(&file, kv()).await;
    picker.wait_healthy().await;

    let mut body = chat("Tell me a story", 6, true);
    body["seed"] = json!(7);
    let response = picker.chat(&body).await;
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let through_picker = response.text().await.unwrap();
    let direct = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", pod.address))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();

    let frames: Vec<&str> = through_picker
        .split("\n\n")
        .filter(|f| !f.is_empty())
        .collect();
    assert_eq!(frames.last(), Some(&"data: [DONE]"));
    let content = |sse: &str| -> Vec<String> {
        sse.split("\n\n")
            .filter_map(|f| f.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str::<Value>(d).unwrap())
            .inspect(|v| assert_eq!(v["object"], "chat.completion.chunk"))
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .filter(|c| !c.is_empty())
            .collect()
    };
    assert_eq!(content(&through_picker).len(), 6);
    assert_eq!(
        content(&through_picker),
        content(&direct),
        "same tokens, same frames"
    );

    let models: Value = picker.get("/v1/models").await.json().await.unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    // The API description, served by the picker itself.
    let api: Value = picker.get("/openapi.json").await.json().await.unwrap();
    assert!(
        api["paths"]["/v1/chat/completions"]["post"].is_object(),
        "{api}"
    );
    let metrics = picker.metrics().await;
    assert_eq!(
        sum_metric(
            &metrics,
            "dynamo_frontend_time_to_first_token_seconds_count"
        ),
        1
    );
    assert_eq!(
        sum_metric(
            &metrics,
            "dynamo_frontend_inter_token_latency_seconds_count"
        ),
        5
    );
    assert_eq!(
        sum_metric(&metrics, "dynamo_frontend_output_sequence_tokens_sum"),
        6
    );
    assert!(
        metrics.contains(
            "dynamo_frontend_requests_total{model=\"qwen-mock\",route=\"/v1/chat/completions\",status=\"200\"} 1"
        ),
        "{metrics}"
    );
    assert_eq!(sum_metric(&metrics, "dynamo_frontend_inflight_requests"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_are_forwarded_to_a_pod_and_answered_as_it_answers() {
    let pod = Pod::start().await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry()]);
    let picker = Picker::start(&file, kv()).await;
    picker.wait_healthy().await;

    let body = json!({"model": MODEL, "input": ["a cat sat", "on the mat"], "dimensions": 8});
    let response = picker.post("/v1/embeddings", body.to_string()).await;
    assert_eq!(response.status(), 200);
    let through_picker: Value = response.json().await.unwrap();
    let direct: Value = reqwest::Client::new()
        .post(format!("http://{}/v1/embeddings", pod.address))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(through_picker, direct);
    assert_eq!(through_picker["data"].as_array().unwrap().len(), 2);
    assert_eq!(
        through_picker["data"][1]["embedding"]
            .as_array()
            .unwrap()
            .len(),
        8
    );
    // The engine's own refusal passes through as it is.
    let refused = picker
        .post(
            "/v1/embeddings",
            json!({"model": MODEL, "input": "x", "dimensions": 100_000}).to_string(),
        )
        .await;
    assert_eq!(refused.status(), 400);
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["param"], "dimensions", "{error}");
    let metrics = picker.metrics().await;
    assert!(
        metrics.contains(
            "dynamo_frontend_requests_total{model=\"qwen-mock\",route=\"/v1/embeddings\",status=\"200\"} 1"
        ),
        "{metrics}"
    );
}

/// One conversation turn with `hint` as its `nvext`, then the next turn; returns the
/// next turn's prompt tokens and how many of them the engine had cached, and the tokens
/// of the conversation up to the end of the first answer.
async fn two_turns(picker: &Picker, seed: u64, nvext: Value) -> (u64, u64, u64) {
    let user = json!({"role": "user", "content": text(300, seed)});
    let first = json!({"model": MODEL, "messages": [user], "max_tokens": 48, "nvext": nvext});
    let answer: Value = picker.chat(&first).await.json().await.unwrap();
    let message = json!({"role": "assistant",
                         "content": answer["choices"][0]["message"]["content"]});
    if nvext["agent_hints"]["speculative_prefill"] == true {
        eventually("the next turn's prefill", || async {
            let metrics = picker.metrics().await;
            let series = "dynamo_frontend_speculative_prefills_total\
                          {model=\"qwen-mock\",outcome=\"sent\"}";
            metric_value(&metrics, series) == Some(1)
        })
        .await;
    }
    let closed = json!({"model": MODEL, "messages": [user, message],
                        "add_generation_prompt": false});
    let prefix = chat_tokens(&closed).len() as u64;
    let next = json!({"model": MODEL, "max_tokens": 1, "messages": [user, message,
                      {"role": "user", "content": "And then?"}]});
    let usage = picker.chat(&next).await.json::<Value>().await.unwrap()["usage"].clone();
    (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        prefix,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_prefill_has_the_next_turns_prefix_cached_when_it_comes() {
    let pod = Pod::start().await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry()]);
    let picker = Picker::start(&file, kv()).await;
    picker.wait_healthy().await;

    // Without the hint the answer's turn is not cached: its text was never a prompt.
    let (_, cached, prefix) = two_turns(&picker, 2, json!({})).await;
    assert!(
        cached + 48 < prefix,
        "cached {cached} of a prefix of {prefix}"
    );
    // With it, the conversation up to the end of the answer is, but its last partial
    // block (16 tokens).
    let hint = json!({"agent_hints": {"speculative_prefill": true}});
    let (prompt, cached, prefix) = two_turns(&picker, 1, hint).await;
    assert!(prefix < prompt);
    assert!(
        cached + 16 > prefix,
        "cached {cached} of a prefix of {prefix}"
    );
    let metrics = picker.metrics().await;
    let series =
        "dynamo_frontend_agent_hints_total{model=\"qwen-mock\",hint=\"speculative_prefill\"}";
    assert_eq!(metric_value(&metrics, series), Some(1), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_prompts_go_to_the_engine_with_their_token_ids_when_asked() {
    // A pod that keeps the bodies it gets and answers a fixed chat completion.
    let (tx, mut bodies) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let app = axum::Router::new().fallback(move |body: axum::body::Bytes| {
        let tx = tx.clone();
        async move {
            tx.send(serde_json::from_slice(&body).unwrap()).unwrap();
            axum::Json(json!({"id": "c", "object": "chat.completion", "created": 0,
                "model": MODEL, "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}))
        }
    });
    let (file, router) = scripted_pod(app).await;
    let mut config = config(&file, router);
    config.frontend.forward_token_ids = true;
    let picker = Picker::start_with(config).await;
    picker.wait_endpoints(1).await;

    let mut body = chat("What is in a name?", 4, false);
    body["nvext"] = json!({"agent_hints": {"priority": 1}});
    assert_eq!(picker.chat(&body).await.status(), 200);
    let got = bodies.recv().await.unwrap();
    assert_eq!(got["nvext"]["token_data"], json!(chat_tokens(&body)));
    assert_eq!(got["nvext"]["agent_hints"], body["nvext"]["agent_hints"]);
    assert_eq!(
        got["messages"], body["messages"],
        "the rest is the client's"
    );
    // Completions carry their own prompt: unchanged.
    let completion = json!({"model": MODEL, "prompt": "Once", "max_tokens": 2});
    picker.post("/v1/completions", completion.to_string()).await;
    assert_eq!(bodies.recv().await.unwrap(), completion);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_ends_at_its_done_while_the_pods_body_stays_open() {
    // A pod that streams a whole answer, `[DONE]` included, and never ends its body.
    let app = axum::Router::new().fallback(|| async {
        let chunk = json!({"id": "c", "object": "chat.completion.chunk", "created": 0,
            "model": MODEL, "choices": [{"index": 0, "delta": {"content": "ok"},
            "finish_reason": "stop"}]});
        let frames = [format!("data: {chunk}\n\n"), "data: [DONE]\n\n".to_owned()];
        let frames = futures::stream::iter(frames.map(|f| Ok(axum::body::Bytes::from(f))));
        let open = futures::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(axum::body::Body::from_stream(frames.chain(open)))
            .unwrap()
    });
    let (file, router) = scripted_pod(app).await;
    let picker = Picker::start(&file, router).await;
    picker.wait_endpoints(1).await;

    let answer = picker.chat(&chat("Say ok", 4, true)).await;
    let body = tokio::time::timeout(Duration::from_secs(20), answer.text())
        .await
        .expect("the client's body ends at [DONE], not when the pod's does")
        .unwrap();
    assert!(body.contains(r#""content":"ok""#), "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_and_never_reach_a_pod() {
    let pod = Pod::start().await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry()]);
    let picker = Picker::start(&file, kv()).await;
    picker.wait_endpoints(1).await;

    let long = text(40_000, 3);
    // (path, body, status, error.param, error.code)
    type Case<'a> = (&'a str, String, u16, Option<&'a str>, Option<&'a str>);
    let cases: Vec<Case> = vec![
        ("/v1/chat/completions", "{not json".into(), 400, None, None),
        (
            "/v1/chat/completions",
            json!({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            404,
            Some("model"),
            Some("model_not_found"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL}).to_string(),
            400,
            None,
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": []}).to_string(),
            400,
            Some("messages"),
            None,
        ),
        (
            "/v1/chat/completions",
            chat("hi", -5, false).to_string(),
            400,
            Some("max_tokens"),
            None,
        ),
        (
            "/v1/chat/completions",
            chat(&long, 16, false).to_string(),
            400,
            Some("messages"),
            Some("context_length_exceeded"),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": ["a", "b"]}).to_string(),
            400,
            Some("prompt"),
            None,
        ),
        ("/v1/embeddings", "{}".into(), 400, None, None),
        (
            "/v1/embeddings",
            json!({"model": MODEL, "input": []}).to_string(),
            400,
            Some("input"),
            None,
        ),
        ("/v1/audio/transcriptions", "{}".into(), 404, None, None),
    ];
    for (path, body, status, param, code) in cases {
        let response = picker.post(path, body.clone()).await;
        assert_eq!(response.status(), status, "{path} {body:.80}");
        let error: Value = response.json().await.unwrap();
        let e = &error["error"];
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{error}"
        );
        assert!(e["type"].is_string(), "{error}");
        assert_eq!(e["param"].as_str(), param, "{error}");
        assert_eq!(e["code"].as_str(), code, "{error}");
        assert!(
            e.get("param").is_some() && e.get("code").is_some(),
            "{error}"
        );
    }
    let missing: Value = picker
        .post("/v1/chat/completions", json!({"model": MODEL}).to_string())
        .await
        .json()
        .await
        .unwrap();
    assert!(
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages"),
        "{missing}"
    );
    assert_eq!(pod.served().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoint_is_a_503_and_health_says_why() {
    let file = EndpointsFile::new();
    let picker = Picker::start(&file, kv()).await;
    let response = picker.chat(&chat("hi", 2, false)).await;
    assert_eq!(response.status(), 503);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["type"], "service_unavailable", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no endpoints discovered")
    );
    let health = picker.get("/health").await;
    assert_eq!(health.status(), 503);
    let health: Value = health.json().await.unwrap();
    assert_eq!(health["reason"], "no endpoints discovered");
    assert_eq!(picker.get("/live").await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_event_stream_drops_the_pods_blocks() {
    let mut pod = Pod::start().await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry()]);
    let picker = Picker::start(&file, kv()).await;
    picker.wait_healthy().await;
    let n = pod.announce(&chat_tokens(&chat(&text(100, 9), 2, false)));
    eventually("the blocks to be indexed", || async {
        picker.epp.router.endpoints()[0].blocks == n
    })
    .await;

    drop(pod.sidecar.take()); // the sidecar dies; the engine stays
    eventually("the blocks to be dropped", || async {
        picker.epp.router.endpoints()[0].blocks == 0
    })
    .await;
    let metrics = picker.metrics().await;
    assert!(metrics.contains("kind=\"lost\""), "{metrics}");
    // The pod still serves; only its cache is unknown.
    let response = picker.chat(&chat("hi", 2, false)).await;
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_file_changes_add_and_remove_pods_at_run_time() {
    let pods = vec![Pod::start().await, Pod::start().await];
    let file = EndpointsFile::new();
    file.write(&[pods[0].entry()]);
    let picker = Picker::start(
        &file,
        RouterConfig {
            mode: RouterMode::RoundRobin,
            ..kv()
        },
    )
    .await;
    picker.wait_endpoints(1).await;

    file.write(&[pods[0].entry(), pods[1].entry()]);
    picker.wait_endpoints(2).await;
    let before = served_counts(&pods).await;
    for i in 0..2 {
        assert_eq!(
            picker
                .chat(&chat(&format!("x{i}"), 2, false))
                .await
                .status(),
            200
        );
    }
    let after = served_counts(&pods).await;
    assert_eq!((after[0] - before[0], after[1] - before[1]), (1, 1));

    file.write(&[pods[1].entry()]);
    picker.wait_endpoints(1).await;
    for i in 0..2 {
        assert_eq!(
            picker
                .chat(&chat(&format!("y{i}"), 2, false))
                .await
                .status(),
            200
        );
    }
    let last = served_counts(&pods).await;
    assert_eq!((last[0] - after[0], last[1] - after[1]), (0, 2));

    file.write(&[]);
    picker.wait_endpoints(0).await;
    assert_eq!(picker.chat(&chat("z", 2, false)).await.status(), 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_refusing_connections_is_retried_elsewhere_and_then_avoided() {
    let pod = Pod::start().await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let file = EndpointsFile::new();
    file.write(&[
        pod.entry(),
        json!({"address": dead.to_string(), "kv_events": format!("http://{dead}")}),
    ]);
    let picker = Picker::start(
        &file,
        RouterConfig {
            mode: RouterMode::RoundRobin,
            unhealthy_for: Duration::from_secs(600),
            ..kv()
        },
    )
    .await;
    picker.wait_endpoints(2).await;
    for i in 0..4 {
        let response = picker.chat(&chat(&format!("q{i}"), 2, false)).await;
        assert_eq!(response.status(), 200, "request {i}");
    }
    assert_eq!(pod.served().await, 4);
    let metrics = picker.metrics().await;
    assert!(
        metrics.contains(&format!(
            "dynamo_epp_upstream_failures_total{{pod=\"{dead}\"}} 1"
        )),
        "tried once, then avoided: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_engine_is_down_is_avoided_and_its_requests_go_elsewhere() {
    let pod = Pod::start().await;
    let down = ApiError {
        code: Some(ENGINE_UNREACHABLE),
        ..ApiError::unavailable("engine request to http://127.0.0.1:1/ failed: refused")
    };
    let (broken, broken_entry) = failing_pod(down.clone()).await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry(), broken_entry]);
    let round_robin = RouterConfig {
        mode: RouterMode::RoundRobin,
        unhealthy_for: Duration::from_secs(600),
        ..kv()
    };
    let picker = Picker::start(&file, round_robin).await;
    picker.wait_endpoints(2).await;
    for i in 0..4 {
        let response = picker.chat(&chat(&format!("q{i}"), 2, true)).await;
        assert_eq!(response.status(), 200, "request {i}");
        assert!(response.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    }
    assert_eq!(pod.served().await, 4);
    let failures = |text: &str, pod| {
        metric_value(
            text,
            &format!("dynamo_epp_upstream_failures_total{{pod=\"{pod}\"}}"),
        )
    };
    assert_eq!(
        failures(&picker.metrics().await, broken),
        Some(1),
        "tried once, then avoided"
    );

    // Another 503 is the engine's answer, not a dead pod: passed on, nothing retried.
    let busy = ApiError {
        code: Some("overloaded"),
        ..ApiError::unavailable("the engine is busy")
    };
    let (busy_pod, busy_entry) = failing_pod(busy.clone()).await;
    file.write(&[busy_entry]);
    picker.wait_endpoints(1).await;
    let response = picker.chat(&chat("hi", 2, false)).await;
    assert_eq!(response.status(), 503);
    assert_eq!(response.json::<Value>().await.unwrap(), busy.body());
    assert_eq!(failures(&picker.metrics().await, busy_pod), None);

    // Every pod down: each tried once, then a 503 that says so.
    let (a, a_entry) = failing_pod(down.clone()).await;
    let (b, b_entry) = failing_pod(down).await;
    file.write(&[a_entry, b_entry]);
    picker.wait_endpoints(2).await;
    let response = picker.chat(&chat("hi", 2, false)).await;
    assert_eq!(response.status(), 503);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["type"], "service_unavailable", "{error}");
    let metrics = picker.metrics().await;
    assert_eq!(
        (failures(&metrics, a), failures(&metrics, b)),
        (Some(1), Some(1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_a_413_before_it_is_read() {
    let pod = Pod::start().await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry()]);
    let mut config = config(&file, kv());
    config.max_body_bytes = Some(2000);
    let epp = start(config).await.unwrap();
    let base = format!("http://{}", epp.http_addr);
    let http = reqwest::Client::new();
    eventually("one endpoint", || async {
        epp.router.endpoints().len() == 1
    })
    .await;
    let too_large = |status: reqwest::StatusCode, error: &Value| {
        assert_eq!(status, 413, "{error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("2000 bytes"),
            "{error}"
        );
    };

    // Content-Length over the limit: the answer comes with no body byte sent.
    let mut socket = tokio::net::TcpStream::connect(epp.http_addr).await.unwrap();
    socket
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\
              content-type: application/json\r\ncontent-length: 5000\r\n\r\n",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0; 4096];
    while !answer.windows(2).any(|w| w == b"}}") {
        let n = tokio::time::timeout(Duration::from_secs(20), socket.read(&mut buf))
            .await
            .expect("an answer before the body")
            .unwrap();
        assert!(n > 0, "closed without an answer");
        answer.extend_from_slice(&buf[..n]);
    }
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let json_start = answer.find("{\"error\"").unwrap();
    too_large(
        reqwest::StatusCode::PAYLOAD_TOO_LARGE,
        &serde_json::from_str(&answer[json_start..]).unwrap(),
    );

    // Chunked, with no length announced: cut where it passes the limit.
    let body = chat(&text(500, 1), 2, false).to_string().into_bytes();
    assert!(body.len() > 2000);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(700).map(|c| Ok(c.to_vec())).collect();
    let response = http
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    let status = response.status();
    too_large(status, &response.json().await.unwrap());

    // Under the limit, chunked or not: served.
    let small = chat("hello", 2, false).to_string().into_bytes();
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        small.chunks(10).map(|c| Ok(c.to_vec())).collect();
    for body in [
        reqwest::Body::from(small.clone()),
        reqwest::Body::wrap_stream(futures::stream::iter(chunks)),
    ] {
        let response = http
            .post(format!("{base}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(pod.served().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_cancels_the_upstream_request() {
    let pod = Pod::start_with_speedup(1.0).await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry()]);
    let picker = Picker::start(&file, kv()).await;
    picker.wait_healthy().await;

    let mut response = picker.chat(&chat("Write a long essay", 4000, true)).await;
    assert_eq!(response.status(), 200);
    let first = response.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    assert_eq!(pod.running().await, 1);
    assert!(picker.epp.router.endpoints()[0].load > 0);
    drop(response);
    eventually("the engine to drop the request", || async {
        pod.running().await == 0
    })
    .await;
    eventually("the load to be released", || async {
        picker.epp.router.endpoints()[0].load == 0
    })
    .await;
    assert_eq!((pod.served().await, pod.aborted().await), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturated_pods_with_a_full_queue_shed_with_429() {
    let pod = Pod::start_with_speedup(1.0).await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry()]);
    let picker = Picker::start(
        &file,
        RouterConfig {
            queue_capacity: 0,
            saturation: SaturationThreshold {
                max_blocks_in_flight: Some(0),
                ..SaturationThreshold::default()
            },
            ..kv()
        },
    )
    .await;
    picker.wait_endpoints(1).await;
    let mut long = picker.chat(&chat(&text(50, 1), 4000, true)).await;
    assert_eq!(long.status(), 200);
    long.chunk().await.unwrap();
    let shed = picker.chat(&chat("hi", 2, false)).await;
    assert_eq!(shed.status(), 429);
    let error: Value = shed.json().await.unwrap();
    assert_eq!(error["error"]["type"], "rate_limit_error", "{error}");
    drop(long);
    eventually("the pod to have room again", || async {
        picker.chat(&chat("hi", 2, false)).await.status() == 200
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_a_pod_is_counted_as_queued() {
    let pod = Pod::start_with_speedup(1.0).await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry()]);
    let picker = Picker::start(
        &file,
        RouterConfig {
            queue_capacity: 4,
            saturation: SaturationThreshold {
                max_blocks_in_flight: Some(0),
                ..SaturationThreshold::default()
            },
            ..kv()
        },
    )
    .await;
    picker.wait_endpoints(1).await;
    let queued = |n: u32| {
        let text = picker.epp.metrics.encode();
        text.lines().any(|l| {
            l.starts_with("dynamo_frontend_queued_requests{") && l.ends_with(&format!(" {n}"))
        })
    };
    let mut long = picker.chat(&chat(&text(50, 1), 4000, true)).await;
    long.chunk().await.unwrap();
    let waiting = tokio::spawn({
        let url = format!("http://{}/v1/chat/completions", picker.epp.http_addr);
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .json(&chat("hi", 2, false))
                .send()
                .await
                .unwrap();
            response.status()
        }
    });
    eventually("one request queued", || async { queued(1) }).await;
    drop(long);
    assert_eq!(waiting.await.unwrap(), 200);
    assert!(queued(0), "{}", picker.epp.metrics.encode());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_metrics_are_polled_for_load_correction() {
    let pod = Pod::start_with_speedup(1.0).await;
    let file = EndpointsFile::new();
    file.write(&[pod.entry()]);
    let mut config = config(&file, kv());
    config.metrics_poll_interval = Some(Duration::from_millis(50));
    let epp = start(config).await.unwrap();
    let base = format!("http://{}", epp.http_addr);
    // The pod is found and its model loaded before the request, or it gets a 503.
    eventually("/health to answer 200", || async {
        reqwest::get(format!("{base}/health"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    // A running request holds KV blocks in the engine; its usage shows up here.
    let mut long = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat(&text(300, 5), 4000, true))
        .send()
        .await
        .unwrap();
    assert_eq!(long.status(), 200);
    long.chunk().await.unwrap();
    let usage_line = format!("dynamo_epp_engine_kv_usage{{pod=\"{}\"}} ", pod.address);
    eventually("a non-zero KV usage read from the engine", || async {
        let text = epp.metrics.encode();
        text.lines()
            .find_map(|l| l.strip_prefix(&usage_line))
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|usage| usage > 0.0)
    })
    .await;
    assert!(
        epp.metrics
            .encode()
            .contains("dynamo_epp_engine_metric_polls_total{result=\"ok\"}")
    );
}
