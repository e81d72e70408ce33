//! Conversion of DynamoGraphDeployments between `nvidia.com/v1alpha1` and
//! `nvidia.com/v1beta1`, as the operator's conversion webhook serves it to the API server.
//!
//! Lossless both ways: converting an object to the other version and back gives the same
//! JSON, unknown fields included. Each field goes where the other version keeps the same
//! thing (`fields`); what the other version cannot hold (v1alpha1's `pvcs`, a service's
//! own `labels`, v1beta1's `frontendSidecar`, the order of `components`, ...) travels in
//! an annotation of the converted object ([`V1ALPHA1_FIELDS`] on a v1beta1 object,
//! [`V1BETA1_FIELDS`] on a v1alpha1 one), as Dynamo keeps its own in `nvidia.com/dgd-spec`.
//! Converting back reads and drops it, and restores each kept field only where the object
//! still holds what the conversion gave: a field changed since through the other version
//! keeps the change (`residue`).
//!
//! The API server stores v1alpha1 and sends the webhook a `ConversionReview` for every read
//! or write in the other version (Kubernetes "Versions in CustomResourceDefinitions":
//! webhook conversion, `apiextensions.k8s.io/v1` review).

mod fields;
mod residue;
mod schema;

use serde_json::{Map, Value};

use residue::Residue;

/// Kind the conversion applies to.
pub const KIND: &str = "DynamoGraphDeployment";

/// Annotation of a v1beta1 object that holds the fields of its v1alpha1 form that v1beta1
/// cannot express.
pub const V1ALPHA1_FIELDS: &str = "nvidia.com/dgd-v1alpha1-fields";

/// Annotation of a v1alpha1 object that holds the fields of its v1beta1 form that
/// v1alpha1 cannot express.
pub const V1BETA1_FIELDS: &str = "nvidia.com/dgd-v1beta1-fields";

/// Path of the conversion webhook on the operator's HTTPS port.
pub const WEBHOOK_PATH: &str = "/convert";

/// The operator's webhook Service of a default install (`helm install dynamo
/// charts/dynamo-platform -n dynamo-system`), which the generated CRD names. The operator
/// points the CRD at its own Service when it starts, so other namespaces work too.
pub const WEBHOOK_SERVICE: &str = "dynamo-operator-webhook";
/// Namespace of [`WEBHOOK_SERVICE`] in the generated CRD.
pub const WEBHOOK_NAMESPACE: &str = "dynamo-system";
/// Port of [`WEBHOOK_SERVICE`].
pub const WEBHOOK_SERVICE_PORT: i32 = 443;

/// The two served versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// `nvidia.com/v1alpha1`, the storage version: the `services` map.
    V1alpha1,
    /// `nvidia.com/v1beta1`: the `components` list with pod templates.
    V1beta1,
}

impl Version {
    /// The version of an `apiVersion` such as `nvidia.com/v1beta1`.
    pub fn of(api_version: &str) -> Option<Self> {
        match api_version {
            "nvidia.com/v1alpha1" => Some(Self::V1alpha1),
            "nvidia.com/v1beta1" => Some(Self::V1beta1),
            _ => None,
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1alpha1 => "nvidia.com/v1alpha1",
            Self::V1beta1 => "nvidia.com/v1beta1",
        }
    }

    fn other(self) -> Self {
        match self {
            Self::V1alpha1 => Self::V1beta1,
            Self::V1beta1 => Self::V1alpha1,
        }
    }

    /// The annotation, on an object of the other version, that holds this version's fields.
    fn fields_annotation(self) -> &'static str {
        match self {
            Self::V1alpha1 => V1ALPHA1_FIELDS,
            Self::V1beta1 => V1BETA1_FIELDS,
        }
    }
}

/// Why an object could not be converted: the field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConversionError {
    /// Dotted path of the field; empty for the object as a whole.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for ConversionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for ConversionError {}

impl ConversionError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// `object` (a DynamoGraphDeployment of either version, as JSON) in the version of
/// `desired_api_version`; unchanged when it already is.
pub fn convert(object: &Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let to = Version::of(desired_api_version).ok_or_else(|| {
        ConversionError::new(
            "",
            format!(
                "cannot convert to {desired_api_version:?}; the versions are nvidia.com/v1alpha1 and nvidia.com/v1beta1"
            ),
        )
    })?;
    let Value::Object(object) = object else {
        return Err(ConversionError::new("", "an object must be a JSON object"));
    };
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != KIND {
        return Err(ConversionError::new(
            "kind",
            format!("only {KIND} objects are converted, not {kind:?}"),
        ));
    }
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let from = Version::of(api_version).ok_or_else(|| {
        ConversionError::new("apiVersion", format!("unknown version {api_version:?}"))
    })?;
    if from == to {
        return Ok(Value::Object(object.clone()));
    }

    let mut metadata = match object.get("metadata") {
        Some(Value::Object(metadata)) => metadata.clone(),
        None => Map::new(),
        Some(_) => return Err(ConversionError::new("metadata", "must be a mapping")),
    };
    let kept = take_annotation(&mut metadata, to.fields_annotation());
    // An object never carries its own version's fields; such an annotation is stale.
    take_annotation(&mut metadata, from.fields_annotation());
    let body: Map<String, Value> = object
        .iter()
        .filter(|(key, _)| !matches!(key.as_str(), "apiVersion" | "kind" | "metadata"))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();

    let mut converted = normalize(to, convert_body(from, &body)?)?;
    // An annotation that does not parse (edited by hand) restores nothing.
    if let Some(kept) = kept.and_then(|text| serde_json::from_str::<Residue>(&text).ok()) {
        kept.restore(&mut converted);
    }
    let converted = denormalize(to, converted);
    let back = normalize(from, convert_body(to, &converted)?)?;
    let residue = Residue::between(&back, &normalize(from, body)?);
    if !residue.is_empty() {
        let text = serde_json::to_string(&residue).expect("a residue serializes");
        annotations(&mut metadata).insert(from.fields_annotation().into(), text.into());
    }

    let mut out = Map::new();
    out.insert("apiVersion".into(), to.api_version().into());
    out.insert("kind".into(), KIND.into());
    out.insert("metadata".into(), Value::Object(metadata));
    out.extend(converted);
    Ok(Value::Object(out))
}

fn convert_body(
    from: Version,
    body: &Map<String, Value>,
) -> Result<Map<String, Value>, ConversionError> {
    match from {
        Version::V1alpha1 => fields::to_beta(body),
        Version::V1beta1 => fields::to_alpha(body),
    }
}

fn annotations(metadata: &mut Map<String, Value>) -> &mut Map<String, Value> {
    let entry = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    entry.as_object_mut().expect("just made an object")
}

/// Removes annotation `key` and returns its value; an emptied `annotations` goes too (the
/// API server never stores an empty map).
fn take_annotation(metadata: &mut Map<String, Value>, key: &str) -> Option<String> {
    let annotations = metadata.get_mut("annotations")?.as_object_mut()?;
    let value = annotations.remove(key);
    if annotations.is_empty() {
        metadata.remove("annotations");
    }
    value.and_then(|v| v.as_str().map(str::to_string))
}

/// v1beta1's `spec.components` list as `{"items": {name: component}, "order": [name]}`,
/// so the residue follows each component by name (its position is kept apart, in
/// `order`) rather than comparing the whole list.
fn normalize(
    version: Version,
    mut body: Map<String, Value>,
) -> Result<Map<String, Value>, ConversionError> {
    if version == Version::V1alpha1 {
        return Ok(body);
    }
    let Some(Value::Object(spec)) = body.get_mut("spec") else {
        return Ok(body);
    };
    let Some(Value::Array(components)) = spec.remove("components") else {
        return Ok(body);
    };
    let mut items = Map::new();
    let mut order = Vec::new();
    for (i, component) in components.into_iter().enumerate() {
        let Some(name) = component
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return Err(ConversionError::new(
                format!("spec.components[{i}].name"),
                "required",
            ));
        };
        if items.insert(name.clone(), component).is_some() {
            return Err(ConversionError::new(
                format!("spec.components[{i}].name"),
                format!("two components are named {name:?}"),
            ));
        }
        order.push(Value::String(name));
    }
    spec.insert(
        "components".into(),
        serde_json::json!({ "items": items, "order": order }),
    );
    Ok(body)
}

/// The inverse of [`normalize`]: components in `order`, any it does not name after them
/// by name.
fn denormalize(version: Version, mut body: Map<String, Value>) -> Map<String, Value> {
    if version == Version::V1alpha1 {
        return body;
    }
    let Some(Value::Object(spec)) = body.get_mut("spec") else {
        return body;
    };
    let Some(Value::Object(mut normalized)) = spec.remove("components") else {
        return body;
    };
    let mut items = match normalized.remove("items") {
        Some(Value::Object(items)) => items,
        _ => Map::new(),
    };
    let mut components = Vec::new();
    for name in normalized
        .get("order")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(component) = name.as_str().and_then(|n| items.remove(n)) {
            components.push(component);
        }
    }
    components.extend(items.into_iter().map(|(_, component)| component));
    spec.insert("components".into(), Value::Array(components));
    body
}
