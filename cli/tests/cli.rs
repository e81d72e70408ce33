//! The `dynamo` binary as a user runs it.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn dynamo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dynamo"))
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("dynamo runs")
}

/// A scratch directory of this test process.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-{}", std::process::id()))
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn validate_accepts_a_sample_and_names_the_object() {
    let out = dynamo(&["validate", "-f", "config/samples/disagg-mocker.yaml"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("DynamoGraphDeployment/disagg-mocker is valid"),
        "{stdout}"
    );
}

#[test]
fn validate_refuses_a_bad_manifest_with_the_field_and_fails() {
    let out = dynamo(&[
        "validate",
        "-f",
        "config/samples/agg-mocker.yaml",
        "crds/tests/bad/multinode-one-node.yaml",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("multinode-one-node.yaml")
            && stderr.contains("spec.services.decode.multinode.nodeCount"),
        "{stderr}"
    );
    // The good file is still reported as valid.
    assert!(String::from_utf8_lossy(&out.stdout).contains("agg-mocker is valid"));
}

#[test]
fn crds_writes_every_generated_file_and_removes_stale_yaml() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("crds-root");
    let _ = std::fs::remove_dir_all(&root);
    let stale = root.join("crds/manifests/nvidia.com_renamed.yaml");
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    std::fs::write(&stale, "old").unwrap();

    let out = dynamo(&["crds", "--root", root.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");

    assert!(!stale.exists(), "a YAML file no type generates is removed");
    let generated = dynamo_crds::generated_files()
        .into_iter()
        .chain(dynamo_operator::controller::rbac::generated_files());
    for (path, content) in generated {
        let written = std::fs::read_to_string(root.join(&path)).unwrap();
        assert_eq!(written, content, "{}", path.display());
    }
}

#[test]
fn validate_reports_every_file_with_field_paths_and_readable_messages() {
    let out = dynamo(&[
        "validate",
        "-f",
        "no/such/file.yaml",
        "crds/tests/bad/name-uppercase-underscore.yaml",
        "crds/tests/bad/name-300-characters.yaml",
        "crds/tests/bad/name-nul-byte.yaml",
        "crds/tests/bad/replicas-a-string.yaml",
        "crds/tests/bad/replicas-above-int32.yaml",
        "config/samples/agg-mocker.yaml",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "no/such/file.yaml: cannot read: No such file or directory",
        "name-uppercase-underscore.yaml: document 1 (DynamoGraphDeployment): metadata.name: \"MyGraph_X\" is not a valid DNS-1123 subdomain: it contains 'M'",
        "name-300-characters.yaml: document 1 (DynamoGraphDeployment): metadata.name: ",
        "(300 characters) is not a valid DNS-1123 subdomain: it has 300 characters",
        "name-nul-byte.yaml: document 1 (DynamoGraphDeployment): metadata.name: \"graph\\0x\" is not a valid DNS-1123 subdomain: it contains '\\0'",
        "replicas-a-string.yaml: document 1 (DynamoGraphDeployment/bad): spec.services.worker.replicas: must be an integer, got the string \"three\"",
        "replicas-above-int32.yaml: document 1 (DynamoGraphDeployment/bad): spec.services.decode.replicas: must be <= 2147483647, got 2147483648",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in:\n{stderr}");
    }
    assert!(!stderr.contains("is not of type"), "{stderr}");
    // One line per problem, each naming its file; and no problem without its field.
    for line in stderr.lines() {
        assert!(
            line.contains(": cannot read: ")
                || line.contains("): spec.")
                || line.contains("): metadata."),
            "a problem without a field path: {line}"
        );
    }
    // The files after the bad ones are still checked.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("agg-mocker is valid"), "{stdout}");
}

#[test]
fn validate_refuses_graphs_whose_generated_names_the_api_server_would_refuse() {
    let dir = scratch("generated-names");
    let gang_service = "d".repeat(57);
    let file = write(
        &dir,
        "names.yaml",
        &format!(
            r#"apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata:
  name: 1graph
spec:
  services:
    worker:
      componentType: worker
---
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata:
  name: g
spec:
  services:
    {gang_service}:
      componentType: decode
      replicas: 100000
      multinode:
        nodeCount: 2
      resources:
        limits:
          gpu: "8"
"#
        ),
    );
    let out = dynamo(&["validate", "-f", &file]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "document 1 (DynamoGraphDeployment/1graph): metadata.name: the endpoint picker's Service name \"1graph-epp\" is not a valid DNS-1035 label: it starts with '1'".to_string(),
        format!(
            "document 2 (DynamoGraphDeployment/g): spec.services.{gang_service}.replicas: the gang's headless Service name \"g-{gang_service}-99999\" is not a valid DNS-1035 label: it has 65 characters"
        ),
    ] {
        assert!(stderr.contains(&expected), "{expected:?} not in:\n{stderr}");
    }
}

/// `dynamo run` with stand-ins for the picker, sidecar and engine (each sleeps until
/// signalled), so the runner's own surfaces are tested without those binaries. Stopped
/// with SIGTERM (which stops its children) when dropped.
struct LocalRun {
    child: Child,
    admin: String,
}

impl LocalRun {
    fn start(extra: &[&str], envs: &[(&str, &str)]) -> Self {
        let bins = scratch(&format!("bins-{}", free_port()));
        for name in ["dynamo-epp", "dynamo-sidecar", "dynamo-mocker"] {
            // By its path: the run and its children have no PATH.
            let path = write(&bins, name, "#!/bin/sh\nexec /bin/sleep 120\n");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let admin_port = free_port().to_string();
        let child = run_command(SAMPLE, extra, envs)
            .args(["--admin-port", &admin_port])
            .arg("--bin-dir")
            .arg(&bins)
            .stdout(Stdio::null())
            .spawn()
            .expect("dynamo run starts");
        Self {
            child,
            admin: format!("http://127.0.0.1:{admin_port}"),
        }
    }

    /// Waits until the admin API answers at all, then returns its answer to `GET /graph`.
    async fn graph(&self, token: Option<&str>) -> reqwest::Response {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut request = reqwest::Client::new().get(format!("{}/graph", self.admin));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            match request.send().await {
                Ok(response) => return response,
                Err(err) => assert!(
                    Instant::now() < deadline,
                    "the admin API never answered: {err}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET /graph` once every process it lists has started (no pid is 0).
    async fn started_graph(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let graph: Value = self.graph(None).await.json().await.unwrap();
            if !graph_pids(&graph).contains(&0) {
                return graph;
            }
            assert!(Instant::now() < deadline, "never all started: {graph}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn scale(&self, token: Option<&str>, body: Value) -> reqwest::Response {
        let mut request = reqwest::Client::new().post(format!("{}/scale", self.admin));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.json(&body).send().await.unwrap()
    }
}

impl Drop for LocalRun {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let _ = self.child.wait();
    }
}

/// The aggregated mocker sample: an endpoint picker and two workers.
const SAMPLE: &str = "config/samples/agg-mocker.yaml";

/// `dynamo run -f file` on free ports, without PATH, so a run that got past its checks
/// by mistake fails to find its binaries instead of hanging.
fn run_command(file: &str, extra: &[&str], envs: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_dynamo"));
    command
        .args(["run", "-f", file])
        .args(["--model-path", "/models/qwen-mock", "--grace", "2"])
        .args(["--port", &free_port().to_string()])
        .args(extra)
        .env("PATH", "")
        .env_remove("DYNAMO_ADMIN_TOKEN")
        .envs(envs.iter().copied())
        .current_dir(repo_root());
    command
}

fn free_port() -> u16 {
    dynamo_server::free_port().unwrap()
}

#[test]
fn run_caps_replicas_and_processes_before_starting_anything() {
    let dir = scratch("caps");
    let sample = std::fs::read_to_string(repo_root().join(SAMPLE)).unwrap();
    let huge = write(
        &dir,
        "huge.yaml",
        &sample.replace("replicas: 2", "replicas: 100000"),
    );
    for (file, args, expected) in [
        (
            huge.as_str(),
            vec![],
            "service \"worker\": 100000 replicas is more than the local cap of 32 per service (--max-replicas)",
        ),
        (
            SAMPLE,
            vec!["--replicas", "worker=40"],
            "service \"worker\": 40 replicas is more than the local cap of 32 per service (--max-replicas)",
        ),
        (
            SAMPLE,
            vec!["--max-replicas", "3", "--replicas", "worker=4"],
            "service \"worker\": 4 replicas is more than the local cap of 3 per service (--max-replicas)",
        ),
        (
            SAMPLE,
            vec!["--max-processes", "4"],
            "2 replicas would run 5 processes (an engine and a sidecar each, and the picker), more than the local cap of 4 (--max-processes)",
        ),
    ] {
        let out = run_command(file, &args, &[]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: {expected:?} not in:\n{stderr}"
        );
    }
}

#[test]
fn run_refuses_an_admin_api_beyond_loopback_without_a_token() {
    let out = run_command(SAMPLE, &["--admin-host", "0.0.0.0"], &[])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the admin API would listen on 0.0.0.0:")
            && stderr.contains("beyond this machine, without a token"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_admin_api_beyond_loopback_takes_only_its_bearer_token_and_caps_scaling() {
    let run = LocalRun::start(
        &["--admin-host", "0.0.0.0"],
        &[("DYNAMO_ADMIN_TOKEN", "s3cret")],
    );
    for token in [None, Some("s3cre"), Some("s3cret-and-more")] {
        let response = run.graph(token).await;
        assert_eq!(response.status(), 401, "{token:?}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].as_str().unwrap().contains("token"), "{body}");
    }
    let response = run.graph(Some("s3cret")).await;
    assert_eq!(response.status(), 200);
    let graph: Value = response.json().await.unwrap();
    assert_eq!(graph["name"], "agg-mocker");
    assert_eq!(graph["services"]["worker"].as_array().unwrap().len(), 2);

    let response = run
        .scale(Some("s3cret"), json!({"service": "worker", "replicas": 33}))
        .await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["error"],
        "service \"worker\": 33 replicas is more than the local cap of 32 per service (--max-replicas)"
    );
    let response = run
        .scale(Some("s3cret"), json!({"service": "worker", "replicas": 1}))
        .await;
    assert_eq!(response.status(), 200);
    let graph: Value = response.json().await.unwrap();
    assert_eq!(graph["services"]["worker"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn the_admin_api_on_loopback_is_open_unless_given_a_token_file() {
    let open = LocalRun::start(&[], &[]);
    assert_eq!(open.graph(None).await.status(), 200);
    drop(open);

    let token = write(&scratch("token"), "token", "from-a-file\n");
    let guarded = LocalRun::start(&["--admin-token-file", &token], &[]);
    assert_eq!(guarded.graph(None).await.status(), 401);
    assert_eq!(guarded.graph(Some("from-a-file")).await.status(), 200);
}

/// The pids of `parent`'s children, from /proc.
fn children(parent: u32) -> BTreeSet<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // `pid (comm) state ppid ...`; comm may hold spaces, so read after its `)`.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// Every pid `GET /graph` lists: the picker's, and each replica's engine and sidecar.
fn graph_pids(graph: &Value) -> BTreeSet<u32> {
    let replicas = graph["services"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|list| list.as_array().unwrap());
    replicas
        .flat_map(|r| [&r["engine_pid"], &r["sidecar_pid"]])
        .chain([&graph["epp_pid"]])
        .map(|pid| u32::try_from(pid.as_u64().unwrap()).unwrap())
        .collect()
}

#[tokio::test]
async fn a_scale_that_cannot_be_recorded_changes_nothing() {
    let tmp = scratch(&format!("state-{}", free_port()));
    let run = LocalRun::start(&[], &[("TMPDIR", tmp.to_str().unwrap())]);
    let before = run.started_graph().await;
    assert_eq!(before["services"]["worker"].as_array().unwrap().len(), 2);
    let running = children(run.child.id());
    assert_eq!(graph_pids(&before), running, "{before}");

    // A directory where the picker's list goes: no write can replace it, root's neither.
    let endpoints = tmp
        .join(format!("dynamo-run-{}", run.child.id()))
        .join("endpoints.json");
    std::fs::remove_file(&endpoints).unwrap();
    std::fs::create_dir(&endpoints).unwrap();
    for replicas in [4, 1] {
        let response = run
            .scale(None, json!({"service": "worker", "replicas": replicas}))
            .await;
        assert_eq!(response.status(), 500, "to {replicas}");
        let body: Value = response.json().await.unwrap();
        let message = body["error"].as_str().unwrap();
        assert!(message.contains("endpoints.json"), "{message}");
        let graph: Value = run.graph(None).await.json().await.unwrap();
        assert_eq!(graph, before, "to {replicas}");
        assert_eq!(children(run.child.id()), running, "to {replicas}");
    }

    // Once the list can be written again, the same request scales.
    std::fs::remove_dir(&endpoints).unwrap();
    let response = run
        .scale(None, json!({"service": "worker", "replicas": 4}))
        .await;
    assert_eq!(response.status(), 200);
    let graph = run.started_graph().await;
    assert_eq!(graph["services"]["worker"].as_array().unwrap().len(), 4);
    assert_eq!(graph_pids(&graph), children(run.child.id()), "{graph}");
    let list: Value = serde_json::from_slice(&std::fs::read(&endpoints).unwrap()).unwrap();
    assert!(list["endpoints"].is_array(), "{list}");
}

/// `GET /graph` on the admin port with exactly these header lines, on a raw connection so
/// the test and not a client decides the `Host`; the status and the body.
fn raw_graph(admin: &str, headers: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let address = admin.strip_prefix("http://").unwrap();
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET /graph HTTP/1.1\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).unwrap().parse().unwrap();
    let body = response.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body)
}

#[tokio::test]
async fn the_admin_api_on_loopback_serves_only_loopback_host_names() {
    let open = LocalRun::start(&[], &[]);
    assert_eq!(open.graph(None).await.status(), 200);
    let port = open.admin.rsplit_once(':').unwrap().1;
    // What a page of another site reaches after its name is rebound to 127.0.0.1.
    for host in [
        "evil.example",
        &format!("evil.example:{port}"),
        "localhost.evil.example",
    ] {
        let (status, body) = raw_graph(&open.admin, &format!("Host: {host}\r\n"));
        assert_eq!(status, 403, "{host}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert!(body["error"].as_str().unwrap().contains("Host"), "{body}");
    }
    let (status, _) = raw_graph(&open.admin, "");
    assert_eq!(status, 403, "no Host at all");
    for host in [
        "localhost".to_owned(),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "[::1]".to_owned(),
    ] {
        let (status, body) = raw_graph(&open.admin, &format!("Host: {host}\r\n"));
        assert_eq!(status, 200, "{host}: {body}");
    }
    drop(open);

    // A token authenticates the caller whatever name it used.
    let guarded = LocalRun::start(&[], &[("DYNAMO_ADMIN_TOKEN", "s3cret")]);
    assert_eq!(guarded.graph(Some("s3cret")).await.status(), 200);
    let (status, body) = raw_graph(
        &guarded.admin,
        "Host: evil.example\r\nAuthorization: Bearer s3cret\r\n",
    );
    assert_eq!(status, 200, "{body}");
}
