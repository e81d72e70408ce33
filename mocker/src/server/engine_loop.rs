//! The engine on wall-clock time: one task owns the [`Engine`], admits requests between
//! steps (as vLLM's engine core does), sleeps for each step's modelled duration, then
//! hands out that step's tokens. A request whose receiver is gone (the client left) is
//! aborted, which frees its KV blocks at once. With the KV block API on, a request first
//! onboards what the sidecar holds of its prompt (in its own task), and the blocks the
//! engine lists for offloading go to the offload queue after each step.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dynamo_kvcache::SeqHash;
use dynamo_kvcache::vllm_events::KvEvent;
use tokio::sync::{mpsc, oneshot};

use super::kv_blocks::{KvBlocks, OffloadQueue, Onboarded};
use super::metrics::EngineMetricsExporter;
use crate::{Clock, Engine, FinishedRequest, RealClock, Rejected, Request, RequestId};

/// What a request's stream receives.
#[derive(Debug)]
pub enum GenEvent {
    /// One output token (an index into the engine's output vocabulary).
    Token(u32),
    /// The last event of a request.
    Finished(FinishedRequest),
}

enum Command {
    Submit {
        request: Request,
        events: mpsc::UnboundedSender<GenEvent>,
        admitted: oneshot::Sender<Result<(), Rejected>>,
        /// When the request reached the engine: it waits for the running step to end
        /// before the loop takes it, and its TTFT counts that wait, as vLLM's does (its
        /// `arrival_time` is stamped when the API server receives the request).
        arrived: Instant,
        onboarded: Option<Onboarded>,
    },
    CachedPrefix {
        hashes: Vec<SeqHash>,
        blocks: oneshot::Sender<usize>,
    },
    ResetPrefixCache {
        done: oneshot::Sender<bool>,
    },
}

/// Why a submission did not start.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Rejected(#[from] Rejected),
    #[error("the engine has stopped")]
    Stopped,
}

/// A cheap, clonable handle to the engine task.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicU64>,
    kv_blocks: Option<Arc<KvBlocks>>,
}

impl EngineHandle {
    /// Queues a request; its tokens arrive on the returned receiver. Dropping the
    /// receiver cancels the request. `pin_ttl` pins its prompt's blocks once cached
    /// (`nvext.cache_control`). A request that `onboarded` its prompt's blocks already
    /// (from a remote prefill) does not look in the sidecar's tiers.
    pub async fn submit(
        &self,
        token_ids: Vec<u32>,
        max_tokens: usize,
        seed: Option<u64>,
        pin_ttl: Option<Duration>,
        onboarded: Option<Onboarded>,
    ) -> Result<(RequestId, mpsc::UnboundedReceiver<GenEvent>), SubmitError> {
        let arrived = Instant::now();
        let onboarded = match (onboarded, &self.kv_blocks) {
            (Some(onboarded), _) => Some(onboarded),
            (None, Some(kv)) if kv.uses_tiers() => Some(kv.onboard(self, &token_ids).await),
            (None, _) => None,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, receiver) = mpsc::unbounded_channel();
        let (admitted, reply) = oneshot::channel();
        let request = Request {
            id,
            token_ids,
            max_tokens,
            seed,
            pin_ttl,
        };
        self.commands
            .send(Command::Submit {
                request,
                events,
                admitted,
                arrived,
                onboarded,
            })
            .map_err(|_| SubmitError::Stopped)?;
        reply.await.map_err(|_| SubmitError::Stopped)??;
        Ok((id, receiver))
    }

    /// Leading blocks of the chain `hashes` in the engine's prefix cache now; `None`
    /// when the engine has stopped.
    pub(super) async fn cached_prefix_blocks(&self, hashes: Vec<SeqHash>) -> Option<usize> {
        let (blocks, reply) = oneshot::channel();
        self.commands
            .send(Command::CachedPrefix { hashes, blocks })
            .ok()?;
        reply.await.ok()
    }

    /// Drops every cached block that no request uses (vLLM's `/reset_prefix_cache`).
    pub async fn reset_prefix_cache(&self) -> Result<bool, SubmitError> {
        let (done, reply) = oneshot::channel();
        self.commands
            .send(Command::ResetPrefixCache { done })
            .map_err(|_| SubmitError::Stopped)?;
        reply.await.map_err(|_| SubmitError::Stopped)
    }
}

/// Starts the engine task. KV events go to `kv_events` when set; with `kv_blocks` (and
/// its tiers in use), requests onboard from the sidecar and evicted blocks are
/// offloaded to it.
pub fn spawn(
    engine: Engine<RealClock>,
    metrics: Arc<EngineMetricsExporter>,
    kv_events: Option<mpsc::UnboundedSender<Vec<KvEvent>>>,
    kv_blocks: Option<Arc<KvBlocks>>,
) -> (EngineHandle, tokio::task::JoinHandle<()>) {
    let (commands, receiver) = mpsc::unbounded_channel();
    let offload = kv_blocks
        .as_ref()
        .filter(|kv| kv.uses_tiers())
        .map(KvBlocks::spawn_offloader);
    let handle = EngineHandle {
        commands,
        next_id: Arc::new(AtomicU64::new(1)),
        kv_blocks,
    };
    let task = tokio::spawn(
        EngineLoop {
            engine,
            streams: HashMap::new(),
            metrics,
            kv_events,
            offload,
        }
        .run(receiver),
    );
    (handle, task)
}

struct EngineLoop {
    engine: Engine<RealClock>,
    streams: HashMap<RequestId, mpsc::UnboundedSender<GenEvent>>,
    metrics: Arc<EngineMetricsExporter>,
    kv_events: Option<mpsc::UnboundedSender<Vec<KvEvent>>>,
    offload: Option<OffloadQueue>,
}

impl EngineLoop {
    /// Runs until every handle is dropped and the last request has finished.
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut open = true;
        loop {
            while open {
                match commands.try_recv() {
                    Ok(command) => self.handle(command),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => open = false,
                }
            }
            if !self.engine.has_work() {
                // An idle step only flushes events raised between steps (a cache reset).
                let flushed = self.engine.step();
                self.publish(flushed.kv_events);
                self.metrics.update(&self.engine.metrics());
                if !open {
                    return;
                }
                match commands.recv().await {
                    Some(command) => self.handle(command),
                    None => open = false,
                }
                continue;
            }
            let outcome = self.engine.step();
            let end = self.engine.clock().deadline(outcome.ended_ms());
            tokio::time::sleep_until(end.into()).await;

            let mut gone = Vec::new();
            for out in &outcome.outputs {
                self.metrics.observe_token(out.ttft_ms, out.itl_ms);
                let delivered = self
                    .streams
                    .get(&out.id)
                    .is_some_and(|s| s.send(GenEvent::Token(out.token)).is_ok());
                if !delivered {
                    gone.push(out.id);
                }
            }
            for finished in outcome.finished {
                self.metrics.observe_finished(&finished);
                if let Some(stream) = self.streams.remove(&finished.id) {
                    let _ = stream.send(GenEvent::Finished(finished));
                }
            }
            // A request that finished in this very step is already out of `streams`.
            for id in gone {
                if self.streams.remove(&id).is_some()
                    && let Some(aborted) = self.engine.abort(id)
                {
                    self.metrics.observe_finished(&aborted);
                }
            }
            self.publish(outcome.kv_events);
            if let (Some(queue), false) = (&self.offload, outcome.offload.is_empty()) {
                queue.push(outcome.offload);
            }
            self.metrics.update(&self.engine.metrics());
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit {
                request,
                events,
                admitted,
                arrived,
                onboarded,
            } => {
                let id = request.id;
                // One that onboarded its blocks first arrived before the onboard.
                let arrived = onboarded.as_ref().map_or(arrived, |o| o.arrived);
                let clock = self.engine.clock();
                let arrival_ms = clock.ms_at(arrived).min(clock.now_ms());
                let result = match onboarded {
                    Some(o) => self.engine.submit_onboarded(request, arrival_ms, o.kv),
                    None => self.engine.submit_at(request, arrival_ms),
                };
                if result.is_ok() {
                    self.streams.insert(id, events);
                }
                let _ = admitted.send(result);
            }
            Command::CachedPrefix { hashes, blocks } => {
                let _ = blocks.send(self.engine.cached_prefix_blocks(&hashes));
            }
            Command::ResetPrefixCache { done } => {
                let _ = done.send(self.engine.reset_prefix_cache());
            }
        }
    }

    fn publish(&self, events: Vec<KvEvent>) {
        if let (Some(sink), false) = (&self.kv_events, events.is_empty()) {
            let _ = sink.send(events);
        }
    }
}
