//! The request, the planner and the picker on a real control plane (kube-apiserver,
//! kube-scheduler and kube-controller-manager v1.36, the test kubelet), with the operator
//! binary holding exactly the chart's RBAC:
//!
//! - a DynamoGraphDeploymentRequest is profiled by the operator and its generated graph
//!   deployed and Ready;
//! - the real planner binary, impersonating the ServiceAccount the operator generated
//!   for it, reads a real Prometheus, decides to scale and writes the adapter's `scale`
//!   subresource, and the graph follows;
//! - the real picker binary, run with its generated Deployment's arguments and
//!   impersonating its generated ServiceAccount, discovers the graph's pods through its
//!   InferencePool and follows them as they change.
//!
//! Every process here is a real binary whose requests the API server's authorizer checks
//! against the generated Roles, so a missing verb fails these tests.

mod cluster;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cluster::kubelet::FakeNode;
use cluster::{
    COMPONENT_TYPE_LABEL, ControlPlane, GRAPH_LABEL, Process, apply_samples, diagnostics,
    eventually, free_port, graph, platform, poll, running_pods, wait_ready,
};
use dynamo_local::prometheus::{LocalPrometheus, ScrapeTarget};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt as _};
use serde_json::Value;

/// The graph's Running pods of one component type.
async fn running_of(client: &Client, namespace: &str, graph: &str, kind: &str) -> Vec<Pod> {
    running_pods(
        client,
        namespace,
        &format!("{GRAPH_LABEL}={graph},{COMPONENT_TYPE_LABEL}={kind}"),
    )
    .await
}

/// The graph's one Deployment of a component type (`epp`, `planner`).
async fn deployment(client: &Client, namespace: &str, graph: &str, kind: &str) -> Deployment {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let mut list = deployments
        .list(&ListParams::default().labels(&format!(
            "{GRAPH_LABEL}={graph},{COMPONENT_TYPE_LABEL}={kind}"
        )))
        .await
        .unwrap()
        .items;
    assert_eq!(list.len(), 1, "one {kind} Deployment of {graph}");
    list.remove(0)
}

/// The Deployment's main container and the ServiceAccount its pods run as.
fn pod_identity(deployment: &Deployment) -> (Container, String) {
    let spec = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .clone()
        .unwrap();
    let account = spec
        .service_account_name
        .clone()
        .expect("the operator names the pod's ServiceAccount");
    (spec.containers[0].clone(), account)
}

/// The container's environment as its pod in `namespace` sees it: plain values and the
/// downward API's namespace.
fn pod_env(container: &Container, namespace: &str) -> Vec<(String, String)> {
    container
        .env
        .iter()
        .flatten()
        .map(|e| {
            let field = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
            let value = match (&e.value, field) {
                (Some(v), _) => v.clone(),
                (None, Some(f)) if f.field_path == "metadata.namespace" => namespace.to_string(),
                _ => panic!("env {} of {}: {e:?}", e.name, container.name),
            };
            (e.name.clone(), value)
        })
        .collect()
}

/// The kubelet's part in the container's Secret volumes (there is no kubelet here): each
/// Secret's keys written under `dir`, and values of `env` that are paths into a mount
/// moved there.
async fn mount_secrets(
    client: &Client,
    namespace: &str,
    deployment: &Deployment,
    env: &mut [(String, String)],
    dir: &Path,
) {
    let spec = deployment.spec.as_ref().unwrap();
    let pod = spec.template.spec.as_ref().unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for mount in pod.containers[0].volume_mounts.iter().flatten() {
        let volume = pod.volumes.iter().flatten().find(|v| v.name == mount.name);
        let Some(name) = volume.and_then(|v| v.secret.as_ref()?.secret_name.clone()) else {
            continue;
        };
        let local = dir.join(&mount.name);
        std::fs::create_dir_all(&local).unwrap();
        let secret = secrets.get(&name).await.unwrap();
        for (key, value) in secret.data.iter().flatten() {
            std::fs::write(local.join(key), &value.0).unwrap();
        }
        for (_, value) in env.iter_mut() {
            if let Some(rest) = value.strip_prefix(mount.mount_path.as_str()) {
                *value = format!("{}{rest}", local.display());
            }
        }
    }
}

/// Sets the value that follows `flag` in `args`.
fn set_flag(args: &mut [String], flag: &str, value: &str) {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    args[at + 1] = value.to_string();
}

/// Removes `flag` and its value from `args`.
fn remove_flag(args: &mut Vec<String>, flag: &str) {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    args.drain(at..at + 2);
}

/// A binary built beside `dynamo` (by `cargo build`, or the workspace's test run).
fn sibling_binary(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_dynamo"))
        .parent()
        .unwrap()
        .join(name);
    assert!(
        path.exists(),
        "build it first (`cargo build -p {name}`): no {}",
        path.display()
    );
    path
}

/// Serves `body` as `/metrics` on a free loopback port, until the runtime stops.
async fn serve_metrics(body: String) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let body = body.clone();
            async move { body }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

async fn http_get(url: &str) -> Option<String> {
    let response = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    response.text().await.ok()
}

/// The `worker_id`s of the picker's per-pod gauges in a `/metrics` page.
fn picker_workers(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| l.starts_with("dynamo_frontend_worker_active_decode_blocks{"))
        .filter_map(|l| {
            let rest = &l[l.find("worker_id=\"")? + "worker_id=\"".len()..];
            Some(rest[..rest.find('"')?].to_string())
        })
        .collect()
}

/// Each pod's `IP:port`.
fn addresses(pods: &[Pod], port: u16) -> BTreeSet<String> {
    pods.iter()
        .map(|p| {
            let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
            format!("{ip}:{port}")
        })
        .collect()
}

/// `config/samples/dgdr.yaml` applied as a user applies it: the operator validates and
/// profiles the request, applies the graph it generated (owned by the request, named after
/// it, with the planner's profile ConfigMap), and the request reaches `Deployed` once that
/// graph's pods run on GPU nodes; each step's Event is recorded.
#[tokio::test]
async fn a_request_is_profiled_deployed_and_its_graph_ready() {
    let nodes = [
        FakeNode::gpu("h1", "clique-a", 8),
        FakeNode::gpu("h2", "clique-a", 8),
    ];
    let (cp, client, _operator, _kubelet) = platform(&nodes).await;
    let ns = "requests";
    apply_samples(&cp, ns, &["dgdr"]);
    let requests = cluster::nvidia_api(&client, "v1beta1", "dynamographdeploymentrequests", ns);
    let deployed = poll(60, || async {
        let request = serde_json::to_value(requests.get("qwen3-sla").await.ok()?).ok()?;
        (request["status"]["phase"] == "Deployed").then_some(request)
    })
    .await;
    let Some(request) = deployed else {
        let request = requests.get("qwen3-sla").await.map(|r| r.data);
        panic!(
            "the request is not Deployed after 60 s: {request:#?}\n{}",
            diagnostics(&cp, ns)
        );
    };
    let status = &request["status"];
    assert_eq!(status["dgdName"], "qwen3-sla", "{status:#}");
    let condition = |kind: &str| {
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == kind)
            .unwrap_or_else(|| panic!("no {kind} condition: {status:#}"))["status"]
            .clone()
    };
    for kind in [
        "Validation",
        "SpecGenerated",
        "DeploymentReady",
        "Succeeded",
    ] {
        assert_eq!(condition(kind), "True", "{kind}: {status:#}");
    }

    // The graph is the profiler's choice, controlled by the request, and ready.
    let selected = &status["profilingResults"]["selectedConfig"];
    let dgd = graph(&client, ns, "qwen3-sla")
        .await
        .expect("the generated graph");
    assert_eq!(dgd["status"]["state"], "ready", "{:#}", dgd["status"]);
    let owner = &dgd["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"], &owner["controller"]),
        (
            &Value::from("DynamoGraphDeploymentRequest"),
            &Value::from("qwen3-sla"),
            &Value::from(true)
        ),
        "{owner:#}"
    );
    assert_eq!(
        dgd["metadata"]["labels"]["dgdr.nvidia.com/name"], "qwen3-sla",
        "{:#}",
        dgd["metadata"]
    );
    let services = selected["spec"]["services"].as_object().unwrap();
    for (service, spec) in services {
        assert_eq!(
            dgd["spec"]["services"][service]["replicas"], spec["replicas"],
            "{service}"
        );
    }
    // Its engine pods run, as many as the profiler chose, each with the GPUs it chose.
    let workers = running_of(&client, ns, "qwen3-sla", "worker").await;
    let worker = &selected["spec"]["services"]["worker"];
    let chosen = worker["replicas"].as_u64().unwrap();
    let gpus = worker["resources"]["limits"]["gpu"].as_str().unwrap();
    assert!(chosen >= 1);
    assert_eq!(workers.len() as u64, chosen, "{}", diagnostics(&cp, ns));
    for pod in &workers {
        let limits = pod.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        assert_eq!(
            limits.get("nvidia.com/gpu").map(|q| q.0.as_str()),
            Some(gpus),
            "{}",
            pod.name_any()
        );
    }
    // The planner of real engines reads the profile the request wrote.
    let owner = cp
        .kubectl_ok(&[
            "get",
            "configmap",
            "-n",
            ns,
            "qwen3-sla-planner-profile",
            "-o",
            "jsonpath={.metadata.ownerReferences[0].kind}",
        ])
        .unwrap();
    assert_eq!(owner, "DynamoGraphDeploymentRequest");
    let events = cp
        .kubectl_ok(&[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            "involvedObject.name=qwen3-sla,involvedObject.kind=DynamoGraphDeploymentRequest",
            "-o",
            "jsonpath={.items[*].reason}",
        ])
        .unwrap();
    for reason in ["SpecGenerated", "DeploymentCreated", "DeploymentReady"] {
        assert!(
            events.split_whitespace().any(|r| r == reason),
            "{reason} in {events}"
        );
    }
}

/// The planner of `config/samples/agg-mocker-planner.yaml`, run as the real `dynamo
/// planner` binary with its generated Deployment's flags and environment (graph and
/// namespace) and impersonating the ServiceAccount the operator generated for it. It
/// plans in load mode (a user-facing mode that needs no profile) every second, reading a
/// real Prometheus that scrapes the picker's per-worker gauges showing a prefill queue of
/// more than a context on the one worker: it scales the worker up through the adapter's
/// `scale` subresource, which its Role allows, and the graph and its pods follow. The same
/// account may not write the graph itself.
#[tokio::test]
async fn the_planner_scales_through_the_adapter_with_its_generated_role() {
    let nodes = [FakeNode::gpu("n1", "clique-a", 8)];
    let (cp, client, _operator, _kubelet) = platform(&nodes).await;
    let ns = "planned";
    let name = "agg-mocker-planner";
    apply_samples(&cp, ns, &[name]);
    wait_ready(&cp, &client, ns, name).await;
    let adapter = format!("{name}-worker");
    let scale = |cp: &ControlPlane| {
        cp.kubectl_ok(&[
            "get",
            "dgdsa",
            "-n",
            ns,
            &adapter,
            "-o",
            "jsonpath={.spec.replicas}",
        ])
        .unwrap()
    };
    assert_eq!(scale(&cp), "1");

    // What the picker exports for its one worker: a prefill queue of 5 contexts (the
    // sample's `--context-length` is 4,096 tokens), so load mode adds a replica.
    let workers = running_of(&client, ns, name, "worker").await;
    assert_eq!(workers.len(), 1);
    let worker = addresses(&workers, 8000).pop_first().unwrap();
    let metrics = serve_metrics(format!(
        "# TYPE dynamo_frontend_worker_active_prefill_tokens gauge\n\
         dynamo_frontend_worker_active_prefill_tokens{{worker_id=\"{worker}\",worker_type=\"decode\"}} 20480\n\
         # TYPE dynamo_frontend_worker_active_decode_blocks gauge\n\
         dynamo_frontend_worker_active_decode_blocks{{worker_id=\"{worker}\",worker_type=\"decode\"}} 100\n\
         # TYPE dynamo_frontend_model_kv_cache_block_size gauge\n\
         dynamo_frontend_model_kv_cache_block_size{{model=\"Qwen/Qwen3-0.6B\"}} 64\n\
         # TYPE dynamo_epp_engine_kv_blocks gauge\n\
         dynamo_epp_engine_kv_blocks{{pod=\"{worker}\"}} 4096\n"
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let prometheus = LocalPrometheus::new(dir.path(), free_port(), name);
    let spec = prometheus.prepare().unwrap();
    prometheus
        .write_targets(&[ScrapeTarget {
            address: metrics.to_string(),
            component: "epp".into(),
            role: "epp".into(),
        }])
        .unwrap();
    let mut command = Command::new(&spec.program);
    command.args(&spec.args);
    let mut prometheus_process = Process::spawn("prometheus", command, dir.path());
    let http = reqwest::Client::new();
    if poll(20, || async { prometheus.ready(&http).await.then_some(()) })
        .await
        .is_none()
    {
        panic!(
            "Prometheus is not ready:\n{}",
            prometheus_process.running_output()
        );
    }

    // The planner as its pod runs it, but on loopback ports, every second, in load mode.
    let (container, account) = pod_identity(&deployment(&client, ns, name, "planner").await);
    let mut args = container.args.clone().unwrap_or_default();
    assert_eq!(
        (
            container.command.as_deref(),
            args.first().map(String::as_str)
        ),
        (Some(&["dynamo".to_string()][..]), Some("planner")),
        "{container:?}"
    );
    let planner_port = free_port();
    set_flag(&mut args, "--interval", "1s");
    set_flag(&mut args, "--startup-delay", "0s");
    set_flag(
        &mut args,
        "--metrics-addr",
        &format!("127.0.0.1:{planner_port}"),
    );
    remove_flag(&mut args, "--profile");
    // The sample plans in both modes; load mode alone needs no profile nor a load interval.
    set_flag(&mut args, "--mode", "load");
    remove_flag(&mut args, "--load-interval");
    args.extend(["--prometheus".into(), prometheus.url()]);
    let user = format!("system:serviceaccount:{ns}:{account}");
    let mut command = Command::new(env!("CARGO_BIN_EXE_dynamo"));
    command
        .args(&args)
        .envs(pod_env(&container, ns))
        .env("KUBECONFIG", cp.kubeconfig_as(&user).unwrap())
        .env("RUST_LOG", "info");
    let mut planner = Process::spawn("planner", command, dir.path());

    let scaled = poll(30, || async { (scale(&cp) == "2").then_some(()) }).await;
    if scaled.is_none() {
        panic!(
            "the planner did not scale the adapter to 2 within 30 s; planner:\n{}",
            planner.running_output()
        );
    }
    eventually("the graph's worker to have 2 replicas", 30, || async {
        let g = graph(&client, ns, name).await?;
        (g["spec"]["services"]["worker"]["replicas"] == 2).then_some(())
    })
    .await;
    eventually("a second worker pod to run", 30, || async {
        (running_of(&client, ns, name, "worker").await.len() == 2).then_some(())
    })
    .await;
    // The write went through the scale subresource, accepted: no refusal on the way.
    let exported = http_get(&format!("http://127.0.0.1:{planner_port}/metrics"))
        .await
        .unwrap();
    let output = planner.running_output();
    assert!(
        exported
            .lines()
            .any(|l| l.starts_with("dynamo_planner_scale_writes_total{result=\"ok\"}")),
        "{exported}\n{output}"
    );
    assert!(
        !exported.contains("result=\"forbidden\""),
        "{exported}\n{output}"
    );
    assert!(
        exported
            .lines()
            .any(|l| l.starts_with("dynamo_planner_decisions_total{reason=\"load_up\"}")),
        "{exported}\n{output}"
    );
    // Its account is limited to the adapters: it may not scale the graph directly.
    let can = |args: &[&str]| {
        let out = cp
            .kubectl()
            .args(["auth", "can-i", "-n", ns, "--as", &user])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let adapter_path = format!("dynamographdeploymentscalingadapters.nvidia.com/{adapter}");
    assert_eq!(can(&["patch", &adapter_path, "--subresource=scale"]), "yes");
    assert_eq!(can(&["patch", &adapter_path]), "no");
    let graph_path = format!("dynamographdeployments.nvidia.com/{name}");
    assert_eq!(can(&["patch", &graph_path]), "no");
    drop(prometheus_process);
}

/// The picker of `config/samples/agg-mocker.yaml`, run as the real `dynamo-epp` binary
/// with its generated Deployment's arguments (ports moved to free loopback ones) and
/// environment, impersonating the ServiceAccount the operator generated for it: through
/// its InferencePool it finds the graph's Ready worker pods (its per-pod gauges name the
/// pod's `IP:port`), follows the graph from two workers to three and down to one, and logs no
/// refused list or watch on the way.
#[tokio::test]
async fn the_picker_follows_the_pool_with_its_generated_role() {
    let nodes = [FakeNode::gpu("n1", "clique-a", 8)];
    let (cp, client, _operator, _kubelet) = platform(&nodes).await;
    let ns = "picked";
    let name = "agg-mocker";
    apply_samples(&cp, ns, &[name]);
    wait_ready(&cp, &client, ns, name).await;

    let epp = deployment(&client, ns, name, "epp").await;
    let (container, account) = pod_identity(&epp);
    assert_eq!(
        container.command.as_deref(),
        Some(&["dynamo-epp".to_string()][..]),
        "{container:?}"
    );
    let mut args = container.args.clone().unwrap_or_default();
    let metrics_port = free_port();
    set_flag(&mut args, "--host", "127.0.0.1");
    set_flag(&mut args, "--http-port", &free_port().to_string());
    set_flag(&mut args, "--ext-proc-port", &free_port().to_string());
    set_flag(&mut args, "--metrics-port", &metrics_port.to_string());
    let user = format!("system:serviceaccount:{ns}:{account}");
    let dir = tempfile::tempdir().unwrap();
    // The graph's credential, which the picker sends when it subscribes to the pods.
    let mut env = pod_env(&container, ns);
    mount_secrets(&client, ns, &epp, &mut env, dir.path()).await;
    let mut command = Command::new(sibling_binary("dynamo-epp"));
    command
        .args(&args)
        .envs(env)
        .env("KUBECONFIG", cp.kubeconfig_as(&user).unwrap())
        .env("RUST_LOG", "info");
    let mut picker = Process::spawn("dynamo-epp", command, dir.path());

    // The pool's pods on its target port, as the picker should see them.
    let pool_port: u16 = cp
        .kubectl_ok(&[
            "get",
            "inferencepools.inference.networking.k8s.io",
            "-n",
            ns,
            "-l",
            &format!("{GRAPH_LABEL}={name}"),
            "-o",
            "jsonpath={.items[0].spec.targetPorts[0].number}",
        ])
        .unwrap()
        .parse()
        .unwrap();
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let mut sees = async |count: usize| {
        let want = poll(30, || async {
            let pods = running_of(&client, ns, name, "worker").await;
            (pods.len() == count).then(|| addresses(&pods, pool_port))
        })
        .await
        .unwrap_or_else(|| panic!("{count} worker pods: {}", diagnostics(&cp, ns)));
        let seen = poll(30, || async {
            let seen = picker_workers(&http_get(&url).await?);
            (seen == want).then_some(())
        })
        .await;
        if seen.is_none() {
            let last = http_get(&url).await.unwrap_or_default();
            panic!(
                "the picker does not see {want:?}:\n{}\n{}",
                picker_workers(&last)
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(" "),
                picker.running_output()
            );
        }
    };
    // The sample runs two workers.
    sees(2).await;
    let patch = |replicas: u32| {
        cp.kubectl_ok(&[
            "patch",
            "-n",
            ns,
            &format!("dynamographdeployments.v1alpha1.nvidia.com/{name}"),
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"services":{{"worker":{{"replicas":{replicas}}}}}}}}}"#),
        ])
        .unwrap()
    };
    patch(3);
    sees(3).await;
    patch(1);
    sees(1).await;
    let output = picker.running_output();
    for refused in ["forbidden", "Forbidden", "watch failed"] {
        assert!(!output.contains(refused), "{refused}:\n{output}");
    }
}
