//! Engine pods: the `main` container with the service's defaults merged in, the injected
//! `sidecar` (a native sidecar: an init container that keeps running), shared memory,
//! volumes, security contexts, and the per-replica and per-rank parts of a gang.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use dynamo_crds::common::{ExtraPodSpec, ResourceItem};
use dynamo_crds::{BackendFramework, ComponentSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvFromSource, EnvVar,
    EnvVarSource, HTTPGetAction, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod, PodAffinityTerm,
    PodAntiAffinity, PodSchedulingGate, PodSecurityContext, PodSpec, Probe, ResourceRequirements,
    SeccompProfile, SecretEnvSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::gang::DEFAULT_GPU_RESOURCE;
use dynamo_names::Role;

use super::graph::Graph;
use super::{credential, labels, names, services};
use dynamo_wiring::kvbm::{self, DiskTier};
use dynamo_wiring::{Addresses, EngineService, EnvValue, HF_HOME, SIDECAR_BINARY, connector};

/// Sidecar inference port; Services and the InferencePool target it.
pub const HTTP_PORT: i32 = Addresses::POD.sidecar_http as i32;
/// Sidecar gRPC port (KV events, KV blocks, transfers).
pub const SIDECAR_GRPC_PORT: i32 = Addresses::POD.sidecar_grpc as i32;
/// Sidecar metrics and health port; the EPP's and the planner's too.
pub const METRICS_PORT: i32 = Addresses::POD.sidecar_metrics as i32;
/// Name of the container port at [`METRICS_PORT`] on every pod of ours: the chart's
/// PodMonitor (charts/dynamo-platform/templates/podmonitor.yaml) scrapes the port of that
/// name on every pod with the graph label ([`labels::GRAPH`]).
pub const METRICS_PORT_NAME: &str = "metrics";
/// The container port Prometheus scrapes on a pod of ours.
pub(crate) fn metrics_port() -> ContainerPort {
    ContainerPort {
        name: Some(METRICS_PORT_NAME.into()),
        container_port: METRICS_PORT,
        ..ContainerPort::default()
    }
}

/// Where the planner's `/metrics` and `/healthz` listen in its pod.
pub const PLANNER_METRICS_ADDR: SocketAddr =
    SocketAddr::new(Addresses::POD.sidecar_host, METRICS_PORT as u16);

/// Where a planner pod's init container writes the mock engine's planner profile and the
/// planner reads it (`--profile`), on an emptyDir both mount.
pub const PLANNER_PROFILE: &str = "/var/run/dynamo/planner/profile.json";

const MAIN: &str = "main";
const SIDECAR: &str = "sidecar";
const SHM_VOLUME: &str = "shm";
/// The init container that writes our KV connector's package for the engine
/// ([`connector::POD_DIR`], on its `PYTHONPATH`), and the volume it writes to.
const CONNECTOR: &str = "dynamo-kv-connector";
/// Where an engine downloads its model unless the graph sets `HF_HOME`: a volume its
/// sidecar mounts too, to serve the model card from the same files.
const HF_HOME_VOLUME: &str = "dynamo-hf-home";
const DEFAULT_HF_HOME: &str = "/dynamo/hf-home";
/// The sidecar's disk tier, unless `DYN_KVBM_DISK_CACHE_DIR` names a volume of the
/// service's own: an emptyDir of the tier's size (Dynamo's default is `/tmp/`; a path of
/// our own keeps other files out of the volume's size).
const KV_DISK_VOLUME: &str = "dynamo-kv-disk";
const DEFAULT_KV_DISK_DIR: &str = "/dynamo/kv-disk";
/// The sidecar's memory request without KV block tiers; a host tier adds its bytes.
const SIDECAR_MEMORY_MIB: u64 = 128;

/// The pod every replica of an engine service starts from: everything but the name and
/// the replica/rank parts. Its hash is the service's spec hash.
pub(crate) fn engine_template(g: &Graph, service: &str, spec: &ComponentSpec, role: Role) -> Pod {
    let extra = spec.extra_pod_spec.clone().unwrap_or_default();
    let mut pod_spec = base_pod_spec(&extra);

    let engine = g.engine(service);
    let mut main = main_container(g, spec, Some(engine));
    credential::hand_to(&mut main);
    let mut sidecar = sidecar_container(g, service, engine, &main);
    credential::hand_to(&mut sidecar);
    let mut volumes = pod_spec.volumes.take().unwrap_or_default();
    volumes.extend(service_volumes(g, spec));
    volumes.push(credential::volume(g));
    if has_hf_home_volume(&main) {
        volumes.push(Volume {
            name: HF_HOME_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
    }
    if uses_connector(engine) {
        volumes.push(Volume {
            name: CONNECTOR.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
    }
    if let Some(disk) = own_kv_disk(engine, &sidecar) {
        volumes.push(Volume {
            name: KV_DISK_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: None,
                size_limit: Some(Quantity(disk.volume_bytes().to_string())),
            }),
            ..Volume::default()
        });
    }
    pod_spec.volumes = (!volumes.is_empty()).then_some(volumes);
    let mut containers = vec![main];
    containers.extend(
        extra
            .containers
            .iter()
            .flatten()
            .filter(|c| c.name != MAIN && c.name != SIDECAR)
            .cloned(),
    );
    pod_spec.containers = containers;
    // The sidecar goes last among the init containers: the user's run first, as they
    // would without it, and prepare what it reads (the model under `HF_HOME`, the disk
    // tier's directory, a volume's permissions); a native sidecar of theirs (a mesh proxy)
    // is then up before ours and stops after it. Ours is up before `main` all the same.
    let mut init_containers: Vec<Container> = pod_spec
        .init_containers
        .take()
        .into_iter()
        .flatten()
        .filter(|c| c.name != SIDECAR && c.name != CONNECTOR)
        .collect();
    if uses_connector(engine) {
        init_containers.push(connector_container(g));
    }
    init_containers.push(sidecar);
    pod_spec.init_containers = Some(init_containers);

    let mut labels = g.service_labels(service, spec);
    if let Some(meta) = &spec.extra_pod_metadata {
        labels.extend(meta.labels.clone().unwrap_or_default());
    }
    // Ours last: user labels must not move a pod out of its graph or role.
    labels.extend(g.service_labels(service, spec));
    labels.insert(labels::ROLE.into(), role.as_str().into());
    let mut annotations = g.service_annotations(spec).unwrap_or_default();
    if let Some(meta) = &spec.extra_pod_metadata {
        annotations.extend(meta.annotations.clone().unwrap_or_default());
    }
    if let Some(scheduler) = &g.batch_scheduler {
        scheduler.apply(&mut pod_spec, &mut labels, &mut annotations);
    }
    Pod {
        metadata: ObjectMeta {
            namespace: Some(g.namespace.to_string()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![g.owner_reference()]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// Volumes the main container's generated mounts need: /dev/shm and the claims.
pub(crate) fn service_volumes(g: &Graph, spec: &ComponentSpec) -> Vec<Volume> {
    let mut volumes = Vec::new();
    if let Some(size) = shared_memory_size(g, spec) {
        volumes.push(Volume {
            name: SHM_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity(size)),
            }),
            ..Volume::default()
        });
    }
    for mount in spec.volume_mounts.iter().flatten() {
        volumes.push(Volume {
            name: mount.name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: mount.name.clone(),
                read_only: None,
            }),
            ..Volume::default()
        });
    }
    volumes
}

/// The mounts of `main` (a service's main container) whose volumes the service itself
/// defines, its claims and `extraPodSpec.volumes` (a model directory, a timing table),
/// read-only and with those volumes: what another container needs to read the same files
/// at the same paths. `/dev/shm` and the volumes generated beside `main` are left out.
pub(crate) fn file_mounts(
    g: &Graph,
    spec: &ComponentSpec,
    main: &Container,
) -> Vec<(VolumeMount, Volume)> {
    let own = spec
        .extra_pod_spec
        .iter()
        .flat_map(|e| e.volumes.iter().flatten());
    let volumes: Vec<Volume> = own
        .cloned()
        .chain(service_volumes(g, spec))
        .filter(|v| v.name != SHM_VOLUME)
        .collect();
    main.volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| {
            let volume = volumes.iter().find(|v| v.name == m.name)?;
            let mount = VolumeMount {
                read_only: Some(true),
                ..m.clone()
            };
            Some((mount, volume.clone()))
        })
        .collect()
}

/// Where one pod sits in its service.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot<'a> {
    pub service: &'a str,
    pub replica: u32,
    pub rank: u32,
    /// 1 for a single-node replica.
    pub node_count: u32,
}

impl Slot<'_> {
    pub fn is_gang(&self) -> bool {
        self.node_count > 1
    }

    pub fn pod_name(&self, graph: &str) -> String {
        if self.is_gang() {
            names::gang_pod(graph, self.service, self.replica, self.rank)
        } else {
            names::single_pod(graph, self.service, self.replica)
        }
    }
}

/// The pod of one slot, from the service template. Gang pods come gated; [`release`]
/// opens the gate.
pub(crate) fn replica_pod(g: &Graph, template: &Pod, hash: &str, slot: Slot) -> Pod {
    let mut pod = template.clone();
    let name = slot.pod_name(g.name);
    pod.metadata.name = Some(name.clone());
    let pod_labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    pod_labels.insert(labels::SPEC_HASH.into(), hash.into());
    pod_labels.insert(labels::REPLICA.into(), slot.replica.to_string());
    // Only single pods and gang leaders serve HTTP; gang workers are reached by the leader.
    if slot.rank == 0 {
        pod_labels.insert(labels::INFERENCE_POOL.into(), g.name.into());
    }
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    if slot.is_gang() {
        let gang = names::gang(g.name, slot.service, slot.replica);
        pod_labels.insert(labels::GANG.into(), gang.clone());
        pod_labels.insert(labels::GANG_RANK.into(), slot.rank.to_string());
        spec.hostname = Some(name);
        spec.subdomain = Some(gang.clone());
        spec.scheduling_gates = Some(vec![PodSchedulingGate {
            name: labels::GANG_GATE.into(),
        }]);
        // One pod per node, whatever the scheduler would otherwise pack together.
        let anti_affinity = PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(labels::GANG.into(), gang.clone())])),
                match_expressions: None,
            }),
            topology_key: "kubernetes.io/hostname".into(),
            ..PodAffinityTerm::default()
        };
        let affinity = spec.affinity.get_or_insert_with(Affinity::default);
        affinity
            .pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default)
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(Vec::new)
            .push(anti_affinity);
        let leader = format!(
            "{}.{gang}.{}.svc.{}",
            names::gang_pod(g.name, slot.service, slot.replica, 0),
            g.namespace,
            g.config.cluster_domain
        );
        if let Some(main) = spec.containers.iter_mut().find(|c| c.name == MAIN) {
            let env = main.env.get_or_insert_with(Vec::new);
            upsert_env(env, plain_env("DYNAMO_LEADER_ADDRESS", &leader));
            upsert_env(env, plain_env("DYNAMO_RANK", &slot.rank.to_string()));
            upsert_env(
                env,
                plain_env("DYNAMO_NODE_COUNT", &slot.node_count.to_string()),
            );
        }
    }
    pod
}

/// Opens the gang gate and pins the pod to its domain (required node affinity on the
/// domain label; a gated pod's node affinity may be narrowed, and only while gated).
pub(crate) fn release(pod: &mut Pod, domain_label: &str, domain: &str) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.scheduling_gates = None;
    let requirement = NodeSelectorRequirement {
        key: domain_label.into(),
        operator: "In".into(),
        values: Some(vec![domain.into()]),
    };
    let selector = spec
        .affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(|| NodeSelector {
            node_selector_terms: vec![],
        });
    if selector.node_selector_terms.is_empty() {
        selector
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    // Terms are ORed: the domain must hold in each of them.
    for term in &mut selector.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(requirement.clone());
    }
}

/// The domain an already released gang pod was pinned to by [`release`].
pub fn pinned_domain(pod: &Pod, domain_label: &str) -> Option<String> {
    let terms = &pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .find(|r| r.key == domain_label && r.operator == "In")
        .and_then(|r| r.values.as_ref()?.first().cloned())
}

/// Whether the pod still waits behind the gang gate.
pub fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|gate| gate.name == labels::GANG_GATE))
}

/// The container named `main`: the user's `mainContainer` (and any container they named
/// `main`) with the service's image, env, resources, mounts and probes merged in; for an
/// engine, the wiring plan's command (the user's, translated and completed).
pub(crate) fn main_container(
    g: &Graph,
    spec: &ComponentSpec,
    engine: Option<&EngineService>,
) -> Container {
    let extra = spec.extra_pod_spec.clone().unwrap_or_default();
    let listed = extra
        .containers
        .iter()
        .flatten()
        .find(|c| c.name == MAIN)
        .cloned();
    let mut main = match (listed, extra.main_container.clone()) {
        (Some(base), Some(top)) => overlay(&base, &top),
        (Some(c), None) | (None, Some(c)) => c,
        (None, None) => Container::default(),
    };
    main.name = MAIN.into();

    let mocker = engine.is_some_and(|e| e.backend == BackendFramework::Mocker);
    if main.image.as_deref().is_none_or(str::is_empty) {
        main.image = Some(if mocker {
            g.config.mocker_image.clone()
        } else {
            g.config.default_engine_image.clone()
        });
    }
    if let Some(engine) = engine {
        main.command = Some(engine.engine_argv(&Addresses::POD));
        main.args = None;
    }

    let mut env = Vec::new();
    for var in g
        .spec
        .envs
        .iter()
        .flatten()
        .chain(spec.envs.iter().flatten())
    {
        upsert_env(&mut env, var.clone());
    }
    for var in main.env.take().unwrap_or_default() {
        upsert_env(&mut env, var);
    }
    if engine.is_some() && !env.iter().any(|e| e.name == HF_HOME) {
        env.push(plain_env(HF_HOME, DEFAULT_HF_HOME));
    }
    for (name, value) in engine
        .map(|e| e.engine_env(&Addresses::POD))
        .unwrap_or_default()
    {
        let user = env.iter().position(|e| e.name == name);
        match (value, user) {
            (EnvValue::ConnectorPath, Some(at)) => {
                let theirs = env[at].value.clone().unwrap_or_default();
                env[at] = plain_env(name, &format!("{}:{theirs}", connector::POD_DIR));
            }
            (_, Some(_)) => {}
            (EnvValue::Literal(value), None) => env.push(plain_env(name, &value)),
            (EnvValue::PodIp, None) => env.push(field_env(name, "status.podIP")),
            (EnvValue::ConnectorPath, None) => env.push(plain_env(name, connector::POD_DIR)),
        }
    }
    main.env = (!env.is_empty()).then_some(env);

    if let Some(secret) = &spec.env_from_secret {
        main.env_from
            .get_or_insert_with(Vec::new)
            .push(EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: secret.clone(),
                    optional: None,
                }),
                ..EnvFromSource::default()
            });
    }

    main.resources = merge_resources(main.resources.take(), spec);

    let mut mounts = main.volume_mounts.take().unwrap_or_default();
    if shared_memory_size(g, spec).is_some() {
        mounts.push(VolumeMount {
            name: SHM_VOLUME.into(),
            mount_path: "/dev/shm".into(),
            ..VolumeMount::default()
        });
    }
    for mount in spec.volume_mounts.iter().flatten() {
        mounts.push(VolumeMount {
            name: mount.name.clone(),
            mount_path: mount
                .mount_point
                .clone()
                .unwrap_or_else(|| format!("/mnt/{}", mount.name)),
            ..VolumeMount::default()
        });
    }
    if engine.is_some()
        && let Some(home) = uncovered_hf_home(main.env.as_deref().unwrap_or_default(), &mounts)
    {
        mounts.push(VolumeMount {
            name: HF_HOME_VOLUME.into(),
            mount_path: home,
            ..VolumeMount::default()
        });
    }
    if engine.is_some_and(uses_connector) {
        mounts.push(VolumeMount {
            name: CONNECTOR.into(),
            mount_path: connector::POD_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    main.volume_mounts = (!mounts.is_empty()).then_some(mounts);

    if let Some(probe) = &spec.liveness_probe {
        main.liveness_probe = Some(probe.clone());
    }
    // No default probes on an engine: it listens on loopback only, where the kubelet's
    // probes do not reach; the sidecar's `/ready` asks the engine's `/health` instead.
    // And a large model can take many minutes to load: no liveness probe may kill it.
    if let Some(probe) = &spec.readiness_probe {
        main.readiness_probe = Some(probe.clone());
    }

    // The mocker is our own process in our image: the full restricted set. Anything else
    // (vLLM, SGLang, TensorRT-LLM, a planner) runs someone else's image that may run as
    // root and write caches (~/.cache, /tmp, torch.compile's cache), so only what cannot
    // break it.
    let ours = if mocker {
        restricted_container()
    } else {
        no_privilege_escalation()
    };
    main.security_context = Some(merge_security_context(ours, main.security_context.as_ref()));
    main
}

/// The engine's `HF_HOME` when no volume of `mounts` holds it: it then gets a volume of its
/// own, so that the sidecar, which mounts what the engine mounts, sees the downloads.
fn uncovered_hf_home(env: &[EnvVar], mounts: &[VolumeMount]) -> Option<String> {
    let home = env.iter().find(|e| e.name == HF_HOME)?.value.clone()?;
    let covered = mounts
        .iter()
        .any(|m| std::path::Path::new(&home).starts_with(&m.mount_path));
    (!covered).then_some(home)
}

/// Whether `main` has the `HF_HOME` volume of [`uncovered_hf_home`].
fn has_hf_home_volume(main: &Container) -> bool {
    main.volume_mounts
        .iter()
        .flatten()
        .any(|m| m.name == HF_HOME_VOLUME)
}

/// The disk tier's directory in the pod.
fn kv_disk_dir(disk: &DiskTier) -> &str {
    disk.dir.as_deref().unwrap_or(DEFAULT_KV_DISK_DIR)
}

/// The disk tier, when it is on the sidecar's own volume rather than one of the service's.
fn own_kv_disk<'a>(engine: &'a EngineService, sidecar: &Container) -> Option<&'a DiskTier> {
    let disk = engine.kvbm.as_ref()?.disk.as_ref()?;
    let mounted = sidecar
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.name == KV_DISK_VOLUME);
    mounted.then_some(disk)
}

/// The injected sidecar, beside `main`: it reads the engine's model files (for the model
/// card) from every volume `main` mounts, read-only, at the same paths. With KV block
/// tiers it writes its disk tier (to the deepest of those volumes holding the directory,
/// else to a volume of its own) and reaches the object tier with the service's `AWS_*`
/// settings and `envFromSecret`.
///
/// A native sidecar (KEP-753; on by default since Kubernetes 1.29, GA in 1.33): an init
/// container with `restartPolicy: Always`. The kubelet starts it before `main` and stops
/// it only after `main` has exited, so the engine never runs without its proxy and KV
/// event relay, not even while it shuts down; it restarts on its own, and its readiness
/// counts toward the pod's Ready. Services' named target ports (`http`) and the
/// PodMonitor's `metrics` port find its ports as they did in `containers`. No startup
/// probe: `main` starts once the sidecar's process runs, and a probe would hold the engine
/// back for as long as the sidecar re-indexes a large disk tier before it listens.
fn sidecar_container(
    g: &Graph,
    service: &str,
    engine: &EngineService,
    main: &Container,
) -> Container {
    let port = |name: &str, number: i32| ContainerPort {
        name: Some(name.into()),
        container_port: number,
        ..ContainerPort::default()
    };
    let hf_home = main
        .env
        .iter()
        .flatten()
        .find(|e| e.name == HF_HOME)
        .and_then(|e| e.value.as_deref());
    let mut command = vec![SIDECAR_BINARY.to_string()];
    command.extend(engine.sidecar_args(&Addresses::POD, hf_home, &services::prefill_peers(g)));
    // An engine that feeds the tiers shares memory regions with its sidecar (`OpenRegion`),
    // which the sidecar makes in its /dev/shm: the engine's, when that is a volume.
    let feeds_tiers = engine.kvbm.is_some() && engine.unfed_kv_tiers(service).is_none();
    let mut mounts: Vec<VolumeMount> = main
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.name != CONNECTOR && (m.name != SHM_VOLUME || feeds_tiers))
        .map(|m| VolumeMount {
            read_only: (m.name != SHM_VOLUME).then_some(true),
            ..m.clone()
        })
        .collect();
    let mut env = vec![
        plain_env("DYNAMO_GRAPH", g.name),
        plain_env("DYNAMO_COMPONENT", service),
        plain_env("DYNAMO_ROLE", engine.role.as_str()),
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_IP", "status.podIP"),
    ];
    // The service's log format is its sidecar's too (docs/dynamo-compatibility.md).
    for var in main.env.iter().flatten() {
        if dynamo_server::LOG_FORMAT_ENVS.contains(&var.name.as_str()) {
            upsert_env(&mut env, var.clone());
        }
    }
    let mut env_from = None;
    let mut requests = BTreeMap::from([
        ("cpu".to_string(), Quantity("100m".into())),
        (
            "memory".to_string(),
            Quantity(format!("{SIDECAR_MEMORY_MIB}Mi")),
        ),
    ]);
    if let Some(tiers) = &engine.kvbm {
        let disk_dir = tiers.disk.as_ref().map_or("", kv_disk_dir);
        let prefix = kvbm::object_prefix(g.namespace, g.name, service);
        command.extend(tiers.sidecar_args(disk_dir, &prefix));
        // The host tier is the sidecar's own memory: the scheduler must count it.
        if tiers.host_bytes > 0 {
            let bytes = (SIDECAR_MEMORY_MIB << 20) + tiers.host_bytes;
            requests.insert("memory".into(), Quantity(bytes.to_string()));
        }
        if let Some(disk) = &tiers.disk {
            let holder = mounts
                .iter_mut()
                .filter(|m| std::path::Path::new(disk_dir).starts_with(&m.mount_path))
                .max_by_key(|m| m.mount_path.len());
            match holder {
                Some(mount) => mount.read_only = None,
                None => {
                    mounts.push(VolumeMount {
                        name: KV_DISK_VOLUME.into(),
                        mount_path: disk_dir.into(),
                        ..VolumeMount::default()
                    });
                    let bytes = disk.volume_bytes().to_string();
                    requests.insert("ephemeral-storage".into(), Quantity(bytes));
                }
            }
        }
        if tiers.object.is_some() {
            for var in main.env.iter().flatten() {
                if kvbm::for_object_client(&var.name) {
                    upsert_env(&mut env, var.clone());
                }
            }
            for (name, value) in tiers.object_env() {
                upsert_env(&mut env, plain_env(name, &value));
            }
            env_from.clone_from(&main.env_from);
        }
    }
    Container {
        name: SIDECAR.into(),
        image: Some(g.config.sidecar_image.clone()),
        command: Some(command),
        ports: Some(vec![
            port("http", HTTP_PORT),
            port("grpc", SIDECAR_GRPC_PORT),
            metrics_port(),
        ]),
        env: Some(env),
        env_from,
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        readiness_probe: Some(http_probe("/ready", METRICS_PORT)),
        liveness_probe: Some(Probe {
            failure_threshold: Some(6),
            ..http_probe("/health", METRICS_PORT)
        }),
        resources: Some(ResourceRequirements {
            requests: Some(requests),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted_container()),
        restart_policy: Some(SIDECAR_RESTART_POLICY.into()),
        ..Container::default()
    }
}

/// What makes an init container a native sidecar.
const SIDECAR_RESTART_POLICY: &str = "Always";

/// Whether an engine loads our KV connector from the package the pod's init container
/// writes ([`connector_container`]).
fn uses_connector(engine: &EngineService) -> bool {
    engine
        .engine_env(&Addresses::POD)
        .iter()
        .any(|(_, value)| *value == EnvValue::ConnectorPath)
}

/// The init container that writes our KV connector's package where the engine's
/// `PYTHONPATH` finds it: our image's `dynamo` binary carries it, so the engine's image
/// needs nothing of ours.
fn connector_container(g: &Graph) -> Container {
    Container {
        name: CONNECTOR.into(),
        image: Some(g.config.sidecar_image.clone()),
        command: Some(connector::install_argv(connector::POD_DIR)),
        volume_mounts: Some(vec![VolumeMount {
            name: CONNECTOR.into(),
            mount_path: connector::POD_DIR.into(),
            ..VolumeMount::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("10m".into())),
                ("memory".to_string(), Quantity("16Mi".into())),
            ])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted_container()),
        ..Container::default()
    }
}

/// Container fields of the Pod Security Standards "restricted" profile
/// (kubernetes.io/docs/concepts/security/pod-security-standards): no privilege escalation,
/// every capability dropped, a non-root user (the image's numeric `USER`, which the kubelet
/// verifies; no `runAsUser`, so OpenShift's restricted SCC may assign one), and a read-only
/// root filesystem: the sidecar, the EPP and the mocker write no file (their only inputs
/// are flags, the model directory and sockets), so they need no writable /tmp either.
pub(crate) fn restricted_container() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".into()]),
        }),
        ..no_privilege_escalation()
    }
}

/// What any engine tolerates: no setuid gains (`no_new_privs`). Capabilities the engine
/// asks for (IPC_LOCK for RDMA) and its user, writable paths and /dev/shm stay as the
/// image and the user set them.
fn no_privilege_escalation() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        ..SecurityContext::default()
    }
}

/// `ours` with every field the user set replacing ours (whole fields: a user's
/// `capabilities` replaces ours entirely). A privileged container or one adding
/// SYS_ADMIN escalates by definition, and the API server refuses it together with
/// `allowPrivilegeEscalation: false` (apimachinery `ValidateSecurityContext`), so ours is
/// dropped there.
pub(crate) fn merge_security_context(
    ours: SecurityContext,
    user: Option<&SecurityContext>,
) -> SecurityContext {
    let Some(user) = user else {
        return ours;
    };
    let mut merged = overlay(&ours, user);
    let adds_sys_admin = user
        .capabilities
        .as_ref()
        .and_then(|c| c.add.as_ref())
        .is_some_and(|add| add.iter().any(|c| c == "SYS_ADMIN" || c == "CAP_SYS_ADMIN"));
    if (user.privileged == Some(true) || adds_sys_admin)
        && user.allow_privilege_escalation.is_none()
    {
        merged.allow_privilege_escalation = None;
    }
    merged
}

/// Pod level, every generated pod: the container runtime's default seccomp profile, which
/// the "restricted" profile requires and Kubernetes does not apply by itself (pods run
/// `Unconfined` unless the kubelet's `--seccomp-default` is on). The graph's own
/// `extraPodSpec.securityContext` fields win.
fn pod_security_context(user: Option<&PodSecurityContext>) -> PodSecurityContext {
    let ours = PodSecurityContext {
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..PodSecurityContext::default()
    };
    match user {
        Some(user) => overlay(&ours, user),
        None => ours,
    }
}

/// PodSpec fields from `extraPodSpec`, other than the containers; fields we do not model
/// (`other`) are passed through unless we set them.
pub(crate) fn base_pod_spec(extra: &ExtraPodSpec) -> PodSpec {
    let spec = PodSpec {
        init_containers: extra.init_containers.clone(),
        volumes: extra.volumes.clone(),
        node_selector: extra.node_selector.clone(),
        affinity: extra.affinity.clone(),
        tolerations: extra.tolerations.clone(),
        topology_spread_constraints: extra.topology_spread_constraints.clone(),
        service_account_name: extra.service_account_name.clone(),
        image_pull_secrets: extra.image_pull_secrets.clone(),
        security_context: Some(pod_security_context(extra.security_context.as_ref())),
        termination_grace_period_seconds: extra.termination_grace_period_seconds,
        priority_class_name: extra.priority_class_name.clone(),
        scheduler_name: extra.scheduler_name.clone(),
        runtime_class_name: extra.runtime_class_name.clone(),
        host_network: extra.host_network,
        host_ipc: extra.host_ipc,
        dns_policy: extra.dns_policy.clone(),
        ..PodSpec::default()
    };
    if extra.other.is_empty() {
        return spec;
    }
    let mut value = serde_json::to_value(&spec).expect("PodSpec serializes");
    if let Some(map) = value.as_object_mut() {
        for (key, v) in &extra.other {
            map.entry(key.clone()).or_insert_with(|| v.clone());
        }
    }
    // An unknown field of the wrong shape is dropped rather than failing the whole graph;
    // the API server's schema check of the DGD is the place that reports it.
    serde_json::from_value(value).unwrap_or(spec)
}

/// GPUs per pod and the GPU resource name of a service.
pub(crate) fn gpu_request(spec: &ComponentSpec) -> (u32, String) {
    let resources = spec.resources.clone().unwrap_or_default();
    let gpu_type = [&resources.limits, &resources.requests]
        .into_iter()
        .flatten()
        .find_map(|item| item.gpu_type.clone())
        .unwrap_or_else(|| DEFAULT_GPU_RESOURCE.into());
    (resources.gpus_per_pod(), gpu_type)
}

/// The service's `resources` over whatever the main container already had. GPUs (an
/// extended resource) go in both requests and limits, which Kubernetes requires equal.
pub(crate) fn merge_resources(
    existing: Option<ResourceRequirements>,
    spec: &ComponentSpec,
) -> Option<ResourceRequirements> {
    let mut out = existing.unwrap_or_default();
    let resources = spec.resources.clone().unwrap_or_default();
    let apply = |target: &mut Option<BTreeMap<String, Quantity>>, item: &Option<ResourceItem>| {
        let Some(item) = item else { return };
        let map = target.get_or_insert_with(BTreeMap::new);
        for (name, value) in [("cpu", &item.cpu), ("memory", &item.memory)] {
            if let Some(v) = value {
                map.insert(name.into(), Quantity(v.clone()));
            }
        }
        for (name, value) in item.custom.iter().flatten() {
            map.insert(name.clone(), Quantity(value.clone()));
        }
    };
    apply(&mut out.requests, &resources.requests);
    apply(&mut out.limits, &resources.limits);
    let (gpus, gpu_resource) = gpu_request(spec);
    if gpus > 0 {
        for target in [&mut out.requests, &mut out.limits] {
            target
                .get_or_insert_with(BTreeMap::new)
                .insert(gpu_resource.clone(), Quantity(gpus.to_string()));
        }
    }
    if resources.claims.is_some() {
        out.claims = resources.claims.clone();
    }
    (out != ResourceRequirements::default()).then_some(out)
}

fn shared_memory_size(g: &Graph, spec: &ComponentSpec) -> Option<String> {
    match &spec.shared_memory {
        Some(shm) if shm.disabled == Some(true) => None,
        Some(shm) => Some(
            shm.size
                .as_ref()
                .map_or_else(|| g.config.default_shared_memory.clone(), |q| q.0.clone()),
        ),
        None => Some(g.config.default_shared_memory.clone()),
    }
}

pub(crate) fn http_probe(path: &str, port: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(port),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(10),
        ..Probe::default()
    }
}

pub(crate) fn plain_env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// A variable from a field of the pod (the downward API).
pub(crate) fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.into(),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// Sets `var`, replacing an earlier one of the same name in place (order stays stable).
pub(crate) fn upsert_env(env: &mut Vec<EnvVar>, var: EnvVar) {
    match env.iter_mut().find(|e| e.name == var.name) {
        Some(existing) => *existing = var,
        None => env.push(var),
    }
}

/// `top`'s set fields over `base` (one level deep, as JSON objects).
fn overlay<T: Serialize + DeserializeOwned + Clone>(base: &T, top: &T) -> T {
    let mut merged = serde_json::to_value(base).expect("k8s objects serialize");
    if let (Some(m), serde_json::Value::Object(t)) = (
        merged.as_object_mut(),
        serde_json::to_value(top).expect("k8s objects serialize"),
    ) {
        for (k, v) in t {
            if !v.is_null() && v != serde_json::Value::String(String::new()) {
                m.insert(k, v);
            }
        }
    }
    serde_json::from_value(merged).unwrap_or_else(|_| top.clone())
}

#[cfg(test)]
mod tests {
    use dynamo_crds::DynamoGraphDeployment;
    use k8s_openapi::api::apps::v1::Deployment;
    use serde_json::{Value, json};

    use super::super::{Desired, Observed, OperatorConfig, reconcile};
    use super::*;

    fn desired(backend: &str, services: Value) -> Desired {
        let dgd: DynamoGraphDeployment = serde_json::from_value(json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
            "spec": {"backendFramework": backend, "services": services},
        }))
        .unwrap();
        reconcile(&dgd, &Observed::default(), &OperatorConfig::default()).unwrap()
    }

    fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
        spec.containers
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no container {name}"))
    }

    /// The injected sidecar, where it belongs: among the init containers.
    fn sidecar(spec: &PodSpec) -> &Container {
        spec.init_containers
            .iter()
            .flatten()
            .find(|c| c.name == SIDECAR)
            .expect("no sidecar init container")
    }

    fn context(c: &Container) -> Value {
        serde_json::to_value(&c.security_context).unwrap()
    }

    fn pod_context(spec: &PodSpec) -> Value {
        serde_json::to_value(&spec.security_context).unwrap()
    }

    fn deployment<'a>(d: &'a Desired, name: &str) -> &'a PodSpec {
        d.deployments
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name))
            .and_then(|d: &Deployment| d.spec.as_ref()?.template.spec.as_ref())
            .unwrap_or_else(|| panic!("no deployment {name}"))
    }

    fn restricted() -> Value {
        json!({
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
        })
    }

    fn runtime_default() -> Value {
        json!({"seccompProfile": {"type": "RuntimeDefault"}})
    }

    #[test]
    fn our_own_containers_get_the_restricted_profile_and_name_their_binary() {
        let d = desired(
            "mocker",
            json!({
                "epp": {"componentType": "epp"},
                "worker": {"componentType": "worker", "replicas": 1},
            }),
        );
        let pod = d.pods[0].spec.as_ref().unwrap();
        assert_eq!(pod_context(pod), runtime_default());
        for (c, binary) in [
            (container(pod, "main"), "dynamo-mocker"),
            (sidecar(pod), "dynamo-sidecar"),
        ] {
            assert_eq!(context(c), restricted(), "{}", c.name);
            assert_eq!(c.command.as_ref().unwrap()[0], binary);
            assert_eq!(c.image.as_deref(), Some(super::super::DEFAULT_IMAGE));
        }
        let epp = deployment(&d, "g-epp");
        assert_eq!(pod_context(epp), runtime_default());
        assert_eq!(context(container(epp, "epp")), restricted());
        assert_eq!(
            container(epp, "epp").command.as_deref(),
            Some(&["dynamo-epp".to_string()][..])
        );
    }

    fn names(containers: &[Container]) -> Vec<&str> {
        containers.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn the_sidecar_is_a_native_sidecar_after_the_users_init_containers() {
        let d = desired(
            "mocker",
            json!({"worker": {"componentType": "worker", "replicas": 1, "extraPodSpec": {
            "initContainers": [
                {"name": "fetch-model", "image": "busybox"},
                {"name": "mesh-proxy", "image": "proxy", "restartPolicy": "Always"},
                {"name": "sidecar", "image": "theirs"},
            ],
            "containers": [
                {"name": "log-shipper", "image": "fluent-bit"},
                {"name": "sidecar", "image": "theirs"},
            ]}}}),
        );
        let pod = d.pods[0].spec.as_ref().unwrap();
        let inits = pod.init_containers.as_deref().unwrap();
        // Theirs first, in their order and as they wrote them; ours replaces one named
        // like it and is last, so it is up before `main` and after what they prepare.
        assert_eq!(names(inits), ["fetch-model", "mesh-proxy", "sidecar"]);
        assert_eq!(inits[0].restart_policy, None);
        assert_eq!(inits[1].restart_policy.as_deref(), Some("Always"));
        let ours = sidecar(pod);
        assert_eq!(ours.restart_policy.as_deref(), Some("Always"));
        assert_eq!(ours.image.as_deref(), Some(super::super::DEFAULT_IMAGE));
        assert_eq!(ours.command.as_ref().unwrap()[0], "dynamo-sidecar");
        // `main` has no twin of it among the regular containers.
        assert_eq!(names(&pod.containers), ["main", "log-shipper"]);
        assert!(
            pod.containers.iter().all(|c| c
                .command
                .iter()
                .flatten()
                .all(|w| w != "dynamo-sidecar")),
            "{:?}",
            pod.containers
        );
        // Everything else about it as before: the named ports Services and the
        // PodMonitor target, the probes that gate the pod's readiness.
        let ports: Vec<(Option<&str>, i32)> = ours
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.as_deref(), p.container_port))
            .collect();
        assert_eq!(
            ports,
            [
                (Some("http"), 8000),
                (Some("grpc"), 9100),
                (Some(METRICS_PORT_NAME), 9090)
            ]
        );
        let get = |probe: &Option<Probe>| {
            let action = probe.as_ref().unwrap().http_get.as_ref().unwrap();
            (action.path.clone().unwrap(), action.port.clone())
        };
        assert_eq!(
            get(&ours.readiness_probe),
            ("/ready".into(), IntOrString::Int(9090))
        );
        assert_eq!(
            get(&ours.liveness_probe),
            ("/health".into(), IntOrString::Int(9090))
        );
        assert_eq!(ours.startup_probe, None);
    }

    #[test]
    fn every_pod_of_a_gang_gets_its_own_native_sidecar() {
        let d = desired(
            "vllm",
            json!({"decode": {"componentType": "worker", "subComponentType": "decode",
                "replicas": 1, "multinode": {"nodeCount": 2},
                "resources": {"limits": {"gpu": "8"}},
                "extraPodSpec": {"mainContainer": {"command": ["vllm", "serve", "m"]}}}}),
        );
        assert_eq!(d.pods.len(), 2, "one pod per rank");
        for pod in &d.pods {
            let spec = pod.spec.as_ref().unwrap();
            let name = pod.metadata.name.as_deref().unwrap();
            assert_eq!(
                names(spec.init_containers.as_deref().unwrap()),
                ["sidecar"],
                "{name}"
            );
            assert_eq!(
                sidecar(spec).restart_policy.as_deref(),
                Some("Always"),
                "{name}"
            );
            assert_eq!(names(&spec.containers), ["main"], "{name}");
        }
    }

    #[test]
    fn a_real_engine_keeps_its_user_caches_and_capabilities() {
        let d = desired(
            "vllm",
            json!({
                "worker": {"componentType": "worker", "replicas": 1, "extraPodSpec": {
                    "mainContainer": {"command": ["vllm", "serve", "Qwen/Qwen3-0.6B"]}}},
                // A planner of the user's own, not `dynamo planner`.
                "planner": {"componentType": "planner",
                    "extraPodSpec": {"mainContainer": {"image": "planner:1",
                        "command": ["python3", "planner.py"]}}},
            }),
        );
        let pod = d.pods[0].spec.as_ref().unwrap();
        assert_eq!(pod_context(pod), runtime_default());
        // Only no_new_privs: vLLM's image runs as root and writes ~/.cache and /tmp.
        let engine = json!({"allowPrivilegeEscalation": false});
        assert_eq!(context(container(pod, "main")), engine);
        assert_eq!(context(sidecar(pod)), restricted());
        let planner = deployment(&d, "g-planner");
        assert_eq!(pod_context(planner), runtime_default());
        assert_eq!(context(container(planner, "main")), engine);
    }

    #[test]
    fn the_users_own_security_contexts_win_field_by_field() {
        let d = desired(
            "mocker",
            json!({
                "epp": {"componentType": "epp", "extraPodSpec": {
                    "mainContainer": {"securityContext": {"readOnlyRootFilesystem": false}}}},
                "worker": {"componentType": "worker", "replicas": 1, "extraPodSpec": {
                    "securityContext": {"seccompProfile": {"type": "Unconfined"}, "fsGroup": 1000},
                    "mainContainer": {"securityContext": {
                        "runAsNonRoot": false, "runAsUser": 0,
                        "capabilities": {"add": ["IPC_LOCK"]}}}}},
            }),
        );
        let pod = d.pods[0].spec.as_ref().unwrap();
        assert_eq!(
            pod_context(pod),
            json!({"fsGroup": 1000, "seccompProfile": {"type": "Unconfined"}})
        );
        assert_eq!(
            context(container(pod, "main")),
            json!({
                "allowPrivilegeEscalation": false,
                "capabilities": {"add": ["IPC_LOCK"]},
                "readOnlyRootFilesystem": true,
                "runAsNonRoot": false,
                "runAsUser": 0,
            })
        );
        // The injected sidecar is ours alone.
        assert_eq!(context(sidecar(pod)), restricted());
        let mut epp = restricted();
        epp["readOnlyRootFilesystem"] = json!(false);
        assert_eq!(context(container(deployment(&d, "g-epp"), "epp")), epp);
    }

    fn env(pairs: &[(&str, &str)]) -> Value {
        pairs
            .iter()
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect()
    }

    fn mount<'a>(c: &'a Container, name: &str) -> Option<&'a VolumeMount> {
        c.volume_mounts.iter().flatten().find(|m| m.name == name)
    }

    fn request(c: &Container, resource: &str) -> Option<String> {
        let requests = c.resources.as_ref()?.requests.as_ref()?;
        requests.get(resource).map(|q| q.0.clone())
    }

    #[test]
    fn the_services_log_format_reaches_its_sidecar() {
        let d = desired(
            "mocker",
            json!({"worker": {"componentType": "worker", "replicas": 1, "envs": env(&[
                ("DYN_LOGGING_JSONL", "1"), ("DYNAMO_LOG_FORMAT", "json"), ("OTHER", "x")])}}),
        );
        let env = sidecar(d.pods[0].spec.as_ref().unwrap())
            .env
            .clone()
            .unwrap();
        let value = |name: &str| {
            env.iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(value("DYN_LOGGING_JSONL").as_deref(), Some("1"));
        assert_eq!(value("DYNAMO_LOG_FORMAT").as_deref(), Some("json"));
        assert_eq!(value("OTHER"), None, "only the log format's variables");
    }

    #[test]
    fn kv_tiers_give_the_sidecar_its_flags_a_sized_disk_volume_and_the_memory() {
        let d = desired(
            "mocker",
            json!({"worker": {"componentType": "worker", "replicas": 1, "envs": env(&[
                ("DYN_KVBM_CPU_CACHE_GB", "2"), ("DYN_KVBM_DISK_CACHE_GB", "10")])}}),
        );
        let pod = d.pods[0].spec.as_ref().unwrap();
        let sidecar = sidecar(pod);
        let command = sidecar.command.as_ref().unwrap().join(" ");
        assert!(
            command.ends_with(
                "--kv-host-bytes 2000000000 --kv-disk-dir /dynamo/kv-disk \
                 --kv-disk-bytes 10000000000"
            ),
            "{command}"
        );
        let disk = mount(sidecar, KV_DISK_VOLUME).unwrap();
        assert_eq!(
            (disk.mount_path.as_str(), disk.read_only),
            (DEFAULT_KV_DISK_DIR, None)
        );
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == KV_DISK_VOLUME);
        assert_eq!(
            serde_json::to_value(volume.unwrap()).unwrap(),
            json!({"name": KV_DISK_VOLUME, "emptyDir": {"sizeLimit": "10268435456"}})
        );
        assert_eq!(
            request(sidecar, "memory").as_deref(),
            Some("2134217728"),
            "128Mi and the host tier"
        );
        assert_eq!(
            request(sidecar, "ephemeral-storage").as_deref(),
            Some("10268435456"),
            "the tier and what may be leaving it for the object store"
        );
        // The engine offloads to its sidecar's gRPC port; it never sees the disk.
        let main = container(pod, "main");
        let engine = main.command.as_ref().unwrap().join(" ");
        assert!(
            engine.ends_with("--kv-blocks-url http://127.0.0.1:9100"),
            "{engine}"
        );
        assert!(mount(main, KV_DISK_VOLUME).is_none());
    }

    #[test]
    fn a_vllm_engine_with_tiers_gets_our_connector_from_an_init_container() {
        let d = desired(
            "vllm",
            json!({"worker": {"componentType": "worker", "replicas": 1,
                "envs": env(&[("DYN_KVBM_CPU_CACHE_GB", "2"), ("PYTHONPATH", "/app")]),
                "extraPodSpec": {"mainContainer": {"command": ["vllm", "serve", "m"]}}}}),
        );
        let pod = d.pods[0].spec.as_ref().unwrap();
        let main = container(pod, "main");
        let command = main.command.as_ref().unwrap();
        let at = command
            .iter()
            .position(|w| w == "--kv-transfer-config")
            .unwrap();
        let config: Value = serde_json::from_str(&command[at + 1]).unwrap();
        assert_eq!(config["kv_connector"], connector::CLASS);
        assert_eq!(config["kv_connector_module_path"], connector::MODULE);
        assert_eq!(
            config["kv_connector_extra_config"]["block_api"],
            "127.0.0.1:9100"
        );
        // Its package first on the engine's path, the user's after it.
        let path = main
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "PYTHONPATH")
            .unwrap();
        assert_eq!(path.value.as_deref(), Some("/opt/dynamo/python:/app"));
        let package = mount(main, CONNECTOR).unwrap();
        assert_eq!(
            (package.mount_path.as_str(), package.read_only),
            (connector::POD_DIR, Some(true))
        );
        // Our image writes it there before the engine starts.
        let inits = pod.init_containers.as_ref().unwrap();
        let writer = inits.iter().position(|c| c.name == CONNECTOR).unwrap();
        assert!(writer < inits.iter().position(|c| c.name == SIDECAR).unwrap());
        let writer = &inits[writer];
        assert_eq!(
            writer.command.as_ref().unwrap().join(" "),
            "dynamo connector install /opt/dynamo/python"
        );
        assert_eq!(writer.image, sidecar(pod).image);
        assert_eq!(mount(writer, CONNECTOR).unwrap().read_only, None);
        // The engine's /dev/shm is a volume: its sidecar makes the shared regions there.
        let shm = mount(sidecar(pod), SHM_VOLUME).expect("the engine's /dev/shm");
        assert_eq!((shm.mount_path.as_str(), shm.read_only), ("/dev/shm", None));
        assert!(mount(sidecar(pod), CONNECTOR).is_none());

        // Without tiers, none of it.
        let d = desired(
            "vllm",
            json!({"worker": {"componentType": "worker", "replicas": 1,
                "extraPodSpec": {"mainContainer": {"command": ["vllm", "serve", "m"]}}}}),
        );
        let pod = d.pods[0].spec.as_ref().unwrap();
        assert!(
            pod.init_containers
                .iter()
                .flatten()
                .all(|c| c.name != CONNECTOR)
        );
        assert!(mount(sidecar(pod), SHM_VOLUME).is_none());
        let main = container(pod, "main");
        assert!(main.env.iter().flatten().all(|e| e.name != "PYTHONPATH"));
    }

    #[test]
    fn without_tiers_the_pod_is_as_before() {
        let d = desired(
            "mocker",
            json!({"worker": {"componentType": "worker", "replicas": 1}}),
        );
        let pod = d.pods[0].spec.as_ref().unwrap();
        let sidecar = sidecar(pod);
        assert!(
            !sidecar
                .command
                .as_ref()
                .unwrap()
                .iter()
                .any(|w| w.starts_with("--kv-h"))
        );
        assert_eq!(request(sidecar, "memory").as_deref(), Some("128Mi"));
        assert!(
            pod.volumes
                .iter()
                .flatten()
                .all(|v| v.name != KV_DISK_VOLUME)
        );
        let engine = container(pod, "main").command.as_ref().unwrap();
        assert!(!engine.iter().any(|w| w == "--kv-blocks-url"));
    }

    #[test]
    fn a_disk_dir_on_the_services_own_volume_is_written_there_and_nowhere_else() {
        let d = desired(
            "vllm",
            json!({"worker": {"componentType": "worker", "replicas": 1,
                "volumeMounts": [{"name": "nvme", "mountPoint": "/mnt/nvme"}],
                "envs": env(&[("DYN_KVBM_DISK_CACHE_GB", "100"),
                    ("DYN_KVBM_DISK_CACHE_DIR", "/mnt/nvme/kv"),
                    ("DYN_KVBM_DISABLE_DISK_OFFLOAD_FILTER", "true")]),
                "extraPodSpec": {"mainContainer": {"command": ["vllm", "serve", "Qwen/Qwen3-0.6B"]}}}}),
        );
        let pod = d.pods[0].spec.as_ref().unwrap();
        let sidecar = sidecar(pod);
        let command = sidecar.command.as_ref().unwrap().join(" ");
        assert!(
            command.ends_with(
                "--kv-disk-dir /mnt/nvme/kv --kv-disk-bytes 100000000000 --kv-disk-min-reuse 1"
            ),
            "{command}"
        );
        assert_eq!(mount(sidecar, "nvme").unwrap().read_only, None);
        assert_eq!(
            mount(sidecar, HF_HOME_VOLUME).unwrap().read_only,
            Some(true)
        );
        assert!(mount(sidecar, KV_DISK_VOLUME).is_none());
        assert!(
            pod.volumes
                .iter()
                .flatten()
                .all(|v| v.name != KV_DISK_VOLUME)
        );
        assert_eq!(request(sidecar, "ephemeral-storage"), None);
        // vLLM gets no flag we cannot back: it would need a connector to the block API.
        let engine = container(pod, "main").command.as_ref().unwrap();
        assert!(!engine.iter().any(|w| w.starts_with("--kv-blocks")));
    }

    #[test]
    fn the_object_tier_reaches_s3_with_the_services_credentials() {
        let d = desired(
            "mocker",
            json!({"worker": {"componentType": "worker", "replicas": 1,
            "envFromSecret": "s3-credentials",
            "envs": [
                {"name": "AWS_SECRET_ACCESS_KEY",
                 "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}},
                {"name": "AWS_REGION", "value": "us-west-2"},
                {"name": "HF_TOKEN", "value": "not-for-the-sidecar"},
                {"name": "DYN_KVBM_OBJECT_ENABLED", "value": "true"},
                {"name": "DYN_KVBM_OBJECT_BUCKET", "value": "kv-blocks"},
                {"name": "DYNAMO_KVBM_OBJECT_CACHE_GB", "value": "50"},
                {"name": "DYN_KVBM_OBJECT_ENDPOINT", "value": "http://minio.storage:9000"},
                {"name": "DYN_KVBM_OBJECT_REGION", "value": "eu-west-1"},
            ]}}),
        );
        let pod = d.pods[0].spec.as_ref().unwrap();
        let sidecar = sidecar(pod);
        let command = sidecar.command.as_ref().unwrap().join(" ");
        assert!(
            command.ends_with(
                "--kv-object-url s3://kv-blocks/ns/g/worker --kv-object-bytes 50000000000"
            ),
            "{command}"
        );
        let env: Value = sidecar
            .env
            .iter()
            .flatten()
            .filter(|e| e.name.starts_with("AWS_") || e.name == "HF_TOKEN")
            .map(|e| serde_json::to_value(e).unwrap())
            .collect();
        assert_eq!(
            env,
            json!([
                {"name": "AWS_SECRET_ACCESS_KEY",
                 "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}},
                {"name": "AWS_REGION", "value": "eu-west-1"},
                {"name": "AWS_ENDPOINT_URL", "value": "http://minio.storage:9000"},
                {"name": "AWS_ALLOW_HTTP", "value": "true"},
            ])
        );
        assert_eq!(
            serde_json::to_value(&sidecar.env_from).unwrap(),
            json!([{"secretRef": {"name": "s3-credentials"}}])
        );
        assert_eq!(request(sidecar, "memory").as_deref(), Some("128Mi"));
    }

    #[test]
    fn a_graph_with_a_bad_tier_size_is_refused_naming_the_service_and_variable() {
        let dgd: DynamoGraphDeployment = serde_json::from_value(json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
            "spec": {"backendFramework": "mocker", "envs": env(&[("DYN_KVBM_CPU_CACHE_GB", "2GB")]),
                "services": {"decode": {"componentType": "worker"}}},
        }))
        .unwrap();
        let err = reconcile(&dgd, &Observed::default(), &OperatorConfig::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.services.decode: DYN_KVBM_CPU_CACHE_GB is \"2GB\", not a size: a number of \
             gigabytes (10^9 bytes, as Dynamo counts them), e.g. 4 or 0.5"
        );
    }

    #[test]
    fn a_privileged_container_is_not_told_not_to_escalate() {
        let user = |value: Value| serde_json::from_value::<SecurityContext>(value).unwrap();
        // The API server refuses allowPrivilegeEscalation: false beside either of these.
        for escalates in [
            json!({"privileged": true}),
            json!({"capabilities": {"add": ["CAP_SYS_ADMIN"]}}),
            json!({"capabilities": {"add": ["SYS_ADMIN"]}}),
        ] {
            let merged = merge_security_context(no_privilege_escalation(), Some(&user(escalates)));
            assert_eq!(merged.allow_privilege_escalation, None, "{merged:?}");
        }
        // Unless the user says so themselves.
        let explicit = user(json!({"privileged": true, "allowPrivilegeEscalation": true}));
        let merged = merge_security_context(restricted_container(), Some(&explicit));
        assert_eq!(merged.allow_privilege_escalation, Some(true));
        // Other capabilities keep it.
        let lock = user(json!({"capabilities": {"add": ["IPC_LOCK"]}}));
        let merged = merge_security_context(no_privilege_escalation(), Some(&lock));
        assert_eq!(merged.allow_privilege_escalation, Some(false));
    }
}
