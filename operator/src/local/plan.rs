//! What a local run starts, decided from the DGD alone (no processes, no sockets): one
//! endpoint picker with its OpenAI frontend, and per worker replica an engine and its
//! sidecar, wired the way the operator wires a pod (`DESIGN.md`, "Pod anatomy"), but on
//! loopback ports instead of fixed pod ports.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dynamo_crds::{BackendFramework, ComponentSpec, ComponentType, DynamoGraphDeployment};

/// How the user asked to run the graph.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Model directory (tokenizer, chat template) for the picker and the mocker.
    pub model_path: Option<PathBuf>,
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

/// Why a graph cannot run locally; each says what to change.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("the graph has no worker service (componentType worker, prefill or decode)")]
    NoWorkers,
    #[error(
        "service {0:?} is multi-node (nodeCount {1}); the local runner starts single-node replicas only: deploy it on a cluster"
    )]
    Multinode(String, i32),
    #[error("--replicas names service {0:?}, which the graph does not have")]
    UnknownService(String),
    #[error("service {0:?} is not a worker (prefill, decode or worker): it cannot be scaled")]
    NotScalable(String),
    #[error("spec.backendFramework is not set: say which engine the workers run")]
    NoBackend,
    #[error(
        "service {0:?} has no extraPodSpec.mainContainer.command: the local runner needs the engine command for backend {1}"
    )]
    NoCommand(String, &'static str),
    #[error(
        "no model directory: pass --model-path DIR (a Hugging Face-style directory with tokenizer.json; `make model` builds one)"
    )]
    NoModelPath,
    #[error("workers serve different models ({0:?} and {1:?}); one local graph serves one model")]
    ModelMismatch(String, String),
    #[error("workers use different KV block sizes ({0} and {1}); the picker needs one")]
    BlockSizeMismatch(u32, u32),
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

/// The role of a worker replica, as the picker's endpoints file names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Worker,
    Prefill,
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// A program to start: the name is resolved by the runner (our binaries first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandSpec {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// The loopback ports of one replica ("pod").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaPorts {
    pub engine: u16,
    pub engine_kv_events: u16,
    pub sidecar: u16,
    pub sidecar_grpc: u16,
    pub sidecar_metrics: u16,
}

/// A worker service: how to start each of its replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerService {
    pub role: Role,
    pub replicas: u32,
    backend: BackendFramework,
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    model_path: Option<PathBuf>,
}

/// The whole local graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Graph {
    pub name: String,
    pub backend: BackendFramework,
    pub model_name: String,
    pub block_size: u32,
    pub model_path: PathBuf,
    pub workers: BTreeMap<String, WorkerService>,
    /// Services that are not started, and why.
    pub notes: Vec<String>,
    pub caps: Caps,
}

/// Flags the runner owns in an engine command; the user's values are dropped because a
/// local replica's ports are chosen at run time.
const RUNNER_FLAGS: [&str; 4] = [
    "--host",
    "--port",
    "--kv-events-endpoint",
    "--kv-events-config",
];

impl Graph {
    pub fn from_dgd(dgd: &DynamoGraphDeployment, options: &RunOptions) -> Result<Self, PlanError> {
        let name = dgd.metadata.name.clone().unwrap_or_else(|| "graph".into());
        let spec = &dgd.spec;
        for service in options.replicas.keys() {
            match spec.services.get(service).map(worker_role) {
                None => return Err(PlanError::UnknownService(service.clone())),
                Some(None) => return Err(PlanError::NotScalable(service.clone())),
                Some(Some(_)) => {}
            }
        }
        let mut workers = BTreeMap::new();
        let mut notes = Vec::new();
        let global_env = env_pairs(spec.envs.as_deref(), &mut notes);
        for (service, component) in &spec.services {
            let Some(role) = worker_role(component) else {
                if let Some(note) = skipped(service, component) {
                    notes.push(note);
                }
                continue;
            };
            if component.node_count() > 1 {
                return Err(PlanError::Multinode(
                    service.clone(),
                    component.node_count(),
                ));
            }
            let backend = spec.backend_framework.ok_or(PlanError::NoBackend)?;
            let main = component
                .extra_pod_spec
                .as_ref()
                .and_then(|e| e.main_container.as_ref());
            let command = main.and_then(|m| m.command.clone()).unwrap_or_default();
            let mut args = command.get(1..).map(<[String]>::to_vec).unwrap_or_default();
            args.extend(main.and_then(|m| m.args.clone()).unwrap_or_default());
            let program = match (command.first(), backend) {
                (Some(program), _) => program.clone(),
                (None, BackendFramework::Mocker) => "dynamo-mocker".into(),
                (None, other) => {
                    return Err(PlanError::NoCommand(service.clone(), backend_name(other)));
                }
            };
            let mut env = global_env.clone();
            env.extend(env_pairs(component.envs.as_deref(), &mut notes));
            if let Some(m) = main {
                env.extend(env_pairs(m.env.as_deref(), &mut notes));
            }
            let replicas = options
                .replicas
                .get(service)
                .copied()
                .unwrap_or_else(|| component.replicas.unwrap_or(1).max(0) as u32);
            workers.insert(
                service.clone(),
                WorkerService {
                    role,
                    replicas,
                    backend,
                    program,
                    args: without_runner_flags(&args),
                    env,
                    model_path: flag_value(&args, "--model-path").map(PathBuf::from),
                },
            );
        }
        let first = workers.values().next().ok_or(PlanError::NoWorkers)?;
        let backend = first.backend;
        let model_path = options
            .model_path
            .clone()
            .or_else(|| first.model_path.clone())
            .ok_or(PlanError::NoModelPath)?;
        let mut served: Option<(String, u32)> = None;
        for worker in workers.values() {
            let model = worker.served_model(&model_path);
            let block_size = worker.block_size();
            if let Some((m, b)) = &served {
                if *m != model {
                    return Err(PlanError::ModelMismatch(m.clone(), model));
                }
                if *b != block_size {
                    return Err(PlanError::BlockSizeMismatch(*b, block_size));
                }
            }
            served = Some((model, block_size));
        }
        let (model_name, block_size) = served.expect("at least one worker");
        let graph = Self {
            name,
            backend,
            model_name,
            block_size,
            model_path,
            workers,
            notes,
            caps: options.caps,
        };
        let planned = graph
            .workers
            .iter()
            .map(|(service, w)| (service.clone(), w.replicas))
            .collect();
        graph.check_caps(&planned)?;
        Ok(graph)
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
        let mut args = worker.args.clone();
        let host = ["--host".to_string(), "127.0.0.1".into()];
        let port = ["--port".to_string(), ports.engine.to_string()];
        match worker.backend {
            BackendFramework::Mocker => {
                args.extend(host);
                args.extend(port);
                args.extend([
                    "--kv-events-endpoint".into(),
                    format!("tcp://127.0.0.1:{}", ports.engine_kv_events),
                ]);
                if worker.model_path.is_none() {
                    args.extend(["--model-path".into(), path_arg(&self.model_path)]);
                }
            }
            // vLLM publishes KV events when given a ZMQ publisher config
            // (vllm/config/kv_events.py, `KVEventsConfig`: enable_kv_cache_events,
            // publisher, endpoint); SGLang takes the same `--kv-events-config` JSON.
            BackendFramework::Vllm | BackendFramework::Sglang => {
                args.extend(host);
                args.extend(port);
                args.extend([
                    "--kv-events-config".into(),
                    format!(
                        r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:{}"}}"#,
                        ports.engine_kv_events
                    ),
                ]);
            }
            BackendFramework::Trtllm => {
                args.extend(host);
                args.extend(port);
            }
        }
        CommandSpec {
            program: worker.program.clone(),
            args,
            env: worker.env.clone(),
        }
    }

    /// The sidecar of one replica, beside its engine.
    pub fn sidecar_command(&self, ports: ReplicaPorts) -> CommandSpec {
        let engine_events = match self.backend {
            BackendFramework::Trtllm => "none".to_string(),
            _ => format!("tcp://127.0.0.1:{}", ports.engine_kv_events),
        };
        CommandSpec {
            program: "dynamo-sidecar".into(),
            args: vec![
                "--listen".into(),
                format!("127.0.0.1:{}", ports.sidecar),
                "--host".into(),
                "127.0.0.1".into(),
                "--engine-url".into(),
                format!("http://127.0.0.1:{}", ports.engine),
                "--engine-kv-events".into(),
                engine_events,
                "--grpc-port".into(),
                ports.sidecar_grpc.to_string(),
                "--metrics-port".into(),
                ports.sidecar_metrics.to_string(),
                "--model-name".into(),
                self.model_name.clone(),
            ],
            env: Vec::new(),
        }
    }

    /// The endpoint picker with its OpenAI frontend on `http`.
    pub fn epp_command(
        &self,
        http: (&str, u16),
        ext_proc_port: u16,
        router_mode: &str,
        endpoints_file: &Path,
    ) -> CommandSpec {
        CommandSpec {
            program: "dynamo-epp".into(),
            args: vec![
                "--host".into(),
                http.0.into(),
                "--http-port".into(),
                http.1.to_string(),
                "--ext-proc-port".into(),
                ext_proc_port.to_string(),
                "--model-path".into(),
                path_arg(&self.model_path),
                "--model-name".into(),
                self.model_name.clone(),
                "--block-size".into(),
                self.block_size.to_string(),
                "--router-mode".into(),
                router_mode.into(),
                "--endpoints-file".into(),
                path_arg(endpoints_file),
            ],
            env: Vec::new(),
        }
    }
}

impl WorkerService {
    /// The model name clients send: the engine's served name, else its model, else the
    /// model directory's name (the mocker's and the picker's default).
    fn served_model(&self, model_path: &Path) -> String {
        let name_flags: &[&str] = match self.backend {
            BackendFramework::Mocker => &["--model-name"],
            BackendFramework::Vllm => &["--served-model-name", "--model"],
            BackendFramework::Sglang => &["--served-model-name", "--model-path"],
            BackendFramework::Trtllm => &["--served-model-name", "--model"],
        };
        name_flags
            .iter()
            .find_map(|flag| flag_value(&self.args, flag))
            .or_else(|| {
                // `vllm serve MODEL` names the model positionally.
                (self.backend == BackendFramework::Vllm
                    && self.args.first().is_some_and(|a| a == "serve"))
                .then(|| self.args.get(1).cloned())
                .flatten()
            })
            .unwrap_or_else(|| {
                model_path
                    .file_name()
                    .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
            })
    }

    /// KV block size in tokens: the engine's flag, else its default (the mocker's 64;
    /// vLLM's 16 on CUDA, `vllm/config/cache.py`).
    fn block_size(&self) -> u32 {
        let flag = match self.backend {
            BackendFramework::Sglang => "--page-size",
            _ => "--block-size",
        };
        flag_value(&self.args, flag)
            .and_then(|v| v.parse().ok())
            .unwrap_or(match self.backend {
                BackendFramework::Mocker => 64,
                BackendFramework::Sglang => 1,
                BackendFramework::Vllm | BackendFramework::Trtllm => 16,
            })
    }
}

/// A worker's role; Dynamo also marks disaggregated workers as `componentType: worker`
/// with `subComponentType: prefill|decode`.
fn worker_role(component: &ComponentSpec) -> Option<Role> {
    match component.component_type? {
        ComponentType::Worker | ComponentType::Main => {
            Some(match component.sub_component_type.as_deref() {
                Some("prefill") => Role::Prefill,
                Some("decode") => Role::Decode,
                _ => Role::Worker,
            })
        }
        ComponentType::Prefill => Some(Role::Prefill),
        ComponentType::Decode => Some(Role::Decode),
        ComponentType::Frontend
        | ComponentType::Epp
        | ComponentType::Planner
        | ComponentType::Default => None,
    }
}

/// A note for a service the runner does not start itself, or `None` when the runner's
/// own endpoint picker takes its place.
fn skipped(service: &str, component: &ComponentSpec) -> Option<String> {
    match component.component_type {
        Some(ComponentType::Frontend | ComponentType::Epp) => None,
        Some(ComponentType::Planner) => Some(format!(
            "service {service:?} (planner) is not started: the planner is not part of local runs yet; scale with POST /scale"
        )),
        _ => Some(format!(
            "service {service:?} has no worker, prefill, decode, frontend or epp componentType: not started"
        )),
    }
}

fn backend_name(backend: BackendFramework) -> &'static str {
    match backend {
        BackendFramework::Vllm => "vllm",
        BackendFramework::Sglang => "sglang",
        BackendFramework::Trtllm => "trtllm",
        BackendFramework::Mocker => "mocker",
    }
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

/// The value of `--flag VALUE` or `--flag=VALUE` (the last one wins, as in argparse).
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let mut found = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == flag {
            found = iter.next().cloned();
        } else if let Some(value) = arg.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(value.to_owned());
        }
    }
    found
}

fn without_runner_flags(args: &[String]) -> Vec<String> {
    let mut kept = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if RUNNER_FLAGS.contains(&arg.as_str()) {
            iter.next();
        } else if !RUNNER_FLAGS
            .iter()
            .any(|f| arg.starts_with(f) && arg[f.len()..].starts_with('='))
        {
            kept.push(arg.clone());
        }
    }
    kept
}

fn path_arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str) -> DynamoGraphDeployment {
        let path = format!("{}/../config/samples/{name}", env!("CARGO_MANIFEST_DIR"));
        let yaml = std::fs::read_to_string(path).unwrap();
        let validated = dynamo_crds::validate::validate_manifest(&yaml).unwrap();
        validated.graph_deployments().next().unwrap().clone()
    }

    const CAPS: Caps = Caps {
        replicas_per_service: 8,
        processes: 20,
    };

    fn options() -> RunOptions {
        RunOptions {
            model_path: Some("/models/qwen-mock".into()),
            replicas: BTreeMap::new(),
            caps: CAPS,
        }
    }

    const PORTS: ReplicaPorts = ReplicaPorts {
        engine: 41001,
        engine_kv_events: 41002,
        sidecar: 41003,
        sidecar_grpc: 41004,
        sidecar_metrics: 41005,
    };

    #[test]
    fn the_aggregated_mocker_sample_runs_two_mocker_replicas() {
        let graph = Graph::from_dgd(&sample("agg-mocker.yaml"), &options()).unwrap();
        assert_eq!(graph.model_name, "Qwen/Qwen3-0.6B");
        assert_eq!(graph.block_size, 64);
        assert_eq!(graph.workers.len(), 1);
        let worker = &graph.workers["worker"];
        assert_eq!((worker.role, worker.replicas), (Role::Worker, 2));
        let engine = graph.engine_command("worker", PORTS);
        assert_eq!(engine.program, "dynamo-mocker");
        let args = engine.args.join(" ");
        assert!(
            args.starts_with("--model-name Qwen/Qwen3-0.6B --num-gpu-blocks 4096"),
            "{args}"
        );
        assert!(args.contains("--port 41001"), "{args}");
        assert!(
            args.contains("--kv-events-endpoint tcp://127.0.0.1:41002"),
            "{args}"
        );
        assert!(args.contains("--model-path /models/qwen-mock"), "{args}");
        let sidecar = graph.sidecar_command(PORTS).args.join(" ");
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
            .epp_command(("127.0.0.1", 8000), 9002, "kv", Path::new("/tmp/e.json"))
            .args
            .join(" ");
        assert!(epp.contains("--model-name Qwen/Qwen3-0.6B"), "{epp}");
        assert!(epp.contains("--block-size 64"), "{epp}");
        assert!(epp.contains("--endpoints-file /tmp/e.json"), "{epp}");
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
    fn vllm_workers_get_loopback_ports_and_a_kv_event_publisher() {
        let graph = Graph::from_dgd(&sample("agg-vllm.yaml"), &options()).unwrap();
        assert_eq!(graph.model_name, "Qwen/Qwen3-0.6B");
        assert_eq!(graph.block_size, 16);
        let engine = graph.engine_command("VllmWorker", PORTS);
        assert_eq!(engine.program, "python3");
        assert_eq!(&engine.args[..3], ["-m", "dynamo.vllm", "--model"]);
        let config = flag_value(&engine.args, "--kv-events-config").unwrap();
        assert!(
            config.contains(r#""endpoint":"tcp://127.0.0.1:41002""#),
            "{config}"
        );
        assert!(
            engine
                .env
                .contains(&("HF_HOME".into(), "/models/hf".into()))
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

    #[test]
    fn user_port_flags_give_way_to_the_runners() {
        let args: Vec<String> = ["--port", "8001", "--host=0.0.0.0", "--x", "1", "--portable"]
            .map(String::from)
            .to_vec();
        assert_eq!(without_runner_flags(&args), ["--x", "1", "--portable"]);
        assert_eq!(flag_value(&args, "--x").as_deref(), Some("1"));
        assert_eq!(flag_value(&args, "--host").as_deref(), Some("0.0.0.0"));
        assert_eq!(flag_value(&args, "--nope"), None);
    }
}
