//! Aggregated and disaggregated graphs of simulated engines, in simulated time
//! (`DESIGN.md`, "Disaggregated request"): `replay --topology agg:4,2p2d,1p3d`.
//!
//! - `agg:N`: N engines that prefill and decode, each request routed by the endpoint
//!   picker's scheduler ([`KvRouter`], `Side::Aggregated`): the plain replay.
//! - `XpYd`: X prefill and Y decode engines. At its arrival a request gets a prefill
//!   engine (KV overlap and prefill load) and a decode engine (decode load only), both
//!   picked at once as the picker does. The prefill engine computes the prompt and
//!   samples one token (the prefill leg: `max_tokens: 1`). It lends its prompt's full
//!   KV blocks short of the last token (as the mock engine does), and those the decode
//!   engine does not hold cross to it: the model's real bytes at the link's bandwidth,
//!   each engine having one link (a prefill engine sends one prompt at a time, a decode
//!   engine receives one at a time, in the order prefills end; a transfer waits for its
//!   prefill engine's link, then for its decode engine's, each busy for the wire time).
//!   On arrival the decode engine queues the request with those blocks
//!   (`Engine::submit_onboarded`, `PromptKv::from_prefill`): it computes only the last
//!   prompt token, as a decode token, before its first token (vLLM's decode after a
//!   remote prefill).
//!   TTFT is therefore prefill (queueing included) + transfer + the decode engine's
//!   first step, counted from the request's arrival; ITL and throughput come from the
//!   decode engines, the KV hit rate from the prefill engines' prefix caches.
//!
//! The picker's load accounting is followed: a prefill leg loads its engine with its
//! uncached prompt blocks until the decode engine's first token (the picker never sees
//! the leg itself), the decode request loads its engine as decode load from then until
//! it finishes; KV events of prefill engines feed the index (decode engines' overlap is
//! never credited).
//!
//! A driver of the simulated cluster (`dynamo_mocker::cluster`), as every replay is:
//! the busy engine furthest behind steps until every busy engine has passed the next
//! known event (an arrival, a prefill's end, a transfer's end); a prefill that ends meanwhile
//! becomes an event, so transfers take the links in time order whatever order engines
//! were stepped in. An engine may overshoot an event by part of one step; the request
//! then joins at its next step, as in vLLM.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Instant;

use dynamo_kvcache::{BlockHasher, RequestId, SeqHash};
use dynamo_loadgen::report::{DisaggStats, Report};
use dynamo_loadgen::workload::Workload;
use dynamo_mocker::replay::{Collector, Percentiles, ReplayReport, Router};
use dynamo_mocker::{
    Driver, Engine, EngineConfig, PromptKv, Request, SimCluster, StepOutcome, TimingModel,
};
use dynamo_names::Role;

use crate::replay::{KvRouter, RouterSetup, check_arrivals};

/// The picker's ids of a request's two legs: the decode request is the request's
/// index, its prefill leg the same with the top bit set.
const PREFILL_LEG: u64 = 1 << 63;

fn decode_leg(i: usize) -> RequestId {
    RequestId(i as u64)
}

fn prefill_leg(i: usize) -> RequestId {
    RequestId(i as u64 | PREFILL_LEG)
}

/// A graph of engines: `agg:N`, or `XpYd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    Aggregated { engines: usize },
    Disaggregated { prefill: usize, decode: usize },
}

impl Topology {
    /// `agg:N` (or `aggN`), `XpYd` (case-insensitive), each count at least 1.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let count = |n: &str| -> Result<usize, String> {
            match n.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!(
                    "{s:?}: engine counts are whole numbers of at least 1"
                )),
            }
        };
        if let Some(n) = t.strip_prefix("agg") {
            let n = n.strip_prefix(':').unwrap_or(n);
            return Ok(Self::Aggregated { engines: count(n)? });
        }
        let shape = || {
            format!(
                "{s:?}: a topology is agg:N (N aggregated engines) or XpYd (X prefill, Y decode engines), e.g. agg:4, 1p3d"
            )
        };
        let (p, rest) = t.split_once('p').ok_or_else(shape)?;
        let d = rest.strip_suffix('d').ok_or_else(shape)?;
        if p.is_empty() || d.is_empty() {
            return Err(shape());
        }
        Ok(Self::Disaggregated {
            prefill: count(p)?,
            decode: count(d)?,
        })
    }

    /// Engines (GPUs) of the graph.
    pub fn engines(&self) -> usize {
        match *self {
            Self::Aggregated { engines } => engines,
            Self::Disaggregated { prefill, decode } => prefill + decode,
        }
    }

    /// Each engine's role, prefill engines first.
    fn roles(&self) -> Vec<Role> {
        match *self {
            Self::Aggregated { engines } => vec![Role::Aggregated; engines],
            Self::Disaggregated { prefill, decode } => std::iter::repeat_n(Role::Prefill, prefill)
                .chain(std::iter::repeat_n(Role::Decode, decode))
                .collect(),
        }
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Aggregated { engines } => write!(f, "agg:{engines}"),
            Self::Disaggregated { prefill, decode } => write!(f, "{prefill}p{decode}d"),
        }
    }
}

/// The engines of a graph: one configuration for those that take prompts (aggregated or
/// prefill engines), one for decode engines (of another tensor parallel size, say).
#[derive(Clone, Copy, Debug)]
pub struct GraphEngines<'a> {
    pub prompts: &'a EngineConfig,
    pub decode: &'a EngineConfig,
}

impl<'a> From<&'a EngineConfig> for GraphEngines<'a> {
    /// Every engine alike.
    fn from(config: &'a EngineConfig) -> Self {
        Self {
            prompts: config,
            decode: config,
        }
    }
}

impl GraphEngines<'_> {
    fn of(&self, role: Role) -> &EngineConfig {
        if role == Role::Decode {
            self.decode
        } else {
            self.prompts
        }
    }

    /// GPUs of `topology` built from these engines.
    fn gpus(&self, topology: Topology) -> usize {
        topology
            .roles()
            .into_iter()
            .map(|r| gpus_per_engine(self.of(r)))
            .sum()
    }
}

/// An engine's GPUs: its tensor parallel size on the hardware model, else one.
fn gpus_per_engine(config: &EngineConfig) -> usize {
    match &config.timing {
        TimingModel::Hardware(e) => e.tp as usize,
        _ => 1,
    }
}

/// The link a disaggregated prefill's KV crosses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Each engine's link, GB/s (10^9 bytes/s).
    pub bandwidth_gbps: f64,
    /// Real KV bytes of one block of the model (`KvGeometry::block_bytes`).
    pub block_bytes: u64,
}

impl Link {
    /// Modelled milliseconds to move `bytes` (before the speedup ratio).
    fn ms(&self, bytes: u64) -> f64 {
        bytes as f64 / (self.bandwidth_gbps * 1e6)
    }
}

/// A request between its prefill leg's end and its KV's arrival.
struct Transfer {
    decode: usize,
    request: Request,
    arrival_ms: f64,
    blocks: usize,
}

/// A request whose prefill leg runs (or ended): where it decodes, and what to send there.
struct Leg {
    decode: usize,
    token_ids: Vec<u32>,
    /// The prompt's full-block sequence hashes.
    hashes: Vec<SeqHash>,
    max_tokens: usize,
    arrival_ms: f64,
}

/// The time of the earliest of `events` (keyed by time bits and request), or infinity.
fn first_ms<V>(events: &BTreeMap<(u64, usize), V>) -> f64 {
    events
        .first_key_value()
        .map_or(f64::INFINITY, |(&(t, _), _)| f64::from_bits(t))
}

/// What a simulation leaves: the figures, and the engines for inspection.
pub struct Simulated {
    pub report: ReplayReport,
    pub engines: Vec<Engine>,
    /// Prefill end to KV arrival, per transferred request, in completion order of the
    /// prefills.
    pub transfer_ms: Vec<f64>,
    pub kv_bytes_moved: u64,
}

/// Replays `workload` (request `i` at `arrivals_ms[i]`) over `topology`, engines built
/// from `engines`, routed as `setup` says, KV moving over `link`.
pub fn run<'a>(
    workload: &Workload,
    arrivals_ms: &[f64],
    engines: impl Into<GraphEngines<'a>>,
    topology: Topology,
    setup: RouterSetup,
    link: &Link,
) -> anyhow::Result<Report> {
    let started = Instant::now();
    let engines = engines.into();
    let sim = simulate(workload, arrivals_ms, engines, topology, setup, link)?;
    let mut report = Report::from_replay(
        &topology.to_string(),
        &sim.report,
        started.elapsed().as_secs_f64(),
    );
    let (prefill, decode) = match topology {
        Topology::Aggregated { .. } => (0, 0),
        Topology::Disaggregated { prefill, decode } => (prefill, decode),
    };
    let mut transfer_ms = sim.transfer_ms;
    let gpus = engines.gpus(topology);
    report.disagg = Some(DisaggStats {
        topology: topology.to_string(),
        engines: topology.engines(),
        prefill_engines: prefill,
        decode_engines: decode,
        gpus,
        output_tokens_per_s_per_gpu: report.output_tokens_per_s / gpus as f64,
        transfer_ms: Percentiles::of(&mut transfer_ms),
        kv_bytes_moved: Some(sim.kv_bytes_moved),
        link_bandwidth_gbps: (prefill > 0).then_some(link.bandwidth_gbps),
        prefill_hops: Default::default(),
    });
    Ok(report)
}

/// [`run`]'s simulation, with the engines as they ended.
pub fn simulate<'a>(
    workload: &Workload,
    arrivals_ms: &[f64],
    engines: impl Into<GraphEngines<'a>>,
    topology: Topology,
    setup: RouterSetup,
    link: &Link,
) -> anyhow::Result<Simulated> {
    let configs = engines.into();
    let config = configs.prompts;
    anyhow::ensure!(
        configs.decode.block_size == config.block_size
            && configs.decode.speedup_ratio == config.speedup_ratio,
        "decode engines need the prompt engines' block size and speedup ratio: a transfer \
         moves whole blocks, on one clock"
    );
    anyhow::ensure!(
        workload.conversations().is_none(),
        "topologies are simulated for request workloads (shared prefix, trace), not conversations"
    );
    check_arrivals(workload, arrivals_ms)?;
    anyhow::ensure!(topology.engines() > 0, "a graph needs at least one engine");
    setup.validate()?;
    anyhow::ensure!(
        link.bandwidth_gbps.is_finite() && link.bandwidth_gbps > 0.0,
        "the link bandwidth must be positive"
    );
    let roles = topology.roles();
    let of_role = |r: &[Role]| -> Vec<usize> {
        (0..roles.len())
            .filter(|&k| r.contains(&roles[k]))
            .collect()
    };
    // The index holds what engines that take prompts have cached.
    let indexed = of_role(&[Role::Aggregated, Role::Prefill]).len();
    let router = KvRouter::new(setup, indexed * config.num_gpu_blocks);
    let mut engines = Vec::with_capacity(roles.len());
    for &role in &roles {
        let mut e = Engine::simulated(configs.of(role).clone())?;
        e.set_emit_kv_events(router.reads_kv_events() && role != Role::Decode);
        engines.push(e);
    }
    let mut sim = Graph {
        workload,
        arrivals_ms,
        link,
        speedup: config.speedup_ratio,
        block_size: config.block_size,
        hasher: engines[0].hasher().clone(),
        cluster: SimCluster::new(engines),
        prefill: of_role(&[Role::Prefill]),
        serving: of_role(&[Role::Aggregated, Role::Decode]),
        link_free_ms: vec![0.0; roles.len()],
        roles,
        router,
        collector: Collector::default(),
        rejected: 0,
        next_arrival: 0,
        legs: HashMap::new(),
        ended: BTreeMap::new(),
        transfers: BTreeMap::new(),
        transfer_ms: Vec::new(),
        kv_bytes_moved: 0,
    };
    sim.run()?;
    anyhow::ensure!(
        sim.legs.is_empty(),
        "{} prefill legs never ended",
        sim.legs.len()
    );
    let first_ms = arrivals_ms.first().copied().unwrap_or(0.0);
    let engines = sim.cluster.into_engines();
    let mut report = sim
        .collector
        .report(&engines, workload.len(), sim.rejected, first_ms);
    if !sim.prefill.is_empty() {
        // Prompts are looked up in the prefill engines' caches; a decode engine's
        // lookups find its onboarded blocks, which are no prefix cache hits.
        let (queries, hits) = sim.prefill.iter().fold((0u64, 0u64), |(q, h), &k| {
            let m = engines[k].metrics().counters;
            (q + m.prefix_cache_queries, h + m.prefix_cache_hits)
        });
        report.prefix_cache_hit_rate = if queries > 0 {
            hits as f64 / queries as f64
        } else {
            0.0
        };
    }
    Ok(Simulated {
        report,
        engines,
        transfer_ms: sim.transfer_ms,
        kv_bytes_moved: sim.kv_bytes_moved,
    })
}

/// [`simulate`] as a driver of the simulated cluster: the events are arrivals, prefill
/// legs that ended (each then takes the links, in time order) and KV transfers landing.
struct Graph<'a> {
    cluster: SimCluster,
    workload: &'a Workload,
    arrivals_ms: &'a [f64],
    link: &'a Link,
    speedup: f64,
    block_size: usize,
    hasher: BlockHasher,
    /// Each engine's role, and the engines of each pick.
    roles: Vec<Role>,
    prefill: Vec<usize>,
    /// Aggregated or decode engines.
    serving: Vec<usize>,
    router: KvRouter,
    collector: Collector,
    rejected: usize,
    next_arrival: usize,
    legs: HashMap<usize, Leg>,
    // Events by (time, request index); a non-negative f64's bits sort as the f64 does.
    /// Prefill legs that ended, with their engine.
    ended: BTreeMap<(u64, usize), (usize, Leg)>,
    /// Transfers by the time their KV has arrived.
    transfers: BTreeMap<(u64, usize), Transfer>,
    /// When each engine's link is free again.
    link_free_ms: Vec<f64>,
    transfer_ms: Vec<f64>,
    kv_bytes_moved: u64,
}

impl Graph<'_> {
    /// A prefill leg ended at `now`: its KV crosses to the decode engine.
    fn transfer(&mut self, now: f64) {
        let ((_, i), (p, leg)) = self.ended.pop_first().expect("an ended prefill is due");
        // The prefill lends its prompt's full blocks short of the last token (always
        // computed); those the decode engine does not cache cross the link, as vLLM
        // reads only what it lacks.
        let blocks = leg.token_ids.len().saturating_sub(1) / self.block_size;
        let d = leg.decode;
        let cached = self.cluster.engines()[d].cached_prefix_blocks(&leg.hashes[..blocks]);
        let bytes = (blocks - cached) as u64 * self.link.block_bytes;
        // Each link carries one prompt at a time, in the order prefills end: the prefill
        // engine's sends when it is free, the decode engine's takes it in when it is
        // free; each is busy for the wire time alone (no link sits reserved while the
        // other end is busy).
        let wire = self.link.ms(bytes) / self.speedup;
        let sent = now.max(self.link_free_ms[p]);
        let end = sent.max(self.link_free_ms[d]) + wire;
        if bytes > 0 {
            self.link_free_ms[p] = sent + wire;
            self.link_free_ms[d] = end;
        }
        self.transfer_ms.push(end - now);
        self.kv_bytes_moved += bytes;
        let request = Request {
            id: i as u64,
            token_ids: leg.token_ids,
            max_tokens: leg.max_tokens,
            seed: None,
            pin_ttl: None,
        };
        let t = Transfer {
            decode: d,
            request,
            arrival_ms: leg.arrival_ms,
            blocks,
        };
        self.transfers.insert((end.to_bits(), i), t);
    }

    /// A transfer landed: the decode engine queues the request with its KV onboarded.
    fn land(&mut self) {
        let (_, t) = self.transfers.pop_first().expect("a landing is due");
        let i = t.request.id as usize;
        let engine = self.cluster.engine_mut(t.decode);
        if engine
            .submit_onboarded(t.request, t.arrival_ms, PromptKv::from_prefill(0..t.blocks))
            .is_err()
        {
            self.rejected += 1;
            self.router.finished(decode_leg(i));
            self.router.finished(prefill_leg(i));
        }
    }

    /// Request `i` arrives at `at`: routed as the picker does.
    fn arrive(&mut self, i: usize, at: f64) {
        let item = self.workload.request(i);
        let hashes = self.hasher.seq_hashes(&item.token_ids);
        let (roles, router) = (&self.roles, &mut self.router);
        self.cluster.release(at, |k, o| match roles[k] {
            Role::Aggregated => router.observe(k, &o),
            Role::Prefill => router.observe_kv_events(k, &o.kv_events),
            Role::Decode => {
                for t in o.outputs.iter().filter(|t| t.index == 0) {
                    let i = t.id as usize;
                    router.first_token(decode_leg(i));
                    router.finished(prefill_leg(i));
                }
                for f in &o.finished {
                    router.finished(decode_leg(f.id as usize));
                }
            }
        });
        router.observe_metrics(self.cluster.engines().iter().enumerate());
        let legs = (!self.prefill.is_empty()).then(|| (&self.prefill[..], prefill_leg(i)));
        let (p, d) = router.pick(&self.serving, decode_leg(i), legs, &hashes, at);
        let Some(p) = p else {
            let engine = self.cluster.engine_mut(d);
            if engine.submit_at(item.into_request(i), at).is_err() {
                self.rejected += 1;
                self.router.finished(decode_leg(i));
            }
            return;
        };
        let leg = Request {
            id: i as u64,
            token_ids: item.token_ids.clone(),
            max_tokens: 1,
            seed: None,
            pin_ttl: None,
        };
        if self.cluster.engine_mut(p).submit_at(leg, at).is_err() {
            self.rejected += 1;
            self.router.finished(prefill_leg(i));
            self.router.finished(decode_leg(i));
            return;
        }
        let leg = Leg {
            decode: d,
            token_ids: item.token_ids,
            hashes,
            max_tokens: item.max_tokens,
            arrival_ms: at,
        };
        self.legs.insert(i, leg);
    }
}

impl Driver for Graph<'_> {
    type Shown = StepOutcome;
    type Error = anyhow::Error;

    fn cluster(&mut self) -> &mut SimCluster {
        &mut self.cluster
    }

    fn next_event_ms(&self) -> Option<f64> {
        let arrival = self.arrivals_ms.get(self.next_arrival);
        let arrival = arrival.copied().unwrap_or(f64::INFINITY);
        Some(
            arrival
                .min(first_ms(&self.ended))
                .min(first_ms(&self.transfers)),
        )
    }

    fn stepped(&mut self, k: usize, o: StepOutcome) -> anyhow::Result<StepOutcome> {
        match self.roles[k] {
            Role::Aggregated | Role::Decode => self.collector.take(&o),
            // A prefill that ends is a new event.
            Role::Prefill => {
                for f in &o.finished {
                    let i = f.id as usize;
                    let leg = self.legs.remove(&i).expect("a prefill leg of ours");
                    self.ended.insert((f.finished_ms.to_bits(), i), (k, leg));
                }
            }
        }
        Ok(o)
    }

    /// At equal times a prefill's end, then a landing, then an arrival.
    fn event(&mut self, now: f64) -> anyhow::Result<()> {
        if first_ms(&self.ended) == now {
            self.transfer(now);
        } else if first_ms(&self.transfers) == now {
            self.land();
        } else {
            self.next_arrival += 1;
            self.arrive(self.next_arrival - 1, now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use dynamo_kvcache::{ApproxConfig, RouterMode, SchedulerConfig};
    use dynamo_loadgen::arrivals;
    use dynamo_loadgen::workload::SharedPrefix;
    use dynamo_mocker::TimingModel;
    use dynamo_mocker::replay::TraceRecord;

    use super::*;

    /// Qwen2.5-0.5B's KV of a 16-token block: 24 layers x 2 KV heads x 64 x bf16, K and V.
    const BLOCK_BYTES: u64 = 2 * 24 * 2 * 64 * 2 * 16;

    fn engine() -> EngineConfig {
        EngineConfig {
            num_gpu_blocks: 16384,
            block_size: 16,
            ..EngineConfig::default()
        }
    }

    fn setup(mode: RouterMode) -> RouterSetup {
        RouterSetup {
            mode,
            scheduler: SchedulerConfig::default(),
            approx: ApproxConfig::default(),
            seed: 3,
        }
    }

    fn link(gbps: f64) -> Link {
        Link {
            bandwidth_gbps: gbps,
            block_bytes: BLOCK_BYTES,
        }
    }

    /// `n` prompts of `isl` tokens that share nothing, `osl` tokens out.
    fn unique(n: usize, isl: usize, osl: usize) -> Workload {
        Workload::shared_prefix(SharedPrefix {
            prefixes: n,
            suffixes: 1,
            prefix_tokens: 0,
            unique_tokens: isl,
            output_tokens: osl,
            seed: 1,
        })
        .unwrap()
    }

    fn topo(s: &str) -> Topology {
        Topology::parse(s).unwrap()
    }

    #[test]
    fn topologies_parse_and_print() {
        assert_eq!(topo("agg:4"), Topology::Aggregated { engines: 4 });
        assert_eq!(topo("AGG4"), Topology::Aggregated { engines: 4 });
        assert_eq!(
            topo("1p3d"),
            Topology::Disaggregated {
                prefill: 1,
                decode: 3
            }
        );
        assert_eq!(topo(" 12P4D ").to_string(), "12p4d");
        assert_eq!(topo("agg4").to_string(), "agg:4");
        assert_eq!(topo("2p2d").engines(), 4);
        for bad in [
            "", "agg", "agg:0", "0p1d", "1p0d", "p1d", "1pd", "1p2", "2d1p", "x",
        ] {
            assert!(Topology::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn one_request_ttft_is_prefill_plus_transfer_plus_the_first_decode_step() {
        // 1,000 prompt tokens: 62 full blocks of 16 cross the link; the decode engine
        // computes the last prompt token as a decode token and samples the first token
        // in one step, its 63 blocks in use.
        let w = unique(1, 1000, 3);
        let t = TimingModel::Polynomial;
        let wire = 62.0 * BLOCK_BYTES as f64 / 1e9 * 1000.0; // ms at 1 GB/s
        let sim = simulate(
            &w,
            &[5.0],
            &engine(),
            topo("1p1d"),
            setup(RouterMode::Kv),
            &link(1.0),
        )
        .unwrap();
        let r = &sim.report;
        assert_eq!((r.completed, r.rejected, r.output_tokens), (1, 0, 3));
        assert_eq!(sim.kv_bytes_moved, 62 * BLOCK_BYTES);
        assert_eq!(sim.transfer_ms.len(), 1);
        assert!(
            (sim.transfer_ms[0] - wire).abs() < 1e-9,
            "{:?}",
            sim.transfer_ms
        );
        let ttft = t.prefill_ms(1000) + wire + t.decode_ms(1, 63.0 / 16384.0);
        assert!(
            (r.ttft_ms.p50 - ttft).abs() < 1e-9,
            "{} vs {ttft}",
            r.ttft_ms.p50
        );
        assert_eq!(r.itl_ms.count, 2);
        // The prefill engine sampled one token, the decode engine prefilled nothing.
        let (p, d) = (
            sim.engines[0].metrics().counters,
            sim.engines[1].metrics().counters,
        );
        assert_eq!((p.prefill_tokens, p.generation_tokens), (1000, 1));
        assert_eq!((d.prefill_tokens, d.generation_tokens), (0, 3));
        // 10x the bandwidth: the transfer takes a tenth; aggregated: no transfer at all.
        let fast = simulate(
            &w,
            &[5.0],
            &engine(),
            topo("1p1d"),
            setup(RouterMode::Kv),
            &link(10.0),
        )
        .unwrap();
        assert!((fast.transfer_ms[0] - wire / 10.0).abs() < 1e-9);
        assert!((r.ttft_ms.p50 - fast.report.ttft_ms.p50 - 0.9 * wire).abs() < 1e-9);
        let agg = simulate(
            &w,
            &[5.0],
            &engine(),
            topo("agg:1"),
            setup(RouterMode::Kv),
            &link(1.0),
        )
        .unwrap();
        assert_eq!(agg.report.ttft_ms.p50, t.prefill_ms(1000));
        assert!(agg.transfer_ms.is_empty() && agg.kv_bytes_moved == 0);
    }

    #[test]
    fn an_engines_link_carries_one_prompt_at_a_time() {
        // Two prompts prefilled in the same step on the one prefill engine: the second
        // transfer waits for the first, whichever decode engine each goes to.
        let w = unique(2, 1000, 2);
        let wire = 62.0 * BLOCK_BYTES as f64 / 1e6;
        for t in ["1p1d", "1p2d"] {
            let sim = simulate(
                &w,
                &[0.0, 0.0],
                &engine(),
                topo(t),
                setup(RouterMode::Kv),
                &link(1.0),
            )
            .unwrap();
            let mut ms = sim.transfer_ms.clone();
            ms.sort_by(f64::total_cmp);
            assert!(
                (ms[0] - wire).abs() < 1e-9 && (ms[1] - 2.0 * wire).abs() < 1e-9,
                "{t}: {ms:?}"
            );
            assert_eq!(sim.report.completed, 2);
        }
    }

    #[test]
    fn links_are_taken_in_the_order_prefills_end() {
        // A long and a short prompt at once on two prefill engines (round-robin: the long
        // one on the engine the simulation steps first), one decode engine: the short
        // prefill ends first and its KV crosses at once; the link is free again by the
        // time the long one ends.
        let record = |isl| TraceRecord {
            timestamp: 0.0,
            input_length: isl,
            output_length: 2,
            hash_ids: Vec::new(),
        };
        let w = Workload::Trace {
            records: vec![record(4000), record(500)],
        };
        let sim = simulate(
            &w,
            &[0.0, 0.0],
            &engine(),
            topo("2p1d"),
            setup(RouterMode::RoundRobin),
            &link(1.0),
        )
        .unwrap();
        let wire = |blocks: f64| blocks * BLOCK_BYTES as f64 / 1e6;
        let mut ms = sim.transfer_ms.clone();
        ms.sort_by(f64::total_cmp);
        assert!(
            (ms[0] - wire(31.0)).abs() < 1e-9 && (ms[1] - wire(249.0)).abs() < 1e-9,
            "{ms:?}"
        );
        let (p0, p1) = (
            sim.engines[0].metrics().counters,
            sim.engines[1].metrics().counters,
        );
        assert_eq!((p0.prefill_tokens, p1.prefill_tokens), (4000, 500));
    }

    #[test]
    fn blocks_the_decode_engine_holds_do_not_move() {
        // The same 62-block prefix twice, a second apart: the second prompt's prefix is
        // cached on both engines, so only its prefill's tail is computed, and nothing
        // crosses the link.
        let w = Workload::shared_prefix(SharedPrefix {
            prefixes: 1,
            suffixes: 2,
            prefix_tokens: 992,
            unique_tokens: 8,
            output_tokens: 2,
            seed: 1,
        })
        .unwrap();
        let sim = simulate(
            &w,
            &[0.0, 1000.0],
            &engine(),
            topo("1p1d"),
            setup(RouterMode::Kv),
            &link(1.0),
        )
        .unwrap();
        assert_eq!(sim.kv_bytes_moved, 62 * BLOCK_BYTES);
        let wire = 62.0 * BLOCK_BYTES as f64 / 1e6;
        assert!((sim.transfer_ms[0] - wire).abs() < 1e-9 && sim.transfer_ms[1] == 0.0);
        let p = sim.engines[0].metrics().counters;
        assert_eq!(p.prefill_tokens, 1000 + 8);
        assert_eq!(p.prefix_cache_hits, 992);
        assert_eq!(sim.report.prefix_cache_hit_rate, 992.0 / 2000.0);
    }

    #[test]
    fn decode_engines_never_prefill_prompts_and_prefill_engines_never_decode() {
        let n = 40;
        let w = unique(n, 1000, 20);
        let at = arrivals::poisson(n, 20.0, 2);
        for mode in [RouterMode::Kv, RouterMode::RoundRobin] {
            let sim = simulate(&w, &at, &engine(), topo("1p3d"), setup(mode), &link(50.0)).unwrap();
            let r = &sim.report;
            assert_eq!(
                (r.completed, r.rejected, r.preemptions),
                (n, 0, 0),
                "{mode}"
            );
            assert_eq!(r.output_tokens, n as u64 * 20);
            assert_eq!(sim.transfer_ms.len(), n);
            assert_eq!(sim.kv_bytes_moved, (n * 62) as u64 * BLOCK_BYTES);
            let p = sim.engines[0].metrics().counters;
            assert_eq!(p.prefill_tokens, n as u64 * 1000, "{mode}");
            assert_eq!(p.generation_tokens, n as u64, "one token per prefill leg");
            let decode: Vec<_> = sim.engines[1..]
                .iter()
                .map(|e| e.metrics().counters)
                .collect();
            // A decode computes no prompt token as a prefill: the last one is a decode.
            let prefilled: u64 = decode.iter().map(|c| c.prefill_tokens).sum();
            assert_eq!(prefilled, 0, "{mode}");
            let out: u64 = decode.iter().map(|c| c.generation_tokens).sum();
            assert_eq!(out, n as u64 * 20);
            // Every decode engine got work.
            assert!(
                decode.iter().all(|c| c.requests_finished > 0),
                "{mode}: {decode:?}"
            );
        }
    }

    fn without_wall_time(mut r: Report) -> Report {
        r.replay.as_mut().unwrap().wall_s = 0.0;
        r
    }

    #[test]
    fn an_aggregated_graph_is_the_plain_replay() {
        // Evictions, cache hits and loads all matter to the picks.
        let (w, at, engine) = crate::replay::tests::small_pressure();
        for mode in RouterMode::ALL {
            let plain = crate::replay::run(&w, &at, &engine, 4, setup(mode)).unwrap();
            let mut agg = run(&w, &at, &engine, topo("agg:4"), setup(mode), &link(50.0)).unwrap();
            let stats = agg.disagg.take().unwrap();
            agg.label = plain.label.clone();
            assert_eq!(without_wall_time(agg), without_wall_time(plain), "{mode}");
            assert_eq!(
                (stats.engines, stats.prefill_engines, stats.decode_engines),
                (4, 0, 0)
            );
            assert_eq!(
                (stats.transfer_ms.count, stats.kv_bytes_moved),
                (0, Some(0))
            );
            assert_eq!(stats.link_bandwidth_gbps, None);
        }
    }

    #[test]
    fn prefills_stall_aggregated_token_streams_and_not_disaggregated_ones() {
        // Long prompts arriving while others decode: an aggregated engine puts each
        // prefill into the step its decoding requests wait for; a decode engine only
        // ever computes a prompt's last partial block.
        let n = 60;
        let w = unique(n, 3000, 50);
        let at = arrivals::poisson(n, 8.0, 4);
        let kv = setup(RouterMode::Kv);
        let agg = run(&w, &at, &engine(), topo("agg:2"), kv, &link(50.0)).unwrap();
        let dis = run(&w, &at, &engine(), topo("1p1d"), kv, &link(50.0)).unwrap();
        let t = TimingModel::Polynomial;
        assert!(agg.itl_ms.p99 > t.prefill_ms(3000), "{agg:?}");
        assert!(dis.itl_ms.p99 < t.prefill_ms(3000) / 2.0, "{dis:?}");
        // Fewer engines prefill, and every prompt crosses the link: the first token
        // comes later.
        assert!(dis.ttft_ms.p50 > agg.ttft_ms.p50, "{agg:?}\n{dis:?}");
        let s = dis.disagg.as_ref().unwrap();
        assert_eq!((s.prefill_engines, s.decode_engines, s.engines), (1, 1, 2));
        assert!(s.transfer_ms.p50 > 0.0 && s.link_bandwidth_gbps == Some(50.0));
        // Off the hardware model an engine is one GPU.
        assert_eq!(s.gpus, 2);
        assert!((s.output_tokens_per_s_per_gpu * 2.0 - dis.output_tokens_per_s).abs() < 1e-9);
        // The same seed, the same figures.
        let again = run(&w, &at, &engine(), topo("1p1d"), kv, &link(50.0)).unwrap();
        assert_eq!(without_wall_time(again), without_wall_time(dis));
    }

    #[test]
    fn decode_engines_may_span_other_gpus_and_throughput_is_per_gpu() {
        // Llama-3.1-8B on H100s: TP1 prompt engines, TP2 decode engines.
        let on = |tp| {
            let model = dynamo_perfmodel::ModelArch::by_name("meta-llama/Llama-3.1-8B-Instruct");
            let gpu = dynamo_perfmodel::GpuSpec::by_name("H100_SXM");
            let e = dynamo_perfmodel::Estimator::new(gpu.unwrap(), model.unwrap(), tp).unwrap();
            engine().on_hardware(e, None).unwrap().0
        };
        let (tp1, tp2) = (on(1), on(2));
        let engines = GraphEngines {
            prompts: &tp1,
            decode: &tp2,
        };
        let n = 40;
        let w = unique(n, 2000, 40);
        let at = arrivals::poisson(n, 4.0, 2);
        let kv = setup(RouterMode::Kv);
        let wide = run(&w, &at, engines, topo("2p1d"), kv, &link(50.0)).unwrap();
        let narrow = run(&w, &at, &tp1, topo("2p1d"), kv, &link(50.0)).unwrap();
        let (dw, dn) = (wide.disagg.clone().unwrap(), narrow.disagg.clone().unwrap());
        assert_eq!((dw.engines, dw.gpus, dn.gpus), (3, 4, 3));
        assert!((dw.output_tokens_per_s_per_gpu * 4.0 - wide.output_tokens_per_s).abs() < 1e-9);
        // The TP2 decode engine reads half the weights per GPU a step: faster tokens.
        assert!(wide.itl_ms.p50 < narrow.itl_ms.p50, "{wide:?}\n{narrow:?}");
        // The prefill legs ran on the same TP1 engines.
        assert_eq!(wide.completed, narrow.completed);
        // Engines whose blocks differ cannot hand KV to each other.
        let other = EngineConfig {
            block_size: 32,
            ..tp2.clone()
        };
        let mismatched = GraphEngines {
            prompts: &tp1,
            decode: &other,
        };
        assert!(simulate(&w, &at, mismatched, topo("2p1d"), kv, &link(50.0)).is_err());
    }

    #[test]
    fn bad_inputs_are_refused() {
        let w = unique(2, 100, 2);
        let kv = setup(RouterMode::Kv);
        assert!(simulate(&w, &[0.0], &engine(), topo("1p1d"), kv, &link(50.0)).is_err());
        assert!(simulate(&w, &[5.0, 1.0], &engine(), topo("1p1d"), kv, &link(50.0)).is_err());
        assert!(simulate(&w, &[0.0, 1.0], &engine(), topo("1p1d"), kv, &link(0.0)).is_err());
        // A prompt no engine can hold is refused, and counted, in either graph.
        let long = unique(1, 16384 * 16 + 1, 1);
        for t in ["agg:1", "1p1d"] {
            let r = simulate(&long, &[0.0], &engine(), topo(t), kv, &link(50.0)).unwrap();
            assert_eq!((r.report.rejected, r.report.completed), (1, 0), "{t}");
        }
    }
}
