//! The planner's performance profile of this engine (`dynamo_planner::profile`), measured
//! on the simulated clock: the engine that serves, driven request by request, not the
//! timing formula read off. What the profiler sweeps on a real GPU, this sweeps on the
//! mock engine, so a planner over mocker workers sizes them from what they really do
//! (chunked prefill, the KV pool's occupancy, the speedup ratio included).
//!
//! - Prefill: for each ISL of the sweep, one request of that many (uncached) prompt tokens
//!   alone on a fresh engine: its TTFT, and `isl / TTFT` as the prefill throughput.
//! - Decode: for each context length x concurrency of the sweep, that many requests of
//!   that prompt length on a fresh engine; once every prompt is prefilled, the mean
//!   duration of the next decode-only steps is the ITL, and `concurrency / ITL` the
//!   decode throughput. Concurrencies above `max_num_seqs`, or whose sequences would not
//!   all fit in the KV pool (so the engine would preempt), are left out: that is where
//!   the engine's decode capacity ends.
//!
//! Throughputs are per GPU: divided by [`ProfileSweep::gpus_per_engine`] (the mock engine
//! stands for one engine of that many GPUs). The sweep's results are made to satisfy the
//! profile format's rules: a measured time that falls as its axis grows (only a timing
//! table can do that) is raised to the previous point's, so the profile never promises a
//! longer prompt sooner or a bigger batch faster.

use dynamo_planner::profile::{DecodePoint, PrefillPoint, Profile, ProfileError};
use thiserror::Error;

use crate::config::{ConfigError, EngineConfig};
use crate::engine::Engine;
use crate::scheduler::Request;

/// What to measure.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileSweep {
    /// Prompt lengths of the prefill points; those that do not fit in the KV pool are
    /// skipped.
    pub isls: Vec<usize>,
    /// Prompt lengths of the decode points.
    pub context_lengths: Vec<usize>,
    /// Sequences decoding at once, per context length (capped by `max_num_seqs` and the
    /// KV pool).
    pub concurrencies: Vec<usize>,
    /// Decode-only steps averaged per decode point.
    pub decode_steps: usize,
    /// GPUs one engine stands for; throughputs are divided by it.
    pub gpus_per_engine: u32,
}

impl Default for ProfileSweep {
    /// ISLs and context lengths from 128 to 32k tokens (the lengths Dynamo's profiler
    /// sweeps for an 8B model), concurrencies in powers of two up to vLLM's default
    /// `max_num_seqs` of 256 and beyond.
    fn default() -> Self {
        Self {
            isls: vec![
                128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 16384, 32768,
            ],
            context_lengths: vec![256, 1024, 2048, 4096, 8192, 16384, 32768],
            concurrencies: vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024],
            decode_steps: 4,
            gpus_per_engine: 1,
        }
    }
}

/// Why no profile could be measured.
#[derive(Debug, Error)]
pub enum PlannerProfileError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "no {0} point fits this engine (its KV pool is too small for every length of the sweep)"
    )]
    NoPoints(&'static str),
    #[error("decode_steps and gpus_per_engine must be at least 1")]
    BadSweep,
    #[error("the measured profile is invalid: {0}")]
    Invalid(#[from] ProfileError),
}

/// The engine the sweep drives: `config` without the sidecar's block API (a lone engine
/// has no sidecar; blocks it would offload do not change its timing).
fn measuring_config(config: &EngineConfig) -> EngineConfig {
    EngineConfig {
        kv_blocks: None,
        ..config.clone()
    }
}

/// Prompt `r` of `len` tokens: its first token is `r`, so no two prompts share a block
/// (nothing is a prefix cache hit) and every request is distinct.
pub fn prompt(r: usize, len: usize, vocab: u32) -> Vec<u32> {
    (0..len)
        .map(|j| ((r + j) % vocab as usize) as u32)
        .collect()
}

/// Whether `n` sequences of `tokens` tokens each fit in the pool at once.
fn fits(config: &EngineConfig, n: usize, tokens: usize) -> bool {
    n.saturating_mul(tokens.div_ceil(config.block_size)) <= config.num_gpu_blocks
}

/// TTFT (simulated ms) of one request of `isl` uncached prompt tokens alone on a fresh
/// engine built from `config`; `None` if it cannot fit in the KV pool.
pub fn measure_ttft_ms(config: &EngineConfig, isl: usize) -> Result<Option<f64>, ConfigError> {
    let config = measuring_config(config);
    if isl == 0 || !fits(&config, 1, isl) {
        return Ok(None);
    }
    let mut engine = Engine::simulated(config.clone())?;
    let request = Request {
        id: 0,
        token_ids: prompt(0, isl, config.vocab_size),
        max_tokens: 1,
        seed: None,
        pin_ttl: None,
    };
    if engine.submit_at(request, 0.0).is_err() {
        return Ok(None);
    }
    while engine.has_work() {
        let o = engine.step();
        if let Some(ttft) = o.outputs.iter().find_map(|t| t.ttft_ms) {
            return Ok(Some(ttft));
        }
        if o.duration_ms == 0.0 {
            break;
        }
    }
    Ok(None)
}

/// Mean ITL (simulated ms) of `concurrency` sequences of `context_length` prompt tokens
/// decoding together on a fresh engine: the mean of the first `steps` decode-only steps
/// once every prompt is prefilled. `None` when they cannot all run at once (above
/// `max_num_seqs`, or more KV than the pool holds).
pub fn measure_itl_ms(
    config: &EngineConfig,
    context_length: usize,
    concurrency: usize,
    steps: usize,
) -> Result<Option<f64>, ConfigError> {
    let config = measuring_config(config);
    if context_length == 0 || concurrency == 0 || steps == 0 {
        return Ok(None);
    }
    if concurrency > config.max_num_seqs {
        return Ok(None);
    }
    // Sequences admitted early decode a token in each later prefill step (chunked
    // prefill mixes them), so each needs enough tokens to outlast the prefills and
    // then `steps` more.
    let prefill_steps = (concurrency * context_length).div_ceil(config.max_num_batched_tokens);
    let max_tokens = prefill_steps + steps + 2;
    if !fits(&config, concurrency, context_length + max_tokens) {
        return Ok(None);
    }
    let mut engine = Engine::simulated(config.clone())?;
    for r in 0..concurrency {
        let request = Request {
            id: r as u64,
            token_ids: prompt(r, context_length, config.vocab_size),
            max_tokens,
            seed: None,
            pin_ttl: None,
        };
        if engine.submit_at(request, 0.0).is_err() {
            return Ok(None);
        }
    }
    let mut durations = Vec::with_capacity(steps);
    while engine.has_work() && durations.len() < steps {
        let o = engine.step();
        if o.duration_ms == 0.0 || !o.preempted.is_empty() {
            return Ok(None);
        }
        if o.work.prefill_tokens == 0 && o.work.decode_seqs == concurrency {
            durations.push(o.duration_ms);
        }
    }
    if durations.len() < steps {
        return Ok(None);
    }
    Ok(Some(durations.iter().sum::<f64>() / steps as f64))
}

/// Measures the planner's profile of engines built from `config` over `sweep` (see the
/// module doc). Deterministic: the same config and sweep give the same profile.
pub fn planner_profile(
    config: &EngineConfig,
    sweep: &ProfileSweep,
) -> Result<Profile, PlannerProfileError> {
    config.validate()?;
    if sweep.decode_steps == 0 || sweep.gpus_per_engine == 0 {
        return Err(PlannerProfileError::BadSweep);
    }
    let gpus = f64::from(sweep.gpus_per_engine);
    let mut isls = sweep.isls.clone();
    // Chunked prefill adds a step (and its fixed cost) at every multiple of the step's
    // token budget: a point on each side of each such boundary inside the sweep keeps
    // the planner's linear interpolation on the engine's steps.
    if let (Some(&lo), Some(&hi)) = (isls.iter().min(), isls.iter().max()) {
        let chunk = config.max_num_batched_tokens;
        let first = lo.div_ceil(chunk).max(1);
        for m in first..=hi / chunk {
            isls.extend([m * chunk, m * chunk + 1].into_iter().filter(|&x| x <= hi));
        }
    }
    isls.sort_unstable();
    isls.dedup();
    let mut prefill: Vec<PrefillPoint> = Vec::new();
    for isl in isls {
        let Some(ttft) = measure_ttft_ms(config, isl)? else {
            continue;
        };
        let ttft_ms = prefill.last().map_or(ttft, |p| ttft.max(p.ttft_ms));
        prefill.push(PrefillPoint {
            isl: isl as f64,
            ttft_ms,
            throughput_per_gpu: isl as f64 * 1000.0 / ttft_ms / gpus,
        });
    }
    let mut contexts = sweep.context_lengths.clone();
    contexts.sort_unstable();
    contexts.dedup();
    let mut concurrencies = sweep.concurrencies.clone();
    concurrencies.sort_unstable();
    concurrencies.dedup();
    let mut decode: Vec<DecodePoint> = Vec::new();
    for ctx in contexts {
        let mut last_itl: Option<f64> = None;
        for &n in &concurrencies {
            // Past the first concurrency that cannot run at once, none can.
            let Some(itl) = measure_itl_ms(config, ctx, n, sweep.decode_steps)? else {
                break;
            };
            let itl_ms = last_itl.map_or(itl, |l| itl.max(l));
            last_itl = Some(itl_ms);
            decode.push(DecodePoint {
                context_length: ctx as f64,
                concurrency: n as f64,
                itl_ms,
                throughput_per_gpu: n as f64 * 1000.0 / itl_ms / gpus,
            });
        }
    }
    if prefill.is_empty() {
        return Err(PlannerProfileError::NoPoints("prefill"));
    }
    if decode.is_empty() {
        return Err(PlannerProfileError::NoPoints("decode"));
    }
    Ok(Profile::new(sweep.gpus_per_engine, prefill, decode)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::{Point, TimingModel, TimingTable};

    /// A small engine (32k tokens of KV) and a sweep around it, fast in a debug build.
    fn small() -> (EngineConfig, ProfileSweep) {
        let config = EngineConfig {
            num_gpu_blocks: 2048,
            block_size: 16,
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            ..EngineConfig::default()
        };
        let sweep = ProfileSweep {
            isls: vec![256, 1024, 2048, 4096, 8192],
            context_lengths: vec![256, 1024, 4096],
            concurrencies: vec![1, 4, 16, 64],
            decode_steps: 3,
            gpus_per_engine: 1,
        };
        (config, sweep)
    }

    #[test]
    fn the_profile_is_valid_json_the_planner_reads() {
        let (config, sweep) = small();
        let p = planner_profile(&config, &sweep).unwrap();
        let text = serde_json::to_string_pretty(&p).unwrap();
        let again = Profile::from_json(&text).unwrap();
        // JSON keeps 17 significant digits at most: equal to the last bits or so.
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        for (a, b) in again.prefill_points().iter().zip(p.prefill_points()) {
            assert!(
                close(a.ttft_ms, b.ttft_ms) && close(a.throughput_per_gpu, b.throughput_per_gpu)
            );
        }
        for (a, b) in again.decode_points().iter().zip(p.decode_points()) {
            assert!(close(a.itl_ms, b.itl_ms) && a.concurrency == b.concurrency);
        }
        // The sweep's 5 ISLs and one past each 2,048-token chunk boundary within them.
        let isls: Vec<f64> = p.prefill_points().iter().map(|q| q.isl).collect();
        assert_eq!(
            isls,
            [
                256.0, 1024.0, 2048.0, 2049.0, 4096.0, 4097.0, 6144.0, 6145.0, 8192.0
            ]
        );
        // 64 sequences of 4,096 tokens need 16k blocks, the pool has 2,048: at that
        // context the sweep stops at 4 (4 x 257 blocks fit; 16 x 257 do not).
        let at = |ctx: f64| -> Vec<f64> {
            p.decode_points()
                .iter()
                .filter(|d| d.context_length == ctx)
                .map(|d| d.concurrency)
                .collect()
        };
        assert_eq!(at(256.0), [1.0, 4.0, 16.0, 64.0]);
        assert_eq!(at(4096.0), [1.0, 4.0]);
        // Decoding more sequences takes longer per step but yields more tokens/s.
        let d: Vec<_> = p
            .decode_points()
            .iter()
            .filter(|d| d.context_length == 256.0)
            .collect();
        assert!(d.windows(2).all(|w| w[1].itl_ms >= w[0].itl_ms));
        assert!(
            d.windows(2)
                .all(|w| w[1].throughput_per_gpu > w[0].throughput_per_gpu)
        );
    }

    #[test]
    fn expected_ttft_matches_what_the_engine_measures() {
        let (config, sweep) = small();
        let p = planner_profile(&config, &sweep).unwrap();
        // Between sweep points, chunked (3,000 > 2,048 tokens per step): the profile's
        // interpolation against one such request run on the engine.
        for isl in [600, 3000, 6000] {
            let measured = measure_ttft_ms(&config, isl).unwrap().unwrap();
            let expected = p.expected_ttft_ms(isl as f64);
            assert!(
                (expected / measured - 1.0).abs() < 0.03,
                "isl {isl}: profile {expected} ms, engine {measured} ms"
            );
        }
        // At a sweep point it is exactly the engine's: the polynomial for one step of
        // 1,024 tokens.
        let t = TimingModel::Polynomial;
        assert_eq!(p.expected_ttft_ms(1024.0), t.prefill_ms(1024));
        // Decode: one sequence of 256 tokens, KV usage 17 blocks of 2,048 at its steps.
        let itl = p.expected_itl_ms(256.0, 1.0);
        assert!((itl - t.decode_ms(1, 17.0 / 2048.0)).abs() < 0.05, "{itl}");
    }

    #[test]
    fn a_faster_engine_has_proportionally_more_throughput() {
        let (config, sweep) = small();
        let slow = planner_profile(&config, &sweep).unwrap();
        let fast = planner_profile(
            &EngineConfig {
                speedup_ratio: 2.5,
                ..config
            },
            &sweep,
        )
        .unwrap();
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-9;
        for (s, f) in slow.prefill_points().iter().zip(fast.prefill_points()) {
            assert!(close(f.throughput_per_gpu, 2.5 * s.throughput_per_gpu));
            assert!(close(f.ttft_ms, s.ttft_ms / 2.5));
        }
        assert_eq!(slow.decode_points().len(), fast.decode_points().len());
        for (s, f) in slow.decode_points().iter().zip(fast.decode_points()) {
            assert!(close(f.throughput_per_gpu, 2.5 * s.throughput_per_gpu));
        }
        // GPUs per engine divide the throughput.
        let two = planner_profile(
            &small().0,
            &ProfileSweep {
                gpus_per_engine: 2,
                ..sweep.clone()
            },
        )
        .unwrap();
        assert_eq!(two.gpus_per_engine(), 2);
        assert!(close(
            two.prefill_points()[0].throughput_per_gpu,
            slow.prefill_points()[0].throughput_per_gpu / 2.0
        ));
    }

    #[test]
    fn a_table_whose_times_fall_is_flattened_into_a_valid_profile() {
        let (config, sweep) = small();
        // Decode steps get faster with more sequences, and prefill of 4k is faster than
        // of 2k: neither may reach the planner as such.
        let table = TimingTable {
            prefill: vec![
                Point { x: 256.0, ms: 10.0 },
                Point {
                    x: 2048.0,
                    ms: 80.0,
                },
                Point {
                    x: 4096.0,
                    ms: 40.0,
                },
                Point {
                    x: 8192.0,
                    ms: 200.0,
                },
            ],
            decode: vec![Point { x: 1.0, ms: 20.0 }, Point { x: 64.0, ms: 10.0 }],
        };
        let config = EngineConfig {
            timing: TimingModel::Table(table),
            ..config
        };
        let p = planner_profile(&config, &sweep).unwrap();
        let ttft: Vec<f64> = p.prefill_points().iter().map(|q| q.ttft_ms).collect();
        assert!(ttft.windows(2).all(|w| w[1] >= w[0]), "{ttft:?}");
        assert!(Profile::from_json(&serde_json::to_string(&p).unwrap()).is_ok());
    }

    #[test]
    fn an_engine_too_small_for_the_sweep_says_so() {
        let (mut config, sweep) = small();
        config.num_gpu_blocks = 4; // 64 tokens
        assert!(matches!(
            planner_profile(&config, &sweep),
            Err(PlannerProfileError::NoPoints("prefill"))
        ));
        let bad = ProfileSweep {
            decode_steps: 0,
            ..sweep
        };
        assert!(matches!(
            planner_profile(&small().0, &bad),
            Err(PlannerProfileError::BadSweep)
        ));
    }
}
