//! Graphs on a real control plane: kube-apiserver, kube-scheduler and
//! kube-controller-manager v1.36, GPU nodes in NVLink domains, the test kubelet marking
//! bound pods Running, and the operator binary with exactly the chart's RBAC (impersonating
//! its ServiceAccount, so the real authorizer checks every verb). Samples come up Ready
//! with their Services, InferencePool, HTTPRoute and scaling adapters; `kubectl scale` of
//! an adapter changes replicas; a multinode gang lands inside one `nvidia.com/gpu.clique`;
//! deleting a graph garbage-collects its children, of every kind of the operator's table.

mod cluster;

use std::collections::{BTreeMap, BTreeSet};

use cluster::kubelet::{self, FakeNode};
use cluster::{
    ControlPlane, GRAPH_LABEL, apply_samples, diagnostics, eventually, platform, poll, repo_root,
    running_pods, wait_ready,
};
use dynamo_operator::reconcile::kinds::{Child, KindVisitor, each_kind};
use dynamo_operator::reconcile::{ObjectKind, labels};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Client, ResourceExt as _};

/// Names of the graph's Running pods.
async fn running(client: &Client, namespace: &str, graph: &str) -> BTreeSet<String> {
    running_pods(client, namespace, &format!("{GRAPH_LABEL}={graph}"))
        .await
        .into_iter()
        .map(|p| p.name_any())
        .collect()
}

/// The `metadata.name` of `config/samples/SAMPLE.yaml`.
fn sample_name(sample: &str) -> String {
    let path = repo_root()
        .join("config/samples")
        .join(format!("{sample}.yaml"));
    let yaml: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    yaml["metadata"]["name"].as_str().unwrap().to_string()
}

/// `kubectl get KIND -l graph=NAME -o name`, one line per object.
fn names_of(cp: &ControlPlane, namespace: &str, kinds: &str, graph: &str) -> Vec<String> {
    cp.kubectl_ok(&[
        "get",
        kinds,
        "-n",
        namespace,
        "-l",
        &format!("{GRAPH_LABEL}={graph}"),
        "-o",
        "name",
    ])
    .unwrap()
    .lines()
    .map(str::to_string)
    .collect()
}

#[tokio::test]
async fn samples_come_up_scale_and_are_collected() {
    let nodes: Vec<FakeNode> = ["a1", "a2", "b1", "b2"]
        .iter()
        .map(|n| FakeNode::gpu(n, &format!("clique-{}", &n[..1]), 8))
        .collect();
    let (cp, client, _operator, _kubelet) = platform(&nodes).await;
    let ns = "graphs";
    // Every single-node sample (the multinode one has its own test), Dynamo's own, and in
    // a namespace of their own the v1beta1 twins, which share their names.
    let samples = [
        "agg-mocker",
        "agg-mocker-kvbm",
        "agg-mocker-planner",
        "agg-vllm",
        "disagg-mocker",
        "disagg-vllm",
        "dynamo/vllm-agg",
        "dynamo/vllm-disagg",
    ];
    let twins = ["v1beta1/agg-vllm", "v1beta1/disagg-vllm"];
    apply_samples(&cp, ns, &samples);
    apply_samples(&cp, "twins", &twins);
    let graphs: Vec<(&str, String)> = samples
        .iter()
        .map(|s| (ns, sample_name(s)))
        .chain(twins.iter().map(|s| ("twins", sample_name(s))))
        .collect();
    for (namespace, graph) in &graphs {
        wait_ready(&cp, &client, namespace, graph).await;
    }
    // What each graph is served through.
    for (namespace, graph) in &graphs {
        let objects = names_of(&cp, namespace, "service,inferencepool", graph);
        assert!(
            objects.iter().any(|o| o.starts_with("service/")),
            "{graph}: {objects:?}"
        );
        assert!(
            objects
                .iter()
                .any(|o| o.starts_with("inferencepool.inference.networking.k8s.io/")),
            "{graph}: {objects:?}"
        );
    }
    // Each graph's block API credential: a 256-bit token in a Secret its pods mount, which
    // the operator created and has no right to read back.
    for (namespace, graph) in &graphs {
        let secret = format!("{graph}-block-api");
        let token = cp
            .kubectl_ok(&[
                "get",
                "secret",
                "-n",
                namespace,
                &secret,
                "-o",
                "go-template={{.data.token | base64decode}}",
            ])
            .unwrap();
        assert_eq!(token.len(), 64, "{graph}: {token:?}");
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token:?}");
        let pods = cp
            .kubectl_ok(&[
                "get",
                "pods",
                "-n",
                namespace,
                "-l",
                &format!("{GRAPH_LABEL}={graph},{}", labels::ROLE),
                "-o",
                "jsonpath={.items[*].spec.volumes[?(@.secret)].secret.secretName}",
            ])
            .unwrap();
        let mounted: BTreeSet<&str> = pods.split_whitespace().collect();
        assert_eq!(mounted, BTreeSet::from([secret.as_str()]), "{graph}");
    }
    let operator = cluster::operator_user(&cp);
    let may_read = cp
        .kubectl()
        .args([
            "auth", "can-i", "get", "secrets", "-n", ns, "--as", &operator,
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&may_read.stdout).trim(), "no");

    // A graph names the Gateway it is routed from.
    cp.kubectl_ok(&[
        "annotate",
        "-n",
        ns,
        "dynamographdeployments.v1alpha1.nvidia.com/agg-vllm",
        "nvidia.com/dynamo-gateway=inference-gateway",
    ])
    .unwrap();
    let routes = eventually("agg-vllm's HTTPRoute", 30, || async {
        let routes = names_of(&cp, ns, "httproute", "agg-vllm");
        (!routes.is_empty()).then_some(routes)
    })
    .await;
    assert_eq!(routes.len(), 1, "{routes:?}");

    // The planner's graph has an adapter per engine service; scaling one through its
    // scale subresource, as the planner and `kubectl scale` do, changes the graph.
    let adapters = names_of(&cp, ns, "dgdsa", "agg-mocker-planner");
    assert!(
        adapters.contains(
            &"dynamographdeploymentscalingadapter.nvidia.com/agg-mocker-planner-worker".to_string()
        ),
        "{adapters:?}"
    );
    let before = running(&client, ns, "agg-mocker-planner").await.len();
    cp.kubectl_ok(&[
        "scale",
        "-n",
        ns,
        "dgdsa/agg-mocker-planner-worker",
        "--replicas=3",
    ])
    .unwrap();
    eventually(
        "the planner graph's worker to have 3 replicas",
        60,
        || async {
            let graph = cluster::get_json(
                &client,
                "v1alpha1",
                "dynamographdeployments",
                ns,
                "agg-mocker-planner",
            )
            .await;
            (graph["spec"]["services"]["worker"]["replicas"] == 3).then_some(())
        },
    )
    .await;
    eventually("a third worker pod to run", 60, || async {
        let now = running(&client, ns, "agg-mocker-planner").await.len();
        (now > before).then_some(())
    })
    .await;
    wait_ready(&cp, &client, ns, "agg-mocker-planner").await;

    // Deleting a graph leaves nothing of it: the garbage collector follows the owner
    // references the operator set.
    assert!(
        !names_of(
            &cp,
            ns,
            "pod,deployment,service,inferencepool,serviceaccount,role,rolebinding",
            "agg-mocker"
        )
        .is_empty()
    );
    cp.kubectl_ok(&[
        "delete",
        "-n",
        ns,
        "dynamographdeployments.v1alpha1.nvidia.com/agg-mocker",
    ])
    .unwrap();
    eventually("agg-mocker's children to be collected", 60, || async {
        names_of(
            &cp,
            ns,
            "pod,deployment,service,inferencepool,serviceaccount,role,rolebinding",
            "agg-mocker",
        )
        .is_empty()
        .then_some(())
    })
    .await;
    // The other graphs are untouched.
    assert!(!running(&client, ns, "disagg-mocker").await.is_empty());
}

/// The graph's objects of every kind of the operator's table (`reconcile::kinds`), by kind,
/// those whose deletion has started left out: the garbage collector's deletion is what
/// counts, and a claim's `kubernetes.io/pvc-protection` finalizer is for a controller this
/// control plane does not run.
async fn objects_by_kind(
    client: &Client,
    namespace: &str,
    graph: &str,
) -> BTreeMap<ObjectKind, Vec<String>> {
    struct Resources;
    impl KindVisitor for Resources {
        type Out = (ObjectKind, ApiResource);
        fn visit<K: Child>(&mut self) -> Self::Out {
            (K::KIND, ApiResource::erase::<K>(&()))
        }
    }
    let selector = ListParams::default().labels(&format!("{GRAPH_LABEL}={graph}"));
    let mut by_kind = BTreeMap::new();
    for (kind, resource) in each_kind(&mut Resources) {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let objects = api
            .list(&selector)
            .await
            .unwrap_or_else(|e| panic!("listing {kind:?}: {e}"));
        let names = objects
            .items
            .iter()
            .filter(|o| o.metadata.deletion_timestamp.is_none())
            .map(|o| o.name_any())
            .collect();
        by_kind.insert(kind, names);
    }
    by_kind
}

/// Every kind of the table is applied and garbage-collected: a graph that wants objects of
/// each (agg-mocker with a gateway, a scaling adapter and a claim) gets at least one of each
/// kind, labeled with the graph, and none is left once the graph is deleted. The kinds come
/// from the table itself, so a new kind cannot be left out.
#[tokio::test]
async fn every_kind_of_the_table_is_applied_and_collected() {
    let nodes = [
        FakeNode::gpu("a1", "clique-a", 8),
        FakeNode::gpu("a2", "clique-a", 8),
    ];
    let (cp, client, _operator, _kubelet) = platform(&nodes).await;
    let ns = "kinds";
    cp.kubectl_ok(&["create", "namespace", ns]).unwrap();
    let sample = repo_root().join("config/samples/agg-mocker.yaml");
    let mut graph: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(sample).unwrap()).unwrap();
    let name = graph["metadata"]["name"].as_str().unwrap().to_string();
    graph["metadata"]["annotations"] =
        serde_json::json!({"nvidia.com/dynamo-gateway": "inference-gateway"});
    graph["spec"]["services"]["worker"]["scalingAdapter"] = serde_json::json!({"enabled": true});
    graph["spec"]["pvcs"] = serde_json::json!([{
        "name": "cache", "create": true, "size": "1Gi",
        "storageClass": "standard", "volumeAccessMode": "ReadWriteOnce",
    }]);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), graph.to_string()).unwrap();
    cp.kubectl_ok(&["apply", "-n", ns, "-f", file.path().to_str().unwrap()])
        .unwrap();

    let every_kind = poll(60, || async {
        let by_kind = objects_by_kind(&client, ns, &name).await;
        by_kind.values().all(|o| !o.is_empty()).then_some(by_kind)
    })
    .await;
    let Some(by_kind) = every_kind else {
        panic!(
            "some kinds have no object of the graph after 60 s: {:#?}\n{}",
            objects_by_kind(&client, ns, &name).await,
            diagnostics(&cp, ns)
        );
    };
    assert_eq!(
        by_kind.keys().copied().collect::<Vec<_>>(),
        ObjectKind::ALL,
        "{by_kind:#?}"
    );

    cp.kubectl_ok(&[
        "delete",
        "-n",
        ns,
        &format!("dynamographdeployments.v1alpha1.nvidia.com/{name}"),
    ])
    .unwrap();
    let collected = poll(60, || async {
        let by_kind = objects_by_kind(&client, ns, &name).await;
        by_kind.values().all(Vec::is_empty).then_some(())
    })
    .await;
    if collected.is_none() {
        panic!(
            "the graph's children are not all collected after 60 s: {:#?}",
            objects_by_kind(&client, ns, &name).await
        );
    }
}

#[tokio::test]
async fn a_multinode_gang_lands_inside_one_nvlink_domain() {
    // Clique a has room for the whole gang whatever the single-node prefill takes; clique
    // b has two nodes, one of them half used by another workload.
    let mut nodes: Vec<FakeNode> = ["a1", "a2", "a3"]
        .iter()
        .map(|n| FakeNode::gpu(n, "clique-a", 8))
        .collect();
    nodes.push(FakeNode::gpu("b1", "clique-b", 8));
    nodes.push(FakeNode::gpu("b2", "clique-b", 4));
    let (cp, client, _operator, _kubelet) = platform(&nodes).await;
    // The shared volume the sample's model cache claims, as a storage admin provides it.
    let volume = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "models"},
        "spec": {
            "capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"],
            "storageClassName": "shared-rwx", "nfs": {"server": "nfs.example", "path": "/models"},
        },
    });
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), volume.to_string()).unwrap();
    cp.kubectl_ok(&["apply", "-f", file.path().to_str().unwrap()])
        .unwrap();
    let ns = "gangs";
    apply_samples(&cp, ns, &["multinode-vllm"]);
    wait_ready(&cp, &client, ns, "multinode-vllm").await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let nodes: Api<Node> = Api::all(client.clone());
    let decode = pods
        .list(&ListParams::default().labels(&format!(
            "{GRAPH_LABEL}=multinode-vllm,nvidia.com/dynamo-component=VllmDecodeWorker"
        )))
        .await
        .unwrap();
    assert_eq!(decode.items.len(), 2, "leader and one worker");
    let mut placed = BTreeSet::new();
    let mut cliques = BTreeSet::new();
    for pod in &decode.items {
        let node = pod
            .spec
            .as_ref()
            .unwrap()
            .node_name
            .clone()
            .expect("bound by the scheduler");
        let labels = nodes.get(&node).await.unwrap().metadata.labels.unwrap();
        cliques.insert(labels[kubelet::CLIQUE_LABEL].clone());
        placed.insert(node);
    }
    assert_eq!(placed.len(), 2, "one pod per node: {placed:?}");
    assert_eq!(cliques, BTreeSet::from(["clique-a".to_string()]));
    // The model cache claim the graph asks to create.
    let claims = names_of(&cp, ns, "persistentvolumeclaim", "multinode-vllm");
    assert_eq!(claims.len(), 1, "{claims:?}");
}

/// A graph the API server accepts but the operator cannot build (its gang names a pack
/// domain the operator does not know) is reported in its status with the field, and
/// nothing of it is applied; fixed with `kubectl patch`, it comes up.
#[tokio::test]
async fn a_graph_the_operator_cannot_build_is_reported_with_its_field_and_nothing_applied() {
    let nodes = [
        FakeNode::gpu("a1", "clique-a", 8),
        FakeNode::gpu("a2", "clique-a", 8),
    ];
    let (cp, client, _operator, _kubelet) = platform(&nodes).await;
    let ns = "unbuildable";
    cp.kubectl_ok(&["create", "namespace", ns]).unwrap();
    let graph = serde_json::json!({
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": "packed", "namespace": ns},
        "spec": {
            "backendFramework": "vllm",
            "services": {"decode": {
                "componentType": "worker",
                "replicas": 1,
                "multinode": {"nodeCount": 2},
                "resources": {"limits": {"gpu": "8"}},
                "topologyConstraint": {"packDomain": "rack9"},
                "extraPodSpec": {"mainContainer": {
                    "command": ["vllm", "serve"],
                    "args": ["Qwen/Qwen3-8B", "--tensor-parallel-size", "16"],
                }},
            }},
        },
    });
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), graph.to_string()).unwrap();
    cp.kubectl_ok(&["apply", "-f", file.path().to_str().unwrap()])
        .unwrap();
    let status = eventually("the graph to fail", 30, || async {
        let status = cluster::graph(&client, ns, "packed").await?["status"].clone();
        (status["state"] == "failed").then_some(status)
    })
    .await;
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["reason"], "InvalidSpec", "{status:#}");
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "spec.services.decode.topologyConstraint.packDomain: unknown pack domain \"rack9\""
        ),
        "{message}"
    );
    let children = "pod,deployment,service,inferencepool,serviceaccount,role,rolebinding";
    assert_eq!(names_of(&cp, ns, children, "packed"), Vec::<String>::new());

    cp.kubectl_ok(&[
        "patch",
        "-n",
        ns,
        "dynamographdeployments.v1alpha1.nvidia.com/packed",
        "--type=merge",
        "-p",
        r#"{"spec":{"services":{"decode":{"topologyConstraint":{"packDomain":"nvlink"}}}}}"#,
    ])
    .unwrap();
    wait_ready(&cp, &client, ns, "packed").await;
}
