//! Conversion between DynamoGraphDeployment v1alpha1 and v1beta1 is lossless both ways
//! (unknown fields included), keeps edits made through the other version, and refuses
//! what it cannot convert with the field at fault.

use dynamo_crds::conversion::{self, V1ALPHA1_FIELDS, V1BETA1_FIELDS};
use dynamo_crds::{DynamoGraphDeployment, dgd_v1beta1};
use proptest::collection::{btree_map, vec};
use proptest::option::of;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

const ALPHA: &str = "nvidia.com/v1alpha1";
const BETA: &str = "nvidia.com/v1beta1";

/// `Some` fields of `pairs` as a JSON object (absent ones left out).
fn object(pairs: Vec<(&str, Option<Value>)>) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
            .collect::<Map<String, Value>>(),
    )
}

fn word() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "Worker", "decode", "x-1", "main"]).prop_map(String::from)
}

fn strings() -> impl Strategy<Value = Value> {
    btree_map(
        prop::sample::select(vec!["app", "team", "nvidia.com/x"]),
        word(),
        0..3,
    )
    .prop_map(|m| json!(m))
}

fn quantity() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec!["1", "2", "500m", "4Gi", "0"]).prop_map(Value::from),
        (0u32..9).prop_map(Value::from),
    ]
}

fn env() -> impl Strategy<Value = Value> {
    vec(
        (prop::sample::select(vec!["HF_HOME", "A", "B"]), word())
            .prop_map(|(n, v)| json!({"name": n, "value": v})),
        0..3,
    )
    .prop_map(Value::from)
}

fn probe() -> impl Strategy<Value = Value> {
    (1i32..9000).prop_map(|port| json!({"httpGet": {"path": "/health", "port": port}}))
}

/// A field no version declares, somewhere it is kept.
fn unknown() -> impl Strategy<Value = Option<Value>> {
    of(prop_oneof![
        Just(json!({"enabled": true, "nested": [1, {"k": null}]})),
        word().prop_map(Value::from)
    ])
}

fn container(named: Option<&'static str>) -> impl Strategy<Value = Value> {
    (
        of(word()),
        of(env()),
        of(probe()),
        of(quantity()),
        unknown(),
    )
        .prop_map(move |(image, env, probe, gpus, extra)| {
            object(vec![
                ("name", named.map(Value::from)),
                ("image", image.map(|i| json!(format!("registry/{i}:1")))),
                ("env", env),
                ("startupProbe", probe),
                (
                    "resources",
                    gpus.map(
                        |g| json!({"limits": {"nvidia.com/gpu": g}, "requests": {"cpu": "1"}}),
                    ),
                ),
                (
                    "terminationMessagePath",
                    extra.map(|_| json!("/dev/termination-log")),
                ),
            ])
        })
}

fn resource_item() -> impl Strategy<Value = Value> {
    (
        of(prop::sample::select(vec!["1", "500m"])),
        of(Just(json!("8Gi"))),
        of(prop::sample::select(vec!["1", "8"])),
        of(Just(json!("amd.com/gpu"))),
        of(Just(json!({"rdma/ib": "1"}))),
    )
        .prop_map(|(cpu, memory, gpu, gpu_type, custom)| {
            object(vec![
                ("cpu", cpu.map(Value::from)),
                ("memory", memory),
                ("gpu", gpu.map(Value::from)),
                ("gpuType", gpu_type),
                ("custom", custom),
            ])
        })
}

fn alpha_service() -> impl Strategy<Value = Value> {
    let role = (
        of(prop::sample::select(vec![
            "frontend", "epp", "worker", "prefill", "decode", "planner", "main", "default",
        ])),
        of(prop::sample::select(vec![
            "prefill", "decode", "Prefill", "other",
        ])),
        of(0i32..5),
        of((2i32..4).prop_map(|n| json!({"nodeCount": n}))),
    );
    let pod = (
        of((
            of(resource_item()),
            of(resource_item()),
            of(Just(json!([{"name": "claim"}]))),
        )
            .prop_map(|(r, l, c)| object(vec![("requests", r), ("limits", l), ("claims", c)]))),
        of(env()),
        of(word()),
        of(vec(
            (word(), of(Just(json!("/cache"))), of(any::<bool>())).prop_map(|(n, m, c)| {
                object(vec![
                    ("name", Some(json!(n))),
                    ("mountPoint", m),
                    ("useAsCompilationCache", c.map(Value::from)),
                ])
            }),
            0..3,
        )),
        of(prop_oneof![
            Just(json!({"disabled": true})),
            Just(json!({"size": "16Gi"})),
            Just(json!({"disabled": false, "size": "1Gi"})),
            Just(json!({})),
        ]),
    );
    let extra = (
        of((
            of(container(None)),
            of(vec(container(Some("helper")), 0..2)),
            of(Just(json!({"disk": "ssd"}))),
            unknown(),
        )
            .prop_map(|(main, containers, node_selector, extra)| {
                object(vec![
                    ("mainContainer", main),
                    ("containers", containers.map(Value::from)),
                    ("nodeSelector", node_selector),
                    ("priority", extra.map(|_| json!(10))),
                ])
            })),
        of((of(strings()), of(strings()))
            .prop_map(|(l, a)| object(vec![("labels", l), ("annotations", a)]))),
        of(probe()),
        of(probe()),
    );
    let rest = (
        of(of(any::<bool>()).prop_map(|e| object(vec![("enabled", e.map(Value::from))]))),
        of((of(Just(json!("rack"))), of(Just(json!("profile"))))
            .prop_map(|(p, t)| object(vec![("packDomain", p), ("topologyProfile", t)]))),
        of(strings()),
        of(strings()),
        of(word()),
        (
            unknown(),
            of(any::<bool>()),
            of(1i32..3),
            of(Just(json!({"image": "fe"}))),
        ),
    );
    (role, pod, extra, rest).prop_map(
        |(
            (ct, sct, replicas, multinode),
            (resources, envs, secret, mounts, shm),
            (extra, meta, live, ready),
            (adapter, topo, ann, lab, ns, (ingress, global, min, sidecar)),
        )| {
            object(vec![
                ("componentType", ct.map(Value::from)),
                ("subComponentType", sct.map(Value::from)),
                ("replicas", replicas.map(Value::from)),
                ("multinode", multinode),
                ("resources", resources),
                ("envs", envs),
                ("envFromSecret", secret.map(Value::from)),
                ("volumeMounts", mounts.map(Value::from)),
                ("sharedMemory", shm),
                ("extraPodSpec", extra),
                ("extraPodMetadata", meta),
                ("livenessProbe", live),
                ("readinessProbe", ready),
                ("scalingAdapter", adapter),
                ("topologyConstraint", topo),
                ("annotations", ann),
                ("labels", lab),
                ("dynamoNamespace", ns.map(Value::from)),
                ("ingress", ingress),
                ("globalDynamoNamespace", global.map(Value::from)),
                ("minAvailable", min.map(Value::from)),
                ("frontendSidecar", sidecar),
            ])
        },
    )
}

fn metadata() -> impl Strategy<Value = Value> {
    (of(strings()), of(strings())).prop_map(|(labels, annotations)| {
        // The API server never stores an empty annotations map.
        let annotations = annotations.filter(|a| a.as_object().is_some_and(|a| !a.is_empty()));
        object(vec![
            ("name", Some(json!("graph"))),
            ("namespace", Some(json!("inference"))),
            ("generation", Some(json!(3))),
            ("labels", labels),
            ("annotations", annotations),
        ])
    })
}

fn status(
    components_key: &'static str,
    ready_key: &'static str,
) -> impl Strategy<Value = Option<Value>> {
    of((
        of(0i64..9),
        of(prop::sample::select(vec!["pending", "deploying", "ready", "degraded", "failed"])),
        of(Just(json!("1/2"))),
        of(btree_map(word(), (0i32..3).prop_map(|r| json!({"replicas": r, "updatedReplicas": r, "readyReplicas": 0})), 0..3)),
        of(Just(json!([{"type": "Ready", "status": "False", "reason": "Deploying", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]))),
    )
        .prop_map(move |(generation, state, ready, replicas, conditions)| {
            object(vec![
                ("observedGeneration", generation.map(Value::from)),
                ("state", state.map(Value::from)),
                (ready_key, ready),
                (components_key, replicas.map(|r| json!(r))),
                ("conditions", conditions),
            ])
        }))
}

fn alpha_graph() -> impl Strategy<Value = Value> {
    (
        metadata(),
        of(btree_map(word(), alpha_service(), 0..4)),
        of(prop::sample::select(vec![
            "vllm", "sglang", "trtllm", "mocker",
        ])),
        of(env()),
        of(Just(json!([{"name": "model-cache", "create": false}]))),
        of((of(Just(json!("nvlink"))), of(Just(json!("topo"))))
            .prop_map(|(p, t)| object(vec![("packDomain", p), ("topologyProfile", t)]))),
        (
            of(strings()),
            of(strings()),
            of(Just(json!({"id": "1", "unknownToBoth": true}))),
            of(Just(json!("high"))),
            unknown(),
        ),
        status("services", "readyServices"),
    )
        .prop_map(
            |(
                metadata,
                services,
                backend,
                envs,
                pvcs,
                topo,
                (ann, lab, restart, priority, extra),
                status,
            )| {
                object(vec![
                    ("apiVersion", Some(json!(ALPHA))),
                    ("kind", Some(json!("DynamoGraphDeployment"))),
                    ("metadata", Some(metadata)),
                    (
                        "spec",
                        Some(object(vec![
                            ("services", services.map(|s| json!(s))),
                            ("backendFramework", backend.map(Value::from)),
                            ("envs", envs),
                            ("pvcs", pvcs),
                            ("topologyConstraint", topo),
                            ("annotations", ann),
                            ("labels", lab),
                            ("restart", restart),
                            ("priorityClassName", priority),
                            ("somethingNew", extra),
                        ])),
                    ),
                    ("status", status),
                ])
            },
        )
}

fn beta_component(name: String) -> impl Strategy<Value = Value> {
    let pod = (
        of((
            of(strings()),
            of(strings()),
            of(Just(json!("ignored-name"))),
        )
            .prop_map(|(l, a, n)| object(vec![("labels", l), ("annotations", a), ("name", n)]))),
        of(vec(container(Some("main")), 0..2)),
        of(vec(container(Some("helper")), 0..2)),
        of(Just(
            json!([{"secretRef": {"name": "hf"}}, {"configMapRef": {"name": "c"}}]),
        )),
        of(Just(json!([{"name": "v", "emptyDir": {}}]))),
        unknown(),
    )
        .prop_map(|(metadata, mains, helpers, env_from, volumes, extra)| {
            let mut containers: Vec<Value> = helpers.into_iter().flatten().collect();
            if let Some(mut main) = mains.and_then(|m| m.into_iter().next()) {
                if let Some(from) = env_from {
                    main["envFrom"] = from;
                }
                containers.insert(containers.len() / 2, main);
            }
            containers.dedup_by(|a, b| a["name"] == b["name"]);
            let spec = object(vec![
                (
                    "containers",
                    (!containers.is_empty()).then(|| json!(containers)),
                ),
                ("volumes", volumes),
                ("hostIPC", extra.map(|_| json!(true))),
            ]);
            object(vec![("metadata", metadata), ("spec", Some(spec))])
        });
    (
        of(prop::sample::select(vec![
            "frontend", "worker", "prefill", "decode", "planner", "epp", "default",
        ])),
        of(pod),
        (
            of(0i32..5),
            of(1i32..2),
            of((2i32..4).prop_map(|n| json!({"nodeCount": n}))),
            of(any::<bool>()),
        ),
        (
            of(prop::sample::select(vec!["0", "8Gi"]).prop_map(Value::from)),
            of(Just(json!({}))),
        ),
        (
            of(Just(json!({"name": "llama", "revision": "1"}))),
            of(Just(json!("helper"))),
            of(Just(json!({"pvcName": "cache", "mountPath": "/c"}))),
        ),
        (
            of(Just(json!({"packDomain": "rack"}))),
            of(Just(json!({"failover": {"mode": "IntraPod"}}))),
            unknown(),
        ),
    )
        .prop_map(
            move |(
                kind,
                pod,
                (replicas, min, multinode, global),
                (shm, adapter),
                (model, sidecar, cache),
                (topo, experimental, extra),
            )| {
                object(vec![
                    ("name", Some(json!(name.clone()))),
                    ("type", kind.map(Value::from)),
                    ("podTemplate", pod),
                    ("replicas", replicas.map(Value::from)),
                    ("minAvailable", min.map(Value::from)),
                    ("multinode", multinode),
                    ("globalDynamoNamespace", global.map(Value::from)),
                    ("sharedMemorySize", shm),
                    ("scalingAdapter", adapter),
                    ("modelRef", model),
                    ("frontendSidecar", sidecar),
                    ("compilationCache", cache),
                    ("topologyConstraint", topo),
                    ("experimental", experimental),
                    ("somethingNew", extra),
                ])
            },
        )
}

fn beta_graph() -> impl Strategy<Value = Value> {
    let components = prop::sample::subsequence(
        vec!["Frontend", "decode", "prefill", "Worker-2", "planner"],
        0..5,
    )
    .prop_shuffle()
    .prop_flat_map(|names| {
        names
            .into_iter()
            .map(|n| beta_component(n.to_string()))
            .collect::<Vec<_>>()
    });
    (
        metadata(),
        of(components),
        of(prop::sample::select(vec![
            "vllm", "sglang", "trtllm", "mocker",
        ])),
        of(env()),
        of((of(Just(json!("nvlink"))), of(Just(json!("topo"))))
            .prop_map(|(p, t)| object(vec![("packDomain", p), ("clusterTopologyName", t)]))),
        (
            of(strings()),
            of(Just(
                json!({"id": "1", "strategy": {"type": "Parallel", "order": ["a"]}}),
            )),
            of(Just(json!({"kvTransferPolicy": {"mode": "x"}}))),
            of(Just(json!("high"))),
            unknown(),
        ),
        status("components", "readyComponents"),
    )
        .prop_map(
            |(
                metadata,
                components,
                backend,
                env,
                topo,
                (labels, restart, experimental, priority, extra),
                status,
            )| {
                object(vec![
                    ("apiVersion", Some(json!(BETA))),
                    ("kind", Some(json!("DynamoGraphDeployment"))),
                    ("metadata", Some(metadata)),
                    (
                        "spec",
                        Some(object(vec![
                            ("components", components.map(Value::from)),
                            ("backendFramework", backend.map(Value::from)),
                            ("env", env),
                            ("topologyConstraint", topo),
                            ("labels", labels),
                            ("restart", restart),
                            ("experimental", experimental),
                            ("priorityClassName", priority),
                            ("somethingNew", extra),
                        ])),
                    ),
                    ("status", status),
                ])
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn v1alpha1_to_v1beta1_and_back_is_the_same_object(alpha in alpha_graph()) {
        let beta = conversion::convert(&alpha, BETA).unwrap();
        prop_assert_eq!(&beta["apiVersion"], BETA);
        serde_json::from_value::<dgd_v1beta1::DynamoGraphDeployment>(beta.clone())
            .map_err(|e| TestCaseError::fail(format!("{e}: {beta:#}")))?;
        let back = conversion::convert(&beta, ALPHA).unwrap();
        prop_assert_eq!(&back, &alpha, "via {:#}", beta);
    }

    #[test]
    fn v1beta1_to_v1alpha1_and_back_is_the_same_object(beta in beta_graph()) {
        let alpha = conversion::convert(&beta, ALPHA).unwrap();
        prop_assert_eq!(&alpha["apiVersion"], ALPHA);
        serde_json::from_value::<DynamoGraphDeployment>(alpha.clone())
            .map_err(|e| TestCaseError::fail(format!("{e}: {alpha:#}")))?;
        let back = conversion::convert(&alpha, BETA).unwrap();
        prop_assert_eq!(&back, &beta, "via {:#}", alpha);
        // Twice round: the stored form is stable, so reads through v1beta1 never drift.
        prop_assert_eq!(conversion::convert(&back, ALPHA).unwrap(), alpha);
    }
}

/// A v1beta1 graph with fields v1alpha1 cannot hold, its components out of name order.
fn rich_beta() -> Value {
    json!({
        "apiVersion": BETA,
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "g", "annotations": {"team": "a"}},
        "spec": {"components": [
            {"name": "Worker", "type": "worker", "replicas": 1, "frontendSidecar": "fe",
             "podTemplate": {"spec": {"containers": [
                 {"name": "fe", "image": "frontend:1"},
                 {"name": "main", "image": "engine:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
             ]}}},
            {"name": "Frontend", "type": "frontend"}
        ]}
    })
}

#[test]
fn what_v1alpha1_cannot_hold_travels_in_an_annotation() {
    let alpha = conversion::convert(&rich_beta(), ALPHA).unwrap();
    let annotations = &alpha["metadata"]["annotations"];
    assert_eq!(annotations["team"], "a");
    let kept = annotations[V1BETA1_FIELDS].as_str().unwrap();
    for field in ["frontendSidecar", "/spec/components/order", "containers"] {
        assert!(kept.contains(field), "{field} missing from {kept}");
    }
    // What the controller reads is v1alpha1's own fields.
    let worker = &alpha["spec"]["services"]["Worker"];
    assert_eq!(worker["resources"], json!({"limits": {"gpu": "1"}}));
    assert_eq!(
        worker["extraPodSpec"]["mainContainer"],
        json!({"image": "engine:1"})
    );
    assert_eq!(
        worker["extraPodSpec"]["containers"],
        json!([{"name": "fe", "image": "frontend:1"}])
    );
    assert_eq!(conversion::convert(&alpha, BETA).unwrap(), rich_beta());
}

#[test]
fn an_edit_through_v1alpha1_wins_over_the_kept_v1beta1_fields() {
    let mut alpha = conversion::convert(&rich_beta(), ALPHA).unwrap();
    // The scaling adapter's merge patch and a user's new image, both through v1alpha1.
    alpha["spec"]["services"]["Worker"]["replicas"] = json!(3);
    alpha["spec"]["services"]["Worker"]["extraPodSpec"]["mainContainer"]["image"] =
        json!("engine:2");
    let beta = conversion::convert(&alpha, BETA).unwrap();
    let worker = beta["spec"]["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "Worker")
        .unwrap();
    assert_eq!(worker["replicas"], 3);
    assert_eq!(
        worker["frontendSidecar"], "fe",
        "untouched v1beta1 fields stay"
    );
    assert_eq!(
        beta["spec"]["components"][0]["name"], "Worker",
        "and so does the order"
    );
    let images: Vec<&Value> = worker["podTemplate"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["image"])
        .collect();
    assert!(
        images.contains(&&json!("engine:2")),
        "the edit wins: {worker:#}"
    );
    assert!(images.contains(&&json!("frontend:1")), "{worker:#}");
}

#[test]
fn a_stale_or_unreadable_annotation_changes_nothing() {
    let mut beta = rich_beta();
    beta["metadata"]["annotations"][V1ALPHA1_FIELDS] = json!("not json");
    let alpha = conversion::convert(&beta, ALPHA).unwrap();
    let mut expected = conversion::convert(&rich_beta(), ALPHA).unwrap();
    assert_eq!(
        alpha,
        expected.clone(),
        "an object never carries its own version's fields"
    );
    expected["metadata"]["annotations"][V1BETA1_FIELDS] = json!("[{\"path\": 7}]");
    let beta = conversion::convert(&expected, BETA).unwrap();
    assert!(
        beta["spec"]["components"][0]
            .get("frontendSidecar")
            .is_none()
    );
    assert_eq!(
        beta["spec"]["components"][1]["name"], "Worker",
        "sorted without the order"
    );
}

#[test]
fn what_cannot_be_converted_is_refused_with_its_field() {
    let refused =
        |object: Value, to: &str| conversion::convert(&object, to).unwrap_err().to_string();
    assert_eq!(
        refused(json!({"apiVersion": BETA, "kind": "Pod"}), ALPHA),
        "kind: only DynamoGraphDeployment objects are converted, not \"Pod\""
    );
    assert_eq!(
        refused(
            json!({"apiVersion": "nvidia.com/v2", "kind": "DynamoGraphDeployment"}),
            ALPHA
        ),
        "apiVersion: unknown version \"nvidia.com/v2\""
    );
    assert!(
        refused(rich_beta(), "nvidia.com/v9").starts_with("cannot convert to \"nvidia.com/v9\"")
    );
    let mut twice = rich_beta();
    twice["spec"]["components"][1]["name"] = json!("Worker");
    assert_eq!(
        refused(twice, ALPHA),
        "spec.components[1].name: two components are named \"Worker\""
    );
    let mut unnamed = rich_beta();
    unnamed["spec"]["components"][1]
        .as_object_mut()
        .unwrap()
        .remove("name");
    assert_eq!(refused(unnamed, ALPHA), "spec.components[1].name: required");
    let services_list =
        json!({"apiVersion": ALPHA, "kind": "DynamoGraphDeployment", "spec": {"services": []}});
    assert_eq!(
        refused(services_list, BETA),
        "spec.services: must be a mapping"
    );
}

#[test]
fn an_object_already_in_the_desired_version_is_unchanged() {
    assert_eq!(
        conversion::convert(&rich_beta(), BETA).unwrap(),
        rich_beta()
    );
}
