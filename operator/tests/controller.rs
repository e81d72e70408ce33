//! The controllers against kube-rs's mocked client (`tower-test`), answered by an
//! in-memory API server: what one reconcile pass writes, and how later passes follow the
//! cluster (deletions, failures, gang restarts, scaling adapters, bad input, API errors).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::api::{FakeApi, Recorded};
use common::{caches, cluster, events, graph_path, path, pod_path, sample};
use dynamo_crds::inference_pool::InferencePool;
use dynamo_crds::{DynamoGraphDeployment, DynamoGraphDeploymentScalingAdapter};
use dynamo_operator::controller::metrics::Metrics;
use dynamo_operator::controller::{Context, Error, dgd, dgdsa, observe};
use dynamo_operator::reconcile::{OperatorConfig, reconcile};
use k8s_openapi::api::core::v1::EnvVar;
use kube::Client;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

const NS: &str = "inference";

fn context(client: &Client, api: &FakeApi, metrics: &Arc<Metrics>) -> Arc<Context> {
    Arc::new(Context::new(
        client.clone(),
        OperatorConfig::default(),
        caches(api),
        metrics.clone(),
        Some("test".into()),
    ))
}

/// One DGD reconcile pass over caches that show what the fake API server holds.
async fn pass(client: &Client, api: &FakeApi, graph: &str) -> Result<Action, Error> {
    pass_with(client, api, graph, &Arc::new(Metrics::default())).await
}

async fn pass_with(
    client: &Client,
    api: &FakeApi,
    graph: &str,
    metrics: &Arc<Metrics>,
) -> Result<Action, Error> {
    let ctx = context(client, api, metrics);
    let dgd = ctx
        .stores
        .graphs
        .get(&ObjectRef::new(graph).within(NS))
        .expect("graph in the cache");
    dgd::reconcile(dgd, ctx).await
}

fn install(api: &FakeApi, name: &str) -> DynamoGraphDeployment {
    let dgd = sample(name);
    api.put(&graph_path(name), serde_json::to_value(&dgd).unwrap());
    dgd
}

/// What kubelet and the Deployment controller would do: bound, unblocked pods run and are
/// ready; Deployments report every replica ready.
fn run_everything(api: &FakeApi) {
    for p in api.paths("/pods/") {
        api.edit(&p, |pod| {
            if pod["spec"]["schedulingGates"].is_array() {
                return;
            }
            pod["spec"]["nodeName"] = json!("a1");
            pod["status"] = json!({
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
            });
        });
    }
    for p in api.paths("/deployments/") {
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

fn status_writes(requests: &[Recorded]) -> Vec<&Recorded> {
    requests
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
        .collect()
}

fn deleted(requests: &[Recorded]) -> BTreeSet<String> {
    requests
        .iter()
        .filter(|r| r.method == "DELETE" && r.status == 200)
        .map(|r| r.path.rsplit('/').next().unwrap().to_string())
        .collect()
}

fn graph_object(api: &FakeApi, name: &str) -> Value {
    api.object(&graph_path(name)).unwrap()
}

#[tokio::test]
async fn a_pass_applies_every_desired_object_and_writes_the_status() {
    let (client, api) = FakeApi::start();
    let dgd = install(&api, "agg-mocker");
    let desired = reconcile(
        &dgd,
        &observe(&dgd, &caches(&api)),
        &OperatorConfig::default(),
    )
    .unwrap();

    let action = pass(&client, &api, "agg-mocker").await.unwrap();
    let requests = api.take_requests();

    let applies: Vec<&Recorded> = requests
        .iter()
        .filter(|r| r.is_apply() && !r.path.ends_with("/status"))
        .collect();
    let mut expected: BTreeSet<String> = desired
        .pods
        .iter()
        .map(|p| pod_path(p.metadata.name.as_ref().unwrap()))
        .collect();
    expected.extend(
        desired
            .services
            .iter()
            .map(|s| path("v1", NS, "services", s.metadata.name.as_ref().unwrap())),
    );
    expected.extend(desired.deployments.iter().map(|d| {
        path(
            "apps/v1",
            NS,
            "deployments",
            d.metadata.name.as_ref().unwrap(),
        )
    }));
    expected.extend(desired.inference_pools.iter().map(|p| {
        path(
            "inference.networking.k8s.io/v1",
            NS,
            "inferencepools",
            p.metadata.name.as_ref().unwrap(),
        )
    }));
    expected.extend(desired.service_accounts.iter().map(|a| {
        path(
            "v1",
            NS,
            "serviceaccounts",
            a.metadata.name.as_ref().unwrap(),
        )
    }));
    let rbac = "rbac.authorization.k8s.io/v1";
    expected.extend(
        desired
            .roles
            .iter()
            .map(|r| path(rbac, NS, "roles", r.metadata.name.as_ref().unwrap())),
    );
    expected.extend(
        desired
            .role_bindings
            .iter()
            .map(|b| path(rbac, NS, "rolebindings", b.metadata.name.as_ref().unwrap())),
    );
    expected.extend(desired.network_policies.iter().map(|n| {
        path(
            "networking.k8s.io/v1",
            NS,
            "networkpolicies",
            n.metadata.name.as_ref().unwrap(),
        )
    }));
    assert!(
        !desired.role_bindings.is_empty(),
        "a graph with workers gets its EPP's access"
    );
    assert_eq!(desired.network_policies.len(), 1);
    assert_eq!(
        applies
            .iter()
            .map(|r| r.path.clone())
            .collect::<BTreeSet<_>>(),
        expected
    );
    assert_eq!(applies.len(), expected.len(), "each object once");
    for r in &applies {
        assert_eq!(r.field_manager(), Some("dynamo-operator"), "{}", r.path);
        assert!(r.query.contains("force=true"), "{}", r.query);
    }
    // The applied body is exactly the pure reconciler's object.
    let worker0 = applies
        .iter()
        .find(|r| r.path == pod_path("agg-mocker-worker-0"))
        .unwrap();
    let want = desired
        .pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("agg-mocker-worker-0"))
        .unwrap();
    assert_eq!(worker0.body, serde_json::to_value(want).unwrap());

    let statuses = status_writes(&requests);
    assert_eq!(statuses.len(), 1);
    assert!(statuses[0].is_apply());
    let status = &statuses[0].body["status"];
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(status["state"], "pending");
    assert_eq!(status["conditions"][0]["type"], "Ready");
    assert_eq!(status["conditions"][0]["status"], "False");
    assert_eq!(
        graph_object(&api, "agg-mocker")["status"]["state"],
        "pending"
    );

    // One Event per reason and pass, naming every object it concerns.
    assert_eq!(events(&requests), vec!["Creating".to_string()]);
    let event = requests
        .iter()
        .find(|r| r.path.contains("/events"))
        .unwrap();
    assert_eq!(event.body["regarding"]["name"], "agg-mocker");
    assert_eq!(event.body["regarding"]["kind"], "DynamoGraphDeployment");
    assert_eq!(event.body["type"], "Normal");
    let note = event.body["note"].as_str().unwrap();
    assert!(
        note.contains("worker replica 0") && note.contains("worker replica 1"),
        "{note}"
    );

    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    api.assert_rbac_allows_all();
}

#[tokio::test]
async fn tiers_a_vllm_worker_cannot_feed_are_warned_once_and_kept_in_a_condition() {
    let (client, api) = FakeApi::start();
    let mut dgd = sample("agg-vllm");
    let worker = dgd.spec.services.get_mut("VllmWorker").unwrap();
    worker.envs = Some(vec![EnvVar {
        name: "DYN_KVBM_CPU_CACHE_GB".into(),
        value: Some("2".into()),
        ..EnvVar::default()
    }]);
    // Two tensor-parallel ranks: our connector keeps one rank's blocks.
    let main = worker
        .extra_pod_spec
        .as_mut()
        .unwrap()
        .main_container
        .as_mut()
        .unwrap();
    main.args
        .get_or_insert_with(Vec::new)
        .extend(["--tensor-parallel-size".into(), "2".into()]);
    api.put(&graph_path("agg-vllm"), serde_json::to_value(&dgd).unwrap());
    pass(&client, &api, "agg-vllm").await.unwrap();
    let first = api.take_requests();
    assert!(events(&first).contains(&"NoKvConnector".to_string()));
    let warning = first
        .iter()
        .find(|r| r.path.contains("/events") && r.body["reason"] == "NoKvConnector")
        .unwrap();
    assert_eq!(warning.body["type"], "Warning");
    let condition = |api: &FakeApi| {
        graph_object(api, "agg-vllm")["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "KvTiersFed")
            .cloned()
            .expect("a KvTiersFed condition")
    };
    let fed = condition(&api);
    assert_eq!(
        (&fed["status"], &fed["reason"]),
        (&json!("False"), &json!("NoKvConnector"))
    );
    assert_eq!(fed["message"], warning.body["note"]);

    // The condition still says it: not warned again on every pass.
    pass(&client, &api, "agg-vllm").await.unwrap();
    assert!(!events(&api.take_requests()).contains(&"NoKvConnector".to_string()));
    assert_eq!(condition(&api), fed);
}

#[tokio::test]
async fn ready_only_once_everything_runs_and_then_passes_are_idempotent() {
    let (client, api) = FakeApi::start();
    install(&api, "agg-mocker");
    pass(&client, &api, "agg-mocker").await.unwrap();
    // Pods exist, nothing is ready yet.
    pass(&client, &api, "agg-mocker").await.unwrap();
    assert_eq!(
        graph_object(&api, "agg-mocker")["status"]["state"],
        "deploying"
    );

    run_everything(&api);
    pass(&client, &api, "agg-mocker").await.unwrap();
    let status = &graph_object(&api, "agg-mocker")["status"];
    assert_eq!(status["state"], "ready");
    assert_eq!(status["conditions"][0]["status"], "True");
    assert_eq!(status["conditions"][0]["observedGeneration"], 1);
    assert_eq!(status["services"]["worker"]["readyReplicas"], 2);

    api.take_requests();
    pass(&client, &api, "agg-mocker").await.unwrap();
    let requests = api.take_requests();
    // Besides, the credential's create, refused: it exists and is never rewritten.
    let (credential, rest): (Vec<_>, Vec<_>) =
        requests.iter().partition(|r| r.path.ends_with("/secrets"));
    assert_eq!(credential.len(), 1);
    assert_eq!(
        (credential[0].method.as_str(), credential[0].status),
        ("POST", 409)
    );
    assert!(
        rest.iter().all(|r| r.is_apply()),
        "a settled graph only re-applies, identically: {:?}",
        requests
            .iter()
            .map(|r| (&r.method, &r.path))
            .collect::<Vec<_>>()
    );
    assert!(status_writes(&requests).is_empty());
    api.assert_rbac_allows_all();
}

#[tokio::test]
async fn children_no_longer_desired_are_deleted_with_their_uid() {
    let (client, api) = FakeApi::start();
    install(&api, "disagg-mocker");
    pass(&client, &api, "disagg-mocker").await.unwrap();
    run_everything(&api);
    pass(&client, &api, "disagg-mocker").await.unwrap();
    assert!(api.object(&pod_path("disagg-mocker-prefill-0")).is_some());
    api.take_requests();

    api.edit(&graph_path("disagg-mocker"), |g| {
        g["metadata"]["generation"] = json!(2);
        g["spec"]["services"]["decode"]["replicas"] = json!(1);
    });
    pass(&client, &api, "disagg-mocker").await.unwrap();
    let requests = api.take_requests();
    assert_eq!(
        deleted(&requests),
        BTreeSet::from(["disagg-mocker-decode-1".to_string()])
    );
    let delete = requests
        .iter()
        .find(|r| r.method == "DELETE" && r.path == pod_path("disagg-mocker-decode-1"))
        .unwrap();
    assert_eq!(
        delete.body["preconditions"]["uid"], "uid-disagg-mocker-decode-1",
        "deleted by UID, so a recreated namesake survives"
    );
    assert!(api.object(&pod_path("disagg-mocker-decode-1")).is_none());
    assert!(events(&requests).contains(&"ScaledDown".to_string()));

    api.edit(&graph_path("disagg-mocker"), |g| {
        g["metadata"]["generation"] = json!(3);
        g["spec"]["services"]
            .as_object_mut()
            .unwrap()
            .remove("prefill");
    });
    pass(&client, &api, "disagg-mocker").await.unwrap();
    let gone = deleted(&api.take_requests());
    for name in [
        "disagg-mocker-prefill-0",
        "disagg-mocker-prefill",
        "disagg-mocker-prefill-peers",
        // Its sidecar has no prefill peers left: the decode pod rolls.
        "disagg-mocker-decode-0",
    ] {
        assert!(gone.contains(name), "{name} not in {gone:?}");
    }
    api.assert_rbac_allows_all();
}

#[tokio::test]
async fn a_failed_pod_is_deleted_then_recreated() {
    let (client, api) = FakeApi::start();
    install(&api, "agg-mocker");
    pass(&client, &api, "agg-mocker").await.unwrap();
    run_everything(&api);
    let worker = pod_path("agg-mocker-worker-1");
    api.edit(&worker, |p| p["status"]["phase"] = json!("Failed"));
    api.take_requests();

    pass(&client, &api, "agg-mocker").await.unwrap();
    let requests = api.take_requests();
    assert_eq!(
        deleted(&requests),
        BTreeSet::from(["agg-mocker-worker-1".into()])
    );
    assert!(events(&requests).contains(&"PodFailed".to_string()));
    assert!(api.object(&worker).is_none());

    pass(&client, &api, "agg-mocker").await.unwrap();
    let requests = api.take_requests();
    let recreated = requests
        .iter()
        .find(|r| r.is_apply() && r.path == worker)
        .expect("the pod is applied again");
    assert!(recreated.created);
    api.assert_rbac_allows_all();
}

#[tokio::test]
async fn a_gang_is_released_together_and_restarted_whole_when_it_loses_a_member() {
    let (client, api) = FakeApi::start();
    for node in cluster() {
        let name = node.metadata.name.clone().unwrap();
        api.put(
            &format!("/api/v1/nodes/{name}"),
            serde_json::to_value(&node).unwrap(),
        );
    }
    install(&api, "multinode-vllm");
    let leader = pod_path("multinode-vllm-vllmdecodeworker-0-ldr");
    let worker = pod_path("multinode-vllm-vllmdecodeworker-0-wkr-1");
    let gated =
        |api: &FakeApi, p: &str| api.object(p).unwrap()["spec"]["schedulingGates"].is_array();

    pass(&client, &api, "multinode-vllm").await.unwrap();
    assert!(
        gated(&api, &leader) && gated(&api, &worker),
        "created gated"
    );
    let status = &graph_object(&api, "multinode-vllm")["status"];
    assert_eq!(status["conditions"][1]["type"], "GangScheduled");
    assert_eq!(status["conditions"][1]["status"], "False");

    let action = pass(&client, &api, "multinode-vllm").await.unwrap();
    assert!(
        !gated(&api, &leader) && !gated(&api, &worker),
        "released together"
    );
    let affinity = &api.object(&leader).unwrap()["spec"]["affinity"]["nodeAffinity"];
    assert!(
        affinity.to_string().contains("nvidia.com/gpu.clique"),
        "{affinity}"
    );
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));

    run_everything(&api);
    pass(&client, &api, "multinode-vllm").await.unwrap();
    api.remove(&worker);
    api.take_requests();
    pass(&client, &api, "multinode-vllm").await.unwrap();
    let requests = api.take_requests();
    assert_eq!(
        deleted(&requests),
        BTreeSet::from(["multinode-vllm-vllmdecodeworker-0-ldr".into()]),
        "the surviving member goes too"
    );
    assert!(events(&requests).contains(&"GangRestart".to_string()));

    // Then the gang is created again, gated, as a whole.
    pass(&client, &api, "multinode-vllm").await.unwrap();
    assert!(gated(&api, &leader) && gated(&api, &worker));
    api.assert_rbac_allows_all();
}

#[tokio::test]
async fn an_invalid_graph_gets_a_condition_and_nothing_else() {
    let (client, api) = FakeApi::start();
    install(&api, "agg-mocker");
    api.edit(&graph_path("agg-mocker"), |g| {
        let worker = g["spec"]["services"]["worker"].clone();
        g["spec"]["services"]["Worker"] = worker;
    });
    let action = pass(&client, &api, "agg-mocker").await.unwrap();
    assert_eq!(action, Action::await_change(), "waits for a spec change");
    let message = refused_as_invalid_spec(&api, "agg-mocker");
    assert_eq!(
        graph_object(&api, "agg-mocker")["status"]["state"],
        "failed"
    );
    assert!(message.contains("differ only in case"), "{message}");
}

/// For a graph the last pass refused: nothing but its status was written, its
/// condition and its one Event say `InvalidSpec`; the condition's message.
fn refused_as_invalid_spec(api: &FakeApi, graph: &str) -> String {
    let requests = api.take_requests();
    assert!(
        !requests
            .iter()
            .any(|r| r.is_apply() && !r.path.ends_with("/status")),
        "nothing is created for a graph that cannot be reconciled"
    );
    let status = &graph_object(api, graph)["status"];
    assert_eq!(status["conditions"][0]["reason"], "InvalidSpec", "{status}");
    assert_eq!(events(&requests), vec!["InvalidSpec".to_string()]);
    status["conditions"][0]["message"]
        .as_str()
        .expect("the condition says why")
        .to_owned()
}

#[tokio::test]
async fn a_malformed_planner_flag_gets_the_invalid_spec_condition() {
    let (client, api) = FakeApi::start();
    install(&api, "disagg-vllm");
    api.edit(&graph_path("disagg-vllm"), |g| {
        g["spec"]["services"]["Planner"]["extraPodSpec"]["mainContainer"]["args"] =
            serde_json::json!(["--ttft", "abc"]);
    });
    pass(&client, &api, "disagg-vllm").await.unwrap();
    assert_eq!(
        refused_as_invalid_spec(&api, "disagg-vllm"),
        "spec.services.Planner: --ttft \"abc\": not a positive number of milliseconds"
    );
}

#[tokio::test]
async fn a_throughput_planner_with_no_profile_to_measure_gets_the_invalid_spec_condition() {
    // Our planner in its default mode on vLLM workers: no profile, no mock engine to
    // measure one on. Refused, rather than a planner pod that exits at every start.
    let (client, api) = FakeApi::start();
    install(&api, "disagg-vllm");
    api.edit(&graph_path("disagg-vllm"), |g| {
        g["spec"]["services"]["Planner"]["extraPodSpec"]["mainContainer"] = serde_json::json!({
            "command": ["dynamo", "planner"], "args": ["--interval", "60s"]});
    });
    let action = pass(&client, &api, "disagg-vllm").await.unwrap();
    assert_eq!(action, Action::await_change(), "waits for a spec change");
    let message = refused_as_invalid_spec(&api, "disagg-vllm");
    assert!(message.starts_with("spec.services.Planner: "), "{message}");
    for way_out in ["--profile FILE", "DGDR", "--mode load"] {
        assert!(message.contains(way_out), "{message}");
    }
}

#[tokio::test]
async fn refused_writes_fail_the_pass_say_why_and_back_off() {
    let (client, api) = FakeApi::start();
    install(&api, "agg-mocker");
    api.fail("PATCH", "/pods/", 422);
    let metrics = Arc::new(Metrics::default());
    let error = pass_with(&client, &api, "agg-mocker", &metrics)
        .await
        .unwrap_err();
    match &error {
        Error::Children { failed, total } => {
            assert_eq!(failed.len(), 2, "both worker pods");
            assert!(*total > 2, "the other objects were still written");
        }
        other => panic!("{other}"),
    }
    assert!(
        api.object(&path("v1", NS, "services", "agg-mocker-epp"))
            .is_some()
    );
    let ready = &graph_object(&api, "agg-mocker")["status"]["conditions"][0];
    assert_eq!(ready["reason"], "ApplyFailed");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("agg-mocker-worker-"),
        "{ready}"
    );
    assert!(
        metrics.encode().contains(
            r#"dynamo_operator_reconcile_errors_total{controller="dgd",error="children"} 1"#
        ),
        "{}",
        metrics.encode()
    );

    let ctx = context(&client, &api, &metrics);
    let dgd = Arc::new(sample("agg-mocker"));
    let delays: Vec<Action> = (0..3)
        .map(|_| dgd::error_policy(dgd.clone(), &error, ctx.clone()))
        .collect();
    assert_eq!(
        delays,
        [1, 2, 4].map(|s| Action::requeue(Duration::from_secs(s)))
    );
}

#[tokio::test]
async fn a_pass_is_counted_and_timed() {
    let (client, api) = FakeApi::start();
    install(&api, "agg-mocker");
    let metrics = Arc::new(Metrics::default());
    pass_with(&client, &api, "agg-mocker", &metrics)
        .await
        .unwrap();
    let text = metrics.encode();
    assert!(
        text.contains(r#"dynamo_operator_reconciles_total{controller="dgd"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"dynamo_operator_reconcile_duration_seconds_count{controller="dgd"} 1"#),
        "{text}"
    );
}

fn adapter_path(name: &str) -> String {
    path(
        "nvidia.com/v1alpha1",
        NS,
        "dynamographdeploymentscalingadapters",
        name,
    )
}

async fn adapter_pass(client: &Client, api: &FakeApi, name: &str) -> Result<Action, Error> {
    let ctx = context(client, api, &Arc::new(Metrics::default()));
    let adapter = ctx
        .stores
        .children
        .get::<DynamoGraphDeploymentScalingAdapter>()
        .and_then(|adapters| adapters.get(&ObjectRef::new(name).within(NS)))
        .expect("adapter in the cache");
    dgdsa::reconcile(adapter, ctx).await
}

#[tokio::test]
async fn a_scaling_adapter_owns_its_service_replicas() {
    let (client, api) = FakeApi::start();
    install(&api, "disagg-vllm");
    pass(&client, &api, "disagg-vllm").await.unwrap();
    let decode = adapter_path("disagg-vllm-vllmdecodeworker");
    let created = api
        .object(&decode)
        .expect("the graph pass creates the adapter");
    assert_eq!(created["spec"]["replicas"], 2);
    assert_eq!(
        created["metadata"]["ownerReferences"][0]["kind"],
        "DynamoGraphDeployment"
    );

    // `kubectl scale dgdsa/disagg-vllm-vllmdecodeworker --replicas=4`
    api.edit(&decode, |a| a["spec"]["replicas"] = json!(4));
    api.take_requests();
    adapter_pass(&client, &api, "disagg-vllm-vllmdecodeworker")
        .await
        .unwrap();
    let requests = api.take_requests();
    let scale = requests
        .iter()
        .find(|r| r.method == "PATCH" && r.path == graph_path("disagg-vllm"))
        .expect("the graph is patched");
    assert_eq!(
        scale.body,
        json!({"spec": {"services": {"VllmDecodeWorker": {"replicas": 4}}}})
    );
    assert_eq!(scale.field_manager(), Some("dynamo-operator"));
    let services = &graph_object(&api, "disagg-vllm")["spec"]["services"];
    assert_eq!(services["VllmDecodeWorker"]["replicas"], 4);
    assert_eq!(
        services["VllmPrefillWorker"]["replicas"], 1,
        "others untouched"
    );
    assert!(events(&requests).contains(&"Scaled".to_string()));
    let status = &api.object(&decode).unwrap()["status"];
    assert_eq!(
        status["selector"],
        "nvidia.com/dynamo-component=VllmDecodeWorker,nvidia.com/dynamo-graph-deployment-name=disagg-vllm"
    );
    assert!(status["lastScaleTime"].is_string());

    // The graph now asks for four decode pods; the next pass counts them.
    pass(&client, &api, "disagg-vllm").await.unwrap();
    assert!(
        api.object(&pod_path("disagg-vllm-vllmdecodeworker-3"))
            .is_some()
    );
    pass(&client, &api, "disagg-vllm").await.unwrap();
    // The adapter's status follows the graph's; nothing else changes.
    api.take_requests();
    adapter_pass(&client, &api, "disagg-vllm-vllmdecodeworker")
        .await
        .unwrap();
    let requests = api.take_requests();
    assert!(
        !requests.iter().any(|r| r.path == graph_path("disagg-vllm")),
        "replicas already match"
    );
    assert_eq!(api.object(&decode).unwrap()["status"]["replicas"], 4);

    // A user who edits the replicas in the graph is overruled by the adapter.
    api.edit(&graph_path("disagg-vllm"), |g| {
        g["spec"]["services"]["VllmDecodeWorker"]["replicas"] = json!(1);
    });
    adapter_pass(&client, &api, "disagg-vllm-vllmdecodeworker")
        .await
        .unwrap();
    assert_eq!(
        graph_object(&api, "disagg-vllm")["spec"]["services"]["VllmDecodeWorker"]["replicas"],
        4
    );
    api.assert_rbac_allows_all();
}

#[tokio::test]
async fn an_adapter_without_its_graph_waits_and_says_why() {
    let (client, api) = FakeApi::start();
    api.put(
        &adapter_path("orphan"),
        json!({
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "DynamoGraphDeploymentScalingAdapter",
            "metadata": {"name": "orphan", "namespace": NS},
            "spec": {"replicas": 3, "dgdRef": {"name": "missing", "service": "decode"}},
        }),
    );
    let action = adapter_pass(&client, &api, "orphan").await.unwrap();
    assert_eq!(action, Action::await_change());
    let requests = api.take_requests();
    assert_eq!(events(&requests), vec!["GraphNotFound".to_string()]);
    assert!(requests.iter().all(|r| r.path.contains("/events")));
}

#[tokio::test]
async fn without_the_inference_pool_api_the_graph_is_served_by_its_services() {
    let (client, api) = FakeApi::start();
    let dgd = Arc::new(install(&api, "agg-mocker"));
    let mut stores = caches(&api);
    stores.children.remove::<InferencePool>();
    let ctx = Arc::new(Context::new(
        client,
        OperatorConfig::default(),
        stores,
        Arc::new(Metrics::default()),
        None,
    ));
    dgd::reconcile(dgd, ctx).await.unwrap();
    let requests = api.take_requests();
    assert!(!requests.iter().any(|r| r.path.contains("inferencepools")));
    assert!(
        api.object(&path("v1", NS, "services", "agg-mocker-worker"))
            .is_some()
    );
    let warning = requests
        .iter()
        .find(|r| r.body["reason"] == "InferencePoolApiMissing")
        .expect("a Warning Event says why");
    assert_eq!(warning.body["type"], "Warning");
}
