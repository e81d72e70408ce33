//! The load generator against a real mock engine server on loopback: streamed SSE over
//! HTTP, usage with cached tokens, errors as the server words them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dynamo_llm::ModelDir;
use dynamo_loadgen::arrivals::{self, Arrivals};
use dynamo_loadgen::bench;
use dynamo_loadgen::client::{Api, Target, Words};
use dynamo_loadgen::workload::{Sessions, SharedPrefix, Workload};
use dynamo_mocker::EngineConfig;
use dynamo_mocker::server::{RunningServer, ServerConfig, start};

fn model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/qwen-mock");
    assert!(
        path.join("tokenizer.json").exists(),
        "run `make model` first"
    );
    path
}

/// A mock engine ten times faster than the modelled GPU, on a free port.
async fn serve() -> RunningServer {
    let config = ServerConfig {
        model_path: model_path(),
        model_name: Some("qwen".into()),
        listen: "127.0.0.1:0".parse().unwrap(),
        kv_events_endpoint: None,
        engine: EngineConfig {
            speedup_ratio: 10.0,
            ..EngineConfig::default()
        },
        server: Default::default(),
        behaviour: Default::default(),
    };
    start(config, std::future::pending())
        .await
        .expect("server starts")
}

fn target(server: &RunningServer, model: &str, api: Api) -> Target {
    Target {
        base_url: format!("http://{}", server.http_addr),
        model: model.into(),
        api,
        words: None,
    }
}

fn workload(prefixes: usize, suffixes: usize) -> Arc<Workload> {
    Arc::new(
        Workload::shared_prefix(SharedPrefix {
            prefixes,
            suffixes,
            prefix_tokens: 256,
            unique_tokens: 32,
            output_tokens: 8,
            seed: 4,
        })
        .unwrap(),
    )
}

fn http() -> reqwest::Client {
    bench::http_client(Duration::from_secs(120)).unwrap()
}

#[tokio::test]
async fn one_client_at_a_time_hits_the_cache_for_every_repeated_prefix() {
    let server = serve().await;
    let w = workload(3, 3);
    let r = bench::run(
        &http(),
        &target(&server, "qwen", Api::Completions),
        w,
        &Arrivals::Concurrency(1),
        "live",
    )
    .await
    .unwrap();
    assert_eq!((r.requests, r.completed, r.errors), (9, 9, 0), "{r:?}");
    assert_eq!(r.output_tokens, 9 * 8);
    // One chunk per token: a first token and 7 gaps per request.
    assert_eq!(
        (r.ttft_ms.count, r.itl_ms.count, r.e2e_ms.count),
        (9, 63, 9)
    );
    assert!(r.ttft_ms.p50 > 0.0 && r.itl_ms.p50 > 0.0 && r.e2e_ms.p50 >= r.ttft_ms.p50);
    // Requests run one by one, so each prefix misses once and then hits its 4 blocks of
    // 64 tokens on its 2 later requests: 6 x 256 cached of 9 x 288 prompt tokens.
    assert_eq!(r.kv_hit_rate, Some(6.0 * 256.0 / (9.0 * 288.0)));
    assert!(r.requests_per_s > 0.0 && r.output_tokens_per_s > r.requests_per_s);
}

#[tokio::test]
async fn open_loop_arrivals_send_everything_and_concurrency_overlaps_requests() {
    let server = serve().await;
    let w = workload(2, 4);
    let t = target(&server, "qwen", Api::Completions);
    let times = arrivals::poisson(w.len(), 200.0, 1);
    let open = bench::run(&http(), &t, w.clone(), &Arrivals::At(times), "poisson")
        .await
        .unwrap();
    assert_eq!(
        (open.completed, open.errors, open.output_tokens),
        (8, 0, 64)
    );
    let closed = bench::run(&http(), &t, w, &Arrivals::Concurrency(4), "c4")
        .await
        .unwrap();
    assert_eq!((closed.completed, closed.errors), (8, 0));
    assert_eq!(closed.label, "c4");
}

#[tokio::test]
async fn chat_prompts_are_one_token_per_word() {
    let server = serve().await;
    let model = ModelDir::load(&model_path(), None).unwrap();
    let mut t = target(&server, "qwen", Api::Chat);
    t.words = Some(Arc::new(Words::from_model(&model).unwrap()));
    let item = workload(1, 1).request(0);
    let text = t.words.as_ref().unwrap().text(&item.token_ids);
    assert_eq!(model.encode(&text).len(), 288, "each word is one token");
    let http = http();
    let record = dynamo_loadgen::client::send(&http, &t, &item, std::time::Instant::now()).await;
    assert_eq!(record.error, None);
    assert_eq!(record.output_tokens, 8);
    // The chat template adds a few tokens around the 288 of the message.
    let prompt = record.prompt_tokens.unwrap();
    assert!((288..288 + 40).contains(&prompt), "{prompt}");
}

#[tokio::test]
async fn errors_are_counted_with_the_servers_message() {
    let server = serve().await;
    let w = workload(1, 2);
    let wrong_model = bench::run(
        &http(),
        &target(&server, "no-such-model", Api::Completions),
        w,
        &Arrivals::Concurrency(2),
        "wrong",
    )
    .await
    .unwrap();
    assert_eq!((wrong_model.completed, wrong_model.errors), (0, 2));
    assert_eq!(wrong_model.error_samples.len(), 1, "{wrong_model:?}");
    let message = &wrong_model.error_samples[0];
    assert!(
        message.starts_with("HTTP 404: ") && message.contains("no-such-model"),
        "{message}"
    );
    assert_eq!(wrong_model.kv_hit_rate, None);

    // Nothing listens on port 1: a connection error, not a hang.
    let mut nowhere = target(&server, "qwen", Api::Completions);
    nowhere.base_url = "http://127.0.0.1:1".into();
    let r = bench::run(
        &http(),
        &nowhere,
        workload(1, 1),
        &Arrivals::Concurrency(1),
        "x",
    )
    .await
    .unwrap();
    assert_eq!(r.errors, 1);
}

fn conversations(sessions: usize, think_time_ms: f64, seed: u64) -> Arc<Workload> {
    Arc::new(
        Workload::sessions(Sessions {
            sessions,
            turns: 3,
            system_tokens: 0,
            session_prefix_tokens: 100,
            turn_tokens: 40,
            output_tokens: 8,
            think_time_ms,
            seed,
        })
        .unwrap(),
    )
}

#[tokio::test]
async fn conversation_turns_go_one_after_the_other_and_reuse_the_last_prompt() {
    let server = serve().await;
    let t = target(&server, "qwen", Api::Completions);
    let think_ms = 30.0;
    let w = conversations(4, think_ms, 9);
    let mut records = bench::run_records(&http(), &t, w.clone(), &Arrivals::At(vec![0.0; 4]))
        .await
        .unwrap();
    assert_eq!(records.len(), 12);
    records.sort_by_key(|r| (r.session, r.turn));
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.error, None, "{r:?}");
        assert_eq!((r.session, r.turn), (Some(i / 3), Some(i % 3)));
        assert_eq!(r.output_tokens, 8);
        // Turn k+1's prompt is turn k's (100, 148 tokens) plus 8 + 40: every full
        // 64-token block of turn k's prompt is found in the cache, nothing else (the
        // sessions share no token).
        let turn = i % 3;
        assert_eq!(r.prompt_tokens, Some(100 + 48 * turn as u64));
        assert_eq!(r.cached_tokens, Some([0, 64, 128][turn]), "{r:?}");
        if turn > 0 {
            let before = &records[i - 1];
            assert!(
                r.sent_ms >= before.sent_ms + before.e2e_ms + think_ms,
                "turn {turn} of session {} was sent before the previous answer ended and the \
                 think time passed: {before:?} then {r:?}",
                i / 3
            );
        }
    }
    // All sessions started at once: their first turns overlap.
    let firsts: Vec<&_> = records.iter().filter(|r| r.turn == Some(0)).collect();
    let last_first_sent = firsts.iter().map(|r| r.sent_ms).fold(0.0, f64::max);
    let first_end = firsts
        .iter()
        .map(|r| r.sent_ms + r.e2e_ms)
        .fold(f64::INFINITY, f64::min);
    assert!(last_first_sent < first_end, "{firsts:?}");

    // Two users at a time through 5 other sessions: everything completes, reported per
    // turn.
    let r = bench::run(
        &http(),
        &t,
        conversations(5, 0.0, 10),
        &Arrivals::Concurrency(2),
        "c2",
    )
    .await
    .unwrap();
    assert_eq!((r.requests, r.completed, r.errors), (15, 15, 0));
    let per_turn: Vec<(usize, usize, usize)> = r
        .turns
        .iter()
        .map(|t| (t.first_turn, t.last_turn, t.requests))
        .collect();
    assert_eq!(per_turn, [(1, 1, 5), (2, 2, 5), (3, 3, 5), (2, 3, 10)]);
    assert_eq!(r.turns[0].kv_hit_rate, Some(0.0));
    assert_eq!(
        r.turns[3].kv_hit_rate,
        Some((64.0 + 128.0) / (148.0 + 196.0))
    );
}

#[test]
fn conversation_words_tokenize_to_growing_prefixes() {
    // Chat prompts: each id is a word with its leading space, so a turn's text
    // tokenizes to the previous turn's tokens followed by the new ones.
    let model = ModelDir::load(&model_path(), None).unwrap();
    let words = Words::from_model(&model).unwrap();
    let w = conversations(2, 0.0, 9);
    let tokens: Vec<Vec<u32>> = (0..3)
        .map(|k| model.encode(&words.text(&w.request(3 + k).token_ids)))
        .collect();
    for k in 0..3 {
        assert_eq!(tokens[k].len(), 100 + 48 * k);
        if k > 0 {
            assert_eq!(tokens[k][..tokens[k - 1].len()], tokens[k - 1][..]);
        }
    }
}
