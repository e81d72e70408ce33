//! The `Dockerfile` builds what the operator and the chart run: every binary a generated
//! container or the chart's operator Deployment starts from the dynamo image is a real
//! binary of the workspace, built with `cargo build --release --locked` and copied onto the
//! image's PATH, and the image runs as a numeric non-root user. (No container engine runs
//! here, so the image itself is not built by the tests; `make image` builds it.)

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::{cluster, observed, repo_root, run, sample};
use dynamo_operator::reconcile::DEFAULT_IMAGE;
use k8s_openapi::api::core::v1::Container;

/// One instruction of a Dockerfile: keyword and its arguments, continuation lines joined.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

fn dockerfile() -> Vec<Instruction> {
    let text = std::fs::read_to_string(repo_root().join("Dockerfile")).expect("Dockerfile");
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(trimmed);
                let (keyword, args) = pending.split_once(' ').unwrap_or((&pending, ""));
                out.push(Instruction {
                    keyword: keyword.to_ascii_uppercase(),
                    args: args.trim().to_string(),
                });
                pending.clear();
            }
        }
    }
    out
}

/// The instructions of each stage, by the stage's name (the last one: the image).
fn stages(instructions: Vec<Instruction>) -> Vec<(String, Vec<Instruction>)> {
    let mut stages: Vec<(String, Vec<Instruction>)> = Vec::new();
    for i in instructions {
        if i.keyword == "FROM" {
            let words: Vec<&str> = i.args.split_whitespace().collect();
            let name = match words.as_slice() {
                [.., as_, name] if as_.eq_ignore_ascii_case("as") => name.to_string(),
                _ => String::new(),
            };
            stages.push((name, Vec::new()));
        } else if let Some((_, body)) = stages.last_mut() {
            body.push(i);
        }
    }
    stages
}

/// `[[bin]]` targets of the workspace's packages.
fn workspace_binaries() -> BTreeSet<String> {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(repo_root())
        .output()
        .expect("cargo metadata runs");
    assert!(output.status.success(), "{output:?}");
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap())
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

/// The binary each container of the dynamo image starts, from every sample graph the
/// operator renders and from the chart's operator Deployment.
fn binaries_run_from_the_image() -> BTreeSet<String> {
    let mut containers: Vec<Container> = Vec::new();
    for name in [
        "agg-mocker",
        "agg-mocker-planner",
        "disagg-mocker",
        "agg-vllm",
        "disagg-vllm",
        "multinode-vllm",
    ] {
        let desired = run(&sample(name), &observed(vec![], cluster()));
        let pods = desired.pods.iter().filter_map(|p| p.spec.clone());
        let templates = desired
            .deployments
            .iter()
            .filter_map(|d| d.spec.as_ref()?.template.spec.clone());
        containers.extend(pods.chain(templates).flat_map(|s| {
            s.containers
                .into_iter()
                .chain(s.init_containers.into_iter().flatten())
        }));
    }
    let mut binaries: BTreeSet<String> = containers
        .iter()
        .filter(|c| c.image.as_deref() == Some(DEFAULT_IMAGE))
        .map(|c| {
            // The image holds several binaries: none may rely on its entrypoint.
            let command = c.command.as_ref().unwrap_or_else(|| {
                panic!("container {} of the dynamo image names no command", c.name)
            });
            command[0].clone()
        })
        .collect();
    let template = std::fs::read_to_string(
        repo_root().join("charts/dynamo-platform/templates/deployment.yaml"),
    )
    .unwrap();
    let command = template
        .lines()
        .find_map(|l| l.trim().strip_prefix("command: "))
        .expect("the chart names the operator's command");
    let command: Vec<String> = serde_json::from_str(command).unwrap();
    binaries.insert(command[0].clone());
    binaries
}

#[test]
fn the_image_holds_every_binary_the_operator_and_the_chart_run() {
    let stages = stages(dockerfile());
    assert!(stages.len() >= 2, "a multi-stage build: {stages:?}");
    let (builder, build) = stages
        .iter()
        .find(|(_, body)| {
            body.iter()
                .any(|i| i.keyword == "RUN" && i.args.contains("cargo build"))
        })
        .expect("a stage runs cargo build");
    let build = build
        .iter()
        .find(|i| i.keyword == "RUN" && i.args.contains("cargo build"))
        .unwrap();
    assert!(
        build.args.contains("cargo build --release --locked"),
        "{build:?}"
    );
    let words: Vec<&str> = build.args.split_whitespace().collect();
    let built: BTreeSet<&str> = words
        .windows(2)
        .filter(|w| w[0] == "--bin")
        .map(|w| w[1])
        .collect();

    let (_, image) = stages.last().unwrap();
    let mut copied = BTreeSet::new();
    let mut model_copied = false;
    let mut connector_deps_copied = false;
    let mut nixl_dirs = BTreeSet::new();
    for copy in image.iter().filter(|i| i.keyword == "COPY") {
        let words: Vec<&str> = copy.args.split_whitespace().collect();
        let (source, target) = (words[1], words[2]);
        if words[0] != format!("--from={builder}") {
            // The only other things the image holds: NIXL's libraries for the sidecars,
            // the vLLM connector's dependency where `dynamo connector install` copies it
            // from, and the mock engine's model directory, where the operator points the
            // mocker by default.
            if words[0] == "--from=nixl" {
                nixl_dirs.insert(target.to_owned());
                continue;
            }
            if words[0] == "--from=connector-deps" {
                assert_eq!(target, dynamo_wiring::connector::IMAGE_DEPS_DIR, "{copy:?}");
                connector_deps_copied = true;
                continue;
            }
            assert_eq!(
                target,
                dynamo_operator::reconcile::OperatorConfig::default().mocker_model_path,
                "{copy:?}"
            );
            model_copied = true;
            continue;
        }
        let name = target
            .strip_prefix("/usr/local/bin/")
            .unwrap_or_else(|| panic!("{target} is not on the image's PATH"));
        let file = source.rsplit('/').next().unwrap();
        assert_eq!(file, name, "{copy:?}");
        // Built by cargo, and moved out of the target cache by the same RUN.
        assert!(built.contains(name), "{name} is not built: {built:?}");
        assert!(
            build.args.contains(&format!("target/release/{name}")),
            "{name} is not copied out of target/release"
        );
        copied.insert(name.to_string());
    }
    // The sidecar loads NIXL from a directory the image holds.
    let nixl_env = image
        .iter()
        .filter(|i| i.keyword == "ENV")
        .find_map(|i| i.args.strip_prefix("DYNAMO_SIDECAR_NIXL_LIB_DIR="))
        .expect("the image names NIXL's library directory to the sidecar");
    assert!(
        nixl_dirs.contains(nixl_env),
        "{nixl_env} not in {nixl_dirs:?}"
    );
    assert!(
        model_copied,
        "the image holds the mock engine's model directory"
    );
    assert!(
        connector_deps_copied,
        "the image holds the vLLM connector's xxhash builds"
    );

    let real = workspace_binaries();
    for binary in binaries_run_from_the_image() {
        assert!(real.contains(&binary), "{binary} is no binary of ours");
        assert!(copied.contains(&binary), "the image lacks {binary}");
    }
    // The entrypoint (`docker run IMAGE run -f ...`) is one of them too.
    let entrypoint = image
        .iter()
        .rfind(|i| i.keyword == "ENTRYPOINT")
        .expect("an entrypoint");
    let entrypoint: Vec<String> = serde_json::from_str(&entrypoint.args).expect("exec form");
    assert!(copied.contains(&entrypoint[0]), "{entrypoint:?}");
}

#[test]
fn the_image_runs_as_a_numeric_non_root_user() {
    let stages = stages(dockerfile());
    let (_, image) = stages.last().unwrap();
    let user = image
        .iter()
        .rfind(|i| i.keyword == "USER")
        .expect("the image sets its user");
    // Numeric, or the kubelet cannot verify runAsNonRoot.
    let (uid, gid) = user.args.split_once(':').unwrap_or((&user.args, ""));
    let uid: u32 = uid.parse().expect("a numeric uid");
    assert_ne!(uid, 0);
    if !gid.is_empty() {
        assert_ne!(gid.parse::<u32>().expect("a numeric gid"), 0);
    }
}
