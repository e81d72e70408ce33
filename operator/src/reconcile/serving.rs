//! The serving path of a graph with engines: the endpoint picker (EPP) Deployment and
//! Service, Services for frontend components, the InferencePool, the optional HTTPRoute,
//! and planner Deployments.
//!
//! A `frontend` service is not a pod of its own: the EPP serves the OpenAI HTTP API on
//! port 8000 next to its ext_proc port, so a frontend service becomes a Service with the
//! frontend's name in front of the EPP pods (no second hop, no duplicate router).

use std::collections::BTreeMap;
use std::path::Path;

use dynamo_crds::inference_pool::{
    EndpointPickerFailureMode, EndpointPickerRef, InferencePool, InferencePoolSpec,
    PoolLabelSelector, PoolPort,
};
use dynamo_crds::{ComponentSpec, ServiceReplicaStatus};
use gateway_api::apis::standard::httproutes::{
    HttpRoute, HttpRouteParentRefs, HttpRouteRules, HttpRouteRulesBackendRefs,
    HttpRouteRulesMatches, HttpRouteRulesMatchesPath, HttpRouteRulesMatchesPathType, HttpRouteSpec,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, GRPCAction, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{credential, epp_access, planner_access};
use dynamo_crds::ServiceRole;
use dynamo_names::Role;

use super::graph::Graph;
use super::pods::{self, HTTP_PORT, METRICS_PORT, METRICS_PORT_NAME, PLANNER_PROFILE};
use super::services::http_service;
use super::{Desired, Observed, labels, names};
use dynamo_server::metrics_endpoint::HEALTH_PATH;
use dynamo_wiring::planner::{GRAPH_ENV, NAMESPACE_ENV};
use dynamo_wiring::{Addresses, DYNAMO_BINARY, EPP_BINARY, Picker, PickerPods};

/// EPP ext_proc (gRPC) port, the Inference Extension's default.
pub const EPP_GRPC_PORT: i32 = 9002;

/// Readiness of a service realized as a Deployment (EPP, frontend, planner).
#[derive(Clone, Debug)]
pub(crate) struct DeploymentOutcome {
    pub service: String,
    pub status: ServiceReplicaStatus,
    pub ready: bool,
}

pub(crate) fn build(
    g: &Graph,
    observed: &Observed,
    desired: &mut Desired,
) -> Vec<DeploymentOutcome> {
    let mut outcomes = Vec::new();
    let front: Vec<(&String, &ComponentSpec)> = g
        .spec
        .services
        .iter()
        .filter(|(_, s)| matches!(s.role(), ServiceRole::Epp | ServiceRole::Frontend))
        .collect();
    let has_engines = g.engine_services().next().is_some();

    if has_engines || !front.is_empty() {
        let (deployment, ready) = epp_deployment(g, observed, &front, desired);
        let status = deployment_status(observed, &deployment, ready);
        desired.deployments.push(deployment);
        desired.services.push(epp_service(g));
        for (service, spec) in &front {
            if spec.role() == ServiceRole::Frontend
                && names::service(g.name, service) != names::epp(g.name)
            {
                desired.services.push(http_service(
                    g,
                    names::service(g.name, service),
                    g.service_labels(service, spec),
                    epp_selector(g),
                ));
            }
            outcomes.push(DeploymentOutcome {
                service: (*service).clone(),
                status: status.0.clone(),
                ready: status.1,
            });
        }
    }
    if has_engines {
        desired.inference_pools.push(inference_pool(g));
        if let Some(route) = http_route(g) {
            desired.http_routes.push(route);
        }
    }
    for (service, spec) in &g.spec.services {
        if spec.role() == ServiceRole::Planner {
            let (deployment, ready) = planner_deployment(g, observed, service, spec, desired);
            let (status, ready) = deployment_status(observed, &deployment, ready);
            desired.deployments.push(deployment);
            outcomes.push(DeploymentOutcome {
                service: service.clone(),
                status,
                ready,
            });
        }
    }
    outcomes
}

fn epp_selector(g: &Graph) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::GRAPH.to_string(), g.name.to_string()),
        (labels::COMPONENT_TYPE.to_string(), "epp".to_string()),
    ])
}

/// The EPP Deployment, configured by flags for this graph's pool and roles; `ready` says
/// whether the observed Deployment has fully rolled out this exact spec. Unless the
/// graph names the EPP's service account, the EPP's own access goes into `desired`.
fn epp_deployment(
    g: &Graph,
    observed: &Observed,
    front: &[(&String, &ComponentSpec)],
    desired: &mut Desired,
) -> (Deployment, bool) {
    let epp_spec = front
        .iter()
        .find(|(_, s)| s.role() == ServiceRole::Epp)
        .or_else(|| front.first())
        .map(|(_, s)| (*s).clone())
        .unwrap_or_default();
    let replicas = epp_spec.replicas.unwrap_or(1);
    let user = epp_spec
        .extra_pod_spec
        .as_ref()
        .and_then(|e| e.main_container.clone())
        .unwrap_or_default();
    // A frontend's image is Dynamo's Python frontend; only an epp service's image is ours.
    let image = front
        .iter()
        .find(|(_, s)| s.role() == ServiceRole::Epp)
        .and_then(|(_, s)| {
            s.extra_pod_spec
                .as_ref()?
                .main_container
                .as_ref()?
                .image
                .clone()
        })
        .unwrap_or_else(|| g.config.epp_image.clone());

    let pool_selector = BTreeMap::from([(labels::INFERENCE_POOL.to_string(), g.name.to_string())]);
    let role_selectors = [Role::Prefill, Role::Decode]
        .into_iter()
        .map(|role| {
            let mut selector = pool_selector.clone();
            selector.insert(labels::ROLE.into(), role.as_str().into());
            (role, labels::selector_string(&selector))
        })
        .collect();
    // No model directory: the picker loads the model from its pods' sidecars.
    let picker = Picker {
        host: Addresses::POD.sidecar_host.to_string(),
        http_port: Addresses::POD.sidecar_http,
        ext_proc_port: EPP_GRPC_PORT as u16,
        metrics_port: Some(Addresses::POD.sidecar_metrics),
        model_path: None,
        router_mode: dynamo_wiring::router_mode(g.spec)
            .unwrap_or_else(|| g.config.default_router_mode.clone()),
        pods: PickerPods::Pool {
            name: names::inference_pool(g.name),
            namespace: g.namespace.into(),
            selector: labels::selector_string(&pool_selector),
            role_selectors,
        },
    };
    let mut args = picker.args(g.wiring.as_ref());
    args.extend(user.args.clone().unwrap_or_default());

    let mut env = Vec::new();
    for var in g
        .spec
        .envs
        .iter()
        .flatten()
        .chain(epp_spec.envs.iter().flatten())
    {
        pods::upsert_env(&mut env, var.clone());
    }
    let grpc_probe = |service: &str| Probe {
        grpc: Some(GRPCAction {
            port: EPP_GRPC_PORT,
            service: Some(service.into()),
        }),
        period_seconds: Some(10),
        ..Probe::default()
    };
    let port = |name: &str, number: i32| ContainerPort {
        name: Some(name.into()),
        container_port: number,
        ..ContainerPort::default()
    };
    let container = Container {
        name: "epp".into(),
        image: Some(image),
        command: user
            .command
            .clone()
            .or_else(|| Some(vec![EPP_BINARY.into()])),
        args: Some(args),
        env: (!env.is_empty()).then_some(env),
        ports: Some(vec![
            port("grpc", EPP_GRPC_PORT),
            port("http", HTTP_PORT),
            pods::metrics_port(),
        ]),
        readiness_probe: Some(grpc_probe("readiness")),
        liveness_probe: Some(grpc_probe("liveness")),
        resources: pods::merge_resources(None, &epp_spec),
        security_context: Some(pods::merge_security_context(
            pods::restricted_container(),
            user.security_context.as_ref(),
        )),
        ..Container::default()
    };
    let extra = epp_spec.extra_pod_spec.clone().unwrap_or_default();
    let mut pod_spec = PodSpec {
        containers: vec![container],
        ..pods::base_pod_spec(&extra)
    };
    if credential::wanted(g) {
        credential::hand_to(&mut pod_spec.containers[0]);
        pod_spec
            .volumes
            .get_or_insert_with(Vec::new)
            .push(credential::volume(g));
    }
    if pod_spec.service_account_name.is_none() {
        let (account, role, binding) = epp_access::build(g);
        pod_spec.service_account_name = account.metadata.name.clone();
        desired.service_accounts.push(account);
        desired.roles.push(role);
        desired.role_bindings.push(binding);
    }
    let mut meta_labels = g.labels();
    meta_labels.extend(epp_selector(g));
    deployment(
        g,
        observed,
        names::epp(g.name),
        meta_labels,
        epp_selector(g),
        replicas,
        pod_spec,
    )
}

/// A planner service's Deployment. When the service runs our planner or Dynamo's planner
/// launcher ([`Graph::planners`]), the container runs `dynamo planner` on this graph (in
/// our image in place of Dynamo's), with its metrics and health on the pod's metrics
/// port, after an init container that measures its profile on a mock engine worker's
/// flags when it takes one ([`profile_measurement`]); any other command runs as written.
/// Every planner pod is told its graph and namespace as Dynamo's planner reads them, and
/// runs as its own account with access to this graph's adapters only, unless it names one.
fn planner_deployment(
    g: &Graph,
    observed: &Observed,
    service: &str,
    spec: &ComponentSpec,
    desired: &mut Desired,
) -> (Deployment, bool) {
    let extra = spec.extra_pod_spec.clone().unwrap_or_default();
    let mut pod_spec = pods::base_pod_spec(&extra);
    let mut main = pods::main_container(g, spec, None);
    let mut volumes = pod_spec.volumes.take().unwrap_or_default();
    volumes.extend(pods::service_volumes(g, spec));
    if let Some(planner) = &g.planners[service] {
        // Dynamo's launcher ran in Dynamo's Python image, from one of its directories; an
        // empty command or ours runs in the user's image (a mirror of ours, say) if named.
        let command = spec.main_command();
        let dynamos = command
            .first()
            .is_some_and(|p| p.rsplit('/').next() != Some(DYNAMO_BINARY));
        let user_image = extra
            .main_container
            .as_ref()
            .and_then(|c| c.image.clone())
            .filter(|i| !i.is_empty() && !dynamos);
        main.image = Some(user_image.unwrap_or_else(|| g.config.planner_image.clone()));
        if dynamos {
            main.working_dir = None;
        }
        main.command = Some(vec![DYNAMO_BINARY.into()]);
        main.args = Some(planner.args.clone());
        let mut ports = main.ports.take().unwrap_or_default();
        ports.retain(|p| {
            p.container_port != METRICS_PORT && p.name.as_deref() != Some(METRICS_PORT_NAME)
        });
        ports.push(pods::metrics_port());
        main.ports = Some(ports);
        // Probes written for Dynamo's image (an `exec` of its shell, say) cannot run in
        // ours, which has no shell (distroless, `Dockerfile`).
        let health = Some(pods::http_probe(HEALTH_PATH, METRICS_PORT));
        let users = |probe: &Option<Probe>| probe.clone().filter(|_| !dynamos);
        main.readiness_probe = users(&spec.readiness_probe).or(health.clone());
        main.liveness_probe = users(&spec.liveness_probe).or(health);
        // Our own binary: the full restricted profile (it writes no file).
        let user = extra
            .main_container
            .as_ref()
            .and_then(|c| c.security_context.as_ref());
        main.security_context = Some(pods::merge_security_context(
            pods::restricted_container(),
            user,
        ));
        if let Some(worker) = &planner.profile_from {
            let mut init = profile_measurement(g, worker, &mut volumes, &mut pod_spec);
            // Our own binary too: the planner's restricted profile.
            init.security_context.clone_from(&main.security_context);
            main.volume_mounts
                .get_or_insert_with(Vec::new)
                .push(profile_mount(Some(true)));
            pod_spec
                .init_containers
                .get_or_insert_with(Vec::new)
                .push(init);
        }
    }
    let env = main.env.get_or_insert_with(Vec::new);
    if !env.iter().any(|e| e.name == GRAPH_ENV) {
        env.push(pods::plain_env(GRAPH_ENV, g.name));
    }
    if !env.iter().any(|e| e.name == NAMESPACE_ENV) {
        env.push(pods::field_env(NAMESPACE_ENV, "metadata.namespace"));
    }
    pod_spec.containers = vec![main];
    pod_spec.volumes = (!volumes.is_empty()).then_some(volumes);
    if pod_spec.service_account_name.is_none() {
        let (account, role, binding) = planner_access::build(g, service);
        pod_spec.service_account_name = account.metadata.name.clone();
        desired.service_accounts.push(account);
        desired.roles.push(role);
        desired.role_bindings.push(binding);
    }
    let selector = BTreeMap::from([
        (labels::GRAPH.to_string(), g.name.to_string()),
        (labels::COMPONENT.to_string(), service.to_string()),
    ]);
    deployment(
        g,
        observed,
        names::planner(g.name, service),
        g.service_labels(service, spec),
        selector,
        spec.replicas.unwrap_or(1),
        pod_spec,
    )
}

/// The emptyDir the profile is written to and read from.
const PROFILE_VOLUME: &str = "dynamo-planner-profile";

fn profile_mount(read_only: Option<bool>) -> VolumeMount {
    let dir = Path::new(PLANNER_PROFILE)
        .parent()
        .expect("a file in a directory");
    VolumeMount {
        name: PROFILE_VOLUME.into(),
        mount_path: dir.to_string_lossy().into_owned(),
        read_only,
        ..VolumeMount::default()
    }
}

/// The init container that measures a planner's profile before it starts: the `worker`
/// service's mock engine in that service's image, with its environment and flags, told to
/// write the profile of the engine they configure to [`PLANNER_PROFILE`] and exit (well
/// under a second of CPU: small requests). It reads what the worker reads (a model
/// directory's config.json, a timing table) from the worker's own volumes, which join the
/// pod's `volumes` with the profile's emptyDir; the worker's image pull secrets join
/// `pod`'s.
fn profile_measurement(
    g: &Graph,
    worker: &str,
    volumes: &mut Vec<Volume>,
    pod: &mut PodSpec,
) -> Container {
    let spec = &g.spec.services[worker];
    let engine = g.engine(worker);
    let worker_main = pods::main_container(g, spec, Some(engine));
    let argv = engine
        .profile_argv(&Addresses::POD, PLANNER_PROFILE)
        .expect("the profile engine runs the mock engine");
    volumes.push(Volume {
        name: PROFILE_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    });
    let mut mounts = vec![profile_mount(None)];
    for (mount, volume) in pods::file_mounts(g, spec, &worker_main) {
        match volumes.iter().find(|v| v.name == volume.name) {
            None => volumes.push(volume),
            Some(same) if *same == volume => {}
            // The planner's own volume of that name is another one: not the worker's files.
            Some(_) => continue,
        }
        mounts.push(mount);
    }
    let secrets = spec
        .extra_pod_spec
        .iter()
        .flat_map(|e| e.image_pull_secrets.iter().flatten());
    for secret in secrets {
        let pulls = pod.image_pull_secrets.get_or_insert_with(Vec::new);
        if !pulls.contains(secret) {
            pulls.push(secret.clone());
        }
    }
    let requests = [("cpu", PROFILE_CPU), ("memory", PROFILE_MEMORY)]
        .map(|(name, q)| (name.to_string(), Quantity(q.into())));
    Container {
        name: PROFILE_CONTAINER.into(),
        image: worker_main.image,
        command: Some(argv),
        env: worker_main.env,
        env_from: worker_main.env_from,
        volume_mounts: Some(mounts),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from(requests)),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }
}

/// The profile measurement's container and requests.
const PROFILE_CONTAINER: &str = "planner-profile";
const PROFILE_CPU: &str = "100m";
const PROFILE_MEMORY: &str = "64Mi";

/// A Deployment with `labels` on it and its pods, labelled with the hash of its spec so a
/// later pass can tell whether the observed one runs this exact spec.
fn deployment(
    g: &Graph,
    observed: &Observed,
    name: String,
    meta_labels: BTreeMap<String, String>,
    selector: BTreeMap<String, String>,
    replicas: i32,
    pod_spec: PodSpec,
) -> (Deployment, bool) {
    let mut deployment = Deployment {
        metadata: g.metadata(name.clone(), meta_labels.clone()),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(meta_labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    };
    let hash = labels::spec_hash(&deployment.spec);
    deployment
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::SPEC_HASH.into(), hash.clone());
    let ready = observed
        .deployments
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some(name.as_str()))
        .is_some_and(|d| {
            let current = d
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::SPEC_HASH))
                == Some(&hash);
            let status = d.status.clone().unwrap_or_default();
            current
                && status.observed_generation.is_some()
                && status.observed_generation >= d.metadata.generation
                && status.updated_replicas.unwrap_or(0) == replicas
                && status.ready_replicas.unwrap_or(0) >= replicas
                && status.replicas.unwrap_or(0) == replicas
        });
    (deployment, ready)
}

fn deployment_status(
    observed: &Observed,
    desired: &Deployment,
    ready: bool,
) -> (ServiceReplicaStatus, bool) {
    let found = observed
        .deployments
        .iter()
        .find(|d| d.metadata.name == desired.metadata.name);
    let status = found.and_then(|d| d.status.clone()).unwrap_or_default();
    let current = found.and_then(|d| d.metadata.labels.as_ref()?.get(labels::SPEC_HASH))
        == desired
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::SPEC_HASH));
    (
        ServiceReplicaStatus {
            replicas: status.replicas.unwrap_or(0),
            updated_replicas: if current {
                status.updated_replicas.unwrap_or(0)
            } else {
                0
            },
            ready_replicas: status.ready_replicas.unwrap_or(0),
        },
        ready,
    )
}

fn epp_service(g: &Graph) -> Service {
    let port = |name: &str, number: i32, app_protocol: Option<&str>| ServicePort {
        name: Some(name.into()),
        port: number,
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        app_protocol: app_protocol.map(Into::into),
        ..ServicePort::default()
    };
    let mut meta_labels = g.labels();
    meta_labels.extend(epp_selector(g));
    Service {
        metadata: g.metadata(names::epp(g.name), meta_labels),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(epp_selector(g)),
            ports: Some(vec![
                // ext_proc is gRPC over cleartext HTTP/2.
                port("grpc", EPP_GRPC_PORT, Some("kubernetes.io/h2c")),
                port("http", HTTP_PORT, None),
                port(METRICS_PORT_NAME, METRICS_PORT, None),
            ]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

fn inference_pool(g: &Graph) -> InferencePool {
    let mut pool = InferencePool::new(
        &names::inference_pool(g.name),
        InferencePoolSpec {
            selector: PoolLabelSelector {
                match_labels: BTreeMap::from([(
                    labels::INFERENCE_POOL.to_string(),
                    g.name.to_string(),
                )]),
            },
            target_ports: vec![PoolPort { number: HTTP_PORT }],
            endpoint_picker_ref: EndpointPickerRef {
                group: None,
                kind: Some("Service".into()),
                name: names::epp(g.name),
                port: Some(PoolPort {
                    number: EPP_GRPC_PORT,
                }),
                failure_mode: Some(EndpointPickerFailureMode::FailClose),
            },
        },
    );
    pool.metadata = g.metadata(names::inference_pool(g.name), g.labels());
    pool
}

/// Route from the Gateway named by the graph's `nvidia.com/dynamo-gateway` annotation.
fn http_route(g: &Graph) -> Option<HttpRoute> {
    let gateway = g.annotations.get(labels::GATEWAY_ANNOTATION)?.trim();
    let (namespace, name) = match gateway.split_once('/') {
        Some((ns, name)) => (Some(ns.to_string()), name.to_string()),
        None => (None, gateway.to_string()),
    };
    if name.is_empty() {
        return None;
    }
    let mut route = HttpRoute::new(
        &names::http_route(g.name),
        HttpRouteSpec {
            parent_refs: Some(vec![HttpRouteParentRefs {
                group: Some("gateway.networking.k8s.io".into()),
                kind: Some("Gateway".into()),
                name,
                namespace,
                ..HttpRouteParentRefs::default()
            }]),
            rules: Some(vec![HttpRouteRules {
                matches: Some(vec![HttpRouteRulesMatches {
                    path: Some(HttpRouteRulesMatchesPath {
                        r#type: Some(HttpRouteRulesMatchesPathType::PathPrefix),
                        value: Some("/".into()),
                    }),
                    ..HttpRouteRulesMatches::default()
                }]),
                backend_refs: Some(vec![HttpRouteRulesBackendRefs {
                    group: Some("inference.networking.k8s.io".into()),
                    kind: Some("InferencePool".into()),
                    name: names::inference_pool(g.name),
                    ..HttpRouteRulesBackendRefs::default()
                }]),
                ..HttpRouteRules::default()
            }]),
            ..HttpRouteSpec::default()
        },
    );
    route.metadata = g.metadata(names::http_route(g.name), g.labels());
    Some(route)
}

#[cfg(test)]
mod tests {
    use clap::{Parser, Subcommand};
    use dynamo_crds::DynamoGraphDeployment;
    use k8s_openapi::api::core::v1::EnvVar;
    use serde_json::{Value, json};

    use super::super::{OperatorConfig, ReconcileError, reconcile};
    use super::*;
    use dynamo_wiring::WiringError;
    use dynamo_wiring::planner::PlannerWiringError;
    use dynamo_wiring::planner::{ModeArg, PlannerArgs};

    /// The `dynamo` binary's command line, as its own parser reads it.
    #[derive(Parser)]
    struct Dynamo {
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(Subcommand)]
    enum Sub {
        Planner(PlannerArgs),
    }

    fn dgd(services: Value) -> DynamoGraphDeployment {
        serde_json::from_value(json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
            "spec": {"backendFramework": "mocker", "services": services},
        }))
        .unwrap()
    }

    fn desired(services: Value) -> Result<Desired, ReconcileError> {
        reconcile(
            &dgd(services),
            &Observed::default(),
            &OperatorConfig::default(),
        )
    }

    fn mocker(component_type: &str) -> Value {
        json!({"componentType": component_type, "extraPodSpec": {"mainContainer": {
            "command": ["dynamo-mocker"], "args": ["--model-name", "m"]}}})
    }

    /// Dynamo's planner as its disaggregated manifests run it.
    fn dynamos_planner(args: &str) -> Value {
        json!({"componentType": "planner", "envs": [
                {"name": "PROMETHEUS_ENDPOINT", "value": "http://prom.monitoring:9090"}],
            "livenessProbe": {"exec": {"command": ["/bin/sh", "-c", "exit 0"]}},
            "extraPodSpec": {"mainContainer": {
                "image": "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0",
                "workingDir": "/workspace/components/src/dynamo/planner/utils",
                "command": ["/bin/sh", "-c"],
                "args": [format!("python3 -m planner_sla {args}")]}}})
    }

    fn disagg_with(planner: Value) -> Value {
        json!({"prefill": mocker("prefill"), "decode": mocker("decode"), "planner": planner})
    }

    fn planner_pod(d: &Desired) -> &PodSpec {
        d.deployments
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some("g-planner"))
            .and_then(|d| d.spec.as_ref()?.template.spec.as_ref())
            .expect("the planner's Deployment")
    }

    fn env<'a>(c: &'a Container, name: &str) -> Option<&'a EnvVar> {
        c.env.iter().flatten().find(|e| e.name == name)
    }

    fn planner_argv(pod: &PodSpec) -> PlannerArgs {
        let main = &pod.containers[0];
        let argv = [main.command.clone().unwrap(), main.args.clone().unwrap()].concat();
        let Sub::Planner(args) = Dynamo::try_parse_from(&argv).unwrap().command;
        args
    }

    #[test]
    fn dynamos_planner_becomes_ours_on_the_graph_with_its_flags() {
        let mut services = disagg_with(dynamos_planner(
            "--environment=kubernetes --backend=vllm --adjustment-interval=60 \
             --profile-results-dir=/data/profiling_results --ttft 200 --no-operation",
        ));
        // Tells the decode engine's command from the prefill engine's.
        services["decode"]["extraPodSpec"]["mainContainer"]["args"] =
            json!(["--model-name", "m", "--seed", "42"]);
        let d = desired(services).unwrap();
        let pod = planner_pod(&d);
        let main = &pod.containers[0];
        assert_eq!(main.image.as_deref(), Some(super::super::DEFAULT_IMAGE));
        assert_eq!(main.working_dir, None);

        let argv: Vec<String> = main
            .command
            .iter()
            .flatten()
            .chain(main.args.iter().flatten())
            .cloned()
            .collect();
        assert_eq!(argv[0], DYNAMO_BINARY);
        let Sub::Planner(args) = Dynamo::try_parse_from(&argv).unwrap().command;
        assert_eq!(args.graph.as_deref(), Some("g"));
        assert_eq!(args.admin_url, None);
        assert_eq!(args.prometheus, "http://prom.monitoring:9090");
        assert_eq!(args.metrics_addr.port(), METRICS_PORT as u16);
        // On mock engine workers it plans throughput on the decode engine's profile.
        assert_eq!(args.mode, ModeArg::Throughput);
        assert_eq!(args.profile.as_deref(), Some(Path::new(PLANNER_PROFILE)));
        let init = &pod.init_containers.as_deref().unwrap()[0];
        let measured = init.command.as_deref().unwrap().join(" ");
        assert!(measured.contains("--seed 42"), "{measured}");
        // The workers name no image: the operator's mocker image, as theirs.
        assert_eq!(init.image.as_deref(), Some(super::super::DEFAULT_IMAGE));
        assert_eq!(args.interval, Some(std::time::Duration::from_secs(60)));
        assert_eq!(args.ttft_ms, 200.0);
        assert!(args.advisory);

        // Scraped and probed on the metrics port; Dynamo's shell probe is not ours.
        let ports = main.ports.as_deref().unwrap();
        assert!(ports.contains(&pods::metrics_port()), "{ports:?}");
        for probe in [&main.readiness_probe, &main.liveness_probe] {
            let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap();
            assert_eq!(get.path.as_deref(), Some(HEALTH_PATH));
            assert_eq!(get.port, IntOrString::Int(METRICS_PORT));
        }
        assert_eq!(
            env(main, GRAPH_ENV).and_then(|e| e.value.as_deref()),
            Some("g")
        );
        let namespace = env(main, NAMESPACE_ENV).and_then(|e| e.value_from.as_ref());
        assert_eq!(
            namespace
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str()),
            Some("metadata.namespace")
        );
        assert_eq!(
            main.security_context,
            Some(pods::restricted_container()),
            "our own binary"
        );
        assert_eq!(pod.service_account_name.as_deref(), Some("g-planner"));
    }

    #[test]
    fn our_planner_keeps_its_flags_image_and_probes_and_another_command_runs_as_written() {
        let ours = json!({"componentType": "planner",
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": 9090}, "periodSeconds": 3},
            "extraPodSpec": {"mainContainer": {"image": "mirror.local/dynamo:1",
                "command": ["dynamo", "planner"], "args": ["--mode", "load", "--max-gpu-budget", "4"]}}});
        let d = desired(disagg_with(ours)).unwrap();
        let main = &planner_pod(&d).containers[0];
        assert_eq!(main.image.as_deref(), Some("mirror.local/dynamo:1"));
        assert_eq!(
            main.readiness_probe.as_ref().unwrap().period_seconds,
            Some(3)
        );
        let argv = [main.command.clone().unwrap(), main.args.clone().unwrap()].concat();
        let Sub::Planner(args) = Dynamo::try_parse_from(&argv).unwrap().command;
        assert_eq!((args.mode, args.max_gpu_budget), (ModeArg::Load, 4));
        assert_eq!(args.graph.as_deref(), Some("g"));

        let custom = json!({"componentType": "planner", "extraPodSpec": {"mainContainer": {
            "image": "me/planner:1", "command": ["python3", "my_planner.py"]}}});
        let d = desired(disagg_with(custom)).unwrap();
        let pod = planner_pod(&d);
        let main = &pod.containers[0];
        assert_eq!(main.image.as_deref(), Some("me/planner:1"));
        assert_eq!(
            main.command.as_deref(),
            Some(&["python3".to_string(), "my_planner.py".to_string()][..])
        );
        assert_eq!(main.args, None);
        // Told its graph as Dynamo's planner reads it, with the same narrow access.
        assert_eq!(
            env(main, GRAPH_ENV).and_then(|e| e.value.as_deref()),
            Some("g")
        );
        assert_eq!(pod.service_account_name.as_deref(), Some("g-planner"));
    }

    #[test]
    fn a_planner_reaches_a_prometheus_behind_tls_and_a_token_as_its_service_says() {
        // docs/planner.md's OpenShift example: our flags, kept.
        let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
        let ours = json!({"componentType": "planner", "extraPodSpec": {"mainContainer": {
            "command": ["dynamo", "planner"],
            "args": ["--mode", "load",
                "--prometheus=https://thanos-querier.openshift-monitoring.svc:9091",
                format!("--prometheus-ca-file={sa}/service-ca.crt"),
                format!("--prometheus-bearer-token-file={sa}/token")]}}});
        let d = desired(disagg_with(ours)).unwrap();
        let args = planner_argv(planner_pod(&d));
        assert_eq!(
            args.prometheus,
            "https://thanos-querier.openshift-monitoring.svc:9091"
        );
        let access = &args.prometheus_access;
        assert_eq!(
            access.ca_file.as_deref(),
            Some(Path::new(&format!("{sa}/service-ca.crt")))
        );
        assert_eq!(
            access.bearer_token_file.as_deref(),
            Some(Path::new(&format!("{sa}/token")))
        );

        // Dynamo's launcher takes no such flag: the service's variables reach the pod.
        let mut dynamos = dynamos_planner("--adjustment-interval=60");
        dynamos["envs"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "DYNAMO_PROMETHEUS_CA_FILE", "value": "/etc/prom/ca.crt"}));
        let d = desired(disagg_with(dynamos)).unwrap();
        let main = &planner_pod(&d).containers[0];
        assert_eq!(
            env(main, "DYNAMO_PROMETHEUS_CA_FILE").and_then(|e| e.value.as_deref()),
            Some("/etc/prom/ca.crt")
        );
    }

    #[test]
    fn the_planners_role_grants_its_graph_and_its_adapters_only() {
        let d = desired(disagg_with(dynamos_planner("--adjustment-interval 60"))).unwrap();
        let role = d
            .roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some("g-planner"))
            .expect("the planner's Role");
        let rules = serde_json::to_value(&role.rules).unwrap();
        let adapters = json!(["g-decode", "g-prefill"]);
        assert_eq!(
            rules,
            json!([
                {"apiGroups": ["nvidia.com"], "resources": ["dynamographdeployments"],
                 "resourceNames": ["g"], "verbs": ["get"]},
                {"apiGroups": ["nvidia.com"], "resources": ["dynamographdeploymentscalingadapters"],
                 "resourceNames": adapters, "verbs": ["get"]},
                {"apiGroups": ["nvidia.com"],
                 "resources": ["dynamographdeploymentscalingadapters/scale"],
                 "resourceNames": adapters, "verbs": ["get", "patch", "update"]},
            ])
        );
        let binding = d
            .role_bindings
            .iter()
            .find(|b| b.metadata.name.as_deref() == Some("g-planner"))
            .expect("the planner's RoleBinding");
        assert_eq!(binding.role_ref.name, "g-planner");
        let subject = &binding.subjects.as_ref().unwrap()[0];
        assert_eq!(
            (subject.kind.as_str(), subject.name.as_str()),
            ("ServiceAccount", "g-planner")
        );
        assert_eq!(subject.namespace.as_deref(), Some("ns"));
        assert!(
            d.service_accounts
                .iter()
                .any(|a| a.metadata.name.as_deref() == Some("g-planner"))
        );

        // A graph without engines gives its planner no adapter rule: a rule without names
        // would cover every adapter of the namespace.
        let load = json!({"componentType": "planner", "extraPodSpec": {"mainContainer": {
            "command": ["dynamo", "planner", "--mode", "load"]}}});
        let d = desired(json!({"planner": load})).unwrap();
        let rules = d.roles[0].rules.as_deref().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["g".to_string()][..])
        );

        // A planner with its own account brings its own access.
        let mut own = dynamos_planner("");
        own["extraPodSpec"]["serviceAccountName"] = json!("mine");
        let d = desired(disagg_with(own)).unwrap();
        assert_eq!(
            planner_pod(&d).service_account_name.as_deref(),
            Some("mine")
        );
        assert!(
            !d.roles
                .iter()
                .any(|r| r.metadata.name.as_deref() == Some("g-planner"))
        );
    }

    fn adapters(d: &Desired) -> Vec<&str> {
        d.scaling_adapters
            .iter()
            .map(|a| a.metadata.name.as_deref().unwrap())
            .collect()
    }

    #[test]
    fn a_planner_gives_every_engine_service_an_adapter() {
        let d = desired(disagg_with(dynamos_planner(""))).unwrap();
        assert_eq!(adapters(&d), ["g-decode", "g-prefill"]);
        let agg = json!({"worker": mocker("worker"), "planner": {"componentType": "planner"}});
        assert_eq!(adapters(&desired(agg).unwrap()), ["g-worker"]);

        // Without a planner only the services that ask for one.
        let mut services = json!({"prefill": mocker("prefill"), "decode": mocker("decode")});
        assert!(adapters(&desired(services.clone()).unwrap()).is_empty());
        services["decode"]["scalingAdapter"] = json!({"enabled": true});
        assert_eq!(adapters(&desired(services).unwrap()), ["g-decode"]);
    }

    #[test]
    fn every_pod_of_ours_is_scraped_on_its_metrics_port() {
        let mut services = disagg_with(dynamos_planner(""));
        services["epp"] = json!({"componentType": "epp"});
        let d = desired(services).unwrap();
        let templates = d.deployments.iter().filter_map(|d| {
            d.spec
                .as_ref()?
                .template
                .metadata
                .clone()
                .zip(d.spec.as_ref()?.template.spec.clone())
        });
        let pods = d
            .pods
            .iter()
            .map(|p| (p.metadata.clone(), p.spec.clone().unwrap()));
        let mut seen = Vec::new();
        for (meta, spec) in templates.chain(pods) {
            let labels = meta.labels.unwrap_or_default();
            assert_eq!(labels.get(labels::GRAPH).map(String::as_str), Some("g"));
            // Prometheus' pod discovery lists init containers' ports too; of those, only a
            // native sidecar's (`restartPolicy: Always`) outlives the pod's start.
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            let scraped = spec.containers.iter().chain(sidecars).find(|c| {
                c.ports
                    .iter()
                    .flatten()
                    .any(|p| p.name.as_deref() == Some(METRICS_PORT_NAME))
            });
            let scraped = scraped.unwrap_or_else(|| panic!("{labels:?}: no metrics port"));
            seen.push(scraped.name.clone());
        }
        seen.sort();
        // The EPP, the planner, and one sidecar per prefill and decode replica.
        assert_eq!(seen, ["epp", "main", "sidecar", "sidecar"]);
    }

    #[test]
    fn a_malformed_planner_flag_refuses_the_graph_naming_the_flag() {
        let e = desired(disagg_with(dynamos_planner("--ttft abc"))).unwrap_err();
        assert_eq!(
            e,
            ReconcileError::Wiring(WiringError::Planner(PlannerWiringError::BadValue {
                service: "planner".into(),
                flag: "--ttft".into(),
                value: "abc".into(),
                problem: "not a positive number of milliseconds".into(),
            }))
        );
        assert_eq!(
            e.to_string(),
            "spec.services.planner: --ttft \"abc\": not a positive number of milliseconds"
        );
    }

    #[test]
    fn a_throughput_planner_on_mock_engines_measures_their_profile_before_it_starts() {
        let mut worker = mocker("worker");
        worker["extraPodSpec"]["mainContainer"]["image"] = json!("mirror.local/dynamo:2");
        worker["extraPodSpec"]["imagePullSecrets"] = json!([{"name": "mirror"}]);
        worker["extraPodSpec"]["mainContainer"]["args"] =
            json!(["--model-name", "worker", "--timing-table", "/tables/t.json"]);
        worker["extraPodSpec"]["mainContainer"]["volumeMounts"] =
            json!([{"name": "tables", "mountPath": "/tables"}]);
        worker["extraPodSpec"]["volumes"] = json!([{"name": "tables", "configMap": {"name": "t"}}]);
        worker["volumeMounts"] = json!([{"name": "models", "mountPoint": "/models"}]);
        // The planner mounts the same claim: one volume for both.
        let planner = json!({"componentType": "planner",
            "volumeMounts": [{"name": "models", "mountPoint": "/m"}],
            "extraPodSpec": {"mainContainer": {"securityContext": {"runAsGroup": 2000}}}});
        let d = desired(json!({"worker": worker, "planner": planner})).unwrap();
        let pod = planner_pod(&d);
        let main = &pod.containers[0];
        let inits = pod.init_containers.as_deref().unwrap();
        assert_eq!(inits.len(), 1);
        let init = &inits[0];

        // The worker's own mock engine, in its image, told to write where `--profile` reads.
        let worker_pod = d
            .pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some("g-worker-0"))
            .and_then(|p| p.spec.as_ref())
            .unwrap();
        let engine = &worker_pod.containers[0];
        assert_eq!(init.image.as_deref(), Some("mirror.local/dynamo:2"));
        assert_eq!(init.image, engine.image);
        let argv = init.command.as_deref().unwrap();
        let (flags, out) = argv.split_at(argv.len() - 2);
        assert_eq!(flags, engine.command.as_deref().unwrap());
        assert_eq!(out, ["--planner-profile-out", PLANNER_PROFILE]);
        assert_eq!(init.args, None);
        // The engine's environment, less the block API credential, which the measurement
        // (serving nothing) neither needs nor gets.
        let credential = dynamo_wiring::credential::CREDENTIAL_FILE_ENV;
        let mut engine_env = engine.env.clone().unwrap();
        assert!(engine_env.iter().any(|e| e.name == credential));
        engine_env.retain(|e| e.name != credential);
        assert_eq!(init.env.as_ref(), Some(&engine_env));
        assert_eq!(
            planner_argv(pod).profile.as_deref(),
            Some(Path::new(PLANNER_PROFILE))
        );
        assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "mirror");

        // Written to an emptyDir the planner reads; the worker's files, read-only.
        let mount = |c: &Container, volume: &str| {
            c.volume_mounts
                .iter()
                .flatten()
                .find(|m| m.name == volume)
                .map(|m| (m.mount_path.clone(), m.read_only))
        };
        let dir = "/var/run/dynamo/planner".to_string();
        assert_eq!(mount(init, PROFILE_VOLUME), Some((dir.clone(), None)));
        assert_eq!(mount(main, PROFILE_VOLUME), Some((dir, Some(true))));
        assert_eq!(mount(init, "tables"), Some(("/tables".into(), Some(true))));
        assert_eq!(mount(init, "models"), Some(("/models".into(), Some(true))));
        assert_eq!(mount(main, "tables"), None);
        let volumes: Vec<_> = pod.volumes.iter().flatten().collect();
        let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["shm", "models", PROFILE_VOLUME, "tables"]);
        let volume = |name: &str| volumes.iter().find(|v| v.name == name).unwrap();
        assert!(volume(PROFILE_VOLUME).empty_dir.is_some());
        assert!(volume("tables").config_map.is_some());
        assert_eq!(
            volume("models")
                .persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str()),
            Some("models")
        );

        // The planner's restricted context (its user's fields merged), small requests.
        assert_eq!(init.security_context, main.security_context);
        let context = init.security_context.as_ref().unwrap();
        assert_eq!(context.run_as_group, Some(2000));
        assert_eq!(context.read_only_root_filesystem, Some(true));
        let requests = init.resources.as_ref().and_then(|r| r.requests.as_ref());
        assert_eq!(
            requests.unwrap().get("cpu"),
            Some(&Quantity(PROFILE_CPU.into()))
        );
    }

    #[test]
    fn a_planner_with_its_own_profile_or_on_load_measures_nothing() {
        let cases = [
            (json!(["--mode", "load"]), None),
            (
                json!(["--profile", "/p/profile.json"]),
                Some("/p/profile.json"),
            ),
        ];
        for (args, profile) in cases {
            let planner = json!({"componentType": "planner", "extraPodSpec": {
                "mainContainer": {"command": ["dynamo", "planner"], "args": args}}});
            let d = desired(disagg_with(planner)).unwrap();
            let pod = planner_pod(&d);
            assert_eq!(pod.init_containers, None, "{args}");
            assert!(
                !pod.volumes
                    .iter()
                    .flatten()
                    .any(|v| v.name == PROFILE_VOLUME),
                "{args}"
            );
            assert_eq!(
                planner_argv(pod).profile.as_deref(),
                profile.map(Path::new),
                "{args}"
            );
        }
    }

    #[test]
    fn a_throughput_planner_with_no_profile_to_measure_refuses_the_graph() {
        let vllm = |component_type: &str| {
            json!({"componentType": component_type, "extraPodSpec": {"mainContainer": {
                "command": ["vllm", "serve", "Qwen/Qwen3-0.6B"]}}})
        };
        let graph = |planner: Value| {
            let mut dgd = dgd(json!({"worker": vllm("worker"), "planner": planner}));
            dgd.spec.backend_framework = Some(dynamo_crds::BackendFramework::Vllm);
            reconcile(&dgd, &Observed::default(), &OperatorConfig::default())
        };
        let e = graph(json!({"componentType": "planner"})).unwrap_err();
        assert_eq!(
            e,
            ReconcileError::Wiring(WiringError::Planner(PlannerWiringError::NoProfile {
                service: "planner".into()
            }))
        );
        let message = e.to_string();
        for says in [
            "spec.services.planner",
            "--profile FILE",
            "DGDR",
            "--mode load",
        ] {
            assert!(message.contains(says), "{message}");
        }

        // Dynamo's planner plans on load there, as Dynamo's does without its profiling.
        let d = graph(dynamos_planner("--adjustment-interval 60")).unwrap();
        let pod = planner_pod(&d);
        assert_eq!(pod.init_containers, None);
        assert_eq!(planner_argv(pod).mode, ModeArg::Load);
    }
}
