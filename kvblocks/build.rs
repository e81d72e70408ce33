//! Compiles the KV block API proto with protox (a protobuf compiler in Rust), so that
//! building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/dynamo/kvblocks/v1/kv_blocks.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // Payloads stay `Bytes` end to end: no copy out of the decode buffer.
        .bytes(".dynamo.kvblocks.v1.Block.payload")
        .compile_fds(descriptors)?;
    Ok(())
}
