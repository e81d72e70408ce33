//! A disaggregated graph as it runs, on a cluster and locally: its generated command
//! lines read by the real binaries' own parsers (decode sidecars take their prefill
//! peers, prefill sidecars none; mock engines lease their blocks through their own
//! sidecar), the Service that resolves to the prefill pods, and vLLM's NIXL side
//! channel (`DESIGN.md`, "Disaggregated request").

mod common;

use std::path::Path;

use clap::Parser;
use common::{cluster, observed, run, sample};
use dynamo_local::plan::{Caps, CommandSpec, Graph, ReplicaPorts, RunOptions};
use dynamo_mocker::OffloadMode;
use dynamo_operator::reconcile::labels;
use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::json;

fn sidecar(argv: &[String]) -> dynamo_sidecar::Config {
    dynamo_sidecar::Config::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

fn mocker(argv: &[String]) -> dynamo_mocker::Args {
    dynamo_mocker::Args::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

fn container<'a>(pod: &'a Pod, name: &str) -> &'a Container {
    let spec = pod.spec.as_ref().unwrap();
    spec.containers.iter().find(|c| c.name == name).unwrap()
}

/// The injected sidecar: a native sidecar, among the init containers.
fn injected_sidecar(pod: &Pod) -> &Container {
    let spec = pod.spec.as_ref().unwrap();
    let mut inits = spec.init_containers.iter().flatten();
    inits.find(|c| c.name == "sidecar").unwrap()
}

fn argv(c: &Container) -> Vec<String> {
    let mut argv = c.command.clone().unwrap_or_default();
    argv.extend(c.args.clone().unwrap_or_default());
    argv
}

fn label<'a>(pod: &'a Pod, key: &str) -> &'a str {
    &pod.metadata.labels.as_ref().unwrap()[key]
}

#[test]
fn decode_pods_accept_the_prefill_pods_their_peers_service_resolves_to() {
    let desired = run(&sample("disagg-mocker"), &observed(vec![], cluster()));
    let peers = desired
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("disagg-mocker-prefill-peers"))
        .expect("the prefill peers' Service");
    let spec = serde_json::to_value(peers.spec.as_ref().unwrap()).unwrap();
    assert_eq!(
        (&spec["clusterIP"], &spec["publishNotReadyAddresses"]),
        (&json!("None"), &json!(false)),
        "headless, ready pods only"
    );
    let selector = peers.spec.as_ref().unwrap().selector.as_ref().unwrap();
    let mut roles = Vec::new();
    for pod in &desired.pods {
        let role = label(pod, labels::ROLE);
        roles.push(role);
        let selected = selector.iter().all(|(k, v)| label(pod, k) == v);
        assert_eq!(selected, role == "prefill", "{role} pod");

        let config = sidecar(&argv(injected_sidecar(pod)));
        let expected: &[&str] = match role {
            "decode" => &["dns:disagg-mocker-prefill-peers.inference.svc.cluster.local:8000"],
            _ => &[],
        };
        assert_eq!(config.disagg.prefill_peers, expected, "{role} sidecar");

        let engine = mocker(&argv(container(pod, "main")));
        assert_eq!(
            engine.kv_blocks_url.as_deref(),
            Some("http://127.0.0.1:9100"),
            "{role}: leases go through its own sidecar"
        );
        assert_eq!(engine.kv_offload, OffloadMode::None, "{role}: no tiers");
    }
    roles.sort();
    assert_eq!(roles, ["decode", "decode", "prefill"]);
}

#[test]
fn local_decode_sidecars_read_their_peers_from_the_runners_endpoints_file() {
    let options = RunOptions {
        model_path: Some("/models/qwen-mock".into()),
        backend: None,
        router_mode: None,
        replicas: Default::default(),
        caps: Caps {
            replicas_per_service: 8,
            processes: 64,
        },
    };
    let graph = Graph::from_dgd(&sample("disagg-mocker"), &options).unwrap();
    let ports = ReplicaPorts {
        engine: 41001,
        engine_kv_events: 41002,
        engine_kv_replay: 41003,
        sidecar: 41004,
        sidecar_grpc: 41005,
        sidecar_metrics: 41006,
        kv_side_channel: 41007,
    };
    let endpoints = Path::new("/tmp/dynamo-run-1/endpoints.json");
    let whole = |c: CommandSpec| std::iter::once(c.program).chain(c.args).collect::<Vec<_>>();
    for (service, peers) in [
        ("decode", vec![format!("file:{}", endpoints.display())]),
        ("prefill", vec![]),
    ] {
        let command = graph.sidecar_command(service, ports, Path::new("/tmp/kv"), endpoints);
        assert_eq!(sidecar(&whole(command)).disagg.prefill_peers, peers);
        let engine = mocker(&whole(graph.engine_command(service, ports)));
        assert_eq!(
            engine.kv_blocks_url.as_deref(),
            Some("http://127.0.0.1:41005")
        );
        assert_eq!(engine.kv_offload, OffloadMode::None);
    }
}

#[test]
fn vllm_prefill_and_decode_pods_open_nixls_side_channel_on_their_own_ip() {
    let desired = run(&sample("disagg-vllm"), &observed(vec![], cluster()));
    assert_eq!(desired.pods.len(), 3);
    for pod in &desired.pods {
        let env = serde_json::to_value(&container(pod, "main").env).unwrap();
        let side_channel: Vec<_> = env
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["name"].as_str().unwrap().starts_with("VLLM_NIXL_"))
            .collect();
        assert_eq!(
            side_channel,
            [
                &json!({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
                &json!({"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "5600"}),
            ],
            "{}",
            label(pod, labels::ROLE)
        );
    }
}
