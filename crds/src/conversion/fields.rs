//! Field by field: where each field of one version goes in the other.
//!
//! v1alpha1 `spec.services.<name>` <-> v1beta1 `spec.components[]` with that `name`. The
//! pod-shaped v1alpha1 fields become the v1beta1 `podTemplate`, and back, the way Dynamo's
//! own conversion places them (ai-dynamo/dynamo `deploy/operator/api/dynamo/v1alpha1/
//! shared_spec_conversion.go`): `extraPodSpec` is the pod spec, `mainContainer` its
//! container `main`; `envs`, `envFromSecret`, `resources` (with `gpu` as the GPU resource)
//! and the probes are `main`'s; `extraPodMetadata` the template's metadata;
//! `componentType: worker` + `subComponentType: prefill|decode` is `type: prefill|decode`;
//! `sharedMemory` is `sharedMemorySize` ("0" when disabled); `scalingAdapter.enabled: true`
//! is `scalingAdapter: {}`; a volume mount used as compilation cache is
//! `compilationCache`; `envs` (graph) is `env`; `topologyConstraint.topologyProfile` (graph)
//! is `clusterTopologyName`; `services` status is `components`, `readyServices`
//! `readyComponents`. Fields both versions spell the same way are copied; fields neither
//! declares are copied (both keep unknown fields); the rest has no counterpart and is left
//! to the residue.

use serde_json::{Map, Value, json};

use super::{ConversionError, Version, schema};
use crate::dgd::DEFAULT_GPU_RESOURCE;

/// The container of a v1beta1 pod template the operator merges its defaults into.
const MAIN: &str = "main";

/// Graph fields both versions spell alike (Dynamo's v1alpha1 has `priorityClassName`,
/// `restart` and `experimental` too; our v1alpha1 keeps them among the unknown fields).
const SPEC_ALIKE: &[&str] = &[
    "annotations",
    "labels",
    "backendFramework",
    "priorityClassName",
    "restart",
    "experimental",
];

/// Component fields both versions spell alike (kept among v1alpha1's unknown fields).
const COMPONENT_ALIKE: &[&str] = &[
    "replicas",
    "multinode",
    "minAvailable",
    "globalDynamoNamespace",
    "modelRef",
    "eppConfig",
];

const STATUS_ALIKE: &[&str] = &["observedGeneration", "state", "conditions"];

/// v1beta1 `type` values.
const BETA_TYPES: &[&str] = &[
    "frontend", "worker", "prefill", "decode", "planner", "epp", "default",
];

type Object = Map<String, Value>;

/// The v1beta1 body (`spec`, `status`) of a v1alpha1 body.
pub(super) fn to_beta(body: &Object) -> Result<Object, ConversionError> {
    convert_body(body, Version::V1alpha1, spec_to_beta, status_to_beta)
}

/// The v1alpha1 body (`spec`, `status`) of a v1beta1 body.
pub(super) fn to_alpha(body: &Object) -> Result<Object, ConversionError> {
    convert_body(body, Version::V1beta1, spec_to_alpha, status_to_alpha)
}

fn convert_body(
    body: &Object,
    from: Version,
    spec: fn(Object) -> Result<Object, ConversionError>,
    status: fn(Object) -> Object,
) -> Result<Object, ConversionError> {
    let mut out = body.clone();
    if let Some(value) = out.remove("spec") {
        out.insert("spec".into(), Value::Object(spec(object(value, "spec")?)?));
    }
    if let Some(value) = out.remove("status") {
        out.insert(
            "status".into(),
            Value::Object(status(object(value, "status")?)),
        );
    }
    schema::prune(&mut out, schema::root(from.other()));
    Ok(out)
}

const SPEC: &[&str] = &["properties", "spec"];
const STATUS: &[&str] = &["properties", "status"];
const ALPHA_SERVICE: &[&str] = &[
    "properties",
    "spec",
    "properties",
    "services",
    "additionalProperties",
];
const BETA_COMPONENT: &[&str] = &["properties", "spec", "properties", "components", "items"];

fn spec_to_beta(mut a: Object) -> Result<Object, ConversionError> {
    let mut b = Object::new();
    if let Some(services) = a.remove("services") {
        let mut services: Vec<(String, Value)> =
            object(services, "spec.services")?.into_iter().collect();
        // Components sorted by name: a map has no order of its own to keep.
        services.sort_by(|a, b| a.0.cmp(&b.0));
        let mut components = Vec::new();
        for (name, service) in services {
            let path = format!("spec.services.{name}");
            components.push(Value::Object(component_to_beta(
                &name,
                object(service, &path)?,
            )));
        }
        if !components.is_empty() {
            b.insert("components".into(), Value::Array(components));
        }
    }
    rename(&mut a, "envs", &mut b, "env");
    if let Some(Value::Object(mut tc)) = a.remove("topologyConstraint") {
        if let Some(profile) = tc.remove("topologyProfile") {
            tc.insert("clusterTopologyName".into(), profile);
        }
        b.insert("topologyConstraint".into(), Value::Object(tc));
    }
    copy_alike(&mut a, SPEC_ALIKE, &mut b);
    copy_unknown(a, Version::V1alpha1, SPEC, &mut b);
    Ok(b)
}

fn spec_to_alpha(mut b: Object) -> Result<Object, ConversionError> {
    let mut a = Object::new();
    if let Some(components) = b.remove("components") {
        let Value::Array(components) = components else {
            return Err(ConversionError::new("spec.components", "must be a list"));
        };
        let mut services = Object::new();
        for (i, component) in components.into_iter().enumerate() {
            let path = format!("spec.components[{i}]");
            let mut component = object(component, &path)?;
            let Some(Value::String(name)) = component.remove("name") else {
                return Err(ConversionError::new(format!("{path}.name"), "required"));
            };
            if services.contains_key(&name) {
                return Err(ConversionError::new(
                    format!("{path}.name"),
                    format!("two components are named {name:?}"),
                ));
            }
            services.insert(name, Value::Object(component_to_alpha(component)));
        }
        a.insert("services".into(), Value::Object(services));
    }
    rename(&mut b, "env", &mut a, "envs");
    if let Some(Value::Object(mut tc)) = b.remove("topologyConstraint") {
        if let Some(name) = tc.remove("clusterTopologyName") {
            tc.insert("topologyProfile".into(), name);
        }
        a.insert("topologyConstraint".into(), Value::Object(tc));
    }
    copy_alike(&mut b, SPEC_ALIKE, &mut a);
    copy_unknown(b, Version::V1beta1, SPEC, &mut a);
    Ok(a)
}

fn component_to_beta(name: &str, mut s: Object) -> Object {
    let mut c = Object::new();
    c.insert("name".into(), name.into());
    let role = s.remove("componentType");
    let sub = s.remove("subComponentType");
    // A worker (or a service of no special role) with a prefill/decode sub-role is what
    // v1beta1 calls a prefill/decode component, as the reconciler reads it.
    let role = match (text(role.as_ref()), text(sub.as_ref())) {
        (None | Some("worker" | "main" | "default"), Some(sub @ ("prefill" | "decode"))) => {
            Some(sub)
        }
        (Some(role), _) if BETA_TYPES.contains(&role) => Some(role),
        _ => None,
    };
    if let Some(role) = role {
        c.insert("type".into(), role.into());
    }
    copy_alike(&mut s, COMPONENT_ALIKE, &mut c);
    if let Some(adapter) = s.remove("scalingAdapter")
        && adapter.get("enabled") == Some(&Value::Bool(true))
    {
        c.insert("scalingAdapter".into(), json!({}));
    }
    if let Some(shm) = s.remove("sharedMemory") {
        let disabled = shm.get("disabled") == Some(&Value::Bool(true));
        match (disabled, shm.get("size")) {
            (true, None) => {
                c.insert("sharedMemorySize".into(), "0".into());
            }
            (false, Some(size)) => {
                c.insert("sharedMemorySize".into(), size.clone());
            }
            _ => {}
        }
    }
    if let Some(pack) = s
        .remove("topologyConstraint")
        .and_then(|t| t.get("packDomain").cloned())
    {
        c.insert("topologyConstraint".into(), json!({ "packDomain": pack }));
    }
    let mounts = s.remove("volumeMounts");
    let cache = mounts
        .iter()
        .flat_map(list)
        .find(|m| m.get("useAsCompilationCache") == Some(&Value::Bool(true)));
    if let Some(mount) = cache {
        let mut cache = Object::new();
        copy_as(mount, "name", &mut cache, "pvcName");
        copy_as(mount, "mountPoint", &mut cache, "mountPath");
        c.insert("compilationCache".into(), Value::Object(cache));
    }
    let template = pod_template(&mut s);
    if !template.is_empty() {
        c.insert("podTemplate".into(), Value::Object(template));
    }
    copy_unknown(s, Version::V1alpha1, ALPHA_SERVICE, &mut c);
    c
}

fn component_to_alpha(mut c: Object) -> Object {
    let mut s = Object::new();
    match c.remove("type") {
        Some(Value::String(role)) if role == "prefill" || role == "decode" => {
            s.insert("componentType".into(), "worker".into());
            s.insert("subComponentType".into(), role.into());
        }
        Some(role) => {
            s.insert("componentType".into(), role);
        }
        None => {}
    }
    copy_alike(&mut c, COMPONENT_ALIKE, &mut s);
    if c.remove("scalingAdapter").is_some() {
        s.insert("scalingAdapter".into(), json!({ "enabled": true }));
    }
    if let Some(size) = c.remove("sharedMemorySize") {
        let none = size == json!("0") || size == json!(0);
        let shm = if none {
            json!({ "disabled": true })
        } else {
            json!({ "size": size })
        };
        s.insert("sharedMemory".into(), shm);
    }
    if let Some(pack) = c
        .remove("topologyConstraint")
        .and_then(|t| t.get("packDomain").cloned())
    {
        s.insert("topologyConstraint".into(), json!({ "packDomain": pack }));
    }
    if let Some(cache) = c.remove("compilationCache") {
        let mut mount = Object::new();
        copy_as(&cache, "pvcName", &mut mount, "name");
        copy_as(&cache, "mountPath", &mut mount, "mountPoint");
        mount.insert("useAsCompilationCache".into(), true.into());
        s.insert("volumeMounts".into(), json!([mount]));
    }
    if let Some(Value::Object(template)) = c.remove("podTemplate") {
        split_pod_template(template, &mut s);
    }
    copy_unknown(c, Version::V1beta1, BETA_COMPONENT, &mut s);
    s
}

/// v1alpha1's pod-shaped service fields as one v1beta1 pod template, consuming them.
fn pod_template(s: &mut Object) -> Object {
    let mut pod = match s.remove("extraPodSpec") {
        Some(Value::Object(pod)) => pod,
        _ => Object::new(),
    };
    let top = pod.remove("mainContainer");
    let mut containers: Vec<Value> = match pod.remove("containers") {
        Some(Value::Array(containers)) => containers,
        _ => Vec::new(),
    };
    // A container listed as `main` is the base `mainContainer` overrides, as the
    // reconciler merges them.
    let listed = containers
        .iter()
        .position(|c| c.get("name") == Some(&json!(MAIN)))
        .map(|i| containers.remove(i));
    let mut main = match listed {
        Some(Value::Object(base)) => base,
        _ => Object::new(),
    };
    if let Some(Value::Object(top)) = top {
        main.extend(top);
    }
    main.remove("name");

    let envs = s.remove("envs");
    if envs.is_some() || main.contains_key("env") {
        let mut env: Vec<Value> = Vec::new();
        for var in envs.iter().chain(main.get("env")).flat_map(list) {
            upsert_env(&mut env, var.clone());
        }
        main.insert("env".into(), Value::Array(env));
    }
    if let Some(Value::String(secret)) = s.remove("envFromSecret") {
        let from = main.entry("envFrom").or_insert_with(|| json!([]));
        if let Value::Array(from) = from {
            from.push(json!({ "secretRef": { "name": secret } }));
        }
    }
    if let Some(Value::Object(resources)) = s.remove("resources") {
        merge_resources(&mut main, &resources);
    }
    for probe in ["livenessProbe", "readinessProbe"] {
        if let Some(value) = s.remove(probe) {
            main.insert(probe.into(), value);
        }
    }
    if !main.is_empty() {
        let mut named = Object::new();
        named.insert("name".into(), MAIN.into());
        named.extend(main);
        containers.insert(0, Value::Object(named));
    }
    if !containers.is_empty() {
        pod.insert("containers".into(), Value::Array(containers));
    }
    let mut template = Object::new();
    if let Some(metadata) = s.remove("extraPodMetadata") {
        template.insert("metadata".into(), metadata);
    }
    if !pod.is_empty() {
        template.insert("spec".into(), Value::Object(pod));
    }
    template
}

/// The inverse of [`pod_template`]: the template's parts into v1alpha1's service fields.
fn split_pod_template(mut template: Object, s: &mut Object) {
    if let Some(metadata) = template.remove("metadata") {
        s.insert("extraPodMetadata".into(), metadata);
    }
    let Some(Value::Object(mut pod)) = template.remove("spec") else {
        return;
    };
    let containers = match pod.remove("containers") {
        Some(Value::Array(containers)) => containers,
        _ => Vec::new(),
    };
    let (mains, others): (Vec<Value>, Vec<Value>) = containers
        .into_iter()
        .partition(|c| c.get("name") == Some(&json!(MAIN)));
    // `mainContainer` is no PodSpec field: a template holding one would be misread.
    pod.remove("mainContainer");
    if let Some(Value::Object(mut main)) = mains.into_iter().next() {
        main.remove("name");
        if let Some(env) = main.remove("env") {
            s.insert("envs".into(), env);
        }
        if let Some(Value::Array(mut from)) = main.remove("envFrom") {
            if let Some(secret) = from.last().and_then(plain_secret_ref) {
                s.insert("envFromSecret".into(), secret.into());
                from.pop();
            }
            if !from.is_empty() {
                main.insert("envFrom".into(), Value::Array(from));
            }
        }
        if let Some(Value::Object(resources)) = main.remove("resources") {
            split_resources(resources, s, &mut main);
        }
        for probe in ["livenessProbe", "readinessProbe"] {
            if let Some(value) = main.remove(probe) {
                s.insert(probe.into(), value);
            }
        }
        if !main.is_empty() {
            pod.insert("mainContainer".into(), Value::Object(main));
        }
    }
    if !others.is_empty() {
        pod.insert("containers".into(), Value::Array(others));
    }
    if !pod.is_empty() {
        s.insert("extraPodSpec".into(), Value::Object(pod));
    }
}

/// The secret of an `envFrom` entry that is nothing but `secretRef: {name}`, which is what
/// v1alpha1's `envFromSecret` becomes.
fn plain_secret_ref(entry: &Value) -> Option<&str> {
    let entry = entry.as_object().filter(|e| e.len() == 1)?;
    let secret = entry
        .get("secretRef")?
        .as_object()
        .filter(|s| s.len() == 1)?;
    secret.get("name")?.as_str()
}

/// v1alpha1 `resources` over the main container's: cpu, memory, custom resources and
/// `gpu` (as `gpuType`, default [`DEFAULT_GPU_RESOURCE`]) per side, and the claims.
fn merge_resources(main: &mut Object, resources: &Object) {
    let mut merged = match main.remove("resources") {
        Some(Value::Object(existing)) => existing,
        _ => Object::new(),
    };
    for side in ["requests", "limits"] {
        let Some(Value::Object(item)) = resources.get(side) else {
            continue;
        };
        let mut amounts = match merged.remove(side) {
            Some(Value::Object(amounts)) => amounts,
            _ => Object::new(),
        };
        for name in ["cpu", "memory"] {
            if let Some(amount) = item.get(name) {
                amounts.insert(name.into(), amount.clone());
            }
        }
        if let Some(Value::Object(custom)) = item.get("custom") {
            amounts.extend(custom.clone());
        }
        if let Some(gpus) = item.get("gpu") {
            let name = text(item.get("gpuType")).unwrap_or(DEFAULT_GPU_RESOURCE);
            amounts.insert(name.into(), gpus.clone());
        }
        merged.insert(side.into(), Value::Object(amounts));
    }
    if let Some(claims) = resources.get("claims") {
        merged.insert("claims".into(), claims.clone());
    }
    if !merged.is_empty() {
        main.insert("resources".into(), Value::Object(merged));
    }
}

/// The inverse of [`merge_resources`]: the main container's requests and limits into
/// v1alpha1 `resources` (one GPU resource per side as `gpu`, the rest as `custom`).
fn split_resources(mut resources: Object, s: &mut Object, main: &mut Object) {
    let mut out = Object::new();
    for side in ["requests", "limits"] {
        let Some(Value::Object(amounts)) = resources.remove(side) else {
            continue;
        };
        let mut item = Object::new();
        let mut custom = Object::new();
        for (name, amount) in amounts {
            let Some(amount) = quantity(&amount) else {
                continue;
            };
            let is_gpu = name == DEFAULT_GPU_RESOURCE || name.ends_with("/gpu");
            if name == "cpu" || name == "memory" {
                item.insert(name, amount.into());
            } else if is_gpu
                && !item.contains_key("gpu")
                && amount.bytes().all(|b| b.is_ascii_digit())
            {
                item.insert("gpu".into(), amount.into());
                if name != DEFAULT_GPU_RESOURCE {
                    item.insert("gpuType".into(), name.into());
                }
            } else {
                custom.insert(name, amount.into());
            }
        }
        if !custom.is_empty() {
            item.insert("custom".into(), Value::Object(custom));
        }
        out.insert(side.into(), Value::Object(item));
    }
    if let Some(claims) = resources.remove("claims") {
        out.insert("claims".into(), claims);
    }
    if !resources.is_empty() {
        main.insert("resources".into(), Value::Object(resources));
    }
    if !out.is_empty() {
        s.insert("resources".into(), Value::Object(out));
    }
}

/// A quantity as v1alpha1 writes it: a string (the API accepts numbers too).
fn quantity(amount: &Value) -> Option<String> {
    match amount {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn status_to_beta(mut a: Object) -> Object {
    let mut b = Object::new();
    copy_alike(&mut a, STATUS_ALIKE, &mut b);
    rename(&mut a, "services", &mut b, "components");
    rename(&mut a, "readyServices", &mut b, "readyComponents");
    copy_unknown(a, Version::V1alpha1, STATUS, &mut b);
    b
}

fn status_to_alpha(mut b: Object) -> Object {
    let mut a = Object::new();
    copy_alike(&mut b, STATUS_ALIKE, &mut a);
    rename(&mut b, "components", &mut a, "services");
    rename(&mut b, "readyComponents", &mut a, "readyServices");
    copy_unknown(b, Version::V1beta1, STATUS, &mut a);
    a
}

/// Adds `var` to `env`, replacing an earlier variable of the same name in place (later wins,
/// as in a container's environment).
fn upsert_env(env: &mut Vec<Value>, var: Value) {
    let name = var.get("name").cloned();
    match env
        .iter_mut()
        .find(|v| name.is_some() && v.get("name") == name.as_ref())
    {
        Some(existing) => *existing = var,
        None => env.push(var),
    }
}

fn copy_alike(from: &mut Object, keys: &[&str], to: &mut Object) {
    for key in keys {
        if let Some(value) = from.remove(*key) {
            to.insert((*key).into(), value);
        }
    }
}

fn rename(from: &mut Object, key: &str, to: &mut Object, new_key: &str) {
    if let Some(value) = from.remove(key) {
        to.insert(new_key.into(), value);
    }
}

fn copy_as(from: &Value, key: &str, to: &mut Object, new_key: &str) {
    if let Some(value) = from.get(key) {
        to.insert(new_key.into(), value.clone());
    }
}

/// Copies the fields left in `from` (version `version`, object at `path` of its schema)
/// that neither version declares; a field one of them declares but no rule above moved
/// has no counterpart.
fn copy_unknown(from: Object, version: Version, path: &[&str], to: &mut Object) {
    let target_path: &[&str] = match path {
        p if p == ALPHA_SERVICE => BETA_COMPONENT,
        p if p == BETA_COMPONENT => ALPHA_SERVICE,
        p => p,
    };
    let own = schema::declared(version, path);
    let theirs = schema::declared(version.other(), target_path);
    for (key, value) in from {
        if !own.contains(key.as_str()) && !theirs.contains(key.as_str()) {
            to.insert(key, value);
        }
    }
}

fn object(value: Value, path: &str) -> Result<Object, ConversionError> {
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ConversionError::new(path, "must be a mapping")),
    }
}

fn list(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

fn text(value: Option<&Value>) -> Option<&str> {
    value.and_then(Value::as_str)
}
