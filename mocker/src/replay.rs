//! Replays a Mooncake-format trace through N simulated engines in simulated time.
//!
//! Trace lines are JSON: `{"timestamp": ms, "input_length": n, "output_length": m,
//! "hash_ids": [..]}` where each hash id names a 512-token block of the prompt
//! (kvcache-ai/Mooncake, FAST'25 trace release). Tokens are synthesised per hash id, so
//! equal ids give equal tokens and the engines' own block hashing finds the sharing.
//!
//! Engines advance independently; before a request arriving at `t` is routed, every
//! engine runs its steps until its clock reaches `t` (an engine mid-step at `t` runs the
//! step to its end, and the request joins at the next step, as in vLLM): a driver of the
//! simulated cluster ([`crate::cluster`]). The router sees every step's outcome (tokens,
//! finished requests and, when it asks for them, KV events), as a real router follows
//! streams and event feeds, but only once the step has ended.
//!
//! [`replay`] takes a trace; [`replay_requests`] takes any workload as token ids.

use std::fmt;

use dynamo_kvcache::{BlockHasher, SeqHash};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::cluster::{Driver, SimCluster, Stuck};
use crate::config::{ConfigError, EngineConfig};
use crate::engine::{Engine, StepOutcome};
use crate::scheduler::Request;
use crate::tokens::{stream_key, token_at};

/// Tokens per Mooncake hash id.
pub const TRACE_BLOCK_TOKENS: usize = 512;
const TRACE_SEED: u64 = 0x6d6f_6f6e_6361_6b65;

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct TraceRecord {
    pub timestamp: f64,
    pub input_length: usize,
    pub output_length: usize,
    #[serde(default)]
    pub hash_ids: Vec<u64>,
}

#[derive(Debug, Error)]
pub enum ReplayError {
    #[error("trace line {line}: {source}")]
    Trace {
        line: usize,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("a replay needs at least one engine")]
    NoEngines,
    #[error("router chose engine {chosen} of {engines}")]
    BadRoute { chosen: usize, engines: usize },
    #[error(transparent)]
    Stuck(#[from] Stuck),
}

/// Parses JSON lines, skipping blank ones.
pub fn parse_trace(text: &str) -> Result<Vec<TraceRecord>, ReplayError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| ReplayError::Trace {
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// The prompt of record `index`: block `b` holds the tokens of `hash_ids[b]`; tokens
/// beyond the listed blocks are unique to the request.
pub fn synthesize_prompt(rec: &TraceRecord, index: u64, vocab_size: u32) -> Vec<u32> {
    let own = stream_key(TRACE_SEED ^ 1, index);
    (0..rec.input_length)
        .map(|i| match rec.hash_ids.get(i / TRACE_BLOCK_TOKENS) {
            Some(&id) => token_at(
                stream_key(TRACE_SEED, id),
                (i % TRACE_BLOCK_TOKENS) as u64,
                vocab_size,
            ),
            None => token_at(own, i as u64, vocab_size),
        })
        .collect()
}

/// One request of a replay.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayRequest {
    /// Simulated arrival time; requests come in non-decreasing order.
    pub arrival_ms: f64,
    pub token_ids: Vec<u32>,
    pub max_tokens: usize,
}

/// What a router sees of a request.
pub struct RouteQuery<'a> {
    /// Position in the workload; also the engine's request id.
    pub index: usize,
    pub arrival_ms: f64,
    pub token_ids: &'a [u32],
    /// Sequence hashes of the prompt's full blocks, from the engines' hasher.
    pub block_hashes: &'a [SeqHash],
}

/// Picks the engine index for each request.
pub trait Router {
    fn route(&mut self, query: &RouteQuery<'_>, engines: &[Engine]) -> usize;

    /// Sees one step of engine `engine`: its tokens (`index` 0 is a first token),
    /// finished requests and, if [`Router::wants_kv_events`], its KV events.
    fn observe(&mut self, _engine: usize, _outcome: &StepOutcome) {}

    /// Engine `engine` refused the request it was routed (it can never fit there).
    fn rejected(&mut self, _engine: usize, _index: usize) {}

    /// Whether the engines should record KV events for [`Router::observe`] (off by
    /// default: collecting them costs time).
    fn wants_kv_events(&self) -> bool {
        false
    }
}

impl<F: FnMut(&RouteQuery<'_>, &[Engine]) -> usize> Router for F {
    fn route(&mut self, query: &RouteQuery<'_>, engines: &[Engine]) -> usize {
        self(query, engines)
    }
}

#[derive(Clone, Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Router for RoundRobin {
    fn route(&mut self, _: &RouteQuery<'_>, engines: &[Engine]) -> usize {
        let k = self.next % engines.len();
        self.next = self.next.wrapping_add(1);
        k
    }
}

/// Most leading prompt blocks already cached; ties go to the engine with the fewest
/// requests in flight, then the lowest index.
#[derive(Clone, Copy, Debug, Default)]
pub struct MostCachedPrefix;

impl Router for MostCachedPrefix {
    fn route(&mut self, q: &RouteQuery<'_>, engines: &[Engine]) -> usize {
        let key = |(i, e): (usize, &Engine)| {
            let m = e.metrics();
            let load = m.num_requests_running + m.num_requests_waiting;
            (
                e.cached_prefix_blocks(q.block_hashes),
                std::cmp::Reverse(load),
                std::cmp::Reverse(i),
            )
        };
        engines
            .iter()
            .enumerate()
            .max_by_key(|&p| key(p))
            .map_or(0, |(i, _)| i)
    }
}

/// p50/p90/p99 by nearest rank, and the mean.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
    pub count: usize,
}

impl Percentiles {
    pub fn of(values: &mut [f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        let rank =
            |q: f64| values[((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1];
        Self {
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            mean: values.iter().sum::<f64>() / values.len() as f64,
            count: values.len(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayReport {
    pub requests: usize,
    pub rejected: usize,
    pub completed: usize,
    pub output_tokens: u64,
    /// First arrival to last token, simulated.
    pub sim_duration_ms: f64,
    pub ttft_ms: Percentiles,
    pub itl_ms: Percentiles,
    /// Arrival to last token, per completed request.
    pub e2e_ms: Percentiles,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    /// Prefix cache hits / queries, in tokens, over all engines.
    pub prefix_cache_hit_rate: f64,
    pub preemptions: u64,
    pub steps: u64,
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "requests {} (completed {}, rejected {}), output tokens {}, steps {}, preemptions {}",
            self.requests,
            self.completed,
            self.rejected,
            self.output_tokens,
            self.steps,
            self.preemptions
        )?;
        writeln!(
            f,
            "simulated {:.1} s: {:.2} req/s, {:.1} output tok/s, prefix cache hit rate {:.1}%",
            self.sim_duration_ms / 1000.0,
            self.requests_per_s,
            self.output_tokens_per_s,
            self.prefix_cache_hit_rate * 100.0
        )?;
        for (name, p) in [
            ("TTFT", self.ttft_ms),
            ("ITL", self.itl_ms),
            ("E2E", self.e2e_ms),
        ] {
            writeln!(
                f,
                "{name} ms: p50 {:.1}  p90 {:.1}  p99 {:.1}  mean {:.1}  (n={})",
                p.p50, p.p90, p.p99, p.mean, p.count
            )?;
        }
        Ok(())
    }
}

/// The figures of a replay, collected step by step (also by replays that step the
/// engines themselves, as `dynamo-e2e`'s conversations do).
#[derive(Default)]
pub struct Collector {
    ttft: Vec<f64>,
    itl: Vec<f64>,
    e2e: Vec<f64>,
    completed: usize,
    output_tokens: u64,
    last_ms: f64,
}

impl Collector {
    pub fn take(&mut self, o: &StepOutcome) {
        for t in &o.outputs {
            self.output_tokens += 1;
            self.ttft.extend(t.ttft_ms);
            self.itl.extend(t.itl_ms);
        }
        self.completed += o.finished.len();
        self.e2e
            .extend(o.finished.iter().map(|f| f.finished_ms - f.arrival_ms));
        if !o.outputs.is_empty() {
            self.last_ms = self.last_ms.max(o.ended_ms());
        }
    }

    /// The report of a replay of `requests` (`rejected` of them refused) over
    /// `engines`, whose first request arrived at `first_ms`.
    pub fn report(
        mut self,
        engines: &[Engine],
        requests: usize,
        rejected: usize,
        first_ms: f64,
    ) -> ReplayReport {
        let (mut queries, mut hits, mut preemptions, mut steps) = (0u64, 0u64, 0u64, 0u64);
        for e in engines {
            let m = e.metrics();
            queries += m.counters.prefix_cache_queries;
            hits += m.counters.prefix_cache_hits;
            preemptions += m.counters.num_preemptions;
            steps += m.steps;
        }
        let sim_duration_ms = (self.last_ms - first_ms).max(0.0);
        let per_s = |x: f64| {
            if sim_duration_ms > 0.0 {
                x * 1000.0 / sim_duration_ms
            } else {
                0.0
            }
        };
        ReplayReport {
            requests,
            rejected,
            completed: self.completed,
            output_tokens: self.output_tokens,
            sim_duration_ms,
            ttft_ms: Percentiles::of(&mut self.ttft),
            itl_ms: Percentiles::of(&mut self.itl),
            e2e_ms: Percentiles::of(&mut self.e2e),
            requests_per_s: per_s(self.completed as f64),
            output_tokens_per_s: per_s(self.output_tokens as f64),
            prefix_cache_hit_rate: if queries > 0 {
                hits as f64 / queries as f64
            } else {
                0.0
            },
            preemptions,
            steps,
        }
    }
}

/// Replays `records` over `num_engines` engines built from `config`.
pub fn replay(
    records: &[TraceRecord],
    config: &EngineConfig,
    num_engines: usize,
    router: &mut dyn Router,
) -> Result<ReplayReport, ReplayError> {
    let requests = records.iter().enumerate().map(|(i, rec)| ReplayRequest {
        arrival_ms: rec.timestamp,
        token_ids: synthesize_prompt(rec, i as u64, config.vocab_size),
        max_tokens: rec.output_length.max(1),
    });
    replay_requests(requests, config, num_engines, router)
}

/// `n` engines of `config` on simulated clocks, publishing KV events if `kv_events` (for
/// a router that reads them).
pub fn simulated_engines(
    config: &EngineConfig,
    n: usize,
    kv_events: bool,
) -> Result<Vec<Engine>, ConfigError> {
    (0..n)
        .map(|_| {
            let mut e = Engine::simulated(config.clone())?;
            e.set_emit_kv_events(kv_events);
            Ok(e)
        })
        .collect()
}

/// Replays `requests` (built lazily, one at a time) over `num_engines` engines.
pub fn replay_requests(
    requests: impl IntoIterator<Item = ReplayRequest>,
    config: &EngineConfig,
    num_engines: usize,
    router: &mut dyn Router,
) -> Result<ReplayReport, ReplayError> {
    if num_engines == 0 {
        return Err(ReplayError::NoEngines);
    }
    let engines = simulated_engines(config, num_engines, router.wants_kv_events())?;
    let mut requests = requests.into_iter().enumerate();
    let next = requests.next();
    let mut replay = Replay {
        hasher: engines[0].hasher().clone(),
        cluster: SimCluster::new(engines),
        first_ms: next.as_ref().map_or(0.0, |(_, r)| r.arrival_ms),
        next,
        requests,
        router,
        collector: Collector::default(),
        count: 0,
        rejected: 0,
    };
    replay.run()?;
    let Replay {
        mut cluster,
        router,
        collector,
        count,
        rejected,
        first_ms,
        ..
    } = replay;
    // Every step is shown in the end.
    cluster.release(f64::INFINITY, |k, o| router.observe(k, &o));
    Ok(collector.report(cluster.engines(), count, rejected, first_ms))
}

/// [`replay_requests`] as a driver of the cluster: each request an event at its
/// arrival.
struct Replay<'r, I> {
    cluster: SimCluster,
    /// The next request to arrive, with its position in the workload.
    next: Option<(usize, ReplayRequest)>,
    requests: I,
    router: &'r mut dyn Router,
    hasher: BlockHasher,
    collector: Collector,
    count: usize,
    rejected: usize,
    first_ms: f64,
}

impl<I: Iterator<Item = (usize, ReplayRequest)>> Driver for Replay<'_, I> {
    type Shown = StepOutcome;
    type Error = ReplayError;

    fn cluster(&mut self) -> &mut SimCluster {
        &mut self.cluster
    }

    fn next_event_ms(&self) -> Option<f64> {
        Some(
            self.next
                .as_ref()
                .map_or(f64::INFINITY, |(_, r)| r.arrival_ms),
        )
    }

    fn stepped(&mut self, _: usize, o: StepOutcome) -> Result<StepOutcome, ReplayError> {
        self.collector.take(&o);
        Ok(o)
    }

    fn event(&mut self, now_ms: f64) -> Result<(), ReplayError> {
        let (i, req) =
            std::mem::replace(&mut self.next, self.requests.next()).expect("an event is a request");
        self.count += 1;
        let router = &mut *self.router;
        self.cluster.release(now_ms, |k, o| router.observe(k, &o));
        let hashes = self.hasher.seq_hashes(&req.token_ids);
        let query = RouteQuery {
            index: i,
            arrival_ms: req.arrival_ms,
            token_ids: &req.token_ids,
            block_hashes: &hashes,
        };
        let engines = self.cluster.engines();
        let k = router.route(&query, engines);
        if k >= engines.len() {
            return Err(ReplayError::BadRoute {
                chosen: k,
                engines: engines.len(),
            });
        }
        let request = Request {
            id: i as u64,
            token_ids: req.token_ids,
            max_tokens: req.max_tokens,
            seed: None,
            // Mooncake traces carry no cache hints.
            pin_ttl: None,
        };
        if self
            .cluster
            .engine_mut(k)
            .submit_at(request, req.arrival_ms)
            .is_err()
        {
            self.rejected += 1;
            router.rejected(k, i);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dynamo_kvcache::vllm_events::KvEvent;

    const TRACE: &str = r#"
{"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 2]}
{"timestamp": 10, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 3]}

{"timestamp": 20, "input_length": 600, "output_length": 2, "hash_ids": [7]}
{"timestamp": 30, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 2]}
"#;

    fn small() -> EngineConfig {
        EngineConfig {
            num_gpu_blocks: 256,
            block_size: 16,
            ..EngineConfig::default()
        }
    }

    #[test]
    fn equal_hash_ids_give_equal_tokens() {
        let recs = parse_trace(TRACE).unwrap();
        assert_eq!(recs.len(), 4);
        let a = synthesize_prompt(&recs[0], 0, 1000);
        let b = synthesize_prompt(&recs[1], 1, 1000);
        assert_eq!(a.len(), 1100);
        assert_eq!(a[..1024], b[..1024]);
        assert_ne!(a[1024..], b[1024..]);
        // Tokens past the listed blocks are the request's own.
        let c = synthesize_prompt(&recs[2], 2, 1000);
        let d = synthesize_prompt(&recs[2], 3, 1000);
        assert_eq!(c[..512], d[..512]);
        assert_ne!(c[512..], d[512..]);
    }

    #[test]
    fn cache_aware_routing_hits_more_than_round_robin() {
        let recs = parse_trace(TRACE).unwrap();
        let rr = replay(&recs, &small(), 2, &mut RoundRobin::default()).unwrap();
        let kv = replay(&recs, &small(), 2, &mut MostCachedPrefix).unwrap();
        for r in [&rr, &kv] {
            assert_eq!(r.completed, 4);
            assert_eq!(r.output_tokens, 13);
            assert_eq!(r.ttft_ms.count, 4);
            assert_eq!(r.itl_ms.count, 9);
        }
        assert!(kv.prefix_cache_hit_rate > rr.prefix_cache_hit_rate);
    }

    #[test]
    fn closures_route_and_bad_routes_are_errors() {
        let recs = parse_trace(TRACE).unwrap();
        let mut all_on_one = |_: &RouteQuery<'_>, _: &[Engine]| 1usize;
        let r = replay(&recs, &small(), 2, &mut all_on_one).unwrap();
        assert_eq!(r.completed, 4);
        let mut off = |_: &RouteQuery<'_>, _: &[Engine]| 5usize;
        assert!(matches!(
            replay(&recs, &small(), 2, &mut off),
            Err(ReplayError::BadRoute {
                chosen: 5,
                engines: 2
            })
        ));
        assert!(matches!(
            parse_trace("{\"timestamp\": 0}\n"),
            Err(ReplayError::Trace { line: 1, .. })
        ));
    }

    /// Routes to engine 0 and records what it is shown.
    #[derive(Default)]
    struct Watcher {
        first_tokens: Vec<u64>,
        finished: Vec<u64>,
        stored_blocks: usize,
        rejected: Vec<(usize, usize)>,
        arrivals: Vec<f64>,
        /// Ends of the steps shown, in the order shown.
        step_ends: Vec<f64>,
        /// At each route: the first tokens shown so far.
        first_tokens_at_route: Vec<usize>,
    }

    impl Router for Watcher {
        fn route(&mut self, q: &RouteQuery<'_>, _: &[Engine]) -> usize {
            self.arrivals.push(q.arrival_ms);
            self.first_tokens_at_route.push(self.first_tokens.len());
            let seen = self.step_ends.iter().copied().fold(0.0, f64::max);
            assert!(seen <= q.arrival_ms, "shown a step ending at {seen} ms");
            0
        }

        fn observe(&mut self, engine: usize, o: &StepOutcome) {
            assert_eq!(engine, 0);
            self.step_ends.push(o.ended_ms());
            let firsts = o.outputs.iter().filter(|t| t.index == 0);
            self.first_tokens.extend(firsts.map(|t| t.id));
            self.finished.extend(o.finished.iter().map(|f| f.id));
            for e in &o.kv_events {
                if let KvEvent::BlockStored { block_hashes, .. } = e {
                    self.stored_blocks += block_hashes.len();
                }
            }
        }

        fn rejected(&mut self, engine: usize, index: usize) {
            self.rejected.push((engine, index));
        }

        fn wants_kv_events(&self) -> bool {
            true
        }
    }

    #[test]
    fn routers_see_first_tokens_finishes_kv_events_and_rejections() {
        let requests =
            [(0.0, 40, 3), (5.0, 10_000, 2), (7.0, 20, 2)].map(|(at, len, out)| ReplayRequest {
                arrival_ms: at,
                token_ids: (0..len).collect(),
                max_tokens: out,
            });
        let mut w = Watcher::default();
        let r = replay_requests(requests, &small(), 2, &mut w).unwrap();
        assert_eq!((r.requests, r.completed, r.rejected), (3, 2, 1));
        assert_eq!(w.arrivals, [0.0, 5.0, 7.0]);
        assert_eq!(w.rejected, [(0, 1)], "10,000 tokens never fit in 256 x 16");
        w.first_tokens.sort_unstable();
        w.finished.sort_unstable();
        assert_eq!((w.first_tokens, w.finished), (vec![0, 2], vec![0, 2]));
        // 40 + 3 and 20 + 2 tokens, the last token never computed: 2 + 1 full blocks of
        // 16 tokens; request 2 shares its first block with request 0.
        assert_eq!(w.stored_blocks, 2);
        assert_eq!(r.e2e_ms.count, 2);
    }

    #[test]
    fn routers_see_a_step_only_once_it_has_ended() {
        // Request 1 arrives while the engine prefills request 0's 2,000 tokens.
        let requests = [(0.0, 2_000, 2), (1.0, 20, 2)].map(|(at, len, out)| ReplayRequest {
            arrival_ms: at,
            token_ids: (0..len).collect(),
            max_tokens: out,
        });
        let mut w = Watcher::default();
        replay_requests(requests, &small(), 1, &mut w).unwrap();
        assert!(w.step_ends[0] > 1.0, "the prefill step straddles request 1");
        assert_eq!(w.first_tokens_at_route, [0, 0]);
        assert!(
            w.step_ends.is_sorted(),
            "steps are shown in the order they ended"
        );
        w.first_tokens.sort_unstable();
        assert_eq!(w.first_tokens, [0, 1], "every step is shown in the end");
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let p = Percentiles::of(&mut v);
        assert_eq!((p.p50, p.p90, p.p99, p.mean), (50.0, 90.0, 99.0, 50.5));
    }
}
