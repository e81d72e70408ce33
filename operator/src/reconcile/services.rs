//! Services of engine pods: one ClusterIP Service per engine service (port 8000 to the
//! sidecar), one headless Service per gang that gives its leader a stable DNS name, and
//! one headless Service per prefill service whose name resolves to its ready pods: the
//! prefill peers decode sidecars accept (`DESIGN.md`, "Disaggregated request").

use std::collections::BTreeMap;

use dynamo_names::Role;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::graph::Graph;
use super::pods::HTTP_PORT;
use super::{Desired, labels, names};
use dynamo_wiring::{Addresses, PrefillPeers};

pub(crate) fn build(g: &Graph, desired: &mut Desired) {
    for (service, spec, role) in g.engine_services() {
        desired.services.push(http_service(
            g,
            names::service(g.name, service),
            g.service_labels(service, spec),
            serving_selector(g, service),
        ));
        if role == Role::Prefill {
            desired.services.push(Service {
                metadata: g.metadata(
                    names::prefill_peers(g.name, service),
                    g.service_labels(service, spec),
                ),
                spec: Some(ServiceSpec {
                    cluster_ip: Some("None".into()),
                    // Only ready pods resolve: a decode sends no prefill to one that
                    // is starting or going away.
                    publish_not_ready_addresses: Some(false),
                    selector: Some(serving_selector(g, service)),
                    ports: Some(vec![http_port()]),
                    ..ServiceSpec::default()
                }),
                status: None,
            });
        }
        if spec.multinode.is_none() {
            continue;
        }
        for replica in 0..spec.replicas.unwrap_or(1).max(0) as u32 {
            let gang = names::gang(g.name, service, replica);
            let mut meta_labels = g.service_labels(service, spec);
            meta_labels.insert(labels::GANG.into(), gang.clone());
            desired.services.push(Service {
                metadata: g.metadata(gang.clone(), meta_labels),
                spec: Some(ServiceSpec {
                    cluster_ip: Some("None".into()),
                    // Workers resolve the leader while it starts, before it is ready.
                    publish_not_ready_addresses: Some(true),
                    selector: Some(BTreeMap::from([(labels::GANG.into(), gang)])),
                    ..ServiceSpec::default()
                }),
                status: None,
            });
        }
    }
}

/// Where decode sidecars find the graph's prefill pods: each prefill service's peers
/// Service, at the sidecar's inference port.
pub(crate) fn prefill_peers(g: &Graph) -> Vec<PrefillPeers> {
    g.engine_services()
        .filter(|(_, _, role)| *role == Role::Prefill)
        .map(|(service, _, _)| PrefillPeers::Dns {
            name: format!(
                "{}.{}.svc.{}",
                names::prefill_peers(g.name, service),
                g.namespace,
                g.config.cluster_domain
            ),
            port: Addresses::POD.sidecar_http,
        })
        .collect()
}

/// The pods of `service` that serve inference (single pods, gang leaders).
fn serving_selector(g: &Graph, service: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::GRAPH.to_string(), g.name.to_string()),
        (labels::COMPONENT.to_string(), service.to_string()),
        (labels::INFERENCE_POOL.to_string(), g.name.to_string()),
    ])
}

/// Port 8000 (`http`) to the pods' `http` port.
fn http_port() -> ServicePort {
    ServicePort {
        name: Some("http".into()),
        port: HTTP_PORT,
        target_port: Some(IntOrString::String("http".into())),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }
}

/// ClusterIP Service with port 8000 (`http`) to the pods' `http` port.
pub(crate) fn http_service(
    g: &Graph,
    name: String,
    meta_labels: BTreeMap<String, String>,
    selector: BTreeMap<String, String>,
) -> Service {
    Service {
        metadata: g.metadata(name, meta_labels),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector),
            ports: Some(vec![http_port()]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}
