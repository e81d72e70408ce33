//! Services of engine pods: one ClusterIP Service per engine service (port 8000 to the
//! sidecar), and one headless Service per gang that gives its leader a stable DNS name.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::graph::Graph;
use super::pods::HTTP_PORT;
use super::{Desired, labels, names};

pub(crate) fn build(g: &Graph, desired: &mut Desired) {
    for (service, spec, _) in g.engine_services() {
        let selector = BTreeMap::from([
            (labels::GRAPH.to_string(), g.name.to_string()),
            (labels::COMPONENT.to_string(), service.clone()),
            (labels::INFERENCE_POOL.to_string(), g.name.to_string()),
        ]);
        desired.services.push(http_service(
            g,
            names::service(g.name, service),
            g.service_labels(service, spec),
            selector,
        ));
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
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: HTTP_PORT,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}
