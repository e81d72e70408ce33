//! What a local run starts, decided from the DGD alone (no processes, no sockets): one
//! endpoint picker with its OpenAI frontend, per worker replica an engine and its
//! sidecar, and the graph's planner. The commands are the wiring plan's
//! ([`dynamo_wiring`]), the same the operator puts in pods, rendered on loopback ports
//! chosen at run time.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use dynamo_crds::{BackendFramework, ComponentSpec, DynamoGraphDeployment, ServiceRole};
use dynamo_names::Role;

use dynamo_wiring::planner::{
    PlannerInputs, PlannerTarget, PlannerWiringError, planner_args, profile_source,
};
use dynamo_wiring::{
    Addresses, DYNAMO_BINARY, Defaults, EPP_BINARY, EngineService, EnvValue, GraphWiring, HF_HOME,
    Picker, PickerPods, PrefillPeers, SIDECAR_BINARY, WiringError, kvbm,
};

/// How the user asked to run the graph.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Model directory (tokenizer, chat template) for the picker and the mocker.
    pub model_path: Option<PathBuf>,
    /// The engine to run instead of the file's.
    pub backend: Option<BackendFramework>,
    /// The picker's router mode instead of the file's.
    pub router_mode: Option<String>,
    /// Replica counts that replace the file's, by service name.
    pub replicas: BTreeMap<String, u32>,
    pub caps: Caps,
}

/// How much one local run may start, so a typo (`replicas: 100000`) is refused instead of
/// forking processes until the machine gives out. Enforced on the file, `--replicas` and
/// every `POST /scale`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Replicas of one worker service.
    pub replicas_per_service: u32,
    /// Processes of the whole run: [`PROCESSES_PER_REPLICA`] per replica and the picker.
    pub processes: u32,
}

/// An engine and its sidecar.
pub const PROCESSES_PER_REPLICA: u32 = 2;

/// What stands for the namespace in a local run's object tier prefix
/// ([`kvbm::object_prefix`]), so local runs and clusters sharing a bucket do not mix.
const LOCAL_SCOPE: &str = "local";

/// Why a graph cannot run locally; each says what to change.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("the graph has no engine service (componentType worker, prefill or decode)")]
    NoWorkers,
    #[error(
        "service {0:?} is multi-node (nodeCount {1}); the local runner starts single-node replicas only: deploy it on a cluster"
    )]
    Multinode(String, i32),
    #[error("--replicas names service {0:?}, which the graph does not have")]
    UnknownService(String),
    #[error("service {0:?} is not a worker (prefill, decode or worker): it cannot be scaled")]
    NotScalable(String),
    #[error(transparent)]
    Wiring(#[from] WiringError),
    #[error(
        "no model directory: pass --model-path DIR (a Hugging Face-style directory with tokenizer.json; `make model` builds one)"
    )]
    NoModelPath,
    /// [`PlannerWiringError::NoProfile`], with the local way out.
    #[error("{0}; or run without it (--no-planner)")]
    PlannerProfile(PlannerWiringError),
    #[error(
        "service {service:?}: {replicas} replicas is more than the local cap of {cap} per service (--max-replicas)"
    )]
    TooManyReplicas {
        service: String,
        replicas: u32,
        cap: u32,
    },
    #[error(
        "{replicas} replicas would run {processes} processes (an engine and a sidecar each, and the picker), more than the local cap of {cap} (--max-processes)"
    )]
    TooManyProcesses {
        replicas: u64,
        processes: u64,
        cap: u32,
    },
}

/// A program to start: the name is resolved by the runner (our binaries first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandSpec {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Directories it writes to, which the runner creates before starting it.
    pub dirs: Vec<PathBuf>,
}

impl CommandSpec {
    fn from_argv(mut argv: Vec<String>, env: Vec<(String, String)>) -> Self {
        let program = if argv.is_empty() {
            String::new()
        } else {
            argv.remove(0)
        };
        Self {
            program,
            args: argv,
            env,
            dirs: Vec::new(),
        }
    }
}

/// The loopback ports of one replica ("pod"); all 0 for a command that serves nothing
/// (the profile measurement).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaPorts {
    pub engine: u16,
    pub engine_kv_events: u16,
    pub engine_kv_replay: u16,
    pub sidecar: u16,
    pub sidecar_grpc: u16,
    pub sidecar_metrics: u16,
    /// A disaggregated engine's KV side channel (vLLM's NIXL, SGLang's bootstrap
    /// server): every replica shares 127.0.0.1, so each needs its own port.
    pub kv_side_channel: u16,
}

impl ReplicaPorts {
    fn addresses(self) -> Addresses {
        Addresses {
            engine: self.engine,
            kv_events: self.engine_kv_events,
            kv_replay: self.engine_kv_replay,
            sidecar_host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            sidecar_http: self.sidecar,
            sidecar_grpc: self.sidecar_grpc,
            sidecar_metrics: self.sidecar_metrics,
            kv_side_channel: Some(self.kv_side_channel),
        }
    }
}

/// A worker service: how to start each of its replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerService {
    pub role: Role,
    pub replicas: u32,
    engine: EngineService,
    env: Vec<(String, String)>,
}

/// The graph's planner service, run as `dynamo planner` against the runner's admin API.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannerService {
    pub name: String,
    spec: ComponentSpec,
    env: Vec<(String, String)>,
    /// The worker service whose mock engine the runner measures for the planner's
    /// profile: set when, given a profile, the planner plans throughput and the service
    /// names none of its own.
    pub profile_from: Option<String>,
}

/// The whole local graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    pub name: String,
    /// The name clients send: the engines', else the model directory's (the picker's
    /// and the mock engine's default).
    pub model_name: String,
    pub model_path: PathBuf,
    /// The picker's router mode: the run's, else the file's, else `kv`.
    pub router_mode: String,
    wiring: GraphWiring,
    pub workers: BTreeMap<String, WorkerService>,
    /// The service the picker stands for (the graph's frontend or epp), as its metrics
    /// are labelled.
    pub picker_service: String,
    /// That service's own flags (its `mainContainer`'s `args`, after ours, as the
    /// operator passes them) and environment.
    picker_args: Vec<String>,
    picker_env: Vec<(String, String)>,
    /// The planner the run starts, if the graph has one it can run.
    pub planner: Option<PlannerService>,
    /// Services that are not started, and why.
    pub notes: Vec<String>,
    /// Settings that take effect but do nothing (KV block tiers no engine feeds).
    pub warnings: Vec<String>,
    pub caps: Caps,
    /// Where the runner writes our KV connector's package for the engines that load it
    /// ([`Graph::uses_connector`]); they find it first on their `PYTHONPATH`.
    pub connector_dir: PathBuf,
}

impl Graph {
    pub fn from_dgd(dgd: &DynamoGraphDeployment, options: &RunOptions) -> Result<Self, PlanError> {
        let name = dgd.metadata.name.clone().unwrap_or_else(|| "graph".into());
        let mut spec = dgd.spec.clone();
        if let Some(backend) = options.backend {
            spec.backend_framework = Some(backend);
        }
        let spec = &spec;
        for service in options.replicas.keys() {
            match spec.services.get(service).map(|s| s.role()) {
                None => return Err(PlanError::UnknownService(service.clone())),
                Some(ServiceRole::Engine(_)) => {}
                Some(_) => return Err(PlanError::NotScalable(service.clone())),
            }
        }
        let model_path = options.model_path.clone().ok_or(PlanError::NoModelPath)?;
        let defaults = Defaults {
            mocker_model_path: Some(path_arg(&model_path)),
        };
        let wiring = GraphWiring::new(spec, &defaults)?.ok_or(PlanError::NoWorkers)?;
        let mut notes = Vec::new();
        let global_env = env_pairs(spec.envs.as_deref(), &mut notes);
        let mut workers = BTreeMap::new();
        let mut planners = Vec::new();
        for (service, component) in &spec.services {
            if component.role() == ServiceRole::Planner {
                planners.push((service, component));
            }
            let Some(engine) = wiring.engines.get(service) else {
                continue;
            };
            if component.node_count() > 1 {
                return Err(PlanError::Multinode(
                    service.clone(),
                    component.node_count(),
                ));
            }
            let env = service_env(&global_env, component, &mut notes);
            let replicas = options
                .replicas
                .get(service)
                .copied()
                .unwrap_or_else(|| component.replicas.unwrap_or(1).max(0) as u32);
            workers.insert(
                service.clone(),
                WorkerService {
                    role: engine.role,
                    replicas,
                    engine: engine.clone(),
                    env,
                },
            );
        }
        let model_name = wiring.served_model.clone().unwrap_or_else(|| {
            model_path
                .file_name()
                .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
        });
        let router_mode = options
            .router_mode
            .clone()
            .or_else(|| dynamo_wiring::router_mode(spec))
            .unwrap_or_else(|| "kv".into());
        let picker = spec
            .services
            .iter()
            .find(|(_, s)| matches!(s.role(), ServiceRole::Frontend | ServiceRole::Epp));
        let picker_service = picker.map_or_else(|| "epp".into(), |(name, _)| name.clone());
        let (picker_args, picker_env) = match picker {
            Some((_, component)) => (
                main_container(component)
                    .and_then(|m| m.args.clone())
                    .unwrap_or_default(),
                service_env(&global_env, component, &mut notes),
            ),
            None => (Vec::new(), global_env.clone()),
        };
        let warnings = wiring
            .engines
            .iter()
            .filter_map(|(service, e)| e.unfed_kv_tiers(service))
            .collect();
        let mut graph = Self {
            name,
            model_name,
            model_path,
            router_mode,
            wiring,
            workers,
            picker_service,
            picker_args,
            picker_env,
            planner: None,
            notes,
            warnings,
            caps: options.caps,
            connector_dir: PathBuf::new(),
        };
        for (service, component) in planners {
            if graph.planner.is_some() {
                graph.notes.push(format!(
                    "service {service:?} (planner) is not started: a local run starts one planner"
                ));
                continue;
            }
            let env = service_env(&global_env, component, &mut graph.notes);
            graph.planner = graph.plan_planner(service, component, env)?;
        }
        let planned = graph
            .workers
            .iter()
            .map(|(service, w)| (service.clone(), w.replicas))
            .collect();
        graph.check_caps(&planned)?;
        Ok(graph)
    }

    /// The planner service `service`, checked by rendering its command: `None` (with a
    /// note) for a planner program that is not ours to run. Whether it gets the mock
    /// engine's profile, and whose, is the wiring's choice ([`profile_source`]).
    fn plan_planner(
        &mut self,
        service: &str,
        spec: &ComponentSpec,
        env: Vec<(String, String)>,
    ) -> Result<Option<PlannerService>, PlanError> {
        let profile_from = match profile_source(service, spec, Some(&self.wiring)) {
            Ok(source) => source.map(|(worker, _)| worker.to_owned()),
            Err(PlannerWiringError::Custom { program, .. }) => {
                self.notes.push(format!(
                    "service {service:?} (planner) runs its own program {program:?}, which a local run does not start; scale with POST /scale"
                ));
                return Ok(None);
            }
            Err(e @ PlannerWiringError::NoProfile { .. }) => {
                return Err(PlanError::PlannerProfile(e));
            }
            Err(e) => return Err(WiringError::from(e).into()),
        };
        Ok(Some(PlannerService {
            name: service.into(),
            spec: spec.clone(),
            env,
            profile_from,
        }))
    }

    /// The planner, against the runner's admin API at `admin_url` and Prometheus at
    /// `prometheus`, its metrics on `metrics_addr`; `profile` replaces the service's.
    pub fn planner_command(
        &self,
        admin_url: &str,
        prometheus: &str,
        metrics_addr: SocketAddr,
        profile: Option<&Path>,
    ) -> Option<Result<CommandSpec, PlanError>> {
        let planner = self.planner.as_ref()?;
        let inputs = PlannerInputs {
            target: PlannerTarget::Admin(admin_url),
            prometheus: Some(prometheus),
            metrics_addr,
            profile,
        };
        Some(
            planner_args(&planner.name, &planner.spec, &inputs)
                .map(|args| CommandSpec {
                    program: DYNAMO_BINARY.into(),
                    args,
                    env: planner.env.clone(),
                    dirs: Vec::new(),
                })
                .map_err(|e| WiringError::from(e).into()),
        )
    }

    /// The mock engine of the planner's [`PlannerService::profile_from`] worker, with the
    /// worker's own flags, told to write its planner profile to `out` and exit.
    pub fn profile_command(&self, out: &Path) -> Option<CommandSpec> {
        let service = self.planner.as_ref()?.profile_from.as_ref()?;
        let ports = ReplicaPorts::default();
        let engine = &self.workers[service].engine;
        let argv = engine.profile_argv(&ports.addresses(), &path_arg(out))?;
        let env = self.engine_command(service, ports).env;
        Some(CommandSpec::from_argv(argv, env))
    }

    /// The KV block size every engine uses.
    pub fn block_size(&self) -> u32 {
        self.wiring.block_size
    }

    /// Whether running `replicas` (per worker service) stays within the caps.
    pub fn check_caps(&self, replicas: &BTreeMap<String, u32>) -> Result<(), PlanError> {
        let cap = self.caps.replicas_per_service;
        if let Some((service, &n)) = replicas.iter().find(|(_, n)| **n > cap) {
            return Err(PlanError::TooManyReplicas {
                service: service.clone(),
                replicas: n,
                cap,
            });
        }
        let total: u64 = replicas.values().map(|&n| u64::from(n)).sum();
        let processes = total * u64::from(PROCESSES_PER_REPLICA) + 1;
        if processes > u64::from(self.caps.processes) {
            return Err(PlanError::TooManyProcesses {
                replicas: total,
                processes,
                cap: self.caps.processes,
            });
        }
        Ok(())
    }

    /// The engine of one replica of `service`.
    pub fn engine_command(&self, service: &str, ports: ReplicaPorts) -> CommandSpec {
        let worker = &self.workers[service];
        let at = ports.addresses();
        let mut env = worker.env.clone();
        for (name, value) in worker.engine.engine_env(&at) {
            let user = env.iter().position(|(n, _)| n == name);
            let connector = || path_arg(&self.connector_dir);
            match (value, user) {
                (EnvValue::ConnectorPath, Some(i)) => {
                    env[i].1 = format!("{}:{}", connector(), env[i].1)
                }
                (_, Some(_)) => {}
                (EnvValue::Literal(value), None) => env.push((name.into(), value)),
                (EnvValue::PodIp, None) => env.push((name.into(), at.sidecar_host.to_string())),
                (EnvValue::ConnectorPath, None) => env.push((name.into(), connector())),
            }
        }
        CommandSpec::from_argv(worker.engine.engine_argv(&at), env)
    }

    /// Whether an engine of the run loads our KV connector, whose package the runner then
    /// writes to [`Graph::connector_dir`].
    pub fn uses_connector(&self) -> bool {
        self.workers.values().any(|w| {
            w.engine
                .engine_env(&ReplicaPorts::default().addresses())
                .iter()
                .any(|(_, v)| *v == EnvValue::ConnectorPath)
        })
    }

    /// The sidecar of one replica of `service`, beside its engine. `kv_disk_dir` is the
    /// replica's own directory for a disk tier: `DYN_KVBM_DISK_CACHE_DIR` names a path in
    /// a pod, and the replicas of one machine must not share one. A decode sidecar takes
    /// its prefill peers from the run's `endpoints_file` (its ready prefill replicas).
    pub fn sidecar_command(
        &self,
        service: &str,
        ports: ReplicaPorts,
        kv_disk_dir: &Path,
        endpoints_file: &Path,
    ) -> CommandSpec {
        let worker = &self.workers[service];
        let hf_home = worker
            .env
            .iter()
            .rev()
            .find(|(name, _)| name == HF_HOME)
            .map(|(_, value)| value.as_str());
        let peers = [PrefillPeers::File(endpoints_file.to_owned())];
        let mut args = worker
            .engine
            .sidecar_args(&ports.addresses(), hf_home, &peers);
        if self.wiring.served_model.is_none() {
            args.extend(["--model-name".into(), self.model_name.clone()]);
        }
        // The service's log format is its sidecar's too (docs/dynamo-compatibility.md).
        let mut env: Vec<_> = (worker.env.iter())
            .filter(|(name, _)| dynamo_server::LOG_FORMAT_ENVS.contains(&name.as_str()))
            .cloned()
            .collect();
        let mut dirs = Vec::new();
        if let Some(tiers) = &worker.engine.kvbm {
            let prefix = kvbm::object_prefix(LOCAL_SCOPE, &self.name, service);
            args.extend(tiers.sidecar_args(&path_arg(kv_disk_dir), &prefix));
            if tiers.disk.is_some() {
                dirs.push(kv_disk_dir.to_owned());
            }
            if tiers.object.is_some() {
                let own = worker
                    .env
                    .iter()
                    .filter(|(n, _)| kvbm::for_object_client(n));
                env.extend(own.cloned());
                env.extend(tiers.object_env().into_iter().map(|(n, v)| (n.into(), v)));
            }
        }
        CommandSpec {
            program: SIDECAR_BINARY.into(),
            args,
            env,
            dirs,
        }
    }

    /// The endpoint picker with its OpenAI frontend on `http`.
    pub fn epp_command(
        &self,
        http: (&str, u16),
        ext_proc_port: u16,
        endpoints_file: &Path,
    ) -> CommandSpec {
        let picker = Picker {
            host: http.0.into(),
            http_port: http.1,
            ext_proc_port,
            metrics_port: None,
            model_path: Some(self.model_path.clone()),
            router_mode: self.router_mode.clone(),
            pods: PickerPods::EndpointsFile(endpoints_file.to_owned()),
        };
        let mut args = picker.args(Some(&self.wiring));
        if self.wiring.served_model.is_none() {
            args.extend(["--model-name".into(), self.model_name.clone()]);
        }
        args.extend(self.picker_args.iter().cloned());
        CommandSpec {
            program: EPP_BINARY.into(),
            args,
            env: self.picker_env.clone(),
            dirs: Vec::new(),
        }
    }
}

fn main_container(spec: &ComponentSpec) -> Option<&k8s_openapi::api::core::v1::Container> {
    spec.extra_pod_spec.as_ref()?.main_container.as_ref()
}

/// A service's environment: the graph's `envs`, then its own, then its main container's.
fn service_env(
    global: &[(String, String)],
    spec: &ComponentSpec,
    notes: &mut Vec<String>,
) -> Vec<(String, String)> {
    let mut env = global.to_vec();
    env.extend(env_pairs(spec.envs.as_deref(), notes));
    if let Some(m) = main_container(spec) {
        env.extend(env_pairs(m.env.as_deref(), notes));
    }
    env
}

/// Literal env values; a `valueFrom` (secrets, downward API) has no local source.
fn env_pairs(
    vars: Option<&[k8s_openapi::api::core::v1::EnvVar]>,
    notes: &mut Vec<String>,
) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for var in vars.unwrap_or_default() {
        match &var.value {
            Some(value) => pairs.push((var.name.clone(), value.clone())),
            None if var.value_from.is_some() => notes.push(format!(
                "env {} uses valueFrom, which has no source outside a cluster: not set",
                var.name
            )),
            None => pairs.push((var.name.clone(), String::new())),
        }
    }
    pairs
}

fn path_arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use dynamo_wiring::planner::ModeArg;

    pub(crate) fn sample(name: &str) -> DynamoGraphDeployment {
        let path = format!("{}/../config/samples/{name}", env!("CARGO_MANIFEST_DIR"));
        let yaml = std::fs::read_to_string(path).unwrap();
        let validated = dynamo_crds::validate::validate_manifest(&yaml).unwrap();
        validated.graph_deployments().next().unwrap().clone()
    }

    const CAPS: Caps = Caps {
        replicas_per_service: 8,
        processes: 20,
    };

    pub(crate) fn options() -> RunOptions {
        RunOptions {
            model_path: Some("/models/qwen-mock".into()),
            backend: None,
            router_mode: None,
            replicas: BTreeMap::new(),
            caps: CAPS,
        }
    }

    const PORTS: ReplicaPorts = ReplicaPorts {
        engine: 41001,
        engine_kv_events: 41002,
        engine_kv_replay: 41006,
        sidecar: 41003,
        sidecar_grpc: 41004,
        sidecar_metrics: 41005,
        kv_side_channel: 41007,
    };

    const ENDPOINTS: &str = "/run/dynamo-run-1/endpoints.json";

    #[test]
    fn the_aggregated_mocker_sample_runs_two_mocker_replicas() {
        let graph = Graph::from_dgd(&sample("agg-mocker.yaml"), &options()).unwrap();
        assert_eq!(graph.model_name, "Qwen/Qwen3-0.6B");
        assert_eq!(graph.block_size(), 64);
        assert_eq!(graph.workers.len(), 1);
        let worker = &graph.workers["worker"];
        assert_eq!((worker.role, worker.replicas), (Role::Aggregated, 2));
        let engine = graph.engine_command("worker", PORTS);
        assert_eq!(engine.program, "dynamo-mocker");
        let args = engine.args.join(" ");
        assert!(
            args.starts_with(
                "--model-path /models/qwen-mock --model-name Qwen/Qwen3-0.6B --num-gpu-blocks 4096"
            ),
            "{args}"
        );
        assert!(args.contains("--port 41001"), "{args}");
        assert!(
            args.contains("--kv-events-endpoint tcp://127.0.0.1:41002"),
            "{args}"
        );
        let sidecar =
            graph.sidecar_command("worker", PORTS, Path::new("/run/kv"), Path::new(ENDPOINTS));
        assert!(sidecar.dirs.is_empty(), "no disk tier, no directory");
        let sidecar = sidecar.args.join(" ");
        assert!(
            sidecar.contains("--engine-url http://127.0.0.1:41001"),
            "{sidecar}"
        );
        assert!(
            sidecar.contains("--engine-kv-events tcp://127.0.0.1:41002"),
            "{sidecar}"
        );
        assert!(sidecar.contains("--listen 127.0.0.1:41003"), "{sidecar}");
        let epp = graph
            .epp_command(("127.0.0.1", 8000), 9002, Path::new("/tmp/e.json"))
            .args
            .join(" ");
        assert!(epp.contains("--model-name Qwen/Qwen3-0.6B"), "{epp}");
        assert!(epp.contains("--block-size 64"), "{epp}");
        assert!(epp.contains("--endpoints-file /tmp/e.json"), "{epp}");
    }

    #[test]
    fn the_pickers_own_flags_and_environment_follow_ours_as_the_operator_passes_them() {
        let mut dgd = sample("agg-mocker.yaml");
        let epp = "componentType: epp\nenvs: [{name: A, value: '1'}]\nextraPodSpec: \
                   {mainContainer: {args: [--max-waiting-requests, '2'], env: [{name: B, value: '2'}]}}";
        dgd.spec
            .services
            .insert("epp".into(), serde_saphyr::from_str(epp).unwrap());
        let graph = Graph::from_dgd(&dgd, &options()).unwrap();
        let epp = graph.epp_command(("127.0.0.1", 8000), 9002, Path::new("/tmp/e.json"));
        let args = epp.args.join(" ");
        assert!(args.ends_with(" --max-waiting-requests 2"), "{args}");
        assert!(args.contains("--endpoints-file /tmp/e.json"), "{args}");
        let env: Vec<_> = epp
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(env, [("A", "1"), ("B", "2")]);
    }

    #[test]
    fn kv_tiers_go_to_each_replicas_own_directory_and_the_engine_offloads_to_its_sidecar() {
        let graph = Graph::from_dgd(&sample("agg-mocker-kvbm.yaml"), &options()).unwrap();
        let engine = graph.engine_command("worker", PORTS).args.join(" ");
        assert!(
            engine.ends_with("--kv-blocks-url http://127.0.0.1:41004"),
            "{engine}"
        );
        let dir = Path::new("/run/dynamo-run-1/kv-disk/worker-0");
        let sidecar = graph.sidecar_command("worker", PORTS, dir, Path::new(ENDPOINTS));
        assert!(
            sidecar.args.join(" ").ends_with(
                "--kv-host-bytes 2000000000 --kv-disk-dir /run/dynamo-run-1/kv-disk/worker-0 \
                 --kv-disk-bytes 10000000000"
            ),
            "{:?}",
            sidecar.args
        );
        assert_eq!(sidecar.dirs, [dir]);
        assert!(sidecar.env.is_empty());
    }

    #[test]
    fn the_services_log_format_reaches_its_sidecar() {
        let mut dgd = sample("agg-mocker.yaml");
        let var = |name: &str, value: &str| k8s_openapi::api::core::v1::EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        };
        let worker = dgd.spec.services.get_mut("worker").unwrap();
        worker.envs = Some(vec![var("DYN_LOGGING_JSONL", "1"), var("OTHER", "x")]);
        let graph = Graph::from_dgd(&dgd, &options()).unwrap();
        let sidecar = graph.sidecar_command("worker", PORTS, Path::new("/d"), Path::new(ENDPOINTS));
        assert_eq!(
            sidecar.env,
            [("DYN_LOGGING_JSONL".to_string(), "1".to_string())]
        );
    }

    #[test]
    fn tiers_on_a_vllm_worker_load_our_connector_unless_it_runs_several_ranks() {
        let mut dgd = sample("agg-vllm.yaml");
        let worker = dgd.spec.services.get_mut("VllmWorker").unwrap();
        worker.envs = Some(vec![
            k8s_openapi::api::core::v1::EnvVar {
                name: "DYN_KVBM_CPU_CACHE_GB".into(),
                value: Some("2".into()),
                value_from: None,
            },
            k8s_openapi::api::core::v1::EnvVar {
                name: "PYTHONPATH".into(),
                value: Some("/mine".into()),
                value_from: None,
            },
        ]);
        let mut graph = Graph::from_dgd(&dgd, &options()).unwrap();
        assert!(graph.warnings.is_empty(), "{:?}", graph.warnings);
        assert!(graph.uses_connector());
        graph.connector_dir = PathBuf::from("/run/dynamo/python");
        let engine = graph.engine_command("VllmWorker", PORTS);
        let path = engine
            .env
            .iter()
            .find(|(name, _)| name == "PYTHONPATH")
            .unwrap();
        assert_eq!(
            path.1, "/run/dynamo/python:/mine",
            "ours first, the user's kept"
        );
        assert!(
            engine
                .args
                .iter()
                .any(|a| a.contains("DynamoSidecarConnector"))
        );

        let main = worker_main(&mut dgd);
        main.args
            .get_or_insert_with(Vec::new)
            .extend(["-tp".into(), "2".into()]);
        let graph = Graph::from_dgd(&dgd, &options()).unwrap();
        assert_eq!(graph.warnings.len(), 1);
        assert!(
            graph.warnings[0].starts_with("VllmWorker: KV block tiers are set (DYN_KVBM_*)"),
            "{:?}",
            graph.warnings
        );
        let on_mocker = RunOptions {
            backend: Some(BackendFramework::Mocker),
            ..options()
        };
        let on_mocker = Graph::from_dgd(&dgd, &on_mocker).unwrap();
        assert_eq!(on_mocker.warnings, [] as [String; 0]);
        assert!(!on_mocker.uses_connector());
        let kvbm = Graph::from_dgd(&sample("agg-mocker-kvbm.yaml"), &options()).unwrap();
        assert!(kvbm.warnings.is_empty());
    }

    fn worker_main(dgd: &mut DynamoGraphDeployment) -> &mut k8s_openapi::api::core::v1::Container {
        let worker = dgd.spec.services.get_mut("VllmWorker").unwrap();
        worker
            .extra_pod_spec
            .as_mut()
            .unwrap()
            .main_container
            .as_mut()
            .unwrap()
    }

    #[test]
    fn the_object_tier_gets_the_services_aws_settings_under_a_local_prefix() {
        let mut dgd = sample("agg-mocker-kvbm.yaml");
        let worker = dgd.spec.services.get_mut("worker").unwrap();
        let var = |name: &str, value: &str| k8s_openapi::api::core::v1::EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        };
        worker.envs = Some(vec![
            var("AWS_ACCESS_KEY_ID", "id"),
            var("DYN_KVBM_OBJECT_ENABLED", "true"),
            var("DYN_KVBM_OBJECT_BUCKET", "kv-blocks"),
            var("DYNAMO_KVBM_OBJECT_CACHE_GB", "1"),
            var("DYN_KVBM_OBJECT_ENDPOINT", "https://s3.example.com"),
        ]);
        let graph = Graph::from_dgd(&dgd, &options()).unwrap();
        let sidecar =
            graph.sidecar_command("worker", PORTS, Path::new("/kv"), Path::new(ENDPOINTS));
        assert_eq!(
            sidecar.args[sidecar.args.len() - 4..],
            [
                "--kv-object-url",
                "s3://kv-blocks/local/agg-mocker-kvbm/worker",
                "--kv-object-bytes",
                "1000000000"
            ]
        );
        assert!(sidecar.dirs.is_empty());
        assert_eq!(
            sidecar.env,
            [
                ("AWS_ACCESS_KEY_ID".to_string(), "id".to_string()),
                ("AWS_ENDPOINT_URL".into(), "https://s3.example.com".into()),
            ]
        );
    }

    #[test]
    fn a_bad_tier_value_stops_a_local_run() {
        let mut dgd = sample("agg-mocker-kvbm.yaml");
        let worker = dgd.spec.services.get_mut("worker").unwrap();
        worker.envs.as_mut().unwrap()[1].value = Some("ten".into());
        let err = Graph::from_dgd(&dgd, &options()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("spec.services.worker: DYN_KVBM_DISK_CACHE_GB is \"ten\""),
            "{err}"
        );
    }

    #[test]
    fn the_disaggregated_sample_has_prefill_and_decode_roles() {
        let graph = Graph::from_dgd(&sample("disagg-mocker.yaml"), &options()).unwrap();
        let roles: Vec<_> = graph
            .workers
            .iter()
            .map(|(n, w)| (n.as_str(), w.role, w.replicas))
            .collect();
        assert_eq!(
            roles,
            vec![("decode", Role::Decode, 2), ("prefill", Role::Prefill, 1)]
        );
    }

    #[test]
    fn disaggregated_mockers_lease_through_their_sidecars_and_decodes_know_their_peers() {
        let graph = Graph::from_dgd(&sample("disagg-mocker.yaml"), &options()).unwrap();
        for service in ["prefill", "decode"] {
            let engine = graph.engine_command(service, PORTS).args.join(" ");
            assert!(
                engine.ends_with("--kv-blocks-url http://127.0.0.1:41004 --kv-offload none"),
                "{service}: {engine}"
            );
        }
        let sidecar = |service| {
            graph
                .sidecar_command(service, PORTS, Path::new("/kv"), Path::new(ENDPOINTS))
                .args
        };
        let decode = sidecar("decode");
        let at = decode.iter().position(|w| w == "--prefill-peers").unwrap();
        assert_eq!(decode[at + 1], format!("file:{ENDPOINTS}"));
        assert!(!sidecar("prefill").contains(&"--prefill-peers".to_string()));
    }

    #[test]
    fn disaggregated_vllm_workers_get_a_side_channel_of_their_own() {
        let graph = Graph::from_dgd(&sample("dynamo/vllm-disagg.yaml"), &options()).unwrap();
        for service in ["VllmPrefillWorker", "VllmDecodeWorker"] {
            let engine = graph.engine_command(service, PORTS);
            let side_channel: Vec<_> = engine
                .env
                .iter()
                .filter(|(name, _)| name.starts_with("VLLM_NIXL_SIDE_CHANNEL_"))
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            assert_eq!(
                side_channel,
                [
                    ("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1"),
                    ("VLLM_NIXL_SIDE_CHANNEL_PORT", "41007")
                ],
                "{service}"
            );
        }
        let agg = Graph::from_dgd(&sample("agg-vllm.yaml"), &options()).unwrap();
        let env = agg.engine_command("VllmWorker", PORTS).env;
        assert!(env.iter().all(|(n, _)| !n.starts_with("VLLM_NIXL")));
    }

    #[test]
    fn vllm_workers_get_loopback_ports_and_a_kv_event_publisher() {
        let graph = Graph::from_dgd(&sample("agg-vllm.yaml"), &options()).unwrap();
        assert_eq!(graph.model_name, "Qwen/Qwen3-0.6B");
        assert_eq!(graph.block_size(), 16);
        let engine = graph.engine_command("VllmWorker", PORTS);
        assert_eq!(engine.program, "vllm");
        assert_eq!(&engine.args[..2], ["serve", "Qwen/Qwen3-0.6B"]);
        let config = engine.args[engine.args.len() - 1].clone();
        assert!(
            config.contains(r#""endpoint":"tcp://127.0.0.1:41002""#)
                && config.contains(r#""replay_endpoint":"tcp://127.0.0.1:41006""#),
            "{config}"
        );
        assert!(
            engine
                .env
                .contains(&("HF_HOME".into(), "/models/hf".into()))
        );
    }

    #[test]
    fn dynamos_published_graph_runs_on_the_mock_engine_when_asked() {
        let opts = RunOptions {
            backend: Some(BackendFramework::Mocker),
            ..options()
        };
        let graph = Graph::from_dgd(&sample("dynamo/vllm-disagg.yaml"), &opts).unwrap();
        assert_eq!(graph.model_name, "Qwen/Qwen3-0.6B");
        assert_eq!(graph.router_mode, "kv");
        let roles: Vec<_> = graph.workers.values().map(|w| w.role).collect();
        assert_eq!(roles, [Role::Decode, Role::Prefill]);
        let engine = graph.engine_command("VllmPrefillWorker", PORTS);
        assert_eq!(engine.program, "dynamo-mocker");
        assert_eq!(
            engine.args[..4],
            [
                "--model-path",
                "/models/qwen-mock",
                "--model-name",
                "Qwen/Qwen3-0.6B"
            ]
        );
        // Without the override it is vLLM's own server, as on a cluster.
        let vllm = Graph::from_dgd(&sample("dynamo/vllm-disagg.yaml"), &options()).unwrap();
        assert_eq!(
            vllm.engine_command("VllmPrefillWorker", PORTS).program,
            "vllm"
        );
    }

    #[test]
    fn multinode_workers_are_refused_with_the_reason() {
        let err = Graph::from_dgd(&sample("multinode-vllm.yaml"), &options()).unwrap_err();
        assert!(matches!(err, PlanError::Multinode(_, n) if n > 1), "{err}");
    }

    #[test]
    fn replica_overrides_must_name_a_worker_service() {
        let dgd = sample("agg-mocker.yaml");
        let mut opts = options();
        opts.replicas.insert("worker".into(), 4);
        assert_eq!(
            Graph::from_dgd(&dgd, &opts).unwrap().workers["worker"].replicas,
            4
        );
        opts.replicas = BTreeMap::from([("nope".into(), 1)]);
        assert_eq!(
            Graph::from_dgd(&dgd, &opts),
            Err(PlanError::UnknownService("nope".into()))
        );
        opts.replicas = BTreeMap::from([("epp".into(), 1)]);
        assert_eq!(
            Graph::from_dgd(&dgd, &opts),
            Err(PlanError::NotScalable("epp".into()))
        );
    }

    #[test]
    fn replicas_and_processes_are_capped_from_the_file_and_the_flag() {
        let mut dgd = sample("disagg-mocker.yaml");
        dgd.spec.services.get_mut("decode").unwrap().replicas = Some(100_000);
        assert_eq!(
            Graph::from_dgd(&dgd, &options()),
            Err(PlanError::TooManyReplicas {
                service: "decode".into(),
                replicas: 100_000,
                cap: 8
            })
        );
        let mut opts = options();
        opts.replicas.insert("decode".into(), 9);
        let err = Graph::from_dgd(&sample("disagg-mocker.yaml"), &opts).unwrap_err();
        assert_eq!(
            err.to_string(),
            "service \"decode\": 9 replicas is more than the local cap of 8 per service (--max-replicas)"
        );
        // 8 + 2 replicas: 20 processes and the picker.
        opts.replicas = BTreeMap::from([("decode".into(), 8), ("prefill".into(), 2)]);
        assert_eq!(
            Graph::from_dgd(&sample("disagg-mocker.yaml"), &opts),
            Err(PlanError::TooManyProcesses {
                replicas: 10,
                processes: 21,
                cap: 20
            })
        );
        opts.replicas.insert("prefill".into(), 1);
        let graph = Graph::from_dgd(&sample("disagg-mocker.yaml"), &opts).unwrap();
        assert_eq!(graph.workers["decode"].replicas, 8);
    }

    /// A graph of `sample` whose planner service runs `dynamo planner` with `args`.
    fn with_planner(sample_name: &str, args: &[&str]) -> DynamoGraphDeployment {
        let mut dgd = sample(sample_name);
        let yaml = format!(
            "componentType: planner\nextraPodSpec: {{mainContainer: {{command: [dynamo, planner], args: [{}]}}}}",
            args.join(", ")
        );
        let planner = serde_saphyr::from_str(&yaml).unwrap();
        dgd.spec.services.insert("planner".into(), planner);
        dgd
    }

    #[test]
    fn the_planner_sample_plans_against_the_run_with_the_mock_engines_profile() {
        let graph = Graph::from_dgd(&sample("agg-mocker-planner.yaml"), &options()).unwrap();
        assert!(graph.notes.is_empty(), "{:?}", graph.notes);
        assert_eq!(graph.picker_service, "epp");
        let planner = graph.planner.as_ref().unwrap();
        assert_eq!(planner.name, "planner");
        assert_eq!(planner.profile_from.as_deref(), Some("worker"));
        let profile = Path::new("/run/dynamo-run-1/planner-profile.json");
        let command = graph
            .planner_command(
                "http://127.0.0.1:7000",
                "http://127.0.0.1:9090",
                "127.0.0.1:9300".parse().unwrap(),
                Some(profile),
            )
            .unwrap()
            .unwrap();
        assert_eq!(command.program, "dynamo");
        let parsed = dynamo_wiring::planner::parse(&command.args).unwrap();
        assert_eq!(parsed.admin_url.as_deref(), Some("http://127.0.0.1:7000"));
        assert_eq!(parsed.prometheus, "http://127.0.0.1:9090");
        assert_eq!(parsed.metrics_addr, "127.0.0.1:9300".parse().unwrap());
        assert_eq!(parsed.profile.as_deref(), Some(profile));
        assert_eq!(parsed.interval, Some(std::time::Duration::from_secs(10)));

        // The profile: the worker's own mock engine, told to measure itself and exit.
        let measure = graph.profile_command(profile).unwrap();
        assert_eq!(measure.program, "dynamo-mocker");
        let args = measure.args.join(" ");
        assert!(args.contains("--max-num-seqs 8"), "{args}");
        assert!(
            args.ends_with("--planner-profile-out /run/dynamo-run-1/planner-profile.json"),
            "{args}"
        );
    }

    #[test]
    fn a_planner_with_a_profile_or_in_load_mode_needs_no_measurement() {
        for args in [&["--mode", "load"][..], &["--profile", "/p.json"]] {
            let graph =
                Graph::from_dgd(&with_planner("agg-mocker.yaml", args), &options()).unwrap();
            let planner = graph.planner.as_ref().unwrap();
            assert_eq!(planner.profile_from, None, "{args:?}");
            assert!(graph.profile_command(Path::new("/p")).is_none());
        }
    }

    #[test]
    fn a_throughput_planner_without_a_profile_or_a_mock_engine_is_refused() {
        let dgd = with_planner("agg-vllm.yaml", &[]);
        let err = Graph::from_dgd(&dgd, &options()).unwrap_err();
        assert_eq!(
            err,
            PlanError::PlannerProfile(PlannerWiringError::NoProfile {
                service: "planner".into()
            })
        );
        let message = err.to_string();
        for way_out in ["--profile FILE", "--mode load", "--no-planner"] {
            assert!(message.contains(way_out), "{message}");
        }
        // The same graph on the mock engine measures it.
        let opts = RunOptions {
            backend: Some(BackendFramework::Mocker),
            ..options()
        };
        let graph = Graph::from_dgd(&dgd, &opts).unwrap();
        assert_eq!(
            graph.planner.unwrap().profile_from.as_deref(),
            Some("VllmWorker")
        );
    }

    #[test]
    fn dynamos_planner_flags_carry_over_and_a_planner_of_its_own_is_noted() {
        // Dynamo's published disaggregated graph: `python3 -m planner_sla` flags.
        let opts = RunOptions {
            backend: Some(BackendFramework::Mocker),
            ..options()
        };
        // On the mock engine it plans throughput with the decode engine's profile.
        let graph = Graph::from_dgd(&sample("disagg-vllm.yaml"), &opts).unwrap();
        let planner = graph.planner.as_ref().unwrap();
        assert_eq!(planner.profile_from.as_deref(), Some("VllmDecodeWorker"));
        let profile = Path::new("/run/p.json");
        let command = graph
            .planner_command(
                "http://a",
                "http://p",
                "127.0.0.1:1".parse().unwrap(),
                Some(profile),
            )
            .unwrap()
            .unwrap();
        let parsed = dynamo_wiring::planner::parse(&command.args).unwrap();
        assert_eq!(parsed.interval, Some(std::time::Duration::from_secs(60)));
        assert_eq!(parsed.mode, ModeArg::Throughput);
        // On vLLM there is no profile to measure: it plans on load.
        let graph = Graph::from_dgd(&sample("disagg-vllm.yaml"), &options()).unwrap();
        assert_eq!(graph.planner.as_ref().unwrap().profile_from, None);
        let command = graph
            .planner_command("http://a", "http://p", "127.0.0.1:1".parse().unwrap(), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            dynamo_wiring::planner::parse(&command.args).unwrap().mode,
            ModeArg::Load
        );

        let mut dgd = sample("agg-mocker.yaml");
        let own = "componentType: planner\nextraPodSpec: {mainContainer: {command: [python3, my_planner.py]}}";
        dgd.spec
            .services
            .insert("planner".into(), serde_saphyr::from_str(own).unwrap());
        let graph = Graph::from_dgd(&dgd, &options()).unwrap();
        assert!(graph.planner.is_none());
        assert!(
            graph.notes[0].contains("runs its own program \"python3\""),
            "{:?}",
            graph.notes
        );
    }

    #[test]
    fn a_model_directory_is_required() {
        let opts = RunOptions {
            model_path: None,
            ..options()
        };
        assert_eq!(
            Graph::from_dgd(&sample("agg-mocker.yaml"), &opts),
            Err(PlanError::NoModelPath)
        );
    }
}
