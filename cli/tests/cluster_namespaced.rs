//! Namespace-scoped mode on a real API server: the chart installed with
//! `namespaceScoped.enabled=true` grants the operator's ServiceAccount a Role in its
//! namespace (and cluster-wide only the graph CRD); the operator run as that account with
//! `--watch-namespace` reconciles a graph there, the API server's RBAC refuses it the same
//! kinds in another namespace and cluster-wide, and without the flag it refuses to start,
//! naming the cluster-wide access it lacks.

mod cluster;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cluster::{
    GRAPH_LABEL, NAMESPACE, Operator, Options, create_namespace, diagnostics, eventually,
    free_port, graph, install_platform_with, nvidia_api, operator_user, poll, repo_root,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// A client that authenticates as `user` (impersonated), so the API server checks its
/// every request against that user's RBAC.
async fn client_as(cp: &cluster::ControlPlane, user: &str) -> kube::Client {
    let kubeconfig = Kubeconfig::read_from(cp.kubeconfig_as(user).unwrap()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The HTTP status of a refused request (403 from RBAC), panicking when it succeeds.
fn refused<T: std::fmt::Debug>(what: &str, outcome: Result<T, kube::Error>) -> u16 {
    match outcome {
        Ok(v) => panic!("{what} was allowed: {v:?}"),
        Err(kube::Error::Api(status)) => status.code,
        Err(e) => panic!("{what}: {e}"),
    }
}

/// `dynamo operator` as `user` without `--watch-namespace`: its exit status and output.
fn operator_without_the_flag(cp: &cluster::ControlPlane, user: &str) -> (bool, String) {
    let log = cp.kubeconfig().with_file_name("cluster-wide-operator.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_dynamo"));
    dynamo_envtest::die_with_parent(&mut command);
    let mut child = command
        .arg("operator")
        .arg(format!(
            "--webhook-url=https://127.0.0.1:{}/convert",
            free_port()
        ))
        .arg(format!("--port={}", free_port()))
        .arg(format!("--lease-namespace={NAMESPACE}"))
        .env("KUBECONFIG", cp.kubeconfig_as(user).unwrap())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("the dynamo binary starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the operator without --watch-namespace still runs after 60 s:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (
        status.success(),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
}

#[tokio::test]
async fn a_namespace_scoped_operator_reconciles_its_namespace_with_only_a_role() {
    let cp = cluster::start(Options::default()).await;
    install_platform_with(&cp, &["namespaceScoped.enabled=true"]);
    let admin = cp.client().await.unwrap();
    let other = "elsewhere";
    create_namespace(&admin, other).await;
    let user = operator_user(&cp);

    // The chart bound no ClusterRole but the CRD's: the account may not watch pods or
    // graphs cluster-wide, so a cluster-wide operator stops at its start-up check.
    let bindings = cp
        .kubectl_ok(&[
            "get",
            "clusterrolebindings",
            "-l",
            "app.kubernetes.io/instance=dynamo",
            "-o",
            "jsonpath={.items[*].roleRef.name}",
        ])
        .unwrap();
    assert_eq!(bindings, format!("dynamo-dynamo-platform-{NAMESPACE}-crd"));
    let (ok, output) = operator_without_the_flag(&cp, &user);
    assert!(
        !ok,
        "the operator started without cluster-wide access:\n{output}"
    );
    for lacking in [
        "list pods (core)",
        "watch dynamographdeployments (nvidia.com)",
    ] {
        assert!(output.contains(lacking), "no {lacking:?} in:\n{output}");
    }
    assert!(
        output.contains("namespaceScoped") || output.contains("ClusterRole"),
        "{output}"
    );

    // With the flag it becomes ready: its conversion webhook points the CRD at itself (the
    // one cluster-wide rule) and every watch it needs is of its namespace.
    let operator = Operator::start(&cp, &user, &[&format!("--watch-namespace={NAMESPACE}")]).await;
    let sample = repo_root().join("config/samples/agg-mocker.yaml");
    for namespace in [NAMESPACE, other] {
        cp.kubectl_ok(&["apply", "-n", namespace, "-f", sample.to_str().unwrap()])
            .unwrap();
    }

    // (a) It reconciles the graph in its namespace: the pods exist, the status is written.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let selector = format!("{GRAPH_LABEL}=agg-mocker");
    let made = poll(60, || async {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?;
        // The two workers' pods (the picker is a Deployment, with no controller-manager
        // here to make its pods).
        (list.items.len() == 2).then_some(())
    })
    .await;
    let status =
        || async { graph(&admin, NAMESPACE, "agg-mocker").await.unwrap()["status"].clone() };
    assert!(
        made.is_some(),
        "not the graph's two worker pods in {NAMESPACE} after 60 s; its status: {:#}\n{}",
        status().await,
        diagnostics(&cp, NAMESPACE)
    );
    // Deploying: its pods are made, none can run (no kubelet here).
    eventually("the graph's status to say deploying", 60, || async {
        let status = status().await;
        (status["observedGeneration"] == 1 && status["state"] == "deploying").then_some(())
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), NAMESPACE);
    let pickers = deployments
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap();
    assert_eq!(pickers.items.len(), 1, "the picker's Deployment");

    // (b) RBAC refuses the account the same kinds in another namespace and cluster-wide.
    let sa = client_as(&cp, &user).await;
    let graphs_here = nvidia_api(&sa, "v1alpha1", "dynamographdeployments", NAMESPACE);
    assert_eq!(
        graphs_here
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let graphs_there = nvidia_api(&sa, "v1alpha1", "dynamographdeployments", other);
    assert_eq!(
        refused(
            "listing graphs elsewhere",
            graphs_there.list(&ListParams::default()).await
        ),
        403
    );
    let pods_there: Api<Pod> = Api::namespaced(sa.clone(), other);
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }))
    .unwrap();
    assert_eq!(
        refused(
            "creating a pod elsewhere",
            pods_there.create(&PostParams::default(), &pod).await
        ),
        403
    );
    let all_pods: Api<Pod> = Api::all(sa.clone());
    assert_eq!(
        refused(
            "listing pods cluster-wide",
            all_pods.list(&ListParams::default()).await
        ),
        403
    );
    let nodes: Api<Node> = Api::all(sa.clone());
    assert_eq!(
        refused("listing nodes", nodes.list(&ListParams::default()).await),
        403
    );

    // The graph elsewhere is not the operator's: no pods, no status, while the operator
    // still runs (a cluster-wide watch would have been refused and kept it from
    // reconciling anything, above).
    let elsewhere = graph(&admin, other, "agg-mocker").await.unwrap();
    assert!(elsewhere["status"].is_null(), "{:#}", elsewhere["status"]);
    let others: Api<Pod> = Api::namespaced(admin.clone(), other);
    assert!(
        others
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let metrics = metrics_page(operator.metrics_port).await;
    assert!(metrics.contains("dynamo_operator_"), "{metrics}");
}

/// The operator's `/metrics` page, showing it is up.
async fn metrics_page(port: u16) -> String {
    reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .expect("the operator serves /metrics")
        .text()
        .await
        .unwrap()
}
