//! A real Kubernetes control plane for tests, the way controller-runtime's envtest runs
//! one: etcd and kube-apiserver (plus kube-scheduler and kube-controller-manager when a
//! test needs pods placed or garbage collected) as processes on free loopback ports, with
//! RBAC on, torn down when the [`ControlPlane`] is dropped.
//!
//! The binaries come from `KUBEBUILDER_ASSETS` (envtest's variable): `../shared/k8s/install.sh
//! DIR` or `setup-envtest use 1.36` fills such a folder. There is no kubelet: [`kubelet`]
//! registers nodes and plays the kubelet's part for the pods the scheduler binds.

pub mod kubelet;

use std::fmt::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use base64::prelude::{BASE64_STANDARD, Engine as _};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The variable naming the folder of the binaries, as in controller-runtime's envtest.
pub const ASSETS_VAR: &str = "KUBEBUILDER_ASSETS";

/// The test's own way in: a static token of a user in `system:masters`.
const ADMIN_TOKEN: &str = "envtest-admin";
const ADMIN_USER: &str = "envtest-admin";

/// Longest wait for the API server to serve its OpenAPI documents.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// What to run beside etcd and the API server.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// kube-scheduler: binds pods to nodes.
    pub scheduler: bool,
    /// kube-controller-manager with the controllers a workload needs (Deployments,
    /// ReplicaSets, garbage collection, namespaces, service accounts and their tokens,
    /// binding claims to volumes).
    pub controller_manager: bool,
    /// The scheduler and controller-manager start only when the test calls
    /// [`ControlPlane::start_controllers`], e.g. once a CRD's conversion webhook is up: a
    /// garbage collector that finds it unreachable retries its watch with a growing
    /// back-off, and collects nothing those objects own meanwhile.
    pub controllers_later: bool,
}

impl Options {
    /// The whole control plane: API server, scheduler and controller-manager.
    pub fn full() -> Self {
        Options {
            scheduler: true,
            controller_manager: true,
            controllers_later: false,
        }
    }
}

/// A running control plane; dropping it stops every process and removes its files.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    children: Vec<(&'static str, Child)>,
    server: String,
    ca_pem: String,
    assets: PathBuf,
    options: Options,
    /// How long the start took, up to the API server's OpenAPI documents.
    pub started_in: Duration,
}

/// The folder of the control-plane binaries, from `KUBEBUILDER_ASSETS`.
///
/// # Panics
/// When it is unset or lacks a binary, saying how to get them: tests that need a real API
/// server fail rather than skip.
pub fn assets() -> PathBuf {
    let dir = std::env::var_os(ASSETS_VAR).map(PathBuf::from);
    let missing = ["etcd", "kube-apiserver", "kubectl"]
        .into_iter()
        .find(|b| dir.as_ref().is_none_or(|d| !d.join(b).is_file()));
    if let Some(binary) = missing {
        panic!(
            "this test needs a real Kubernetes control plane: set {ASSETS_VAR} to a folder with \
             etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kubectl \
             ({binary} is missing{}). Get them with `../shared/k8s/install.sh .cache/k8s && \
             export {ASSETS_VAR}=$PWD/.cache/k8s` or controller-runtime's \
             `setup-envtest use 1.36 -p path`; `make k8s` does the former.",
            dir.map(|d| format!(" in {}", d.display()))
                .unwrap_or_else(|| format!("; {ASSETS_VAR} is unset"))
        );
    }
    let dir = dir.expect("checked above");
    std::path::absolute(&dir).unwrap_or(dir)
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    dynamo_server::free_port().expect("binding a loopback port")
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver (and what `options` asks for) and waits until the
    /// API server serves its OpenAPI documents, so client-side validation works at once.
    /// A port taken between choosing and binding it is retried with other ports.
    pub async fn start(options: Options) -> anyhow::Result<Self> {
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start(&options).await {
                Ok(cp) => return Ok(cp),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried at least once"))
    }

    async fn try_start(options: &Options) -> anyhow::Result<Self> {
        let begun = Instant::now();
        let assets = assets();
        // etcd's fsyncs are the slowest part of a start: keep its files in memory.
        let tmp = Path::new("/dev/shm");
        let dir = if tmp.is_dir() {
            tempfile::Builder::new()
                .prefix("envtest-")
                .tempdir_in(tmp)?
        } else {
            tempfile::Builder::new().prefix("envtest-").tempdir()?
        };
        let root = dir.path().to_path_buf();
        let path = |name: &str| root.join(name);
        // The key pair that signs and checks service-account tokens.
        let sa_key = rcgen::KeyPair::generate()?;
        std::fs::write(path("sa.key"), sa_key.serialize_pem())?;
        std::fs::write(path("sa.pub"), sa_key.public_key_pem())?;
        std::fs::write(
            path("tokens.csv"),
            format!("{ADMIN_TOKEN},{ADMIN_USER},{ADMIN_USER},system:masters\n"),
        )?;
        let (etcd_port, etcd_peer, api_port) = (free_port(), free_port(), free_port());
        let mut cp = ControlPlane {
            children: Vec::new(),
            server: format!("https://127.0.0.1:{api_port}"),
            ca_pem: String::new(),
            assets: assets.clone(),
            options: options.clone(),
            started_in: Duration::ZERO,
            dir,
        };
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        cp.spawn(
            "etcd",
            &[
                "--data-dir",
                &path("etcd").to_string_lossy(),
                "--listen-client-urls",
                &etcd_url,
                "--advertise-client-urls",
                &etcd_url,
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{etcd_peer}"),
            ],
        )?;
        let mut apiserver = vec![
            "--etcd-servers".to_string(),
            etcd_url,
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", path("certs").display()),
            format!("--service-account-key-file={}", path("sa.pub").display()),
            format!(
                "--service-account-signing-key-file={}",
                path("sa.key").display()
            ),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--authorization-mode=RBAC".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            format!("--token-auth-file={}", path("tokens.csv").display()),
            "--allow-privileged=true".into(),
            // Off by default, on in OpenShift: setting `blockOwnerDeletion` needs `update`
            // on the owner's `finalizers`.
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement".into(),
        ];
        if !options.controller_manager {
            // Its admission waits for the token controller, which only the
            // controller-manager runs.
            apiserver.push("--disable-admission-plugins=ServiceAccount".into());
        }
        let apiserver: Vec<&str> = apiserver.iter().map(String::as_str).collect();
        cp.spawn("kube-apiserver", &apiserver)?;
        cp.wait_ready().await?;
        cp.write_kubeconfig(&path("kubeconfig"), None)?;
        if !options.controllers_later {
            cp.start_controllers()?;
        }
        cp.started_in = begun.elapsed();
        Ok(cp)
    }

    /// Starts the scheduler and the controller-manager the options ask for, unless they
    /// run already.
    pub fn start_controllers(&mut self) -> anyhow::Result<()> {
        let running = |cp: &Self, name: &str| cp.children.iter().any(|(n, _)| *n == name);
        let kubeconfig = format!("--kubeconfig={}", self.kubeconfig().display());
        if self.options.scheduler && !running(self, "kube-scheduler") {
            self.spawn(
                "kube-scheduler",
                &[&kubeconfig, "--leader-elect=false", "--secure-port=0"],
            )?;
        }
        if self.options.controller_manager && !running(self, "kube-controller-manager") {
            let key = self.dir.path().join("sa.key");
            let ca = self.dir.path().join("ca.crt");
            self.spawn(
                "kube-controller-manager",
                &[
                    &kubeconfig,
                    "--leader-elect=false",
                    "--secure-port=0",
                    "--controllers=deployment-controller,replicaset-controller,\
                     garbage-collector-controller,namespace-controller,\
                     serviceaccount-controller,serviceaccount-token-controller,\
                     persistentvolume-binder-controller",
                    &format!("--service-account-private-key-file={}", key.display()),
                    &format!("--root-ca-file={}", ca.display()),
                    "--use-service-account-credentials=false",
                    "--kube-api-qps=200",
                    "--kube-api-burst=400",
                    "--concurrent-gc-syncs=5",
                ],
            )?;
        }
        Ok(())
    }

    /// Starts `binary` from the assets folder, its output in `{binary}.log` beside the
    /// control plane's files; it is killed when this process dies, even by a signal.
    fn spawn(&mut self, binary: &'static str, args: &[&str]) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.path().join(format!("{binary}.log")))?;
        let mut command = Command::new(self.assets.join(binary));
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        die_with_parent(&mut command);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", self.assets.join(binary).display()))?;
        self.children.push((binary, child));
        Ok(())
    }

    /// Waits for `/readyz`, then for `/openapi/v3` (served a little later), polling with
    /// the admin token; fails early, with the log's tail, when a process has exited.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let certs = self.dir.path().join("certs/apiserver.crt");
        loop {
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver was not ready within {START_TIMEOUT:?}:\n{}",
                    self.log_tail("kube-apiserver")
                );
            }
            if self.ca_pem.is_empty()
                && let Ok(chain) = std::fs::read_to_string(&certs)
                && let Some(ca) = last_pem_block(&chain)
            {
                // The self-signed serving certificate is followed by its CA.
                std::fs::write(self.dir.path().join("ca.crt"), &ca)?;
                self.ca_pem = ca;
            }
            if !self.ca_pem.is_empty()
                && self.answers("/readyz").await
                && self.answers("/openapi/v3").await
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn answers(&self, path: &str) -> bool {
        let Ok(client) = self.client().await else {
            return false;
        };
        let request = http_get(path);
        client.request_text(request).await.is_ok()
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        for (name, child) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                let name: &str = name;
                bail!("{name} exited ({status}):\n{}", self.log_tail(name));
            }
        }
        Ok(())
    }

    /// The last lines a process of the control plane wrote.
    fn log_tail(&self, binary: &str) -> String {
        let log = std::fs::read_to_string(self.dir.path().join(format!("{binary}.log")))
            .unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The admin's kubeconfig (group `system:masters`), for kubectl, helm and the like.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// Writes a kubeconfig whose requests impersonate `user` (e.g.
    /// `system:serviceaccount:NS:NAME`, which adds that account's groups), so the API
    /// server's real authorizer checks every verb against that user's RBAC.
    pub fn kubeconfig_as(&self, user: &str) -> anyhow::Result<PathBuf> {
        let path = self
            .dir
            .path()
            .join(format!("kubeconfig-{}", user.replace([':', '/'], "-")));
        self.write_kubeconfig(&path, Some(user))?;
        Ok(path)
    }

    fn write_kubeconfig(&self, path: &Path, impersonate: Option<&str>) -> anyhow::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml(impersonate))?;
        Ok(())
    }

    fn kubeconfig_yaml(&self, impersonate: Option<&str>) -> String {
        let ca = BASE64_STANDARD.encode(self.ca_pem.as_bytes());
        let mut user = format!("    token: {ADMIN_TOKEN}\n");
        if let Some(name) = impersonate {
            let _ = writeln!(user, "    as: {}", serde_json::Value::from(name));
        }
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    \
             server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: envtest\n  \
             user:\n{user}contexts:\n- name: envtest\n  context:\n    cluster: envtest\n    \
             user: envtest\n    namespace: default\ncurrent-context: envtest\n",
            self.server
        )
    }

    /// A client with the admin's rights.
    pub async fn client(&self) -> anyhow::Result<Client> {
        self.client_from(None).await
    }

    async fn client_from(&self, impersonate: Option<&str>) -> anyhow::Result<Client> {
        let kubeconfig = Kubeconfig::from_yaml(&self.kubeconfig_yaml(impersonate))?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// `kubectl` from the assets folder, talking to this control plane as the admin.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(self.assets.join("kubectl"));
        command.env("KUBECONFIG", self.kubeconfig());
        command
    }

    /// Runs `kubectl ARGS` as the admin and returns its stdout; fails with its stderr.
    pub fn kubectl_ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.kubectl().args(args).output()?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed ({}):\n{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Dependents first, etcd last.
        for (_, child) in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Has the process `command` starts killed when the thread that started it ends, as when
/// a test is killed on a timeout: nothing of a test outlives it.
pub fn die_with_parent(command: &mut Command) {
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe, as pre_exec requires.
    unsafe {
        command.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
}

fn http_get(path: &str) -> http::Request<Vec<u8>> {
    http::Request::get(path)
        .body(Vec::new())
        .expect("a GET of a path is a valid request")
}

fn last_pem_block(chain: &str) -> Option<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    let start = chain.rfind(BEGIN)?;
    let block = chain[start..].trim_end();
    block
        .ends_with("-----END CERTIFICATE-----")
        .then(|| format!("{block}\n"))
}
