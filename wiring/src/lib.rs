//! The wiring plan: one pure place that turns a graph's services into what runs: each
//! engine's command, flags and environment per backend (address, KV event publisher,
//! model, block size, disaggregation role and KV side channel), its sidecar's flags (with
//! the KV block tiers its env asks for, `kvbm`, and a decode pod's prefill peers), and the
//! endpoint picker's flags.
//!
//! The operator's pods (`dynamo-operator`'s `reconcile`) and the local runner's processes
//! (`dynamo-local`) are two renderings of it: they differ only in [`Addresses`] (the
//! fixed pod ports of `DESIGN.md` "Pod anatomy" or free loopback ports), in where decode
//! sidecars find the prefill pods ([`PrefillPeers`]: a headless Service or the runner's
//! endpoints file) and in how the picker finds its pods and its model.
//!
//! Engine commands are ours to write when the service runs a launcher we know (the
//! engines' own servers, Dynamo's worker wrappers, the mock engine): Dynamo's wrappers
//! become the engine's OpenAI server with the flags that carry over (`engines.rs`). A
//! command we do not know runs as written; it must then keep the pod's contract itself.
//!
//! It also holds the contracts between our programs that the plan writes or that sit
//! beside it: the planner's flags and environment ([`planner::PlannerArgs`], which parses
//! every planner command line written here) and the local runner's `GET /graph` answer
//! ([`admin::GraphStatus`]). It depends on no crate of ours above it.

pub mod admin;
mod argv;
pub mod connector;
pub mod credential;
mod engines;
pub mod kvbm;
pub mod planner;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use argv::Arity;
use kvbm::{Kvbm, KvbmError};
use planner::PlannerWiringError;

use dynamo_crds::{BackendFramework, ComponentSpec, DynamoGraphDeploymentSpec, ServiceRole};
use dynamo_names::Role;

/// Where one replica's processes listen. The engine and its KV event sockets are always
/// on loopback: only the sidecar faces the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addresses {
    pub engine: u16,
    pub kv_events: u16,
    pub kv_replay: u16,
    /// Where the sidecar's listeners bind: every interface in a pod, loopback locally.
    pub sidecar_host: IpAddr,
    pub sidecar_http: u16,
    pub sidecar_grpc: u16,
    pub sidecar_metrics: u16,
    /// Where a disaggregated engine's peers set up KV transfers with it (vLLM's NIXL
    /// side channel, SGLang's bootstrap server); `None`: the engine's default port.
    pub kv_side_channel: Option<u16>,
}

impl Addresses {
    /// A pod's fixed layout (`DESIGN.md`, "Pod anatomy").
    pub const POD: Self = Self {
        engine: 8001,
        kv_events: 5557,
        kv_replay: 5558,
        sidecar_host: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        sidecar_http: 8000,
        sidecar_grpc: 9100,
        sidecar_metrics: 9090,
        kv_side_channel: None,
    };

    /// The engine's KV side channel port here, if it has one.
    fn kv_side_channel(&self, backend: BackendFramework) -> Option<u16> {
        self.kv_side_channel
            .or_else(|| engines::engine(backend).kv_side_channel_port)
    }
}

pub(crate) const LOOPBACK: &str = "127.0.0.1";

/// Our binaries, as the image (`Dockerfile`, `/usr/local/bin`) and the local runner
/// (`target/`) hold them; `dynamo` runs the planner ([`planner`]).
pub const DYNAMO_BINARY: &str = "dynamo";
pub const SIDECAR_BINARY: &str = "dynamo-sidecar";
pub const EPP_BINARY: &str = "dynamo-epp";
pub const MOCKER_BINARY: &str = "dynamo-mocker";

/// The variable that tells an engine (huggingface_hub) where to download models, and so
/// tells its sidecar where to find their files.
pub const HF_HOME: &str = "HF_HOME";

/// Why a graph cannot be wired; each says what to change.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum WiringError {
    #[error(
        "spec.backendFramework is not set and no worker's command names an engine ({}): \
         set spec.backendFramework",
        engines::launcher_names()
    )]
    NoBackend,
    #[error(
        "spec.services.{0}: the engine command names no model (--model, or --model-path for SGLang)"
    )]
    NoModel(String),
    #[error(
        "workers serve different models ({0:?} and {1:?}); one graph's picker routes one model"
    )]
    ModelMismatch(String, String),
    #[error("workers use different KV block sizes ({0} and {1}); the picker hashes with one")]
    BlockSizeMismatch(u32, u32),
    #[error(transparent)]
    Kvbm(#[from] KvbmError),
    #[error(transparent)]
    Planner(#[from] PlannerWiringError),
}

/// Where a decode pod's sidecar finds the prefill pods it may send a request's prefill
/// to (one entry of its `--prefill-peers`; `DESIGN.md`, "Disaggregated request").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrefillPeers {
    /// Every address `name` resolves to, at `port`: a headless Service of prefill pods.
    Dns { name: String, port: u16 },
    /// The prefill entries of the local runner's endpoints file.
    File(PathBuf),
}

impl fmt::Display for PrefillPeers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrefillPeers::Dns { name, port } => write!(f, "dns:{name}:{port}"),
            PrefillPeers::File(path) => write!(f, "file:{}", path.display()),
        }
    }
}

/// The value of a variable the plan sets in an engine's environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvValue {
    Literal(String),
    /// The address other pods reach this one at: the pod's IP (the downward API's
    /// `status.podIP`), loopback in a local run.
    PodIp,
    /// The directory our KV connector's package is written to ([`connector::POD_DIR`] in a
    /// pod, the run's own locally), first on a search path: before the value the user set,
    /// which it joins rather than yields to.
    ConnectorPath,
}

/// How an engine service's main container starts.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Launch {
    /// A launcher we know: the plan writes the command (`args` are the user's flags that
    /// carry over, without the model and the flags the plan owns).
    Owned { args: Vec<String> },
    /// A command we do not know, run as written.
    Custom(Vec<String>),
}

/// One engine service, as every rendering starts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineService {
    pub role: Role,
    pub backend: BackendFramework,
    /// What the engine loads (a Hugging Face id or a path; the mock engine's model
    /// directory), when the command says.
    pub model: Option<String>,
    /// The name clients send, when known before the engine runs.
    pub served_model: Option<String>,
    pub block_size: u32,
    /// The KV block tiers its sidecar holds (`DYN_KVBM_*` in its env).
    pub kvbm: Option<Kvbm>,
    launch: Launch,
}

/// Settings that differ between the cluster and a local run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Defaults {
    /// The mock engine's model directory (tokenizer, chat template) unless the service
    /// names one: a path in the mocker's image or volume, or the local `--model-path`.
    pub mocker_model_path: Option<String>,
}

impl EngineService {
    fn new(
        service: &str,
        spec: &ComponentSpec,
        role: Role,
        backend: BackendFramework,
        defaults: &Defaults,
        kvbm: Option<Kvbm>,
    ) -> Result<Self, WiringError> {
        let command = spec.main_command();
        let launched = engines::launched_backend(spec);
        let positional = engines::positional_model(&command).cloned();
        let user_args = match launched {
            // After `vllm serve MODEL` or `trtllm-serve MODEL`, the flags.
            Some(_) => launcher_args(&command)[usize::from(positional.is_some())..].to_vec(),
            // No command: the plan starts the graph's engine with no flags of the user's.
            None if command.is_empty() => Vec::new(),
            None => {
                let default_block = engines::engine(backend).default_block_size;
                return Ok(Self {
                    role,
                    backend,
                    model: model_of(backend, &command),
                    served_model: served_of(backend, &command),
                    block_size: block_size_of(backend, &command).unwrap_or(default_block),
                    kvbm,
                    launch: Launch::Custom(command),
                });
            }
        };
        let dynamo_wrapper = is_dynamo_wrapper(&command);
        let args = if dynamo_wrapper {
            engines::from_dynamo(backend, &user_args)
        } else {
            user_args.clone()
        };
        // The launcher's own backend reads the user's flags; the graph's may differ (a
        // vLLM command run on the mock engine).
        let source = launched.unwrap_or(backend);
        let mut model = model_of(source, &user_args).or(positional);
        let mut served = served_of(source, &user_args).or_else(|| model.clone());
        let default_block = engines::engine(backend).default_block_size;
        let block_size = block_size_of(source, &user_args).unwrap_or(default_block);
        let mut args = if backend == BackendFramework::Mocker && source != backend {
            engines::for_mocker(&args)
        } else {
            args
        };
        if backend == BackendFramework::Mocker {
            let path = argv::value(&user_args, "--model-path")
                .filter(|_| source == backend)
                .or_else(|| defaults.mocker_model_path.clone());
            served = argv::value(&user_args, "--model-name").or(served);
            model = path;
        }
        let source_engine = engines::engine(source);
        for flag in source_engine
            .model_flags
            .iter()
            .chain(source_engine.served_name_flag.as_ref())
        {
            args = argv::remove(&args, flag, Arity::One);
        }
        for (flag, arity) in engines::engine(backend).owned_flags {
            args = argv::remove(&args, flag, *arity);
        }
        if backend != BackendFramework::Mocker && model.is_none() {
            return Err(WiringError::NoModel(service.to_owned()));
        }
        Ok(Self {
            role,
            backend,
            model,
            served_model: served,
            block_size,
            kvbm,
            launch: Launch::Owned { args },
        })
    }

    pub fn publishes_kv_events(&self) -> bool {
        engines::engine(self.backend).publishes_kv_events
    }

    /// Why the KV block tiers its service sets hold nothing, when they do not: its engine
    /// has no connector to its sidecar's block API (only the mock engine and vLLM have
    /// one), or not for its flags, so the tiers' memory and disk are reserved for no use.
    pub fn unfed_kv_tiers(&self, service: &str) -> Option<String> {
        self.kvbm.as_ref()?;
        let why = (engines::engine(self.backend).unfed_kv_tiers)(self)?;
        Some(format!(
            "{service}: KV block tiers are set (DYN_KVBM_*), but {why}, so they hold nothing"
        ))
    }

    /// The engine's flags: the user's that carry over, or the whole command the plan
    /// does not own.
    pub(crate) fn args(&self) -> &[String] {
        match &self.launch {
            Launch::Owned { args } | Launch::Custom(args) => args,
        }
    }

    /// Whether it runs the mock engine, which can measure its own planner profile.
    pub fn runs_mocker(&self) -> bool {
        match &self.launch {
            Launch::Owned { .. } => self.backend == BackendFramework::Mocker,
            Launch::Custom(argv) => argv
                .first()
                .is_some_and(|p| p.rsplit('/').next() == Some(MOCKER_BINARY)),
        }
    }

    /// Its mock engine's command line at `at`, told to measure the planner's profile of
    /// the engine its flags configure, write it to `out` and exit without serving
    /// (`--planner-profile-out`); `None` unless it runs the mock engine.
    pub fn profile_argv(&self, at: &Addresses, out: &str) -> Option<Vec<String>> {
        if !self.runs_mocker() {
            return None;
        }
        let mut argv = self.engine_argv(at);
        argv.extend(["--planner-profile-out".into(), out.into()]);
        Some(argv)
    }

    /// The engine's command line (program first) at `at`.
    pub fn engine_argv(&self, at: &Addresses) -> Vec<String> {
        let args = match &self.launch {
            Launch::Custom(argv) => return argv.clone(),
            Launch::Owned { args } => args,
        };
        let model = self.model.clone().unwrap_or_default();
        let engine = engines::engine(self.backend);
        let mut out: Vec<String> = engine.server.iter().map(|w| (*w).to_owned()).collect();
        // Every backend but the mock engine needs a model (`WiringError::NoModel`).
        if !model.is_empty() {
            out.extend(engine.server_model_flag.map(str::to_owned));
            out.push(model);
        }
        if let (Some(flag), Some(served)) = (engine.served_name_flag, &self.served_model) {
            out.extend([flag.into(), served.clone()]);
        }
        out.extend(args.iter().cloned());
        if let Some(flag) = engine.block_size_flag
            && self.block_size != engine.default_block_size
            && !argv::has(&out, flag)
        {
            out.extend([flag.into(), self.block_size.to_string()]);
        }
        out.extend([
            "--host".into(),
            LOOPBACK.into(),
            "--port".into(),
            at.engine.to_string(),
        ]);
        (engine.write_flags)(self, at, &mut out);
        out
    }

    /// Variables the engine needs in its environment at `at` (each unless the user set
    /// it): a disaggregated vLLM's NIXL side channel, on an address decode pods reach.
    pub fn engine_env(&self, at: &Addresses) -> Vec<(&'static str, EnvValue)> {
        (engines::engine(self.backend).env)(self, at)
    }

    /// The sidecar's flags, beside this engine at `at`; `hf_home` is the engine's
    /// Hugging Face home, where the sidecar finds a downloaded model's files;
    /// `prefill_peers` are the graph's prefill pods, which only a decode sidecar sends
    /// requests to.
    pub fn sidecar_args(
        &self,
        at: &Addresses,
        hf_home: Option<&str>,
        prefill_peers: &[PrefillPeers],
    ) -> Vec<String> {
        let kv_events = match self.publishes_kv_events() {
            true => format!("tcp://{LOOPBACK}:{}", at.kv_events),
            false => "none".into(),
        };
        let kv_replay = match engines::engine(self.backend).replays_kv_events {
            true => format!("tcp://{LOOPBACK}:{}", at.kv_replay),
            false => "none".into(),
        };
        let mut args = vec![
            "--listen".into(),
            format!("{}:{}", at.sidecar_host, at.sidecar_http),
            "--host".into(),
            at.sidecar_host.to_string(),
            "--grpc-port".into(),
            at.sidecar_grpc.to_string(),
            "--metrics-port".into(),
            at.sidecar_metrics.to_string(),
            "--engine-url".into(),
            format!("http://{LOOPBACK}:{}", at.engine),
            "--engine-kv-events".into(),
            kv_events,
        ];
        if self.publishes_kv_events() && engines::engine(self.backend).kv_events_connect {
            args.push("--engine-kv-events-listen".into());
        }
        args.extend([
            "--engine-kv-replay".into(),
            kv_replay,
            "--block-size".into(),
            self.block_size.to_string(),
        ]);
        if let Some(served) = &self.served_model {
            args.extend(["--model-name".into(), served.clone()]);
        }
        if let Some(model) = &self.model {
            args.extend(["--model-source".into(), model.clone()]);
        }
        if let Some(home) = hf_home {
            args.extend(["--hf-home".into(), home.into()]);
        }
        if self.role == Role::Decode && !prefill_peers.is_empty() {
            let peers: Vec<String> = prefill_peers.iter().map(ToString::to_string).collect();
            args.extend(["--prefill-peers".into(), peers.join(",")]);
        }
        args
    }
}

/// An engine service's role: its `componentType` (or `subComponentType`), unless Dynamo's
/// worker wrapper flags say otherwise (`--is-prefill-worker`); `None` for a service that
/// is no engine.
pub fn engine_role(spec: &ComponentSpec) -> Option<Role> {
    let ServiceRole::Engine(role) = spec.role() else {
        return None;
    };
    let command = spec.main_command();
    if engines::launched_backend(spec).is_none() || !is_dynamo_wrapper(&command) {
        return Some(role);
    }
    Some(engines::dynamo_role(&launcher_args(&command)).unwrap_or(role))
}

/// Whether a command runs one of Dynamo's worker wrappers (`python3 -m dynamo.vllm`).
fn is_dynamo_wrapper(command: &[String]) -> bool {
    command.iter().any(|w| w.starts_with("dynamo."))
}

/// The words after the launcher: after `-m MODULE` for a Python module, after `serve`
/// for `vllm serve`, else after the program.
fn launcher_args(command: &[String]) -> Vec<String> {
    let start = match command.iter().position(|w| w == "-m") {
        Some(m) => m + 2,
        None if command.get(1).is_some_and(|w| w == "serve") => 2,
        None => 1,
    };
    command
        .get(start..)
        .map(<[String]>::to_vec)
        .unwrap_or_default()
}

fn model_of(backend: BackendFramework, args: &[String]) -> Option<String> {
    engines::engine(backend)
        .model_flags
        .iter()
        .find_map(|flag| argv::value(args, flag))
}

fn served_of(backend: BackendFramework, args: &[String]) -> Option<String> {
    argv::value(args, engines::engine(backend).served_name_flag?)
}

fn block_size_of(backend: BackendFramework, args: &[String]) -> Option<u32> {
    argv::value(args, engines::engine(backend).block_size_flag?)?
        .parse()
        .ok()
}

/// Every engine service of a graph, and what the picker needs of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphWiring {
    pub backend: BackendFramework,
    pub engines: BTreeMap<String, EngineService>,
    /// The served model, when some engine names it (all that do agree).
    pub served_model: Option<String>,
    /// The KV block size all engines use.
    pub block_size: u32,
}

impl GraphWiring {
    /// Wires every engine service of `spec`; `Ok(None)` when the graph has none.
    pub fn new(
        spec: &DynamoGraphDeploymentSpec,
        defaults: &Defaults,
    ) -> Result<Option<Self>, WiringError> {
        let engine_services: Vec<_> = spec
            .services
            .iter()
            .filter_map(|(name, s)| Some((name, s, engine_role(s)?)))
            .collect();
        if engine_services.is_empty() {
            return Ok(None);
        }
        let backend = engines::graph_backend(spec).ok_or(WiringError::NoBackend)?;
        let mut engines = BTreeMap::new();
        for (name, service, role) in engine_services {
            let kvbm = Kvbm::of(name, spec.envs.as_deref(), service)?;
            let engine = EngineService::new(name, service, role, backend, defaults, kvbm)?;
            engines.insert(name.clone(), engine);
        }
        let mut served_model: Option<String> = None;
        let mut block_size = None;
        for engine in engines.values() {
            if let (Some(a), Some(b)) = (&served_model, &engine.served_model)
                && a != b
            {
                return Err(WiringError::ModelMismatch(a.clone(), b.clone()));
            }
            served_model = served_model.or_else(|| engine.served_model.clone());
            match block_size {
                Some(b) if b != engine.block_size => {
                    return Err(WiringError::BlockSizeMismatch(b, engine.block_size));
                }
                _ => block_size = Some(engine.block_size),
            }
        }
        Ok(Some(Self {
            backend,
            engines,
            served_model,
            block_size: block_size.expect("at least one engine"),
        }))
    }

    /// Whether the graph splits prefill from decode.
    pub fn is_disaggregated(&self) -> bool {
        self.engines.values().any(|e| e.role != Role::Aggregated)
    }

    /// The engine service whose mock engine measures a planner's profile, for both
    /// renderings: the one that does both phases, else decode's, else prefill's (a
    /// profile holds the prefill and the decode points of one engine); `None` when no
    /// engine runs the mock engine.
    pub fn profile_engine(&self) -> Option<(&str, &EngineService)> {
        [Role::Aggregated, Role::Decode, Role::Prefill]
            .into_iter()
            .find_map(|role| {
                self.engines
                    .iter()
                    .find(|(_, e)| e.role == role && e.runs_mocker())
            })
            .map(|(name, e)| (name.as_str(), e))
    }
}

/// Where the picker listens and finds its pods and model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Picker {
    pub host: String,
    pub http_port: u16,
    pub ext_proc_port: u16,
    pub metrics_port: Option<u16>,
    /// A model directory on the picker's machine; without one the picker loads the
    /// model from its pods' sidecars.
    pub model_path: Option<PathBuf>,
    pub router_mode: String,
    pub pods: PickerPods,
}

impl Picker {
    /// The endpoint picker's flags; `engines` tell it the model and block size.
    pub fn args(&self, engines: Option<&GraphWiring>) -> Vec<String> {
        let mut args = vec![
            "--host".into(),
            self.host.clone(),
            "--http-port".into(),
            self.http_port.to_string(),
            "--ext-proc-port".into(),
            self.ext_proc_port.to_string(),
        ];
        if let Some(port) = self.metrics_port {
            args.extend(["--metrics-port".into(), port.to_string()]);
        }
        if let Some(path) = &self.model_path {
            args.extend(["--model-path".into(), path.to_string_lossy().into_owned()]);
        }
        if let Some(model) = engines.and_then(|e| e.served_model.as_ref()) {
            args.extend(["--model-name".into(), model.clone()]);
        }
        if let Some(engines) = engines {
            args.extend(["--block-size".into(), engines.block_size.to_string()]);
            // The mock engine reads the prompt's token ids and skips tokenizing it again.
            if engines.backend == BackendFramework::Mocker {
                args.push("--forward-token-ids".into());
            }
        }
        args.extend(["--router-mode".into(), self.router_mode.clone()]);
        match &self.pods {
            PickerPods::EndpointsFile(path) => args.extend([
                "--endpoints-file".into(),
                path.to_string_lossy().into_owned(),
            ]),
            PickerPods::Pool {
                name,
                namespace,
                selector,
                role_selectors,
            } => {
                args.extend([
                    "--pool-name".into(),
                    name.clone(),
                    "--pool-namespace".into(),
                    namespace.clone(),
                    "--selector".into(),
                    selector.clone(),
                ]);
                if engines.is_some_and(GraphWiring::is_disaggregated) {
                    for (role, selector) in role_selectors {
                        args.extend([format!("--{}-selector", role.as_str()), selector.clone()]);
                    }
                }
            }
        }
        args
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PickerPods {
    /// The local runner's endpoints file.
    EndpointsFile(PathBuf),
    /// An InferencePool and label selectors (the prefill and decode ones are passed only
    /// for a disaggregated graph).
    Pool {
        name: String,
        namespace: String,
        selector: String,
        role_selectors: Vec<(Role, String)>,
    },
}

/// The router mode the graph asks for: `DYN_ROUTER_MODE` on a frontend or epp service
/// or the graph (Dynamo's variable), or a Dynamo frontend's `--router-mode`.
pub fn router_mode(spec: &DynamoGraphDeploymentSpec) -> Option<String> {
    let front: Vec<&ComponentSpec> = spec
        .services
        .values()
        .filter(|s| matches!(s.role(), ServiceRole::Frontend | ServiceRole::Epp))
        .collect();
    front
        .iter()
        .flat_map(|s| s.envs.iter().flatten())
        .chain(spec.envs.iter().flatten())
        .find(|e| e.name == "DYN_ROUTER_MODE")
        .and_then(|e| e.value.clone())
        .or_else(|| {
            front
                .iter()
                .find_map(|s| argv::value(&s.main_command(), "--router-mode"))
        })
}

#[cfg(test)]
mod tests;
