//! A local graph (`dynamo run`) as a test fixture: started on free ports, stopped (with
//! every child it started) when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::Value;

/// The repository root, where `make model` and `make pyenv` put their output.
pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// Where cargo put this workspace's binaries (`target/<profile>`): the test binary lives
/// in its `deps/` folder.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

pub fn model_dir() -> PathBuf {
    let dir = PathBuf::from(ROOT).join(".cache/models/qwen-mock");
    assert!(
        dir.join("tokenizer.json").exists(),
        "run `make model` first"
    );
    dir
}

pub fn free_port() -> u16 {
    dynamo_server::free_port().unwrap()
}

pub struct LocalGraph {
    /// Locked to look whether `dynamo run` has exited while waiting on it.
    child: Mutex<Child>,
    pub port: u16,
    pub admin_port: u16,
    pub log: PathBuf,
    pub model: String,
}

impl LocalGraph {
    /// Runs `graph` (a file under `e2e/tests/graphs/` or `config/samples/`) with extra
    /// `dynamo run` arguments and waits until it says it is ready.
    pub async fn start(graph: &str, extra: &[&str]) -> Self {
        Self::start_with_env(graph, extra, &[]).await
    }

    /// [`Self::start`] with variables in the environment of `dynamo run`, which every
    /// process it starts inherits (e.g. a sidecar flag's `DYNAMO_SIDECAR_*` twin).
    pub async fn start_with_env(graph: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let bin = bin_dir();
        let dynamo = bin.join("dynamo");
        assert!(
            dynamo.exists(),
            "build the workspace binaries first ({dynamo:?})"
        );
        let port = free_port();
        let admin_port = free_port();
        let log = std::env::temp_dir().join(format!("dynamo-e2e-{port}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&dynamo)
            .arg("run")
            .arg("-f")
            .arg(graph_path(graph))
            .args(["--port", &port.to_string()])
            .args(["--admin-port", &admin_port.to_string()])
            .arg("--model-path")
            .arg(model_dir())
            .args(["--grace", "5"])
            .args(extra)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let graph = Self {
            child: Mutex::new(child),
            port,
            admin_port,
            log,
            model: "Qwen/Qwen3-0.6B".into(),
        };
        graph.wait_healthy(Duration::from_secs(120)).await;
        graph.wait_announced_ready(Duration::from_secs(60)).await;
        graph
    }

    /// Waits for `dynamo run`'s `ready:` line, then checks what it promises: the picker
    /// lists every replica the runner started.
    async fn wait_announced_ready(&self, limit: Duration) {
        let start = Instant::now();
        while !self.log_text().lines().any(|l| l.starts_with("ready: ")) {
            assert!(
                start.elapsed() < limit,
                "no ready: line {limit:?} after the picker was healthy\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let graph = self.graph().await;
        let started: usize = graph["services"]
            .as_object()
            .expect("the graph lists its services")
            .values()
            .map(|replicas| replicas.as_array().map_or(0, Vec::len))
            .sum();
        let listed = metric_sum(
            &get_text(&self.url("/metrics")).await,
            "dynamo_epp_endpoints",
            &[],
        );
        assert_eq!(
            listed as usize, started,
            "ready: printed with {listed} of {started} replicas listed to the picker\n{graph:#}"
        );
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn admin(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin_port)
    }

    pub async fn wait_healthy(&self, limit: Duration) {
        let url = self.url("/health");
        let start = Instant::now();
        while start.elapsed() < limit {
            let exited = self.child.lock().unwrap().try_wait().ok().flatten();
            if let Some(status) = exited {
                panic!(
                    "dynamo run exited ({status}) before {url} was healthy\n{}",
                    self.log_text()
                );
            }
            if reqwest::get(&url)
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{url} not healthy in {limit:?}\n{}", self.log_text());
    }

    /// `GET /graph` of the runner's admin API.
    pub async fn graph(&self) -> Value {
        get_json(&self.admin("/graph")).await
    }

    /// The engines' addresses (`ip:port`) of every replica of `service`.
    pub async fn engines(&self, service: &str) -> Vec<String> {
        self.graph().await["services"][service]
            .as_array()
            .expect("the service runs")
            .iter()
            .map(|r| r["engine"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The engines of `service` once every replica is ready. The frontend is healthy as
    /// soon as one replica of each service is, and under load a second engine can still
    /// be starting then.
    pub async fn ready_engines(&self, service: &str) -> Vec<String> {
        let start = Instant::now();
        loop {
            let graph = self.graph().await;
            let replicas = graph["services"][service]
                .as_array()
                .expect("the service runs");
            if replicas.iter().all(|r| r["ready"] == true) {
                return replicas
                    .iter()
                    .map(|r| r["engine"].as_str().unwrap().to_owned())
                    .collect();
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{service}'s replicas are not all ready after 60 s: {graph:#}\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `scripts/NAME` with the project's Python (`make pyenv`) and `args`; its
    /// standard output. A failed run fails the test with its output and the graph's log.
    pub async fn run_script(&self, name: &str, args: Vec<String>) -> String {
        let python = PathBuf::from(ROOT).join(".cache/venv/bin/python");
        assert!(python.exists(), "run `make pyenv` first");
        let script = PathBuf::from(ROOT).join("scripts").join(name);
        let out = tokio::task::spawn_blocking(move || {
            Command::new(python)
                .arg(script)
                .args(args)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{name}\nstdout: {stdout}\nstderr: {}\nlog:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        stdout
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for LocalGraph {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(pid) = Pid::from_raw(child.id() as i32) {
            let _ = kill_process(pid, Signal::TERM);
        }
        let stopped = poll(Duration::from_secs(30), || {
            child.try_wait().ok().flatten().is_some()
        });
        if !stopped {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn graph_path(graph: &str) -> PathBuf {
    let local = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/graphs")
        .join(graph);
    if local.exists() {
        local
    } else {
        PathBuf::from(ROOT).join("config/samples").join(graph)
    }
}

pub async fn get_json(url: &str) -> Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

pub async fn get_text(url: &str) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

/// Calls `cond` every 100 ms until it holds or `limit` passes (blocking: for `Drop`).
fn poll(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Sends a signal to a process the runner reported.
pub fn signal(pid: u64, signal: Signal) {
    let pid = Pid::from_raw(pid as i32).expect("a live process id");
    kill_process(pid, signal).expect("the process exists");
}

/// The value of a Prometheus sample `name{labels}` summed over the label sets matching
/// every `label=value` in `filter`.
pub fn metric_sum(text: &str, name: &str, filter: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, labels) = series.split_once('{').unwrap_or((series, ""));
            (metric == name
                && filter
                    .iter()
                    .all(|(k, v)| labels.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}
