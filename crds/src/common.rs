//! Building blocks shared by the custom resources.
//!
//! Field names and shapes follow Dynamo's v1alpha1 Go types
//! (`deploy/operator/api/v1alpha1/common.go` and `topology_types.go` in ai-dynamo/dynamo),
//! so Dynamo's published manifests deserialize unchanged.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, LocalObjectReference, PodSecurityContext, ResourceClaim, Toleration,
    TopologySpreadConstraint, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Fields we accept and keep but do not act on. Serialized back exactly as read, so a
/// manifest written for Dynamo round-trips; the schema object holding this map carries
/// `x-kubernetes-preserve-unknown-fields: true` (kube rewrites `flatten` that way).
pub type PreservedFields = BTreeMap<String, Value>;

/// Kubernetes' rules for object names, label keys and label values, as
/// k8s.io/apimachinery `pkg/util/validation` (`validation.go`) defines them: the API server
/// refuses an object whose name, namespace or labels break them. The validator checks a
/// manifest's own metadata with them, and the operator every name it generates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// `IsDNS1123Label`: at most 63 characters, lower-case alphanumerics and '-', starting
    /// and ending with an alphanumeric. Namespaces (`ValidateNamespaceName`), a pod's
    /// `hostname` and `subdomain`.
    Dns1123Label,
    /// `IsDNS1123Subdomain`: at most 253 characters, DNS-1123 labels joined by '.'. Names of
    /// custom resources (the apiextensions-apiserver's `NameIsDNSSubdomain`), pods,
    /// Deployments, ServiceAccounts.
    Dns1123Subdomain,
    /// `IsDNS1035Label`: a DNS-1123 label that starts with a letter. Service names
    /// (`ValidateServiceName = NameIsDNS1035Label` in k8s.io/kubernetes
    /// `pkg/apis/core/validation`).
    Dns1035Label,
    /// `IsQualifiedName`: label and annotation keys, `[prefix/]name` with a DNS-1123
    /// subdomain prefix and a name of at most 63 alphanumerics, '-', '_' and '.', starting
    /// and ending with an alphanumeric.
    QualifiedName,
    /// `IsValidLabelValue`: empty, or at most 63 alphanumerics, '-', '_' and '.', starting
    /// and ending with an alphanumeric.
    LabelValue,
}

/// Longest DNS label (RFC 1123, `DNS1123LabelMaxLength`), label value and key name part.
const LABEL_MAX: usize = 63;
/// Longest DNS subdomain (`DNS1123SubdomainMaxLength`).
const SUBDOMAIN_MAX: usize = 253;

/// A value that breaks a [`NameRule`]; displays as `"value" is not a valid <rule>: <why> (<rule text>)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameError {
    pub rule: NameRule,
    /// The value, quoted and escaped, shortened when long.
    pub value: String,
    /// What in the value breaks the rule.
    pub reason: String,
}

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is not a valid {}: {} ({})",
            self.value,
            self.rule.name(),
            self.reason,
            self.rule.requirement()
        )
    }
}

impl NameRule {
    /// The rule's name as Kubernetes' messages use it.
    pub fn name(self) -> &'static str {
        match self {
            NameRule::Dns1123Label => "DNS-1123 label",
            NameRule::Dns1123Subdomain => "DNS-1123 subdomain",
            NameRule::Dns1035Label => "DNS-1035 label",
            NameRule::QualifiedName => "label or annotation key",
            NameRule::LabelValue => "label value",
        }
    }

    fn requirement(self) -> &'static str {
        match self {
            NameRule::Dns1123Label => {
                "at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit"
            }
            NameRule::Dns1123Subdomain => {
                "at most 253 lower-case letters, digits, '-' and '.', each part between dots starting and ending with a letter or digit"
            }
            NameRule::Dns1035Label => {
                "at most 63 lower-case letters, digits and '-', starting with a letter and ending with a letter or digit"
            }
            NameRule::QualifiedName => {
                "[prefix/]name: an optional DNS-1123 subdomain prefix, and a name of at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
            }
            NameRule::LabelValue => {
                "empty, or at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
            }
        }
    }

    /// Whether `value` obeys the rule; the error says what breaks it.
    pub fn check(self, value: &str) -> Result<(), NameError> {
        match self.broken_by(value) {
            None => Ok(()),
            Some(reason) => Err(NameError {
                rule: self,
                value: quoted(value),
                reason,
            }),
        }
    }

    fn broken_by(self, value: &str) -> Option<String> {
        let lower = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        let label_char = |c: char| lower(c) || c == '-';
        // A label value's and a key's name part (`qualifiedNameFmt` in apimachinery).
        let qualified = |part: &str| {
            let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            let alphanumeric = |c: char| c.is_ascii_alphanumeric();
            shape(part, LABEL_MAX, name_char, alphanumeric, alphanumeric)
        };
        match self {
            NameRule::Dns1123Label => shape(value, LABEL_MAX, label_char, lower, lower),
            NameRule::Dns1035Label => shape(
                value,
                LABEL_MAX,
                label_char,
                |c| c.is_ascii_lowercase(),
                lower,
            ),
            NameRule::Dns1123Subdomain => shape(
                value,
                SUBDOMAIN_MAX,
                |c| label_char(c) || c == '.',
                lower,
                lower,
            )
            .or_else(|| {
                value
                    .split('.')
                    .any(|part| part.is_empty() || part.starts_with('-') || part.ends_with('-'))
                    .then(|| "a '.' is next to another '.' or a '-'".to_string())
            }),
            NameRule::LabelValue if value.is_empty() => None,
            NameRule::LabelValue => qualified(value),
            NameRule::QualifiedName => {
                let (prefix, name) = match value.split_once('/') {
                    Some((prefix, name)) => (Some(prefix), name),
                    None => (None, value),
                };
                if let Some(prefix) = prefix
                    && let Err(e) = NameRule::Dns1123Subdomain.check(prefix)
                {
                    return Some(format!(
                        "its prefix {} is not a DNS-1123 subdomain: {}",
                        e.value, e.reason
                    ));
                }
                qualified(name).map(|reason| match prefix {
                    Some(_) => format!("its name part {}: {reason}", quoted(name)),
                    None => reason,
                })
            }
        }
    }
}

/// Why `value` is not a non-empty run of at most `max` bytes of `allowed` characters with
/// a `first`-allowed first and `last`-allowed last character; `None` when it is.
fn shape(
    value: &str,
    max: usize,
    allowed: impl Fn(char) -> bool,
    first: impl Fn(char) -> bool,
    last: impl Fn(char) -> bool,
) -> Option<String> {
    let (Some(head), Some(tail)) = (value.chars().next(), value.chars().next_back()) else {
        return Some("it is empty".into());
    };
    if value.len() > max {
        return Some(format!("it has {} characters", value.len()));
    }
    if let Some(c) = value.chars().find(|c| !allowed(*c)) {
        return Some(format!("it contains {c:?}"));
    }
    if !first(head) {
        return Some(format!("it starts with {head:?}"));
    }
    (!last(tail)).then(|| format!("it ends with {tail:?}"))
}

/// `value` as a quoted, escaped string (a NUL shows as `\0`); a value longer than 96
/// characters shows its first 64 and last 24, so a 300-character name does not flood the
/// message and a generated name keeps its distinguishing tail (`...-99999-wkr-1`).
fn quoted(value: &str) -> String {
    const HEAD: usize = 64;
    const TAIL: usize = 24;
    let count = value.chars().count();
    if count <= HEAD + TAIL + 8 {
        return format!("{value:?}");
    }
    let head: String = value.chars().take(HEAD).collect();
    let tail: String = value.chars().skip(count - TAIL).collect();
    format!("{head:?}...{tail:?} ({count} characters)")
}

/// Resource amounts of one kind (requests or limits), as strings the way Dynamo writes them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceItem {
    /// CPU amount, a Kubernetes quantity such as "500m" or "2".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Memory amount, a Kubernetes quantity such as "4Gi".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// Number of GPUs per pod, e.g. "1" or "8". For a multinode service the total is nodeCount times this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+$"))]
    pub gpu: Option<String>,
    /// Extended resource name of the GPU; "nvidia.com/gpu" when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Further extended resources by name, e.g. {"rdma/ib": "1"}.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<BTreeMap<String, String>>,
}

/// Requests and limits of a service's main container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// Minimum resources the scheduler reserves for each pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<ResourceItem>,
    /// Maximum resources each pod may use; `limits.gpu` is where GPUs are usually asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceItem>,
    /// Dynamic resource allocation claims of the main container (Kubernetes `ResourceClaim` entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<Vec<ResourceClaim>>,
}

impl Resources {
    /// GPUs per pod: `limits.gpu`, else `requests.gpu`; 0 when neither parses.
    pub fn gpus_per_pod(&self) -> u32 {
        let parse = |item: &Option<ResourceItem>| {
            item.as_ref()
                .and_then(|i| i.gpu.as_deref())
                .and_then(|g| g.parse::<u32>().ok())
        };
        parse(&self.limits)
            .or_else(|| parse(&self.requests))
            .unwrap_or(0)
    }
}

/// Multi-node layout of one service replica: a leader and `nodeCount - 1` workers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MultinodeSpec {
    /// Number of nodes one replica spans (at least 2). Total GPUs per replica is nodeCount times the GPU count per pod.
    #[schemars(range(min = 2))]
    pub node_count: i32,
}

/// Extra metadata put on the service's pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtraPodMetadata {
    /// Annotations added to every pod of the service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// Labels added to every pod of the service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// Pod spec overrides for a service: the usual PodSpec fields, every one optional (Dynamo
/// inlines a whole `corev1.PodSpec` here), plus `mainContainer`, merged into the container
/// named `main`. PodSpec fields not listed are accepted and passed through unchanged.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtraPodSpec {
    /// Overrides for the engine container (`main`): image, command, args, env, ports, resources...
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "main_container"
    )]
    #[schemars(schema_with = "main_container::schema")]
    pub main_container: Option<Container>,
    /// Further containers of the pod, kept as the user wrote them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "list_of_kubernetes_objects")]
    pub containers: Option<Vec<Container>>,
    /// Init containers of the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "list_of_kubernetes_objects")]
    pub init_containers: Option<Vec<Container>>,
    /// Volumes of the pod (mount them with `mainContainer.volumeMounts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "list_of_kubernetes_objects")]
    pub volumes: Option<Vec<Volume>>,
    /// Node selector labels the pod's node must carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Node and pod affinity rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Tolerations of the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Topology spread constraints of the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// Service account the pod runs as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Secrets used to pull the images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// Pod-level security settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,
    /// Seconds the pod gets to stop gracefully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub termination_grace_period_seconds: Option<i64>,
    /// PriorityClass of the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Scheduler that places the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// RuntimeClass of the pod (e.g. "nvidia").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// Use the node's network namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
    /// Use the node's IPC namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ipc: Option<bool>,
    /// DNS policy of the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_policy: Option<String>,
    /// Other PodSpec fields, passed through unchanged.
    #[serde(flatten)]
    pub other: PreservedFields,
}

/// The tmpfs mounted at /dev/shm (NCCL and engines need more than the container default).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!(has(self.disabled) && self.disabled && has(self.size))").message("size must not be set when disabled is true"))]
pub struct SharedMemorySpec {
    /// Do not mount a tmpfs at /dev/shm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// Size of the tmpfs, a quantity such as "8Gi".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Quantity>,
}

/// Whether a DynamoGraphDeploymentScalingAdapter owns the replicas of a service.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingAdapter {
    /// When true, a DGDSA is created for the service and only it changes `replicas` (an
    /// engine service of a graph with a planner gets one regardless); the planner, HPA and
    /// KEDA scale through the DGDSA's scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// A persistent volume claim, defined once in `spec.pvcs` and mounted by services via `volumeMounts`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.create) || !self.create || (has(self.size) && has(self.storageClass) && has(self.volumeAccessMode))").message("size, storageClass and volumeAccessMode are required when create is true"))]
pub struct Pvc {
    /// Name of the claim; services refer to it in `volumeMounts[].name`.
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
        length(min = 1, max = 253)
    )]
    pub name: String,
    /// Create the claim (true) or use an existing one (false or unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<bool>,
    /// StorageClass for a claim to create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    /// Size of a claim to create, e.g. "100Gi".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Quantity>,
    /// Access mode of a claim to create, e.g. "ReadWriteMany".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_access_mode: Option<String>,
}

/// Mount of a claim from `spec.pvcs` into the service's main container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    /// Name of a claim in `spec.pvcs`.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Path to mount it at; a backend default is used for a compilation cache when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_point: Option<String>,
    /// Use this volume as the engine's compilation cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_as_compilation_cache: Option<bool>,
}

/// Placement domain a service's pods are packed into.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyConstraint {
    /// Topology level to pack within, e.g. "rack", "host", or "nvlink" (node label
    /// `nvidia.com/gpu.clique`); lower-case alphanumerics and '-'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"))]
    pub pack_domain: Option<String>,
    /// Name of the ClusterTopology that defines the levels (Dynamo's `topologyProfile`), kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_profile: Option<String>,
}

/// Schema for a list of Kubernetes objects (containers, volumes) that the API server passes
/// through and the pod's own validation checks later. Inlining their full schemas would
/// make the CRD several hundred kilobytes larger for no gain.
fn list_of_kubernetes_objects(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "nullable": true,
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

/// `mainContainer` is a Kubernetes `Container` whose `name` may be left out (the operator
/// names it `main`), as in Dynamo's examples. On the Rust side a missing name reads as ""
/// and "" is not written back, so manifests round-trip.
mod main_container {
    use k8s_openapi::api::core::v1::Container;
    use schemars::JsonSchema;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub fn serialize<S: Serializer>(
        container: &Option<Container>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut value = serde_json::to_value(container).map_err(serde::ser::Error::custom)?;
        if let Some(map) = value.as_object_mut()
            && map.get("name").and_then(Value::as_str) == Some("")
        {
            map.remove("name");
        }
        value.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Container>, D::Error> {
        let mut value = Option::<Value>::deserialize(d)?;
        if let Some(Value::Object(map)) = value.as_mut() {
            map.entry("name")
                .or_insert_with(|| Value::String(String::new()));
        }
        value
            .map(|v| serde_json::from_value(v).map_err(serde::de::Error::custom))
            .transpose()
    }

    /// The Container schema without `required`.
    pub fn schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut schema = Container::json_schema(generator);
        schema.remove("required");
        schema.insert("nullable".into(), true.into());
        schema
    }
}
