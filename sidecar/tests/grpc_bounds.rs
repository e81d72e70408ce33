//! The gRPC port bounds what a client can make the sidecar hold with the requests it
//! sends (`docs/sidecar.md`, "Security"): a message must arrive whole in time, none may
//! be larger than a limit, and those arriving on one connection not larger together
//! than another. The half-sent messages go over a raw HTTP/2 connection, as no gRPC
//! client sends them.

mod common;

use bytes::Bytes;
use common::*;
use dynamo_sidecar::Sidecar;
use tonic::Code;

const OFFLOAD: &str = "/dynamo.kvblocks.v1.KvBlocks/Offload";
const RECEIVING: &str = "dynamo_sidecar_grpc_receiving_bytes";
const REFUSED: &str = "dynamo_sidecar_grpc_messages_refused_total";

fn zeros(len: usize) -> Bytes {
    Bytes::from(vec![0; len])
}

async fn receiving_is(sidecar: &Sidecar, bytes: u32) {
    eventually(&format!("{bytes} bytes being received"), || async {
        metric(sidecar, RECEIVING, "").await == f64::from(bytes)
    })
    .await;
}

async fn refused(sidecar: &Sidecar, reason: &str) -> f64 {
    metric(sidecar, REFUSED, &format!("reason=\"{reason}\"")).await
}

#[tokio::test]
async fn a_message_not_whole_in_time_ends_its_call_and_frees_its_bytes() {
    let flags = ["--grpc-message-timeout", "500ms"];
    let sidecar = sidecar_with("http://127.0.0.1:1", None, None, &flags).await;
    let mut connection = RawGrpc::open(sidecar.grpc_addr, None).await;
    // Half of a 1 MiB message, and then nothing.
    let half = [grpc_prefix(1 << 20), zeros(512 << 10)];
    let call = connection.call(OFFLOAD, &half).await;
    receiving_is(&sidecar, 1 << 20).await;
    let _still_open = call.body.clone();
    assert_eq!(call.status().await, Code::DeadlineExceeded);
    assert_eq!(metric(&sidecar, RECEIVING, "").await, 0.0);
    assert_eq!(refused(&sidecar, "timeout").await, 1.0);
}

#[tokio::test]
async fn messages_past_the_size_limits_are_refused_before_they_are_read() {
    let flags = [
        "--grpc-max-message-bytes",
        "1MiB",
        "--grpc-max-connection-bytes",
        "1536KiB",
    ];
    let sidecar = sidecar_with("http://127.0.0.1:1", None, None, &flags).await;
    let mut one = RawGrpc::open(sidecar.grpc_addr, None).await;
    let too_large = one.call(OFFLOAD, &[grpc_prefix((1 << 20) + 1)]).await;
    assert_eq!(too_large.status().await, Code::ResourceExhausted);

    // A message in progress on a connection leaves it room for half a megabyte more.
    let started = [grpc_prefix(1 << 20), zeros(100 << 10)];
    let _in_progress = one.call(OFFLOAD, &started).await;
    receiving_is(&sidecar, 1 << 20).await;
    let past_the_connection = one.call(OFFLOAD, &[grpc_prefix(1 << 20)]).await;
    assert_eq!(past_the_connection.status().await, Code::ResourceExhausted);
    // Another connection has room of its own.
    let mut two = RawGrpc::open(sidecar.grpc_addr, None).await;
    let _elsewhere = two.call(OFFLOAD, &[grpc_prefix(1 << 20), zeros(1)]).await;
    receiving_is(&sidecar, 2 << 20).await;
    assert_eq!(refused(&sidecar, "too_large").await, 1.0);
    assert_eq!(refused(&sidecar, "connection_full").await, 1.0);

    // Clients that go away take what they were sending with them.
    drop((one, two, _in_progress, _elsewhere));
    receiving_is(&sidecar, 0).await;
}
