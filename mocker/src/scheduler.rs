//! vLLM v1-style continuous batching over the block pool
//! (vllm/v1/core/sched/scheduler.py, `Scheduler.schedule`, FCFS policy):
//!
//! 1. Running sequences first, oldest first: each asks for its remaining tokens (a
//!    decode asks for 1, a prefill in progress for the rest of its prompt), capped by
//!    the step's token budget (chunked prefill). When the pool cannot hold them, the
//!    youngest running sequence is preempted (recompute: its blocks are freed and it goes
//!    back to the front of the waiting queue); if that is the sequence itself, the pass
//!    ends.
//! 2. Then, only if nothing was preempted, waiting sequences in order while the budget,
//!    `max_num_seqs` and the pool allow; each first looks up its prefix in the cache
//!    (at most `len - 1` tokens, since the last one must be computed to sample from).
//!    Blocks onboarded from the sidecar before submission extend that prefix on the
//!    first admission: they get fresh blocks and are registered as if computed. A
//!    request whose whole prompt a prefill engine computed (a disaggregated decode) has
//!    every prompt token but the last computed once its blocks are in, and computes that
//!    one token as a decode does (vLLM's scheduler after a remote prefill's KV arrived,
//!    `_update_waiting_for_remote_kv`: `num_computed_tokens` is the prompt's length less
//!    one, the partial last block being transferred too).
//!
//! A scheduled chunk's full blocks are registered in the prefix cache as soon as it is
//! scheduled, before the step computes them, as vLLM's `KVCacheManager.allocate_slots`
//! does (`cache_blocks` up to the computed plus the new tokens): a request admitted later
//! in the same step finds the prefix an earlier one is computing in it and shares those
//! blocks instead of computing them again (Dynamo 1.6.1's mocker does the same: three
//! requests of one 2,048-token prefix at once on one engine reuse 2,048 tokens each but
//! the first). After the step, a sequence whose every known token is computed samples
//! one new token.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::time::Duration;

use dynamo_kvcache::{BlockHasher, SeqHash};
use dynamo_perfmodel::attention_pairs;
use thiserror::Error;

use crate::block_pool::{BlockId, BlockPool};
use crate::timing::StepWork;
use crate::tokens::{stream_key, token_at};

pub type RequestId = u64;

/// A generation request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub id: RequestId,
    pub token_ids: Vec<u32>,
    /// Exactly this many tokens are generated (EOS is not modelled).
    pub max_tokens: usize,
    /// Seed of this request's output stream; `None` uses the request id.
    pub seed: Option<u64>,
    /// Pin the prompt's full blocks in the prefix cache for this long (engine time) once
    /// computed, renewed by every later hit (Dynamo's `nvext.cache_control`).
    pub pin_ttl: Option<Duration>,
}

/// Why a request was refused at submission (the HTTP layer answers 4xx).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Rejected {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("request id {0} is already in flight")]
    DuplicateId(RequestId),
    #[error(
        "prompt of {prompt_tokens} tokens plus {max_tokens} output tokens needs {needed_blocks} KV blocks, the pool has {pool_blocks}"
    )]
    TooLong {
        prompt_tokens: usize,
        max_tokens: usize,
        needed_blocks: usize,
        pool_blocks: usize,
    },
}

/// One token handed to a request in a step.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOutput {
    pub id: RequestId,
    pub token: u32,
    /// Position among the request's output tokens (0 = first).
    pub index: usize,
    /// Time to first token, on the first token only.
    pub ttft_ms: Option<f64>,
    /// Time since the previous token, on every later token.
    pub itl_ms: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` reached.
    Length,
    Aborted,
}

/// A request that left the engine.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedRequest {
    pub id: RequestId,
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    /// Prompt tokens served from the prefix cache on first admission.
    pub cached_prompt_tokens: usize,
    pub arrival_ms: f64,
    pub first_token_ms: Option<f64>,
    pub finished_ms: f64,
    pub num_preemptions: u32,
}

/// Prompt KV a request brings, loaded from outside the GPU pool before its first
/// admission.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptKv {
    /// Positions of the full prompt blocks loaded: on first admission they count as cached
    /// where they continue the cached prefix.
    pub blocks: Range<usize>,
    /// A prefill engine computed the whole prompt (a disaggregated decode): a cached prefix
    /// reaching the last token's block leaves only the last token to compute, as a decode
    /// token (vLLM's decode after a remote prefill; see the module's notes).
    pub remote_prefill: bool,
}

impl PromptKv {
    /// Blocks onboarded from the sidecar's tiers.
    pub fn from_tiers(blocks: Range<usize>) -> Self {
        Self {
            blocks,
            remote_prefill: false,
        }
    }

    /// The blocks of a prefill engine's whole prompt.
    pub fn from_prefill(blocks: Range<usize>) -> Self {
        Self {
            blocks,
            remote_prefill: true,
        }
    }
}

#[derive(Debug)]
struct Sequence {
    tokens: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    stream: u64,
    /// Sequence hashes of every full block of `tokens`.
    hashes: Vec<SeqHash>,
    blocks: Vec<BlockId>,
    num_computed: usize,
    /// Leading blocks registered in (or taken from) the prefix cache.
    num_committed: usize,
    /// KV onboarded before the first admission.
    onboarded: PromptKv,
    /// How long to pin the prompt's full blocks, ms.
    pin_ttl_ms: Option<f64>,
    arrival_ms: f64,
    first_token_ms: Option<f64>,
    last_token_ms: f64,
    cached_prompt_tokens: usize,
    num_preemptions: u32,
}

impl Sequence {
    fn outputs(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// The pin the request puts on its block at position `i`: prompt blocks only (a
    /// preempted sequence's cached prefix may run into its output).
    fn pin_for(&self, i: usize, block_size: usize) -> Option<f64> {
        self.pin_ttl_ms.filter(|_| i < self.prompt_len / block_size)
    }

    fn extend_hashes(&mut self, hasher: &BlockHasher) {
        let bs = hasher.block_size();
        while (self.hashes.len() + 1) * bs <= self.tokens.len() {
            let i = self.hashes.len();
            let local = hasher.local_hash(&self.tokens[i * bs..(i + 1) * bs]);
            self.hashes
                .push(hasher.chain(self.hashes.last().copied(), local));
        }
    }
}

/// Scheduling limits, copied from the engine config.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub enable_prefix_caching: bool,
    pub vocab_size: u32,
    pub seed: u64,
}

/// A sequence's share of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub id: RequestId,
    pub num_tokens: usize,
    pub is_prefill: bool,
}

/// What one `schedule` call decided.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub scheduled: Vec<Scheduled>,
    pub preempted: Vec<RequestId>,
    pub work: StepWork,
}

/// Token outputs of one finished step.
#[derive(Clone, Debug, Default)]
pub struct StepTokens {
    pub outputs: Vec<TokenOutput>,
    pub finished: Vec<FinishedRequest>,
}

/// Running totals, in vLLM's units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerCounters {
    /// Prompt tokens looked up in the prefix cache (first admission of each request).
    pub prefix_cache_queries: u64,
    /// Of those, tokens found cached.
    pub prefix_cache_hits: u64,
    pub num_preemptions: u64,
    /// Tokens prefilled (computed without sampling), recomputation included. A remote
    /// prefill's last prompt token is computed as a decode token, so it is not counted.
    pub prefill_tokens: u64,
    pub generation_tokens: u64,
    pub requests_finished: u64,
}

#[derive(Debug)]
pub struct Scheduler {
    limits: Limits,
    hasher: BlockHasher,
    pool: BlockPool,
    seqs: HashMap<RequestId, Sequence>,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    counters: SchedulerCounters,
}

impl Scheduler {
    pub fn new(limits: Limits, hasher: BlockHasher, pool: BlockPool) -> Self {
        assert_eq!(hasher.block_size(), pool.block_size());
        Self {
            limits,
            hasher,
            pool,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: SchedulerCounters::default(),
        }
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn pool_mut(&mut self) -> &mut BlockPool {
        &mut self.pool
    }

    pub fn hasher(&self) -> &BlockHasher {
        &self.hasher
    }

    pub fn counters(&self) -> SchedulerCounters {
        self.counters
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn has_work(&self) -> bool {
        !self.seqs.is_empty()
    }

    fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.pool.block_size())
    }

    /// Queues a request, or refuses one that could never run.
    pub fn add(&mut self, req: Request, arrival_ms: f64) -> Result<(), Rejected> {
        self.add_onboarded(req, arrival_ms, PromptKv::default())
    }

    /// As [`Self::add`], for a request that brings `onboarded` prompt KV.
    pub fn add_onboarded(
        &mut self,
        req: Request,
        arrival_ms: f64,
        onboarded: PromptKv,
    ) -> Result<(), Rejected> {
        if req.token_ids.is_empty() {
            return Err(Rejected::EmptyPrompt);
        }
        if req.max_tokens == 0 {
            return Err(Rejected::ZeroMaxTokens);
        }
        if self.seqs.contains_key(&req.id) {
            return Err(Rejected::DuplicateId(req.id));
        }
        // The last sampled token is never fed back, so its KV never needs a slot.
        let needed_blocks = self.blocks_for(req.token_ids.len() + req.max_tokens - 1);
        if needed_blocks > self.pool.num_blocks() {
            return Err(Rejected::TooLong {
                prompt_tokens: req.token_ids.len(),
                max_tokens: req.max_tokens,
                needed_blocks,
                pool_blocks: self.pool.num_blocks(),
            });
        }
        let mut seq = Sequence {
            prompt_len: req.token_ids.len(),
            tokens: req.token_ids,
            max_tokens: req.max_tokens,
            stream: stream_key(self.limits.seed, req.seed.unwrap_or(req.id)),
            hashes: Vec::new(),
            blocks: Vec::new(),
            num_computed: 0,
            num_committed: 0,
            onboarded,
            pin_ttl_ms: req.pin_ttl.map(|ttl| ttl.as_secs_f64() * 1000.0),
            arrival_ms,
            first_token_ms: None,
            last_token_ms: arrival_ms,
            cached_prompt_tokens: 0,
            num_preemptions: 0,
        };
        seq.tokens.reserve(req.max_tokens);
        seq.extend_hashes(&self.hasher);
        self.seqs.insert(req.id, seq);
        self.waiting.push_back(req.id);
        Ok(())
    }

    /// Drops a request wherever it is; `None` if it is unknown.
    pub fn abort(&mut self, id: RequestId, now_ms: f64) -> Option<FinishedRequest> {
        let seq = self.seqs.remove(&id)?;
        self.waiting.retain(|&w| w != id);
        self.running.retain(|&r| r != id);
        self.pool.free(seq.blocks.iter().rev().copied());
        Some(finished(id, &seq, FinishReason::Aborted, now_ms))
    }

    /// Decides the next step. Allocates the blocks it needs.
    pub fn schedule(&mut self) -> Batch {
        let mut batch = Batch::default();
        let mut budget = self.limits.max_num_batched_tokens;

        let mut i = 0;
        'running: while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let (n, need) = {
                let seq = &self.seqs[&id];
                let n = (seq.tokens.len() - seq.num_computed).min(budget);
                (n, self.blocks_for(seq.num_computed + n) - seq.blocks.len())
            };
            while self.pool.num_free() < need {
                let victim = self
                    .running
                    .pop()
                    .expect("running holds the current sequence");
                self.preempt(victim);
                batch.preempted.push(victim);
                if victim == id {
                    break 'running;
                }
            }
            let new_blocks = self.pool.allocate(need).expect("checked free blocks");
            let seq = self.seqs.get_mut(&id).expect("running sequence exists");
            seq.blocks.extend(new_blocks);
            let is_prefill =
                !(n == 1 && seq.outputs() > 0 && seq.num_computed + 1 == seq.tokens.len());
            self.cache_scheduled(id, n);
            batch.scheduled.push(Scheduled {
                id,
                num_tokens: n,
                is_prefill,
            });
            budget -= n;
            i += 1;
        }

        if batch.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.limits.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let Some(s) = self.admit(id, budget) else {
                    break;
                };
                self.waiting.pop_front();
                self.running.push(id);
                self.cache_scheduled(id, s.num_tokens);
                budget -= s.num_tokens;
                batch.scheduled.push(s);
            }
        }

        // Contexts for the hardware model: `num_computed` is still the pre-step count.
        for s in &batch.scheduled {
            let computed = self.seqs[&s.id].num_computed;
            let work = &mut batch.work;
            if s.is_prefill {
                work.prefill_tokens += s.num_tokens;
                work.prefill_seqs += 1;
                work.prefill_context_tokens += computed;
                work.prefill_attention_pairs +=
                    attention_pairs(s.num_tokens as u64, computed as u64);
            } else {
                work.decode_seqs += 1;
                work.decode_context_tokens += computed + 1;
            }
        }
        batch.work.kv_usage = self.pool.usage();
        batch
    }

    /// Takes the cached prefix and the blocks of the first chunk, or nothing at all.
    fn admit(&mut self, id: RequestId, budget: usize) -> Option<Scheduled> {
        let bs = self.pool.block_size();
        let seq = &self.seqs[&id];
        // Leading blocks held on the GPU or onboarded; `on_gpu` of them are in the pool.
        let max_blocks = (seq.tokens.len() - 1) / bs;
        let (hit, on_gpu) = if self.limits.enable_prefix_caching {
            let mut on_gpu = 0;
            let hit = seq.hashes[..max_blocks]
                .iter()
                .enumerate()
                .take_while(|&(i, h)| {
                    let cached = self.pool.is_cached(h);
                    on_gpu += usize::from(cached);
                    cached || seq.onboarded.blocks.contains(&i)
                })
                .count();
            (hit, on_gpu)
        } else {
            (0, 0)
        };
        // The prompt's KV is all here but the last token's, whose logits are sampled from.
        let prefilled =
            self.limits.enable_prefix_caching && seq.onboarded.remote_prefill && hit == max_blocks;
        let computed = if prefilled {
            seq.tokens.len() - 1
        } else {
            hit * bs
        };
        let n = (seq.tokens.len() - computed).min(budget);
        let need = self.blocks_for(computed + n) - on_gpu;
        let hits_leaving_free = self.pool.free_among_cached(&seq.hashes[..hit]);
        if self.pool.num_free() - hits_leaving_free < need {
            return None;
        }
        let seq = self.seqs.get_mut(&id).expect("waiting sequence exists");
        // Touch the GPU hits before allocating, so allocation cannot evict them.
        let touched: Vec<Option<BlockId>> = seq.hashes[..hit]
            .iter()
            .enumerate()
            .map(|(i, &h)| self.pool.touch(h, seq.pin_for(i, bs)))
            .collect();
        let mut fresh = self
            .pool
            .allocate(need)
            .expect("checked free blocks")
            .into_iter();
        let mut run = None; // the start of a run of onboarded blocks
        for (i, block) in touched.into_iter().enumerate() {
            match block {
                Some(block) => {
                    if let Some(start) = run.take() {
                        commit_onboarded(&mut self.pool, seq, start..i, bs);
                    }
                    seq.blocks.push(block);
                }
                None => {
                    run.get_or_insert(i);
                    seq.blocks
                        .push(fresh.next().expect("a block per onboarded block"));
                }
            }
        }
        if let Some(start) = run {
            commit_onboarded(&mut self.pool, seq, start..hit, bs);
        }
        seq.blocks.extend(fresh);
        seq.num_computed = computed;
        seq.num_committed = hit;
        // Onboarded KV is used once: after a preemption the blocks are cached or gone.
        seq.onboarded = PromptKv::default();
        if seq.num_preemptions == 0 {
            // vLLM counts queries and hits in tokens, once per request; onboarded tokens
            // are not prefix cache hits (vLLM counts them as the connector's), but they
            // are cached tokens of the request.
            self.counters.prefix_cache_queries += seq.tokens.len() as u64;
            self.counters.prefix_cache_hits += (on_gpu * bs) as u64;
            seq.cached_prompt_tokens = computed;
        }
        // A decode, or a remote prefill's last prompt token, which costs as a decode does.
        let is_prefill = !(n == 1 && (seq.outputs() > 0 || prefilled));
        Some(Scheduled {
            id,
            num_tokens: n,
            is_prefill,
        })
    }

    /// Registers the full blocks that `id`'s next `n` tokens complete, from the moment
    /// they are scheduled (vLLM's `allocate_slots`; see the module's notes).
    fn cache_scheduled(&mut self, id: RequestId, n: usize) {
        if !self.limits.enable_prefix_caching {
            return;
        }
        let bs = self.pool.block_size();
        let seq = self.seqs.get_mut(&id).expect("scheduled sequence exists");
        let full = (seq.num_computed + n) / bs;
        if full > seq.num_committed {
            let from = seq.num_committed;
            self.pool.commit_full(
                &seq.blocks[from..full],
                &seq.hashes[from..full],
                from.checked_sub(1).map(|p| seq.hashes[p]),
                &seq.tokens[from * bs..full * bs],
            );
            pin_prompt(&mut self.pool, seq, from..full, bs);
            seq.num_committed = full;
        }
    }

    fn preempt(&mut self, id: RequestId) {
        let seq = self.seqs.get_mut(&id).expect("preempted sequence exists");
        self.pool.free(seq.blocks.drain(..).rev());
        seq.num_computed = 0;
        seq.num_committed = 0;
        seq.num_preemptions += 1;
        self.counters.num_preemptions += 1;
        self.waiting.push_front(id);
    }

    /// Applies a step that ended at `end_ms`: advances, samples and finishes.
    pub fn complete(&mut self, batch: &Batch, end_ms: f64) -> StepTokens {
        let mut out = StepTokens::default();
        self.pool.set_now(end_ms);
        for s in &batch.scheduled {
            let seq = self.seqs.get_mut(&s.id).expect("scheduled sequence exists");
            seq.num_computed += s.num_tokens;
            if s.is_prefill {
                self.counters.prefill_tokens += s.num_tokens as u64;
            }
            if seq.num_computed < seq.tokens.len() {
                continue; // a prefill chunk with more to come
            }
            // Keyed by the position in the whole sequence, prompt included: a request that
            // continues a partial answer (prompt + the answer so far, same seed) gets the
            // rest of that answer, as a model continuing its own output would.
            let index = seq.outputs();
            let position = seq.tokens.len() as u64;
            let token = token_at(seq.stream, position, self.limits.vocab_size);
            seq.tokens.push(token);
            seq.extend_hashes(&self.hasher);
            let (ttft_ms, itl_ms) = match seq.first_token_ms {
                None => {
                    seq.first_token_ms = Some(end_ms);
                    (Some(end_ms - seq.arrival_ms), None)
                }
                Some(_) => (None, Some(end_ms - seq.last_token_ms)),
            };
            seq.last_token_ms = end_ms;
            self.counters.generation_tokens += 1;
            out.outputs.push(TokenOutput {
                id: s.id,
                token,
                index,
                ttft_ms,
                itl_ms,
            });
            if seq.outputs() == seq.max_tokens {
                let seq = self.seqs.remove(&s.id).expect("sequence exists");
                self.pool.free(seq.blocks.iter().rev().copied());
                self.counters.requests_finished += 1;
                out.finished
                    .push(finished(s.id, &seq, FinishReason::Length, end_ms));
            }
        }
        if !out.finished.is_empty() {
            let seqs = &self.seqs;
            self.running.retain(|id| seqs.contains_key(id));
        }
        out
    }
}

/// Registers the onboarded blocks at positions `run` of `seq` (already in `seq.blocks`).
fn commit_onboarded(pool: &mut BlockPool, seq: &Sequence, run: Range<usize>, bs: usize) {
    pool.commit_onboarded(
        &seq.blocks[run.clone()],
        &seq.hashes[run.clone()],
        run.start.checked_sub(1).map(|p| seq.hashes[p]),
        &seq.tokens[run.start * bs..run.end * bs],
    );
    pin_prompt(pool, seq, run, bs);
}

/// Pins the prompt blocks among the just registered positions `run`, if `seq` pins.
fn pin_prompt(pool: &mut BlockPool, seq: &Sequence, run: Range<usize>, bs: usize) {
    if let Some(ttl_ms) = seq.pin_for(run.start, bs) {
        let prompt_end = run.end.min(seq.prompt_len / bs);
        pool.pin(&seq.hashes[run.start..prompt_end], ttl_ms);
    }
}

fn finished(id: RequestId, seq: &Sequence, reason: FinishReason, now_ms: f64) -> FinishedRequest {
    FinishedRequest {
        id,
        reason,
        prompt_tokens: seq.prompt_len,
        output_tokens: seq.outputs(),
        cached_prompt_tokens: seq.cached_prompt_tokens,
        arrival_ms: seq.arrival_ms,
        first_token_ms: seq.first_token_ms,
        finished_ms: now_ms,
        num_preemptions: seq.num_preemptions,
    }
}
