//! `dynamo-e2e overhead`: the CPU the serving path spends per request, process by process.
//!
//! One engine (the mock engine with no simulated time, so that every request is as
//! cheap as the engine can make it), its sidecar and the endpoint picker in front, each
//! the real binary; a closed loop of clients sends small chat requests (a prompt of a few
//! words, a few output tokens), streamed or not, for a warm-up and then a measured window.
//! Each process's CPU time (`utime + stime` of `/proc/<pid>/stat`, every thread,
//! user and kernel) is read at both ends of the window and divided by the requests that
//! completed within it. This is the side-by-side probe of the Dynamo reference kit
//! (`overhead.sh`: wrk with `chat.lua`, `cpu_sampler.py`), with our load generator.
//!
//! The machine's other users and the load generator itself share its cores: the figures
//! are CPU per request, not a throughput limit (req/s is reported beside them).

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use dynamo_kvcache::RouterMode;
use dynamo_loadgen::client::{Api, RequestRecord, Target, Words, send, send_whole};
use dynamo_loadgen::launch::Launched;
use dynamo_loadgen::workload::{PROMPT_VOCAB, WorkItem};
use dynamo_mocker::replay::Percentiles;
use dynamo_mocker::tokens::{stream_key, token_at};
use dynamo_server::free_port;
use serde::Serialize;
use tokio::task::JoinSet;

/// How long a process gets to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Tokens per KV block of the engine, the sidecar and the picker alike (the mock
/// engine's default, as `dynamo run` passes it to the other two).
const BLOCK_SIZE: usize = 64;

/// How the answers come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Delivery {
    /// Server-sent events, one chunk per token (`stream: true`).
    Streamed,
    /// One JSON answer (`stream: false`).
    Whole,
}

/// What to start and how to load it.
#[derive(Clone, Debug, Serialize)]
pub struct Setup {
    /// Where `dynamo-mocker`, `dynamo-sidecar` and `dynamo-epp` are.
    pub bin_dir: PathBuf,
    pub model_path: PathBuf,
    pub model_name: String,
    pub router_mode: RouterMode,
    /// The mock engine's `--speedup-ratio`.
    pub speedup_ratio: f64,
    /// Clients in the closed loop.
    pub concurrency: usize,
    /// Words of each prompt (one token each).
    pub prompt_words: usize,
    pub output_tokens: usize,
    /// Load before each measured window, s.
    pub warmup_s: f64,
    /// Each measured window, s.
    pub window_s: f64,
    pub deliveries: Vec<Delivery>,
    pub seed: u64,
    #[serde(skip)]
    pub request_timeout: Duration,
    #[serde(skip)]
    pub health_timeout: Duration,
}

/// One process's share of a window.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessCpu {
    /// `picker`, `sidecar`, `engine`, or `load generator` (this process).
    pub role: &'static str,
    pub cpu_s: f64,
    /// CPU seconds per second of the window.
    pub cores: f64,
    /// CPU milliseconds per completed request.
    pub ms_per_request: f64,
}

/// The figures of one measured window.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadRun {
    pub delivery: Delivery,
    /// Requests answered in full within the window.
    pub requests: u64,
    /// Requests that failed within the window.
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub window_s: f64,
    pub requests_per_s: f64,
    /// Sending to the end of the answer, of the window's requests.
    pub e2e_ms: Percentiles,
    pub processes: Vec<ProcessCpu>,
    /// Busy CPU of the whole machine (every process, ours included), in cores.
    pub machine_busy_cores: f64,
}

/// Every window of one launch of the graph.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadReport {
    pub kind: &'static str,
    pub title: String,
    pub setup: Setup,
    /// Cores of the machine (`available_parallelism`).
    pub machine_cores: usize,
    pub runs: Vec<OverheadRun>,
}

/// The engine, its sidecar and the picker, started in that order (each healthy before
/// the next), stopped in the other.
struct Graph {
    picker: Launched,
    sidecar: Launched,
    engine: Launched,
    url: String,
}

impl Graph {
    async fn start(setup: &Setup, http: &reqwest::Client) -> anyhow::Result<Self> {
        let bin = |name: &str| -> anyhow::Result<Command> {
            let path = setup.bin_dir.join(name);
            anyhow::ensure!(
                path.is_file(),
                "{} is missing: build it (cargo build --release -p dynamo-epp -p dynamo-sidecar -p dynamo-mocker) or give --bin-dir",
                path.display()
            );
            Ok(Command::new(path))
        };
        let model_path = setup.model_path.to_string_lossy().into_owned();
        let block_size = BLOCK_SIZE.to_string();
        let (engine_port, kv_events_port) = (free_port()?, free_port()?);
        let (sidecar_port, grpc_port, metrics_port) = (free_port()?, free_port()?, free_port()?);
        let (picker_port, ext_proc_port) = (free_port()?, free_port()?);
        let kv_events = format!("tcp://127.0.0.1:{kv_events_port}");

        let mut engine = bin("dynamo-mocker")?;
        engine.args([
            "--model-path",
            &model_path,
            "--model-name",
            &setup.model_name,
        ]);
        engine.args(["--host", "127.0.0.1", "--port", &engine_port.to_string()]);
        engine.args([
            "--block-size",
            &block_size,
            "--kv-events-endpoint",
            &kv_events,
        ]);
        engine.args(["--speedup-ratio", &setup.speedup_ratio.to_string()]);
        let engine = start(
            engine,
            http,
            &format!("http://127.0.0.1:{engine_port}"),
            setup,
        )
        .await?;

        let mut sidecar = bin("dynamo-sidecar")?;
        sidecar.args(["--listen", &format!("127.0.0.1:{sidecar_port}")]);
        sidecar.args(["--engine-url", &format!("http://127.0.0.1:{engine_port}")]);
        sidecar.args(["--engine-kv-events", &kv_events]);
        sidecar.args(["--host", "127.0.0.1", "--grpc-port", &grpc_port.to_string()]);
        sidecar.args(["--metrics-port", &metrics_port.to_string()]);
        sidecar.args([
            "--model-name",
            &setup.model_name,
            "--block-size",
            &block_size,
        ]);
        let sidecar = start(
            sidecar,
            http,
            &format!("http://127.0.0.1:{metrics_port}"),
            setup,
        )
        .await?;

        let mut picker = bin("dynamo-epp")?;
        picker.args([
            "--model-path",
            &model_path,
            "--model-name",
            &setup.model_name,
        ]);
        picker.args([
            "--host",
            "127.0.0.1",
            "--http-port",
            &picker_port.to_string(),
        ]);
        picker.args(["--ext-proc-port", &ext_proc_port.to_string()]);
        // The model is the picker's own directory: no model card to read.
        picker.args(["--model-card-port", "0"]);
        picker.args(["--endpoints", &format!("127.0.0.1:{sidecar_port}")]);
        picker.args(["--kv-events-port", &grpc_port.to_string()]);
        picker.args(["--block-size", &block_size]);
        picker.args(["--router-mode", setup.router_mode.as_str()]);
        let url = format!("http://127.0.0.1:{picker_port}");
        let picker = start(picker, http, &url, setup).await?;
        Ok(Self {
            picker,
            sidecar,
            engine,
            url,
        })
    }

    /// The processes measured, by role.
    fn pids(&self) -> [(&'static str, u32); 3] {
        [
            ("picker", self.picker.pid()),
            ("sidecar", self.sidecar.pid()),
            ("engine", self.engine.pid()),
        ]
    }

    async fn stop(self) -> anyhow::Result<()> {
        for process in [self.picker, self.sidecar, self.engine] {
            process.stop(STOP_GRACE).await?;
        }
        Ok(())
    }
}

/// Starts `program` and waits for its `GET {base_url}/health`.
async fn start(
    program: Command,
    http: &reqwest::Client,
    base_url: &str,
    setup: &Setup,
) -> anyhow::Result<Launched> {
    let line = std::iter::once(program.get_program())
        .chain(program.get_args())
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let mut process = Launched::spawn(program, line)?;
    process
        .wait_healthy(http, base_url, setup.health_timeout)
        .await?;
    Ok(process)
}

/// CPU seconds `pid` has used so far, every thread, user and kernel (`proc(5)`:
/// `utime` and `stime`, fields 14 and 15 of `/proc/<pid>/stat`, in clock ticks).
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_cpu_ticks(&stat)
        .map(|ticks| ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
        .with_context(|| format!("{path} has no utime and stime: {stat}"))
}

/// `utime + stime` of a `/proc/<pid>/stat` line. The command name (field 2, in
/// parentheses) may hold spaces and parentheses: fields are counted after its last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11); // fields 3 to 13
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Busy and total CPU time of the machine so far (the `cpu` line of `/proc/stat`, in
/// ticks: busy is all but `idle` and `iowait`).
fn machine_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    parse_machine_ticks(&stat).context("/proc/stat has no cpu line")
}

fn parse_machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8) // user nice system idle iowait irq softirq steal
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let total: u64 = ticks.iter().sum();
    Some((total - ticks.get(3)? - ticks.get(4)?, total))
}

/// The CPU of every process, and the machine's, at one instant.
struct Sample {
    at: Instant,
    cpu_s: Vec<(&'static str, f64)>,
    machine: (u64, u64),
}

fn sample(pids: &[(&'static str, u32)]) -> anyhow::Result<Sample> {
    let cpu_s = pids
        .iter()
        .map(|&(role, pid)| Ok((role, cpu_seconds(pid)?)))
        .collect::<anyhow::Result<_>>()?;
    Ok(Sample {
        at: Instant::now(),
        cpu_s,
        machine: machine_ticks()?,
    })
}

/// Request `i`: `words` words of the model's vocabulary, none shared with other requests
/// beyond chance.
fn request(setup: &Setup, i: u64) -> WorkItem {
    let key = stream_key(setup.seed, i);
    WorkItem {
        token_ids: (0..setup.prompt_words as u64)
            .map(|pos| token_at(key, pos, PROMPT_VOCAB))
            .collect(),
        max_tokens: setup.output_tokens,
    }
}

/// A request that ended: when, and how.
struct Ended {
    at: Instant,
    record: RequestRecord,
}

/// Keeps `setup.concurrency` requests in flight until `stop` is raised; each client's
/// requests, as they ended.
fn closed_loop(
    setup: &Arc<Setup>,
    http: &reqwest::Client,
    target: &Arc<Target>,
    delivery: Delivery,
    stop: &Arc<AtomicBool>,
) -> JoinSet<Vec<Ended>> {
    let mut clients = JoinSet::new();
    let first = Instant::now();
    for client in 0..setup.concurrency {
        let (setup, http, target, stop) =
            (setup.clone(), http.clone(), target.clone(), stop.clone());
        clients.spawn(async move {
            let mut ended = Vec::new();
            // Client c sends requests c, c + n, c + 2n...: all different.
            let mut i = client as u64;
            while !stop.load(Ordering::Relaxed) {
                let item = request(&setup, i);
                let record = match delivery {
                    Delivery::Streamed => send(&http, &target, &item, first).await,
                    Delivery::Whole => send_whole(&http, &target, &item, first).await,
                };
                ended.push(Ended {
                    at: Instant::now(),
                    record,
                });
                i += setup.concurrency as u64;
            }
            ended
        });
    }
    clients
}

/// One window: warm-up, measure, then let the clients finish their last requests.
async fn measure(
    setup: &Arc<Setup>,
    http: &reqwest::Client,
    target: &Arc<Target>,
    pids: &[(&'static str, u32)],
    delivery: Delivery,
) -> anyhow::Result<OverheadRun> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = closed_loop(setup, http, target, delivery, &stop);
    tokio::time::sleep(Duration::from_secs_f64(setup.warmup_s)).await;
    let before = sample(pids)?;
    tokio::time::sleep(Duration::from_secs_f64(setup.window_s)).await;
    let after = sample(pids)?;
    stop.store(true, Ordering::Relaxed);
    let mut ended = Vec::new();
    while let Some(done) = clients.join_next().await {
        ended.extend(done?);
    }
    let within: Vec<&RequestRecord> = ended
        .iter()
        .filter(|e| e.at > before.at && e.at <= after.at)
        .map(|e| &e.record)
        .collect();
    let failed: Vec<&RequestRecord> = within
        .iter()
        .copied()
        .filter(|r| r.error.is_some())
        .collect();
    let requests = (within.len() - failed.len()) as u64;
    let window_s = (after.at - before.at).as_secs_f64();
    let per_request = |cpu_s: f64| 1000.0 * cpu_s / requests.max(1) as f64;
    let processes = before
        .cpu_s
        .iter()
        .zip(&after.cpu_s)
        .map(|(&(role, start), &(_, end))| {
            let cpu_s = end - start;
            ProcessCpu {
                role,
                cpu_s,
                cores: cpu_s / window_s,
                ms_per_request: per_request(cpu_s),
            }
        })
        .collect();
    let (busy, total) = (
        after.machine.0 - before.machine.0,
        after.machine.1 - before.machine.1,
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut e2e: Vec<f64> = within
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| r.e2e_ms)
        .collect();
    let mut error_samples: Vec<String> = failed.iter().filter_map(|r| r.error.clone()).collect();
    error_samples.dedup();
    error_samples.truncate(3);
    Ok(OverheadRun {
        delivery,
        requests,
        errors: failed.len() as u64,
        error_samples,
        window_s,
        requests_per_s: requests as f64 / window_s,
        e2e_ms: Percentiles::of(&mut e2e),
        processes,
        machine_busy_cores: cores as f64 * busy as f64 / total.max(1) as f64,
    })
}

/// Starts the graph, measures a window per delivery, stops the graph.
pub async fn run(setup: Setup, words: Words) -> anyhow::Result<OverheadReport> {
    anyhow::ensure!(setup.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(
        setup.prompt_words > 0 && setup.output_tokens > 0,
        "--prompt-words and --output-tokens must be at least 1"
    );
    for (flag, s) in [
        ("--warmup-s", setup.warmup_s),
        ("--duration-s", setup.window_s),
    ] {
        anyhow::ensure!(s.is_finite() && s >= 0.0, "{flag} must be >= 0");
    }
    anyhow::ensure!(setup.window_s > 0.0, "--duration-s must be positive");
    anyhow::ensure!(!setup.deliveries.is_empty(), "--deliveries names none");
    let http = reqwest::Client::builder()
        .timeout(setup.request_timeout)
        .tcp_nodelay(true)
        .pool_max_idle_per_host(setup.concurrency)
        .build()?;
    let graph = Graph::start(&setup, &http).await?;
    let target = Arc::new(Target {
        base_url: graph.url.clone(),
        model: setup.model_name.clone(),
        api: Api::Chat,
        words: Some(Arc::new(words)),
    });
    let me = std::process::id();
    let mut pids = graph.pids().to_vec();
    pids.push(("load generator", me));
    let setup = Arc::new(setup);
    let mut runs = Vec::new();
    let measured = async {
        for &delivery in &setup.deliveries {
            let run = measure(&setup, &http, &target, &pids, delivery).await?;
            eprintln!(
                "overhead {delivery:?}: {} requests in {:.1} s ({} failed)",
                run.requests, run.window_s, run.errors
            );
            runs.push(run);
        }
        anyhow::Ok(())
    };
    let outcome = measured.await;
    graph.stop().await?;
    outcome?;
    let setup = Arc::unwrap_or_clone(setup);
    let title = format!(
        "CPU per request: one mock engine (speedup {}), its sidecar, the picker ({} routing); {} clients in a closed loop, chat prompts of {} words, {} output tokens; {:.0} s warm-up, {:.0} s window",
        setup.speedup_ratio,
        setup.router_mode,
        setup.concurrency,
        setup.prompt_words,
        setup.output_tokens,
        setup.warmup_s,
        setup.window_s,
    );
    Ok(OverheadReport {
        kind: "overhead",
        title,
        setup,
        machine_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        runs,
    })
}

/// The report as Markdown: one row per window.
pub fn markdown(report: &OverheadReport) -> String {
    let roles: Vec<&str> = report
        .runs
        .first()
        .map(|r| r.processes.iter().map(|p| p.role).collect())
        .unwrap_or_default();
    let mut md = format!("### {}\n\n", report.title);
    md.push_str("| answers | req/s | requests | errors | e2e p50 ms |");
    for role in &roles {
        md.push_str(&format!(" {role} CPU ms/req |"));
    }
    md.push_str(" machine busy cores |\n|---|---|---|---|---|");
    md.push_str(&"---|".repeat(roles.len()));
    md.push_str("---|\n");
    for r in &report.runs {
        md.push_str(&format!(
            "| {} | {:.0} | {} | {} | {:.1} |",
            match r.delivery {
                Delivery::Streamed => "streamed",
                Delivery::Whole => "whole",
            },
            r.requests_per_s,
            r.requests,
            r.errors,
            r.e2e_ms.p50
        ));
        for p in &r.processes {
            md.push_str(&format!(
                " {:.3} ({:.2} cores) |",
                p.ms_per_request, p.cores
            ));
        }
        md.push_str(&format!(
            " {:.2} of {} |\n",
            r.machine_busy_cores, report.machine_cores
        ));
    }
    for r in report.runs.iter().filter(|r| !r.error_samples.is_empty()) {
        md.push_str(&format!(
            "\n{:?} errors: {}\n",
            r.delivery,
            r.error_samples.join("; ")
        ));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_lines_are_read_past_odd_command_names() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
        // cmajflt utime stime ...
        let line = "4242 (tokio (x) y) S 1 4242 4242 0 -1 4194560 900 0 3 0 1234 56 0 0 20 0 9 0";
        assert_eq!(parse_cpu_ticks(line), Some(1290));
        assert_eq!(parse_cpu_ticks("4242 (x) S 1"), None);
        let stat = "cpu  100 5 50 1000 20 3 2 0 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n";
        assert_eq!(parse_machine_ticks(stat), Some((160, 1180)));
        assert_eq!(parse_machine_ticks("intr 1\n"), None);
    }

    #[test]
    fn requests_differ_and_are_as_long_as_asked() {
        let setup = Setup {
            bin_dir: PathBuf::new(),
            model_path: PathBuf::new(),
            model_name: "m".into(),
            router_mode: RouterMode::Kv,
            speedup_ratio: 1000.0,
            concurrency: 2,
            prompt_words: 20,
            output_tokens: 16,
            warmup_s: 0.0,
            window_s: 1.0,
            deliveries: vec![Delivery::Streamed],
            seed: 0,
            request_timeout: Duration::from_secs(1),
            health_timeout: Duration::from_secs(1),
        };
        let (a, b) = (request(&setup, 0), request(&setup, 1));
        assert_eq!((a.token_ids.len(), a.max_tokens), (20, 16));
        assert_ne!(a.token_ids, b.token_ids);
        assert_eq!(a, request(&setup, 0));
    }
}
