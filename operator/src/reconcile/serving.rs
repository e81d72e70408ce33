//! The serving path of a graph with engines: the endpoint picker (EPP) Deployment and
//! Service, Services for frontend components, the InferencePool, the optional HTTPRoute,
//! and planner Deployments.
//!
//! A `frontend` service is not a pod of its own: the EPP serves the OpenAI HTTP API on
//! port 8000 next to its ext_proc port, so a frontend service becomes a Service with the
//! frontend's name in front of the EPP pods (no second hop, no duplicate router).

use std::collections::BTreeMap;

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
    Container, ContainerPort, GRPCAction, PodSpec, PodTemplateSpec, Probe, Service, ServicePort,
    ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::epp_access;
use dynamo_crds::{EngineRole, ServiceRole};

use super::graph::Graph;
use super::pods::{self, HTTP_PORT, METRICS_PORT};
use super::services::http_service;
use super::{Desired, Observed, labels, names};
use crate::wiring::{self, Addresses, EPP_BINARY, Picker, PickerPods};

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
            let (deployment, ready) = planner_deployment(g, observed, service, spec);
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
    let role_selectors = [EngineRole::Prefill, EngineRole::Decode]
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
        router_mode: wiring::router_mode(g.spec)
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
            port("metrics", METRICS_PORT),
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

fn planner_deployment(
    g: &Graph,
    observed: &Observed,
    service: &str,
    spec: &ComponentSpec,
) -> (Deployment, bool) {
    let extra = spec.extra_pod_spec.clone().unwrap_or_default();
    let mut pod_spec = pods::base_pod_spec(&extra);
    pod_spec.containers = vec![pods::main_container(g, spec, None)];
    let mut volumes = pod_spec.volumes.take().unwrap_or_default();
    volumes.extend(pods::service_volumes(g, spec));
    pod_spec.volumes = (!volumes.is_empty()).then_some(volumes);
    let selector = BTreeMap::from([
        (labels::GRAPH.to_string(), g.name.to_string()),
        (labels::COMPONENT.to_string(), service.to_string()),
    ]);
    deployment(
        g,
        observed,
        names::service(g.name, service),
        g.service_labels(service, spec),
        selector,
        spec.replicas.unwrap_or(1),
        pod_spec,
    )
}

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
                port("metrics", METRICS_PORT, None),
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
