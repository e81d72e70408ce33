//! Shared test fixtures: pods made of a real mock engine (HTTP) and a real KV event hub
//! served over gRPC (the sidecar's stream), and the picker started in-process on
//! ephemeral ports.

#![allow(dead_code)] // each test binary uses its own subset

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dynamo_epp::config::{
    Config, DEFAULT_MAX_ATTEMPTS, DEFAULT_MIGRATION_WAIT, DiscoveryConfig, RouterConfig,
};
use dynamo_epp::frontend::FrontendOptions;
use dynamo_kvcache::{BlockHasher, KvEvent, StoredBlock, Tier};
use dynamo_kvstream::{HubConfig, KvEventHub};
use dynamo_llm::ModelDir;
use dynamo_mocker::EngineConfig;
use dynamo_mocker::server::{ServerConfig, start};
use dynamo_server::parse_duration;
use serde_json::{Value, json};
use tonic::transport::server::TcpIncoming;

pub const MODEL: &str = "qwen-mock";
pub const BLOCK_SIZE: usize = 16;

/// The model directory `make model` builds.
pub fn model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/qwen-mock")
}

pub fn model() -> ModelDir {
    ModelDir::load(&model_dir(), None).expect("run `make model` first")
}

/// A sidecar's KV event stream on its own runtime, so that dropping it kills the server
/// and its connections at once, as a process exit does.
pub struct Sidecar {
    pub url: String,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Sidecar {
    pub fn start(hub: &KvEventHub) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let service = hub.service();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        Self {
            url,
            runtime: Some(runtime),
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// One pod: a mock engine and the KV event stream its sidecar would serve.
pub struct Pod {
    pub address: SocketAddr,
    pub hub: KvEventHub,
    pub sidecar: Option<Sidecar>,
}

impl Pod {
    pub async fn start() -> Self {
        Self::start_with_speedup(20.0).await
    }

    /// `speedup`: how much faster than the modelled GPU the engine runs.
    pub async fn start_with_speedup(speedup: f64) -> Self {
        let server = start(
            ServerConfig {
                model_path: model_dir(),
                model_name: None,
                listen: "127.0.0.1:0".parse().unwrap(),
                kv_events_endpoint: None,
                engine: EngineConfig {
                    block_size: BLOCK_SIZE,
                    speedup_ratio: speedup,
                    ..EngineConfig::default()
                },
                server: Default::default(),
                behaviour: Default::default(),
            },
            std::future::pending(),
        )
        .await
        .expect("mock engine starts");
        let hub = KvEventHub::new(HubConfig::default());
        let sidecar = Sidecar::start(&hub);
        Self {
            address: server.http_addr,
            hub,
            sidecar: Some(sidecar),
        }
    }

    pub fn kv_events(&self) -> String {
        self.sidecar.as_ref().expect("sidecar running").url.clone()
    }

    /// The endpoints-file entry of this pod.
    pub fn entry(&self) -> Value {
        json!({"address": self.address.to_string(), "kv_events": self.kv_events()})
    }

    /// Announces that the pod caches every full block of `tokens`.
    pub fn announce(&self, tokens: &[u32]) -> usize {
        let hasher = BlockHasher::new(BLOCK_SIZE, MODEL, None);
        let blocks: Vec<StoredBlock> = hasher
            .seq_hashes(tokens)
            .into_iter()
            .map(|seq_hash| StoredBlock {
                seq_hash,
                engine_hash: seq_hash.0,
                tier: Tier::Gpu,
            })
            .collect();
        let n = blocks.len();
        self.hub.publish(&KvEvent::Stored {
            parent: None,
            blocks,
        });
        n
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.address))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Requests the engine completed (`vllm:request_success_total`, aborts excluded).
    pub async fn served(&self) -> u64 {
        let text = self.metrics().await;
        let aborted = text
            .lines()
            .filter(|l| l.starts_with("vllm:request_success_total{"))
            .filter(|l| l.contains("finished_reason=\"abort\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64;
        sum_metric(&text, "vllm:request_success_total") - aborted
    }

    /// Requests the engine aborted because their client left.
    pub async fn aborted(&self) -> u64 {
        let text = self.metrics().await;
        sum_metric(&text, "vllm:request_success_total") - self.served().await
    }

    pub async fn running(&self) -> u64 {
        sum_metric(&self.metrics().await, "vllm:num_requests_running")
    }
}

/// Sum of every series of `name` in a Prometheus text.
pub fn sum_metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// An endpoints file in the temp directory, removed on drop.
pub struct EndpointsFile(pub PathBuf);

impl EndpointsFile {
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "epp-test-{}-{}.json",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let file = Self(path);
        file.write(&[]);
        file
    }

    /// Replaces the file's content as a writer would: new file, then rename.
    pub fn write(&self, entries: &[Value]) {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, json!({"endpoints": entries}).to_string()).unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }
}

impl Drop for EndpointsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A picker config on ephemeral loopback ports reading `file`.
pub fn config(file: &EndpointsFile, router: RouterConfig) -> Config {
    Config {
        model_path: Some(model_dir()),
        model_name: None,
        model_card_port: None,
        http_addr: "127.0.0.1:0".parse().unwrap(),
        ext_proc_addr: "127.0.0.1:0".parse().unwrap(),
        metrics_addr: None,
        discovery: DiscoveryConfig::File {
            path: file.0.clone(),
            poll: Duration::from_millis(50),
        },
        kv_events_port: 9100,
        credential: None,
        metrics_poll_interval: None,
        router: RouterConfig {
            block_size: BLOCK_SIZE,
            ..router
        },
        frontend: FrontendOptions {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            migration_limit: 0,
            migration_wait: parse_duration(DEFAULT_MIGRATION_WAIT).unwrap(),
            parsers: Default::default(),
            forward_token_ids: false,
        },
        max_body_bytes: None,
        server: Default::default(),
    }
}

/// Polls `cond` every 20 ms for up to 20 s (the machine may be loaded).
pub async fn eventually<F: Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    for _ in 0..1000 {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A chat request body.
pub fn chat(content: &str, max_tokens: i64, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

/// A prompt text of roughly `words` words, distinct per `seed`.
pub fn text(words: usize, seed: u64) -> String {
    (0..words)
        .map(|i| {
            format!(
                "w{}",
                (i as u64).wrapping_mul(2654435761).wrapping_add(seed) % 997
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A pod whose sidecar answers every request with `error` (e.g. its 503
/// `engine_unreachable` while its engine is down), on a real socket.
pub async fn failing_pod(error: dynamo_llm::ApiError) -> (SocketAddr, Value) {
    use axum::response::IntoResponse;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(move || {
        let error = error.clone();
        async move { error.into_response() }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    // No KV stream: the endpoint is used in round-robin pools.
    let entry = json!({"address": address.to_string(), "kv_events": format!("http://{address}")});
    (address, entry)
}

/// The value of the sample `series` (its name and labels as printed), if present.
pub fn metric_value(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
        .map(|v| v as u64)
}
