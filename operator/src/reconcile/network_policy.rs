//! The graph's NetworkPolicy: on its engine pods, the sidecars' gRPC port (the KV block
//! API and the KV event stream) admits only pods of the same graph (the other sidecars,
//! the picker). Every other port and protocol stays open to all, as without the policy:
//! the proxy port serves the gateway, the metrics port probes and Prometheus, and a gang's
//! ranks talk on ports of their engine's choosing. The credential is the check that holds
//! on any network; the policy keeps strangers from reaching the port at all where the
//! cluster's network plugin enforces policies.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::graph::Graph;
use super::pods::SIDECAR_GRPC_PORT;
use super::{Desired, credential, labels, names};

const LAST_PORT: i32 = 65535;

pub(crate) fn build(g: &Graph, desired: &mut Desired) {
    if !credential::wanted(g) {
        return;
    }
    let graph = || {
        [(labels::GRAPH.to_string(), g.name.to_string())]
            .into_iter()
            .collect()
    };
    let engine_pods = LabelSelector {
        match_labels: Some(graph()),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: labels::ROLE.into(),
            operator: "Exists".into(),
            values: None,
        }]),
    };
    let ports = |protocol: &str, from: i32, to: i32| NetworkPolicyPort {
        protocol: Some(protocol.into()),
        port: Some(IntOrString::Int(from)),
        end_port: Some(to),
    };
    let same_graph = NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            pod_selector: Some(LabelSelector {
                match_labels: Some(graph()),
                match_expressions: None,
            }),
            ..NetworkPolicyPeer::default()
        }]),
        ports: None,
    };
    let all_but_the_grpc_port = NetworkPolicyIngressRule {
        from: None,
        ports: Some(vec![
            ports("TCP", 1, SIDECAR_GRPC_PORT - 1),
            ports("TCP", SIDECAR_GRPC_PORT + 1, LAST_PORT),
            ports("UDP", 1, LAST_PORT),
            ports("SCTP", 1, LAST_PORT),
        ]),
    };
    desired.network_policies.push(NetworkPolicy {
        metadata: g.metadata(names::block_api(g.name), g.labels()),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(engine_pods),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![same_graph, all_but_the_grpc_port]),
            egress: None,
        }),
    });
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use dynamo_crds::DynamoGraphDeployment;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;
    use crate::reconcile::{Observed, OperatorConfig, reconcile};

    fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
        let exact = (selector.match_labels.iter().flatten()).all(|(k, v)| labels.get(k) == Some(v));
        let exists = (selector.match_expressions.iter().flatten())
            .all(|e| e.operator == "Exists" && labels.contains_key(&e.key));
        exact && exists
    }

    /// Whether `policy` lets a pod labelled `from` reach TCP `port` of the pod labelled
    /// `to` (NetworkPolicy semantics: a selected pod takes what some rule admits; an
    /// unselected pod, everything).
    fn admits(
        policy: &NetworkPolicy,
        from: &BTreeMap<String, String>,
        to: &BTreeMap<String, String>,
        port: i32,
    ) -> bool {
        let spec = policy.spec.as_ref().unwrap();
        if !matches(spec.pod_selector.as_ref().unwrap(), to) {
            return true;
        }
        spec.ingress.iter().flatten().any(|rule| {
            let peer = rule.from.as_ref().is_none_or(|peers| {
                peers
                    .iter()
                    .any(|p| matches(p.pod_selector.as_ref().unwrap(), from))
            });
            let on_port = rule.ports.as_ref().is_none_or(|ports| {
                ports.iter().any(|p| {
                    let Some(IntOrString::Int(first)) = p.port else {
                        return false;
                    };
                    p.protocol.as_deref() == Some("TCP")
                        && (first..=p.end_port.unwrap_or(first)).contains(&port)
                })
            });
            peer && on_port
        })
    }

    #[test]
    fn only_the_graphs_pods_reach_the_grpc_port_and_every_other_port_stays_open() {
        let dgd: DynamoGraphDeployment = serde_json::from_value(json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeployment",
            "metadata": {"name": "g", "namespace": "ns", "uid": "u"},
            "spec": {"backendFramework": "mocker", "services": {
                "prefill": {"componentType": "worker", "subComponentType": "prefill"},
                "decode": {"componentType": "worker", "subComponentType": "decode"}}},
        }))
        .unwrap();
        let desired = reconcile(&dgd, &Observed::default(), &OperatorConfig::default()).unwrap();
        let [policy] = &desired.network_policies[..] else {
            panic!("{:?}", desired.network_policies)
        };
        let labels = |p: &Pod| p.metadata.labels.clone().unwrap();
        let engines: Vec<_> = desired.pods.iter().map(labels).collect();
        let picker = desired.deployments[0]
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref();
        let picker = picker.unwrap().labels.clone().unwrap();
        let stranger = BTreeMap::from([(labels::GRAPH.to_string(), "other".to_string())]);
        let grpc = SIDECAR_GRPC_PORT;
        for to in &engines {
            for from in engines.iter().chain([&picker]) {
                assert!(admits(policy, from, to, grpc), "{from:?} -> {to:?}");
            }
            assert!(!admits(policy, &stranger, to, grpc));
            for port in [1, 8000, grpc - 1, grpc + 1, 9090, 65535] {
                assert!(admits(policy, &stranger, to, port), "{port}");
            }
        }
        // The picker's own pod is not the policy's business.
        assert!(admits(policy, &stranger, &picker, grpc));
    }
}
