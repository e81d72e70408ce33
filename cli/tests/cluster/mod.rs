//! The platform on a real control plane ([`dynamo_envtest`]): installed the way a user
//! installs it (`helm install` of the chart, the Gateway API and InferencePool CRDs) and
//! the operator binary run from outside the cluster with the chart's RBAC.
#![allow(dead_code, unused_imports)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use dynamo_envtest::{ControlPlane, Options, free_port, kubelet};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

/// The chart's release and namespace in these tests, as docs/operator.md installs it.
pub const RELEASE: &str = "dynamo";
pub const NAMESPACE: &str = "dynamo-system";
/// The graph CRD, which the operator points at its webhook.
pub const GRAPH_CRD: &str = "dynamographdeployments.nvidia.com";

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A control plane; its start time is printed, since the tests' budget depends on it.
pub async fn start(options: Options) -> ControlPlane {
    let cp = ControlPlane::start(options.clone())
        .await
        .unwrap_or_else(|e| panic!("starting the control plane: {e:#}"));
    eprintln!("control plane ({options:?}) started in {:?}", cp.started_in);
    cp
}

/// helm, from `make helm` (or `HELM`).
pub fn helm() -> PathBuf {
    std::env::var_os("HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/bin/helm"))
}

/// The Gateway API HTTPRoute and the Inference Extension InferencePool CRDs, as a user
/// installs them from those projects' releases (here from `../shared/k8s/crds`, or
/// `THIRD_PARTY_CRDS`).
pub fn third_party_crds() -> Vec<PathBuf> {
    let dir = std::env::var_os("THIRD_PARTY_CRDS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/k8s/crds"));
    let files = [
        "gateway.networking.k8s.io_httproutes.yaml",
        "inference.networking.k8s.io_inferencepools.yaml",
    ]
    .map(|f| dir.join(f));
    for f in &files {
        assert!(
            f.is_file(),
            "{} is missing: set THIRD_PARTY_CRDS to a folder with Gateway API v1.6 \
             (standard) and Inference Extension v1.6 CRDs",
            f.display()
        );
    }
    files.into()
}

/// `helm install` of the chart (its CRDs included) into [`NAMESPACE`], after the Gateway
/// API and InferencePool CRDs, so the operator finds them at start-up.
pub fn install_platform(cp: &ControlPlane) {
    install_platform_with(cp, &[]);
}

/// [`install_platform`] with more `--set` values `sets`.
pub fn install_platform_with(cp: &ControlPlane, sets: &[&str]) {
    for crd in third_party_crds() {
        cp.kubectl_ok(&["apply", "--server-side", "-f", &crd.to_string_lossy()])
            .unwrap();
    }
    let out = Command::new(helm())
        .args([
            "install",
            RELEASE,
            "charts/dynamo-platform",
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            // The CRDs and RBAC: the operator runs outside the cluster (docs/operator.md).
            "--set",
            "replicaCount=0",
        ])
        .args(sets.iter().flat_map(|set| ["--set", set]))
        .env("KUBECONFIG", cp.kubeconfig())
        .env(
            "HELM_CACHE_HOME",
            cp.kubeconfig().with_file_name("helm-cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            cp.kubeconfig().with_file_name("helm-config"),
        )
        .env(
            "HELM_DATA_HOME",
            cp.kubeconfig().with_file_name("helm-data"),
        )
        .current_dir(repo_root())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}; `make helm` fetches it", helm().display()));
    assert!(
        out.status.success(),
        "helm install failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cp.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd",
        "--all",
    ])
    .unwrap();
}

/// The user the chart's ServiceAccount authenticates as.
pub fn operator_user(cp: &ControlPlane) -> String {
    let name = cp
        .kubectl_ok(&[
            "get",
            "serviceaccounts",
            "-n",
            NAMESPACE,
            "-l",
            &format!("app.kubernetes.io/instance={RELEASE}"),
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ])
        .unwrap();
    assert!(!name.is_empty(), "the chart made no ServiceAccount");
    format!("system:serviceaccount:{NAMESPACE}:{name}")
}

/// `dynamo operator` run from outside the cluster as a process, its webhook at
/// `--webhook-url`; stopped when dropped. Its logs go to the test's output.
pub struct Operator {
    child: Child,
    pub webhook_url: String,
    pub metrics_port: u16,
}

impl Operator {
    /// Starts the operator as `user` (impersonated: the API server's authorizer checks
    /// its every request against that user's RBAC) and waits until the graph CRD's
    /// conversion points at its webhook.
    pub async fn start(cp: &ControlPlane, user: &str, extra_args: &[&str]) -> Operator {
        let (webhook_port, metrics_port) = (free_port(), free_port());
        let webhook_url = format!("https://127.0.0.1:{webhook_port}/convert");
        let mut command = Command::new(env!("CARGO_BIN_EXE_dynamo"));
        dynamo_envtest::die_with_parent(&mut command);
        let child = command
            .arg("operator")
            .arg(format!("--webhook-url={webhook_url}"))
            .arg(format!("--port={metrics_port}"))
            .arg(format!("--lease-namespace={NAMESPACE}"))
            .arg("--debounce-ms=100")
            .args(extra_args)
            .env("KUBECONFIG", cp.kubeconfig_as(user).unwrap())
            .env("RUST_LOG", "info,dynamo_operator=debug")
            .stdin(Stdio::null())
            .spawn()
            .expect("the dynamo binary starts");
        let mut operator = Operator {
            child,
            webhook_url,
            metrics_port,
        };
        let client = cp.client().await.unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(client);
        let url = operator.webhook_url.clone();
        eventually("the CRD points at the operator's webhook", 30, || async {
            let crd = crds.get(GRAPH_CRD).await.ok()?;
            let config = crd.spec.conversion?.webhook?.client_config?;
            (config.url.as_deref() == Some(url.as_str()) && config.ca_bundle.is_some())
                .then_some(())
        })
        .await;
        assert!(
            operator.child.try_wait().unwrap().is_none(),
            "the operator exited"
        );
        operator
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

/// Stops `child` as Kubernetes stops a container (SIGTERM) and waits for it.
fn terminate(child: &mut Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let _ = child.wait();
}

/// A process of the test (a planner, a picker, Prometheus) with its output in a file;
/// stopped when dropped.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    pub fn spawn(name: &str, mut command: Command, dir: &Path) -> Process {
        dynamo_envtest::die_with_parent(&mut command);
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Process {
            name: name.to_string(),
            child,
            log,
        }
    }

    /// Its output so far, after checking that it still runs.
    pub fn running_output(&mut self) -> String {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{} exited ({status}):\n{}", self.name, self.output());
        }
        self.output()
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

/// Polls `check` every 200 ms until it gives a value, for up to `seconds`.
pub async fn poll<T, F, Fut>(seconds: u64, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// [`poll`], panicking naming `what` when `check` never gives a value.
pub async fn eventually<T, F, Fut>(what: &str, seconds: u64, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(seconds, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {seconds} s waiting for {what}"))
}

/// The `nvidia.com` resource `plural` at `version` (e.g. `v1beta1`), untyped, so a test
/// reads exactly what the API server serves in that version.
pub fn nvidia_api(
    client: &kube::Client,
    version: &str,
    plural: &str,
    namespace: &str,
) -> Api<kube::api::DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("nvidia.com", version, "");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// One object of `nvidia_api(..)` as JSON.
pub async fn get_json(
    client: &kube::Client,
    version: &str,
    plural: &str,
    namespace: &str,
    name: &str,
) -> serde_json::Value {
    let object = nvidia_api(client, version, plural, namespace)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading {plural}.{version} {namespace}/{name}: {e}"));
    serde_json::to_value(object).unwrap()
}

pub async fn create_namespace(client: &kube::Client, name: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let object = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    namespaces
        .create(&kube::api::PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
}

/// The label every object of a graph carries, with the graph's name.
pub const GRAPH_LABEL: &str = "nvidia.com/dynamo-graph-deployment-name";
/// The label of a pod's component type (`worker`, `epp`, `planner`, ...).
pub const COMPONENT_TYPE_LABEL: &str = "nvidia.com/dynamo-component-type";

/// A whole control plane with the platform installed, `nodes` registered, the test
/// kubelet running and the operator started with the chart's RBAC. The controllers start
/// once the operator's conversion webhook is up, as in a cluster where the operator runs
/// before graphs are deleted: the garbage collector watches graphs through it.
pub async fn platform(
    nodes: &[kubelet::FakeNode],
) -> (
    ControlPlane,
    kube::Client,
    Operator,
    tokio::task::JoinHandle<()>,
) {
    let mut cp = start(Options {
        controllers_later: true,
        ..Options::full()
    })
    .await;
    install_platform(&cp);
    let client = cp.client().await.unwrap();
    kubelet::add_nodes(&client, nodes).await.unwrap();
    let kubelet = kubelet::run(client.clone());
    let operator = Operator::start(&cp, &operator_user(&cp), &[]).await;
    cp.start_controllers().unwrap();
    (cp, client, operator, kubelet)
}

/// `kubectl apply -f config/samples/SAMPLE.yaml ...` into a new `namespace`.
pub fn apply_samples(cp: &ControlPlane, namespace: &str, samples: &[&str]) {
    cp.kubectl_ok(&["create", "namespace", namespace]).unwrap();
    let mut args = vec!["apply".to_string(), "-n".into(), namespace.into()];
    for sample in samples {
        let path = repo_root()
            .join("config/samples")
            .join(format!("{sample}.yaml"));
        args.extend(["-f".into(), path.to_string_lossy().into_owned()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cp.kubectl_ok(&args).unwrap();
}

/// What the cluster shows of `namespace`, for a failure message.
pub fn diagnostics(cp: &ControlPlane, namespace: &str) -> String {
    let show = |args: &[&str]| cp.kubectl_ok(args).unwrap_or_else(|e| e.to_string());
    format!(
        "{}\n{}",
        show(&["get", "pods", "-n", namespace, "-o", "wide"]),
        show(&["get", "events", "-n", namespace]),
    )
}

/// The graph as the API server serves it in v1alpha1, the stored version.
pub async fn graph(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Option<serde_json::Value> {
    let graph = nvidia_api(client, "v1alpha1", "dynamographdeployments", namespace)
        .get(name)
        .await
        .ok()?;
    serde_json::to_value(graph).ok()
}

/// Waits up to 90 s for the graph's `status.state` to be `ready`.
pub async fn wait_ready(cp: &ControlPlane, client: &kube::Client, namespace: &str, name: &str) {
    let ready = poll(90, || async {
        let g = graph(client, namespace, name).await?;
        (g["status"]["state"] == "ready").then_some(())
    })
    .await;
    if ready.is_none() {
        let status = graph(client, namespace, name)
            .await
            .map(|g| g["status"].clone());
        panic!(
            "graph {namespace}/{name} is not ready after 90 s: {status:#?}\n{}",
            diagnostics(cp, namespace)
        );
    }
}

/// The Running pods of `namespace` with the labels `selector`.
pub async fn running_pods(
    client: &kube::Client,
    namespace: &str,
    selector: &str,
) -> Vec<k8s_openapi::api::core::v1::Pod> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    pods.list(&kube::api::ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect()
}
