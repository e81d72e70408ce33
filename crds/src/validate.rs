//! Checks a manifest the way the API server would check it against our CRDs, without a
//! cluster: `dynamo validate -f FILE` and the local runner use this.
//!
//! For each YAML document: pick the CRD from `apiVersion`/`kind`, apply the schema's
//! defaults, check the object against the structural openAPIV3 schema (types, enums,
//! bounds, patterns, required and unknown fields, as `kubectl apply`'s strict field
//! validation does), check the metadata as the API server checks every object's (name,
//! namespace, label and annotation keys and values, with [`NameRule`]), evaluate the CEL
//! rules (`x-kubernetes-validations`) with kube-cel, then deserialize it into the typed
//! resource. Every problem is reported, each with the path of the field it is about.

use std::fmt;
use std::sync::OnceLock;

use jsonschema::JsonType;
use jsonschema::error::{TypeKind, ValidationErrorKind};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::common::NameRule;
use crate::{
    DynamoGraphDeployment, DynamoGraphDeploymentRequest, DynamoGraphDeploymentScalingAdapter,
};

/// One object that passed validation, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum DynamoObject {
    /// A `DynamoGraphDeployment`.
    GraphDeployment(Box<DynamoGraphDeployment>),
    /// A `DynamoGraphDeploymentScalingAdapter`.
    ScalingAdapter(Box<DynamoGraphDeploymentScalingAdapter>),
    /// A `DynamoGraphDeploymentRequest`.
    Request(Box<DynamoGraphDeploymentRequest>),
}

/// `Kind/name`, as `kubectl` names an object.
impl fmt::Display for DynamoObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn show<K: Resource<DynamicType = ()>>(f: &mut fmt::Formatter<'_>, o: &K) -> fmt::Result {
            write!(f, "{}/{}", K::kind(&()), o.name_any())
        }
        match self {
            Self::GraphDeployment(o) => show(f, o.as_ref()),
            Self::ScalingAdapter(o) => show(f, o.as_ref()),
            Self::Request(o) => show(f, o.as_ref()),
        }
    }
}

/// Every object of a manifest, in document order, after validation (with schema defaults applied).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Validated {
    /// The objects, one per non-empty YAML document.
    pub objects: Vec<DynamoObject>,
}

impl Validated {
    /// The DynamoGraphDeployments of the manifest.
    pub fn graph_deployments(&self) -> impl Iterator<Item = &DynamoGraphDeployment> {
        self.objects.iter().filter_map(|o| match o {
            DynamoObject::GraphDeployment(d) => Some(d.as_ref()),
            _ => None,
        })
    }

    /// The DynamoGraphDeploymentScalingAdapters of the manifest.
    pub fn scaling_adapters(&self) -> impl Iterator<Item = &DynamoGraphDeploymentScalingAdapter> {
        self.objects.iter().filter_map(|o| match o {
            DynamoObject::ScalingAdapter(a) => Some(a.as_ref()),
            _ => None,
        })
    }

    /// The DynamoGraphDeploymentRequests of the manifest.
    pub fn requests(&self) -> impl Iterator<Item = &DynamoGraphDeploymentRequest> {
        self.objects.iter().filter_map(|o| match o {
            DynamoObject::Request(r) => Some(r.as_ref()),
            _ => None,
        })
    }
}

/// One thing wrong with one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based index of the YAML document.
    pub document: usize,
    /// `kind/name` of the object, when it has them.
    pub object: Option<String>,
    /// Dotted path of the field, e.g. `spec.services.decode.multinode.nodeCount`;
    /// empty for the object as a whole.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(object) = &self.object {
            write!(f, " ({object})")?;
        }
        if self.path.is_empty() {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": {}: {}", self.path, self.message)
        }
    }
}

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    /// The text is not YAML.
    #[error("not valid YAML: {0}")]
    Yaml(String),
    /// The text holds no object.
    #[error("the manifest holds no object")]
    Empty,
    /// One or more objects break the schema or its rules.
    #[error("{}", render_problems(.0))]
    Invalid(Vec<Problem>),
}

impl ValidationError {
    /// The problems found; empty for YAML errors and empty manifests.
    pub fn problems(&self) -> &[Problem] {
        match self {
            ValidationError::Invalid(problems) => problems,
            _ => &[],
        }
    }
}

fn render_problems(problems: &[Problem]) -> String {
    let lines: Vec<String> = problems.iter().map(Problem::to_string).collect();
    lines.join("\n")
}

/// Validates one or more YAML documents holding DynamoGraphDeployment,
/// DynamoGraphDeploymentScalingAdapter or DynamoGraphDeploymentRequest objects.
pub fn validate_manifest(yaml: &str) -> Result<Validated, ValidationError> {
    validate_manifest_with(yaml, |_| Vec::new())
}

/// [`validate_manifest`], then `check` on every object that passed it: further problems
/// as `(field path, message)` pairs, reported like the schema's. The operator checks the
/// names it would generate from a graph this way.
pub fn validate_manifest_with(
    yaml: &str,
    check: impl Fn(&DynamoObject) -> Vec<(String, String)>,
) -> Result<Validated, ValidationError> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(yaml).map_err(|e| ValidationError::Yaml(e.to_string()))?;
    let mut objects = Vec::new();
    let mut problems = Vec::new();
    for (index, document) in documents.into_iter().enumerate() {
        if document.is_null() {
            continue;
        }
        match validate_object(index + 1, document) {
            Ok(object) => {
                let found = check(&object);
                let label = object.to_string();
                problems.extend(found.into_iter().map(|(path, message)| Problem {
                    document: index + 1,
                    object: Some(label.clone()),
                    path,
                    message,
                }));
                objects.push(object);
            }
            Err(mut found) => problems.append(&mut found),
        }
    }
    if !problems.is_empty() {
        return Err(ValidationError::Invalid(problems));
    }
    if objects.is_empty() {
        return Err(ValidationError::Empty);
    }
    Ok(Validated { objects })
}

/// The kinds we know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    GraphDeployment,
    ScalingAdapter,
    Request,
}

impl Kind {
    fn of(kind: &str) -> Option<Self> {
        [Kind::GraphDeployment, Kind::ScalingAdapter, Kind::Request]
            .into_iter()
            .find(|k| k.typed_api_version().1 == kind)
    }

    /// The `(apiVersion, kind)` of our Rust type of this kind: objects of the CRD's other
    /// versions are converted to it (as the API server would) once they pass their checks.
    fn typed_api_version(self) -> (String, String) {
        fn of<K: Resource<DynamicType = ()>>() -> (String, String) {
            (K::api_version(&()).into_owned(), K::kind(&()).into_owned())
        }
        match self {
            Kind::GraphDeployment => of::<DynamoGraphDeployment>(),
            Kind::ScalingAdapter => of::<DynamoGraphDeploymentScalingAdapter>(),
            Kind::Request => of::<DynamoGraphDeploymentRequest>(),
        }
    }

    fn to_object(self, value: Value) -> Result<DynamoObject, serde_json::Error> {
        fn typed<T: DeserializeOwned>(value: Value) -> Result<Box<T>, serde_json::Error> {
            serde_json::from_value(value).map(Box::new)
        }
        Ok(match self {
            Kind::GraphDeployment => DynamoObject::GraphDeployment(typed(value)?),
            Kind::ScalingAdapter => DynamoObject::ScalingAdapter(typed(value)?),
            Kind::Request => DynamoObject::Request(typed(value)?),
        })
    }
}

/// Every served version of every CRD, prepared for the checkers.
fn all_checks() -> &'static [VersionChecks] {
    static CHECKS: OnceLock<Vec<VersionChecks>> = OnceLock::new();
    CHECKS.get_or_init(|| {
        crate::manifests::crds()
            .iter()
            .flat_map(|crd| {
                crd.spec
                    .versions
                    .iter()
                    .map(|version| VersionChecks::new(crd, version))
            })
            .collect()
    })
}

/// The schema of one CRD version, prepared for both checkers.
struct VersionChecks {
    kind: Kind,
    api_version: String,
    kind_name: String,
    /// The openAPIV3 schema exactly as in the CRD (defaults, CEL rules).
    openapi: Value,
    /// The same schema as JSON Schema, for the structural check.
    structural: jsonschema::Validator,
    cel: kube_cel::CompiledSchema,
}

impl VersionChecks {
    fn new(crd: &CustomResourceDefinition, version: &CustomResourceDefinitionVersion) -> Self {
        let openapi = crate::manifests::schema_of(version);
        let structural = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft4)
            .should_validate_formats(false)
            .build(&with_object_envelope(openapi_to_json_schema(&openapi)))
            .expect("the generated schema is valid JSON Schema");
        let cel = kube_cel::compile_schema(&openapi);
        let kind_name = crd.spec.names.kind.clone();
        Self {
            kind: Kind::of(&kind_name).expect("every generated CRD is a kind we know"),
            api_version: format!("{}/{}", crd.spec.group, version.name),
            kind_name,
            openapi,
            structural,
            cel,
        }
    }
}

fn validate_object(document: usize, object: Value) -> Result<DynamoObject, Vec<Problem>> {
    let text = |key: &str| {
        object
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (api_version, kind_name) = (text("apiVersion"), text("kind"));
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(str::to_string);
    // A name the API server would refuse is reported on its own line, not repeated in
    // front of every problem.
    let shown_name = name
        .as_deref()
        .filter(|n| NameRule::Dns1123Subdomain.check(n).is_ok());
    let label = match (shown_name, kind_name.is_empty()) {
        (Some(name), false) => Some(format!("{kind_name}/{name}")),
        (None, false) => Some(kind_name.clone()),
        _ => None,
    };
    let problem = |path: String, message: String| Problem {
        document,
        object: label.clone(),
        path,
        message,
    };

    if !object.is_object() {
        return Err(vec![problem(
            String::new(),
            "must be a YAML mapping (an object)".into(),
        )]);
    }
    let Some(checks) = all_checks()
        .iter()
        .find(|c| c.kind_name == kind_name && c.api_version == api_version)
    else {
        let known: Vec<String> = all_checks()
            .iter()
            .map(|c| format!("{}/{}", c.api_version, c.kind_name))
            .collect();
        return Err(vec![problem(
            "kind".into(),
            format!(
                "unsupported apiVersion/kind {api_version:?}/{kind_name:?}; expected one of: {}",
                known.join(", ")
            ),
        )]);
    };
    // The API server defaults before it validates; so do we.
    let object = kube_cel::apply_defaults(&checks.openapi, &object);
    let mut problems = Vec::new();
    for error in checks.structural.iter_errors(&object) {
        let path = dotted_path(error.instance_path().as_str());
        for (path, message) in describe(&path, error.kind(), error.instance(), &error.to_string()) {
            problems.push(problem(path, message));
        }
    }
    for (path, message) in metadata_problems(&object) {
        problems.push(problem(path, message));
    }
    if let Err(errors) = kube_cel::Validator::new().validate_compiled(&checks.cel, &object, None) {
        for error in errors.as_slice() {
            problems.push(problem(error.field_path.clone(), error.message.clone()));
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let (typed_version, _) = checks.kind.typed_api_version();
    let object = if checks.api_version == typed_version {
        object
    } else {
        crate::conversion::convert(&object, &typed_version)
            .map_err(|e| vec![problem(String::new(), format!("cannot be converted: {e}"))])?
    };
    checks.kind.to_object(object).map_err(|e| {
        vec![problem(
            String::new(),
            format!("does not fit the {} type: {e}", checks.kind_name),
        )]
    })
}

/// A clear message (and the exact field path) for one schema error.
fn describe(
    path: &str,
    kind: &ValidationErrorKind,
    instance: &Value,
    fallback: &str,
) -> Vec<(String, String)> {
    let child = |name: &str| {
        if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        }
    };
    let one = |message: String| vec![(path.to_string(), message)];
    match kind {
        ValidationErrorKind::Required { property } => {
            vec![(
                child(property.as_str().unwrap_or_default()),
                "required field is missing".into(),
            )]
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => unexpected
            .iter()
            .map(|name| (child(name), "unknown field".to_string()))
            .collect(),
        ValidationErrorKind::Minimum { limit } => {
            one(format!("must be >= {}, got {instance}", number(limit)))
        }
        ValidationErrorKind::Maximum { limit } => {
            one(format!("must be <= {}, got {instance}", number(limit)))
        }
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            one(format!("must be > {}, got {instance}", number(limit)))
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            one(format!("must be < {}, got {instance}", number(limit)))
        }
        ValidationErrorKind::MinLength { limit } => one(format!(
            "must be at least {limit} characters long, has {}",
            characters(instance)
        )),
        ValidationErrorKind::MaxLength { limit } => one(format!(
            "must be at most {limit} characters long, has {}",
            characters(instance)
        )),
        ValidationErrorKind::MinItems { limit } => one(format!(
            "must have at least {limit} items, has {}",
            instance.as_array().map_or(0, Vec::len)
        )),
        ValidationErrorKind::MaxItems { limit } => one(format!(
            "must have at most {limit} items, has {}",
            instance.as_array().map_or(0, Vec::len)
        )),
        ValidationErrorKind::MaxProperties { limit } => one(format!(
            "must have at most {limit} entries, has {}",
            instance.as_object().map_or(0, Map::len)
        )),
        ValidationErrorKind::MinProperties { limit } => one(format!(
            "must have at least {limit} entries, has {}",
            instance.as_object().map_or(0, Map::len)
        )),
        ValidationErrorKind::Pattern { pattern } => {
            one(format!("{instance} does not match the pattern {pattern}"))
        }
        ValidationErrorKind::Enum { options } => {
            let allowed: Vec<String> = options
                .as_array()
                .map(|values| {
                    // `null` of a nullable field only stands for "not set".
                    values
                        .iter()
                        .filter(|v| !v.is_null())
                        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            one(format!(
                "unsupported value {instance}; must be one of: {}",
                allowed.join(", ")
            ))
        }
        ValidationErrorKind::Type { kind } => {
            // Written here rather than taken from jsonschema, whose text for a nullable
            // field ("is not of types \"integer\", \"null\"") reads badly; `null` is
            // left out, as above.
            let expected: Vec<JsonType> = match kind {
                TypeKind::Single(t) => vec![*t],
                TypeKind::Multiple(set) => set.iter().filter(|t| *t != JsonType::Null).collect(),
            };
            let expected: Vec<&str> = expected.into_iter().map(a_json_type).collect();
            one(format!(
                "must be {}, got {}",
                expected.join(" or "),
                a_value(instance)
            ))
        }
        _ => one(fallback.to_string()),
    }
}

/// `a string`, `an integer`, ... as a message names an expected type.
fn a_json_type(t: JsonType) -> &'static str {
    match t {
        JsonType::Array => "a list",
        JsonType::Boolean => "true or false",
        JsonType::Integer => "an integer",
        JsonType::Null => "null",
        JsonType::Number => "a number",
        JsonType::Object => "a mapping",
        JsonType::String => "a string",
    }
}

/// What a message says was found instead: scalars as written, containers by their shape.
fn a_value(value: &Value) -> String {
    match value {
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
        Value::Null => "null".into(),
        Value::String(_) => format!("the string {value}"),
        other => other.to_string(),
    }
}

fn characters(value: &Value) -> usize {
    value.as_str().map_or(0, |s| s.chars().count())
}

/// What the API server checks in every object's metadata (`ValidateObjectMeta` in
/// k8s.io/apimachinery `pkg/api/validation`): the name is a DNS-1123 subdomain (custom
/// resources), the namespace a DNS-1123 label, label keys qualified names and values
/// label values, annotation keys qualified names (checked lower-cased, as it does).
/// Wrong types are the schema check's to report.
fn metadata_problems(object: &Value) -> Vec<(String, String)> {
    let metadata = object.get("metadata");
    let field = |key: &str| metadata.and_then(|m| m.get(key));
    let map = |key: &str| field(key).and_then(Value::as_object).into_iter().flatten();
    let mut problems = Vec::new();
    if field("name").is_none() {
        problems.push(("metadata.name".into(), "required field is missing".into()));
    }
    let mut checks: Vec<(String, NameRule, String)> = Vec::new();
    if let Some(name) = field("name").and_then(Value::as_str) {
        checks.push((
            "metadata.name".into(),
            NameRule::Dns1123Subdomain,
            name.into(),
        ));
    }
    if let Some(namespace) = field("namespace").and_then(Value::as_str) {
        checks.push((
            "metadata.namespace".into(),
            NameRule::Dns1123Label,
            namespace.into(),
        ));
    }
    for (key, value) in map("labels") {
        checks.push((
            "metadata.labels".into(),
            NameRule::QualifiedName,
            key.clone(),
        ));
        if let Some(value) = value.as_str() {
            checks.push((
                format!("metadata.labels.{key}"),
                NameRule::LabelValue,
                value.into(),
            ));
        }
    }
    for (key, _) in map("annotations") {
        checks.push((
            "metadata.annotations".into(),
            NameRule::QualifiedName,
            key.to_lowercase(),
        ));
    }
    problems.extend(
        checks.into_iter().filter_map(|(path, rule, value)| {
            rule.check(&value).err().map(|e| (path, e.to_string()))
        }),
    );
    problems
}

/// A bound as people write it: `2`, not `2.0` (CRD bounds are stored as floats).
fn number(limit: &Value) -> String {
    match limit.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => limit.to_string(),
    }
}

/// `/spec/services/decode/envs/0/name` -> `spec.services.decode.envs[0].name`.
fn dotted_path(pointer: &str) -> String {
    let mut path = String::new();
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            path.push_str(&format!("[{segment}]"));
        } else {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(&segment);
        }
    }
    path
}

/// The CRD schema leaves out the fields every object has; the API server checks those
/// itself (their types here, their values in [`metadata_problems`]).
fn with_object_envelope(mut schema: Value) -> Value {
    let strings = json!({"type": "object", "additionalProperties": {"type": "string"}});
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        properties.insert("apiVersion".into(), json!({"type": "string"}));
        properties.insert("kind".into(), json!({"type": "string"}));
        properties.insert(
            "metadata".into(),
            json!({"type": "object", "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "labels": strings,
                "annotations": strings,
            }}),
        );
    }
    schema
}

/// Turns a CRD's openAPIV3 schema into the JSON Schema the API server effectively enforces:
/// `nullable: true` admits `null`, and an object with `properties` but neither
/// `additionalProperties` nor `x-kubernetes-preserve-unknown-fields` refuses unknown
/// fields (the API server would drop them; `kubectl apply` refuses them by default).
fn openapi_to_json_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out: Map<String, Value> = map
                .iter()
                .map(|(key, value)| {
                    let value = match key.as_str() {
                        // Keyword maps whose values are schemas (not schemas themselves).
                        "properties" | "definitions" => Value::Object(
                            value
                                .as_object()
                                .map(|props| {
                                    props
                                        .iter()
                                        .map(|(k, v)| (k.clone(), openapi_to_json_schema(v)))
                                        .collect()
                                })
                                .unwrap_or_default(),
                        ),
                        // Literal values, never schemas.
                        "enum" | "default" | "example" | "x-kubernetes-validations" => {
                            value.clone()
                        }
                        _ => openapi_to_json_schema(value),
                    };
                    (key.clone(), value)
                })
                .collect();
            // An integer field holds a Go int32/int64 (and our i32/i64): a larger value
            // cannot be stored, so it is refused with the bound and the field's path
            // rather than failing later without one.
            let bounds = match map.get("format").and_then(Value::as_str) {
                Some("int32") => Some((json!(i32::MIN), json!(i32::MAX))),
                Some("int64") => Some((json!(i64::MIN), json!(i64::MAX))),
                _ => None,
            };
            if let Some((min, max)) = bounds {
                out.entry("minimum").or_insert(min);
                out.entry("maximum").or_insert(max);
            }
            if map.get("nullable") == Some(&Value::Bool(true)) {
                if let Some(Value::String(kind)) = map.get("type") {
                    out.insert("type".into(), json!([kind, "null"]));
                }
                if let Some(Value::Array(values)) = out.get_mut("enum") {
                    values.push(Value::Null);
                }
            }
            let preserves_unknown =
                map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            if map.contains_key("properties")
                && !map.contains_key("additionalProperties")
                && !preserves_unknown
            {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(openapi_to_json_schema).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_becomes_dotted_path() {
        assert_eq!(
            dotted_path("/spec/services/decode/envs/0/name"),
            "spec.services.decode.envs[0].name"
        );
        assert_eq!(dotted_path(""), "");
        assert_eq!(
            dotted_path("/metadata/annotations/a~1b"),
            "metadata.annotations.a/b"
        );
    }

    #[test]
    fn nullable_admits_null_and_closed_objects_refuse_unknown_fields() {
        let schema =
            json!({"type": "object", "properties": {"a": {"type": "string", "nullable": true}}});
        let converted = openapi_to_json_schema(&schema);
        assert_eq!(
            converted["properties"]["a"]["type"],
            json!(["string", "null"])
        );
        assert_eq!(converted["additionalProperties"], json!(false));
        let open = json!({"type": "object", "properties": {}, "x-kubernetes-preserve-unknown-fields": true});
        assert!(
            openapi_to_json_schema(&open)
                .get("additionalProperties")
                .is_none()
        );
    }
}
