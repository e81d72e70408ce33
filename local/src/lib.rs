//! `dynamo run -f FILE`: the same DGD that deploys on a cluster, run on one machine as
//! processes (`DESIGN.md`, "Local runner"). Per worker replica an engine and its sidecar
//! on free loopback ports, one endpoint picker with its OpenAI frontend on `--port`, a
//! small admin API to list and scale replicas, and for a graph with a planner, the
//! planner and a Prometheus it reads. Ctrl-C or SIGTERM stops every child it started,
//! and nothing else.

mod admin;
pub mod plan;
mod process;
pub mod prometheus;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use dynamo_crds::BackendFramework;
use dynamo_server::endpoints_file::{EndpointEntry, EndpointsFile};
use dynamo_server::{Throttled, parse_duration};
use dynamo_wiring::admin::{GraphStatus, PlannerStatus, ProcessStatus, ReplicaStatus};
use dynamo_wiring::credential::{self, CREDENTIAL_FILE_ENV};
use tokio::sync::Mutex;

use admin::Admin;
use plan::{Caps, CommandSpec, Graph, PlanError, ReplicaPorts, RunOptions};
use process::{Program, Supervised};
use prometheus::{LocalPrometheus, ScrapeTarget};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The DynamoGraphDeployment to run (the file `kubectl apply` takes).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Port of the OpenAI-compatible frontend.
    #[arg(long, default_value_t = 8000, env = "DYNAMO_PORT")]
    pub port: u16,
    /// Address the frontend binds; replicas always bind loopback.
    #[arg(long, default_value = "127.0.0.1", env = "DYNAMO_HOST")]
    pub host: String,
    /// Address the admin API binds; anything but loopback needs a token.
    #[arg(long, default_value = "127.0.0.1", env = "DYNAMO_ADMIN_HOST")]
    pub admin_host: String,
    /// Bearer token every admin API request must carry (required off loopback).
    #[arg(long, env = "DYNAMO_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// File holding the admin API's bearer token (trailing whitespace is ignored).
    #[arg(long, env = "DYNAMO_ADMIN_TOKEN_FILE", conflicts_with = "admin_token")]
    pub admin_token_file: Option<PathBuf>,
    /// Most replicas of one worker service (the file, --replicas and POST /scale alike).
    #[arg(long, default_value_t = 32, env = "DYNAMO_MAX_REPLICAS")]
    pub max_replicas: u32,
    /// Most processes of the whole run: an engine and a sidecar per replica, and the picker.
    #[arg(long, default_value_t = 128, env = "DYNAMO_MAX_PROCESSES")]
    pub max_processes: u32,
    /// Router mode of the endpoint picker: kv, approx, round-robin or random [default:
    /// the graph's `DYN_ROUTER_MODE` or its Dynamo frontend's `--router-mode`, else kv].
    #[arg(long, env = "DYNAMO_ROUTER_MODE")]
    pub router_mode: Option<String>,
    /// Run the workers on this engine instead of the file's (`mocker` runs any graph,
    /// Dynamo's published ones included, on this machine's CPU).
    #[arg(long, value_parser = parse_backend)]
    pub backend_framework: Option<BackendFramework>,
    /// Model directory (tokenizer.json, chat template) for the picker and the mocker.
    #[arg(long, env = "DYNAMO_MODEL_PATH")]
    pub model_path: Option<PathBuf>,
    /// Replica count of a worker service, replacing the file's (repeatable).
    #[arg(long = "replicas", value_name = "SERVICE=N", value_parser = parse_replicas)]
    pub replicas: Vec<(String, u32)>,
    /// Port of the admin API (GET /graph, POST /scale); 0 picks a free one.
    #[arg(long, default_value_t = 0, env = "DYNAMO_ADMIN_PORT")]
    pub admin_port: u16,
    /// Where `dynamo-mocker`, `dynamo-sidecar` and `dynamo-epp` are [default: beside this
    /// binary, then PATH].
    #[arg(long, env = "DYNAMO_BIN_DIR")]
    pub bin_dir: Option<PathBuf>,
    /// How long a child may take to exit after SIGTERM before it is killed.
    #[arg(long, default_value = "10", value_parser = parse_duration)]
    pub grace: Duration,
    /// Do not start the graph's planner (nor the Prometheus it reads).
    #[arg(long)]
    pub no_planner: bool,
}

fn parse_replicas(s: &str) -> Result<(String, u32), String> {
    let (service, n) = s
        .split_once('=')
        .ok_or_else(|| format!("expected SERVICE=N, got {s:?}"))?;
    let n = n
        .parse()
        .map_err(|_| format!("replicas of {service:?} must be a whole number, got {n:?}"))?;
    Ok((service.to_owned(), n))
}

impl RunArgs {
    /// The admin API's token, from `--admin-token` (`DYNAMO_ADMIN_TOKEN`) or its file.
    fn admin_token(&self) -> anyhow::Result<Option<String>> {
        let token = match (&self.admin_token, &self.admin_token_file) {
            (Some(token), _) => token.clone(),
            (None, Some(file)) => std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the admin token file {}", file.display()))?
                .trim_end()
                .to_owned(),
            (None, None) => return Ok(None),
        };
        if token.is_empty() {
            bail!("the admin token is empty");
        }
        Ok(Some(token))
    }
}

fn parse_backend(s: &str) -> Result<BackendFramework, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| format!("unknown engine {s:?}: vllm, sglang, trtllm or mocker"))
}

/// Runs the graph until Ctrl-C or SIGTERM.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: RunArgs) -> anyhow::Result<()> {
    let yaml = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let validated = dynamo_operator::reconcile::names::validate_manifest(&yaml)
        .with_context(|| format!("{} is not a valid manifest", args.file.display()))?;
    let mut graphs = validated.graph_deployments();
    let (Some(dgd), None) = (graphs.next(), graphs.next()) else {
        bail!(
            "{} must hold exactly one DynamoGraphDeployment",
            args.file.display()
        );
    };
    let options = RunOptions {
        model_path: args.model_path.clone(),
        backend: args.backend_framework,
        router_mode: args.router_mode.clone(),
        replicas: args.replicas.iter().cloned().collect(),
        caps: Caps {
            replicas_per_service: args.max_replicas,
            processes: args.max_processes,
        },
    };
    let mut graph = Graph::from_dgd(dgd, &options)?;
    if args.no_planner
        && let Some(planner) = graph.planner.take()
    {
        graph.notes.push(format!(
            "service {:?} (planner) is not started (--no-planner); scale with POST /scale",
            planner.name
        ));
    }
    for note in &graph.notes {
        eprintln!("note: {note}");
    }
    for warning in &graph.warnings {
        eprintln!("warning: {warning}");
    }
    let bins = Bins::new(args.bin_dir.clone())?;
    // Checked before anything starts, so a missing program is one clear error.
    let prometheus_bin = match &graph.planner {
        Some(planner) => Some(
            bins.find(prometheus::PROGRAM)
                .ok_or_else(|| prometheus::missing(&planner.name))?,
        ),
        None => None,
    };
    let admin_token = args.admin_token()?;
    let admin = Admin::bind(&args.admin_host, args.admin_port, admin_token.clone()).await?;
    // Made once nothing else can fail before the end removes it.
    let state_dir = std::env::temp_dir().join(format!("dynamo-run-{}", std::process::id()));
    std::fs::create_dir_all(&state_dir)?;
    if graph.uses_connector() {
        graph.connector_dir = state_dir.join("python");
        // The engines run in this machine's Python: xxhash, if missing, is `pip install`ed.
        dynamo_wiring::connector::install(&graph.connector_dir, None)
            .with_context(|| format!("cannot write {}", graph.connector_dir.display()))?;
    }
    let runner = Runner::new(graph, bins, args.grace, state_dir.clone());
    write_credential(&runner.credential_file)?;
    let runner = Arc::new(Mutex::new(runner));
    let result = serve(&runner, &args, admin, prometheus_bin, admin_token).await;
    eprintln!("stopping: the planner and the endpoint picker first, then every replica");
    runner.lock().await.stop_all().await;
    std::fs::remove_dir_all(&state_dir).ok();
    result
}

/// Writes a fresh block API credential to `path`, readable by this user only: the run's
/// processes (all of this user) share it, and no other local user may call their block
/// API.
fn write_credential(path: &Path) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(credential::new_token().as_bytes())?;
    Ok(())
}

/// Starts everything, then waits for Ctrl-C or SIGTERM.
async fn serve(
    runner: &Arc<Mutex<Runner>>,
    args: &RunArgs,
    admin: Admin,
    prometheus_bin: Option<PathBuf>,
    admin_token: Option<String>,
) -> anyhow::Result<()> {
    let admin_addr = admin.local_addr()?;
    let admin_url = format!(
        "http://{}:{}",
        reachable(&admin_addr.ip().to_string()),
        admin_addr.port()
    );
    let mut planner = None;
    {
        let mut r = runner.lock().await;
        let services: Vec<(String, u32)> = r
            .graph
            .workers
            .iter()
            .map(|(name, w)| (name.clone(), w.replicas))
            .collect();
        for (service, replicas) in services {
            for _ in 0..replicas {
                r.add_replica(&service)?;
            }
        }
        r.write_endpoints()?;
        let ext_proc_port = r.free_port()?;
        let mut epp =
            r.graph
                .epp_command((&args.host, args.port), ext_proc_port, &r.endpoints_file);
        r.hand_credential(&mut epp);
        let epp = r.bins.program(epp)?;
        r.epp = Some(Supervised::start("epp".into(), epp, r.grace));
        r.picker_metrics = format!("{}:{}", reachable(&args.host), args.port);
        if let Some(path) = prometheus_bin {
            r.start_prometheus(path)?;
            planner = Some(r.plan_planner(&admin_url, admin_token)?);
        }
        print_table(&r, args, &admin)?;
    }
    let admin = tokio::spawn(admin.serve(runner.clone()));
    let probes = tokio::spawn(probe_readiness(runner.clone()));
    let ready = tokio::spawn(announce_ready(runner.clone(), args.host.clone(), args.port));
    let planner = planner.map(|p| tokio::spawn(start_planner(runner.clone(), p)));
    dynamo_server::logged_shutdown_signal().await;
    admin.abort();
    probes.abort();
    ready.abort();
    if let Some(planner) = planner {
        planner.abort();
    }
    Ok(())
}

/// Where a client on this machine reaches a listener bound to `host`: loopback for the
/// unspecified address, `[v6]` in brackets.
fn reachable(host: &str) -> String {
    match host.parse::<IpAddr>() {
        Ok(ip) if ip.is_unspecified() => Ipv4Addr::LOCALHOST.to_string(),
        Ok(IpAddr::V6(ip)) => format!("[{ip}]"),
        _ => host.to_owned(),
    }
}

/// The planner, ready to start once its profile is measured (if it needs one), the
/// graph is up and Prometheus answers.
struct PendingPlanner {
    program: Program,
    /// Its profile: the mock engine to run, and where it writes it.
    profile: Option<(Program, PathBuf)>,
    admin_url: String,
    metrics_addr: SocketAddr,
}

/// Measures the profile, waits for the graph (every service has had a ready replica,
/// so the planner does not size a graph still starting) and for Prometheus' `/-/ready`,
/// then starts the planner. A failure is printed and leaves the graph serving without it.
async fn start_planner(runner: Arc<Mutex<Runner>>, pending: PendingPlanner) {
    if let Some((mocker, out)) = &pending.profile {
        let measured = tokio::process::Command::new(&mocker.path)
            .args(&mocker.spec.args)
            .envs(mocker.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await;
        match measured {
            Ok(o) if o.status.success() => {
                println!(
                    "planner: measured the mock engine's profile: {}",
                    out.display()
                );
            }
            Ok(o) => {
                eprintln!(
                    "planner: not started: measuring the mock engine's profile failed ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                return;
            }
            Err(e) => {
                eprintln!(
                    "planner: not started: cannot run {}: {e}",
                    mocker.path.display()
                );
                return;
            }
        }
    }
    let client = reqwest::Client::new();
    loop {
        let (complete, prometheus) = {
            let r = runner.lock().await;
            (r.complete, r.prometheus.as_ref().map(|p| p.config.clone()))
        };
        if complete
            && let Some(prometheus) = prometheus
            && prometheus.ready(&client).await
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut r = runner.lock().await;
    let grace = r.grace;
    let Some(planner) = r.planner.as_mut() else {
        return;
    };
    planner.process = Some(Supervised::start(
        planner.service.clone(),
        pending.program,
        grace,
    ));
    println!(
        "planner: started against {} (metrics http://{}/metrics)",
        pending.admin_url, pending.metrics_addr
    );
    if let Err(e) = r.write_scrape_targets() {
        eprintln!("{e:#}");
    }
}

/// The processes of a local graph.
pub(crate) struct Runner {
    graph: Graph,
    bins: Bins,
    grace: Duration,
    endpoints_file: PathBuf,
    /// The run's block API credential, which every engine and sidecar of the run reads,
    /// and the picker, for their KV event streams.
    credential_file: PathBuf,
    /// The run's own directory (the endpoints file, the replicas' disk tiers), removed
    /// at the end.
    state_dir: PathBuf,
    /// Replicas of each worker service, in index order.
    replicas: BTreeMap<String, Vec<Replica>>,
    epp: Option<Supervised>,
    /// `host:port` where the picker serves `/metrics` (its OpenAI frontend).
    picker_metrics: String,
    /// The planner's Prometheus, for a graph with a planner.
    prometheus: Option<RunningPrometheus>,
    planner: Option<RunningPlanner>,
    /// Replicas whose sidecar answered `/ready` at the last probe; only they are in the
    /// picker's list, as only Ready pods are in a cluster's.
    ready: HashSet<(String, u32)>,
    /// Every service had a ready replica at some point. Until then the picker gets no
    /// pods: a disaggregated graph whose decode pods are up before its prefill pods
    /// would otherwise start out serving aggregated, and a graph of several services
    /// would start out on some of them.
    complete: bool,
}

struct RunningPrometheus {
    config: LocalPrometheus,
    process: Supervised,
}

struct RunningPlanner {
    service: String,
    metrics_addr: SocketAddr,
    /// `None` until the graph is up and Prometheus ready.
    process: Option<Supervised>,
}

struct Replica {
    index: u32,
    ports: ReplicaPorts,
    engine: Supervised,
    sidecar: Supervised,
}

/// Why a scale request was refused. After any of them the graph is as it was.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScaleError {
    #[error("no worker service {0:?} (workers: {1})")]
    UnknownService(String, String),
    #[error(transparent)]
    OverCap(PlanError),
    #[error("cannot start a replica, so nothing changed: {0:#}")]
    Start(anyhow::Error),
    #[error("cannot record the change, so nothing changed: {0:#}")]
    Record(anyhow::Error),
}

impl Runner {
    /// A runner with nothing started yet, keeping its files in `state_dir`.
    fn new(graph: Graph, bins: Bins, grace: Duration, state_dir: PathBuf) -> Self {
        Self {
            graph,
            bins,
            grace,
            endpoints_file: state_dir.join("endpoints.json"),
            credential_file: state_dir.join("block-api-token"),
            state_dir,
            replicas: BTreeMap::new(),
            epp: None,
            picker_metrics: String::new(),
            prometheus: None,
            planner: None,
            ready: HashSet::new(),
            complete: false,
        }
    }

    fn free_port(&mut self) -> anyhow::Result<u16> {
        dynamo_server::free_port().context("no free loopback port")
    }

    /// Starts Prometheus (the program at `path`) on a free loopback port, scraping what
    /// runs now; [`Self::write_scrape_targets`] keeps its list current.
    fn start_prometheus(&mut self, path: PathBuf) -> anyhow::Result<()> {
        let port = self.free_port()?;
        let config = LocalPrometheus::new(&self.state_dir, port, &self.graph.name);
        let spec = config.prepare().with_context(|| {
            format!(
                "cannot write Prometheus' config in {}",
                self.state_dir.display()
            )
        })?;
        let process = Supervised::start("prometheus".into(), Program { path, spec }, self.grace);
        self.prometheus = Some(RunningPrometheus { config, process });
        self.write_scrape_targets()
    }

    /// The planner's command and what must happen before it starts; its metrics port is
    /// chosen now, so the table shows it.
    fn plan_planner(
        &mut self,
        admin_url: &str,
        admin_token: Option<String>,
    ) -> anyhow::Result<PendingPlanner> {
        let prometheus = self
            .prometheus
            .as_ref()
            .context("Prometheus starts before the planner")?
            .config
            .url();
        let metrics_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.free_port()?));
        let out = self.state_dir.join("planner-profile.json");
        let profile = match self.graph.profile_command(&out) {
            Some(command) => Some((self.bins.program(command)?, out)),
            None => None,
        };
        let mut spec = self
            .graph
            .planner_command(
                admin_url,
                &prometheus,
                metrics_addr,
                profile.as_ref().map(|(_, out)| out.as_path()),
            )
            .context("the graph has no planner")??;
        if let Some(token) = admin_token {
            // By environment, not a flag: flags show in `ps`.
            spec.env.push(("DYNAMO_ADMIN_TOKEN".into(), token));
        }
        let service = self
            .graph
            .planner
            .as_ref()
            .map(|p| p.name.clone())
            .unwrap_or_default();
        self.planner = Some(RunningPlanner {
            service,
            metrics_addr,
            process: None,
        });
        Ok(PendingPlanner {
            program: self.bins.program(spec)?,
            profile,
            admin_url: admin_url.to_owned(),
            metrics_addr,
        })
    }

    /// What Prometheus scrapes: the picker, every replica's sidecar (the pod's metrics
    /// port on a cluster) and the planner once it runs. A restarted child keeps its
    /// port, so only starting and removing processes changes the list.
    fn scrape_targets(&self) -> Vec<ScrapeTarget> {
        let mut targets = vec![ScrapeTarget {
            address: self.picker_metrics.clone(),
            component: self.graph.picker_service.clone(),
            role: "epp".into(),
        }];
        for (service, replicas) in &self.replicas {
            let role = self.graph.workers[service].role.as_str();
            targets.extend(replicas.iter().map(|r| ScrapeTarget {
                address: format!("127.0.0.1:{}", r.ports.sidecar_metrics),
                component: service.clone(),
                role: role.into(),
            }));
        }
        if let Some(planner) = &self.planner
            && planner.process.is_some()
        {
            targets.push(ScrapeTarget {
                address: planner.metrics_addr.to_string(),
                component: planner.service.clone(),
                role: "planner".into(),
            });
        }
        targets
    }

    /// Rewrites Prometheus' target list (a no-op without Prometheus).
    fn write_scrape_targets(&self) -> anyhow::Result<()> {
        let Some(prometheus) = &self.prometheus else {
            return Ok(());
        };
        prometheus
            .config
            .write_targets(&self.scrape_targets())
            .with_context(|| {
                format!(
                    "cannot write {}",
                    prometheus.config.targets_file().display()
                )
            })
    }

    /// Tells a process of the run (engine, sidecar, picker) where its credential is.
    fn hand_credential(&self, command: &mut CommandSpec) {
        let file = self.credential_file.to_string_lossy().into_owned();
        command.env.push((CREDENTIAL_FILE_ENV.into(), file));
    }

    /// Starts the next replica of `service` (engine, then its sidecar).
    fn add_replica(&mut self, service: &str) -> anyhow::Result<()> {
        let ports = ReplicaPorts {
            engine: self.free_port()?,
            engine_kv_events: self.free_port()?,
            engine_kv_replay: self.free_port()?,
            sidecar: self.free_port()?,
            sidecar_grpc: self.free_port()?,
            sidecar_metrics: self.free_port()?,
            kv_side_channel: self.free_port()?,
        };
        // Past every index in use: a scale-down may have taken one from the middle.
        let index = self
            .replicas
            .get(service)
            .and_then(|r| r.iter().map(|r| r.index).max())
            .map_or(0, |last| last + 1);
        let mut engine = self.graph.engine_command(service, ports);
        self.hand_credential(&mut engine);
        let engine = self.bins.program(engine)?;
        let kv_disk = self
            .state_dir
            .join("kv-disk")
            .join(format!("{service}-{index}"));
        let mut sidecar =
            self.graph
                .sidecar_command(service, ports, &kv_disk, &self.endpoints_file);
        self.hand_credential(&mut sidecar);
        for dir in &sidecar.dirs {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let sidecar = self.bins.program(sidecar)?;
        let replica = Replica {
            index,
            ports,
            engine: Supervised::start(format!("{service}-{index}"), engine, self.grace),
            sidecar: Supervised::start(format!("{service}-{index}/sc"), sidecar, self.grace),
        };
        self.replicas
            .entry(service.to_owned())
            .or_default()
            .push(replica);
        Ok(())
    }

    /// The ready replicas, for the picker (its pods) and the decode sidecars (their
    /// prefill peers).
    fn endpoints(&self) -> EndpointsFile {
        if !self.complete {
            return EndpointsFile::default();
        }
        let endpoints = self
            .replicas
            .iter()
            .flat_map(|(service, replicas)| {
                let role = self.graph.workers[service].role;
                replicas
                    .iter()
                    .filter(|r| self.ready.contains(&(service.clone(), r.index)))
                    .map(move |r| EndpointEntry {
                        address: format!("127.0.0.1:{}", r.ports.sidecar),
                        kv_events: Some(format!("http://127.0.0.1:{}", r.ports.sidecar_grpc)),
                        role: Some(role),
                        sidecar_metrics: Some(format!(
                            "http://127.0.0.1:{}",
                            r.ports.sidecar_metrics
                        )),
                    })
            })
            .collect();
        EndpointsFile { endpoints }
    }

    /// With every replica started in the picker's list: how many there are.
    fn every_replica_listed(&self) -> Option<usize> {
        let replicas = self
            .replicas
            .iter()
            .flat_map(|(service, list)| list.iter().map(move |r| (service.clone(), r.index)));
        let mut count = 0;
        for replica in replicas {
            if !self.ready.contains(&replica) {
                return None;
            }
            count += 1;
        }
        (self.complete && count > 0).then_some(count)
    }

    /// Whether every service that has replicas has a ready one.
    fn every_service_ready(&self) -> bool {
        self.replicas.iter().all(|(service, replicas)| {
            replicas.is_empty()
                || replicas
                    .iter()
                    .any(|r| self.ready.contains(&(service.clone(), r.index)))
        })
    }

    fn write_endpoints(&self) -> anyhow::Result<()> {
        self.endpoints()
            .write(&self.endpoints_file)
            .with_context(|| format!("cannot write {}", self.endpoints_file.display()))
    }

    /// Takes `ready` as the ready replicas if the picker's list can be rewritten to match;
    /// else keeps the old set (the next probe tries again), so `/graph` never shows a
    /// replica ready that the list lacks.
    fn set_ready(&mut self, ready: HashSet<(String, u32)>) -> anyhow::Result<()> {
        let before = (std::mem::replace(&mut self.ready, ready), self.complete);
        self.complete |= self.every_service_ready();
        let written = self.write_endpoints();
        if written.is_err() {
            (self.ready, self.complete) = before;
        }
        written
    }

    /// Grows or shrinks `service` to `replicas`. New replicas join the picker's list once
    /// their sidecar is ready; removed ones (see [`take_surplus`]) leave the list before
    /// they are stopped, so no new request is sent to a stopping replica. A change that cannot be started or
    /// recorded is undone before the error returns: the replicas it started are stopped,
    /// those it took out are put back, and the list and Prometheus' targets stay as
    /// they were.
    pub(crate) async fn scale(&mut self, service: &str, replicas: u32) -> Result<(), ScaleError> {
        if !self.graph.workers.contains_key(service) {
            let known: Vec<&str> = self.graph.workers.keys().map(String::as_str).collect();
            return Err(ScaleError::UnknownService(service.into(), known.join(", ")));
        }
        let mut counts: BTreeMap<String, u32> = self
            .graph
            .workers
            .keys()
            .map(|s| (s.clone(), self.replicas.get(s).map_or(0, Vec::len) as u32))
            .collect();
        let current = counts.insert(service.to_owned(), replicas).unwrap_or(0);
        self.graph
            .check_caps(&counts)
            .map_err(ScaleError::OverCap)?;
        // What an undo restores: the service's list (`None`: it had none) and readiness.
        let before = self.replicas.get(service).map(Vec::len);
        let ready = self.ready.clone();
        // Taken out of the list now, stopped only once the change is recorded.
        let list = self.replicas.entry(service.to_owned()).or_default();
        let surplus = list.len().saturating_sub(replicas as usize);
        let mut removed = take_surplus(list, surplus, |index| {
            ready.contains(&(service.to_owned(), index))
        });
        for r in &removed {
            self.ready.remove(&(service.to_owned(), r.index));
        }
        let changed = (current..replicas)
            .try_for_each(|_| self.add_replica(service))
            .map_err(ScaleError::Start)
            .and_then(|()| {
                // The picker's list last: writing it commits the change.
                self.write_scrape_targets()
                    .and_then(|()| self.write_endpoints())
                    .map_err(ScaleError::Record)
            });
        if let Err(err) = changed {
            let list = self.replicas.entry(service.to_owned()).or_default();
            let started = list.split_off(before.unwrap_or(0).min(list.len()));
            list.append(&mut removed);
            list.sort_by_key(|r| r.index);
            if before.is_none() {
                self.replicas.remove(service);
            }
            self.ready = ready;
            // The picker's list was not replaced; Prometheus' targets may have been.
            if let Err(err) = self.write_scrape_targets() {
                eprintln!("{err:#}");
            }
            futures::future::join_all(started.into_iter().map(Replica::stop)).await;
            return Err(err);
        }
        futures::future::join_all(removed.into_iter().map(Replica::stop)).await;
        Ok(())
    }

    pub(crate) fn status(&self) -> GraphStatus {
        let services = self
            .replicas
            .iter()
            .map(|(service, replicas)| {
                let role = self.graph.workers[service].role.as_str();
                let list = replicas
                    .iter()
                    .map(|r| ReplicaStatus {
                        index: r.index,
                        role: role.into(),
                        engine: format!("127.0.0.1:{}", r.ports.engine),
                        sidecar: format!("127.0.0.1:{}", r.ports.sidecar),
                        kv_events: format!("http://127.0.0.1:{}", r.ports.sidecar_grpc),
                        engine_metrics: format!("http://127.0.0.1:{}/metrics", r.ports.engine),
                        sidecar_metrics: format!(
                            "http://127.0.0.1:{}/metrics",
                            r.ports.sidecar_metrics
                        ),
                        ready: self.ready.contains(&(service.clone(), r.index)),
                        engine_pid: r.engine.pid(),
                        sidecar_pid: r.sidecar.pid(),
                        restarts: r.engine.restarts() + r.sidecar.restarts(),
                    })
                    .collect();
                (service.clone(), list)
            })
            .collect();
        GraphStatus {
            name: self.graph.name.clone(),
            model: self.graph.model_name.clone(),
            epp_pid: self.epp.as_ref().map_or(0, Supervised::pid),
            roles: self
                .graph
                .workers
                .iter()
                .map(|(service, w)| (service.clone(), w.role.as_str().to_string()))
                .collect(),
            services,
            prometheus: self.prometheus.as_ref().map(|p| ProcessStatus {
                url: p.config.url(),
                pid: p.process.pid(),
                restarts: p.process.restarts(),
            }),
            planner: self.planner.as_ref().map(|p| PlannerStatus {
                service: p.service.clone(),
                metrics: format!("http://{}/metrics", p.metrics_addr),
                pid: p.process.as_ref().map_or(0, Supervised::pid),
                restarts: p.process.as_ref().map_or(0, Supervised::restarts),
            }),
        }
    }

    /// Stops the planner (so it scales nothing while the graph goes away), then the
    /// picker, then every replica and Prometheus at once.
    async fn stop_all(&mut self) {
        if let Some(planner) = self.planner.take().and_then(|p| p.process) {
            planner.stop().await;
        }
        if let Some(epp) = self.epp.take() {
            epp.stop().await;
        }
        let replicas = std::mem::take(&mut self.replicas);
        let prometheus = self.prometheus.take().map(|p| p.process.stop());
        futures::future::join(
            futures::future::join_all(replicas.into_values().flatten().map(Replica::stop)),
            futures::future::OptionFuture::from(prometheus),
        )
        .await;
    }
}

impl Replica {
    /// The sidecar first, so no request reaches an engine that is going away.
    async fn stop(self) {
        self.sidecar.stop().await;
        self.engine.stop().await;
    }
}

/// Every 500 ms asks each replica's sidecar `/ready` (engine up, KV events live) and
/// rewrites the picker's list when the answer changes: the local stand-in for a pod's
/// readiness probe and the endpoints a cluster publishes. As with a probe's default
/// `failureThreshold` of 3, one slow answer on a busy machine does not drop a replica.
async fn probe_readiness(runner: Arc<Mutex<Runner>>) {
    const FAILURE_THRESHOLD: u32 = 3;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .expect("a plain HTTP client");
    let mut failures: HashMap<(String, u32), u32> = HashMap::new();
    loop {
        let targets: Vec<((String, u32), u16)> = {
            let r = runner.lock().await;
            r.replicas
                .iter()
                .flat_map(|(service, list)| {
                    list.iter()
                        .map(|rep| ((service.clone(), rep.index), rep.ports.sidecar_metrics))
                })
                .collect()
        };
        let mut answered = HashSet::new();
        for (key, port) in &targets {
            let url = format!("http://127.0.0.1:{port}/ready");
            if client
                .get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                answered.insert(key.clone());
            }
        }
        let mut r = runner.lock().await;
        let mut ready = HashSet::new();
        for (key, _) in targets {
            // Replicas removed while probing stay out.
            let exists = r
                .replicas
                .get(&key.0)
                .is_some_and(|list| list.iter().any(|rep| rep.index == key.1));
            let failed = failures.entry(key.clone()).or_default();
            *failed = if answered.contains(&key) {
                0
            } else {
                *failed + 1
            };
            let was_ready = r.ready.contains(&key);
            if exists && (*failed == 0 || (was_ready && *failed < FAILURE_THRESHOLD)) {
                ready.insert(key);
            }
        }
        failures.retain(|key, _| r.replicas.contains_key(&key.0));
        if ready != r.ready
            && let Err(err) = r.set_ready(ready)
        {
            // Retried every round until the list can be written: said once in a while.
            static UNRECORDED: Throttled = Throttled::new(Duration::from_secs(10));
            UNRECORDED.log(|skipped| match skipped {
                0 => eprintln!("{err:#}"),
                n => eprintln!("{err:#} ({n} more times since)"),
            });
        }
        drop(r);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Finds our binaries (beside this one, or in `--bin-dir`) and everything else on PATH.
struct Bins {
    dir: Option<PathBuf>,
}

impl Bins {
    fn new(dir: Option<PathBuf>) -> anyhow::Result<Self> {
        let dir = match dir {
            Some(dir) => Some(dir),
            None => std::env::current_exe()?.parent().map(Path::to_path_buf),
        };
        Ok(Self { dir })
    }

    /// `program` as a path: as given when it has a directory, else the first file of
    /// that name beside us (or in `--bin-dir`), then on PATH.
    fn find(&self, program: &str) -> Option<PathBuf> {
        let name = Path::new(program);
        if name.components().count() > 1 {
            return Some(name.to_path_buf());
        }
        self.dir
            .iter()
            .cloned()
            .chain(
                std::env::var_os("PATH")
                    .iter()
                    .flat_map(std::env::split_paths),
            )
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    }

    fn program(&self, spec: CommandSpec) -> anyhow::Result<Program> {
        let path = self.find(&spec.program).with_context(|| {
            format!(
                "cannot find {:?}: build it (`cargo build --bins`) or put it on PATH",
                spec.program
            )
        })?;
        Ok(Program { path, spec })
    }
}

fn print_table(runner: &Runner, args: &RunArgs, admin: &Admin) -> anyhow::Result<()> {
    let g = &runner.graph;
    println!(
        "dynamo run: graph {} ({} workers, model {}, router {})",
        g.name,
        g.workers.values().map(|w| w.replicas).sum::<u32>(),
        g.model_name,
        g.router_mode
    );
    println!(
        "  {:<14} {:<8} {:<16} {:<16} {:<16}",
        "REPLICA", "ROLE", "ENGINE", "SIDECAR", "KV EVENTS"
    );
    for (service, replicas) in &runner.replicas {
        for r in replicas {
            println!(
                "  {:<14} {:<8} 127.0.0.1:{:<6} 127.0.0.1:{:<6} 127.0.0.1:{:<6}",
                format!("{service}-{}", r.index),
                g.workers[service].role.as_str(),
                r.ports.engine,
                r.ports.sidecar,
                r.ports.sidecar_grpc
            );
        }
    }
    println!("  OpenAI API   http://{}:{}/v1", args.host, args.port);
    if let Some(prometheus) = &runner.prometheus {
        println!(
            "  Prometheus   {} (scrapes the picker and the sidecars; {})",
            prometheus.config.url(),
            prometheus.config.config_file().display()
        );
    }
    if let Some(planner) = &runner.planner {
        println!(
            "  planner      {} (http://{}/metrics), once the graph is up",
            planner.service, planner.metrics_addr
        );
    }
    println!(
        "  admin API    http://{} (GET /graph, POST /scale{})",
        admin.local_addr()?,
        if admin.needs_token() {
            "; Authorization: Bearer <token>"
        } else {
            ""
        }
    );
    println!("Try:");
    println!(
        "  curl http://localhost:{}/v1/chat/completions -H 'Content-Type: application/json' \\\n    -d '{{\"model\": \"{}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 32}}'",
        args.port, g.model_name
    );
    Ok(())
}

/// Prints one line once every replica started is in the picker's list and the picker
/// answers `/health` with 200: a graph announced ready with one of its replicas listed
/// would take a burst of requests, or an engine's loss, on that one alone.
async fn announce_ready(runner: Arc<Mutex<Runner>>, host: String, port: u16) {
    let host = reachable(&host);
    let client = reqwest::Client::new();
    loop {
        let listed = runner.lock().await.every_replica_listed();
        if let Some(replicas) = listed
            && picker_answers(&client, &host, port, replicas).await
        {
            println!("ready: the OpenAI API answers on http://{host}:{port}/v1");
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Whether the picker at `host:port` is healthy and lists `replicas` pods.
async fn picker_answers(client: &reqwest::Client, host: &str, port: u16, replicas: usize) -> bool {
    let url = |path: &str| format!("http://{host}:{port}{path}");
    let healthy = client
        .get(url("/health"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success());
    if !healthy {
        return false;
    }
    let Ok(metrics) = client.get(url("/metrics")).send().await else {
        return false;
    };
    metrics
        .text()
        .await
        .is_ok_and(|text| listed_pods(&text) == replicas)
}

/// The pods the picker's `/metrics` text says it lists, in any role and state.
fn listed_pods(metrics: &str) -> usize {
    let series = format!("{}{{", dynamo_names::metrics::frontend::ENDPOINTS);
    metrics
        .lines()
        .filter(|l| l.starts_with(&series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as usize
}

/// Takes `n` replicas out of `list`, as Kubernetes' ReplicaSet picks pods to delete:
/// those not ready first (one still starting serves nobody, while taking a ready one
/// could leave the service with none), the newest first within each group. The rest keep
/// their order.
fn take_surplus(list: &mut Vec<Replica>, n: usize, ready: impl Fn(u32) -> bool) -> Vec<Replica> {
    let doomed = surplus(list.iter().map(|r| (r.index, ready(r.index))), n);
    let (removed, kept) = std::mem::take(list)
        .into_iter()
        .partition(|r| doomed.contains(&r.index));
    *list = kept;
    removed
}

/// The indices of the `n` replicas [`take_surplus`] removes, of `(index, ready)` pairs.
fn surplus(replicas: impl Iterator<Item = (u32, bool)>, n: usize) -> Vec<u32> {
    let mut order: Vec<(u32, bool)> = replicas.collect();
    order.sort_by_key(|&(index, ready)| (ready, std::cmp::Reverse(index)));
    order.into_iter().take(n).map(|(index, _)| index).collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use crate::plan::tests::{options, sample};

    #[test]
    fn the_listed_pods_are_counted_over_every_role_and_state() {
        let metrics = "# HELP dynamo_epp_endpoints Known pods\n\
            dynamo_epp_endpoints{role=\"prefill\",state=\"ready\"} 2\n\
            dynamo_epp_endpoints{role=\"decode\",state=\"syncing\"} 1\n\
            dynamo_epp_endpoints_other{role=\"decode\"} 7\n\
            dynamo_epp_index_blocks 40\n";
        assert_eq!(listed_pods(metrics), 3);
        assert_eq!(listed_pods(""), 0);
    }

    #[test]
    fn a_scale_down_takes_replicas_still_starting_before_ready_ones_newest_first() {
        let replicas = [(0, false), (1, true), (2, false), (3, true)];
        assert_eq!(surplus(replicas.into_iter(), 1), [2]);
        assert_eq!(surplus(replicas.into_iter(), 3), [2, 0, 3]);
        let all_ready = [(0, true), (1, true), (2, true)];
        assert_eq!(surplus(all_ready.into_iter(), 2), [2, 1]);
        assert_eq!(surplus(all_ready.into_iter(), 0), [] as [u32; 0]);
    }

    /// A runner of the aggregated mocker sample with nothing started, its engines and
    /// sidecars `sleep` stand-ins, its state in `dir`.
    fn runner(dir: &Path) -> Runner {
        let bins = dir.join("bins");
        std::fs::create_dir(&bins).unwrap();
        for name in ["dynamo-mocker", "dynamo-sidecar"] {
            let path = bins.join(name);
            std::fs::write(&path, "#!/bin/sh\nexec /bin/sleep 120\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let graph = Graph::from_dgd(&sample("agg-mocker.yaml"), &options());
        let bins = Bins { dir: Some(bins) };
        Runner::new(graph.unwrap(), bins, Duration::from_secs(2), dir.into())
    }

    /// Answers `/ready` on `port` as a ready sidecar would, sending one message per probe.
    async fn ready_sidecar(port: u16) -> tokio::sync::mpsc::UnboundedReceiver<()> {
        let (probed, probes) = tokio::sync::mpsc::unbounded_channel();
        let app = axum::Router::new().route(
            "/ready",
            axum::routing::get(move || {
                let _ = probed.send(());
                async {}
            }),
        );
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        probes
    }

    fn listed(runner: &Runner) -> Vec<String> {
        let text = std::fs::read_to_string(&runner.endpoints_file).unwrap();
        let file: EndpointsFile = serde_json::from_str(&text).unwrap();
        file.endpoints.into_iter().map(|e| e.address).collect()
    }

    #[tokio::test]
    async fn a_replica_shows_ready_only_once_the_picker_list_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut runner = runner(dir.path());
        runner.scale("worker", 1).await.unwrap();
        let replica = &runner.replicas["worker"][0];
        let (sidecar, metrics) = (replica.ports.sidecar, replica.ports.sidecar_metrics);
        let mut probes = ready_sidecar(metrics).await;
        // A directory where the list goes: no write replaces it, not even root's.
        let endpoints = runner.endpoints_file.clone();
        std::fs::remove_file(&endpoints).unwrap();
        std::fs::create_dir(&endpoints).unwrap();

        let runner = Arc::new(Mutex::new(runner));
        let probe = tokio::spawn(probe_readiness(runner.clone()));
        // The second probe comes after the first one's answer was taken in.
        probes.recv().await.unwrap();
        probes.recv().await.unwrap();
        let graph = runner.lock().await.status();
        assert!(
            !graph.services["worker"][0].ready,
            "ready, yet not in the list"
        );

        std::fs::remove_dir(&endpoints).unwrap();
        let written = async {
            while !runner.lock().await.status().services["worker"][0].ready {
                probes.recv().await.unwrap();
            }
        };
        // Only against a hang: the probe after the next one writes the list.
        tokio::time::timeout(Duration::from_secs(60), written)
            .await
            .expect("the replica never became ready once the list could be written");
        let mut runner = runner.lock().await;
        assert_eq!(listed(&runner), [format!("127.0.0.1:{sidecar}")]);
        probe.abort();
        runner.stop_all().await;
    }
}
