//! `dynamo-e2e replay`: router modes, tiers and graphs compared on simulated engines.

use super::*;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Simulated engines.
    #[arg(long, default_value_t = 4, env = "DYNAMO_E2E_WORKERS")]
    pub workers: usize,
    #[command(flatten)]
    pub engine: SimEngineArgs,
    /// Router modes to compare, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kv,approx,round-robin",
        env = "DYNAMO_E2E_MODES"
    )]
    pub modes: Vec<RouterMode>,
    /// Closed loop: this many clients, each sending the next request as soon as its
    /// previous one ends (aiperf's `--concurrency`, as workload B runs live), instead of
    /// a request rate.
    #[arg(
        long,
        conflicts_with_all = ["request_rate", "rate_schedule", "sessions", "tiers", "topology"],
        env = "DYNAMO_E2E_CONCURRENCY"
    )]
    pub concurrency: Option<usize>,
    /// The picker's cost knobs, under its names.
    #[command(flatten)]
    pub router: RouterKnobs,
    /// KV block tier configs to compare (conversations only), each run with every router
    /// mode: `off`, or tiers joined by `+` among `host=SIZE`, `disk=SIZE`,
    /// `object=SIZE`, e.g. `off,host=2GB,host=512MB+disk=8GB`. Sizes are each engine's
    /// (its sidecar's), in real KV bytes: `2GB`, `512MiB` or plain bytes.
    #[arg(long, value_delimiter = ',', value_parser = TierSpec::parse, env = "DYNAMO_E2E_TIERS")]
    pub tiers: Vec<TierSpec>,
    /// Uses a block needs before it moves from host memory to disk.
    #[arg(long, default_value_t = 2, env = "DYNAMO_E2E_KV_DISK_MIN_REUSE")]
    pub kv_disk_min_reuse: u32,
    /// Uses a block needs before it moves from disk (or host memory) to the object store.
    #[arg(long, default_value_t = 2, env = "DYNAMO_E2E_KV_OBJECT_MIN_REUSE")]
    pub kv_object_min_reuse: u32,
    /// Real KV bytes of one block [default: from `--model-path`'s config.json and
    /// `--block-size`].
    #[arg(long, value_parser = parse_bytes, env = "DYNAMO_E2E_KV_BLOCK_BYTES")]
    pub kv_block_bytes: Option<u64>,
    /// Graphs to compare (request workloads), each run with every router mode in place
    /// of `--workers`: `agg:N` (N engines that prefill and decode) or `XpYd` (X prefill
    /// and Y decode engines, each prompt's KV moving over `--kv-link-bandwidth-gbps`),
    /// e.g. `agg:4,2p2d,1p3d`.
    #[arg(long, value_delimiter = ',', value_parser = Topology::parse, env = "DYNAMO_E2E_TOPOLOGY")]
    pub topology: Vec<Topology>,
    /// Decode engines of a disaggregated `--topology` span this many GPUs
    /// (`--perf-model hardware`), where prefill and aggregated engines span
    /// `--tensor-parallel-size`: each role its own tensor parallel size, as a DGDR's
    /// profiler chooses them. Tables then compare throughput per GPU across graphs.
    #[arg(long, env = "DYNAMO_E2E_DECODE_TENSOR_PARALLEL_SIZE")]
    pub decode_tensor_parallel_size: Option<u64>,
    /// Bandwidth of each engine's link for disaggregated KV transfers, GB/s: InfiniBand's
    /// 400 Gb/s across nodes; NVLink within a node is 900 GB/s (brief, "Transfer (NIXL)
    /// transports").
    #[arg(
        long,
        default_value_t = dynamo_mocker::kv_blocks::DEFAULT_LINK_BANDWIDTH_GBPS,
        env = "DYNAMO_E2E_KV_LINK_BANDWIDTH_GBPS"
    )]
    pub kv_link_bandwidth_gbps: f64,
    /// Model directory whose config.json sizes a KV block (with `--tiers` or a
    /// disaggregated `--topology`).
    #[arg(
        long,
        default_value = ".cache/models/qwen-mock",
        env = "DYNAMO_E2E_MODEL_PATH"
    )]
    pub model_path: PathBuf,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// One `--tiers` entry: its text (the run's label) and each tier's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierSpec {
    pub label: String,
    pub host: Option<u64>,
    pub disk: Option<u64>,
    pub object: Option<u64>,
}

impl TierSpec {
    pub(super) fn parse(s: &str) -> Result<Self, String> {
        let mut spec = Self {
            label: s.trim().to_owned(),
            host: None,
            disk: None,
            object: None,
        };
        if spec.label == "off" {
            return Ok(spec);
        }
        for part in spec.label.clone().split('+') {
            let (name, size) = part.split_once('=').ok_or_else(|| {
                format!("{part:?}: a tier is host=SIZE, disk=SIZE or object=SIZE (or `off`)")
            })?;
            let slot = match name.trim() {
                "host" => &mut spec.host,
                "disk" => &mut spec.disk,
                "object" => &mut spec.object,
                other => return Err(format!("{other:?}: tiers are host, disk and object")),
            };
            if slot.is_some() {
                return Err(format!("{s:?} names {name} twice"));
            }
            // 0 bytes is a tier that is off, as for the sidecar.
            *slot = Some(parse_bytes(size)?).filter(|&b| b > 0);
        }
        Ok(spec)
    }

    pub(super) fn placement(&self, disk_min_reuse: u32, object_min_reuse: u32) -> PlacementConfig {
        let limits = |bytes: Option<u64>, min_reuse| {
            bytes.map(|capacity_bytes| TierLimits {
                capacity_bytes,
                min_reuse,
            })
        };
        PlacementConfig {
            host: limits(self.host, 1),
            disk: limits(self.disk, disk_min_reuse),
            object: limits(self.object, object_min_reuse),
        }
    }
}

pub(super) fn run_replay(args: ReplayArgs) -> anyhow::Result<()> {
    let w = &args.workload;
    let workload = w.workload()?;
    let rates = w.rates();
    // A closed loop sends each request when an earlier one ends: no times to compute.
    let times: Vec<Vec<f64>> = match args.concurrency {
        Some(_) => vec![Vec::new()],
        None => rates
            .iter()
            .map(|&rate| w.times_ms(&workload, rate))
            .collect::<anyhow::Result<_>>()?,
    };
    anyhow::ensure!(args.workers > 0, "--workers must be at least 1");
    args.router.check().map_err(anyhow::Error::msg)?;
    let engine = args.engine.config()?;
    engine.validate()?;
    let decode_engine = match args.decode_tensor_parallel_size {
        None => engine.clone(),
        Some(tp) => {
            anyhow::ensure!(
                !args.topology.is_empty()
                    && matches!(engine.timing, dynamo_mocker::TimingModel::Hardware(_)),
                "--decode-tensor-parallel-size sizes the decode engines of a --topology on \
                 --perf-model hardware"
            );
            let mut decode = args.engine.clone();
            decode.timing.tensor_parallel_size = tp;
            let config = decode.config()?;
            config.validate()?;
            config
        }
    };
    let graph_engines = disagg::GraphEngines {
        prompts: &engine,
        decode: &decode_engine,
    };
    let scheduler = args.router.scheduler();
    let approx = args.router.approx();
    anyhow::ensure!(
        args.tiers.is_empty() || workload.conversations().is_some(),
        "--tiers simulates KV block tiers for conversations: give --sessions"
    );
    let topologies = !args.topology.is_empty();
    anyhow::ensure!(
        !topologies || (args.tiers.is_empty() && workload.conversations().is_none()),
        "--topology simulates request workloads (shared prefix, trace): not with --sessions or --tiers"
    );
    anyhow::ensure!(
        args.kv_link_bandwidth_gbps.is_finite() && args.kv_link_bandwidth_gbps > 0.0,
        "--kv-link-bandwidth-gbps must be positive"
    );
    let on = |t: &TierSpec| t.host.is_some() || t.disk.is_some() || t.object.is_some();
    let moves_kv = args
        .topology
        .iter()
        .any(|t| matches!(t, Topology::Disaggregated { .. }));
    let block_bytes = match (args.kv_block_bytes, args.tiers.iter().any(on) || moves_kv) {
        (Some(b), _) => Some(b),
        (None, true) => match hardware_block_bytes(&engine) {
            Some(b) => Some(b),
            None => Some(kv_block_bytes(
                &args.model_path,
                args.engine.shape.block_size,
            )?),
        },
        (None, false) => None,
    };
    anyhow::ensure!(block_bytes != Some(0), "--kv-block-bytes must be positive");
    let tier_setups: Vec<Option<(String, replay::TierSetup)>> = if args.tiers.is_empty() {
        vec![None]
    } else {
        args.tiers
            .iter()
            .map(|t| {
                let placement = t.placement(args.kv_disk_min_reuse, args.kv_object_min_reuse);
                let setup = replay::TierSetup::new(placement, block_bytes.unwrap_or(1));
                Some((t.label.clone(), setup))
            })
            .collect()
    };
    let link = disagg::Link {
        bandwidth_gbps: args.kv_link_bandwidth_gbps,
        block_bytes: block_bytes.unwrap_or(1),
    };
    let mut runs = Vec::new();
    for (&rate, times) in rates.iter().zip(&times) {
        let at = rate.map_or_else(String::new, |r| format!(" at {r} req/s"));
        for &mode in &args.modes {
            let setup = replay::RouterSetup {
                mode,
                scheduler,
                approx,
                seed: w.seed,
            };
            let mut these = Vec::new();
            if topologies {
                for &topology in &args.topology {
                    let mut run =
                        disagg::run(&workload, times, graph_engines, topology, setup, &link)?;
                    if args.modes.len() > 1 {
                        run.label = format!("{mode} {topology}");
                    }
                    these.push(run);
                }
            }
            if let Some(clients) = args.concurrency {
                let run =
                    replay::run_closed_loop(&workload, clients, &engine, args.workers, setup)?;
                these.push(run);
            }
            for tiers in tier_setups
                .iter()
                .filter(|_| !topologies && args.concurrency.is_none())
            {
                let mut run = replay::run_with_tiers(
                    &workload,
                    times,
                    &engine,
                    args.workers,
                    setup,
                    tiers.as_ref().map(|(_, t)| t),
                )?;
                if let Some((label, _)) = tiers {
                    run.label = if args.modes.len() == 1 {
                        label.clone()
                    } else {
                        format!("{mode} {label}")
                    };
                }
                these.push(run);
            }
            for mut run in these {
                let wall_s = run.replay.map_or(0.0, |d| d.wall_s);
                eprintln!("replay {}{at}: computed in {wall_s:.2} s", run.label);
                run.request_rate = rate;
                runs.push(run);
            }
        }
    }
    let blocks = format!(
        "{} blocks of {} tokens, {}",
        engine.num_gpu_blocks,
        engine.block_size,
        engine.timing.describe()
    );
    let graph = if topologies {
        let list: Vec<String> = args.topology.iter().map(Topology::to_string).collect();
        let decode = if args.decode_tensor_parallel_size.is_some() {
            format!(
                "; decode engines of {} blocks, {}",
                decode_engine.num_gpu_blocks,
                decode_engine.timing.describe()
            )
        } else {
            String::new()
        };
        format!("graphs {}, engines of {blocks}{decode}", list.join(", "))
    } else {
        format!("{} engines x {blocks}", args.workers)
    };
    let mut title = format!(
        "Replay: {}; {}; {graph}; router overlap_score_weight {}, router_temperature {}",
        workload.describe(),
        w.describe_arrivals(args.concurrency),
        args.router.overlap_score_weight,
        args.router.router_temperature
    );
    let mut config = json!({
        "workers": args.workers,
        "engine": engine,
        "router": {"overlap_score_weight": args.router.overlap_score_weight,
                   "router_temperature": args.router.router_temperature,
                   "approx_ttl_s": args.router.approx_ttl.as_secs_f64()},
    });
    if !w.request_rate.is_empty() {
        config["request_rates"] = json!(w.request_rate);
    }
    if args.decode_tensor_parallel_size.is_some() {
        config["decode_engine"] = json!(decode_engine);
    }
    if let Some(clients) = args.concurrency {
        config["concurrency"] = json!(clients);
    }
    if let Some(schedule) = &w.rate_schedule {
        config["rate_schedule"] = json!(schedule.to_string());
    }
    // Ratios against round-robin, or with tiers or graphs against the first of them.
    let mut baseline = RouterMode::RoundRobin.as_str().to_owned();
    if topologies {
        title.push_str(&format!(
            "; disaggregated KV over {} GB/s links, blocks of {} bytes",
            args.kv_link_bandwidth_gbps,
            block_bytes.unwrap_or(0)
        ));
        config["topologies"] = json!({
            "graphs": args.topology.iter().map(Topology::to_string).collect::<Vec<_>>(),
            "kv_link_bandwidth_gbps": args.kv_link_bandwidth_gbps,
            "block_bytes": block_bytes,
        });
        baseline = runs.first().map(|r| r.label.clone()).unwrap_or_default();
    }
    if !args.tiers.is_empty() {
        let kv = KvBlocksConfig::default();
        title.push_str(&format!(
            "; KV tiers per engine, blocks of {} bytes, onboarding at host {} / disk {} / object {} GB/s, disk min reuse {}",
            block_bytes.unwrap_or(0),
            kv.host_bandwidth_gbps,
            kv.disk_bandwidth_gbps,
            kv.object_bandwidth_gbps,
            args.kv_disk_min_reuse,
        ));
        config["tiers"] = json!({
            "configs": args.tiers.iter().map(|t| json!({
                "label": t.label, "host_bytes": t.host, "disk_bytes": t.disk, "object_bytes": t.object,
            })).collect::<Vec<_>>(),
            "block_bytes": block_bytes,
            "kv_disk_min_reuse": args.kv_disk_min_reuse,
            "kv_object_min_reuse": args.kv_object_min_reuse,
            "bandwidth_gbps": {"host": kv.host_bandwidth_gbps, "disk": kv.disk_bandwidth_gbps,
                               "object": kv.object_bandwidth_gbps},
        });
        baseline = runs.first().map(|r| r.label.clone()).unwrap_or_default();
    }
    publish("replay", &title, config, &runs, &baseline, &args.output)
}
