//! The DynamoGraphDeploymentRequest controller, one pass at a time, against the mocked
//! client: what each step writes, and the requests it refuses or cannot serve.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::api::FakeApi;
use common::{caches, events, graph_path, path};
use dynamo_operator::controller::metrics::Metrics;
use dynamo_operator::controller::{Context, dgdr};
use dynamo_operator::reconcile::OperatorConfig;
use dynamo_operator::reconcile::names::validate_manifest;
use kube::Client;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

const NS: &str = "inference";

fn request_path(name: &str) -> String {
    path(
        "nvidia.com/v1beta1",
        NS,
        "dynamographdeploymentrequests",
        name,
    )
}

/// A request with `spec` (YAML flow), as `kubectl apply` would store it.
fn submit(api: &FakeApi, name: &str, spec: &str) {
    let spec: Value = serde_saphyr::from_str(spec).expect("spec parses");
    api.put(
        &request_path(name),
        json!({
            "apiVersion": "nvidia.com/v1beta1",
            "kind": "DynamoGraphDeploymentRequest",
            "metadata": {"name": name, "namespace": NS},
            "spec": spec,
        }),
    );
}

/// One reconcile pass over caches showing what the fake API server holds.
async fn pass(client: &Client, api: &FakeApi, name: &str) -> Action {
    let ctx = Arc::new(Context::new(
        client.clone(),
        OperatorConfig::default(),
        caches(api),
        Arc::new(Metrics::default()),
        Some("test".into()),
    ));
    let request = ctx
        .stores
        .requests
        .get(&ObjectRef::new(name).within(NS))
        .expect("request in the cache");
    dgdr::reconcile(request, ctx)
        .await
        .expect("the pass succeeds")
}

fn status(api: &FakeApi, name: &str) -> Value {
    api.object(&request_path(name)).unwrap()["status"].clone()
}

fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

/// Small enough to profile in a debug build in a second or two.
const SMALL: &str = "{model: Qwen/Qwen3-8B, backend: mocker, hardware: {totalGpus: 4}, \
                     workload: {isl: 1000, osl: 100, requestRate: 2}, sla: {ttft: 500, itl: 30}";

#[tokio::test]
async fn without_auto_apply_a_request_stops_at_ready_with_an_applicable_graph() {
    let (client, api) = FakeApi::start();
    submit(&api, "small", &format!("{SMALL}, autoApply: false}}"));
    assert_eq!(pass(&client, &api, "small").await, Action::await_change());

    let s = status(&api, "small");
    assert_eq!(s["phase"], "Ready", "{s}");
    assert_eq!(s["profilingPhase"], "Done");
    assert_eq!(condition(&s, "SpecGenerated")["status"], "True");
    assert_eq!(condition(&s, "Succeeded")["status"], "True");
    assert!(
        api.object(&graph_path("small")).is_none(),
        "nothing deployed"
    );
    // What the user applies by hand passes the CRD schema as is.
    let graph = serde_json::to_string(&s["profilingResults"]["selectedConfig"]).unwrap();
    let validated = validate_manifest(&graph).expect("the generated graph is valid");
    assert_eq!(validated.graph_deployments().count(), 1);
    // A mock engine graph's planner needs no profile ConfigMap, and none was asked for.
    assert!(api.paths("/configmaps/").is_empty());

    // Nothing further happens on another pass.
    api.take_requests();
    assert_eq!(pass(&client, &api, "small").await, Action::await_change());
    assert!(api.take_requests().is_empty());
}

#[tokio::test]
async fn a_request_deploys_then_follows_its_graph_and_a_spec_change_updates_it() {
    let (client, api) = FakeApi::start();
    submit(&api, "small", &format!("{SMALL}}}"));
    assert_eq!(
        pass(&client, &api, "small").await,
        Action::requeue(Duration::from_secs(2))
    );
    assert_eq!(status(&api, "small")["phase"], "Deploying");
    let dgd = api
        .object(&graph_path("small"))
        .expect("the graph is applied");
    assert_eq!(dgd["metadata"]["ownerReferences"][0]["name"], "small");
    let reasons = events(&api.take_requests());
    assert_eq!(
        reasons,
        ["Initialized", "SpecGenerated", "DeploymentCreated"]
    );

    // The graph's controller reports it ready at its generation.
    let generation = dgd["metadata"]["generation"].clone();
    let ready = |api: &FakeApi| {
        let generation =
            api.object(&graph_path("small")).unwrap()["metadata"]["generation"].clone();
        api.edit(&graph_path("small"), |g| {
            g["status"] = json!({"state": "ready", "observedGeneration": generation});
        });
    };
    ready(&api);
    assert_eq!(generation, 1);
    pass(&client, &api, "small").await;
    assert_eq!(status(&api, "small")["phase"], "Deployed");
    assert_eq!(
        condition(&status(&api, "small"), "DeploymentReady")["status"],
        "True"
    );

    // A pod fails: the graph degrades, and so does the request.
    api.edit(&graph_path("small"), |g| {
        g["status"]["state"] = json!("degraded")
    });
    pass(&client, &api, "small").await;
    assert_eq!(status(&api, "small")["phase"], "Deploying");
    assert!(events(&api.take_requests()).contains(&"DeploymentDegraded".to_string()));
    ready(&api);
    pass(&client, &api, "small").await;
    assert_eq!(status(&api, "small")["phase"], "Deployed");

    // Thirty times the load: profiled again, and the same graph follows with more workers.
    // Engines of every role (the new load may well be served disaggregated).
    let workers = |api: &FakeApi| -> i64 {
        let graph = api.object(&graph_path("small")).unwrap();
        let services = graph["spec"]["services"].as_object().unwrap().clone();
        services
            .iter()
            .filter(|(name, _)| *name != "epp")
            .map(|(_, s)| s["replicas"].as_i64().unwrap())
            .sum()
    };
    let before = workers(&api);
    api.edit(&request_path("small"), |r| {
        r["spec"]["workload"]["requestRate"] = json!(60)
    });
    pass(&client, &api, "small").await;
    let s = status(&api, "small");
    assert_eq!(s["phase"], "Deploying", "{s}");
    assert_eq!(s["observedGeneration"], 2);
    assert!(
        workers(&api) > before,
        "{} workers, were {before}: {}",
        workers(&api),
        api.object(&graph_path("small")).unwrap()["spec"]
    );
    let reasons = events(&api.take_requests());
    assert!(reasons.contains(&"SpecChanged".to_string()), "{reasons:?}");
    assert!(
        reasons.contains(&"DeploymentUpdated".to_string()),
        "{reasons:?}"
    );
    // Until the graph's controller catches up with the new spec, it is not deployed.
    pass(&client, &api, "small").await;
    assert_eq!(status(&api, "small")["phase"], "Deploying");
    ready(&api);
    pass(&client, &api, "small").await;
    assert_eq!(status(&api, "small")["phase"], "Deployed");

    // Deleted by hand: said so, and not recreated.
    api.remove(&graph_path("small"));
    pass(&client, &api, "small").await;
    let s = status(&api, "small");
    assert_eq!(s["phase"], "Ready");
    assert_eq!(
        condition(&s, "DeploymentReady")["reason"],
        "DeploymentDeleted"
    );
    pass(&client, &api, "small").await;
    assert!(api.object(&graph_path("small")).is_none());
    api.assert_rbac_allows_all();
}

#[tokio::test]
async fn a_request_no_layout_serves_fails_saying_what_is_out_of_reach() {
    let (client, api) = FakeApi::start();
    submit(
        &api,
        "fast",
        "{model: Qwen/Qwen3-0.6B, hardware: {totalGpus: 1}, \
         workload: {isl: 1000, osl: 100, requestRate: 1}, sla: {ttft: 0.5, itl: 20}}",
    );
    assert_eq!(pass(&client, &api, "fast").await, Action::await_change());
    let s = status(&api, "fast");
    assert_eq!(s["phase"], "Failed");
    let profiling = condition(&s, "Profiling");
    assert_eq!(profiling["status"], "False");
    assert_eq!(profiling["reason"], "SLAUnreachable");
    let message = profiling["message"].as_str().unwrap();
    assert!(
        message.contains("the TTFT target of 0.5 ms is out of reach"),
        "{message}"
    );
    assert!(message.contains("the best,"), "{message}");
    assert!(events(&api.requests()).contains(&"SLAUnreachable".to_string()));
    assert!(api.object(&graph_path("fast")).is_none());
}

#[tokio::test]
async fn invalid_requests_fail_validation_with_what_is_wrong() {
    let cases = [
        (
            "{model: acme/secret-model, workload: {requestRate: 1}}",
            "is not in the built-in catalog",
        ),
        (
            "{model: Qwen/Qwen3-0.6B, workload: {isl: 40000, osl: 1000, requestRate: 1}}",
            "more than Qwen/Qwen3-0.6B's context of 40960 tokens",
        ),
        (
            "{model: Qwen/Qwen3-0.6B, hardware: {totalGpus: 0}, workload: {requestRate: 1}}",
            "hardware.totalGpus is 0",
        ),
        // Refused for its spec before its calibration is looked for.
        (
            "{model: Qwen/Qwen3-0.6B, hardware: {totalGpus: 0}, workload: {requestRate: 1}, \
             profilingConfig: {calibrationRef: {name: absent}}}",
            "hardware.totalGpus is 0",
        ),
    ];
    for (spec, expected) in cases {
        let (client, api) = FakeApi::start();
        submit(&api, "bad", spec);
        assert_eq!(pass(&client, &api, "bad").await, Action::await_change());
        let s = status(&api, "bad");
        assert_eq!(s["phase"], "Failed", "{spec}");
        let validation = condition(&s, "Validation");
        assert_eq!(validation["reason"], "ValidationFailed");
        let message = validation["message"].as_str().unwrap();
        assert!(message.contains(expected), "{spec}: {message}");
        assert!(events(&api.requests()).contains(&"ValidationFailed".to_string()));
        assert!(s["profilingResults"].is_null());
    }
}

#[tokio::test]
async fn a_model_from_a_config_map_waits_for_the_map_then_profiles() {
    let (client, api) = FakeApi::start();
    submit(
        &api,
        "private",
        "{model: acme/tiny, backend: mocker, modelConfigRef: {name: tiny-config}, \
         hardware: {totalGpus: 1}, workload: {isl: 500, osl: 50, requestRate: 1}, \
         sla: {ttft: 1000, itl: 50}}",
    );
    assert_eq!(
        pass(&client, &api, "private").await,
        Action::requeue(Duration::from_secs(30))
    );
    let s = status(&api, "private");
    assert_eq!(s["phase"], "Pending");
    let validation = condition(&s, "Validation");
    assert_eq!(validation["reason"], "ModelConfigNotFound");
    assert!(
        validation["message"]
            .as_str()
            .unwrap()
            .contains("tiny-config")
    );

    // A Qwen3-0.6B-shaped config.json under another name.
    let config = json!({
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "num_hidden_layers": 28, "vocab_size": 151936, "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16", "tie_word_embeddings": true
    });
    api.put(
        &path("v1", NS, "configmaps", "tiny-config"),
        json!({"metadata": {"name": "tiny-config", "namespace": NS},
               "data": {"config.json": config.to_string()}}),
    );
    pass(&client, &api, "private").await;
    let s = status(&api, "private");
    assert_eq!(s["phase"], "Deploying", "{s}");
    assert!(api.object(&graph_path("private")).is_some());
}

/// The predicted ITL of a profiled request's Profiling condition, ms.
fn predicted_itl_ms(status: &Value) -> f64 {
    let message = condition(status, "Profiling")["message"]
        .as_str()
        .unwrap()
        .to_owned();
    let itl = message.split("ITL ").nth(1).expect("an ITL in the message");
    itl.split(' ').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_request_profiles_on_its_calibration_and_waits_while_it_is_missing_or_wrong() {
    let (client, api) = FakeApi::start();
    submit(&api, "built-in", &format!("{SMALL}}}"));
    submit(
        &api,
        "calibrated",
        &format!(
            "{SMALL}, profilingConfig: {{calibrationRef: {{name: h100-qwen}}, profilerImage: kept}}}}"
        ),
    );
    pass(&client, &api, "built-in").await;
    let built_in = status(&api, "built-in");
    assert_eq!(built_in["phase"], "Deploying", "{built_in}");

    // No ConfigMap yet: the request waits, saying which field names it.
    assert_eq!(
        pass(&client, &api, "calibrated").await,
        Action::requeue(Duration::from_secs(30))
    );
    let waiting = |api: &FakeApi| {
        let s = status(api, "calibrated");
        assert_eq!(s["phase"], "Pending", "{s}");
        let validation = condition(&s, "Validation");
        assert_eq!(validation["reason"], "CalibrationUnusable");
        validation["message"].as_str().unwrap().to_owned()
    };
    let message = waiting(&api);
    assert!(
        message.contains("h100-qwen") && message.contains("spec.profilingConfig.calibrationRef"),
        "{message}"
    );

    let put = |file: &str| {
        api.put(
            &path("v1", NS, "configmaps", "h100-qwen"),
            json!({"metadata": {"name": "h100-qwen", "namespace": NS},
                   "data": {"calibration.yaml": file}}),
        )
    };
    // A measurement out of bounds: refused, naming the point's field.
    put(
        "{gpu: H100_SXM, model: Qwen/Qwen3-8B, tp: 1, points: [{isl: 1000, osl: 100, \
         concurrency: 1, ttft_ms: -1}]}",
    );
    pass(&client, &api, "calibrated").await;
    let message = waiting(&api);
    assert!(message.contains("points[0].ttft_ms"), "{message}");

    // Factors a fit printed (a slower engine than the built-in constants): profiled on them.
    put("{gpu: H100_SXM, model: Qwen/Qwen3-8B, tp: 1, \
         efficiency: {compute: 0.25, memory: 0.4, step_overhead_ms: 6}}");
    pass(&client, &api, "calibrated").await;
    let calibrated = status(&api, "calibrated");
    assert_eq!(calibrated["phase"], "Deploying", "{calibrated}");
    let (a, b) = (predicted_itl_ms(&built_in), predicted_itl_ms(&calibrated));
    assert!(b > 1.5 * a, "ITL {a} ms built in, {b} ms calibrated");
    // Dynamo's other profilingConfig fields are kept.
    let stored = api.object(&request_path("calibrated")).unwrap();
    assert_eq!(stored["spec"]["profilingConfig"]["profilerImage"], "kept");
}

#[tokio::test]
async fn a_graph_of_the_same_name_that_the_request_does_not_own_is_left_alone() {
    let (client, api) = FakeApi::start();
    let mut theirs = common::sample("agg-mocker");
    theirs.metadata.name = Some("small".into());
    api.put(&graph_path("small"), serde_json::to_value(&theirs).unwrap());
    submit(&api, "small", &format!("{SMALL}}}"));
    pass(&client, &api, "small").await;
    let s = status(&api, "small");
    assert_eq!(s["phase"], "Failed");
    let message = condition(&s, "DeploymentReady")["message"].clone();
    assert!(
        message
            .as_str()
            .unwrap()
            .contains("was not generated by this request")
    );
    let graph = api.object(&graph_path("small")).unwrap();
    assert!(graph["metadata"]["ownerReferences"].is_null(), "{graph}");
    assert!(
        !api.requests()
            .iter()
            .any(|r| r.path == graph_path("small") && r.method == "PATCH"),
        "their graph was not written"
    );
}
