//! The candidates, their predictions and the choice among them.
//!
//! - Tensor parallel sizes: the divisors of the GPUs per node (an engine stays inside one
//!   NVLink domain) that divide the model's attention heads (and go with its KV heads, as
//!   vLLM requires) and hold the weights plus the KV of one request of ISL + OSL tokens.
//! - Layouts within the GPU budget: aggregated, `n` engines of TP `t`; disaggregated, `p`
//!   prefill engines of TP `tp` and `d` decode engines of TP `td`.
//! - Step budgets: each layout is predicted with its engines that prefill (aggregated or
//!   prefill engines) at every step budget of [`chunk_sizes`] and keeps the one
//!   [`tuned`] picks: the engine's default unless a smaller budget meets the SLA where it
//!   does not, or serves more. Decode engines keep the default (they compute one token of
//!   each prompt).
//! - Predictions: each role's engine is simulated under its share of the load
//!   ([`crate::sim`]), once per (role, TP, step budget, share) and reused by every
//!   layout that has it. A request rate is split round-robin over the engines of each
//!   role. A concurrency is split over an aggregated layout's engines as evenly as it
//!   goes (some hold one more);
//!   a disaggregated layout's decode engines hold it all (what is in prefill or in
//!   transfer is counted as decoding: pessimistic on both ITL and TTFT), and its prefill
//!   engines see the rate the decode engines complete. A disaggregated TTFT is the
//!   prefill engine's (queueing included) plus the KV transfer across the network (the
//!   slower side's shard over one GPU's NIC) plus the decode engine's wait for its first
//!   step.
//! - Throughput per GPU: output tokens per second of the whole layout over its GPUs (a
//!   rate that is kept up with is served as offered).
//! - Choice among the layouts that meet the SLA (means of TTFT and ITL, or of the
//!   end-to-end time): the fewest GPUs (then the most throughput per GPU); with
//!   `optimizationType: throughput` the most throughput per GPU; with `latency` the
//!   lowest mean end-to-end time. Ties go to the lower end-to-end time, then to fewer
//!   GPUs, then to the aggregated layout.
//! - Pareto set: the layouts no other beats on throughput per GPU and each latency target.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

use dynamo_crds::dgdr::OptimizationType;
use dynamo_mocker::{EngineConfig, TimingModel};
use dynamo_perfmodel::{DoesNotFit, Estimator, InvalidParallelism, Link, Uncertainty};
use serde::Serialize;

use crate::request::{Load, Request, Sla};
use crate::sim::{Drive, EngineRun, SimError, Stage, full_batch, simulate};

/// An engine offered more than this share of its saturated throughput is overloaded: its
/// queue grows without bound, or so near it that a short run cannot tell.
pub const MAX_UTILIZATION: f64 = 0.95;

/// The seed of every simulation: the same arrivals for every candidate, so they differ
/// by what they are, not by the draw.
pub(crate) const SEED: u64 = 17;

/// Step budgets below the engine's default that the sweep tries, down to 256 tokens,
/// about where a step of a 70B model's chunk stops being compute-bound on an H100
/// (docs/performance-disagg.md, "On the hardware model"), and no fewer than the
/// sequences a step may hold (vLLM refuses a budget under `max_num_seqs`).
const SMALLER_CHUNKS: [u32; 3] = [2048, 512, 256];

/// The step budgets (`max_num_batched_tokens`) swept for engines that prefill: the
/// default ([`default_chunk`]), then each smaller one of [`SMALLER_CHUNKS`]. A smaller
/// budget prefills a long prompt in more, shorter steps, so the decodes that share them
/// wait less: a lower ITL for a longer TTFT.
fn chunk_sizes() -> Vec<u32> {
    let default = default_chunk();
    let smaller = SMALLER_CHUNKS.into_iter().filter(|&c| c < default);
    std::iter::once(default).chain(smaller).collect()
}

/// The step budget of an engine that names none (`EngineConfig`'s, vLLM's): the
/// generated graph names only the others.
pub fn default_chunk() -> u32 {
    EngineConfig::default().max_num_batched_tokens as u32
}

/// Engines of one role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Engines {
    /// Tensor parallel size: GPUs per engine.
    pub tp: u32,
    pub replicas: u32,
    /// Token budget of one step (vLLM `--max-num-batched-tokens`): a longer prompt is
    /// prefilled in chunks of it.
    pub max_num_batched_tokens: u32,
}

impl Engines {
    /// `replicas` engines of `tp` GPUs at the default step budget.
    pub fn new(tp: u32, replicas: u32) -> Self {
        Self {
            tp,
            replicas,
            max_num_batched_tokens: default_chunk(),
        }
    }

    pub fn gpus(&self) -> u32 {
        self.tp * self.replicas
    }

    /// The configuration these engines run: the sweep's for their TP and step budget.
    pub(crate) fn shape(&self) -> Shape {
        (self.tp, self.max_num_batched_tokens)
    }
}

/// An engine's tensor parallel size and step budget: what its configuration is keyed by.
pub(crate) type Shape = (u32, u32);

/// How a candidate graph serves: every engine both prefills and decodes, or prefill and
/// decode engines apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Layout {
    Aggregated { workers: Engines },
    Disaggregated { prefill: Engines, decode: Engines },
}

impl Layout {
    pub fn gpus(&self) -> u32 {
        match self {
            Self::Aggregated { workers } => workers.gpus(),
            Self::Disaggregated { prefill, decode } => prefill.gpus() + decode.gpus(),
        }
    }

    /// The engines that prefill: an aggregated layout's workers, a disaggregated one's
    /// prefill engines.
    fn prefilling(&mut self) -> &mut Engines {
        match self {
            Self::Aggregated { workers } => workers,
            Self::Disaggregated { prefill, .. } => prefill,
        }
    }
}

impl fmt::Display for Layout {
    /// The step budget is named where it is not the engines' default.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let chunks = |e: &Engines| {
            if e.max_num_batched_tokens == default_chunk() {
                String::new()
            } else {
                format!(" with {}-token chunks", e.max_num_batched_tokens)
            }
        };
        match self {
            Self::Aggregated { workers: w } => {
                write!(f, "agg {} x TP{}{}", w.replicas, w.tp, chunks(w))
            }
            Self::Disaggregated {
                prefill: p,
                decode: d,
            } => write!(
                f,
                "disagg {} x TP{} prefill{} + {} x TP{} decode",
                p.replicas,
                p.tp,
                chunks(p),
                d.replicas,
                d.tp
            ),
        }
    }
}

/// A layout and what the simulation predicts for it (means over the measured requests).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    pub layout: Layout,
    pub gpus: u32,
    pub ttft_ms: f64,
    pub itl_ms: f64,
    pub e2e_ms: f64,
    /// Requests per second the layout serves.
    pub requests_per_s: f64,
    /// Output tokens per second per GPU.
    pub throughput_per_gpu: f64,
    /// Some engine cannot keep up with its share of the load.
    pub overloaded: bool,
    pub meets_sla: bool,
}

impl Candidate {
    /// How far it is from the SLA: the largest of achieved / target over the targets
    /// (at most 1 when it meets them), the predictions taken at their bounds under `u`;
    /// infinite when overloaded.
    pub fn shortfall(&self, sla: &Sla, u: &Uncertainty) -> f64 {
        if self.overloaded {
            return f64::INFINITY;
        }
        match *sla {
            Sla::TtftItl { ttft_ms, itl_ms } => {
                (self.bound_ttft_ms(u) / ttft_ms).max(self.bound_itl_ms(u) / itl_ms)
            }
            Sla::E2e { e2e_ms } => self.bound_e2e_ms(u) / e2e_ms,
        }
    }

    /// The most a real engine's TTFT may be, by `u`.
    pub fn bound_ttft_ms(&self, u: &Uncertainty) -> f64 {
        u.ttft_ms(self.ttft_ms, self.itl_ms)
    }

    pub fn bound_itl_ms(&self, u: &Uncertainty) -> f64 {
        u.itl_ms(self.itl_ms)
    }

    pub fn bound_e2e_ms(&self, u: &Uncertainty) -> f64 {
        u.e2e_ms(self.ttft_ms, self.itl_ms, self.e2e_ms)
    }
}

/// Why no candidate can be evaluated or chosen.
#[derive(Debug)]
pub(crate) enum SweepError {
    /// No tensor parallel size fits: the reason at the largest one tried.
    NoFit(DoesNotFit),
    NoParallelism(InvalidParallelism),
    Engine(SimError),
}

/// The tensor parallel sizes worth sweeping (those that hold a request at the default
/// step budget), each at every step budget of [`chunk_sizes`] that fits, with its
/// engine configuration: the mock engine's defaults, whose step budget is
/// [`default_chunk`] and whose batch the generated graph names beside a smaller one (the
/// KV pool is what the GPUs hold after the weights and a step's activations at that
/// budget).
pub(crate) fn engine_configs(req: &Request) -> Result<BTreeMap<Shape, EngineConfig>, SweepError> {
    let mut configs = BTreeMap::new();
    let mut last_no_fit = None;
    let mut last_invalid = None;
    let sizes = (1..=req.gpus_per_node.min(req.total_gpus))
        .filter(|t| req.gpus_per_node.is_multiple_of(*t));
    for tp in sizes {
        let mut e = match Estimator::new(req.gpu.clone(), req.model.clone(), u64::from(tp)) {
            Ok(e) => e,
            Err(invalid) => {
                last_invalid = Some(invalid);
                continue;
            }
        };
        if let Some(share) = req.gpu_memory_utilization {
            e.gpu_memory_utilization = share;
        }
        e.efficiency = req.efficiency.clone();
        let tokens = u64::from(req.isl) + u64::from(req.osl);
        for chunk in chunk_sizes() {
            let budgeted = EngineConfig {
                max_num_batched_tokens: chunk as usize,
                ..EngineConfig::default()
            };
            let fitted = budgeted
                .on_hardware(e.clone(), None)
                .and_then(|(config, _)| estimator(&config).fits(tokens, 1).map(|_| config));
            match fitted {
                Ok(config) => {
                    configs.insert((tp, chunk), config);
                }
                Err(no_fit) if chunk == default_chunk() => {
                    last_no_fit = Some(no_fit);
                    break;
                }
                // A smaller step's activations take less memory: not reached while the
                // default fits, and harmless to skip.
                Err(_) => {}
            }
        }
    }
    if configs.is_empty() {
        return Err(match (last_no_fit, last_invalid) {
            (Some(no_fit), _) => SweepError::NoFit(no_fit),
            (None, Some(invalid)) => SweepError::NoParallelism(invalid),
            (None, None) => unreachable!("TP 1 is always tried"),
        });
    }
    Ok(configs)
}

/// The hardware model an engine configuration from [`engine_configs`] runs on.
pub(crate) fn estimator(config: &EngineConfig) -> &Estimator {
    match &config.timing {
        TimingModel::Hardware(e) => e,
        _ => unreachable!("the profiler's engines run on the hardware model"),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum DriveKey {
    Open { rate_bits: u64, engines: u32 },
    Closed(u32),
}

/// Every candidate of `req`, predicted.
pub(crate) struct Sweep<'r> {
    req: &'r Request,
    configs: &'r BTreeMap<Shape, EngineConfig>,
    runs: HashMap<(Stage, Shape, DriveKey), EngineRun>,
    /// Saturated requests/s of one engine, by stage and shape.
    capacity: HashMap<(Stage, Shape), f64>,
}

impl<'r> Sweep<'r> {
    pub fn new(req: &'r Request, configs: &'r BTreeMap<Shape, EngineConfig>) -> Self {
        Self {
            req,
            configs,
            runs: HashMap::new(),
            capacity: HashMap::new(),
        }
    }

    /// Engine runs simulated so far.
    pub fn simulations(&self) -> usize {
        self.runs.len() + self.capacity.len()
    }

    /// Requests/s one engine of `stage` and `shape` completes when it runs full.
    fn capacity(&mut self, stage: Stage, shape: Shape) -> Result<f64, SweepError> {
        if let Some(c) = self.capacity.get(&(stage, shape)) {
            return Ok(*c);
        }
        let (isl, osl) = (self.req.isl as usize, self.req.osl as usize);
        let config = &self.configs[&shape];
        let in_flight = full_batch(config, stage, isl, osl);
        let run = simulate(config, stage, Drive::Closed { in_flight }, isl, osl, SEED)
            .map_err(SweepError::Engine)?;
        self.capacity.insert((stage, shape), run.requests_per_s);
        Ok(run.requests_per_s)
    }

    fn run(&mut self, stage: Stage, shape: Shape, drive: Drive) -> Result<EngineRun, SweepError> {
        let key = match drive {
            Drive::Open {
                rate_per_s,
                engines,
            } => DriveKey::Open {
                rate_bits: rate_per_s.to_bits(),
                engines,
            },
            Drive::Closed { in_flight } => DriveKey::Closed(in_flight),
        };
        if let Some(run) = self.runs.get(&(stage, shape, key)) {
            return Ok(*run);
        }
        let (isl, osl) = (self.req.isl as usize, self.req.osl as usize);
        let run = simulate(&self.configs[&shape], stage, drive, isl, osl, SEED)
            .map_err(SweepError::Engine)?;
        self.runs.insert((stage, shape, key), run);
        Ok(run)
    }

    /// The tensor parallel sizes swept.
    fn tps(&self) -> Vec<u32> {
        let mut tps: Vec<u32> = self.configs.keys().map(|&(tp, _)| tp).collect();
        tps.dedup();
        tps
    }

    /// The step budgets swept at `tp`, the default (the largest) first.
    fn chunks(&self, tp: u32) -> Vec<u32> {
        let mut chunks: Vec<u32> = self
            .configs
            .keys()
            .filter(|&&(t, _)| t == tp)
            .map(|&(_, c)| c)
            .collect();
        chunks.sort_unstable_by(|a, b| b.cmp(a));
        chunks
    }

    /// The layouts within the GPU budget for `load`, aggregated first, each by GPUs, at
    /// the default step budget; without a load, one engine of each role.
    pub fn layouts(&self, load: Option<Load>) -> Vec<Layout> {
        let total = self.req.total_gpus;
        let Some(load) = load else {
            return self.unit_layouts();
        };
        let tps = self.tps();
        let mut out = Vec::new();
        for &tp in &tps {
            for replicas in 1..=total / tp {
                out.push(Layout::Aggregated {
                    workers: Engines::new(tp, replicas),
                });
            }
        }
        for &tp in &tps {
            for p in 1..=total / tp {
                let left = total - p * tp;
                for &td in &tps {
                    for d in 1..=left / td {
                        out.push(Layout::Disaggregated {
                            prefill: Engines::new(tp, p),
                            decode: Engines::new(td, d),
                        });
                    }
                }
            }
        }
        if let Load::Concurrency(c) = load {
            // An engine beyond one per request in flight would idle.
            out.retain(|l| match l {
                Layout::Aggregated { workers } => workers.replicas <= c,
                Layout::Disaggregated { prefill, decode } => {
                    prefill.replicas <= c && decode.replicas <= c
                }
            });
        }
        out
    }

    /// One aggregated engine, or one prefill and one decode engine, of every TP within
    /// the budget.
    fn unit_layouts(&self) -> Vec<Layout> {
        let total = self.req.total_gpus;
        let tps = self.tps();
        let aggregated = tps.iter().map(|&tp| Layout::Aggregated {
            workers: Engines::new(tp, 1),
        });
        let disaggregated = tps.iter().flat_map(|&tp| {
            tps.iter()
                .filter(move |&&td| tp + td <= total)
                .map(move |&td| Layout::Disaggregated {
                    prefill: Engines::new(tp, 1),
                    decode: Engines::new(td, 1),
                })
        });
        aggregated.chain(disaggregated).collect()
    }

    /// `layout` with its engines that prefill at each step budget swept, the default
    /// first.
    pub fn chunk_variants(&self, layout: Layout) -> Vec<Layout> {
        let mut layout = layout;
        let tp = layout.prefilling().tp;
        self.chunks(tp)
            .into_iter()
            .map(|chunk| {
                layout.prefilling().max_num_batched_tokens = chunk;
                layout
            })
            .collect()
    }

    /// `layout` at the most requests in flight it serves within the SLA, and that load:
    /// a binary search up to a full batch of its (decode) engines, latency growing with
    /// the load. When even one request misses the SLA, the prediction at one.
    pub fn most_within_sla(&mut self, layout: Layout) -> Result<(Candidate, Load), SweepError> {
        let (stage, engines) = match layout {
            Layout::Aggregated { workers } => (Stage::Aggregated, workers),
            Layout::Disaggregated { decode, .. } => (Stage::Decode, decode),
        };
        let (isl, osl) = (self.req.isl as usize, self.req.osl as usize);
        let full = full_batch(&self.configs[&engines.shape()], stage, isl, osl) * engines.replicas;
        let mut at = |c: u32| -> Result<Candidate, SweepError> {
            self.evaluate(layout, Load::Concurrency(c))
        };
        let mut best = (at(1)?, 1);
        if !best.0.meets_sla {
            return Ok((best.0, Load::Concurrency(1)));
        }
        // Invariant: `lo` meets the SLA, anything above `hi` does not.
        let (mut lo, mut hi) = (1, full.max(1));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            let candidate = at(mid)?;
            if candidate.meets_sla {
                (lo, best) = (mid, (candidate, mid));
            } else {
                hi = mid - 1;
            }
        }
        Ok((best.0, Load::Concurrency(best.1)))
    }

    /// Predicts `layout` under `load`.
    pub fn evaluate(&mut self, layout: Layout, load: Load) -> Result<Candidate, SweepError> {
        let req = self.req;
        let osl = f64::from(req.osl);
        let gpus = layout.gpus();
        let (ttft, itl, e2e, rps, overloaded) = match (layout, load) {
            (Layout::Aggregated { workers: w }, Load::Rate(rate)) => {
                let r = self.open(Stage::Aggregated, w.shape(), rate, w.replicas)?;
                let served = if r.overloaded {
                    r.requests_per_s * f64::from(w.replicas)
                } else {
                    rate
                };
                (r.ttft_ms, r.itl_ms, r.e2e_ms, served, r.overloaded)
            }
            (Layout::Aggregated { workers: w }, Load::Concurrency(c)) => {
                let s = self.closed_split(Stage::Aggregated, w, c)?;
                (s.ttft_ms, s.itl_ms, s.e2e_ms, s.requests_per_s, false)
            }
            (
                Layout::Disaggregated {
                    prefill: p,
                    decode: d,
                },
                load,
            ) => {
                let (dec, rate) = match load {
                    Load::Rate(rate) => {
                        let r = self.open(Stage::Decode, d.shape(), rate, d.replicas)?;
                        (r, rate)
                    }
                    Load::Concurrency(c) => {
                        let s = self.closed_split(Stage::Decode, d, c)?;
                        (s, s.requests_per_s)
                    }
                };
                let pre = self.open(Stage::Prefill, p.shape(), rate, p.replicas)?;
                let transfer = self.transfer_ms(p.shape(), d.shape());
                let overloaded = pre.overloaded || dec.overloaded;
                let served = if overloaded {
                    let by_prefill = pre.requests_per_s * f64::from(p.replicas);
                    let by_decode = dec.requests_per_s * f64::from(d.replicas);
                    by_prefill.min(by_decode).min(rate)
                } else {
                    rate
                };
                let ttft = pre.ttft_ms + transfer + dec.ttft_ms;
                let e2e = pre.ttft_ms + transfer + dec.e2e_ms;
                (ttft, dec.itl_ms, e2e, served, overloaded)
            }
        };
        let mut candidate = Candidate {
            layout,
            gpus,
            ttft_ms: ttft,
            itl_ms: itl,
            e2e_ms: e2e,
            requests_per_s: rps,
            throughput_per_gpu: rps * osl / f64::from(gpus),
            overloaded,
            meets_sla: false,
        };
        candidate.meets_sla = candidate.shortfall(&req.sla, &req.uncertainty) <= 1.0;
        Ok(candidate)
    }

    /// One of `engines` engines under its round-robin share of `rate`; overloaded
    /// without simulating past [`MAX_UTILIZATION`] of its capacity.
    fn open(
        &mut self,
        stage: Stage,
        shape: Shape,
        rate: f64,
        engines: u32,
    ) -> Result<EngineRun, SweepError> {
        let capacity = self.capacity(stage, shape)?;
        if rate / f64::from(engines) > MAX_UTILIZATION * capacity {
            return Ok(EngineRun {
                ttft_ms: f64::INFINITY,
                itl_ms: f64::INFINITY,
                e2e_ms: f64::INFINITY,
                requests_per_s: capacity,
                overloaded: true,
            });
        }
        let drive = Drive::Open {
            rate_per_s: rate,
            engines,
        };
        self.run(stage, shape, drive)
    }

    /// `c` requests in flight over `engines`: `c mod n` engines hold one more than the
    /// others. Means are weighted by the requests each engine completes.
    fn closed_split(
        &mut self,
        stage: Stage,
        engines: Engines,
        c: u32,
    ) -> Result<EngineRun, SweepError> {
        let n = engines.replicas;
        let (q, more) = (c / n, c % n);
        let mut parts = Vec::new();
        if more > 0 {
            parts.push((
                more,
                self.run(stage, engines.shape(), Drive::Closed { in_flight: q + 1 })?,
            ));
        }
        if q > 0 {
            parts.push((
                n - more,
                self.run(stage, engines.shape(), Drive::Closed { in_flight: q })?,
            ));
        }
        let rps: f64 = parts
            .iter()
            .map(|(k, r)| f64::from(*k) * r.requests_per_s)
            .sum();
        let mean = |f: fn(&EngineRun) -> f64| {
            parts
                .iter()
                .map(|(k, r)| f64::from(*k) * r.requests_per_s * f(r))
                .sum::<f64>()
                / rps
        };
        Ok(EngineRun {
            ttft_ms: mean(|r| r.ttft_ms),
            itl_ms: mean(|r| r.itl_ms),
            e2e_ms: mean(|r| r.e2e_ms),
            requests_per_s: rps,
            overloaded: false,
        })
    }

    /// A prompt's KV from a prefill engine of shape `p` to a decode engine of shape `d`:
    /// every rank moves its shard over its own NIC at once, the side with the larger
    /// shards binding.
    fn transfer_ms(&self, p: Shape, d: Shape) -> f64 {
        let isl = u64::from(self.req.isl);
        let ms = |s: Shape| estimator(&self.configs[&s]).kv_transfer_ms(isl, Link::Network);
        ms(p).max(ms(d))
    }
}

/// The step budget a layout keeps, among `variants` (its [`Sweep::chunk_variants`],
/// the default first, each predicted with its load): of those that meet the SLA, the one
/// that serves the most per GPU (with `optimizationType: latency`, the lowest end-to-end
/// time), the larger budget on a tie, so a smaller chunk only where it meets the SLA
/// where larger ones do not, or does better by the request's measure; when none meets
/// it, the one closest to it.
pub fn tuned(
    variants: &[(Candidate, Load)],
    optimization: Option<OptimizationType>,
    sla: &Sla,
    u: &Uncertainty,
) -> (Candidate, Load) {
    let meeting = variants.iter().filter(|(c, _)| c.meets_sla);
    let best = match optimization {
        Some(OptimizationType::Latency) => meeting.min_by(|a, b| a.0.e2e_ms.total_cmp(&b.0.e2e_ms)),
        _ => meeting.reduce(|best, v| {
            if v.0.throughput_per_gpu > best.0.throughput_per_gpu {
                v
            } else {
                best
            }
        }),
    };
    *best
        .or_else(|| {
            variants
                .iter()
                .min_by(|a, b| a.0.shortfall(sla, u).total_cmp(&b.0.shortfall(sla, u)))
        })
        .expect("a layout has its default step budget")
}

/// The candidate to deploy among those that meet the SLA (see the module doc).
pub fn select(
    candidates: &[Candidate],
    optimization: Option<OptimizationType>,
) -> Option<Candidate> {
    let tie = |a: &Candidate, b: &Candidate| {
        a.e2e_ms
            .total_cmp(&b.e2e_ms)
            .then(a.gpus.cmp(&b.gpus))
            .then(a.layout.cmp(&b.layout))
    };
    let order = |a: &Candidate, b: &Candidate| -> Ordering {
        match optimization {
            None => a
                .gpus
                .cmp(&b.gpus)
                .then(b.throughput_per_gpu.total_cmp(&a.throughput_per_gpu))
                .then_with(|| tie(a, b)),
            Some(OptimizationType::Throughput) => b
                .throughput_per_gpu
                .total_cmp(&a.throughput_per_gpu)
                .then_with(|| tie(a, b)),
            Some(OptimizationType::Latency) => tie(a, b),
        }
    };
    candidates
        .iter()
        .filter(|c| c.meets_sla)
        .min_by(|a, b| order(a, b))
        .copied()
}

/// The candidates no other beats on throughput per GPU and every latency the SLA names
/// (TTFT and ITL, or end-to-end), overloaded ones aside; by GPUs, then throughput.
pub fn pareto(candidates: &[Candidate], sla: &Sla) -> Vec<Candidate> {
    let axes = |c: &Candidate| -> Vec<f64> {
        let mut v = vec![-c.throughput_per_gpu];
        match sla {
            Sla::TtftItl { .. } => v.extend([c.ttft_ms, c.itl_ms]),
            Sla::E2e { .. } => v.push(c.e2e_ms),
        }
        v
    };
    let stable: Vec<&Candidate> = candidates.iter().filter(|c| !c.overloaded).collect();
    let dominates = |a: &Candidate, b: &Candidate| {
        let (x, y) = (axes(a), axes(b));
        x.iter().zip(&y).all(|(p, q)| p <= q) && x.iter().zip(&y).any(|(p, q)| p < q)
    };
    let mut front: Vec<Candidate> = stable
        .iter()
        .filter(|b| !stable.iter().any(|a| dominates(a, b)))
        .map(|c| **c)
        .collect();
    front.sort_by(|a, b| {
        a.gpus
            .cmp(&b.gpus)
            .then(b.throughput_per_gpu.total_cmp(&a.throughput_per_gpu))
            .then(a.layout.cmp(&b.layout))
    });
    front
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(layout: Layout, ttft: f64, itl: f64, tput: f64) -> Candidate {
        Candidate {
            layout,
            gpus: layout.gpus(),
            ttft_ms: ttft,
            itl_ms: itl,
            e2e_ms: ttft + 99.0 * itl,
            requests_per_s: 1.0,
            throughput_per_gpu: tput,
            overloaded: false,
            meets_sla: true,
        }
    }

    fn agg(tp: u32, replicas: u32) -> Layout {
        Layout::Aggregated {
            workers: Engines::new(tp, replicas),
        }
    }

    #[test]
    fn the_optimization_type_picks_among_those_that_meet_the_sla() {
        let small = candidate(agg(1, 2), 150.0, 18.0, 500.0);
        let dense = candidate(agg(2, 1), 120.0, 19.0, 700.0);
        let big = candidate(agg(1, 8), 60.0, 8.0, 125.0);
        let mut miss = candidate(agg(1, 1), 400.0, 30.0, 1000.0);
        miss.meets_sla = false;
        let all = [big, small, dense, miss];
        // Fewest GPUs (a tie at 2: the more throughput per GPU), most throughput per
        // GPU, lowest latency; never one that misses.
        assert_eq!(select(&all, None), Some(dense));
        assert_eq!(
            select(&all, Some(OptimizationType::Throughput)),
            Some(dense)
        );
        assert_eq!(select(&all, Some(OptimizationType::Latency)), Some(big));
        assert_eq!(select(&[miss], None), None);
    }

    #[test]
    fn the_pareto_set_keeps_what_nothing_beats_on_every_axis() {
        let sla = Sla::TtftItl {
            ttft_ms: 200.0,
            itl_ms: 20.0,
        };
        let a = candidate(agg(1, 2), 150.0, 18.0, 500.0);
        let b = candidate(agg(2, 1), 120.0, 19.0, 500.0);
        let c = candidate(agg(1, 4), 100.0, 10.0, 250.0);
        let worse = candidate(agg(1, 3), 160.0, 19.0, 333.0);
        let mut overloaded = candidate(agg(1, 1), 10.0, 1.0, 2000.0);
        overloaded.overloaded = true;
        let front = pareto(&[worse, c, a, b, overloaded], &sla);
        let layouts: Vec<Layout> = front.iter().map(|c| c.layout).collect();
        assert_eq!(layouts, [agg(1, 2), agg(2, 1), agg(1, 4)]);
        // On end-to-end time alone a (150 + 99 x 18 = 1,932 ms) beats b (2,001 ms) at
        // equal throughput.
        let e2e = pareto(&[a, b, c], &Sla::E2e { e2e_ms: 3000.0 });
        let layouts: Vec<Layout> = e2e.iter().map(|c| c.layout).collect();
        assert_eq!(layouts, [agg(1, 2), agg(1, 4)]);
    }

    #[test]
    fn a_layout_keeps_the_default_budget_unless_a_smaller_one_does_better() {
        let sla = Sla::TtftItl {
            ttft_ms: 500.0,
            itl_ms: 50.0,
        };
        let u = Uncertainty::NONE;
        let load = Load::Rate(9.0);
        let at = |chunk, ttft, itl, tput| {
            let mut layout = agg(2, 3);
            layout.prefilling().max_num_batched_tokens = chunk;
            let mut c = candidate(layout, ttft, itl, tput);
            c.meets_sla = ttft <= 500.0 && itl <= 50.0;
            (c, load)
        };
        let chunk = |v: &[(Candidate, Load)], o| match tuned(v, o, &sla, &u).0.layout {
            Layout::Aggregated { workers } => workers.max_num_batched_tokens,
            Layout::Disaggregated { .. } => unreachable!(),
        };
        // Both meet it, serving alike: the default stays, even if the smaller has the
        // lower end-to-end time (unless that is what the request optimizes).
        let both = [at(8192, 300.0, 40.0, 225.0), at(512, 450.0, 30.0, 225.0)];
        assert_eq!(chunk(&both, None), 8192);
        assert_eq!(chunk(&both, Some(OptimizationType::Throughput)), 8192);
        assert_eq!(chunk(&both, Some(OptimizationType::Latency)), 512);
        // Only the smaller meets it, or it serves more.
        let only_small = [at(8192, 300.0, 75.0, 225.0), at(512, 450.0, 38.0, 225.0)];
        assert_eq!(chunk(&only_small, None), 512);
        let more = [at(8192, 300.0, 40.0, 225.0), at(512, 450.0, 30.0, 260.0)];
        assert_eq!(chunk(&more, None), 512);
        // Neither: the one closest to the SLA (75/50 against 600/500).
        let neither = [at(8192, 300.0, 75.0, 225.0), at(512, 600.0, 38.0, 225.0)];
        assert_eq!(chunk(&neither, None), 512);
    }

    #[test]
    fn layouts_print_as_the_table_names_them() {
        assert_eq!(agg(2, 4).to_string(), "agg 4 x TP2");
        let d = Layout::Disaggregated {
            prefill: Engines::new(1, 2),
            decode: Engines::new(2, 3),
        };
        assert_eq!(d.to_string(), "disagg 2 x TP1 prefill + 3 x TP2 decode");
        assert_eq!(d.gpus(), 8);
        // A budget other than the default is named.
        let mut chunked = d;
        chunked.prefilling().max_num_batched_tokens = 512;
        assert_eq!(
            chunked.to_string(),
            "disagg 2 x TP1 prefill with 512-token chunks + 3 x TP2 decode"
        );
    }
}
