//! Installing the platform on a real API server (kube-apiserver v1.36 from
//! `KUBEBUILDER_ASSETS`): the generated CRDs with kubectl, both ways, and with helm; every
//! bad manifest refused naming its field; every sample applied both ways and read back in
//! both versions through the operator's conversion webhook, losing nothing.

mod cluster;

use std::path::{Path, PathBuf};

use cluster::{
    ControlPlane, Operator, Options, create_namespace, get_json, install_platform, nvidia_api,
    operator_user, repo_root,
};
use kube::api::PostParams;
use serde_json::Value;

fn crd_dir() -> String {
    repo_root().join("crds/manifests").to_string_lossy().into()
}

/// Waits until the API server serves the CRDs of [`crd_dir`]; kubectl's report.
fn wait_established(cp: &ControlPlane) -> String {
    let wait = ["wait", "--for=condition=Established", "--timeout=30s", "-f"];
    let mut args = wait.to_vec();
    let dir = crd_dir();
    args.push(&dir);
    cp.kubectl_ok(&args).unwrap()
}

#[tokio::test]
async fn the_generated_crds_install_with_kubectl_client_side_and_server_side() {
    let cp = cluster::start(Options::default()).await;
    // Client-side apply keeps the whole object in an annotation of at most 256 KiB.
    cp.kubectl_ok(&["apply", "-f", &crd_dir()]).unwrap();
    cp.kubectl_ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &crd_dir(),
    ])
    .unwrap();
    let established = wait_established(&cp);
    assert_eq!(established.lines().count(), 3, "{established}");
    // Each as `make crds` generates it, not only the checked-in copies.
    for crd in dynamo_crds::manifests::crds() {
        let name = crd.metadata.name.clone().unwrap();
        let served = cp
            .kubectl_ok(&[
                "get",
                "crd",
                &name,
                "-o",
                "jsonpath={.spec.versions[*].name}",
            ])
            .unwrap();
        let generated: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(served, generated.join(" "), "{name}");
    }
}

#[tokio::test]
async fn helm_installs_the_chart_with_its_crds() {
    let cp = cluster::start(Options::default()).await;
    install_platform(&cp);
    let crds = cp.kubectl_ok(&["get", "crd", "-o", "name"]).unwrap();
    for crd in dynamo_crds::manifests::crds() {
        let name = crd.metadata.name.unwrap();
        assert!(crds.contains(&name), "{name} missing from {crds}");
    }
    let objects = cp
        .kubectl_ok(&[
            "get",
            "deployment,serviceaccount,service,role,rolebinding",
            "-n",
            cluster::NAMESPACE,
            "-o",
            "name",
        ])
        .unwrap();
    for kind in [
        "deployment.apps/",
        "serviceaccount/",
        "service/dynamo-operator-webhook",
    ] {
        assert!(objects.contains(kind), "no {kind} in {objects}");
    }
    assert!(operator_user(&cp).starts_with("system:serviceaccount:dynamo-system:"));
}

/// The field path an `# expect:` line names, e.g. `spec.services.worker.replicas`.
fn expected_field(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let expect = text
        .lines()
        .find_map(|l| l.strip_prefix("# expect: "))
        .unwrap_or_else(|| panic!("{} has no # expect: line", path.display()));
    // "document 2 (Kind/name): field: message"
    let expect = match expect.split_once("): ") {
        Some((doc, rest)) if doc.starts_with("document ") => rest,
        _ => expect,
    };
    expect.split(':').next().unwrap().trim().to_string()
}

fn bad_manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("crds/tests/bad"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn the_api_server_refuses_every_bad_manifest_naming_its_field() {
    let cp = cluster::start(Options::default()).await;
    cp.kubectl_ok(&["apply", "--server-side", "-f", &crd_dir()])
        .unwrap();
    wait_established(&cp);
    let client = cp.client().await.unwrap();
    let files = bad_manifests();
    assert!(files.len() >= 20, "{files:?}");
    for (i, path) in files.iter().enumerate() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let namespace = format!("bad-{i}");
        create_namespace(&client, &namespace).await;
        let mut apply = cp.kubectl();
        apply.arg("apply");
        // A manifest that names its namespace is applied there.
        if !std::fs::read_to_string(path)
            .unwrap()
            .contains("\n  namespace:")
        {
            apply.args(["-n", &namespace]);
        }
        let out = apply.arg("-f").arg(path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} was accepted");
        // The server writes `spec.services[decode]` where we write `spec.services.decode`.
        let said = stderr.replace('[', ".").replace(']', "");
        let field = expected_field(path).replace('[', ".").replace(']', "");
        let parent = field.rsplit_once('.').map_or(field.as_str(), |(p, _)| p);
        let named = match name.as_str() {
            // No namespace can be named so: the object's namespace is not found.
            "namespace-not-a-label.yaml" => said.contains("namespaces \"team.a\" not found"),
            // An unknown kind never reaches a server that serves no such resource.
            "unknown-kind.yaml" => said.contains("no matches for kind"),
            _ => said.contains(&field) || said.contains(&format!("{parent}:")),
        };
        assert!(
            named,
            "{name}: the refusal does not name {field}:\n{stderr}"
        );
        // kubectl applies the documents of a file one by one: only the bad one is refused.
        let mut stored = Vec::new();
        for (version, plural) in [
            ("v1alpha1", "dynamographdeployments"),
            ("v1beta1", "dynamographdeploymentrequests"),
            ("v1alpha1", "dynamographdeploymentscalingadapters"),
        ] {
            let api = nvidia_api(&client, version, plural, &namespace);
            let list = api.list(&Default::default()).await.unwrap();
            stored.extend(
                list.items
                    .into_iter()
                    .map(|o| format!("{plural}/{}", o.metadata.name.unwrap())),
            );
        }
        let expected: &[&str] = if name == "second-document-bad.yaml" {
            &["dynamographdeployments/bad"]
        } else {
            &[]
        };
        assert_eq!(stored, expected, "{name}");
    }
}

/// config/samples and its subfolders (`dynamo/`, `v1beta1/`), each with its YAML files:
/// names are unique within a folder, so each folder is applied at once into a namespace.
fn sample_folders() -> Vec<(PathBuf, Vec<PathBuf>)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, Vec<PathBuf>)>) {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
        files.sort();
        out.push((dir.to_path_buf(), files));
    }
    let mut folders = Vec::new();
    walk(&repo_root().join("config/samples"), &mut folders);
    folders.sort();
    folders
}

/// What a user wrote and what they read back: the spec, labels and annotations.
fn user_fields(object: &Value) -> Value {
    serde_json::json!({
        "spec": object["spec"],
        "labels": object["metadata"]["labels"],
        "annotations": object["metadata"]["annotations"],
    })
}

/// Whether every field of `written` is in `read` with the same value (the server may
/// add defaults and kubectl its annotation, never change what was written).
fn contains(read: &Value, written: &Value) -> bool {
    match (read, written) {
        (_, Value::Null) => true,
        (Value::Object(r), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| r.get(k).is_some_and(|rv| contains(rv, wv))),
        _ => read == written,
    }
}

#[tokio::test]
async fn every_sample_applies_both_ways_and_reads_back_in_both_versions() {
    let cp = cluster::start(Options::default()).await;
    install_platform(&cp);
    let _operator = Operator::start(&cp, &operator_user(&cp), &[]).await;
    let client = cp.client().await.unwrap();
    let graphs = "dynamographdeployments";
    let mut checked = 0;
    let folders = sample_folders();
    let ways = [
        ("client", &["apply"][..]),
        ("server", &["apply", "--server-side"]),
    ];
    for ((way, args), (i, (folder, files))) in ways
        .into_iter()
        .flat_map(|way| folders.iter().enumerate().map(move |f| (way, f)))
    {
        let namespace = format!("{way}-{i}");
        create_namespace(&client, &namespace).await;
        let mut apply = args.to_vec();
        apply.extend(["-n", &namespace, "-f", folder.to_str().unwrap()]);
        cp.kubectl_ok(&apply)
            .unwrap_or_else(|e| panic!("{}: {e:#}", folder.display()));
        for path in files {
            let yaml = std::fs::read_to_string(path).unwrap();
            let sample: Value = serde_saphyr::from_str(&yaml).unwrap();
            let (api_version, kind) = (
                sample["apiVersion"].as_str().unwrap(),
                sample["kind"].as_str().unwrap(),
            );
            let name = sample["metadata"]["name"].as_str().unwrap();
            if kind != "DynamoGraphDeployment" {
                let version = api_version.trim_start_matches("nvidia.com/");
                let plural = format!("{}s", kind.to_lowercase());
                let read = get_json(&client, version, &plural, &namespace, name).await;
                assert!(
                    contains(&user_fields(&read), &user_fields(&sample)),
                    "{}",
                    path.display()
                );
                continue;
            }
            let (written, other) = if api_version.ends_with("v1alpha1") {
                ("v1alpha1", "v1beta1")
            } else {
                ("v1beta1", "v1alpha1")
            };
            let as_written = get_json(&client, written, graphs, &namespace, name).await;
            assert!(
                contains(&user_fields(&as_written), &user_fields(&sample)),
                "{} read back as {written} lost a field:\n{:#}",
                path.display(),
                user_fields(&as_written)
            );
            // Through the webhook to the other version, written back as a new object in
            // that version, read in the first: the same fields.
            let converted = get_json(&client, other, graphs, &namespace, name).await;
            assert_eq!(converted["apiVersion"], format!("nvidia.com/{other}"));
            let copy_name = format!("{name}-copy");
            let mut copy = serde_json::json!({
                "apiVersion": converted["apiVersion"],
                "kind": kind,
                "metadata": {"name": copy_name, "namespace": namespace},
                "spec": converted["spec"],
            });
            for key in ["labels", "annotations"] {
                if let Some(v) = converted["metadata"].get(key) {
                    copy["metadata"][key] = v.clone();
                }
            }
            // kubectl's record of the first object's apply is not the copy's.
            let last_applied = "kubectl.kubernetes.io/last-applied-configuration";
            if let Some(a) = copy["metadata"]["annotations"].as_object_mut() {
                a.remove(last_applied);
            }
            nvidia_api(&client, other, graphs, &namespace)
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(copy).unwrap(),
                )
                .await
                .unwrap_or_else(|e| panic!("{} as {other}: {e}", path.display()));
            let round_trip = get_json(&client, written, graphs, &namespace, &copy_name).await;
            let mut expected = user_fields(&as_written);
            if let Some(a) = expected["annotations"].as_object_mut() {
                a.remove(last_applied);
                if a.is_empty() {
                    expected["annotations"] = Value::Null;
                }
            }
            assert_eq!(
                user_fields(&round_trip),
                expected,
                "{} ({way}-side) changed on its way through {other}",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 22, "only {checked} graphs round-tripped");
}
