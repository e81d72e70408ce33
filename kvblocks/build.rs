//! Compiles the KV block API proto with protox (a protobuf compiler in Rust), so that
//! building needs no `protoc` on the machine. Also writes its descriptors, without source
//! info, for the Python client (`connectors/python/dynamo_kv/kv_blocks.binpb`, which
//! `tests/python_descriptors.rs` keeps equal to them).

use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/dynamo/kvblocks/v1/kv_blocks.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    let mut bare = descriptors.clone();
    bare.file.iter_mut().for_each(|f| f.source_code_info = None);
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("kv_blocks.binpb"), bare.encode_to_vec())?;
    tonic_prost_build::configure()
        // Payloads stay `Bytes` end to end: no copy out of the decode buffer.
        .bytes(".dynamo.kvblocks.v1.Block.payload")
        .compile_fds(descriptors)?;
    Ok(())
}
