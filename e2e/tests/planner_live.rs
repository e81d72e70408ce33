//! The planner in a live local graph: `dynamo run` starts mocker workers, the endpoint
//! picker, a real Prometheus (Debian's `prometheus`, which must be on PATH) scraping them,
//! and `dynamo planner` against the runner's admin API; the tests put load on the
//! frontend and watch the planner scale the worker through `GET /graph` and its own
//! `/metrics`, then break Prometheus.
//!
//! The graphs plan every 3 s and their workers are small (a quarter of the modelled
//! GPU's speed, 4 sequences at once), so a few requests a second overload one worker.
//! Every wait polls with a deadline; the deadlines are far beyond what the planner needs,
//! so only a planner that does not act fails them.

#[allow(dead_code)] // the fixture serves several test binaries, each using a part
mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dynamo_loadgen::client::{Api, Target, send};
use dynamo_loadgen::workload::WorkItem;
use rustix::process::{Pid, Signal, kill_process};
use support::{LocalGraph, get_text, metric_sum};
use tokio::task::JoinHandle;

/// How long any one expected change may take: many planner intervals, a replica's start
/// and a busy 2-core machine included.
const DEADLINE: Duration = Duration::from_secs(120);

/// The worker: a quarter of the modelled GPU's speed and 4 sequences at once, so a few
/// requests a second are more than one worker serves (its profile, which the runner
/// measures from these flags, says so too).
const WORKER_ARGS: &[&str] = &[
    "--model-name",
    "Qwen/Qwen3-0.6B",
    "--num-gpu-blocks",
    "512",
    "--max-num-seqs",
    "4",
    "--speedup-ratio",
    "0.25",
];

/// Planner flags every graph here shares: a decision every 3 s, at most 3 workers (each
/// is two processes on this machine), scale-downs two intervals after the last ask for
/// more.
const PLANNER_ARGS: &[&str] = &[
    "--interval",
    "3s",
    "--max-gpu-budget",
    "3",
    "--scale-down-window",
    "6s",
];

/// The first decision 2 s (and one interval) after the planner starts.
const SOON: &[&str] = &["--startup-delay", "2s"];

/// A local graph with a planner, its file removed when dropped.
struct PlannerGraph {
    graph: LocalGraph,
    file: PathBuf,
    planner_metrics: String,
}

impl PlannerGraph {
    /// Runs an aggregated mocker graph of `workers` workers whose planner also takes the
    /// flags of `planner`, and waits until the planner serves its metrics.
    async fn start(name: &str, workers: u32, planner: &[&[&str]]) -> Self {
        Self::with_picker(name, workers, &[], planner).await
    }

    /// [`PlannerGraph::start`], the picker taking the flags of `picker` too.
    async fn with_picker(name: &str, workers: u32, picker: &[&str], planner: &[&[&str]]) -> Self {
        // The runner refuses a graph with a planner without it; say so at once rather
        // than after the fixture's health deadline.
        assert!(
            std::process::Command::new("prometheus")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success()),
            "these tests run a real Prometheus: install it (Debian and Ubuntu: `apt-get install prometheus`)"
        );
        let list = |words: &[&str]| {
            words
                .iter()
                .map(|w| format!("\"{w}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let planner_args: Vec<&str> = PLANNER_ARGS
            .iter()
            .chain(planner.iter().copied().flatten())
            .copied()
            .collect();
        let yaml = format!(
            "apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata:
  name: {name}
spec:
  backendFramework: mocker
  services:
    epp:
      componentType: epp
      extraPodSpec:
        mainContainer:
          args: [{}]
    planner:
      componentType: planner
      extraPodSpec:
        mainContainer:
          command: [dynamo, planner]
          args: [{}]
    worker:
      componentType: worker
      replicas: {workers}
      extraPodSpec:
        mainContainer:
          command: [dynamo-mocker]
          args: [{}]
",
            list(picker),
            list(&planner_args),
            list(WORKER_ARGS)
        );
        let file = std::env::temp_dir().join(format!(
            "dynamo-planner-live-{}-{name}.yaml",
            std::process::id()
        ));
        std::fs::write(&file, yaml).unwrap();
        let graph = LocalGraph::start(file.to_str().unwrap(), &[]).await;
        let mut planner_graph = Self {
            graph,
            file,
            planner_metrics: String::new(),
        };
        let status = planner_graph.graph.graph().await;
        planner_graph.planner_metrics = status["planner"]["metrics"]
            .as_str()
            .unwrap_or_else(|| panic!("GET /graph names the planner: {status}"))
            .to_owned();
        planner_graph
            .until("the planner serves its metrics", async |g| {
                g.planner_text().await.is_some()
            })
            .await;
        planner_graph
    }

    /// The planner's `/metrics`, or `None` while it does not answer.
    async fn planner_text(&self) -> Option<String> {
        let response = reqwest::get(&self.planner_metrics).await.ok()?;
        response.text().await.ok()
    }

    async fn planner(&self) -> Planner {
        let text = self
            .planner_text()
            .await
            .expect("the planner answers /metrics");
        Planner {
            desired: metric_sum(
                &text,
                "dynamo_planner_desired_replicas",
                &[("service", "worker")],
            ),
            reasons: metric_sum(&text, "dynamo_planner_decisions_total", &[]),
            sized: metric_sum(
                &text,
                "dynamo_planner_decisions_total",
                &[("reason", "throughput")],
            ),
            missing_input: metric_sum(
                &text,
                "dynamo_planner_decisions_total",
                &[("reason", "missing_input")],
            ),
            writes: metric_sum(&text, "dynamo_planner_scale_writes_total", &[]),
        }
    }

    /// The worker's replicas, as `GET /graph` lists them.
    async fn replicas(&self) -> usize {
        self.worker_replicas().await.len()
    }

    /// The worker's replicas that serve (their sidecar answers `/ready`).
    async fn ready_replicas(&self) -> usize {
        let list = self.worker_replicas().await;
        list.iter().filter(|r| r["ready"] == true).count()
    }

    async fn worker_replicas(&self) -> Vec<serde_json::Value> {
        let status = self.graph.graph().await;
        status["services"]["worker"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits for `n` more decisions that sized the worker from the traffic.
    async fn sized_decisions(&self, n: f64) {
        let seen = self.planner().await.sized;
        self.until(&format!("{n} more sizing decisions"), async |g| {
            g.planner().await.sized >= seen + n
        })
        .await;
    }

    /// Polls `cond` every 250 ms until it holds; fails after [`DEADLINE`] with the
    /// planner's and the runner's own lines.
    async fn until(&self, what: &str, mut cond: impl AsyncFnMut(&Self) -> bool) {
        let start = Instant::now();
        while start.elapsed() < DEADLINE {
            if cond(self).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!(
            "{what}: not within {DEADLINE:?}\nplanner metrics:\n{}\nrunner log (planner, Prometheus, runner):\n{}",
            self.planner_text().await.unwrap_or_default(),
            self.log()
        );
    }

    /// The end of the run's log: the runner's own lines, the planner's and Prometheus'
    /// (children's lines are `NAME | line`).
    fn log(&self) -> String {
        let text = self.graph.log_text();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| match l.split_once(" | ") {
                None => true,
                Some((name, _)) => matches!(name.trim(), "planner" | "prometheus"),
            })
            .collect();
        lines[lines.len().saturating_sub(80)..].join("\n")
    }
}

impl Drop for PlannerGraph {
    fn drop(&mut self) {
        std::fs::remove_file(&self.file).ok();
    }
}

/// What the planner's `/metrics` says.
#[derive(Debug)]
struct Planner {
    /// `dynamo_planner_desired_replicas` of the worker service (0 before any decision).
    desired: f64,
    /// Every decision's reasons, counted (a decision may give several).
    reasons: f64,
    /// Decisions that sized the worker from the traffic (one `throughput` reason each).
    sized: f64,
    /// Decisions held for missing input (their only reason).
    missing_input: f64,
    writes: f64,
}

/// The fewest and most worker replicas `GET /graph` listed while it ran.
struct ReplicaWatch {
    stop: Arc<AtomicBool>,
    task: JoinHandle<(usize, usize)>,
}

impl ReplicaWatch {
    fn start(graph: &PlannerGraph) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let url = graph.graph.admin("/graph");
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut least, mut most) = (usize::MAX, 0);
            while !flag.load(Ordering::Relaxed) {
                if let Ok(response) = reqwest::get(&url).await
                    && let Ok(status) = response.json::<serde_json::Value>().await
                {
                    let n = status["services"]["worker"].as_array().map_or(0, Vec::len);
                    least = least.min(n);
                    most = most.max(n);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (least, most)
        });
        Self { stop, task }
    }

    async fn finish(self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Streamed completions against the frontend until stopped: `rate` new requests a
/// second whatever the graph's answers (open loop: the backlog of an overloaded graph
/// grows, as real traffic's would), or `concurrency` requests always in flight.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

enum Shape {
    Rate(f64),
    Concurrency(usize),
}

impl Load {
    fn start(graph: &PlannerGraph, shape: Shape) -> Self {
        let target = Arc::new(Target {
            base_url: graph.graph.url(""),
            model: graph.graph.model.clone(),
            api: Api::Completions,
            words: None,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let (flag, count) = (stop.clone(), sent.clone());
        let task = tokio::spawn(async move {
            let http = reqwest::Client::new();
            let started = Instant::now();
            // 128 prompt tokens, distinct per request, and 64 tokens of answer.
            let one = move |i: usize| {
                let (http, target) = (http.clone(), target.clone());
                let item = WorkItem {
                    token_ids: (0..128)
                        .map(|t| 1000 + ((i * 131 + t) % 20000) as u32)
                        .collect(),
                    max_tokens: 64,
                };
                async move {
                    // Answers do not matter here (a replica scaled away may cut one off).
                    send(&http, &target, &item, started).await;
                }
            };
            match shape {
                Shape::Rate(rate) => {
                    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
                    let mut i = 0;
                    while !flag.load(Ordering::Relaxed) {
                        tick.tick().await;
                        tokio::spawn(one(i));
                        count.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                }
                Shape::Concurrency(n) => {
                    let clients = (0..n).map(|c| {
                        let (flag, count, one) = (flag.clone(), count.clone(), one.clone());
                        tokio::spawn(async move {
                            let mut i = c;
                            while !flag.load(Ordering::Relaxed) {
                                one(i).await;
                                count.fetch_add(1, Ordering::Relaxed);
                                i += n;
                            }
                        })
                    });
                    futures::future::join_all(clients.collect::<Vec<_>>()).await;
                }
            }
        });
        Self { stop, sent, task }
    }

    /// Stops sending; requests in flight run on.
    fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.task.abort();
        self.sent.load(Ordering::Relaxed)
    }
}

/// Under more requests than one worker serves, the planner sizes the worker up from its
/// profile (measured by the runner from the worker's own flags); when they stop, it
/// brings it back to one, and never below.
#[tokio::test(flavor = "multi_thread")]
async fn throughput_mode_scales_up_under_load_and_back_down_to_one() {
    let g = PlannerGraph::start(
        "planner-throughput",
        1,
        &[SOON, &["--predictor", "constant"]],
    )
    .await;
    let watch = ReplicaWatch::start(&g);
    let load = Load::start(&g, Shape::Rate(4.0));
    g.until("the planner wants a second worker", async |g| {
        g.planner().await.desired >= 2.0
    })
    .await;
    g.until("the graph serves on more than one worker", async |g| {
        g.ready_replicas().await >= 2
    })
    .await;
    // The same load, sized again on the grown graph: it keeps the workers it needs.
    g.sized_decisions(2.0).await;
    let loaded = g.planner().await;
    assert!(loaded.desired >= 2.0, "{loaded:?}");
    assert!(g.replicas().await >= 2);
    let sent = load.stop();
    assert!(sent > 0);
    g.until("the planner brings the worker back to one", async |g| {
        g.planner().await.desired == 1.0 && g.replicas().await == 1
    })
    .await;
    // Two more decisions of an idle graph: it stays at one.
    g.sized_decisions(2.0).await;
    assert_eq!(g.replicas().await, 1);
    assert_eq!(g.planner().await.desired, 1.0);
    let (least, most) = watch.finish().await;
    assert!(least >= 1, "the worker went down to {least} replicas");
    assert!(most >= 2, "{most}");
}

/// Load mode: a queue of prompts (more requests in flight than the worker runs at once)
/// adds a worker; an idle graph loses them again, down to one. The picker holds what
/// its worker has no room for (about 4 requests' blocks, its 4 sequences), so the
/// worker's own queue stays under the threshold (8 prompts of 128 tokens) and the
/// picker's, which the planner counts as the worker's, is what adds one.
#[tokio::test(flavor = "multi_thread")]
async fn load_mode_scales_up_under_a_queue_and_down_when_idle() {
    let g = PlannerGraph::with_picker(
        "planner-load",
        1,
        &["--max-blocks-in-flight", "12"],
        &[SOON, &["--mode", "load", "--context-length", "1024"]],
    )
    .await;
    let watch = ReplicaWatch::start(&g);
    let load = Load::start(&g, Shape::Concurrency(16));
    g.until("the planner adds a worker", async |g| {
        g.planner().await.desired >= 2.0 && g.replicas().await >= 2
    })
    .await;
    let picker = get_text(&g.graph.url("/metrics")).await;
    let waited = metric_sum(&picker, "dynamo_epp_queue_wait_seconds_count", &[]);
    assert!(waited > 0.0, "no request waited in the picker:\n{picker}");
    load.stop();
    g.until("the idle graph is back to one worker", async |g| {
        g.planner().await.desired == 1.0 && g.replicas().await == 1
    })
    .await;
    // The picker's view of the one worker left is whole again: the planner goes on
    // judging it (steady) rather than holding on a count of engines that is off.
    let steady = |text: &str| {
        metric_sum(
            text,
            "dynamo_planner_decisions_total",
            &[("reason", "load_steady")],
        )
    };
    let seen = steady(&get_text(&g.planner_metrics).await);
    g.until("two steady decisions on one worker", async |g| {
        steady(&get_text(&g.planner_metrics).await) >= seen + 2.0
    })
    .await;
    assert_eq!(g.replicas().await, 1);
    let (least, most) = watch.finish().await;
    assert!(least >= 1, "the worker went down to {least} replicas");
    assert!(most >= 2, "{most}");
}

/// Prometheus gone (killed, and killed again each time the runner restarts it): the
/// planner holds the graph's two workers, though an idle graph would otherwise shrink
/// to one, counts each decision as missing input, and never scales to zero.
#[tokio::test(flavor = "multi_thread")]
async fn without_prometheus_the_planner_holds_and_says_why() {
    let g = PlannerGraph::start(
        "planner-blind",
        2,
        &[&["--predictor", "constant", "--startup-delay", "10s"]],
    )
    .await;
    let before = g.planner().await;
    assert_eq!(
        before.reasons, 0.0,
        "the planner decided before the test could take Prometheus away: {before:?}"
    );
    let url = g.graph.admin("/graph");
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let killer = tokio::spawn(async move {
        let mut kills = 0;
        while !flag.load(Ordering::Relaxed) {
            let status: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
            let pid = status["prometheus"]["pid"].as_u64().unwrap_or(0);
            // It may be gone already, reaped before the runner's status caught up.
            if let Some(pid) = Pid::from_raw(pid as i32)
                && kill_process(pid, Signal::KILL).is_ok()
            {
                kills += 1;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        kills
    });
    let watch = ReplicaWatch::start(&g);
    g.until("two decisions held for missing input", async |g| {
        g.planner().await.missing_input >= 2.0
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let kills = killer.await.unwrap();
    assert!(kills >= 1);
    let after = g.planner().await;
    assert_eq!(
        after.missing_input, after.reasons,
        "every decision held for missing input: {after:?}"
    );
    assert_eq!(after.desired, 2.0, "{after:?}");
    assert_eq!(after.writes, 0.0, "{after:?}");
    let (least, most) = watch.finish().await;
    assert_eq!((least, most), (2, 2), "the graph's workers changed");
    let log = g.log();
    assert!(
        log.contains("prometheus: exited"),
        "the runner reports Prometheus' exits:\n{log}"
    );
}

/// `--advisory`: the planner's desired replicas follow the load; the graph's do not.
#[tokio::test(flavor = "multi_thread")]
async fn advisory_mode_decides_but_does_not_scale() {
    let g = PlannerGraph::start(
        "planner-advisory",
        1,
        &[SOON, &["--predictor", "constant", "--advisory"]],
    )
    .await;
    let watch = ReplicaWatch::start(&g);
    let load = Load::start(&g, Shape::Rate(4.0));
    g.until("the planner wants a second worker", async |g| {
        g.planner().await.desired >= 2.0
    })
    .await;
    // Two more decisions that would have scaled it.
    g.sized_decisions(2.0).await;
    load.stop();
    let planner = g.planner().await;
    assert_eq!(planner.writes, 0.0, "{planner:?}");
    assert_eq!(g.replicas().await, 1);
    let text = get_text(&g.planner_metrics).await;
    assert_eq!(metric_sum(&text, "dynamo_planner_advisory", &[]), 1.0);
    let (least, most) = watch.finish().await;
    assert_eq!((least, most), (1, 1), "the graph's workers changed");
}
