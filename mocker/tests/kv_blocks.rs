//! The mock engine against a sidecar's KV block API, over real sockets: a fake sidecar
//! (a map of blocks behind the real gRPC service) that can corrupt blocks and hang.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{metric, serve};
use dynamo_kvblocks::pb::kv_blocks_server::{KvBlocks, KvBlocksServer};
use dynamo_kvblocks::pb::{
    self, Held, LendReply, LendRequest, LookupReply, LookupRequest, OffloadReply, OnboardRequest,
    OpenRegionReply, OpenRegionRequest,
};
use dynamo_kvblocks::{Layout, MAX_MESSAGE_BYTES, checksum};
use dynamo_kvcache::{BlockHasher, SeqHash};
use dynamo_mocker::kv_blocks::payload;
use dynamo_mocker::server::RunningServer;
use dynamo_mocker::timing::Point;
use dynamo_mocker::{EngineConfig, KvBlocksConfig, OffloadMode, TimingModel, TimingTable};
use dynamo_server::{Server, ServerLimits};
use futures::Stream;
use serde_json::{Value, json};
use tonic::{Request, Response, Status, Streaming};

mod common;

/// Payload bytes of one qwen-mock block at block size 16 and `SCALE`: 2 (K, V) x 24
/// layers x 2 KV heads x 64 (896 / 14) x 2 bytes x 16 tokens x SCALE, rounded.
const SCALE: f64 = 0.001;
const REAL_BLOCK_BYTES: u64 = 2 * 24 * 2 * 64 * 2 * 16;
const BLOCK_BYTES: u64 = 197;

struct FakeState {
    blocks: HashMap<u64, pb::Block>,
    lookup_delay: Duration,
    /// Where the fake says every block is.
    tier: pb::Tier,
    /// `Lookup` and `Onboard` calls so far.
    lookups: usize,
    /// `Offload` calls are taken and never read: a sidecar far behind on its writes.
    stall_offloads: bool,
    /// `Offload` calls begun.
    offloads: usize,
}

impl Default for FakeState {
    fn default() -> Self {
        Self {
            blocks: HashMap::new(),
            lookup_delay: Duration::ZERO,
            tier: pb::Tier::Host,
            lookups: 0,
            stall_offloads: false,
            offloads: 0,
        }
    }
}

/// The fake sidecar: every block in one tier, none ever evicted.
#[derive(Clone, Default)]
struct Fake(Arc<Mutex<FakeState>>);

impl Fake {
    fn holds(&self, hash: SeqHash) -> Option<pb::Block> {
        self.0.lock().unwrap().blocks.get(&hash.0).cloned()
    }

    /// Flips a payload byte; with `fix_checksum` the checksum matches the wrong bytes,
    /// so only a check of the content can catch it.
    fn corrupt(&self, hash: SeqHash, fix_checksum: bool) {
        let mut held = self.0.lock().unwrap();
        let block = held.blocks.get_mut(&hash.0).expect("held");
        let mut bytes = block.payload.to_vec();
        bytes[0] ^= 0xff;
        if fix_checksum {
            block.checksum = checksum(&bytes);
        }
        block.payload = bytes.into();
    }
}

#[tonic::async_trait]
impl KvBlocks for Fake {
    async fn offload(
        &self,
        request: Request<Streaming<pb::Block>>,
    ) -> Result<Response<OffloadReply>, Status> {
        let stall = {
            let mut state = self.0.lock().unwrap();
            state.offloads += 1;
            state.stall_offloads
        };
        if stall {
            // Holds the stream unread: its payload fills the HTTP/2 windows.
            let _held = request;
            return futures::future::pending().await;
        }
        let mut stream = request.into_inner();
        let mut reply = OffloadReply::default();
        while let Some(block) = stream.message().await? {
            match self.0.lock().unwrap().blocks.insert(block.hash, block) {
                Some(_) => reply.duplicates += 1,
                None => reply.stored += 1,
            }
        }
        Ok(Response::new(reply))
    }

    async fn lookup(
        &self,
        request: Request<LookupRequest>,
    ) -> Result<Response<LookupReply>, Status> {
        let delay = {
            let mut state = self.0.lock().unwrap();
            state.lookups += 1;
            state.lookup_delay
        };
        tokio::time::sleep(delay).await;
        let state = self.0.lock().unwrap();
        let held = request
            .into_inner()
            .hashes
            .iter()
            .take_while(|h| state.blocks.contains_key(h))
            .map(|&hash| Held {
                hash,
                tier: state.tier.into(),
            })
            .collect();
        Ok(Response::new(LookupReply { held }))
    }

    type OnboardStream = Pin<Box<dyn Stream<Item = Result<pb::Block, Status>> + Send>>;

    async fn onboard(
        &self,
        request: Request<OnboardRequest>,
    ) -> Result<Response<Self::OnboardStream>, Status> {
        let mut held = self.0.lock().unwrap();
        held.lookups += 1;
        let blocks: Vec<_> = request
            .into_inner()
            .hashes
            .iter()
            .map_while(|h| held.blocks.get(h).cloned().map(Ok))
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(blocks))))
    }

    async fn open_region(
        &self,
        _: Request<OpenRegionRequest>,
    ) -> Result<Response<OpenRegionReply>, Status> {
        Err(Status::unimplemented("payloads stay inline"))
    }

    async fn lend(
        &self,
        _: Request<Streaming<LendRequest>>,
    ) -> Result<Response<LendReply>, Status> {
        Err(Status::unimplemented(
            "no leases here (tests/disagg.rs has a real sidecar)",
        ))
    }

    async fn describe(
        &self,
        _: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeReply>, Status> {
        Err(Status::unimplemented("no NIXL agent here"))
    }
}

/// Serves `fake` on a free loopback port, as the sidecar serves its gRPC API.
async fn sidecar(fake: Fake) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let incoming = Server::new(&ServerLimits::default()).grpc_incoming(listener);
    let service = KvBlocksServer::new(fake).max_decoding_message_size(MAX_MESSAGE_BYTES);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    url
}

/// An engine of 8 blocks of 16 tokens using the block API at `url`.
async fn engine(kv: KvBlocksConfig) -> RunningServer {
    engine_timed(kv, TimingModel::Polynomial).await
}

async fn engine_timed(kv: KvBlocksConfig, timing: TimingModel) -> RunningServer {
    let kv = KvBlocksConfig {
        bytes_scale: SCALE,
        ..kv
    };
    engine_with(kv, timing).await
}

/// The engine of [`engine`], with `kv` as given (payload scale included).
async fn engine_with(kv: KvBlocksConfig, timing: TimingModel) -> RunningServer {
    serve(EngineConfig {
        num_gpu_blocks: 8,
        block_size: 16,
        speedup_ratio: 10.0,
        timing,
        kv_blocks: Some(kv),
        ..EngineConfig::default()
    })
    .await
}

/// Prefill at 10 ms a token (decode 1 ms a step): a GPU slow enough that a slow tier
/// still beats recomputing.
fn slow_prefill() -> TimingModel {
    let point = |x, ms| Point { x, ms };
    TimingModel::Table(TimingTable {
        prefill: vec![point(0.0, 0.0), point(100.0, 1000.0)],
        decode: vec![point(1.0, 1.0)],
    })
}

/// 100 tokens: 6 full blocks and 4 more, 7 of the pool's 8 blocks.
fn prompt(start: u32) -> Vec<u32> {
    (start..start + 100).collect()
}

fn hashes(tokens: &[u32]) -> Vec<SeqHash> {
    BlockHasher::new(16, "qwen", None).seq_hashes(tokens)
}

/// A one-token completion of `tokens`; its usage.
async fn complete(server: &RunningServer, tokens: &[u32]) -> Value {
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", server.http_addr))
        .json(&json!({"model": "qwen", "prompt": tokens, "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    body["usage"].clone()
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..250 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what} did not happen within 5 s");
}

/// Runs prompt A, then prompt B, which evicts A's blocks 1..6 from the 8-block pool
/// (its tail first; block 0 stays); waits until the sidecar holds them.
async fn evict_a(server: &RunningServer, fake: &Fake, a: &[SeqHash]) {
    complete(server, &prompt(1)).await;
    complete(server, &prompt(1000)).await;
    eventually("offload of A's evicted blocks", async || {
        a[1..].iter().all(|&h| fake.holds(h).is_some())
    })
    .await;
    assert!(fake.holds(a[0]).is_none(), "block 0 was never evicted");
}

#[tokio::test]
async fn evicted_blocks_go_to_the_sidecar_and_a_repeated_prompt_onboards_them() {
    let fake = Fake::default();
    fake.0.lock().unwrap().tier = pb::Tier::Disk;
    // 5 blocks from disk at 2 MB/s: 5 x 196608 B = 492 ms, 49 ms at speedup 10; their
    // 80 tokens' prefill would take 800 ms.
    let server = engine_timed(
        KvBlocksConfig {
            url: sidecar(fake.clone()).await,
            disk_bandwidth_gbps: 0.002,
            ..KvBlocksConfig::default()
        },
        slow_prefill(),
    )
    .await;
    let a = hashes(&prompt(1));
    evict_a(&server, &fake, &a).await;
    for i in 1..6 {
        let block = fake.holds(a[i]).unwrap();
        assert_eq!(block.parent, Some(a[i - 1].0));
        assert_eq!(block.tokens, 16);
        let layout = block.layout.clone().unwrap();
        assert_eq!(
            Layout::from(layout),
            Layout {
                block_bytes: BLOCK_BYTES,
                block_size: 16,
                layers: 24,
                dtype: "bfloat16".into()
            }
        );
        assert_eq!(block.payload, payload(a[i], BLOCK_BYTES as usize));
        assert_eq!(block.checksum, checksum(&block.payload));
    }
    assert_eq!(
        metric(&server, "dynamo_mocker_kv_offload_blocks_total").await,
        5.0
    );

    let (prefilled, ttft) = (
        metric(&server, "vllm:prompt_tokens_total").await,
        metric(&server, "vllm:time_to_first_token_seconds_sum").await,
    );
    let usage = complete(&server, &prompt(1)).await;
    // Block 0 from the GPU, 1..6 onboarded: only the last 4 tokens are computed.
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 96);
    assert_eq!(
        metric(&server, "vllm:prompt_tokens_total").await - prefilled,
        4.0
    );
    let onboard_s = 5.0 * REAL_BLOCK_BYTES as f64 / 2e6 / 10.0;
    let took = metric(&server, "vllm:time_to_first_token_seconds_sum").await - ttft;
    assert!(
        took >= onboard_s,
        "TTFT {took} s includes the {onboard_s} s onboard"
    );
    assert_eq!(
        metric(
            &server,
            "dynamo_mocker_kv_onboard_blocks_total{model_name=\"qwen\",tier=\"disk\"}"
        )
        .await,
        5.0
    );
    assert_eq!(
        metric(&server, "dynamo_mocker_kv_onboard_bytes_total").await,
        5.0 * BLOCK_BYTES as f64
    );
    assert_eq!(
        metric(&server, "dynamo_mocker_kv_onboard_real_bytes_total").await,
        5.0 * REAL_BLOCK_BYTES as f64
    );
    assert_eq!(
        metric(&server, "dynamo_mocker_kv_onboard_corrupt_blocks_total").await,
        0.0
    );
}

#[tokio::test]
async fn write_through_offloads_every_block_without_eviction() {
    let fake = Fake::default();
    let server = engine(KvBlocksConfig {
        url: sidecar(fake.clone()).await,
        offload: OffloadMode::All,
        ..KvBlocksConfig::default()
    })
    .await;
    complete(&server, &prompt(1)).await;
    let a = hashes(&prompt(1));
    eventually("write-through of A's 6 blocks", async || {
        a.iter().all(|&h| fake.holds(h).is_some())
    })
    .await;
    assert_eq!(fake.holds(a[0]).unwrap().parent, None);
}

#[tokio::test]
async fn corrupted_blocks_are_never_used_and_are_counted() {
    let fake = Fake::default();
    let server = engine(KvBlocksConfig {
        url: sidecar(fake.clone()).await,
        ..KvBlocksConfig::default()
    })
    .await;
    let a = hashes(&prompt(1));
    evict_a(&server, &fake, &a).await;
    // Block 3 carries a checksum of its wrong bytes (only the content check sees it);
    // block 4 fails its checksum, so the client stops there (4 and 5 never arrive).
    fake.corrupt(a[3], true);
    fake.corrupt(a[4], false);
    let prefilled = metric(&server, "vllm:prompt_tokens_total").await;
    let usage = complete(&server, &prompt(1)).await;
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 48,
        "block 0 from the GPU, 1 and 2 onboarded; 3 on recomputed"
    );
    assert_eq!(
        metric(&server, "vllm:prompt_tokens_total").await - prefilled,
        52.0
    );
    assert_eq!(
        metric(&server, "dynamo_mocker_kv_onboard_corrupt_blocks_total").await,
        1.0
    );
    assert_eq!(
        metric(&server, "dynamo_mocker_kv_onboard_missing_blocks_total").await,
        2.0
    );
    assert_eq!(
        metric(&server, "dynamo_mocker_kv_onboard_blocks_total").await,
        2.0
    );
}

#[tokio::test]
async fn a_sidecar_that_is_down_fails_no_request() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let server = engine(KvBlocksConfig {
        url,
        ..KvBlocksConfig::default()
    })
    .await;
    complete(&server, &prompt(1)).await;
    complete(&server, &prompt(1000)).await; // evicts A's blocks: their offload fails
    let usage = complete(&server, &prompt(1)).await;
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 16,
        "GPU only"
    );
    // The first lookup fails; for a second after that the sidecar is not asked.
    let fallbacks = "dynamo_mocker_kv_onboard_fallbacks_total{model_name=\"qwen\",reason=";
    let error = metric(&server, &format!("{fallbacks}\"error\"}}")).await;
    let backoff = metric(&server, &format!("{fallbacks}\"backoff\"}}")).await;
    assert!(error >= 1.0 && error + backoff == 3.0, "{error} {backoff}");
    eventually("the failed offload is counted", async || {
        metric(&server, "dynamo_mocker_kv_offload_dropped_blocks_total").await >= 5.0
    })
    .await;
}

#[tokio::test]
async fn a_hung_sidecar_costs_one_timeout_then_is_skipped() {
    let fake = Fake::default();
    fake.0.lock().unwrap().lookup_delay = Duration::from_secs(30);
    let server = engine(KvBlocksConfig {
        url: sidecar(fake).await,
        timeout_ms: 200,
        ..KvBlocksConfig::default()
    })
    .await;
    let started = Instant::now();
    let usage = complete(&server, &prompt(1)).await;
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    let took = started.elapsed();
    assert!(
        (Duration::from_millis(200)..Duration::from_secs(2)).contains(&took),
        "{took:?}"
    );
    let fallbacks = "dynamo_mocker_kv_onboard_fallbacks_total{model_name=\"qwen\",reason=";
    assert_eq!(
        metric(&server, &format!("{fallbacks}\"timeout\"}}")).await,
        1.0
    );
    let started = Instant::now();
    complete(&server, &prompt(3000)).await;
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "skipped, not waited for"
    );
    assert_eq!(
        metric(&server, &format!("{fallbacks}\"backoff\"}}")).await,
        1.0
    );
}

#[tokio::test]
async fn offload_none_neither_offloads_nor_looks_up() {
    let fake = Fake::default();
    let server = engine(KvBlocksConfig {
        url: sidecar(fake.clone()).await,
        offload: OffloadMode::None,
        ..KvBlocksConfig::default()
    })
    .await;
    complete(&server, &prompt(1)).await;
    complete(&server, &prompt(1000)).await; // evicts A's blocks 1..6
    let usage = complete(&server, &prompt(1)).await;
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 16,
        "GPU only"
    );
    // Offloads are asynchronous: give a wrong one time to arrive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let state = fake.0.lock().unwrap();
    assert!(state.blocks.is_empty(), "nothing offloaded");
    assert_eq!(state.lookups, 0, "no lookups or onboards");
}

#[tokio::test]
async fn a_tier_slower_than_prefill_is_left_and_the_blocks_recomputed() {
    let fake = Fake::default();
    fake.0.lock().unwrap().tier = pb::Tier::Object;
    // 5 blocks over a 2 MB/s link: 492 ms, against ~1.2 ms of prefill for their tokens.
    let server = engine(KvBlocksConfig {
        url: sidecar(fake.clone()).await,
        object_bandwidth_gbps: 0.002,
        ..KvBlocksConfig::default()
    })
    .await;
    let a = hashes(&prompt(1));
    evict_a(&server, &fake, &a).await;
    let before = fake.0.lock().unwrap().lookups;
    let usage = complete(&server, &prompt(1)).await;
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 16,
        "GPU only"
    );
    assert_eq!(
        metric(&server, "dynamo_mocker_kv_onboard_recomputed_blocks_total").await,
        5.0
    );
    assert_eq!(
        metric(&server, "dynamo_mocker_kv_onboard_blocks_total").await,
        0.0
    );
    assert_eq!(
        fake.0.lock().unwrap().lookups,
        before + 1,
        "looked up, never onboarded"
    );
}

#[tokio::test]
async fn a_lookup_is_answered_while_an_offload_holds_the_sidecar() {
    let fake = Fake::default();
    fake.0.lock().unwrap().stall_offloads = true;
    // One block's payload (300x its 196,608 real bytes: 59 MB) is more than the HTTP/2
    // windows (32 MiB): were lookups on the offload's connection, they could not be sent.
    // The limit is long so that only a lookup that waits on the offload fails.
    let kv = KvBlocksConfig {
        url: sidecar(fake.clone()).await,
        bytes_scale: 300.0,
        timeout_ms: 60_000,
        ..KvBlocksConfig::default()
    };
    let server = engine_with(kv, TimingModel::Polynomial).await;
    complete(&server, &prompt(1)).await;
    complete(&server, &prompt(1000)).await; // evicts A's blocks: an offload that stalls
    eventually("the stalled offload", async || {
        fake.0.lock().unwrap().offloads > 0
    })
    .await;
    let before = fake.0.lock().unwrap().lookups;
    let usage = complete(&server, &prompt(1)).await;
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 16);
    assert_eq!(
        fake.0.lock().unwrap().lookups,
        before + 1,
        "the lookup was answered"
    );
    let fallbacks = "dynamo_mocker_kv_onboard_fallbacks_total{model_name=\"qwen\",reason=";
    assert_eq!(
        metric(&server, &format!("{fallbacks}\"timeout\"}}")).await,
        0.0
    );
}
