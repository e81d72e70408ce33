//! Engine behaviour through the public API, on simulated time.

use dynamo_kvcache::vllm_events::{KvEvent, KvEventEncoder, MEDIUM_GPU, decode_message};
use dynamo_mocker::{
    Clock, Engine, EngineConfig, FinishReason, KvBlocksConfig, OffloadBlock, OffloadMode, PromptKv,
    Rejected, Request, StepOutcome, TimingModel,
};

fn config(blocks: usize, block_size: usize) -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: blocks,
        block_size,
        vocab_size: 1000,
        ..EngineConfig::default()
    }
}

fn req(id: u64, tokens: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        id,
        token_ids: tokens,
        max_tokens,
        seed: None,
        pin_ttl: None,
    }
}

fn prompt(start: u32, len: usize) -> Vec<u32> {
    (start..start + len as u32).collect()
}

/// Steps until idle, returning every outcome.
fn drain(e: &mut Engine) -> Vec<StepOutcome> {
    let mut out = Vec::new();
    while e.has_work() {
        out.push(e.step());
        assert!(out.len() < 100_000, "engine does not make progress");
    }
    out
}

fn stored_hashes(steps: &[StepOutcome]) -> Vec<u64> {
    steps
        .iter()
        .flat_map(|s| &s.kv_events)
        .filter_map(|e| match e {
            KvEvent::BlockStored { block_hashes, .. } => Some(block_hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn ttft(steps: &[StepOutcome], id: u64) -> f64 {
    steps
        .iter()
        .flat_map(|s| &s.outputs)
        .find(|o| o.id == id && o.index == 0)
        .and_then(|o| o.ttft_ms)
        .expect("first token")
}

#[test]
fn repeated_prompt_hits_the_prefix_cache() {
    let mut e = Engine::simulated(config(1024, 16)).unwrap();
    let p = prompt(1, 100); // 6 full blocks + 4 tokens
    e.submit(req(1, p.clone(), 3)).unwrap();
    let first = drain(&mut e);
    assert_eq!(first[0].work.prefill_tokens, 100);
    let expected: Vec<u64> = e.hasher().seq_hashes(&p).iter().map(|h| h.0).collect();
    assert_eq!(
        stored_hashes(&first),
        expected,
        "the prompt's 6 full blocks"
    );
    match &first[0].kv_events[0] {
        KvEvent::BlockStored {
            parent_hash,
            token_ids,
            block_size,
            lora_id,
            medium,
            ..
        } => {
            assert_eq!(*parent_hash, None);
            assert_eq!(token_ids, &p[..96]);
            assert_eq!(*block_size, 16);
            assert_eq!(*lora_id, None);
            assert_eq!(medium.as_deref(), Some(MEDIUM_GPU));
        }
        other => panic!("expected BlockStored, got {other:?}"),
    }

    e.submit(req(2, p.clone(), 3)).unwrap();
    let second = drain(&mut e);
    assert_eq!(
        second[0].work.prefill_tokens, 4,
        "only the partial block is computed"
    );
    assert!(ttft(&second, 2) < ttft(&first, 1));
    assert!(stored_hashes(&second).is_empty(), "no block is new");
    let m = e.metrics().counters;
    assert_eq!((m.prefix_cache_queries, m.prefix_cache_hits), (200, 96));
    let done = second.iter().flat_map(|s| &s.finished).next().unwrap();
    assert_eq!(done.cached_prompt_tokens, 96);
}

#[test]
fn a_fully_cached_prompt_still_computes_its_last_token() {
    let mut e = Engine::simulated(config(64, 4)).unwrap();
    e.submit(req(1, prompt(0, 16), 1)).unwrap();
    drain(&mut e);
    e.submit(req(2, prompt(0, 16), 1)).unwrap();
    let s = drain(&mut e);
    // 3 of 4 blocks come from the cache; the last block is recomputed.
    assert_eq!(s[0].work.prefill_tokens, 4);
    assert_eq!(e.metrics().counters.prefix_cache_hits, 12);
}

#[test]
fn requests_scheduled_together_share_the_prefix_the_first_computes() {
    // Three prompts of one 96-token prefix and 4 tokens each of their own, all waiting
    // for the same step: the first computes the prefix, the others take its blocks as
    // they are scheduled (vLLM caches blocks when it allocates them, before the step).
    let mut e = Engine::simulated(config(64, 16)).unwrap();
    let prefix = prompt(1, 96);
    for id in 1..=3u32 {
        let mut p = prefix.clone();
        p.extend(1000 * id..1000 * id + 4);
        e.submit(req(u64::from(id), p, 2)).unwrap();
    }
    let steps = drain(&mut e);
    assert_eq!(steps[0].work.prefill_seqs, 3);
    assert_eq!(steps[0].work.prefill_tokens, 100 + 4 + 4);
    let expected: Vec<u64> = e.hasher().seq_hashes(&prefix).iter().map(|h| h.0).collect();
    assert_eq!(stored_hashes(&steps), expected, "the prefix is stored once");
    let cached: Vec<usize> = steps
        .iter()
        .flat_map(|s| &s.finished)
        .map(|f| f.cached_prompt_tokens)
        .collect();
    assert_eq!(cached, [0, 96, 96]);
    // The one step computed all three prompts: their first tokens come together.
    assert_eq!(ttft(&steps, 2), ttft(&steps, 1));
    assert_eq!(ttft(&steps, 3), ttft(&steps, 1));
}

#[test]
fn a_copy_shares_the_chunk_computed_in_its_own_first_step() {
    // A 160-token prompt (10 blocks of 16) in chunks of at most 96 tokens, and a copy
    // behind it. Step 1 computes the first 96 tokens; in step 2 the original's last 64
    // are scheduled first, so the copy finds 9 blocks (all but the one holding its last
    // token, which it must compute to sample from) and computes only 16 tokens.
    let mut e = Engine::simulated(EngineConfig {
        max_num_batched_tokens: 96,
        ..config(64, 16)
    })
    .unwrap();
    let p = prompt(1, 160);
    e.submit(req(1, p.clone(), 1)).unwrap();
    e.submit(req(2, p, 1)).unwrap();
    let first = e.step();
    assert_eq!(
        (first.work.prefill_seqs, first.work.prefill_tokens),
        (1, 96)
    );
    let second = e.step();
    assert_eq!(
        (second.work.prefill_seqs, second.work.prefill_tokens),
        (2, 64 + 16)
    );
    assert_eq!(e.metrics().counters.prefix_cache_hits, 144);
    let steps = [first, second];
    assert_eq!(ttft(&steps, 2), ttft(&steps, 1));
}

#[test]
fn filling_the_pool_evicts_least_recently_used_blocks() {
    let mut e = Engine::simulated(config(8, 4)).unwrap();
    let a = prompt(100, 16);
    let ha: Vec<u64> = e.hasher().seq_hashes(&a).iter().map(|h| h.0).collect();
    e.submit(req(1, a.clone(), 1)).unwrap();
    drain(&mut e);
    assert_eq!(e.cached_prefix_blocks(&e.hasher().seq_hashes(&a)), 4);

    // 6 new blocks: the 4 never-used ones, then A's blocks from its tail (freed first).
    e.submit(req(2, prompt(500, 24), 1)).unwrap();
    let s = drain(&mut e);
    let removed: Vec<&KvEvent> = s
        .iter()
        .flat_map(|o| &o.kv_events)
        .filter(|ev| matches!(ev, KvEvent::BlockRemoved { .. }))
        .collect();
    assert_eq!(
        removed,
        vec![&KvEvent::BlockRemoved {
            block_hashes: vec![ha[3], ha[2]],
            medium: Some(MEDIUM_GPU.into())
        }]
    );
    assert_eq!(e.cached_prefix_blocks(&e.hasher().seq_hashes(&a)), 2);

    e.submit(req(3, a, 1)).unwrap();
    let s = drain(&mut e);
    assert_eq!(s[0].work.prefill_tokens, 8);
}

#[test]
fn chunked_prefill_splits_a_long_prompt_within_the_token_budget() {
    let mut cfg = config(1024, 16);
    cfg.max_num_batched_tokens = 64;
    let mut e = Engine::simulated(cfg).unwrap();
    e.submit(req(1, prompt(0, 200), 2)).unwrap();
    let s = drain(&mut e);
    let prefill: Vec<usize> = s.iter().map(|o| o.work.prefill_tokens).collect();
    assert_eq!(prefill, vec![64, 64, 64, 8, 0]);
    assert!(s[..3].iter().all(|o| o.outputs.is_empty()));
    assert_eq!(s[3].outputs[0].index, 0, "first token after the last chunk");
    assert_eq!(s[4].work.decode_seqs, 1);
}

#[test]
fn steps_report_the_contexts_their_tokens_attend_to() {
    let pairs = dynamo_perfmodel::attention_pairs;
    let mut cfg = config(1024, 16);
    cfg.max_num_batched_tokens = 64;
    let mut e = Engine::simulated(cfg).unwrap();
    e.submit(req(1, prompt(0, 200), 2)).unwrap();
    let s = drain(&mut e);
    // Each chunk attends to the chunks before it.
    let chunks: Vec<(usize, usize, u64)> = s[..4]
        .iter()
        .map(|o| {
            (
                o.work.prefill_seqs,
                o.work.prefill_context_tokens,
                o.work.prefill_attention_pairs,
            )
        })
        .collect();
    assert_eq!(
        chunks,
        vec![
            (1, 0, pairs(64, 0)),
            (1, 64, pairs(64, 64)),
            (1, 128, pairs(64, 128)),
            (1, 192, pairs(8, 192))
        ]
    );
    // The decode step's token sees the prompt, the first output and itself.
    assert_eq!(
        (s[4].work.decode_seqs, s[4].work.decode_context_tokens),
        (1, 201)
    );
    assert_eq!(s[4].work.prefill_seqs, 0);
    // A prefix-cache hit is context, not work.
    e.submit(req(2, prompt(0, 100), 1)).unwrap();
    let s = drain(&mut e);
    assert_eq!(
        (s[0].work.prefill_tokens, s[0].work.prefill_context_tokens),
        (4, 96)
    );
    assert_eq!(s[0].work.prefill_attention_pairs, pairs(4, 96));
}

#[test]
fn chunked_prefill_shares_the_budget_with_decodes() {
    let mut cfg = config(1024, 16);
    cfg.max_num_batched_tokens = 64;
    let mut e = Engine::simulated(cfg).unwrap();
    e.submit(req(1, prompt(0, 10), 5)).unwrap();
    e.step();
    e.submit(req(2, prompt(1000, 200), 1)).unwrap();
    let o = e.step();
    // One decode token for request 1, 63 prefill tokens for request 2.
    assert_eq!((o.work.decode_seqs, o.work.prefill_tokens), (1, 63));
}

#[test]
fn preemption_under_pressure_still_finishes_every_request_with_the_same_tokens() {
    let run = |blocks: usize| {
        let mut e = Engine::simulated(config(blocks, 4)).unwrap();
        for id in 0..4 {
            e.submit(req(id, prompt(id as u32 * 1000, 20), 20)).unwrap();
        }
        let steps = drain(&mut e);
        (steps, e.metrics())
    };
    let (tight, m) = run(16); // each request needs 10 blocks on its own
    assert!(m.counters.num_preemptions > 0);
    assert!(tight.iter().any(|s| !s.preempted.is_empty()));
    let finished: Vec<_> = tight.iter().flat_map(|s| &s.finished).collect();
    assert_eq!(finished.len(), 4);
    assert!(
        finished
            .iter()
            .all(|f| f.output_tokens == 20 && f.reason == FinishReason::Length)
    );
    assert!(finished.iter().any(|f| f.num_preemptions > 0));

    let tokens = |steps: &[StepOutcome], id| -> Vec<u32> {
        steps
            .iter()
            .flat_map(|s| &s.outputs)
            .filter(|o| o.id == id)
            .map(|o| o.token)
            .collect()
    };
    let (roomy, m) = run(1024);
    assert_eq!(m.counters.num_preemptions, 0);
    for id in 0..4 {
        assert_eq!(tokens(&tight, id), tokens(&roomy, id), "request {id}");
    }
    assert_eq!(m.kv_cache_usage, 0.0, "all blocks freed");
}

#[test]
fn single_request_timing_equals_the_model() {
    let mut cfg = config(100, 16);
    cfg.speedup_ratio = 4.0;
    let model = TimingModel::Polynomial;
    let mut e = Engine::simulated(cfg).unwrap();
    e.clock_mut().advance_to(1000.0);
    e.submit(req(1, prompt(0, 100), 4)).unwrap();
    let s = drain(&mut e);
    let outs: Vec<_> = s.iter().flat_map(|o| &o.outputs).collect();
    assert_eq!(outs.len(), 4);
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    // TTFT is the prefill of the whole prompt: no decode step before the first token.
    assert!(close(outs[0].ttft_ms.unwrap(), model.prefill_ms(100) / 4.0));
    // Decode steps hold 7 blocks (101..=103 tokens of KV) of 100.
    for o in &outs[1..] {
        assert!(close(o.itl_ms.unwrap(), model.decode_ms(1, 0.07) / 4.0));
    }
    let f = &s.last().unwrap().finished[0];
    let e2e = f.finished_ms - f.arrival_ms;
    assert!(close(
        e2e,
        (model.prefill_ms(100) + 3.0 * model.decode_ms(1, 0.07)) / 4.0
    ));
}

#[test]
fn table_timing_model_drives_the_clock() {
    let mut cfg = config(100, 16);
    cfg.timing = TimingModel::Table(
        dynamo_mocker::TimingTable::from_json(
            r#"{"prefill": [{"x": 0, "ms": 10}, {"x": 100, "ms": 30}],
                "decode": [{"x": 1, "ms": 5}, {"x": 2, "ms": 7}]}"#,
        )
        .unwrap(),
    );
    let mut e = Engine::simulated(cfg).unwrap();
    e.submit(req(1, prompt(0, 50), 2)).unwrap();
    let s = drain(&mut e);
    assert_eq!(s[0].outputs[0].ttft_ms, Some(20.0));
    assert_eq!(s[1].outputs[0].itl_ms, Some(5.0));
}

#[test]
fn impossible_requests_are_rejected_at_submission() {
    let mut e = Engine::simulated(config(4, 4)).unwrap();
    assert_eq!(
        e.submit(req(1, prompt(0, 16), 2)),
        Err(Rejected::TooLong {
            prompt_tokens: 16,
            max_tokens: 2,
            needed_blocks: 5,
            pool_blocks: 4
        })
    );
    assert_eq!(e.submit(req(2, vec![], 2)), Err(Rejected::EmptyPrompt));
    assert_eq!(
        e.submit(req(3, prompt(0, 4), 0)),
        Err(Rejected::ZeroMaxTokens)
    );
    e.submit(req(4, prompt(0, 15), 2)).unwrap();
    assert_eq!(
        e.submit(req(4, prompt(0, 3), 1)),
        Err(Rejected::DuplicateId(4))
    );
    let s = drain(&mut e);
    assert_eq!(s.iter().flat_map(|o| &o.finished).count(), 1);
}

#[test]
fn outputs_are_deterministic_for_a_seed() {
    let run = |seed: u64, req_seed: Option<u64>| {
        let mut cfg = config(256, 16);
        cfg.seed = seed;
        let mut e = Engine::simulated(cfg).unwrap();
        let mut r = req(7, prompt(0, 30), 12);
        r.seed = req_seed;
        e.submit(r).unwrap();
        drain(&mut e)
            .iter()
            .flat_map(|s| s.outputs.iter().map(|o| o.token))
            .collect::<Vec<u32>>()
    };
    let a = run(1, None);
    assert_eq!(a.len(), 12);
    assert!(a.iter().all(|&t| t < 1000));
    assert_eq!(a, run(1, None));
    assert_ne!(a, run(2, None));
    assert_ne!(a, run(1, Some(99)));
    assert_eq!(run(1, Some(99)), run(1, Some(99)));
}

#[test]
fn a_seeded_answer_resent_with_its_start_appended_continues_the_same() {
    let run = |tokens: Vec<u32>, max_tokens: usize| {
        let mut e = Engine::simulated(config(256, 16)).unwrap();
        let mut r = req(1, tokens, max_tokens);
        r.seed = Some(5);
        e.submit(r).unwrap();
        drain(&mut e)
            .iter()
            .flat_map(|s| s.outputs.iter().map(|o| o.token))
            .collect::<Vec<u32>>()
    };
    let whole = run(prompt(0, 30), 12);
    let mut continued = prompt(0, 30);
    continued.extend_from_slice(&whole[..5]);
    assert_eq!(run(continued, 7), whole[5..]);
}

#[test]
fn max_num_seqs_caps_the_running_set_and_abort_frees_blocks() {
    let mut cfg = config(256, 16);
    cfg.max_num_seqs = 2;
    let mut e = Engine::simulated(cfg).unwrap();
    for id in 0..3 {
        e.submit(req(id, prompt(id as u32 * 100, 20), 50)).unwrap();
    }
    e.step();
    let m = e.metrics();
    assert_eq!((m.num_requests_running, m.num_requests_waiting), (2, 1));
    assert!(m.kv_cache_usage > 0.0);
    let f = e.abort(0).unwrap();
    assert_eq!(f.reason, FinishReason::Aborted);
    assert_eq!(e.abort(0), None);
    e.step();
    assert_eq!(e.metrics().num_requests_running, 2);
    e.abort(1);
    e.abort(2);
    assert_eq!(e.metrics().kv_cache_usage, 0.0);
    assert!(!e.has_work());
}

#[test]
fn engine_events_go_through_the_wire_format_and_reset_clears() {
    let mut e = Engine::simulated(config(64, 4)).unwrap();
    e.submit(req(1, prompt(0, 10), 1)).unwrap();
    let s = drain(&mut e);
    let events: Vec<KvEvent> = s.iter().flat_map(|o| o.kv_events.clone()).collect();
    let mut enc = KvEventEncoder::new("", Some(0));
    let frames = enc.encode(s[0].ended_ms() / 1000.0, events.clone());
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    assert_eq!(decode_message(&refs).unwrap().batch.batch.events, events);

    assert!(e.reset_prefix_cache());
    assert_eq!(e.step().kv_events, vec![KvEvent::AllBlocksCleared]);
    assert_eq!(
        e.cached_prefix_blocks(&e.hasher().seq_hashes(&prompt(0, 10))),
        0
    );
}

fn offloading(blocks: usize, block_size: usize, mode: OffloadMode) -> EngineConfig {
    EngineConfig {
        kv_blocks: Some(KvBlocksConfig {
            offload: mode,
            ..KvBlocksConfig::default()
        }),
        ..config(blocks, block_size)
    }
}

fn offloaded(steps: &[StepOutcome]) -> Vec<OffloadBlock> {
    steps.iter().flat_map(|s| s.offload.clone()).collect()
}

#[test]
fn evicted_blocks_are_listed_for_offload_with_their_parents() {
    let mut e = Engine::simulated(offloading(8, 4, OffloadMode::Evicted)).unwrap();
    let a = prompt(100, 16);
    let ha = e.hasher().seq_hashes(&a);
    e.submit(req(1, a, 1)).unwrap();
    assert!(offloaded(&drain(&mut e)).is_empty(), "nothing evicted yet");
    // Evicts A's last two blocks, tail first (as the BlockRemoved test above).
    e.submit(req(2, prompt(500, 24), 1)).unwrap();
    assert_eq!(
        offloaded(&drain(&mut e)),
        vec![
            OffloadBlock {
                hash: ha[3],
                parent: Some(ha[2])
            },
            OffloadBlock {
                hash: ha[2],
                parent: Some(ha[1])
            },
        ]
    );
    let plain = Engine::simulated(config(8, 4)).unwrap();
    assert!(plain.config().kv_blocks.is_none(), "off unless configured");
}

#[test]
fn write_through_lists_each_block_once_as_it_is_registered() {
    let mut e = Engine::simulated(offloading(8, 4, OffloadMode::All)).unwrap();
    let a = prompt(100, 10); // 2 full blocks
    let ha = e.hasher().seq_hashes(&a);
    e.submit(req(1, a, 3)).unwrap();
    let steps = drain(&mut e);
    let listed = offloaded(&steps);
    // The prompt's 2 blocks in the prefill step, then the decode-filled third.
    assert_eq!(steps[0].offload.len(), 2);
    assert_eq!(
        listed[0],
        OffloadBlock {
            hash: ha[0],
            parent: None
        }
    );
    assert_eq!(listed[1].parent, Some(ha[0]));
    assert_eq!(listed.len(), 3);
    // Evicting them later lists nothing again.
    e.submit(req(2, prompt(500, 30), 1)).unwrap();
    assert!(
        offloaded(&drain(&mut e))
            .iter()
            .all(|b| !ha.contains(&b.hash))
    );
}

#[test]
fn onboarded_blocks_extend_the_cached_prefix_on_first_admission() {
    let cfg = offloading(64, 16, OffloadMode::Evicted);
    let p = prompt(1, 100); // 6 full blocks + 4 tokens
    let mut e = Engine::simulated(cfg.clone()).unwrap();
    let hashes = e.hasher().seq_hashes(&p);
    // Block 0 is on the GPU; blocks 1..4 were onboarded.
    e.submit(req(1, p[..20].to_vec(), 1)).unwrap();
    drain(&mut e);
    e.submit_onboarded(req(2, p.clone(), 1), 0.0, PromptKv::from_tiers(1..4))
        .unwrap();
    let steps = drain(&mut e);
    assert_eq!(steps[0].work.prefill_tokens, 100 - 64);
    let done = steps.iter().flat_map(|s| &s.finished).next().unwrap();
    assert_eq!(done.cached_prompt_tokens, 64);
    let m = e.metrics().counters;
    assert_eq!(m.prefix_cache_hits, 16, "onboarded tokens are not GPU hits");
    // Onboarded blocks are cached now, and stored as GPU blocks (one event per run).
    assert_eq!(e.cached_prefix_blocks(&hashes), 6);
    assert_eq!(
        stored_hashes(&steps),
        hashes[1..].iter().map(|h| h.0).collect::<Vec<_>>()
    );

    // A gap (block 0 neither cached nor onboarded) makes onboarded blocks useless.
    let mut e = Engine::simulated(cfg.clone()).unwrap();
    e.submit_onboarded(req(1, p.clone(), 1), 0.0, PromptKv::from_tiers(1..6))
        .unwrap();
    assert_eq!(drain(&mut e)[0].work.prefill_tokens, 100);

    // Onboarded blocks are never offloaded back when evicted; computed ones are.
    let mut e = Engine::simulated(cfg).unwrap();
    let q = prompt(5000, 17);
    e.submit(req(1, q.clone(), 1)).unwrap();
    drain(&mut e);
    e.submit_onboarded(req(2, p.clone(), 1), 0.0, PromptKv::from_tiers(0..6))
        .unwrap();
    assert_eq!(drain(&mut e)[0].work.prefill_tokens, 4);
    e.submit(req(3, prompt(1000, 16 * 64 - 1), 1)).unwrap(); // takes the whole pool
    let evicted: Vec<_> = offloaded(&drain(&mut e)).iter().map(|b| b.hash).collect();
    assert_eq!(evicted, e.hasher().seq_hashes(&q));
}

#[test]
fn a_remote_prefill_leaves_only_the_last_prompt_token_computed_as_a_decode() {
    let p = prompt(1, 100); // 6 full blocks of 16 + 4 tokens
    let mut e = Engine::simulated(config(64, 16)).unwrap();
    e.submit_onboarded(req(1, p.clone(), 3), 0.0, PromptKv::from_prefill(0..6))
        .unwrap();
    let steps = drain(&mut e);
    let first = &steps[0];
    assert_eq!(
        first.work.prefill_tokens, 0,
        "the tail past the last full block came too"
    );
    assert_eq!(first.work.prefill_seqs, 0);
    assert_eq!(first.work.decode_seqs, 1);
    assert_eq!(first.work.decode_context_tokens, 100);
    assert_eq!(
        first.outputs.len(),
        1,
        "the first token comes from the first step"
    );
    let done = steps.iter().flat_map(|s| &s.finished).next().unwrap();
    assert_eq!(done.cached_prompt_tokens, 99);
    assert_eq!(e.metrics().counters.prefill_tokens, 0);
    // The prompt's full blocks are cached as if computed here.
    assert_eq!(e.cached_prefix_blocks(&e.hasher().seq_hashes(&p)), 6);

    // A prompt of whole blocks: the last block is full only with the last token.
    let q = prompt(500, 64);
    let mut e = Engine::simulated(config(64, 16)).unwrap();
    e.submit_onboarded(req(1, q, 1), 0.0, PromptKv::from_prefill(0..3))
        .unwrap();
    let first = &drain(&mut e)[0];
    assert_eq!((first.work.prefill_tokens, first.work.decode_seqs), (0, 1));

    // Fewer blocks than the prompt's (a transfer that came short): the rest is a prefill.
    let mut e = Engine::simulated(config(64, 16)).unwrap();
    e.submit_onboarded(req(1, p.clone(), 1), 0.0, PromptKv::from_prefill(0..4))
        .unwrap();
    assert_eq!(drain(&mut e)[0].work.prefill_tokens, 100 - 64);

    // The same blocks onboarded from a tier: the tail past them is computed.
    let mut e = Engine::simulated(config(64, 16)).unwrap();
    e.submit_onboarded(req(1, p, 1), 0.0, PromptKv::from_tiers(0..6))
        .unwrap();
    assert_eq!(drain(&mut e)[0].work.prefill_tokens, 4);
}
