//! DynamoGraphDeployment v1beta1: the CRD serves it beside v1alpha1 with webhook
//! conversion, its schema refuses what Dynamo's refuses, and every v1beta1 sample is valid
//! and converts to its v1alpha1 twin in config/samples.

use std::path::{Path, PathBuf};

use dynamo_crds::conversion::{self, V1ALPHA1_FIELDS};
use dynamo_crds::dgd_v1beta1;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

fn samples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples")
}

fn v1beta1_samples() -> Vec<(String, Value)> {
    let dir = samples_dir().join("v1beta1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let value: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, value)
        })
        .collect()
}

fn schema_of(crd: &CustomResourceDefinition, version: &str) -> Value {
    dynamo_crds::manifests::schema_of(
        crd.spec
            .versions
            .iter()
            .find(|v| v.name == version)
            .unwrap(),
    )
}

/// CEL messages of the v1beta1 schema's rules that `object` breaks.
fn cel_problems(object: &Value) -> Vec<String> {
    let schema = schema_of(&dynamo_crds::manifests::graph_crd(), "v1beta1");
    let compiled = kube_cel::compile_schema(&schema);
    match kube_cel::Validator::new().validate_compiled(&compiled, object, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.as_slice().iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn the_graph_crd_serves_both_versions_and_stores_v1alpha1() {
    let crd = dynamo_crds::manifests::graph_crd();
    let versions: Vec<(&str, bool, bool)> = crd
        .spec
        .versions
        .iter()
        .map(|v| (v.name.as_str(), v.served, v.storage))
        .collect();
    assert_eq!(
        versions,
        [("v1alpha1", true, true), ("v1beta1", true, false)]
    );
    let conversion = serde_json::to_value(crd.spec.conversion.as_ref().unwrap()).unwrap();
    assert_eq!(
        conversion,
        json!({
            "strategy": "Webhook",
            "webhook": {
                "clientConfig": {"service": {
                    "name": "dynamo-operator-webhook",
                    "namespace": "dynamo-system",
                    "path": "/convert",
                    "port": 443
                }},
                "conversionReviewVersions": ["v1"]
            }
        })
    );
    let beta = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == "v1beta1")
        .unwrap();
    assert!(beta.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = beta
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.json_path.as_str())
        .collect();
    assert_eq!(
        columns,
        [
            ".status.state",
            ".status.readyComponents",
            ".spec.backendFramework",
            ".metadata.creationTimestamp"
        ]
    );
}

#[test]
fn the_v1beta1_schema_has_dynamos_bounds() {
    let schema = schema_of(&dynamo_crds::manifests::graph_crd(), "v1beta1");
    let components = &schema["properties"]["spec"]["properties"]["components"];
    assert_eq!(components["maxItems"], 25);
    assert_eq!(components["x-kubernetes-list-type"], "map");
    assert_eq!(components["x-kubernetes-list-map-keys"], json!(["name"]));
    let component = &components["items"];
    assert_eq!(component["x-kubernetes-preserve-unknown-fields"], true);
    assert_eq!(component["required"], json!(["name"]));
    assert_eq!(component["properties"]["name"]["maxLength"], 63);
    assert_eq!(component["properties"]["replicas"]["minimum"], 0.0);
    assert_eq!(component["properties"]["minAvailable"]["minimum"], 1.0);
    let types: Vec<&str> = component["properties"]["type"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        types,
        [
            "frontend", "worker", "prefill", "decode", "planner", "epp", "default"
        ]
    );
    let containers =
        &component["properties"]["podTemplate"]["properties"]["spec"]["properties"]["containers"];
    assert_eq!(containers["x-kubernetes-list-map-keys"], json!(["name"]));
}

#[test]
fn every_v1beta1_sample_is_valid_and_converts_to_its_v1alpha1_twin() {
    let samples = v1beta1_samples();
    assert!(samples.len() >= 2, "{samples:?}");
    for (name, sample) in samples {
        // Typed, and back to the same JSON: no misspelled field was dropped on the way.
        let typed: dgd_v1beta1::DynamoGraphDeployment =
            serde_json::from_value(sample.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(serde_json::to_value(&typed).unwrap(), sample, "{name}");
        assert_eq!(cel_problems(&sample), Vec::<String>::new(), "{name}");

        let alpha = conversion::convert(&sample, "nvidia.com/v1alpha1").unwrap();
        assert!(
            alpha["metadata"]["annotations"]
                .get(V1ALPHA1_FIELDS)
                .is_none()
                && alpha["metadata"]["annotations"].is_null(),
            "{name}: everything has a v1alpha1 field: {alpha:#}"
        );
        let twin_text = std::fs::read_to_string(samples_dir().join(&name)).unwrap();
        let twin: Value = serde_saphyr::from_str(&twin_text).unwrap();
        assert_eq!(alpha, twin, "{name}: {alpha:#}");
        // The v1alpha1 form passes the v1alpha1 schema (bounds, rules), as stored.
        let yaml = serde_saphyr::to_string(&alpha).unwrap();
        dynamo_crds::validate_manifest(&yaml).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            conversion::convert(&alpha, "nvidia.com/v1beta1").unwrap(),
            sample,
            "{name}"
        );
    }
}

/// A valid v1beta1 graph with one worker, changed by `edit`.
fn graph(edit: impl FnOnce(&mut Value)) -> Value {
    let mut graph = json!({
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "g"},
        "spec": {"components": [{
            "name": "worker",
            "type": "worker",
            "replicas": 2,
            "podTemplate": {"spec": {"containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": 1}}}
            ]}}
        }]}
    });
    edit(&mut graph);
    graph
}

#[test]
fn the_v1beta1_rules_refuse_what_dynamo_refuses() {
    assert_eq!(cel_problems(&graph(|_| {})), Vec::<String>::new());
    let component = |g: &mut Value| g["spec"]["components"][0].as_object_mut().unwrap().clone();
    type Edit = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "component names must be unique, compared case-insensitively",
            Box::new(move |g| {
                let mut twin = component(g);
                twin.insert("name".into(), "Worker".into());
                g["spec"]["components"]
                    .as_array_mut()
                    .unwrap()
                    .push(Value::Object(twin));
            }),
        ),
        (
            "at most one component may have type epp",
            Box::new(|g| {
                let list = g["spec"]["components"].as_array_mut().unwrap();
                list.push(json!({"name": "e1", "type": "epp"}));
                list.push(json!({"name": "e2", "type": "epp"}));
            }),
        ),
        (
            "eppConfig may only be set when type is epp",
            Box::new(|g| g["spec"]["components"][0]["eppConfig"] = json!({"config": {}})),
        ),
        (
            "eppConfig needs exactly one of configMapRef and config",
            Box::new(|g| {
                g["spec"]["components"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "e", "type": "epp", "eppConfig": {}}));
            }),
        ),
        (
            "minAvailable must be at most replicas",
            Box::new(|g| g["spec"]["components"][0]["minAvailable"] = json!(3)),
        ),
        (
            "frontendSidecar must name a container of podTemplate.spec.containers",
            Box::new(|g| g["spec"]["components"][0]["frontendSidecar"] = json!("sidecar-frontend")),
        ),
        (
            "every container but main must set image",
            Box::new(|g| {
                g["spec"]["components"][0]["podTemplate"]["spec"]["containers"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "helper"}));
            }),
        ),
        (
            "multinode requires GPUs",
            Box::new(|g| {
                g["spec"]["components"][0]["multinode"] = json!({"nodeCount": 2});
                g["spec"]["components"][0]["podTemplate"]["spec"]["containers"][0]["resources"] =
                    json!({"limits": {"cpu": "4"}});
            }),
        ),
    ];
    for (expected, edit) in cases {
        let problems = cel_problems(&graph(edit));
        assert!(
            problems.iter().any(|p| p.contains(expected)),
            "expected {expected:?}, got {problems:?}"
        );
    }
    let multinode = graph(|g| g["spec"]["components"][0]["multinode"] = json!({"nodeCount": 2}));
    assert_eq!(cel_problems(&multinode), Vec::<String>::new());
}

#[test]
fn scaling_adapters_accept_dynamos_service_name_and_the_older_spelling() {
    let adapter = |dgd_ref: Value| {
        format!(
            "apiVersion: nvidia.com/v1alpha1\nkind: DynamoGraphDeploymentScalingAdapter\nmetadata:\n  name: a\nspec:\n  replicas: 2\n  dgdRef: {dgd_ref}\n"
        )
    };
    for dgd_ref in [
        json!({"name": "g", "serviceName": "VllmWorker"}),
        json!({"name": "g", "service": "VllmWorker"}),
    ] {
        let validated = dynamo_crds::validate_manifest(&adapter(dgd_ref.clone()))
            .unwrap_or_else(|e| panic!("{dgd_ref}: {e}"));
        let parsed = validated.scaling_adapters().next().unwrap();
        assert_eq!(parsed.spec.dgd_ref.service, "VllmWorker");
        // Written back in Dynamo's spelling.
        assert_eq!(
            serde_json::to_value(&parsed.spec.dgd_ref).unwrap(),
            json!({"name": "g", "serviceName": "VllmWorker"})
        );
    }
    for dgd_ref in [
        json!({"name": "g", "serviceName": "a", "service": "a"}),
        json!({"name": "g"}),
    ] {
        let err = dynamo_crds::validate_manifest(&adapter(dgd_ref.clone())).unwrap_err();
        assert!(
            err.to_string()
                .contains("spec.dgdRef: dgdRef needs serviceName"),
            "{dgd_ref}: {err}"
        );
    }
}
