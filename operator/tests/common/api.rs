//! A small in-memory stand-in for the Kubernetes API server behind kube-rs's `tower-test`
//! mocked client: objects by path, resourceVersions, UIDs, list and watch (streamed, from
//! any resourceVersion), delete preconditions, status subresources, and injected failures.
//! Server-side apply is approximated as client-side three-way apply against the previous
//! apply to the object (right for a single field manager): fields the last apply set and
//! this one omits are removed, everything else is merged. Every request is recorded, so
//! tests can assert what the controllers wrote and that the RBAC tables allow it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::{Arc, Mutex};

use axum::body::Body as ResponseBody;
use bytes::Bytes;
use dynamo_operator::controller::rbac;
use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::watch;

/// One request the client made, after the fake handled it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
    pub status: u16,
    /// The request created the object (an apply of a missing object, or a POST).
    pub created: bool,
}

impl Recorded {
    /// `fieldManager=...` of the query.
    pub fn field_manager(&self) -> Option<&str> {
        self.query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldManager="))
    }
    pub fn is_apply(&self) -> bool {
        self.method == "PATCH" && self.content_type.starts_with("application/apply-patch")
    }
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    /// The last applied body of each object, to prune what a later apply omits.
    applied: BTreeMap<String, Value>,
    /// Every change: (resourceVersion, watch event type, object path, object).
    log: Vec<(u64, &'static str, String, Value)>,
    requests: Vec<Recorded>,
    /// (method, path fragment, HTTP status): matching requests fail.
    failures: Vec<(String, String, u16)>,
    version: u64,
}

#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    /// The latest resourceVersion, for watches waiting on changes.
    changes: watch::Sender<u64>,
}

impl Default for FakeApi {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            changes: watch::Sender::new(0),
        }
    }
}

/// A parsed resource path: `/api/v1/...` or `/apis/{group}/{version}/...`.
#[derive(Debug, PartialEq)]
pub struct ApiPath {
    pub group: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// Path of the object (or collection) without the subresource.
    pub object: String,
}

pub fn parse_path(path: &str) -> Option<ApiPath> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (resource, name, subresource) = match rest {
        [resource] => (resource, None, None),
        [resource, name] => (resource, Some(name.to_string()), None),
        [resource, name, sub] => (resource, Some(name.to_string()), Some(sub.to_string())),
        _ => return None,
    };
    let base = path.find(&format!("/{resource}")).map(|i| &path[..i])?;
    let object = match &name {
        Some(name) => format!("{base}/{resource}/{name}"),
        None => format!("{base}/{resource}"),
    };
    Some(ApiPath {
        group,
        namespace,
        resource: resource.to_string(),
        name,
        subresource,
        object,
    })
}

impl FakeApi {
    /// A client whose every request this fake answers (on a task of the current runtime).
    pub fn start() -> (Client, FakeApi) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<ResponseBody>>();
        let api = FakeApi::default();
        let server = api.clone();
        tokio::spawn(async move {
            let mut handle = pin!(handle);
            while let Some((request, send)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await.unwrap_or_default();
                let content_type = parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let query = parts.uri.query().unwrap_or_default();
                let method = parts.method.as_str();
                let body = if method == "GET" && query.contains("watch=true") {
                    server.watch(parts.uri.path(), query)
                } else {
                    let (status, answer) =
                        server.handle(method, parts.uri.path(), query, &content_type, &bytes);
                    (
                        status,
                        ResponseBody::from(serde_json::to_vec(&answer).unwrap()),
                    )
                };
                let response = Response::builder()
                    .status(body.0)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(body.1)
                    .unwrap();
                send.send_response(response);
            }
        });
        (Client::new(service, "default"), api)
    }

    /// Creates or replaces the object at `path`, as another client (a user, the kubelet,
    /// the scheduler) would; watches see it.
    pub fn put(&self, path: &str, mut object: Value) {
        let mut state = self.state.lock().unwrap();
        let uid = state
            .objects
            .get(path)
            .map(|o| o["metadata"]["uid"].clone());
        if object["metadata"]["uid"].is_null() {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            object["metadata"]["uid"] = uid.unwrap_or_else(|| json!(format!("uid-{name}")));
        }
        state.store(path, object);
        self.changes.send_replace(state.version);
    }

    /// Changes the object at `path` with `edit`, as another client would.
    pub fn edit(&self, path: &str, edit: impl FnOnce(&mut Value)) {
        let mut object = self
            .object(path)
            .unwrap_or_else(|| panic!("no object {path}"));
        edit(&mut object);
        self.put(path, object);
    }

    /// Deletes the object at `path`, as another client would.
    pub fn remove(&self, path: &str) {
        let mut state = self.state.lock().unwrap();
        if let Some(object) = state.objects.remove(path) {
            state.version += 1;
            let version = state.version;
            state
                .log
                .push((version, "DELETED", path.to_string(), object));
            self.changes.send_replace(version);
        }
    }

    /// Objects of one kind (by API group and plural), deserialized.
    pub fn objects_of<K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned>(
        &self,
    ) -> Vec<K> {
        let state = self.state.lock().unwrap();
        state
            .objects
            .iter()
            .filter(|(path, _)| {
                parse_path(path)
                    .is_some_and(|p| p.group == K::group(&()) && p.resource == K::plural(&()))
            })
            .map(|(_, o)| serde_json::from_value(o.clone()).expect("stored objects deserialize"))
            .collect()
    }

    /// Paths of the stored objects whose path contains `fragment`.
    pub fn paths(&self, fragment: &str) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .objects
            .keys()
            .filter(|p| p.contains(fragment))
            .cloned()
            .collect()
    }

    pub fn object(&self, path: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(path).cloned()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn take_requests(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.state.lock().unwrap().requests)
    }

    /// Requests with `method` whose path contains `fragment` fail with `status`.
    pub fn fail(&self, method: &str, fragment: &str, status: u16) {
        self.state
            .lock()
            .unwrap()
            .failures
            .push((method.into(), fragment.into(), status));
    }

    /// Every recorded request is allowed by the operator's RBAC tables (cluster rules
    /// anywhere, lease rules namespaced).
    pub fn assert_rbac_allows_all(&self) {
        for r in self.requests() {
            let path = parse_path(&r.path).unwrap_or_else(|| panic!("unparsed path {}", r.path));
            let resource = match &path.subresource {
                Some(sub) => format!("{}/{sub}", path.resource),
                None => path.resource.clone(),
            };
            let mut verbs = vec![verb(&r, &path)];
            if r.created && r.method == "PATCH" {
                verbs.push("create");
            }
            for verb in verbs {
                let allowed = rbac::allows(rbac::CLUSTER_RULES, &path.group, &resource, verb)
                    || (path.namespace.is_some()
                        && rbac::allows(rbac::LEASE_RULES, &path.group, &resource, verb));
                assert!(
                    allowed,
                    "RBAC tables lack {verb} {resource} ({}) for {} {}",
                    path.group, r.method, r.path
                );
            }
        }
    }

    fn handle(
        &self,
        method: &str,
        path: &str,
        query: &str,
        content_type: &str,
        bytes: &[u8],
    ) -> (u16, Value) {
        let body: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
        let mut state = self.state.lock().unwrap();
        let failure = state
            .failures
            .iter()
            .find(|(m, fragment, _)| m == method && path.contains(fragment.as_str()))
            .map(|(_, _, status)| *status);
        let (status, answer, created) = match (failure, parse_path(path)) {
            (Some(code), _) => (code, status_body(code, "injected failure"), false),
            (None, None) => (404, status_body(404, "unknown path"), false),
            (None, Some(p)) => state.answer(method, &p, &body),
        };
        let is_apply = content_type.starts_with("application/apply-patch");
        if is_apply && status < 300 && parse_path(path).is_some_and(|p| p.subresource.is_none()) {
            state.applied.insert(path.to_string(), body.clone());
        }
        state.requests.push(Recorded {
            method: method.into(),
            path: path.into(),
            query: query.into(),
            content_type: content_type.into(),
            body,
            status,
            created,
        });
        self.changes.send_replace(state.version);
        (status, answer)
    }

    /// A list, or a watch that streams every change after the requested resourceVersion
    /// and stays open.
    fn watch(&self, path: &str, query: &str) -> (u16, ResponseBody) {
        let Some(p) = parse_path(path) else {
            return (
                404,
                ResponseBody::from(status_body(404, "unknown path").to_string()),
            );
        };
        let from: u64 = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("resourceVersion="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        self.state.lock().unwrap().requests.push(Recorded {
            method: "GET".into(),
            path: path.into(),
            query: query.into(),
            content_type: String::new(),
            body: Value::Null,
            status: 200,
            created: false,
        });
        let state = self.state.clone();
        let changes = self.changes.subscribe();
        let lines = futures::stream::unfold((from, changes), move |(mut cursor, mut changes)| {
            let state = state.clone();
            let p_group = p.group.clone();
            let p_resource = p.resource.clone();
            let p_namespace = p.namespace.clone();
            async move {
                loop {
                    let batch: Vec<String> = {
                        let state = state.lock().unwrap();
                        let batch = state
                            .log
                            .iter()
                            .filter(|(v, ..)| *v > cursor)
                            .filter(|(_, _, path, _)| {
                                parse_path(path).is_some_and(|o| {
                                    o.group == p_group
                                        && o.resource == p_resource
                                        && (p_namespace.is_none() || o.namespace == p_namespace)
                                })
                            })
                            .map(|(_, kind, _, object)| {
                                json!({"type": kind, "object": object}).to_string() + "\n"
                            })
                            .collect();
                        cursor = state.version;
                        batch
                    };
                    if !batch.is_empty() {
                        let chunk = Bytes::from(batch.concat());
                        return Some((Ok::<_, std::convert::Infallible>(chunk), (cursor, changes)));
                    }
                    // Wait for the next change; a closed fake ends the watch.
                    changes.changed().await.ok()?;
                }
            }
        });
        (200, ResponseBody::from_stream(lines))
    }
}

impl State {
    /// Stores `object` at `path` under a new resourceVersion and logs the change.
    fn store(&mut self, path: &str, mut object: Value) -> Value {
        self.version += 1;
        // The API server counts spec changes in `metadata.generation`; the controllers read
        // it on our own kinds (status.observedGeneration), so the fake keeps it for those.
        if path.starts_with("/apis/nvidia.com/") {
            let previous = self.objects.get(path);
            let generation = match previous {
                Some(p) if p["spec"] == object["spec"] => p["metadata"]["generation"].clone(),
                Some(p) => json!(p["metadata"]["generation"].as_i64().unwrap_or(0) + 1),
                None if object["metadata"]["generation"].is_i64() => {
                    object["metadata"]["generation"].clone()
                }
                None => json!(1),
            };
            object["metadata"]["generation"] = generation;
        }
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        let kind = if self.objects.contains_key(path) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.objects.insert(path.to_string(), object.clone());
        let version = self.version;
        self.log
            .push((version, kind, path.to_string(), object.clone()));
        object
    }

    fn answer(&mut self, method: &str, p: &ApiPath, body: &Value) -> (u16, Value, bool) {
        let not_found = || (404, status_body(404, "not found"), false);
        match (method, &p.name) {
            ("GET", Some(_)) => match self.objects.get(&p.object) {
                Some(o) => (200, o.clone(), false),
                None => not_found(),
            },
            ("GET", None) => {
                let items: Vec<Value> = self
                    .objects
                    .iter()
                    .filter(|(path, _)| {
                        parse_path(path).is_some_and(|o| {
                            o.group == p.group
                                && o.resource == p.resource
                                && (p.namespace.is_none() || o.namespace == p.namespace)
                        })
                    })
                    .map(|(_, o)| o.clone())
                    .collect();
                let list = json!({
                    "kind": "List",
                    "apiVersion": "v1",
                    "metadata": { "resourceVersion": self.version.to_string() },
                    "items": items,
                });
                (200, list, false)
            }
            ("POST", None) => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                let key = format!("{}/{name}", p.object);
                if self.objects.contains_key(&key) {
                    return (409, status_body(409, "already exists"), false);
                }
                let mut object = body.clone();
                object["metadata"]["uid"] = json!(format!("uid-{name}"));
                (201, self.store(&key, object), true)
            }
            ("PUT", Some(_)) => {
                let Some(current) = self.objects.get(&p.object) else {
                    return not_found();
                };
                let sent = &body["metadata"]["resourceVersion"];
                if !sent.is_null() && *sent != current["metadata"]["resourceVersion"] {
                    return (409, status_body(409, "the object has been modified"), false);
                }
                let mut object = body.clone();
                object["metadata"]["uid"] = current["metadata"]["uid"].clone();
                (200, self.store(&p.object, object), false)
            }
            ("PATCH", Some(name)) => {
                let existing = self.objects.get(&p.object).cloned();
                let created = existing.is_none();
                let mut object = match (existing, p.subresource.is_some()) {
                    (Some(o), _) => o,
                    // A status patch or a merge patch needs the object.
                    (None, true) => return not_found(),
                    (None, false) if body["apiVersion"].is_null() => return not_found(),
                    (None, false) => json!({ "metadata": { "uid": format!("uid-{name}") } }),
                };
                match p.subresource.as_deref() {
                    Some("status") => object["status"] = body["status"].clone(),
                    _ => {
                        if let Some(last) = self.applied.get(&p.object) {
                            prune(&mut object, last, body);
                        }
                        merge(&mut object, body);
                    }
                }
                let object = self.store(&p.object, object);
                (if created { 201 } else { 200 }, object, created)
            }
            ("DELETE", Some(_)) => {
                let Some(current) = self.objects.get(&p.object) else {
                    return not_found();
                };
                let uid = &body["preconditions"]["uid"];
                if !uid.is_null() && *uid != current["metadata"]["uid"] {
                    return (409, status_body(409, "precondition failed: UID"), false);
                }
                let object = self.objects.remove(&p.object).unwrap();
                self.applied.remove(&p.object);
                self.version += 1;
                let version = self.version;
                self.log
                    .push((version, "DELETED", p.object.clone(), object));
                (
                    200,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                    false,
                )
            }
            _ => (405, status_body(405, "not supported by the fake"), false),
        }
    }
}

/// Removes from `object` the fields `last` applied that `next` no longer sets.
fn prune(object: &mut Value, last: &Value, next: &Value) {
    let (Some(object), Some(last)) = (object.as_object_mut(), last.as_object()) else {
        return;
    };
    for (k, v) in last {
        match next.get(k) {
            None => {
                object.remove(k);
            }
            Some(n) => {
                if let Some(o) = object.get_mut(k) {
                    prune(o, v, n);
                }
            }
        }
    }
}

/// JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            let target = target.as_object_mut().unwrap();
            for (k, v) in fields {
                if v.is_null() {
                    target.remove(k);
                } else {
                    merge(target.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn status_body(code: u16, message: &str) -> Value {
    // metav1.StatusReason values of the codes the fake answers.
    let reason = match code {
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        422 => "Invalid",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    };
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn verb(r: &Recorded, p: &ApiPath) -> &'static str {
    match (r.method.as_str(), &p.name) {
        ("GET", Some(_)) => "get",
        ("GET", None) if r.query.contains("watch=true") => "watch",
        ("GET", None) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => "unknown",
    }
}
