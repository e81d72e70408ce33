//! What the sidecar tests share: an in-process sidecar on free loopback ports, an engine
//! KV event publisher writing vLLM's wire format (with vLLM's replay protocol), a real
//! gRPC subscriber, and metric scraping.
#![allow(dead_code)] // each test binary uses its own part of this

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use dynamo_kvcache::vllm_events::{KvEvent as EngineEvent, KvEventBatch, encode_message};
use dynamo_kvcache::{KvEvent, KvIndex, WorkerId};
use dynamo_kvstream::{PodUpdate, SubscriberConfig, follow};
use dynamo_sidecar::{Config, Sidecar};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, XPubSocket, ZmqMessage};

/// Generous: the machine running the tests may be loaded.
pub const WAIT: Duration = Duration::from_secs(30);

/// The model name that salts hashes in these tests.
pub const MODEL: &str = "m";

/// A sidecar on free loopback ports in front of `engine_url`.
pub async fn sidecar(engine_url: &str, kv_events: Option<&str>, replay: Option<&str>) -> Sidecar {
    sidecar_with(engine_url, kv_events, replay, &[]).await
}

/// Like [`sidecar`], with `extra` flag-value pairs replacing the test defaults.
pub async fn sidecar_with(
    engine_url: &str,
    kv_events: Option<&str>,
    replay: Option<&str>,
    extra: &[&str],
) -> Sidecar {
    try_sidecar_with(engine_url, kv_events, replay, extra)
        .await
        .expect("sidecar starts")
}

pub async fn try_sidecar_with(
    engine_url: &str,
    kv_events: Option<&str>,
    replay: Option<&str>,
    extra: &[&str],
) -> anyhow::Result<Sidecar> {
    let defaults = [
        ("--listen", "127.0.0.1:0"),
        ("--host", "127.0.0.1"),
        ("--grpc-port", "0"),
        ("--metrics-port", "0"),
        ("--engine-url", engine_url),
        ("--engine-kv-events", kv_events.unwrap_or("none")),
        ("--engine-kv-replay", replay.unwrap_or("none")),
        ("--model-name", MODEL),
    ];
    let mut args = vec!["dynamo-sidecar"];
    for (flag, value) in defaults {
        if !extra.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    args.extend(extra);
    Sidecar::start(&Config::parse_from(args)).await
}

/// Polls `check` until it holds; panics with `what` after [`WAIT`].
pub async fn eventually<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The sum of the samples of `name` (with any labels matching `labels`) on the sidecar's
/// metrics port.
pub async fn metric(sidecar: &Sidecar, name: &str, labels: &str) -> f64 {
    metric_at(sidecar.metrics_addr, name, labels).await
}

/// [`metric`] of the sidecar whose metrics port is `addr`.
pub async fn metric_at(addr: std::net::SocketAddr, name: &str, labels: &str) -> f64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            l.split([' ', '{']).next() == Some(name) && (labels.is_empty() || l.contains(labels))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// The messages an engine sent, as `(seq, payload)`.
type Sent = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// An engine's KV event publisher: vLLM's PUB wire format on an XPUB socket (identical on
/// the wire, and it tells us when the sidecar has subscribed), plus vLLM's replay ROUTER.
/// Both are the `zeromq` crate's: a ZMTP implementation independent of the sidecar's
/// `dynamo_zmtp`, so these tests do not check our codec only against itself.
pub struct EnginePublisher {
    socket: XPubSocket,
    pub endpoint: String,
    pub replay_endpoint: String,
    /// Every message, for replay.
    sent: Sent,
    next_seq: u64,
    _replay: AbortOnDropHandle<()>,
}

impl EnginePublisher {
    pub async fn bind() -> Self {
        let mut socket = XPubSocket::new();
        let endpoint = socket.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        let mut router = RouterSocket::new();
        let replay_endpoint = router.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let replay = AbortOnDropHandle::new(tokio::spawn(serve_replay(router, sent.clone())));
        Self {
            socket,
            endpoint,
            replay_endpoint,
            sent,
            next_seq: 0,
            _replay: replay,
        }
    }

    /// Waits until a subscriber has subscribed (the first message of a SUB socket).
    pub async fn wait_subscriber(&mut self) {
        let message = tokio::time::timeout(WAIT, self.socket.recv())
            .await
            .expect("a subscriber within the wait")
            .unwrap();
        assert_eq!(message.get(0).map(|f| f[0]), Some(1), "a subscribe message");
    }

    /// Publishes `events` as the next message.
    pub async fn publish(&mut self, events: Vec<EngineEvent>) {
        let seq = self.next_seq;
        self.send(seq, events).await;
    }

    /// Numbers `events` as the next message but loses it: it reaches only the replay buffer.
    pub fn lose(&mut self, events: Vec<EngineEvent>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let [_, _, payload] = encode_message(b"", seq, &batch(events));
        self.sent.lock().unwrap().push((seq, payload));
    }

    /// Publishes with an explicit sequence number (a restarted engine starts at 0).
    pub async fn send(&mut self, seq: u64, events: Vec<EngineEvent>) {
        let frames = encode_message(b"", seq, &batch(events));
        self.sent.lock().unwrap().push((seq, frames[2].clone()));
        self.next_seq = seq + 1;
        self.send_frames(frames.into_iter().map(Bytes::from).collect())
            .await;
    }

    /// Sends any frames, well-formed or not.
    pub async fn send_frames(&mut self, frames: Vec<Bytes>) {
        self.socket
            .send(ZmqMessage::try_from(frames).unwrap())
            .await
            .unwrap();
    }

    /// Forgets the replay buffer (an engine whose buffer moved past the lost messages).
    pub fn forget_history(&self) {
        self.sent.lock().unwrap().clear();
    }
}

fn batch(events: Vec<EngineEvent>) -> KvEventBatch {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    KvEventBatch {
        ts,
        events,
        dp_rank: Some(0),
    }
}

/// vLLM's `ZmqEventPublisher._service_replay`: `[id, b"", start]` in, one
/// `[id, b"", seq, payload]` per buffered message from `start` on, then `[id, b"", -1, b""]`.
async fn serve_replay(mut router: RouterSocket, sent: Sent) {
    while let Ok(request) = router.recv().await {
        let frames = request.into_vec();
        let [id, _, start] = <[Bytes; 3]>::try_from(frames).expect("[id, b\"\", start]");
        let start = u64::from_be_bytes(start[..].try_into().unwrap());
        let replies: Vec<(u64, Vec<u8>)> = sent
            .lock()
            .unwrap()
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .chain([(u64::MAX, Vec::new())])
            .collect();
        for (seq, payload) in replies {
            let reply = vec![
                id.clone(),
                Bytes::new(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                Bytes::from(payload),
            ];
            router
                .send(ZmqMessage::try_from(reply).unwrap())
                .await
                .unwrap();
        }
    }
}

pub fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>) -> EngineEvent {
    EngineEvent::BlockStored {
        block_hashes: hashes.to_vec(),
        parent_hash: parent,
        token_ids: tokens,
        block_size: 4,
        lora_id: None,
        medium: Some("GPU".into()),
        lora_name: None,
    }
}

pub fn removed(hashes: &[u64]) -> EngineEvent {
    EngineEvent::BlockRemoved {
        block_hashes: hashes.to_vec(),
        medium: Some("GPU".into()),
    }
}

/// `n` blocks' worth of tokens starting at `first`.
pub fn tokens(first: u32, blocks: usize) -> Vec<u32> {
    (first..first + 4 * blocks as u32).collect()
}

/// A subscriber like the endpoint picker's: `dynamo_kvstream::follow` on the sidecar's
/// gRPC port, its updates queued for the test.
pub struct Follower {
    updates: mpsc::UnboundedReceiver<PodUpdate>,
    _task: AbortOnDropHandle<()>,
}

impl Follower {
    pub fn start(grpc: std::net::SocketAddr) -> Self {
        let (tx, updates) = mpsc::unbounded_channel();
        let config = SubscriberConfig {
            retry_min: Duration::from_millis(20),
            retry_max: Duration::from_millis(200),
            connect_timeout: Duration::from_secs(5),
            credential: None,
        };
        let task = tokio::spawn(follow(format!("http://{grpc}"), config, move |u| {
            let _ = tx.send(u);
        }));
        Self {
            updates,
            _task: AbortOnDropHandle::new(task),
        }
    }

    pub async fn next(&mut self) -> PodUpdate {
        tokio::time::timeout(WAIT, self.updates.recv())
            .await
            .expect("an update within the wait")
            .expect("the follower runs")
    }

    /// An update already received, if any.
    pub fn try_next(&mut self) -> Option<PodUpdate> {
        self.updates.try_recv().ok()
    }

    /// The next update, which must be a live event.
    pub async fn event(&mut self) -> KvEvent {
        match self.next().await {
            PodUpdate::Event(e, _) => e,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    /// The next update, which must be a snapshot.
    pub async fn snapshot(&mut self) -> Vec<KvEvent> {
        match self.next().await {
            PodUpdate::Snapshot(chains) => chains,
            other => panic!("expected a snapshot, got {other:?}"),
        }
    }
}

/// A picker's view of one pod, rebuilt from the updates it received.
pub struct View(KvIndex);

const POD: WorkerId = WorkerId(0);

impl View {
    pub fn new() -> Self {
        Self(KvIndex::new(1 << 20))
    }

    pub fn apply(&mut self, update: &PodUpdate) {
        match update {
            PodUpdate::Snapshot(chains) => {
                self.0.remove_worker(POD);
                for chain in chains {
                    self.0.apply(POD, chain).unwrap();
                }
            }
            PodUpdate::Event(event, _) => self.0.apply(POD, event).unwrap(),
            PodUpdate::Lost => self.0.remove_worker(POD),
        }
    }

    /// The tiers in which the pod holds `block`, best first.
    pub fn tiers_of(&self, block: dynamo_kvcache::SeqHash) -> Vec<dynamo_kvcache::Tier> {
        self.0.tiers_of(POD, block)
    }

    /// The pod's blocks as stored chains, in a canonical order.
    pub fn chains(&self) -> Vec<KvEvent> {
        self.0.snapshot(POD)
    }
}

/// A stand-in HTTP engine for proxy tests. `POST /v1/chat/completions` records what it
/// got and streams SSE, holding its second chunk until the test [releases](Self::release)
/// it; `GET /forever` streams a chunk every 20 ms until its client goes away;
/// `/metrics` and `/health` answer as an engine's do.
pub struct Upstream {
    pub url: String,
    pub state: Arc<UpstreamState>,
    _server: AbortOnDropHandle<()>,
}

pub struct UpstreamState {
    gate: tokio::sync::Semaphore,
    /// The last chat request's headers and body.
    pub seen: Mutex<Option<(axum::http::HeaderMap, Bytes)>>,
    /// Set when a `/forever` stream was dropped (its connection closed).
    pub forever_dropped: std::sync::atomic::AtomicBool,
}

impl Upstream {
    pub async fn start() -> Self {
        use axum::routing::{get, post};
        let state = Arc::new(UpstreamState {
            gate: tokio::sync::Semaphore::new(0),
            seen: Mutex::new(None),
            forever_dropped: Default::default(),
        });
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/forever", get(forever))
            .route(
                "/metrics",
                get(|| async { "vllm:num_requests_running 3\n" }),
            )
            .route("/health", get(|| async { "ok" }))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            url,
            state,
            _server: AbortOnDropHandle::new(server),
        }
    }

    /// Lets one held SSE stream send the rest of its chunks.
    pub fn release(&self) {
        self.state.gate.add_permits(1);
    }
}

type UpstreamRef = axum::extract::State<Arc<UpstreamState>>;

async fn chat(
    axum::extract::State(state): UpstreamRef,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    *state.seen.lock().unwrap() = Some((headers, body));
    let chunks = futures::stream::unfold(0, move |step| {
        let state = state.clone();
        async move {
            let chunk = match step {
                0 => "data: 1\n\n",
                1 => {
                    state.gate.acquire().await.unwrap().forget();
                    "data: 2\n\n"
                }
                2 => "data: [DONE]\n\n",
                _ => return None,
            };
            Some((Ok::<_, std::io::Error>(chunk), step + 1))
        }
    });
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-engine", "yes")
        .body(axum::body::Body::from_stream(chunks))
        .unwrap()
}

/// Sets its flag when dropped.
struct DropFlag(Arc<UpstreamState>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0
            .forever_dropped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

async fn forever(axum::extract::State(state): UpstreamRef) -> axum::body::Body {
    let flag = DropFlag(state);
    let ticks = futures::stream::unfold(flag, |flag| async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Some((Ok::<_, std::io::Error>("data: tick\n\n"), flag))
    });
    axum::body::Body::from_stream(ticks)
}

/// Reads `response`, appending to `so_far`, until `so_far` contains `wanted`.
pub async fn read_until(response: &mut reqwest::Response, so_far: &mut String, wanted: &str) {
    tokio::time::timeout(WAIT, async {
        while !so_far.contains(wanted) {
            let chunk = response.chunk().await.unwrap().expect("more body");
            so_far.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{wanted:?} not received; got {so_far:?}"));
}

/// The `dynamo-sidecar` binary, killed when dropped.
pub struct SidecarProcess {
    pub child: Child,
    pub proxy: SocketAddr,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
    /// Every line it logged so far.
    log: Arc<Mutex<Vec<String>>>,
}

impl SidecarProcess {
    /// Starts it on free loopback ports, learning them from its "serving" log line.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    /// [`SidecarProcess::start`] with `env` added to its environment.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dynamo-sidecar"))
            .envs(env.iter().copied())
            .args(["--listen", "127.0.0.1:0", "--host", "127.0.0.1"])
            .args([
                "--grpc-port",
                "0",
                "--metrics-port",
                "0",
                "--model-name",
                MODEL,
            ])
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .spawn()
            .expect("the sidecar binary starts");
        let logs = BufReader::new(child.stderr.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        // Keeps reading, so the sidecar never blocks on a full pipe.
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in logs.lines().map_while(Result::ok) {
                if line.contains("dynamo-sidecar serving") {
                    let _ = tx.send(line.clone());
                }
                kept.lock().unwrap().push(line);
            }
        });
        let line = rx.recv_timeout(WAIT).expect("the sidecar logs its ports");
        let addr = |field: &str| -> SocketAddr {
            let value = line.split(&format!("{field}=")).nth(1).expect(field);
            let value: String = value
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                .collect();
            value
                .parse()
                .unwrap_or_else(|_| panic!("{field} in {line}"))
        };
        let (proxy, grpc, metrics) = (addr("proxy"), addr("grpc"), addr("metrics"));
        Self {
            child,
            proxy,
            grpc,
            metrics,
            log,
        }
    }

    /// The lines it logged so far that contain `text`.
    pub fn logged(&self, text: &str) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|l| l.contains(text)).cloned().collect()
    }

    /// A line of `/proc/PID/status`, in bytes (the kernel reports kB).
    pub fn status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("{field} in {status}"));
        let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kb * 1024
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Generous for a gRPC call that ends at once, or after a timeout of a second or so.
pub const ENDS: Duration = Duration::from_secs(10);

/// A raw HTTP/2 connection to a sidecar's gRPC port, for requests no gRPC client sends
/// (half a message) and answers no gRPC client leaves unread.
pub struct RawGrpc {
    addr: SocketAddr,
    send: hyper::client::conn::http2::SendRequest<axum::body::Body>,
    /// Drives the connection; ends when it closes.
    pub driver: tokio::task::JoinHandle<()>,
}

/// A call whose request body the test writes, and its answer's head.
pub struct RawCall {
    pub body: mpsc::Sender<std::io::Result<Bytes>>,
    pub answer: tokio::task::JoinHandle<hyper::Response<hyper::body::Incoming>>,
}

impl RawGrpc {
    /// A connection whose client lets the sidecar send `window` bytes of each answer
    /// before it reads them (`None`: HTTP/2's default).
    pub async fn open(addr: SocketAddr, window: Option<u32>) -> Self {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, driver) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .initial_stream_window_size(window)
                .handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .unwrap();
        let driver = tokio::spawn(async move {
            let _ = driver.await;
        });
        Self { addr, send, driver }
    }

    /// Starts a call of `path` that sends `first`, then whatever the test sends on
    /// its `body` (which ends the request when dropped).
    pub async fn call(&mut self, path: &str, first: &[Bytes]) -> RawCall {
        let (body, chunks) = mpsc::channel(16);
        for chunk in first {
            body.send(Ok(chunk.clone())).await.unwrap();
        }
        let stream = tokio_stream::wrappers::ReceiverStream::new(chunks);
        let request = hyper::Request::post(format!("http://{}{path}", self.addr))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(axum::body::Body::from_stream(stream))
            .unwrap();
        self.send.ready().await.unwrap();
        let answer = self.send.send_request(request);
        let answer = tokio::spawn(async move { answer.await.unwrap() });
        RawCall { body, answer }
    }
}

impl Drop for RawGrpc {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl RawCall {
    /// The gRPC status the call ended with (a trailers-only answer's).
    pub async fn status(self) -> tonic::Code {
        let answer = tokio::time::timeout(ENDS, self.answer)
            .await
            .expect("the call ends")
            .unwrap();
        let status = answer.headers()["grpc-status"].to_str().unwrap();
        tonic::Code::from_i32(status.parse().unwrap())
    }
}

/// The 5-byte prefix of a gRPC message of `len` bytes.
pub fn grpc_prefix(len: u32) -> Bytes {
    let mut prefix = vec![0];
    prefix.extend(len.to_be_bytes());
    prefix.into()
}

/// A chain of `n` blocks of `bytes` each, hashes `first..`, each payload its hash's low
/// byte over and over.
pub fn block_chain(first: u64, n: u64, bytes: usize) -> Vec<dynamo_kvblocks::Block> {
    let layout = dynamo_kvblocks::Layout {
        block_bytes: bytes as u64,
        block_size: 16,
        layers: 2,
        dtype: "bfloat16".into(),
    };
    (first..first + n)
        .map(|h| {
            let payload = Bytes::from(vec![h as u8; bytes]);
            let parent = (h > first).then(|| dynamo_kvcache::SeqHash(h - 1));
            let hash = dynamo_kvcache::SeqHash(h);
            dynamo_kvblocks::Block::new(hash, parent, 16, layout.clone(), payload)
        })
        .collect()
}

/// The directory of NIXL's libraries for tests that move blocks over NIXL (`NIXL_LIB_DIR`,
/// which `.ci/run` exports), loaded into this process; `None`, with a message, where
/// NIXL is not installed: the test then skips. `DYNAMO_REQUIRE_NIXL` (set in CI) makes
/// a missing NIXL a failure instead.
pub fn nixl_lib_dir(test: &str) -> Option<String> {
    let dir = std::env::var("NIXL_LIB_DIR").ok();
    if dynamo_sidecar::nixl::library::load(dir.as_deref().map(std::path::Path::new)) {
        return Some(dir.unwrap_or_default());
    }
    assert!(
        std::env::var_os("DYNAMO_REQUIRE_NIXL").is_none(),
        "{test}: NIXL is required here but libnixl_capi.so did not load from NIXL_LIB_DIR {dir:?}"
    );
    println!("SKIPPED {test}: NIXL is not installed (no libnixl_capi.so; set NIXL_LIB_DIR)");
    None
}
