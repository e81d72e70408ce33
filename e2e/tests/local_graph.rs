//! End to end over a local graph: `dynamo run` starts mocker engines, their sidecars and
//! the endpoint picker's OpenAI frontend as real processes on real sockets; the tests
//! drive it with the official `openai` Python client and plain HTTP, and break it.

mod support;

use std::time::Duration;

use rustix::process::Signal;
use serde_json::{Value, json};
use support::{LocalGraph, get_text, metric_sum, signal};

/// A completion of `prompt`; returns (prompt tokens, cached prompt tokens).
async fn complete(graph: &LocalGraph, prompt: &str, max_tokens: u32) -> (u64, u64) {
    let response = reqwest::Client::new()
        .post(graph.url("/v1/completions"))
        .json(&json!({"model": graph.model, "prompt": prompt, "max_tokens": max_tokens}))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert!(status.is_success(), "{status}: {body}");
    let usage = &body["usage"];
    (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    )
}

/// A prompt of about `words` tokens (common words are one token each) whose word
/// sequence differs between prefix ids from the first words on.
fn prefix(id: usize, words: usize) -> String {
    const WORDS: [&str; 16] = [
        "river", "stone", "light", "green", "house", "table", "water", "music", "paper", "glass",
        "cloud", "bread", "horse", "chair", "night", "field",
    ];
    (0..words)
        .map(|i| WORDS[(i * (2 * id + 3) + id * 5 + i / 16) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Waits until the frontend has no request in flight, so the next pick sees no load
/// left from the previous request (a client can read a whole body a moment before the
/// frontend sees its upstream end).
async fn settle(graph: &LocalGraph) {
    for _ in 0..100 {
        let text = get_text(&graph.url("/metrics")).await;
        if metric_sum(&text, "dynamo_frontend_inflight_requests", &[]) == 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("requests stayed in flight");
}

/// Per engine of `service`, a counter from its `/metrics`.
async fn engine_counter(graph: &LocalGraph, service: &str, metric: &str) -> Vec<f64> {
    let mut values = Vec::new();
    for engine in graph.ready_engines(service).await {
        let text = get_text(&format!("http://{engine}/metrics")).await;
        values.push(metric_sum(&text, metric, &[]));
    }
    values
}

#[tokio::test(flavor = "multi_thread")]
async fn the_official_openai_client_works_against_four_workers() {
    let graph = LocalGraph::start("agg-mocker.yaml", &["--replicas", "worker=4"]).await;
    assert_eq!(graph.engines("worker").await.len(), 4);
    let args = vec![graph.url("/v1"), graph.model.clone()];
    graph.run_script("openai_checks.py", args).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn prompts_sharing_a_prefix_land_on_the_worker_that_holds_it() {
    let graph = LocalGraph::start("agg-mocker.yaml", &["--replicas", "worker=4"]).await;
    let shared = prefix(1, 600);
    complete(&graph, &format!("{shared} first"), 4).await;
    // The blocks reach the picker through engine -> sidecar -> picker event streams.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..5 {
        settle(&graph).await;
        let (prompt, cached) = complete(&graph, &format!("{shared} variant {i}"), 4).await;
        assert!(
            cached * 10 >= prompt * 8,
            "request {i}: only {cached} of {prompt} prompt tokens came from the cache\n{}",
            get_text(&graph.url("/metrics")).await,
        );
    }
    let prompts = engine_counter(&graph, "worker", "vllm:prompt_tokens_total").await;
    let busy: Vec<_> = prompts.iter().filter(|p| **p > 0.0).collect();
    assert_eq!(busy.len(), 1, "prompt tokens per engine: {prompts:?}");
    let hits = engine_counter(&graph, "worker", "vllm:prefix_cache_hits_total").await;
    assert!(hits.iter().sum::<f64>() > 0.0, "{hits:?}");
}

/// Hit rate (cached / prompt tokens) of 7 prefixes x 6 suffixes in a fixed shuffled
/// order, one request at a time, on workers too small to hold every prefix.
async fn shared_prefix_hit_rate(router_mode: &str) -> f64 {
    let graph = LocalGraph::start("pressure-mocker.yaml", &["--router-mode", router_mode]).await;
    let mut order: Vec<(usize, usize)> = (0..6)
        .flat_map(|round| (0..7).map(move |p| (p, round)))
        .collect();
    // A fixed permutation (multiplicative step coprime with 42), so round-robin gets no
    // accidental affinity from a regular order.
    order = (0..order.len())
        .map(|i| order[(i * 17) % order.len()])
        .collect();
    let (mut prompt, mut cached) = (0, 0);
    for (p, round) in order {
        let (n, c) = complete(&graph, &format!("{} suffix {round}", prefix(p, 200)), 2).await;
        prompt += n;
        cached += c;
        // Let the engine's events reach the picker before the next pick.
        tokio::time::sleep(Duration::from_millis(100)).await;
        settle(&graph).await;
    }
    cached as f64 / prompt as f64
}

#[tokio::test(flavor = "multi_thread")]
async fn kv_routing_hits_the_cache_more_than_round_robin_under_pressure() {
    let kv = shared_prefix_hit_rate("kv").await;
    let round_robin = shared_prefix_hit_rate("round-robin").await;
    eprintln!("hit rate: kv {kv:.3}, round-robin {round_robin:.3}");
    assert!(
        kv > round_robin * 1.4,
        "kv {kv:.3} vs round-robin {round_robin:.3}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_an_engine_mid_stream_ends_the_stream_and_new_requests_succeed() {
    let graph = LocalGraph::start("agg-mocker.yaml", &[]).await;
    let mut stream = reqwest::Client::new()
        .post(graph.url("/v1/completions"))
        .json(&json!({"model": graph.model, "prompt": "tell a long story",
                      "max_tokens": 3000, "stream": true}))
        .send()
        .await
        .unwrap();
    assert!(stream.status().is_success());
    assert!(stream.chunk().await.unwrap().is_some(), "a first chunk");

    // The engine running the request is the one reporting it.
    let running = engine_counter(&graph, "worker", "vllm:num_requests_running").await;
    let victim = running
        .iter()
        .position(|r| *r > 0.0)
        .expect("one engine runs it");
    let status = graph.graph().await;
    let pid = status["services"]["worker"][victim]["engine_pid"]
        .as_u64()
        .unwrap();
    signal(pid, Signal::KILL);

    // The stream ends (cleanly or with an error), it does not hang.
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the stream outlived its engine");

    // New requests succeed within seconds (the picker avoids the dead worker, and the
    // runner restarts it).
    let client = reqwest::Client::new();
    let mut ok = 0;
    for _ in 0..200 {
        let response = client
            .post(graph.url("/v1/completions"))
            .json(&json!({"model": graph.model, "prompt": "hello", "max_tokens": 2}))
            .send()
            .await;
        if response.is_ok_and(|r| r.status().is_success()) {
            ok += 1;
            if ok == 10 {
                break;
            }
        } else {
            ok = 0;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        ok,
        10,
        "ten requests in a row did not succeed\n{}",
        graph.log_text()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_picker_is_warm_before_it_serves() {
    let graph = LocalGraph::start("agg-mocker.yaml", &["--replicas", "worker=4"]).await;
    let prompts: Vec<String> = (0..3).map(|p| prefix(10 + p, 600)).collect();
    for p in &prompts {
        complete(&graph, &format!("{p} first"), 2).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let epp_pid = graph.graph().await["epp_pid"].as_u64().unwrap();
    signal(epp_pid, Signal::KILL);
    // Wait for the new picker process, then for it to report healthy.
    for _ in 0..600 {
        let pid = graph.graph().await["epp_pid"].as_u64().unwrap();
        if pid != 0 && pid != epp_pid {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    graph.wait_healthy(Duration::from_secs(60)).await;

    // Its first picks already know where each prefix lives (4 workers: a lucky guess for
    // all three would be a 1 in 64 chance).
    for p in &prompts {
        settle(&graph).await;
        let (prompt, cached) = complete(&graph, &format!("{p} again"), 2).await;
        assert!(
            cached * 10 >= prompt * 8,
            "after the restart only {cached} of {prompt} tokens were cached"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_sidecar_takes_its_blocks_out_of_the_index() {
    let graph = LocalGraph::start("agg-mocker.yaml", &["--replicas", "worker=1"]).await;
    let index_blocks = || async {
        metric_sum(
            &get_text(&graph.url("/metrics")).await,
            "dynamo_epp_index_blocks",
            &[],
        )
    };
    complete(&graph, &prefix(20, 600), 2).await;
    let mut indexed = 0.0;
    for _ in 0..200 {
        indexed = index_blocks().await;
        if indexed > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        indexed >= 9.0,
        "the prompt's blocks were indexed: {indexed}"
    );

    let pid = graph.graph().await["services"]["worker"][0]["sidecar_pid"]
        .as_u64()
        .unwrap();
    signal(pid, Signal::KILL);
    let mut left = indexed;
    for _ in 0..600 {
        left = index_blocks().await;
        if left == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0.0, "blocks of the dead sidecar stayed in the index");
}
