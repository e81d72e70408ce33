//! The load generator against a real mock engine server on loopback: streamed SSE over
//! HTTP, usage with cached tokens, errors as the server words them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dynamo_e2e::arrivals::{self, Arrivals};
use dynamo_e2e::bench;
use dynamo_e2e::client::{Api, Target, Words};
use dynamo_e2e::workload::{SharedPrefix, Workload};
use dynamo_llm::ModelDir;
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
    let record = dynamo_e2e::client::send(&http, &t, &item, std::time::Instant::now()).await;
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
