//! The platform on a real control plane ([`dynamo_envtest`]): installed the way a user
//! installs it (`helm install` of the chart, the Gateway API and InferencePool CRDs) and
//! the operator binary run from outside the cluster with the chart's RBAC.
#![allow(dead_code, unused_imports)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use dynamo_envtest::{ControlPlane, Options, kubelet};
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
    let cp = ControlPlane::start(options)
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
        ])
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Operator {
    /// Starts the operator as `user` (impersonated: the API server's authorizer checks
    /// its every request against that user's RBAC) and waits until the graph CRD's
    /// conversion points at its webhook.
    pub async fn start(cp: &ControlPlane, user: &str, extra_args: &[&str]) -> Operator {
        let (webhook_port, metrics_port) = (free_port(), free_port());
        let webhook_url = format!("https://127.0.0.1:{webhook_port}/convert");
        let child = Command::new(env!("CARGO_BIN_EXE_dynamo"))
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
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let _ = self.child.wait();
    }
}

/// Polls `check` every 200 ms until it gives a value, for up to `seconds`; panics naming
/// `what` when it never does.
pub async fn eventually<T, F, Fut>(what: &str, seconds: u64, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {seconds} s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
