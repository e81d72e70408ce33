//! The whole controller (watches, triggers, both appliers) running against the mocked
//! client, with the test playing kubelet, scheduler and user.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::api::FakeApi;
use common::{cluster, graph_path, path, pod_path, sample};
use dynamo_operator::controller::metrics::Metrics;
use dynamo_operator::controller::{OptionalApis, run_controllers};
use dynamo_operator::reconcile::OperatorConfig;
use kube::runtime::controller::Config;
use serde_json::{Value, json};

/// Starts both controllers on a fresh fake API server.
fn start() -> (FakeApi, tokio::task::JoinHandle<()>) {
    let (client, api) = FakeApi::start();
    let apis = OptionalApis {
        inference_pool: true,
        http_route: true,
    };
    let controllers = tokio::spawn(async move {
        run_controllers(
            client,
            OperatorConfig::default(),
            Config::default(),
            apis,
            Arc::new(Metrics::default()),
            "test",
        )
        .await;
    });
    (api, controllers)
}

/// Polls `check` until it holds (generous: the machine may be loaded).
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// kubelet: every scheduled, ungated pod runs and is ready; Deployments are rolled out.
fn kubelet(api: &FakeApi) {
    for p in api.paths("/pods/") {
        let pod = api.object(&p).unwrap();
        if pod["spec"]["schedulingGates"].is_array() || pod["status"]["phase"] == "Running" {
            continue;
        }
        api.edit(&p, |pod| {
            pod["spec"]["nodeName"] = json!("a1");
            pod["status"] = json!({
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
            });
        });
    }
    for p in api.paths("/deployments/") {
        let d = api.object(&p).unwrap();
        if d["status"]["readyReplicas"] == d["spec"]["replicas"] {
            continue;
        }
        api.edit(&p, |d| {
            let replicas = d["spec"]["replicas"].clone();
            d["status"] = json!({
                "observedGeneration": 1,
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": replicas,
            });
        });
    }
}

fn state(api: &FakeApi, graph: &str) -> Value {
    api.object(&graph_path(graph)).unwrap()["status"]["state"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_comes_up_and_scales_through_its_adapter() {
    let (api, controllers) = start();
    api.put(
        &graph_path("agg-vllm"),
        serde_json::to_value(sample("agg-vllm")).unwrap(),
    );

    eventually("the worker pods are created", || {
        api.object(&pod_path("agg-vllm-vllmworker-1")).is_some()
    })
    .await;
    eventually("the graph is deploying", || {
        state(&api, "agg-vllm") == "deploying"
    })
    .await;
    kubelet(&api);
    eventually("the graph is ready", || state(&api, "agg-vllm") == "ready").await;

    // `kubectl scale dgdsa/agg-vllm-vllmworker --replicas=3`
    let adapter = path(
        "nvidia.com/v1alpha1",
        "inference",
        "dynamographdeploymentscalingadapters",
        "agg-vllm-vllmworker",
    );
    eventually("the adapter exists", || api.object(&adapter).is_some()).await;
    api.edit(&adapter, |a| a["spec"]["replicas"] = json!(3));
    eventually("a third worker is created", || {
        api.object(&pod_path("agg-vllm-vllmworker-2")).is_some()
    })
    .await;
    kubelet(&api);
    eventually("the adapter reports three replicas", || {
        api.object(&adapter).unwrap()["status"]["replicas"] == 3
    })
    .await;
    eventually("ready again", || state(&api, "agg-vllm") == "ready").await;

    // A deleted pod is recreated.
    api.remove(&pod_path("agg-vllm-vllmworker-0"));
    eventually("the deleted pod is back", || {
        api.object(&pod_path("agg-vllm-vllmworker-0")).is_some()
    })
    .await;
    api.assert_rbac_allows_all();
    controllers.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_nodes_release_a_waiting_gang() {
    let (api, controllers) = start();
    api.put(
        &graph_path("multinode-vllm"),
        serde_json::to_value(sample("multinode-vllm")).unwrap(),
    );
    let leader = pod_path("multinode-vllm-vllmdecodeworker-0-ldr");
    // No nodes yet: the gang waits behind its gate, and the status says why.
    eventually("the gang is created and reported unplaced", || {
        let status = &api.object(&graph_path("multinode-vllm")).unwrap()["status"];
        api.object(&leader).is_some()
            && status["conditions"][1]["type"] == "GangScheduled"
            && status["conditions"][1]["status"] == "False"
    })
    .await;
    assert!(api.object(&leader).unwrap()["spec"]["schedulingGates"].is_array());

    for node in cluster() {
        let name = node.metadata.name.clone().unwrap();
        api.put(
            &format!("/api/v1/nodes/{name}"),
            serde_json::to_value(&node).unwrap(),
        );
    }
    eventually("the gang is released", || {
        api.object(&leader).unwrap()["spec"]["schedulingGates"].is_null()
    })
    .await;
    controllers.abort();
}
