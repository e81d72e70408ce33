//! Our vLLM KV connector (`connectors/python`) against this sidecar's binary and vLLM's
//! real scheduler: each test runs one module of its pytest suite in the vLLM environment
//! (`make vllm`, `VLLM_DIR`), which skips without it unless `DYNAMO_REQUIRE_VLLM` is set
//! (CI sets it). Also: the descriptors the Python side builds its messages from are the
//! protos' as compiled here.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Compares a committed descriptor set with the compiled one, or rewrites it.
fn check_descriptors(committed: &str, compiled: &[u8]) {
    let path = root().join(committed);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, compiled).unwrap();
    }
    let on_disk = std::fs::read(&path).unwrap_or_default();
    assert!(
        on_disk == compiled,
        "{} is not the compiled proto: run `UPDATE_GOLDEN=1 cargo nextest run -p \
         dynamo-sidecar --test python_connector`",
        path.display()
    );
}

#[test]
fn the_clients_descriptors_are_the_block_apis() {
    check_descriptors(
        "connectors/python/dynamo_kv/kv_blocks.binpb",
        dynamo_kvblocks::DESCRIPTORS,
    );
}

#[test]
fn the_tests_descriptors_are_the_kv_event_streams() {
    check_descriptors(
        "connectors/python/tests/kv_events.binpb",
        dynamo_kvstream::DESCRIPTORS,
    );
}

/// Runs `module` of the connector's tests with vLLM's Python, against this crate's
/// sidecar binary.
fn pytest(module: &str) {
    let root = root();
    let vllm = std::env::var_os("VLLM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".cache/vllm"));
    let python = vllm.join("bin/python");
    if !python.exists() {
        assert!(
            std::env::var_os("DYNAMO_REQUIRE_VLLM").is_none(),
            "no vLLM at {} (`make vllm`), and DYNAMO_REQUIRE_VLLM is set",
            vllm.display()
        );
        eprintln!("skipped: no vLLM at {} (`make vllm`)", vllm.display());
        return;
    }
    let status = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x"])
        .arg(root.join("connectors/python/tests").join(module))
        .env("PYTHONPATH", root.join("connectors/python"))
        .env("DYNAMO_SIDECAR_BIN", env!("CARGO_BIN_EXE_dynamo-sidecar"))
        .env("DYNAMO_MODEL_DIR", root.join(".cache/models/qwen-mock"))
        // vLLM's scheduler on a machine without a GPU (else "Failed to infer device type").
        .env("VLLM_TARGET_DEVICE", "cpu")
        .env("HF_HUB_OFFLINE", "1")
        .env("NO_COLOR", "1")
        .status()
        .expect("runs pytest");
    assert!(status.success(), "connectors/python/tests/{module} failed");
}

#[test]
fn python_vectors() {
    pytest("test_vectors.py");
}

#[test]
fn bad_settings_are_refused_by_name() {
    pytest("test_settings.py");
}

#[test]
fn offload_and_onboard_through_vllms_scheduler() {
    pytest("test_tiers.py");
}

#[test]
fn faults_never_load_wrong_kv() {
    pytest("test_faults.py");
}

#[test]
fn blocks_are_named_as_the_engines_kv_events() {
    pytest("test_events.py");
}
