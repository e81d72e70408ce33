//! The parts of the generated CRDs that clients depend on.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::Value;

use dynamo_crds::{
    DynamoGraphDeployment, DynamoGraphDeploymentRequest, DynamoGraphDeploymentScalingAdapter,
};

fn schema(crd: &CustomResourceDefinition) -> Value {
    dynamo_crds::manifests::schema_of(&crd.spec.versions[0])
}

fn column_paths(crd: &CustomResourceDefinition) -> Vec<(String, String)> {
    crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.json_path.clone()))
        .collect()
}

#[test]
fn names_scope_and_versions() {
    for (crd, plural, short, version) in [
        (
            DynamoGraphDeployment::crd(),
            "dynamographdeployments",
            "dgd",
            "v1alpha1",
        ),
        (
            DynamoGraphDeploymentScalingAdapter::crd(),
            "dynamographdeploymentscalingadapters",
            "dgdsa",
            "v1alpha1",
        ),
        (
            DynamoGraphDeploymentRequest::crd(),
            "dynamographdeploymentrequests",
            "dgdr",
            "v1beta1",
        ),
    ] {
        assert_eq!(crd.spec.group, "nvidia.com");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.plural, plural);
        assert_eq!(crd.spec.names.short_names, Some(vec![short.to_string()]));
        assert_eq!(crd.spec.versions.len(), 1);
        assert_eq!(crd.spec.versions[0].name, version);
        let subresources = crd.spec.versions[0].subresources.as_ref().unwrap();
        assert!(
            subresources.status.is_some(),
            "{plural} has the status subresource"
        );
    }
}

#[test]
fn scaling_adapter_has_the_scale_subresource() {
    let crd = DynamoGraphDeploymentScalingAdapter::crd();
    let scale = crd.spec.versions[0]
        .subresources
        .as_ref()
        .unwrap()
        .scale
        .as_ref()
        .unwrap();
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(
        scale.label_selector_path.as_deref(),
        Some(".status.selector")
    );
    let schema = schema(&crd);
    assert_eq!(
        schema["properties"]["spec"]["required"],
        serde_json::json!(["dgdRef", "replicas"])
    );
    assert_eq!(
        schema["properties"]["spec"]["properties"]["replicas"]["minimum"],
        0.0
    );
}

#[test]
fn printer_columns() {
    let dgd = column_paths(&DynamoGraphDeployment::crd());
    for expected in [
        ("State", ".status.state"),
        ("Ready", ".status.readyServices"),
        ("Age", ".metadata.creationTimestamp"),
    ] {
        assert!(
            dgd.contains(&(expected.0.into(), expected.1.into())),
            "{dgd:?}"
        );
    }
    let dgdsa = column_paths(&DynamoGraphDeploymentScalingAdapter::crd());
    assert!(
        dgdsa.contains(&("Replicas".into(), ".status.replicas".into())),
        "{dgdsa:?}"
    );
    let dgdr = column_paths(&DynamoGraphDeploymentRequest::crd());
    assert!(
        dgdr.contains(&("Phase".into(), ".status.phase".into())),
        "{dgdr:?}"
    );
}

#[test]
fn graph_schema_bounds_and_enums() {
    let schema = schema(&DynamoGraphDeployment::crd());
    let spec = &schema["properties"]["spec"]["properties"];
    assert_eq!(spec["services"]["maxProperties"], 25);
    let service = &spec["services"]["additionalProperties"];
    assert_eq!(service["x-kubernetes-preserve-unknown-fields"], true);
    assert_eq!(service["properties"]["replicas"]["minimum"], 0.0);
    assert_eq!(
        service["properties"]["multinode"]["properties"]["nodeCount"]["minimum"],
        2.0
    );
    let types: Vec<&str> = service["properties"]["componentType"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for t in ["frontend", "worker", "prefill", "decode", "planner", "epp"] {
        assert!(types.contains(&t), "{types:?}");
    }
    assert_eq!(
        spec["backendFramework"]["enum"],
        serde_json::json!(["vllm", "sglang", "trtllm", "mocker"])
    );
    assert!(
        spec["services"]["x-kubernetes-validations"]
            .as_array()
            .unwrap()
            .len()
            >= 3
    );
}

#[test]
fn every_cel_rule_has_a_message_and_compiles() {
    // Every served version of every CRD, as `make crds` writes them.
    for crd in dynamo_crds::crds() {
        for version in &crd.spec.versions {
            let kind = format!("{} {}", crd.spec.names.kind, version.name);
            let schema = dynamo_crds::manifests::schema_of(version);
            let compiled = kube_cel::compile_schema(&schema);
            assert!(
                !compiled.has_errors(),
                "{kind}: {:?}",
                compiled.compilation_errors()
            );
            let mut rules = Vec::new();
            collect_rules(&schema, &mut rules);
            assert!(!rules.is_empty(), "{kind}");
            for rule in rules {
                let message = rule["message"].as_str().unwrap_or_default();
                assert!(!message.is_empty(), "{kind}: rule without message: {rule}");
            }
        }
    }
}

#[test]
fn request_defaults() {
    let schema = schema(&DynamoGraphDeploymentRequest::crd());
    let spec = &schema["properties"]["spec"]["properties"];
    assert_eq!(spec["backend"]["default"], "auto");
    assert_eq!(spec["autoApply"]["default"], true);
    assert_eq!(spec["workload"]["properties"]["isl"]["default"], 4000);
    assert_eq!(spec["workload"]["properties"]["osl"]["default"], 1000);
    assert_eq!(
        schema["properties"]["spec"]["required"],
        serde_json::json!(["model"])
    );
}

fn collect_rules(schema: &Value, rules: &mut Vec<Value>) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                if key == "x-kubernetes-validations" {
                    rules.extend(value.as_array().into_iter().flatten().cloned());
                } else {
                    collect_rules(value, rules);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_rules(item, rules)),
        _ => {}
    }
}
