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
    start_watching(None)
}

/// [`start`], watching only `namespace` when given (`--watch-namespace`).
fn start_watching(namespace: Option<&'static str>) -> (FakeApi, tokio::task::JoinHandle<()>) {
    let (client, api) = FakeApi::start();
    let apis = OptionalApis::default();
    let controllers = tokio::spawn(async move {
        run_controllers(
            client,
            OperatorConfig::default(),
            Config::default(),
            apis,
            Arc::new(Metrics::default()),
            "test",
            namespace,
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
async fn watching_one_namespace_lists_and_watches_only_there() {
    let (api, controllers) = start_watching(Some("inference"));
    api.put(
        &graph_path("agg-vllm"),
        serde_json::to_value(sample("agg-vllm")).unwrap(),
    );
    let elsewhere = path(
        "nvidia.com/v1alpha1",
        "other",
        "dynamographdeployments",
        "agg-vllm",
    );
    let mut other = sample("agg-vllm");
    other.metadata.namespace = Some("other".into());
    api.put(&elsewhere, serde_json::to_value(other).unwrap());

    eventually("the watched graph's pods are created", || {
        api.object(&pod_path("agg-vllm-vllmworker-1")).is_some()
    })
    .await;
    eventually("the watched graph is deploying", || {
        state(&api, "agg-vllm") == "deploying"
    })
    .await;
    let requests = api.requests();
    let reads: Vec<_> = requests.iter().filter(|r| r.method == "GET").collect();
    assert!(reads.len() >= 5, "{reads:?}");
    for r in reads {
        assert!(
            r.path.contains("/namespaces/inference/"),
            "a read outside the watched namespace: {} {}?{}",
            r.method,
            r.path,
            r.query
        );
    }
    assert!(requests.iter().all(|r| !r.path.contains("/nodes")));
    assert!(api.paths("/namespaces/other/pods/").is_empty());
    assert!(api.object(&elsewhere).unwrap()["status"].is_null());
    controllers.abort();
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

/// `kubectl apply -f config/samples/dgdr.yaml`: the request is profiled, its graph
/// generated, deployed and followed until it is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_request_is_profiled_deployed_and_followed_until_ready() {
    let (api, controllers) = start();
    let request_path = path(
        "nvidia.com/v1beta1",
        "inference",
        "dynamographdeploymentrequests",
        "qwen3-sla",
    );
    let yaml = std::fs::read_to_string(common::repo_root().join("config/samples/dgdr.yaml"))
        .expect("the sample exists");
    let mut request: Value = serde_saphyr::from_str(&yaml).unwrap();
    request["metadata"]["namespace"] = json!("inference");
    api.put(&request_path, request);
    let phase = |api: &FakeApi| api.object(&request_path).unwrap()["status"]["phase"].clone();

    eventually("the request deploys its graph", || {
        phase(&api) == "Deploying"
    })
    .await;
    let dgd = api
        .object(&graph_path("qwen3-sla"))
        .expect("the generated graph");
    let owner = &dgd["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "DynamoGraphDeploymentRequest");
    assert_eq!(owner["uid"], "uid-qwen3-sla");
    assert_eq!(owner["controller"], true);
    assert_eq!(
        dgd["metadata"]["labels"]["dgdr.nvidia.com/name"],
        "qwen3-sla"
    );
    // The sample's vLLM planner reads its profile from a ConfigMap the request owns.
    let profile = api
        .object(&path(
            "v1",
            "inference",
            "configmaps",
            "qwen3-sla-planner-profile",
        ))
        .expect("the planner profile");
    assert_eq!(
        profile["metadata"]["ownerReferences"][0]["uid"],
        "uid-qwen3-sla"
    );
    let points: Value = serde_json::from_str(profile["data"]["profile.json"].as_str().unwrap())
        .expect("the profile is JSON");
    assert!(points.is_object(), "{points}");

    eventually("the graph's workers are created", || {
        !api.paths("/pods/qwen3-sla-").is_empty()
    })
    .await;
    eventually("the graph is rolled out", || {
        kubelet(&api);
        state(&api, "qwen3-sla") == "ready"
    })
    .await;
    eventually("the request is deployed", || phase(&api) == "Deployed").await;

    let status = api.object(&request_path).unwrap()["status"].clone();
    assert_eq!(status["dgdName"], "qwen3-sla");
    assert_eq!(status["observedGeneration"], 1);
    let succeeded = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Succeeded")
        .unwrap();
    assert_eq!(succeeded["status"], "True", "{status}");
    let pareto = status["profilingResults"]["pareto"].as_array().unwrap();
    assert_eq!(
        pareto
            .iter()
            .filter(|p| p["config"]["selected"] == true)
            .count(),
        1,
        "{pareto:?}"
    );
    // Every phase was shown, in order.
    let phases: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.path == format!("{request_path}/status") && r.method == "PATCH")
        .map(|r| r.body["status"]["phase"].as_str().unwrap().to_string())
        .fold(Vec::new(), |mut seen, p| {
            if seen.last() != Some(&p) {
                seen.push(p);
            }
            seen
        });
    assert_eq!(
        phases,
        ["Pending", "Profiling", "Ready", "Deploying", "Deployed"]
    );
    let reasons = common::events(&api.requests());
    for reason in [
        "Initialized",
        "SpecGenerated",
        "DeploymentCreated",
        "DeploymentReady",
    ] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "{reason} in {reasons:?}"
        );
    }
    api.assert_rbac_allows_all();
    controllers.abort();
}
