//! The openAPIV3 schemas of both versions, read from the types: which fields each version
//! declares, and the pruning the API server applies to whatever it stores or serves.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use kube::CustomResourceExt;
use serde_json::{Map, Value};

use super::Version;
use crate::manifests::schema_of;
use crate::{DynamoGraphDeployment, dgd_v1beta1};

/// The root schema (`spec`, `status`) of `version`.
pub(super) fn root(version: Version) -> &'static Value {
    static SCHEMAS: OnceLock<[Value; 2]> = OnceLock::new();
    let schemas = SCHEMAS.get_or_init(|| {
        [
            schema_of(&DynamoGraphDeployment::crd().spec.versions[0]),
            schema_of(&dgd_v1beta1::DynamoGraphDeployment::crd().spec.versions[0]),
        ]
    });
    match version {
        Version::V1alpha1 => &schemas[0],
        Version::V1beta1 => &schemas[1],
    }
}

/// The field names `version` declares in the object at `path` (a list of keywords and
/// property names leading from the root schema to it).
pub(super) fn declared(version: Version, path: &[&str]) -> BTreeSet<&'static str> {
    let node = path
        .iter()
        .try_fold(root(version), |node, step| node.get(*step));
    node.and_then(|n| n.get("properties"))
        .and_then(Value::as_object)
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// Removes the fields `schema` does not declare where it does not preserve unknown fields,
/// as the API server prunes a custom resource (apiextensions "structural schema" pruning).
pub(super) fn prune(object: &mut Map<String, Value>, schema: &Value) {
    let properties = schema.get("properties").and_then(Value::as_object);
    let preserves = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let additional = schema.get("additionalProperties").filter(|s| s.is_object());
    object.retain(|key, value| {
        let child = properties.and_then(|p| p.get(key)).or(additional);
        match child {
            Some(child) => {
                prune_value(value, child);
                true
            }
            None => preserves,
        }
    });
}

fn prune_value(value: &mut Value, schema: &Value) {
    match value {
        Value::Object(map) => prune(map, schema),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    prune_value(item, item_schema);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prunes_what_a_closed_object_does_not_declare() {
        let schema = json!({"properties": {
            "closed": {"type": "object", "properties": {"a": {"type": "string"}}},
            "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                     "properties": {"inner": {"type": "object", "properties": {}}}},
            "map": {"type": "object", "additionalProperties": {"type": "object", "properties": {"b": {}}}},
            "list": {"type": "array", "items": {"type": "object", "properties": {"c": {}}}}
        }});
        let mut object = json!({
            "closed": {"a": "x", "z": 1},
            "open": {"anything": 1, "inner": {"gone": 2}},
            "map": {"k": {"b": 1, "gone": 2}},
            "list": [{"c": 1, "gone": 2}],
            "unknown": 1
        })
        .as_object()
        .unwrap()
        .clone();
        prune(&mut object, &schema);
        assert_eq!(
            Value::Object(object),
            json!({
                "closed": {"a": "x"},
                "open": {"anything": 1, "inner": {}},
                "map": {"k": {"b": 1}},
                "list": [{"c": 1}]
            })
        );
    }

    #[test]
    fn declared_fields_come_from_the_types() {
        let service = declared(
            Version::V1alpha1,
            &[
                "properties",
                "spec",
                "properties",
                "services",
                "additionalProperties",
            ],
        );
        assert!(service.contains("extraPodSpec") && service.contains("componentType"));
        let component = declared(
            Version::V1beta1,
            &["properties", "spec", "properties", "components", "items"],
        );
        assert!(component.contains("podTemplate") && component.contains("name"));
    }
}
