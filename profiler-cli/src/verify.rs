//! `dynamo profile --verify`: the selected layout run on this machine and measured, the
//! prediction's check on the same engine.
//!
//! - The graph: the profiler's own ([`graph::generate`]) for the request resolved to the
//!   mock engine backend, so every engine is `dynamo-mocker --perf-model hardware` with the
//!   request's GPU and the layout's tensor parallel size (the engine the profiler
//!   simulated), with the selected replicas and layout and no planner (it would change
//!   the replicas being measured). Disaggregated engines copy a token share of each KV
//!   block's bytes (`--kv-bytes-scale`): the modelled transfer still counts every byte,
//!   but two cores cannot copy hundreds of MB a request over loopback.
//! - Run as `dynamo run` runs it (this binary, on free loopback ports), until every
//!   replica is ready.
//! - The load (`dynamo-loadgen`'s client): the request's ISL and OSL, prompts of unique
//!   tokens (the profiler counts no prefix cache hits); Poisson arrivals at
//!   `requestRate`, or `concurrency` clients each sending its next request when its last
//!   one ends, started spread over one predicted request's time as the simulation's are.
//! - Measured as the simulation measures: the requests in flight when the first one ends
//!   are the warm-up; the window opens once they have all ended and lasts
//!   `--verify-duration`; the load goes on until every request sent in it has ended.
//!   TTFT, ITL (every gap between tokens) and end-to-end time over those requests, with
//!   the means set against the prediction (itself a mean), and the requests completed
//!   per second of the window.
//! - Beside them, what the prediction leaves out or the machine adds: the TTFT of a
//!   one-token request (the HTTP path), how often a timer wakes later than a mock
//!   engine's clock forgives, and how busy the CPUs were and with what.

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser as _;
use dynamo_crds::{BackendFramework, DynamoGraphDeployment, ServiceRole};
use dynamo_loadgen::arrivals::exponential_gap_ms;
use dynamo_loadgen::bench::http_client;
use dynamo_loadgen::client::{Api, RequestRecord, Target, send};
use dynamo_loadgen::launch::{Launched, Stopped};
use dynamo_loadgen::report::Report;
use dynamo_loadgen::workload::{PROMPT_VOCAB, WorkItem};
use dynamo_mocker::TimingModel;
use dynamo_mocker::tokens::{stream_key, token_at};
use dynamo_names::Role;
use dynamo_profiler::graph::{engine_command, generate};
use dynamo_profiler::{Candidate, Layout, Load, Profiled, Request};
use dynamo_server::free_port;
use dynamo_wiring::admin::GraphStatus;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::task::JoinSet;

/// Payload bytes a disaggregated mock engine really copies per KV block, as a share of
/// the block's modelled bytes.
const KV_BYTES_SCALE: &str = "0.0001";
/// Seeds the prompts and the arrivals, so a run sends what the last one sent.
const SEED: u64 = 17;
/// From the start of `dynamo run` until every replica is ready (debug builds on 2 cores
/// take about 15 s).
const STARTUP: Duration = Duration::from_secs(120);
/// SIGTERM to SIGKILL for the graph's processes.
const GRACE: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(50);
/// The timer probe: a wake-up every period, late past [`LATE_WAKE`]: a mock engine's clock
/// forgives a step that starts up to 2 ms after the modelled end of the last
/// (`mocker/src/clock.rs`); one that starts later delays every step after it.
const PROBE_PERIOD: Duration = Duration::from_millis(5);
const LATE_WAKE: Duration = Duration::from_millis(2);
/// Lateness a step would gather, as a share of the predicted ITL, past which the table says
/// the machine lengthens what it measures.
const LATE_SHARE: f64 = 0.05;
/// Fewer measured requests than this say little.
const FEW_REQUESTS: usize = 20;

/// Runs `profiled`'s selected layout as graph `name` on mock engines with the tokenizer
/// of `model_path`, measures it for `window`, and prints predicted against measured on
/// stderr. Fails if the graph does not come up or a measured request fails.
pub fn run(
    profiled: &Profiled,
    name: &str,
    model_path: &Path,
    window: Duration,
) -> anyhow::Result<()> {
    let selected = &profiled.selected;
    let req = Request {
        backend: BackendFramework::Mocker,
        planner: false,
        ..profiled.request.clone()
    };
    check_engine_model(&req, selected.layout, model_path)?;
    let dgd = mock_graph(name, &req, selected);
    let dir = std::env::temp_dir().join(format!("dynamo-verify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join("graph.yaml");
    let log = dir.join("run.log");
    std::fs::write(&file, serde_saphyr::to_string(&dgd)?)
        .with_context(|| format!("writing {}", file.display()))?;
    eprintln!(
        "verify: {} on mock engines (dynamo-mocker --perf-model hardware --gpu {}) on this \
         machine, without a planner (it would change the replicas being measured)",
        selected.layout, req.gpu.name
    );
    let verification = Verification {
        req: &req,
        load: profiled.load,
        selected,
        model_path,
        window,
    };
    let verified = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(verification.run(&file, &log));
    match verified {
        Ok(()) => {
            std::fs::remove_dir_all(&dir).ok();
            Ok(())
        }
        Err(e) => Err(e.context(format!("the graph's file and log are in {}", dir.display()))),
    }
}

/// The profiler's graph of `selected` for `req` (the mock engine backend, no planner),
/// each disaggregated engine copying only [`KV_BYTES_SCALE`] of its blocks' bytes.
fn mock_graph(name: &str, req: &Request, selected: &Candidate) -> DynamoGraphDeployment {
    let mut dgd = generate(name, req, selected);
    for service in dgd.spec.services.values_mut() {
        let ServiceRole::Engine(Role::Prefill | Role::Decode) = service.role() else {
            continue;
        };
        let main = service
            .extra_pod_spec
            .as_mut()
            .and_then(|p| p.main_container.as_mut());
        if let Some(main) = main {
            let args = main.args.get_or_insert_default();
            args.extend(["--kv-bytes-scale".into(), KV_BYTES_SCALE.into()]);
        }
    }
    dgd
}

/// Refuses a model directory whose `config.json` would give the mock engines another
/// model than the one profiled (they read it before the catalog): what the engine's own
/// flag parser makes of the generated command.
fn check_engine_model(req: &Request, layout: Layout, model_path: &Path) -> anyhow::Result<()> {
    let engines = match layout {
        Layout::Aggregated { workers } => workers,
        Layout::Disaggregated { prefill, .. } => prefill,
    };
    let (command, args) = engine_command(req, engines);
    let argv: Vec<OsString> = command
        .into_iter()
        .map(OsString::from)
        .chain(["--model-path".into(), model_path.into()])
        .chain(args.into_iter().map(OsString::from))
        .collect();
    let refused = "the mock engine refuses the generated flags";
    let config = dynamo_mocker::Args::try_parse_from(&argv)
        .context(refused)?
        .engine_config()
        .context(refused)?;
    let TimingModel::Hardware(estimator) = &config.timing else {
        bail!("the generated mock engine does not run on the hardware model");
    };
    let size = |m: &dynamo_perfmodel::ModelArch| {
        format!("{:.2}B parameters", m.params().total() as f64 / 1e9)
    };
    if estimator.model != req.model {
        bail!(
            "the mock engines would model {}/config.json ({}), not the {} profiled ({}): pass a \
             --model-path whose config.json is the profiled model's, or that has none (the \
             catalog's is used then)",
            model_path.display(),
            size(&estimator.model),
            req.model.name,
            size(&req.model)
        );
    }
    Ok(())
}

/// One verification: the graph's request (resolved to the mock engine, without a
/// planner), the load predicted for (the request's, or for a request without one the
/// concurrency the profiler sized), the prediction and the window.
struct Verification<'a> {
    req: &'a Request,
    load: Load,
    selected: &'a Candidate,
    model_path: &'a Path,
    window: Duration,
}

impl Verification<'_> {
    /// Starts the graph in `file` (its output to `log`), measures it, stops it and prints
    /// the table.
    async fn run(&self, file: &Path, log: &Path) -> anyhow::Result<()> {
        let (port, admin_port) = (free_port()?, free_port()?);
        let exe = std::env::current_exe()?;
        let (port_arg, admin_port_arg) = (port.to_string(), admin_port.to_string());
        let words = [
            exe.as_os_str(),
            OsStr::new("run"),
            OsStr::new("-f"),
            file.as_os_str(),
            OsStr::new("--port"),
            OsStr::new(&port_arg),
            OsStr::new("--admin-port"),
            OsStr::new(&admin_port_arg),
            OsStr::new("--model-path"),
            self.model_path.as_os_str(),
        ]
        .map(shell_word)
        .join(" ");
        let command = format!("exec {words} > {} 2>&1", shell_word(log.as_os_str()));
        // Each request ends, failed if need be, so that the run does.
        let timeout = Duration::from_secs_f64(60.0 + 10.0 * self.selected.e2e_ms / 1000.0);
        let http = http_client(timeout)?;
        let mut graph = Launched::start(command)?;
        // The graph runs in process groups of its own, which a Ctrl-C does not reach: it
        // is stopped here however the measurement ends.
        let measured = tokio::select! {
            measured = self.measure(&mut graph, &http, port, admin_port, log, &words) => measured,
            () = dynamo_server::shutdown_signal() => Err(anyhow::anyhow!("interrupted")),
        };
        if graph.stop(GRACE).await? == Stopped::Killed {
            eprintln!("verify: the graph outlived {GRACE:?} after SIGTERM and was killed");
        }
        let measured = measured?;
        eprint!("{}", measured.table(self.req, self.selected));
        let report = &measured.report;
        if report.errors > 0 {
            bail!(
                "{} of {} measured requests failed: {}",
                report.errors,
                report.requests,
                report.error_samples.join("; ")
            );
        }
        Ok(())
    }

    /// Waits for `graph` (started as `command`) on `port` and `admin_port`, then measures
    /// the HTTP path and the load.
    async fn measure(
        &self,
        graph: &mut Launched,
        http: &reqwest::Client,
        port: u16,
        admin_port: u16,
        log: &Path,
        command: &str,
    ) -> anyhow::Result<Measured> {
        let started = Instant::now();
        let base_url = format!("http://127.0.0.1:{port}");
        let up = async {
            graph.wait_healthy(http, &base_url, STARTUP).await?;
            every_replica_ready(http, admin_port, self.selected.layout, started + STARTUP).await
        };
        up.await
            .map_err(|e| e.context(format!("starting the graph: {}", tail(log))))?;
        eprintln!(
            "verify: {command} up in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let target = Target {
            base_url,
            model: self.req.served_model.clone(),
            api: Api::Completions,
            words: None,
        };
        let ms = one_token_ttft(http, &target).await?;
        eprintln!(
            "verify: a one-token request's TTFT here is {ms:.1} ms: the HTTP path through the \
             picker and the sidecar, which the prediction leaves out, and one short engine step"
        );
        let shape = Shape {
            isl: self.req.isl as usize,
            osl: self.req.osl as usize,
        };
        let (predicted_e2e_ms, window) = (self.selected.e2e_ms, self.window);
        measure(
            http.clone(),
            target,
            shape,
            self.load,
            predicted_e2e_ms,
            window,
        )
        .await
    }
}

/// The median TTFT of a few one-token requests sent one at a time.
async fn one_token_ttft(http: &reqwest::Client, target: &Target) -> anyhow::Result<f64> {
    let item = WorkItem {
        token_ids: vec![1],
        max_tokens: 1,
    };
    let start = Instant::now();
    let mut ttfts = Vec::new();
    for _ in 0..5 {
        let r = send(http, target, &item, start).await;
        if let Some(e) = r.error {
            bail!("a one-token request failed: {e}");
        }
        ttfts.push(r.ttft_ms.unwrap_or(r.e2e_ms));
    }
    ttfts.sort_by(f64::total_cmp);
    Ok(ttfts[ttfts.len() / 2])
}

/// Quoted for `sh`.
fn shell_word(word: &OsStr) -> String {
    format!("'{}'", word.to_string_lossy().replace('\'', r"'\''"))
}

/// The last lines of the graph's log.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "the end of its log:\n{}",
        lines[lines.len().saturating_sub(30)..].join("\n")
    )
}

/// Waits until the runner's admin API lists every replica of `layout` as ready, so the
/// load does not start on some of them.
async fn every_replica_ready(
    http: &reqwest::Client,
    admin_port: u16,
    layout: Layout,
    deadline: Instant,
) -> anyhow::Result<()> {
    let want = match layout {
        Layout::Aggregated { workers } => workers.replicas,
        Layout::Disaggregated { prefill, decode } => prefill.replicas + decode.replicas,
    } as usize;
    let url = format!("http://127.0.0.1:{admin_port}/graph");
    loop {
        let status: Option<GraphStatus> = match http.get(&url).send().await {
            Ok(response) => response.json().await.ok(),
            Err(_) => None,
        };
        let ready = status.map_or(0, |s| {
            s.services.values().flatten().filter(|r| r.ready).count()
        });
        if ready == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{ready} of {want} replicas were ready after {STARTUP:?}");
        }
        tokio::time::sleep(POLL * 4).await;
    }
}

#[derive(Clone, Copy)]
struct Shape {
    isl: usize,
    osl: usize,
}

impl Shape {
    /// Request `i`: its own prompt, no token in common with another's but by chance.
    fn request(self, i: usize) -> WorkItem {
        let key = stream_key(SEED, i as u64);
        WorkItem {
            token_ids: (0..self.isl as u64)
                .map(|pos| token_at(key, pos, PROMPT_VOCAB))
                .collect(),
            max_tokens: self.osl,
        }
    }
}

/// Every request sent so far: when (ms from the start of the load), and what it measured
/// once it ended.
#[derive(Default)]
struct Sent {
    at_ms: Vec<f64>,
    ended: Vec<Option<RequestRecord>>,
}

fn end_ms(r: &RequestRecord) -> f64 {
    r.sent_ms + r.e2e_ms
}

impl Sent {
    /// The opening of the window: once the requests sent before the first one ended
    /// have all ended, the last of their ends.
    fn warm_end(&self) -> Option<f64> {
        let first = self
            .ended
            .iter()
            .flatten()
            .map(end_ms)
            .min_by(f64::total_cmp)?;
        let mut last = first;
        for (at, ended) in self.at_ms.iter().zip(&self.ended) {
            if *at < first {
                last = last.max(end_ms(ended.as_ref()?));
            }
        }
        Some(last)
    }

    /// The requests sent in `[from, to)`, if every one has ended.
    fn window(&self, from: f64, to: f64) -> Option<Vec<RequestRecord>> {
        self.at_ms
            .iter()
            .zip(&self.ended)
            .filter(|(at, _)| (from..to).contains(*at))
            .map(|(_, ended)| ended.clone())
            .collect()
    }

    /// Requests that ended in `[from, to)`.
    fn ended_within(&self, from: f64, to: f64) -> usize {
        let ends = self.ended.iter().flatten().map(end_ms);
        ends.filter(|end| (from..to).contains(end)).count()
    }
}

/// What the load generator sends with, shared by its tasks.
struct Generator {
    http: reqwest::Client,
    target: Target,
    shape: Shape,
    start: Instant,
    sent: Mutex<Sent>,
    /// The timer probe's wake-ups, the late ones, and their lateness (µs).
    wakes: AtomicU64,
    late_wakes: AtomicU64,
    late_us: AtomicU64,
}

/// The machine at one moment: its CPU time, and the probe's wake-ups so far.
struct Snapshot {
    cpu: Option<CpuTimes>,
    wakes: u64,
    late_wakes: u64,
    late_us: u64,
}

impl Generator {
    fn now_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            cpu: CpuTimes::now(),
            wakes: self.wakes.load(Ordering::Relaxed),
            late_wakes: self.late_wakes.load(Ordering::Relaxed),
            late_us: self.late_us.load(Ordering::Relaxed),
        }
    }

    /// Sleeps a [`PROBE_PERIOD`] at a time, counting the wake-ups later than
    /// [`LATE_WAKE`] and their lateness: what a mock engine's steps meet on this machine
    /// now.
    async fn probe(&self) {
        loop {
            let due = tokio::time::Instant::now() + PROBE_PERIOD;
            tokio::time::sleep_until(due).await;
            self.wakes.fetch_add(1, Ordering::Relaxed);
            let late = due.elapsed();
            if late > LATE_WAKE {
                self.late_wakes.fetch_add(1, Ordering::Relaxed);
                self.late_us
                    .fetch_add(late.as_micros() as u64, Ordering::Relaxed);
            }
        }
    }

    /// Sends the next request and files what it measured.
    async fn request(&self) {
        let i = {
            let mut sent = self.sent.lock().expect("not poisoned");
            sent.at_ms.push(self.now_ms());
            sent.ended.push(None);
            sent.at_ms.len() - 1
        };
        let record = send(&self.http, &self.target, &self.shape.request(i), self.start).await;
        self.sent.lock().expect("not poisoned").ended[i] = Some(record);
    }
}

/// What the window measured.
struct Measured {
    /// The requests sent in the window.
    report: Report,
    warm_up_s: f64,
    window_s: f64,
    /// Requests that ended within the window, per second.
    completed_per_s: f64,
    /// What the CPUs did during the window, if known.
    cpu: Option<CpuUse>,
    /// The timer probe during the window: the share of its wake-ups that came late, and
    /// their lateness over all its wake-ups (what each step of a mock engine gathers).
    late_wakes: f64,
    late_ms_per_wake: f64,
    /// The load, for the table.
    offered: String,
}

/// Sends the request's load to `target` until the window's requests have all ended.
async fn measure(
    http: reqwest::Client,
    target: Target,
    shape: Shape,
    load: Load,
    predicted_e2e_ms: f64,
    window: Duration,
) -> anyhow::Result<Measured> {
    let state = Arc::new(Generator {
        http,
        target,
        shape,
        start: Instant::now(),
        sent: Mutex::default(),
        wakes: AtomicU64::new(0),
        late_wakes: AtomicU64::new(0),
        late_us: AtomicU64::new(0),
    });
    let mut tasks = JoinSet::new();
    let probe = state.clone();
    tasks.spawn(async move { probe.probe().await });
    let offered = match load {
        Load::Rate(rate) => {
            let state = state.clone();
            tasks.spawn(async move {
                let mut rng = StdRng::seed_from_u64(SEED);
                let mut requests = JoinSet::new();
                let mut at = Duration::ZERO;
                loop {
                    tokio::time::sleep_until((state.start + at).into()).await;
                    let state = state.clone();
                    requests.spawn(async move { state.request().await });
                    while requests.try_join_next().is_some() {}
                    at += Duration::from_secs_f64(exponential_gap_ms(&mut rng, rate) / 1000.0);
                }
            });
            format!("Poisson arrivals at {rate} req/s")
        }
        Load::Concurrency(clients) => {
            // Clients that start together stay in lock step (every request is the same
            // length); spread over one request's time, they see the steady mix of
            // prefills and decodes the simulation measures.
            let spread = Duration::from_secs_f64(predicted_e2e_ms / 1000.0);
            for k in 0..clients {
                let state = state.clone();
                tasks.spawn(async move {
                    tokio::time::sleep_until((state.start + spread * k / clients).into()).await;
                    loop {
                        state.request().await;
                    }
                });
            }
            let s = if clients == 1 { "" } else { "s" };
            format!("{clients} client{s} in a closed loop")
        }
    };
    let lock = || state.sent.lock().expect("not poisoned");
    let from = loop {
        tokio::time::sleep(POLL).await;
        if let Some(at) = lock().warm_end() {
            break at;
        }
    };
    let open = state.snapshot();
    let to = from + window.as_secs_f64() * 1000.0;
    tokio::time::sleep_until((state.start + Duration::from_secs_f64(to / 1000.0)).into()).await;
    let close = state.snapshot();
    let (records, completed) = loop {
        let done = {
            let sent = lock();
            let records = sent.window(from, to);
            records.map(|r| (r, sent.ended_within(from, to)))
        };
        if let Some(done) = done {
            break done;
        }
        tokio::time::sleep(POLL).await;
    };
    // Dropping the tasks cancels the requests still in flight; none of them is measured.
    drop(tasks);
    let window_s = window.as_secs_f64();
    let cpu = match (open.cpu, close.cpu) {
        (Some(a), Some(b)) => b.since(&a),
        _ => None,
    };
    let wakes = close.wakes.saturating_sub(open.wakes).max(1) as f64;
    let late_wakes = close.late_wakes.saturating_sub(open.late_wakes) as f64 / wakes;
    let late_ms_per_wake = close.late_us.saturating_sub(open.late_us) as f64 / 1000.0 / wakes;
    Ok(Measured {
        report: Report::from_records("measured", &records, window_s),
        warm_up_s: from / 1000.0,
        window_s,
        completed_per_s: completed as f64 / window_s,
        cpu,
        late_wakes,
        late_ms_per_wake,
        offered,
    })
}

/// CPU time so far (Linux's `/proc`), in ticks: the machine's, busy and in all, and that
/// of this process and its descendants (the load generator and the graph).
#[derive(Clone, Copy)]
struct CpuTimes {
    busy: u64,
    total: u64,
    ours: u64,
}

/// What the CPUs did during the window.
#[derive(Clone, Copy)]
struct CpuUse {
    cpus: usize,
    /// Shares of the machine's CPU time: busy, and spent by the graph and its load.
    busy: f64,
    ours: f64,
}

impl CpuTimes {
    fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().next()?.strip_prefix("cpu ")?;
        // user nice system idle iowait irq softirq steal: waiting on I/O is idle.
        let ticks: Vec<u64> = line
            .split_whitespace()
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let total: u64 = ticks.iter().sum();
        let idle = ticks.get(3)? + ticks.get(4)?;
        Some(Self {
            busy: total - idle,
            total,
            ours: tree_ticks(std::process::id())?,
        })
    }

    fn since(&self, earlier: &Self) -> Option<CpuUse> {
        let total = self.total.checked_sub(earlier.total).filter(|t| *t > 0)? as f64;
        Some(CpuUse {
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            busy: self.busy.saturating_sub(earlier.busy) as f64 / total,
            ours: self.ours.saturating_sub(earlier.ours) as f64 / total,
        })
    }
}

/// User and system ticks of process `root` and every process descended from it.
fn tree_ticks(root: u32) -> Option<u64> {
    let mut procs = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // The fields after the command's closing parenthesis: state, ppid, ... then
        // utime and stime, the 12th and 13th.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        if let (Some(ppid), Some(utime), Some(stime)) = (number(1), number(11), number(12)) {
            procs.push((pid, ppid as u32, utime + stime));
        }
    }
    let mut tree = vec![root];
    let mut grew = true;
    while grew {
        grew = false;
        for (pid, ppid, _) in &procs {
            if tree.contains(ppid) && !tree.contains(pid) {
                tree.push(*pid);
                grew = true;
            }
        }
    }
    Some(
        procs
            .iter()
            .filter(|(pid, _, _)| tree.contains(pid))
            .map(|(_, _, ticks)| ticks)
            .sum(),
    )
}

impl Measured {
    /// The run in words, the table of predicted against measured, and what to make of it.
    fn table(&self, req: &Request, predicted: &Candidate) -> String {
        let r = &self.report;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "verify: {}, ISL {} OSL {}: {:.1} s of warm-up, then {} requests sent in {:.1} s \
             measured ({} failed)",
            self.offered, req.isl, req.osl, self.warm_up_s, r.requests, self.window_s, r.errors
        );
        let _ = writeln!(
            out,
            "  {:<8} {:>10} {:>10} {:>10} {:>10}  measured/predicted",
            "", "predicted", "measured", "p50", "p90"
        );
        let rows = [
            ("TTFT ms", predicted.ttft_ms, &r.ttft_ms, 1),
            ("ITL ms", predicted.itl_ms, &r.itl_ms, 2),
            ("E2E ms", predicted.e2e_ms, &r.e2e_ms, 0),
        ];
        for (what, p, m, digits) in rows {
            let _ = writeln!(
                out,
                "  {what:<8} {p:>10.digits$} {:>10.digits$} {:>10.digits$} {:>10.digits$}  {:.2}",
                m.mean,
                m.p50,
                m.p90,
                m.mean / p
            );
        }
        let _ = writeln!(
            out,
            "  {:<8} {:>10.2} {:>10.2} {:>10} {:>10}  {:.2}",
            "req/s",
            predicted.requests_per_s,
            self.completed_per_s,
            "",
            "",
            self.completed_per_s / predicted.requests_per_s
        );
        let late_share = self.late_ms_per_wake / predicted.itl_ms;
        let _ = write!(
            out,
            "verify: while measuring, a {} ms timer woke more than {} ms late {:.1}% of the \
             time, {:.2} ms a wake-up on average ({:.1}% of the predicted ITL)",
            PROBE_PERIOD.as_millis(),
            LATE_WAKE.as_millis(),
            self.late_wakes * 100.0,
            self.late_ms_per_wake,
            late_share * 100.0
        );
        if let Some(cpu) = self.cpu {
            let _ = write!(
                out,
                "; the machine's {} CPUs were {:.0}% busy, {:.0}% for the graph and its load",
                cpu.cpus,
                cpu.busy * 100.0,
                cpu.ours * 100.0
            );
        }
        if late_share > LATE_SHARE {
            let _ = write!(
                out,
                ": a mock engine's step that starts that late stays late, which lengthens ITL \
                 and TTFT{}",
                match self.cpu {
                    Some(cpu) if cpu.ours > cpu.busy / 2.0 => {
                        "; the graph and its load take most of the CPU time: more cores measure \
                         the model better"
                    }
                    Some(_) => {
                        "; other processes take most of the CPU time: a quieter machine measures \
                         the model better"
                    }
                    None => "",
                }
            );
        }
        out.push('\n');
        if r.requests < FEW_REQUESTS {
            let _ = writeln!(
                out,
                "verify: only {} requests measured: a longer --verify-duration measures more",
                r.requests
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(sent_ms: f64, e2e_ms: f64) -> Option<RequestRecord> {
        Some(RequestRecord {
            sent_ms,
            e2e_ms,
            ..RequestRecord::default()
        })
    }

    #[test]
    fn the_window_opens_when_the_warm_up_requests_have_all_ended() {
        let mut sent = Sent {
            at_ms: vec![0.0, 10.0, 50.0, 120.0, 130.0],
            ended: vec![ended(0.0, 100.0), None, ended(50.0, 40.0), None, None],
        };
        // The first end is at 90 ms; the request sent at 10 ms is still running.
        assert_eq!(sent.warm_end(), None);
        sent.ended[1] = ended(10.0, 150.0);
        assert_eq!(sent.warm_end(), Some(160.0));
        // The window's requests, once they have all ended.
        assert!(sent.window(100.0, 200.0).is_none());
        sent.ended[3] = ended(120.0, 60.0);
        sent.ended[4] = ended(130.0, 100.0);
        let window = sent.window(100.0, 200.0).unwrap();
        assert_eq!(window.len(), 2);
        // Ended at 100, 160 and 180 ms (the others at 90 and 230).
        assert_eq!(sent.ended_within(100.0, 200.0), 3);
    }

    #[test]
    fn disaggregated_engines_copy_a_share_of_the_kv_bytes() {
        let spec = serde_json::from_value(serde_json::json!({
            "model": "Qwen/Qwen3-0.6B",
            "workload": {"isl": 1000, "osl": 100, "requestRate": 1},
            "features": {"planner": {}},
        }))
        .unwrap();
        let req = Request {
            backend: BackendFramework::Mocker,
            planner: false,
            ..dynamo_profiler::request::resolve(&spec, None).unwrap()
        };
        let engines = dynamo_profiler::Engines::new;
        let layout = Layout::Disaggregated {
            prefill: engines(1, 2),
            decode: engines(2, 1),
        };
        let selected = Candidate {
            layout,
            gpus: layout.gpus(),
            ttft_ms: 20.0,
            itl_ms: 5.0,
            e2e_ms: 515.0,
            requests_per_s: 1.0,
            throughput_per_gpu: 25.0,
            overloaded: false,
            meets_sla: true,
        };
        let dgd = mock_graph("g", &req, &selected);
        let services = &dgd.spec.services;
        assert!(!services.contains_key("planner"));
        for (role, replicas, tp) in [("prefill", 2, "1"), ("decode", 1, "2")] {
            assert_eq!(services[role].replicas, Some(replicas));
            let main = services[role]
                .extra_pod_spec
                .as_ref()
                .and_then(|p| p.main_container.as_ref())
                .unwrap();
            assert_eq!(
                main.command.as_deref(),
                Some(&["dynamo-mocker".to_owned()][..])
            );
            let args = main.args.as_deref().unwrap();
            assert!(args.windows(2).any(|w| w == ["--perf-model", "hardware"]));
            assert!(args.windows(2).any(|w| w == ["--tensor-parallel-size", tp]));
            assert!(args.ends_with(&["--kv-bytes-scale".into(), KV_BYTES_SCALE.into()]));
        }
    }
}
