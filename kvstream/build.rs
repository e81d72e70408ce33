//! Compiles the KV event stream proto with protox (a protobuf compiler in Rust), so that
//! building needs no `protoc` on the machine. Also writes its descriptors, without source
//! info, for the Python connector's tests, which subscribe to a real sidecar
//! (`connectors/python/tests/kv_events.binpb`, kept equal by `tests/python_descriptors.rs`).

use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/dynamo/kv/v1/kv_events.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    let mut bare = descriptors.clone();
    bare.file.iter_mut().for_each(|f| f.source_code_info = None);
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("kv_events.binpb"), bare.encode_to_vec())?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
