//! What a sidecar with a NIXL agent refuses to describe, before any read is possible,
//! and what a reader refuses of a description: a real sidecar, a real agent reading
//! from it. Skips, saying so, where NIXL is not installed.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use dynamo_kvblocks::described::{DescribeError, described};
use dynamo_kvblocks::pb::DescribeRequest;
use dynamo_kvblocks::pb::kv_blocks_client::KvBlocksClient;
use dynamo_kvblocks::{Block, BlockClient, Layout};
use dynamo_kvcache::SeqHash;
use dynamo_sidecar::Sidecar;
use dynamo_sidecar::nixl::NixlAgent;

fn chain(n: u64) -> Vec<Block> {
    let layout = Layout {
        block_bytes: 4096,
        block_size: 16,
        layers: 2,
        dtype: "bfloat16".into(),
    };
    (0..n)
        .map(|i| {
            let parent = i.checked_sub(1).map(|p| SeqHash(500 + p));
            let payload = Bytes::from(vec![i as u8 + 7; 4096]);
            Block::new(SeqHash(500 + i), parent, 16, layout.clone(), payload)
        })
        .collect()
}

fn hashes(n: u64) -> Vec<SeqHash> {
    (0..n).map(|i| SeqHash(500 + i)).collect()
}

async fn nixl_sidecar(dir: &str, extra: &[&str]) -> Sidecar {
    let mut flags = vec!["--nixl-lib-dir", dir];
    flags.extend(extra);
    sidecar_with("http://127.0.0.1:9", None, None, &flags).await
}

/// A Describe call from the loopback address `from` (the lease's peer is the caller's
/// address).
async fn describe_from(sidecar: &Sidecar, from: Ipv4Addr, lease: &str) -> tonic::Code {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", sidecar.grpc_addr))
        .unwrap()
        .local_address(Some(IpAddr::V4(from)))
        .connect()
        .await
        .unwrap();
    let request = DescribeRequest {
        lease: lease.into(),
        hashes: hashes(2).iter().map(|h| h.0).collect(),
    };
    match KvBlocksClient::new(channel).describe(request).await {
        Ok(_) => tonic::Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn leases_of_another_peer_unknown_expired_or_described_are_refused() {
    let Some(dir) = nixl_lib_dir("leases_of_another_peer_unknown_expired_or_described_are_refused")
    else {
        return;
    };
    let sidecar = nixl_sidecar(&dir, &["--kv-lease-duration", "300ms"]).await;
    let mut engine = BlockClient::new(&format!("http://{}", sidecar.grpc_addr)).unwrap();
    // Lent from 127.0.0.1 without a claim: the lease is 127.0.0.1's.
    assert_eq!(engine.lend("mine", chain(2)).await.unwrap().lent, 2);
    let other = Ipv4Addr::new(127, 0, 0, 2);
    assert_eq!(
        describe_from(&sidecar, other, "mine").await,
        tonic::Code::PermissionDenied
    );
    let own = Ipv4Addr::LOCALHOST;
    assert_eq!(
        describe_from(&sidecar, own, "unknown").await,
        tonic::Code::NotFound
    );
    assert_eq!(describe_from(&sidecar, own, "mine").await, tonic::Code::Ok);
    assert_eq!(
        describe_from(&sidecar, own, "mine").await,
        tonic::Code::FailedPrecondition,
        "described once"
    );
    assert_eq!(engine.lend("stale", chain(2)).await.unwrap().lent, 2);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        describe_from(&sidecar, own, "stale").await,
        tonic::Code::NotFound
    );
    eventually("expired leases and their exposed copies go", || async {
        sidecar.leases.held() == (0, 0)
    })
    .await;
}

#[tokio::test]
async fn a_reader_takes_only_the_described_memory_and_refuses_forged_descriptions() {
    let Some(dir) =
        nixl_lib_dir("a_reader_takes_only_the_described_memory_and_refuses_forged_descriptions")
    else {
        return;
    };
    let sidecar = nixl_sidecar(&dir, &[]).await;
    let mut client = BlockClient::new(&format!("http://{}", sidecar.grpc_addr)).unwrap();
    assert_eq!(client.lend("lease", chain(3)).await.unwrap().lent, 3);
    // Asking for a chain that leaves the lease after two blocks: two described.
    let asked = [SeqHash(500), SeqHash(501), SeqHash(9)];
    let reply = client.describe("lease", &asked).await.unwrap().unwrap();
    let plan = described(reply.clone(), &asked, 1 << 20).unwrap();
    assert_eq!(plan.blocks.len(), 2);

    let mut longer = reply.clone();
    longer.blocks[0].len += 4096;
    assert_eq!(
        described(longer, &asked, 1 << 20),
        Err(DescribeError::Length(500, 8192, 4096))
    );
    let mut renamed = reply.clone();
    renamed.blocks[1].block.as_mut().unwrap().hash = 777;
    assert!(matches!(
        described(renamed, &asked, 1 << 20),
        Err(DescribeError::OutOfChain(1, 777, 501))
    ));

    let reader = NixlAgent::start("test-reader").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let slices: Vec<_> = plan.blocks.iter().map(|(_, s)| *s).collect();
    let read = reader
        .read(&plan.agent, &plan.metadata, &slices, deadline)
        .unwrap();
    let expected: Vec<u8> = [vec![7u8; 4096], vec![8u8; 4096]].concat();
    assert_eq!(read.as_slice(), &expected[..], "the lease's payloads");
    for (message, _) in plan.blocks {
        let payload_free = client.accept(Some(SeqHash(message.hash)), message).unwrap();
        assert!(
            payload_free.is_none(),
            "a block without its payload is no block"
        );
    }

    // An address moved past the exposed copy reaches no memory.
    let mut past = slices.clone();
    past[1].addr += 4096;
    let refused = reader.read(&plan.agent, &plan.metadata, &past, deadline);
    assert!(refused.is_err(), "read past the registered memory");
    assert!(client.end_lease("lease").await.is_ok());
    assert_eq!(sidecar.leases.held(), (0, 0));
}
