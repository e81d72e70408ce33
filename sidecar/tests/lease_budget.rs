//! Everything the block API holds for its clients outside the tiers is charged to the
//! lease budget (`--kv-lease-bytes`) and shown by `dynamo_sidecar_kv_lease_bytes`
//! (`docs/disagg.md`): a lend while its blocks arrive, and an onboard's blocks until
//! the client takes them. A lend left open ends at the message timeout; a client that
//! stops reading its answer is cut off with its connection.

mod common;

use common::*;
use dynamo_kvblocks::BlockClient;
use dynamo_kvblocks::pb::kv_blocks_client::KvBlocksClient;
use dynamo_kvblocks::pb::{self, LendRequest, OnboardRequest};
use dynamo_sidecar::Sidecar;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const LEASE_BYTES: &str = "dynamo_sidecar_kv_lease_bytes";
const ONBOARD: &str = "/dynamo.kvblocks.v1.KvBlocks/Onboard";

async fn lease_bytes(sidecar: &Sidecar) -> f64 {
    metric(sidecar, LEASE_BYTES, "").await
}

#[tokio::test]
async fn a_lend_still_arriving_counts_against_the_lease_budget() {
    let flags = [
        "--kv-lease-bytes",
        "64KiB",
        "--kv-lease-bytes-per-peer",
        "64KiB",
        "--grpc-message-timeout",
        "1s",
    ];
    let sidecar = sidecar_with("http://127.0.0.1:1", None, None, &flags).await;
    let url = format!("http://{}", sidecar.grpc_addr);
    // Half the budget arrives on a lend that is never finished.
    let (open, messages) = mpsc::channel(16);
    for block in block_chain(0, 8, 4096) {
        let message = LendRequest {
            lease: "open".into(),
            block: Some(pb::Block::from(&block)),
        };
        open.send(message).await.unwrap();
    }
    let mut raw = KvBlocksClient::connect(url.clone()).await.unwrap();
    let lending = tokio::spawn(async move { raw.lend(ReceiverStream::new(messages)).await });
    eventually("the open lend is charged", || async {
        lease_bytes(&sidecar).await == 32768.0
    })
    .await;

    // So a lend of more than the other half is refused as its blocks arrive.
    let mut engine = BlockClient::new(&url).unwrap();
    let refused = engine
        .lend("whole", block_chain(100, 9, 4096))
        .await
        .unwrap();
    let why = refused.refused.expect("refused");
    assert!(why.contains("lease budget"), "{why}");
    let over = "reason=\"over_budget\"";
    let refusals = metric(&sidecar, "dynamo_sidecar_kv_leases_refused_total", over).await;
    assert_eq!(refusals, 1.0);
    assert_eq!(
        lease_bytes(&sidecar).await,
        32768.0,
        "the refused lend holds nothing"
    );

    // The open lend ends at the message timeout, and its bytes with it.
    let ended = tokio::time::timeout(ENDS, lending).await.expect("it ends");
    let status = ended.unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    assert_eq!(lease_bytes(&sidecar).await, 0.0);
    assert_eq!(sidecar.leases.held(), (0, 0));
    drop(open);
}

#[tokio::test]
async fn an_answer_its_client_does_not_read_is_charged_and_cut_off() {
    let flags = [
        "--kv-host-bytes",
        "4MiB",
        "--kv-lease-bytes",
        "512KiB",
        "--grpc-message-timeout",
        "1s",
    ];
    let sidecar = sidecar_with("http://127.0.0.1:1", None, None, &flags).await;
    let blocks = block_chain(0, 8, 64 << 10);
    let mut engine = BlockClient::new(&format!("http://{}", sidecar.grpc_addr)).unwrap();
    assert_eq!(engine.offload(blocks.clone()).await.unwrap().stored, 8);

    // A client that lets nothing of an answer through (a flow-control window of 0)
    // asks three times for all eight blocks.
    let mut client = RawGrpc::open(sidecar.grpc_addr, Some(0)).await;
    let request = OnboardRequest {
        hashes: blocks.iter().map(|b| b.hash.0).collect(),
        region_id: None,
        lease: None,
    }
    .encode_to_vec();
    let mut calls = Vec::new();
    for _ in 0..3 {
        let message = [grpc_prefix(request.len() as u32), request.clone().into()];
        let call = client.call(ONBOARD, &message).await;
        drop(call.body);
        calls.push(call.answer);
    }
    // Their blocks wait, charged, within the budget.
    eventually("every answer has blocks waiting", || async {
        lease_bytes(&sidecar).await >= 3.0 * 65536.0
    })
    .await;
    assert!(lease_bytes(&sidecar).await <= 512.0 * 1024.0);

    // The client is cut off: its connection closes, and the blocks are freed.
    tokio::time::timeout(ENDS, &mut client.driver)
        .await
        .expect("the connection is closed")
        .unwrap();
    eventually("the answers' blocks are freed", || async {
        lease_bytes(&sidecar).await == 0.0
    })
    .await;
    let cut = metric(&sidecar, "dynamo_sidecar_kv_answers_cut_total", "").await;
    assert!(cut >= 1.0, "{cut}");
    // The engine still onboards what it offloaded.
    assert_eq!(
        engine.onboard(&[blocks[0].hash]).await.unwrap(),
        blocks[..1]
    );
}
