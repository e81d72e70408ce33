//! Our vLLM KV connector (`connectors/python`, docs/vllm-connector.md): how a vLLM engine
//! whose service sets KV block tiers is told to use it, and the package itself, carried
//! in our binary so that it reaches any vLLM image without rebuilding it: a pod's init
//! container (our image) writes it to a volume on the engine's `PYTHONPATH`
//! (`dynamo connector install DIR`), and `dynamo run` writes it to its state directory.

use std::io;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use dynamo_names::Role;

/// The connector's module and class, as vLLM's `--kv-transfer-config` names them.
pub const MODULE: &str = "dynamo_kv.vllm";
pub const CLASS: &str = "DynamoSidecarConnector";

/// Where a pod's engine finds the package (an `emptyDir` the init container fills).
pub const POD_DIR: &str = "/opt/dynamo/python";

/// Where our image keeps the package's one dependency an engine image may lack (xxhash,
/// built for each CPython in `cpXY/`; Dockerfile), which `install` copies beside it.
pub const IMAGE_DEPS_DIR: &str = "/opt/dynamo/connector-deps";

/// The variable the package's directory goes first in.
pub const PYTHONPATH: &str = "PYTHONPATH";

macro_rules! package {
    ($($path:literal),* $(,)?) => {
        &[$(($path, include_bytes!(concat!("../../connectors/python/", $path)))),*]
    };
}

/// Every file of the package, by its path under the directory on `PYTHONPATH`
/// (`tests::the_package_is_every_file_of_the_connector` keeps the list whole).
pub const FILES: &[(&str, &[u8])] = package![
    "dynamo_kv/__init__.py",
    "dynamo_kv/api.py",
    "dynamo_kv/blocks.py",
    "dynamo_kv/hashing.py",
    "dynamo_kv/kv_blocks.binpb",
    "dynamo_kv/vllm/__init__.py",
    "dynamo_kv/vllm/connector.py",
    "dynamo_kv/vllm/metadata.py",
    "dynamo_kv/vllm/scheduler.py",
    "dynamo_kv/vllm/settings.py",
    "dynamo_kv/vllm/worker.py",
];

/// `dynamo connector ...`: what the init container runs.
#[derive(Clone, Debug, PartialEq, Eq, Subcommand)]
pub enum ConnectorCommand {
    /// Write its Python package (`dynamo_kv`) under DIR, for an engine's PYTHONPATH (what
    /// an engine pod's init container runs).
    Install { dir: PathBuf },
}

/// The subcommand's words after `dynamo connector`, as our binary parses them.
pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<ConnectorCommand, clap::Error> {
    #[derive(Parser)]
    struct Words {
        #[command(subcommand)]
        command: ConnectorCommand,
    }
    let words = std::iter::once("connector").chain(args.iter().map(AsRef::as_ref));
    Ok(Words::try_parse_from(words)?.command)
}

/// The init container's command: writes the package under `dir`.
pub fn install_argv(dir: &str) -> Vec<String> {
    [crate::DYNAMO_BINARY, "connector", "install", dir]
        .map(String::from)
        .to_vec()
}

/// Runs a parsed `dynamo connector` command.
pub fn run(command: ConnectorCommand) -> io::Result<()> {
    match command {
        ConnectorCommand::Install { dir } => install(&dir, Some(Path::new(IMAGE_DEPS_DIR))),
    }
}

/// Writes the package under `dir` (made if missing), replacing what an older one left,
/// with what `deps` holds, where it exists, as its `_deps`.
pub fn install(dir: &Path, deps: Option<&Path>) -> io::Result<()> {
    for (path, bytes) in FILES {
        let to = dir.join(path);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&to, bytes)?;
    }
    if let Some(deps) = deps.filter(|d| d.is_dir()) {
        copy_tree(deps, &dir.join("dynamo_kv/_deps"))?;
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// vLLM's `--kv-transfer-config` for an engine whose sidecar's block API is on loopback at
/// `block_api_port`, its blocks hashed under `model` (the sidecar's `--model-name`). A
/// failed load is recomputed (vLLM's default fails the request). A prefill or decode
/// engine also moves its prompt's blocks with NixlConnector, both behind vLLM's
/// MultiConnector.
pub fn kv_transfer_config(role: Role, block_api_port: u16, model: Option<&str>) -> String {
    let mut extra = serde_json::json!({"block_api": format!("127.0.0.1:{block_api_port}")});
    if let Some(model) = model {
        extra["model_name"] = model.into();
    }
    let ours = serde_json::json!({
        "kv_connector": CLASS,
        "kv_connector_module_path": MODULE,
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    });
    let mut config = match role {
        Role::Aggregated => ours,
        Role::Prefill | Role::Decode => serde_json::json!({
            "kv_connector": "MultiConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": [
                {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                ours,
            ]},
        }),
    };
    config["kv_load_failure_policy"] = "recompute".into();
    config.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_package_is_every_file_of_the_connector() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../connectors/python");
        let mut found = Vec::new();
        let mut dirs = vec![root.join("dynamo_kv")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if path.is_dir() {
                    if name != "__pycache__" {
                        dirs.push(path);
                    }
                } else if name.ends_with(".py") || name.ends_with(".binpb") {
                    found.push(
                        path.strip_prefix(&root)
                            .unwrap()
                            .to_string_lossy()
                            .into_owned(),
                    );
                }
            }
        }
        found.sort();
        let listed: Vec<&str> = FILES.iter().map(|(path, _)| *path).collect();
        assert_eq!(found, listed);
    }

    #[test]
    fn the_init_containers_command_parses() {
        let argv = install_argv(POD_DIR);
        assert_eq!(
            parse(&argv[2..]).unwrap(),
            ConnectorCommand::Install {
                dir: POD_DIR.into()
            }
        );
        assert!(parse(&["install"]).is_err(), "a directory is needed");
    }

    #[test]
    fn install_writes_the_package_and_the_images_dependencies() {
        let dir = tempfile::tempdir().unwrap();
        install(dir.path(), None).unwrap();
        install(dir.path(), Some(&dir.path().join("absent"))).unwrap();
        for (path, bytes) in FILES {
            assert_eq!(
                std::fs::read(dir.path().join(path)).unwrap(),
                *bytes,
                "{path}"
            );
        }
        assert!(!dir.path().join("dynamo_kv/_deps").exists());
        let deps = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(deps.path().join("cp312/xxhash")).unwrap();
        std::fs::write(deps.path().join("cp312/xxhash/__init__.py"), "x").unwrap();
        install(dir.path(), Some(deps.path())).unwrap();
        let copied = dir.path().join("dynamo_kv/_deps/cp312/xxhash/__init__.py");
        assert_eq!(std::fs::read_to_string(copied).unwrap(), "x");
    }

    #[test]
    fn disaggregated_engines_also_get_nixl() {
        let agg: serde_json::Value =
            serde_json::from_str(&kv_transfer_config(Role::Aggregated, 9100, Some("m"))).unwrap();
        assert_eq!(agg["kv_connector"], CLASS);
        assert_eq!(
            agg["kv_connector_extra_config"]["block_api"],
            "127.0.0.1:9100"
        );
        assert_eq!(agg["kv_connector_extra_config"]["model_name"], "m");
        assert_eq!(agg["kv_load_failure_policy"], "recompute");
        let decode: serde_json::Value =
            serde_json::from_str(&kv_transfer_config(Role::Decode, 9100, None)).unwrap();
        let connectors = &decode["kv_connector_extra_config"]["connectors"];
        assert_eq!(connectors[0]["kv_connector"], "NixlConnector");
        assert_eq!(connectors[1]["kv_connector"], CLASS);
    }
}
