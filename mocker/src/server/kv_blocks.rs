//! The KV block API on the wire (`docs/mocker.md`, "KV blocks in the sidecar"): blocks
//! the engine evicts (or all, write-through) go to the sidecar in the background, and a
//! new request brings back what the sidecar holds of its prompt before it is queued.
//!
//! Neither path can stall the engine loop. Offloads pass through a bounded queue to one
//! task that batches them into `Offload` calls; a full queue drops blocks (counted).
//! Offloads have a connection of their own: megabytes of payload in flight (or an
//! offload the sidecar is slow to take) never sit ahead of a lookup on the wire. The
//! lookup and onboard run in the request's own task, like a real engine's asynchronous
//! KV load, under a timeout; on any failure the request recomputes (counted) and new
//! requests leave the sidecar alone for [`BACKOFF`], so a sidecar that is down or hung
//! costs a timeout now and then rather than one per request. A held prefix is onboarded
//! only as far as moving it is cheaper than computing it (`onboard_cost`).
//!
//! The leases of disaggregated serving (lend a prefill's blocks, take a remote
//! prefill's) are in [`lease`].

pub mod lease;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dynamo_kvblocks::{Block, BlockClient, ClientError, Credential, Layout, MAX_MESSAGE_BYTES};
use dynamo_kvcache::{BlockHasher, SeqHash, Tier};
use tokio::sync::mpsc;

use super::engine_loop::EngineHandle;
use super::metrics::KvBlockMetrics;
use crate::kv_blocks::{KvBlocksConfig, KvGeometry, OffloadMode, is_payload_of, payload};
use crate::onboard_cost::plan_onboard;
use crate::timing::TimingModel;
use crate::{EngineConfig, OffloadBlock, PromptKv};

/// Blocks waiting to be offloaded (hashes only: payloads are built when sent).
const OFFLOAD_QUEUE_BLOCKS: usize = 1024;
/// Most blocks, and payload bytes, in one `Offload` call.
const OFFLOAD_BATCH_BLOCKS: usize = 256;
const OFFLOAD_BATCH_BYTES: u64 = 32 << 20;
/// How long onboarding skips the sidecar after it failed.
const BACKOFF: Duration = Duration::from_secs(1);
/// Room for a block's fields besides its payload in one gRPC message.
const MESSAGE_OVERHEAD: u64 = 4096;

/// The prefix a request brought back from the sidecar before it was queued.
#[derive(Debug)]
pub struct Onboarded {
    /// When the request asked; its latencies count from here.
    pub arrived: Instant,
    /// Its prompt KV now loaded (possibly none).
    pub kv: PromptKv,
}

/// One engine's connection to its sidecar's block API.
pub struct KvBlocks {
    config: KvBlocksConfig,
    /// Lookups, onboards and leases.
    client: BlockClient,
    /// Offloads only, on a connection of their own.
    offload_client: BlockClient,
    layout: Layout,
    /// The model's real KV bytes per block: what transfer times are modelled on.
    real_block_bytes: u64,
    hasher: BlockHasher,
    /// The engine's prefill model, against which onboarding is weighed.
    timing: TimingModel,
    speedup_ratio: f64,
    timeout: Duration,
    metrics: KvBlockMetrics,
    /// No lookups before this instant: the sidecar failed recently.
    backoff_until: Mutex<Option<Instant>>,
}

impl KvBlocks {
    /// The block API as `config` sets it up, for `engine` serving a model of `geometry`
    /// whose blocks it names with `hasher`.
    pub fn new(
        config: KvBlocksConfig,
        engine: &EngineConfig,
        geometry: &KvGeometry,
        hasher: BlockHasher,
        metrics: KvBlockMetrics,
    ) -> anyhow::Result<Arc<Self>> {
        let real_block_bytes = geometry.block_bytes(engine.block_size);
        let block_bytes = config.payload_bytes(real_block_bytes);
        anyhow::ensure!(
            block_bytes + MESSAGE_OVERHEAD <= MAX_MESSAGE_BYTES as u64,
            "a KV block of {block_bytes} bytes does not fit the block API's {MAX_MESSAGE_BYTES}-byte \
             messages; lower --kv-bytes-scale or --block-size"
        );
        let credential = config
            .token_file
            .as_deref()
            .map(Credential::read)
            .transpose()?;
        let connect = || -> anyhow::Result<BlockClient> {
            let client = BlockClient::new(&config.url)?;
            Ok(match &credential {
                Some(credential) => client.with_credential(credential.clone()),
                None => client,
            })
        };
        let (client, offload_client) = (connect()?, connect()?);
        Ok(Arc::new(Self {
            layout: Layout {
                block_bytes,
                block_size: engine.block_size as u32,
                layers: geometry.layers,
                dtype: geometry.dtype.clone(),
            },
            real_block_bytes,
            hasher,
            timing: engine.timing.clone(),
            speedup_ratio: engine.speedup_ratio,
            timeout: Duration::from_millis(config.timeout_ms),
            client,
            offload_client,
            config,
            metrics,
            backoff_until: Mutex::new(None),
        }))
    }

    /// Whether blocks go to and come back from the sidecar's tiers (`--kv-offload`
    /// other than `none`).
    pub fn uses_tiers(&self) -> bool {
        self.config.uses_tiers()
    }

    pub fn config(&self) -> &KvBlocksConfig {
        &self.config
    }

    /// The sequence hashes of `tokens`' full prompt blocks: as on admission, the last
    /// prompt token is always computed, so `(len - 1) / block_size` of them.
    pub fn prompt_chain(&self, tokens: &[u32]) -> Vec<SeqHash> {
        let full = tokens.len().saturating_sub(1) / self.hasher.block_size();
        self.hasher
            .seq_hashes(&tokens[..full * self.hasher.block_size()])
    }

    /// Starts the offload task; it ends when the returned queue is dropped.
    pub fn spawn_offloader(self: &Arc<Self>) -> OffloadQueue {
        let (sender, receiver) = mpsc::channel(OFFLOAD_QUEUE_BLOCKS);
        tokio::spawn(self.clone().offload(receiver));
        OffloadQueue {
            sender,
            metrics: self.metrics.clone(),
        }
    }

    async fn offload(self: Arc<Self>, mut queue: mpsc::Receiver<OffloadBlock>) {
        let per_call = (OFFLOAD_BATCH_BYTES / self.layout.block_bytes)
            .clamp(1, OFFLOAD_BATCH_BLOCKS as u64) as usize;
        let mut batch = Vec::with_capacity(per_call);
        let mut failing = false;
        while queue.recv_many(&mut batch, per_call).await > 0 {
            let n = batch.len() as u64;
            let (layout, taken) = (self.layout.clone(), std::mem::take(&mut batch));
            // Payloads of a large model are megabytes each: built off the async workers.
            let blocks = tokio::task::spawn_blocking(move || {
                let len = layout.block_bytes as usize;
                taken
                    .into_iter()
                    .map(|b| {
                        let bytes = payload(b.hash, len);
                        Block::new(b.hash, b.parent, layout.block_size, layout.clone(), bytes)
                    })
                    .collect()
            })
            .await
            .expect("building payloads does not panic");
            let mut client = self.offload_client.clone();
            let error = match tokio::time::timeout(self.timeout, client.offload(blocks)).await {
                Ok(Ok(reply)) => {
                    self.metrics
                        .offloaded
                        .inc_by(reply.stored + reply.duplicates);
                    let refused = reply.dropped + reply.corrupt;
                    if refused > 0 {
                        self.metrics.offload_dropped("refused", refused);
                    }
                    if failing {
                        tracing::info!("offloading KV blocks to the sidecar again");
                    }
                    failing = false;
                    continue;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {:?}", self.timeout),
            };
            self.metrics.offload_dropped("failed", n);
            if !failing {
                tracing::warn!(url = %self.config.url, %error, "offloading KV blocks failed; dropping them until the sidecar answers");
            }
            failing = true;
        }
    }

    /// Loads what the sidecar holds of `tokens`' full prompt blocks (beyond the engine's
    /// own cached prefix, or from the first block when offloading writes through), and
    /// waits the modelled transfer time. Never fails: anything that goes wrong leaves the
    /// request to recompute.
    pub async fn onboard(&self, engine: &EngineHandle, tokens: &[u32]) -> Onboarded {
        let arrived = Instant::now();
        let nothing = Onboarded {
            arrived,
            kv: PromptKv::default(),
        };
        if tokens.len().saturating_sub(1) < self.hasher.block_size() {
            return nothing;
        }
        if self
            .backoff_until
            .lock()
            .expect("backoff lock")
            .is_some_and(|until| arrived < until)
        {
            self.metrics.fallback("backoff");
            return nothing;
        }
        let hashes = self.prompt_chain(tokens);
        let Some(on_gpu) = engine.cached_prefix_blocks(hashes.clone()).await else {
            return nothing;
        };
        // Written through, the sidecar also holds what is on the GPU now: take the
        // prefix from its first block, since the GPU's copies may be evicted while the
        // request waits for admission (vLLM asks its connector at admission; this engine
        // asks at arrival). Offloading only evictions, it holds what the GPU does not.
        let from = match self.config.offload {
            OffloadMode::All => 0,
            OffloadMode::Evicted | OffloadMode::None => on_gpu,
        };
        if from == hashes.len() {
            return nothing;
        }
        let started = Instant::now();
        let parent = from.checked_sub(1).map(|p| hashes[p]);
        // Prompt tokens past the chain: computed whatever is onboarded.
        let tail = tokens.len() - hashes.len() * self.hasher.block_size();
        let fetched = tokio::time::timeout(self.timeout, self.fetch(&hashes[from..], parent, tail));
        let (loaded, modelled_ms) = match fetched.await {
            Ok(Ok(loaded)) => loaded,
            Ok(Err(e)) => return self.failed("error", e.to_string(), nothing),
            Err(_) => {
                let error = format!("no answer within {:?}", self.timeout);
                return self.failed("timeout", error, nothing);
            }
        };
        let modelled = Duration::from_secs_f64(modelled_ms / self.speedup_ratio / 1000.0);
        tokio::time::sleep_until((started + modelled).into()).await;
        Onboarded {
            arrived,
            kv: PromptKv::from_tiers(from..from + loaded),
        }
    }

    fn failed(&self, reason: &'static str, error: String, nothing: Onboarded) -> Onboarded {
        self.metrics.fallback(reason);
        tracing::warn!(url = %self.config.url, %error, "KV block lookup failed; recomputing");
        *self.backoff_until.lock().expect("backoff lock") = Some(Instant::now() + BACKOFF);
        nothing
    }

    /// Looks up the chain `wanted` (whose first block follows `parent`, and after which
    /// `tail` prompt tokens follow), onboards as much of the held prefix as is cheaper
    /// to move than to compute, and returns how many leading blocks check out, with the
    /// modelled milliseconds (before speedup) to load them from their tiers.
    async fn fetch(
        &self,
        wanted: &[SeqHash],
        parent: Option<SeqHash>,
        tail: usize,
    ) -> Result<(usize, f64), ClientError> {
        let mut client = self.client.clone();
        let held: Vec<(SeqHash, Tier)> = client
            .lookup(wanted)
            .await?
            .into_iter()
            .zip(wanted)
            .take_while(|((hash, _), want)| hash == *want)
            .map(|(held, _)| held)
            .collect();
        let block_tokens = self.hasher.block_size();
        let tiers: Vec<Tier> = held.iter().map(|&(_, tier)| tier).collect();
        let after = (wanted.len() - held.len()) * block_tokens + tail;
        let plan = plan_onboard(
            &tiers,
            block_tokens,
            self.real_block_bytes,
            after,
            &self.config,
            &self.timing,
        );
        if plan.blocks < held.len() {
            self.metrics
                .recomputed_cheaper
                .inc_by((held.len() - plan.blocks) as u64);
        }
        let held = &held[..plan.blocks];
        if held.is_empty() {
            return Ok((0, 0.0));
        }
        let hashes: Vec<SeqHash> = held.iter().map(|&(hash, _)| hash).collect();
        let blocks = client.onboard(&hashes).await?;
        self.metrics
            .missing
            .inc_by((held.len() - blocks.len()) as u64);
        let good = self.check(blocks, hashes, parent).await;
        let mut modelled_ms = 0.0;
        let used = good.iter().take_while(|(ok, _)| *ok).count();
        for (&(_, tier), &(_, bytes)) in held.iter().zip(&good).take(used) {
            self.metrics.onboarded(tier).inc();
            self.metrics.onboarded_bytes.inc_by(bytes);
            self.metrics
                .onboarded_real_bytes
                .inc_by(self.real_block_bytes);
            modelled_ms += self.config.transfer_ms(self.real_block_bytes, tier);
        }
        Ok((used, modelled_ms))
    }

    /// Whether each of `blocks`, delivered for the chain `hashes` (whose first block
    /// follows `parent`), is exactly the block this engine would compute, with its
    /// payload bytes; those that are not are counted as corrupt.
    async fn check(
        &self,
        blocks: Vec<Block>,
        hashes: Vec<SeqHash>,
        parent: Option<SeqHash>,
    ) -> Vec<(bool, u64)> {
        let layout = self.layout.clone();
        // Comparing megabytes of payload with what the hash derives is CPU work.
        let checked = tokio::task::spawn_blocking(move || {
            let parents = std::iter::once(parent).chain(hashes.iter().copied().map(Some));
            blocks
                .iter()
                .zip(hashes.iter().zip(parents))
                .map(|(block, (&hash, parent))| {
                    // The client has checked each payload against its checksum.
                    let ok = block.hash == hash
                        && block.parent == parent
                        && block.tokens == layout.block_size
                        && block.layout == layout
                        && is_payload_of(hash, &block.payload);
                    (ok, block.payload.len() as u64)
                })
                .collect::<Vec<_>>()
        })
        .await
        .expect("verifying payloads does not panic");
        let corrupt = checked.iter().filter(|(ok, _)| !ok).count();
        self.metrics.corrupt.inc_by(corrupt as u64);
        checked
    }
}

/// The engine loop's end of the offload queue.
pub struct OffloadQueue {
    sender: mpsc::Sender<OffloadBlock>,
    metrics: KvBlockMetrics,
}

impl OffloadQueue {
    /// Queues `blocks` without waiting; what does not fit is dropped and counted.
    pub fn push(&self, blocks: Vec<OffloadBlock>) {
        let mut dropped = 0;
        for block in blocks {
            if let Err(mpsc::error::TrySendError::Full(_)) = self.sender.try_send(block) {
                dropped += 1;
            }
        }
        if dropped > 0 {
            self.metrics.offload_dropped("queue_full", dropped);
        }
    }
}
