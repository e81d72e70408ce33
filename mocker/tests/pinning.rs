//! Prefix pinning (`nvext.cache_control`): a pinned prefix outlives a flood of unrelated
//! prompts that evicts everything else, until its TTL runs out; a hit renews it; and a
//! pin never refuses a request that needs its blocks. On simulated time through the
//! engine, and over HTTP against the server.

use std::time::Duration;

use common::{metric, serve};
use dynamo_mocker::server::RunningServer;
use dynamo_mocker::{Clock, Engine, EngineConfig, KvBlocksConfig, OffloadMode, Request};
use serde_json::{Value, json};

mod common;

const BLOCK: usize = 16;
const POOL: usize = 64;
/// The conversation's prompt: 10 full blocks.
const PREFIX: usize = 10 * BLOCK;

fn config() -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: POOL,
        block_size: BLOCK,
        vocab_size: 1000,
        ..EngineConfig::default()
    }
}

fn tokens(start: u32, len: usize) -> Vec<u32> {
    (start..start + len as u32).collect()
}

/// Runs one request to its end and returns its cached prompt tokens.
fn run(e: &mut Engine, id: u64, token_ids: Vec<u32>, pin_ttl: Option<Duration>) -> usize {
    let request = Request {
        id,
        token_ids,
        max_tokens: 2,
        seed: None,
        pin_ttl,
    };
    e.submit(request).expect("fits the pool");
    let mut cached = None;
    while e.has_work() {
        for f in e.step().finished {
            assert_eq!(f.id, id);
            cached = Some(f.cached_prompt_tokens);
        }
    }
    cached.expect("the request finished")
}

/// Unrelated prompts of 20 blocks, three pools' worth: LRU keeps nothing unpinned.
fn flood(e: &mut Engine) {
    for i in 0..10 {
        run(
            e,
            100 + i,
            tokens(10_000 + 1000 * i as u32, 20 * BLOCK),
            None,
        );
    }
}

/// The conversation's next turn: its prompt, then more.
fn next_turn() -> Vec<u32> {
    tokens(0, PREFIX + BLOCK)
}

const TTL: Duration = Duration::from_secs(10);

#[test]
fn a_pinned_prefix_survives_a_flood_that_evicts_an_unpinned_one() {
    for (pin, kept) in [(Some(TTL), PREFIX), (None, 0)] {
        let mut e = Engine::simulated(config()).unwrap();
        run(&mut e, 1, tokens(0, PREFIX), pin);
        assert!(e.clock().now_ms() < 1000.0, "well within the TTL");
        flood(&mut e);
        assert_eq!(run(&mut e, 2, next_turn(), None), kept, "pin {pin:?}");
        let m = e.metrics();
        assert_eq!(m.pins.evicted_dropped + m.pins.evicted_offloaded, 0);
    }
}

#[test]
fn a_pin_runs_out_after_its_ttl() {
    for (idle_ms, kept) in [(9_000.0, PREFIX), (10_500.0, 0)] {
        let mut e = Engine::simulated(config()).unwrap();
        run(&mut e, 1, tokens(0, PREFIX), Some(TTL));
        assert_eq!(e.metrics().pinned_blocks, PREFIX / BLOCK);
        e.clock_mut().advance_to(idle_ms);
        flood(&mut e);
        assert_eq!(run(&mut e, 2, next_turn(), None), kept, "idle {idle_ms} ms");
    }
}

#[test]
fn a_hit_without_cache_control_renews_the_pin() {
    let mut e = Engine::simulated(config()).unwrap();
    run(&mut e, 1, tokens(0, PREFIX), Some(TTL));
    e.clock_mut().advance_to(8_000.0);
    // A short request on the prefix: a hit, no cache_control of its own.
    assert_eq!(run(&mut e, 2, tokens(0, PREFIX + 1), None), PREFIX);
    assert!(e.metrics().pins.renewed >= (PREFIX / BLOCK) as u64);
    // Past the first pin's TTL, within the renewed one.
    e.clock_mut().advance_to(15_000.0);
    flood(&mut e);
    assert_eq!(run(&mut e, 3, next_turn(), None), PREFIX);
}

#[test]
fn pinned_blocks_yield_to_a_request_that_needs_them_and_are_demoted_to_the_tier() {
    for tier in [None, Some(OffloadMode::All)] {
        let mut e = Engine::simulated(EngineConfig {
            kv_blocks: tier.map(|offload| KvBlocksConfig {
                offload,
                ..KvBlocksConfig::default()
            }),
            ..config()
        })
        .unwrap();
        run(&mut e, 1, tokens(0, PREFIX), Some(TTL));
        let pinned = e.hasher().seq_hashes(&tokens(0, PREFIX));
        // A prompt as large as the pool: it runs, taking the pinned blocks.
        let request = Request {
            id: 2,
            token_ids: tokens(50_000, POOL * BLOCK - 1),
            max_tokens: 1,
            seed: None,
            pin_ttl: None,
        };
        e.submit(request).expect("fits the pool");
        let mut offloaded = Vec::new();
        let mut finished = false;
        while e.has_work() {
            let step = e.step();
            offloaded.extend(step.offload.iter().map(|b| b.hash));
            finished |= step.finished.iter().any(|f| f.id == 2);
        }
        assert!(finished, "tier {tier:?}");
        let m = e.metrics();
        assert_eq!(m.pinned_blocks, 0);
        assert_eq!(e.cached_prefix_blocks(&pinned), 0);
        match tier {
            None => assert_eq!(m.pins.evicted_dropped, pinned.len() as u64),
            Some(_) => {
                assert_eq!(m.pins.evicted_offloaded, pinned.len() as u64);
                // Write-through handed them over when computed; evicted, pinned, again.
                for h in &pinned {
                    assert!(offloaded.contains(h), "pinned block {h:?} demoted");
                }
            }
        }
    }
}

async fn post(server: &RunningServer, path: &str, body: Value) -> Value {
    let resp = reqwest::Client::new()
        .post(format!("http://{}{path}", server.http_addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

fn cached_tokens(answer: &Value) -> u64 {
    answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// A conversation turn, then a flood of unrelated completions over three pools' worth
/// of tokens, then the next turn: what of the first turn's prompt is still cached, and
/// how many blocks it pinned.
async fn conversation_after_flood(cache_control: Option<Value>) -> (u64, u64, f64) {
    let server = serve(EngineConfig {
        speedup_ratio: 100.0,
        ..config()
    })
    .await;
    let system = "You are a careful assistant for a long agentic coding session. \
        Read the repository, plan the change, and explain every step you take.";
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "List the crates of this workspace and what each does."}),
    ];
    let chat = |messages: &Vec<Value>| {
        let mut body = json!({"model": "qwen", "messages": messages, "max_tokens": 4});
        if let Some(c) = &cache_control {
            body["nvext"] = json!({"cache_control": c});
        }
        body
    };
    let first = post(&server, "/v1/chat/completions", chat(&messages)).await;
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    let full_blocks = prompt / BLOCK as u64;
    assert!(full_blocks >= 2, "{first}");

    let mut flooded = 0;
    for i in 0.. {
        let text: String = (0..80).map(|j| format!(" f{i}x{j}")).collect();
        let answer = post(
            &server,
            "/v1/completions",
            json!({"model": "qwen", "prompt": text, "max_tokens": 1}),
        )
        .await;
        flooded += answer["usage"]["prompt_tokens"].as_u64().unwrap();
        if flooded > 3 * (POOL * BLOCK) as u64 {
            break;
        }
    }
    let pinned = metric(&server, "dynamo_mocker_kv_pinned_blocks").await;
    let evicted = metric(&server, "dynamo_mocker_kv_pinned_evictions").await;
    assert_eq!(evicted, 0.0, "the flood never needed the pinned blocks");

    let answer = first["choices"][0]["message"]["content"].clone();
    messages.push(json!({"role": "assistant", "content": answer}));
    messages.push(json!({"role": "user", "content": "Now the tests of each."}));
    let second = post(&server, "/v1/chat/completions", chat(&messages)).await;
    (full_blocks, cached_tokens(&second), pinned)
}

#[tokio::test]
async fn cache_control_keeps_a_conversation_prefix_through_a_flood_over_http() {
    let pin = json!({"type": "ephemeral", "ttl": "5m"});
    let (full_blocks, cached, pinned) = conversation_after_flood(Some(pin)).await;
    assert_eq!(pinned, full_blocks as f64);
    assert_eq!(
        cached,
        full_blocks * BLOCK as u64,
        "the first turn's prompt"
    );

    let (_, cached, pinned) = conversation_after_flood(None).await;
    assert_eq!(pinned, 0.0);
    assert_eq!(cached, 0, "without cache_control the flood evicted it");
}
