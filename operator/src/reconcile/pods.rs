//! Engine pods: the `main` container with the service's defaults merged in, the injected
//! `sidecar`, shared memory, volumes, and the per-replica and per-rank parts of a gang.

use std::collections::BTreeMap;

use dynamo_crds::ComponentSpec;
use dynamo_crds::common::{ExtraPodSpec, ResourceItem};
use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, EmptyDirVolumeSource, EnvFromSource, EnvVar, EnvVarSource,
    HTTPGetAction, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod, PodAffinityTerm, PodAntiAffinity,
    PodSchedulingGate, PodSpec, Probe, ResourceRequirements, SecretEnvSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::gang::DEFAULT_GPU_RESOURCE;
use super::graph::{Graph, Role};
use super::{labels, names};

/// Engine port inside the pod (the sidecar proxies 8000 to it).
pub const ENGINE_PORT: i32 = 8001;
/// Sidecar inference port; Services and the InferencePool target it.
pub const HTTP_PORT: i32 = 8000;
/// Sidecar gRPC port (KV events, KV blocks, transfers).
pub const SIDECAR_GRPC_PORT: i32 = 9100;
/// Sidecar metrics and health port.
pub const METRICS_PORT: i32 = 9090;

const MAIN: &str = "main";
const SIDECAR: &str = "sidecar";
const SHM_VOLUME: &str = "shm";

/// The pod every replica of an engine service starts from: everything but the name and
/// the replica/rank parts. Its hash is the service's spec hash.
pub(crate) fn engine_template(g: &Graph, service: &str, spec: &ComponentSpec, role: Role) -> Pod {
    let extra = spec.extra_pod_spec.clone().unwrap_or_default();
    let mut pod_spec = base_pod_spec(&extra);

    let mut containers = vec![main_container(g, spec, true)];
    containers.extend(
        extra
            .containers
            .iter()
            .flatten()
            .filter(|c| c.name != MAIN && c.name != SIDECAR)
            .cloned(),
    );
    containers.push(sidecar_container(g, service, role));
    pod_spec.containers = containers;

    let mut volumes = pod_spec.volumes.take().unwrap_or_default();
    volumes.extend(service_volumes(g, spec));
    pod_spec.volumes = (!volumes.is_empty()).then_some(volumes);

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
/// `main`) with the service's image, command, env, resources, mounts and probes merged in.
pub(crate) fn main_container(g: &Graph, spec: &ComponentSpec, engine: bool) -> Container {
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

    let mocker = engine && g.is_mocker();
    if main.image.as_deref().is_none_or(str::is_empty) {
        main.image = Some(if mocker {
            g.config.mocker_image.clone()
        } else {
            g.config.default_engine_image.clone()
        });
    }
    if mocker {
        if main.command.as_ref().is_none_or(Vec::is_empty) {
            main.command = Some(vec!["dynamo-mocker".into()]);
        }
        let args = main.args.get_or_insert_with(Vec::new);
        // The sidecar expects the engine on loopback port 8001 (mocker default: 8000).
        if !args
            .iter()
            .any(|a| a == "--port" || a.starts_with("--port="))
        {
            args.extend(["--port".into(), ENGINE_PORT.to_string()]);
        }
    }

    let mut env = Vec::new();
    if mocker {
        // The mocker reads its model directory from here unless `--model-path` is given;
        // the graph's or service's envs override it.
        env.push(plain_env("DYNAMO_MODEL_PATH", &g.config.mocker_model_path));
    }
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

    if engine {
        let ports = main.ports.get_or_insert_with(Vec::new);
        if !ports.iter().any(|p| p.container_port == ENGINE_PORT) {
            ports.push(ContainerPort {
                name: Some("engine".into()),
                container_port: ENGINE_PORT,
                ..ContainerPort::default()
            });
        }
    }

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
    main.volume_mounts = (!mounts.is_empty()).then_some(mounts);

    if let Some(probe) = &spec.liveness_probe {
        main.liveness_probe = Some(probe.clone());
    }
    if let Some(probe) = &spec.readiness_probe {
        main.readiness_probe = Some(probe.clone());
    } else if engine && main.readiness_probe.is_none() {
        // vLLM's and the mocker's /health. No default liveness probe: a large model can
        // take many minutes to load and must not be killed for it.
        main.readiness_probe = Some(http_probe("/health", ENGINE_PORT));
    }
    main
}

fn sidecar_container(g: &Graph, service: &str, role: Role) -> Container {
    let port = |name: &str, number: i32| ContainerPort {
        name: Some(name.into()),
        container_port: number,
        ..ContainerPort::default()
    };
    let field = |path: &str| EnvVarSource {
        field_ref: Some(ObjectFieldSelector {
            api_version: None,
            field_path: path.into(),
        }),
        ..EnvVarSource::default()
    };
    let from_field = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(field(path)),
    };
    Container {
        name: SIDECAR.into(),
        image: Some(g.config.sidecar_image.clone()),
        ports: Some(vec![
            port("http", HTTP_PORT),
            port("grpc", SIDECAR_GRPC_PORT),
            port("metrics", METRICS_PORT),
        ]),
        env: Some(vec![
            plain_env(
                "DYNAMO_SIDECAR_ENGINE_URL",
                &format!("http://127.0.0.1:{ENGINE_PORT}"),
            ),
            plain_env("DYNAMO_SIDECAR_ENGINE_KV_EVENTS", "tcp://127.0.0.1:5557"),
            plain_env("DYNAMO_GRAPH", g.name),
            plain_env("DYNAMO_COMPONENT", service),
            plain_env("DYNAMO_ROLE", role.as_str()),
            from_field("POD_NAME", "metadata.name"),
            from_field("POD_IP", "status.podIP"),
        ]),
        readiness_probe: Some(http_probe("/ready", METRICS_PORT)),
        liveness_probe: Some(Probe {
            failure_threshold: Some(6),
            ..http_probe("/health", METRICS_PORT)
        }),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), Quantity("100m".into())),
                ("memory".into(), Quantity("128Mi".into())),
            ])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
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
        security_context: extra.security_context.clone(),
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
