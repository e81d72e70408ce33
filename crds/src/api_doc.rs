//! The API reference (docs/api.md), rendered from the generated openAPIV3 schemas so it
//! always says what the API server enforces.

use std::fmt::Write;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use serde_json::Value;

use crate::manifests::{crds, schema_of};

/// Fields whose type is a Kubernetes API type: documented by name, not field by field
/// (their own reference is `kubectl explain` / the Kubernetes API docs).
const KUBERNETES_TYPES: &[(&str, &str)] = &[
    ("mainContainer", "core/v1 Container (name optional)"),
    ("livenessProbe", "core/v1 Probe"),
    ("readinessProbe", "core/v1 Probe"),
    ("envs", "[]core/v1 EnvVar"),
    ("env", "[]core/v1 EnvVar"),
    ("configMapRef", "core/v1 ConfigMapKeySelector"),
    ("affinity", "core/v1 Affinity"),
    ("tolerations", "[]core/v1 Toleration"),
    (
        "topologySpreadConstraints",
        "[]core/v1 TopologySpreadConstraint",
    ),
    ("imagePullSecrets", "[]core/v1 LocalObjectReference"),
    ("securityContext", "core/v1 PodSecurityContext"),
    ("claims", "[]core/v1 ResourceClaim"),
    ("conditions", "[]meta/v1 Condition"),
    ("lastScaleTime", "meta/v1 Time"),
];

/// The API reference (docs/api.md): every field of the three resources with its type,
/// whether it is required, its default, bounds or allowed values and description, and
/// every CEL rule.
pub fn api_reference_markdown() -> String {
    let mut out = String::new();
    out.push_str("<!-- Generated from crds/src by `make crds` (dynamo crds). Do not edit. -->\n\n");
    out.push_str("# API reference\n\n");
    out.push_str(
        "Custom resources of group `nvidia.com`, all namespaced. Field paths use `<name>` for \
         map keys and `[]` for list items. Constraints and rules are enforced by the API server \
         (and by `dynamo validate -f FILE`, which applies the same schema). Fields marked \
         *preserves unknown fields* also accept and keep fields not listed here, so manifests \
         written for NVIDIA Dynamo apply unchanged.\n\n",
    );
    let crds = crds();
    for crd in &crds {
        for version in &crd.spec.versions {
            let title = title(crd, version);
            let _ = writeln!(out, "- [{title}](#{})", anchor(&title));
        }
    }
    for crd in &crds {
        for version in &crd.spec.versions {
            render_version(&mut out, crd, version);
        }
    }
    out
}

/// `Kind`, or `Kind vN` for each version of a CRD that serves several.
fn title(crd: &CustomResourceDefinition, version: &CustomResourceDefinitionVersion) -> String {
    if crd.spec.versions.len() > 1 {
        format!("{} {}", crd.spec.names.kind, version.name)
    } else {
        crd.spec.names.kind.clone()
    }
}

/// The anchor GitHub gives a heading.
fn anchor(title: &str) -> String {
    title.to_lowercase().replace(' ', "-")
}

fn render_version(
    out: &mut String,
    crd: &CustomResourceDefinition,
    version: &CustomResourceDefinitionVersion,
) {
    let schema = schema_of(version);
    let names = &crd.spec.names;
    let _ = writeln!(out, "\n## {}\n", title(crd, version));
    let _ = writeln!(
        out,
        "{}\n",
        one_line(schema["description"].as_str().unwrap_or_default())
    );
    let stored = if crd.spec.versions.len() > 1 && version.storage {
        " (the storage version)"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "- API version: `{}/{}`{stored}",
        crd.spec.group, version.name
    );
    let _ = writeln!(
        out,
        "- Plural: `{}`; short names: {}",
        names.plural,
        code_list(names.short_names.iter().flatten())
    );
    let mut subresources = vec!["status".to_string()];
    if let Some(scale) = version.subresources.as_ref().and_then(|s| s.scale.as_ref()) {
        subresources.push(format!(
            "scale (spec replicas `{}`, status replicas `{}`, selector `{}`)",
            scale.spec_replicas_path,
            scale.status_replicas_path,
            scale.label_selector_path.as_deref().unwrap_or("-")
        ));
    }
    let _ = writeln!(out, "- Subresources: {}", subresources.join(", "));
    let columns: Vec<String> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| format!("{} (`{}`)", c.name, c.json_path))
        .collect();
    let _ = writeln!(out, "- `kubectl get` columns: {}", columns.join(", "));

    let mut rows = Vec::new();
    let mut rules = Vec::new();
    for part in ["spec", "status"] {
        let node = &schema["properties"][part];
        let required = schema["required"]
            .as_array()
            .is_some_and(|r| r.iter().any(|v| v == part));
        walk(part, node, required, &mut rows, &mut rules);
    }
    out.push_str("\n### Fields\n\n| Field | Type | Required | Default | Constraints | Description |\n|---|---|---|---|---|---|\n");
    for row in rows {
        out.push_str(&row);
    }
    out.push_str("\n### Validation rules (CEL)\n\n");
    if rules.is_empty() {
        out.push_str("None beyond the field constraints above.\n");
    } else {
        out.push_str("| Applies to | Rule | Message |\n|---|---|---|\n");
        for rule in rules {
            out.push_str(&rule);
        }
    }
}

/// Adds a table row for the field at `path` and recurses into its children.
fn walk(path: &str, node: &Value, required: bool, rows: &mut Vec<String>, rules: &mut Vec<String>) {
    let field_name = path
        .rsplit('.')
        .next()
        .unwrap_or(path)
        .trim_end_matches("[]");
    let kubernetes_type = KUBERNETES_TYPES
        .iter()
        .find(|(name, _)| *name == field_name)
        .map(|(_, t)| *t);
    let type_name = kubernetes_type.map_or_else(|| type_of(node), str::to_string);
    let default = node
        .get("default")
        .map_or(String::new(), |d| format!("`{d}`"));
    rows.push(format!(
        "| `{path}` | {type_name} | {} | {default} | {} | {} |\n",
        if required { "yes" } else { "" },
        escape(&constraints(node)),
        escape(&one_line(node["description"].as_str().unwrap_or_default())),
    ));
    for rule in node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        rules.push(format!(
            "| `{path}` | `{}` | {} |\n",
            escape(rule["rule"].as_str().unwrap_or_default()),
            escape(rule["message"].as_str().unwrap_or_default())
        ));
    }
    if kubernetes_type.is_some() {
        return;
    }
    if let Some(properties) = node["properties"].as_object() {
        let required: Vec<&str> = node["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        for (name, child) in properties {
            walk(
                &format!("{path}.{name}"),
                child,
                required.contains(&name.as_str()),
                rows,
                rules,
            );
        }
    }
    if let Some(values) = node.get("additionalProperties").filter(|v| v.is_object()) {
        walk_children(&format!("{path}.<name>"), values, rows, rules);
    }
    if let Some(items) = node.get("items").filter(|v| v.is_object()) {
        walk_children(&format!("{path}[]"), items, rows, rules);
    }
}

/// Children of a map value or list item (the value itself is already described by its parent's type).
fn walk_children(path: &str, node: &Value, rows: &mut Vec<String>, rules: &mut Vec<String>) {
    let has_children =
        node.get("properties").is_some() || node.get("x-kubernetes-validations").is_some();
    if has_children {
        walk(path, node, false, rows, rules);
    }
}

fn type_of(node: &Value) -> String {
    if node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return "quantity (int or string)".into();
    }
    match node["type"].as_str() {
        Some("array") => format!("[]{}", type_of(&node["items"])),
        Some("object") => match node.get("additionalProperties") {
            Some(values) if values.is_object() => format!("map[string]{}", type_of(values)),
            _ => "object".into(),
        },
        Some(scalar) => match node["format"].as_str() {
            Some(format) => format!("{scalar} ({format})"),
            None => scalar.into(),
        },
        None => "any".into(),
    }
}

fn constraints(node: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(values) = node["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
            .collect();
        parts.push(format!("one of: {}", code_list(values.iter())));
    }
    for (key, label) in [
        ("minimum", ">="),
        ("maximum", "<="),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("maxProperties", "max entries"),
    ] {
        if let Some(limit) = node.get(key).and_then(Value::as_f64) {
            parts.push(format!("{label} {limit}"));
        }
    }
    if let Some(pattern) = node["pattern"].as_str() {
        parts.push(format!("pattern `{pattern}`"));
    }
    if node.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        parts.push("preserves unknown fields".into());
    }
    parts.join("; ")
}

fn code_list<'a>(items: impl Iterator<Item = &'a String>) -> String {
    items
        .map(|i| format!("`{i}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn escape(text: &str) -> String {
    text.replace('|', "\\|")
}
