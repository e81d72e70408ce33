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

/// Lease budget, and so NIXL arena, of a sidecar whose arena the tests can see whole.
const ARENA_BYTES: u64 = 20 << 10;
const SMALL_ARENA: [&str; 4] = [
    "--kv-lease-bytes",
    "20KiB",
    "--kv-lease-bytes-per-peer",
    "20KiB",
];

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
    // Its arena (as large as the lease budget) is 20 KiB: the first lease's copy starts it.
    let sidecar = nixl_sidecar(&dir, &SMALL_ARENA).await;
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

    let reader = NixlAgent::start("test-reader", 1 << 20).unwrap();
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

    // An address moved past the arena reaches no memory.
    let mut past = slices.clone();
    past[1].addr = slices[0].addr + ARENA_BYTES;
    let refused = reader.read(&plan.agent, &plan.metadata, &past, deadline);
    assert!(refused.is_err(), "read past the registered memory");
    assert!(client.end_lease("lease").await.is_ok());
    assert_eq!(sidecar.leases.held(), (0, 0));
}

#[tokio::test]
async fn a_slot_reused_by_another_lease_reads_as_that_lease_and_fails_the_old_checks() {
    let Some(dir) =
        nixl_lib_dir("a_slot_reused_by_another_lease_reads_as_that_lease_and_fails_the_old_checks")
    else {
        return;
    };
    let sidecar = nixl_sidecar(&dir, &SMALL_ARENA).await;
    let mut client = BlockClient::new(&format!("http://{}", sidecar.grpc_addr)).unwrap();
    let reader = NixlAgent::start("test-reuse-reader", 1 << 20).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let read = |plan: &dynamo_kvblocks::described::Described| {
        let slices: Vec<_> = plan.blocks.iter().map(|(_, s)| *s).collect();
        let landed = reader
            .read(&plan.agent, &plan.metadata, &slices, deadline)
            .unwrap();
        landed.as_slice().to_vec()
    };

    assert_eq!(client.lend("first", chain(2)).await.unwrap().lent, 2);
    let first = client.describe("first", &hashes(2)).await.unwrap().unwrap();
    let first = described(first, &hashes(2), 1 << 20).unwrap();
    assert_eq!(read(&first), [vec![7u8; 4096], vec![8u8; 4096]].concat());
    assert!(client.end_lease("first").await.is_ok());

    // Another chain, its payloads other bytes, in the slot the first lease gave back.
    let other: Vec<Block> = (0..2u64)
        .map(|i| {
            let parent = i.checked_sub(1).map(|p| SeqHash(900 + p));
            let layout = chain(1)[0].layout.clone();
            Block::new(
                SeqHash(900 + i),
                parent,
                16,
                layout,
                Bytes::from(vec![0xee; 4096]),
            )
        })
        .collect();
    let other_hashes: Vec<SeqHash> = other.iter().map(|b| b.hash).collect();
    assert_eq!(client.lend("second", other).await.unwrap().lent, 2);
    let second = client
        .describe("second", &other_hashes)
        .await
        .unwrap()
        .unwrap();
    let second = described(second, &other_hashes, 1 << 20).unwrap();
    assert_eq!(
        second.blocks[0].1.addr, first.blocks[0].1.addr,
        "slot reused"
    );
    assert_eq!(second.metadata, first.metadata, "nothing registered anew");

    // The first lease is no longer described, and its old addresses hold the second's
    // bytes, which the first's blocks refuse.
    let gone = client.describe("first", &hashes(2)).await;
    assert!(gone.is_err(), "{gone:?}");
    let stale = read(&first);
    assert_eq!(stale, vec![0xee; 8192]);
    for (i, (mut message, _)) in first.blocks.into_iter().enumerate() {
        message.payload = Bytes::copy_from_slice(&stale[i * 4096..(i + 1) * 4096]);
        let accepted = client.accept(Some(SeqHash(message.hash)), message);
        assert!(matches!(accepted, Ok(None) | Err(_)), "{accepted:?}");
    }
    assert!(client.end_lease("second").await.is_ok());
    assert_eq!(sidecar.leases.held(), (0, 0));
}

#[tokio::test]
async fn a_lease_with_no_room_to_expose_moves_over_grpc() {
    let Some(dir) = nixl_lib_dir("a_lease_with_no_room_to_expose_moves_over_grpc") else {
        return;
    };
    // 12 KiB: the lease (8 KiB) fits, its copy for NIXL does not.
    let sidecar = nixl_sidecar(
        &dir,
        &[
            "--kv-lease-bytes",
            "12KiB",
            "--kv-lease-bytes-per-peer",
            "12KiB",
        ],
    )
    .await;
    let mut client = BlockClient::new(&format!("http://{}", sidecar.grpc_addr)).unwrap();
    assert_eq!(client.lend("tight", chain(2)).await.unwrap().lent, 2);
    let described = client.describe("tight", &hashes(2)).await;
    assert!(described.is_err(), "no room: {described:?}");
    assert!(client.end_lease("tight").await.is_ok());

    assert_eq!(client.lend("fallback", chain(2)).await.unwrap().lent, 2);
    let agent = NixlAgent::start("test-fallback-reader", 1 << 20).unwrap();
    let transfer = dynamo_sidecar::disagg::transfer::Transfer::new(Duration::from_secs(10), None)
        .with_nixl(Some(std::sync::Arc::new(agent)), 1 << 20);
    let (blocks, how) = transfer
        .fetch(sidecar.grpc_addr, "fallback", &hashes(2))
        .await
        .unwrap();
    assert_eq!(blocks.len(), 2);
    assert_eq!(how, dynamo_sidecar::disagg::transfer::Transport::Grpc);
    assert_eq!(blocks[1].payload, Bytes::from(vec![8u8; 4096]));
}
