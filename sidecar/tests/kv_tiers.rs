//! The sidecar's KV block tiers through the block API, with real files: what is offloaded
//! comes back byte for byte from the tier that holds it, moves down as tiers fill,
//! survives a restart on disk, and is never served when it does not check out; the pod's
//! KV event stream says which tier holds what.

mod common;
mod support {
    pub mod moto;
}

use std::path::Path;

use bytes::Bytes;
use common::*;
use dynamo_kvblocks::{Block, BlockClient, Layout};
use dynamo_kvcache::{SeqHash, Tier};
use dynamo_sidecar::Sidecar;

const BLOCK_BYTES: usize = 4096;

fn layout() -> Layout {
    Layout {
        block_bytes: BLOCK_BYTES as u64,
        block_size: 16,
        layers: 2,
        dtype: "bfloat16".into(),
    }
}

/// A chain of `n` blocks, hashes `first..`, payloads derived from the hash.
fn chain(first: u64, n: u64) -> Vec<Block> {
    chain_of(first, n, BLOCK_BYTES)
}

fn chain_of(first: u64, n: u64, bytes: usize) -> Vec<Block> {
    (first..first + n)
        .map(|h| {
            let payload: Vec<u8> = (0..bytes).map(|i| (h as usize * 31 + i) as u8).collect();
            let parent = (h > first).then(|| SeqHash(h - 1));
            let layout = Layout {
                block_bytes: bytes as u64,
                ..layout()
            };
            Block::new(SeqHash(h), parent, 16, layout, Bytes::from(payload))
        })
        .collect()
}

fn hashes(blocks: &[Block]) -> Vec<SeqHash> {
    blocks.iter().map(|b| b.hash).collect()
}

/// What a block counts against a tier: its record (a few dozen bytes of header, then the
/// payload) in whole 4 KiB filesystem blocks.
const RECORD: u64 = (BLOCK_BYTES as u64 + 64).next_multiple_of(4096);

async fn start(extra: &[&str]) -> (Sidecar, BlockClient) {
    let sidecar = sidecar_with("http://127.0.0.1:1", None, None, extra).await;
    let client = BlockClient::new(&format!("http://{}", sidecar.grpc_addr)).unwrap();
    (sidecar, client)
}

async fn held(client: &mut BlockClient, chain: &[SeqHash]) -> Vec<Tier> {
    client
        .lookup(chain)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, t)| t)
        .collect()
}

#[tokio::test]
async fn blocks_move_down_as_host_memory_fills_and_come_back_verified() {
    let dir = tempfile::tempdir().unwrap();
    let host = (3 * RECORD).to_string();
    let disk = (100 * RECORD).to_string();
    let dir_arg = dir.path().to_str().unwrap();
    let (sidecar, mut client) = start(&[
        "--kv-host-bytes",
        &host,
        "--kv-disk-dir",
        dir_arg,
        "--kv-disk-bytes",
        &disk,
        "--kv-disk-min-reuse",
        "1",
    ])
    .await;
    let mut follower = Follower::start(sidecar.grpc_addr);
    let mut view = View::new();
    view.apply(&follower.next().await);

    let blocks = chain(100, 5);
    let reply = client.offload(blocks.clone()).await.unwrap();
    assert_eq!((reply.stored, reply.dropped, reply.corrupt), (5, 0, 0));
    assert_eq!(
        client
            .offload(blocks[..1].to_vec())
            .await
            .unwrap()
            .duplicates,
        1
    );

    let chain = hashes(&blocks);
    // Readable all along: from host memory until written to disk, then from disk.
    assert_eq!(held(&mut client, &chain).await.len(), 5);
    eventually("the least recently offloaded blocks reach disk", || {
        let mut client = client.clone();
        let chain = chain.clone();
        async move {
            held(&mut client, &chain).await
                == [Tier::Disk, Tier::Disk, Tier::Host, Tier::Host, Tier::Host]
        }
    })
    .await;
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2 + 1,
        "two records and .partial/"
    );

    // The two on disk come back, and are hot again: copied up to host memory, pushing
    // the two least recently used there down in their place.
    assert_eq!(client.onboard(&chain[..2]).await.unwrap(), blocks[..2]);
    assert_eq!(
        held(&mut client, &chain[..2]).await,
        [Tier::Host, Tier::Host]
    );
    eventually("the displaced blocks reach disk", || {
        let mut client = client.clone();
        let chain = chain.clone();
        async move {
            held(&mut client, &chain).await
                == [Tier::Host, Tier::Host, Tier::Disk, Tier::Disk, Tier::Host]
        }
    })
    .await;

    // The pod's event stream tells the picker which tier holds what.
    eventually("the picker's view has every tier move", || {
        while let Some(update) = follower.try_next() {
            view.apply(&update);
        }
        let tiers = view.tiers_of(SeqHash(101));
        async move { tiers.first() == Some(&Tier::Host) }
    })
    .await;

    // Four moves down: the two first offloads', then the two the copies up displaced.
    for (name, labels, value) in [
        ("kvbm_offload_blocks_d2h_total", "", 5.0),
        ("kvbm_offload_blocks_h2d_total", "", 4.0),
        ("kvbm_onboard_blocks_h2d_total", "", 0.0),
        ("kvbm_onboard_blocks_d2d_total", "", 2.0),
        (
            "dynamo_sidecar_kv_offered_blocks_total",
            "outcome=\"duplicate\"",
            1.0,
        ),
    ] {
        assert_eq!(
            metric(&sidecar, name, labels).await,
            value,
            "{name}{{{labels}}}"
        );
    }

    // Whichever tier each is in by now, every byte comes back, in chain order.
    let back = client.onboard(&chain).await.unwrap();
    assert_eq!(back, blocks);
    let onboarded = metric(&sidecar, "kvbm_onboard_blocks_h2d_total", "").await
        + metric(&sidecar, "kvbm_onboard_blocks_d2d_total", "").await;
    assert_eq!(onboarded, 2.0 + 5.0, "each block read once, from one tier");
    assert!(metric(&sidecar, "kvbm_host_cache_hit_rate", "").await > 0.0);
}

#[tokio::test]
async fn the_disk_tier_survives_a_restart_and_a_corrupt_record_is_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap().to_owned();
    let flags = ["--kv-disk-dir", &dir_arg, "--kv-disk-bytes", "1MiB"];
    let blocks = chain(7, 4);
    let chain = hashes(&blocks);
    {
        let (_sidecar, mut client) = start(&flags).await;
        assert_eq!(client.offload(blocks.clone()).await.unwrap().stored, 4);
        eventually("every block is written", || {
            let (mut client, chain) = (client.clone(), chain.clone());
            async move { held(&mut client, &chain).await.len() == 4 }
        })
        .await;
    }
    let (sidecar, mut client) = start(&flags).await;
    assert_eq!(
        held(&mut client, &chain).await,
        [Tier::Disk; 4],
        "re-indexed at start"
    );

    flip_last_byte(
        &dir.path()
            .join(dynamo_kvblocks::record::name(SeqHash(9), Some(SeqHash(8)))),
    );
    let back = client.onboard(&chain).await.unwrap();
    assert_eq!(
        back,
        blocks[..2],
        "the stream stops before the corrupt block"
    );
    assert_eq!(
        metric(
            &sidecar,
            "dynamo_sidecar_kv_corrupt_blocks_total",
            "tier=\"disk\""
        )
        .await,
        1.0
    );
    assert_eq!(
        held(&mut client, &chain).await.len(),
        2,
        "the corrupt block is forgotten"
    );
    assert!(
        !dir.path()
            .join(dynamo_kvblocks::record::name(SeqHash(9), Some(SeqHash(8))))
            .exists()
    );
}

fn flip_last_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    *bytes.last_mut().unwrap() ^= 0xFF;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn a_corrupt_offload_is_refused_and_a_failing_disk_drops_without_failing_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap().to_owned();
    let (sidecar, mut client) =
        start(&["--kv-disk-dir", &dir_arg, "--kv-disk-bytes", "1MiB"]).await;

    let mut bad = chain(1, 1);
    bad[0].checksum ^= 1;
    assert_eq!(client.offload(bad).await.unwrap().corrupt, 1);

    // The disk starts failing: writes cannot create their partial files.
    let partial = dir.path().join(".partial");
    std::fs::remove_dir(&partial).unwrap();
    std::fs::write(&partial, b"not a directory").unwrap();
    let blocks = chain(10, 8);
    let reply = client.offload(blocks.clone()).await.unwrap();
    assert_eq!(
        reply.stored, 8,
        "taken: the engine never waits for the disk"
    );
    eventually("every write has failed and been counted", || async {
        metric(
            &sidecar,
            "dynamo_sidecar_kv_dropped_blocks_total",
            "reason=\"disk_error\"",
        )
        .await
            == 8.0
    })
    .await;
    assert!(held(&mut client, &hashes(&blocks)).await.is_empty());
    assert!(client.onboard(&hashes(&blocks)).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_failing_disk_says_so_once_in_a_while_not_once_per_block() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap().to_owned();
    let sidecar = SidecarProcess::start(&["--kv-disk-dir", &dir_arg, "--kv-disk-bytes", "4MiB"]);
    let mut client = BlockClient::new(&format!("http://{}", sidecar.grpc)).unwrap();
    let partial = dir.path().join(".partial");
    eventually("the disk tier is set up", || async { partial.is_dir() }).await;
    std::fs::remove_dir(&partial).unwrap();
    std::fs::write(&partial, b"not a directory").unwrap();
    for first in (1..=200).step_by(8) {
        client.offload(chain(first, 8)).await.unwrap();
    }
    let dropped = "dynamo_sidecar_kv_dropped_blocks_total";
    eventually("every write has failed and been counted", || async {
        metric_at(sidecar.metrics, dropped, "reason=\"disk_error\"").await == 200.0
    })
    .await;
    let warnings = sidecar.logged("a KV block could not be written to disk");
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
}

#[tokio::test]
async fn a_sidecar_killed_mid_write_leaves_only_whole_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap().to_owned();
    let flags = [
        "--engine-url",
        "http://127.0.0.1:1",
        "--engine-kv-events",
        "none",
        "--kv-disk-dir",
        &dir_arg,
        "--kv-disk-bytes",
        "1GiB",
    ];
    let blocks = chain_of(1, 300, 1 << 20);
    let chain = hashes(&blocks);
    let mut sidecar = SidecarProcess::start(&flags);
    let client = BlockClient::new(&format!("http://{}", sidecar.grpc)).unwrap();
    let offloading = tokio::spawn({
        let (mut client, blocks) = (client.clone(), blocks.clone());
        async move { client.offload(blocks).await }
    });
    eventually("some blocks are on disk", || {
        let (mut client, chain) = (client.clone(), chain.clone());
        async move { held(&mut client, &chain).await.len() >= 20 }
    })
    .await;
    sidecar.child.kill().unwrap();
    sidecar.child.wait().unwrap();
    // The offload stream was cut (or had just ended): either way the engine moves on.
    let _ = offloading.await;

    let sidecar = SidecarProcess::start(&flags);
    let mut client = BlockClient::new(&format!("http://{}", sidecar.grpc)).unwrap();
    let prefix = held(&mut client, &chain).await.len();
    assert!(
        prefix >= 20,
        "what was written before the kill is served again: {prefix}"
    );
    assert_eq!(
        client.onboard(&chain[..prefix]).await.unwrap(),
        blocks[..prefix]
    );
    // Every other block is either whole or absent, never wrong.
    for block in &blocks[prefix..] {
        let back = client.onboard(&[block.hash]).await.unwrap();
        assert!(
            back.is_empty() || back == [block.clone()],
            "block {:?}",
            block.hash
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path().join(".partial"))
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test]
async fn payloads_cross_through_shared_memory_and_a_torn_one_is_refused() {
    let regions = tempfile::tempdir().unwrap();
    let (sidecar, mut client) = start(&[
        "--kv-host-bytes",
        "64MiB",
        "--kv-region-dir",
        regions.path().to_str().unwrap(),
    ])
    .await;
    // Room for three blocks each way: the rest of a call goes inline.
    assert!(client.share_memory(3 * BLOCK_BYTES as u64).await.unwrap());
    assert_eq!(std::fs::read_dir(regions.path()).unwrap().count(), 2);
    let blocks = chain(1, 5);
    assert_eq!(client.offload(blocks.clone()).await.unwrap().stored, 5);
    assert_eq!(client.onboard(&hashes(&blocks)).await.unwrap(), blocks);

    // A slice whose bytes are not the block's: the sidecar refuses it.
    let mut raw = dynamo_kvblocks::pb::kv_blocks_client::KvBlocksClient::connect(format!(
        "http://{}",
        sidecar.grpc_addr
    ))
    .await
    .unwrap();
    let region = raw
        .open_region(dynamo_kvblocks::pb::OpenRegionRequest { bytes: 1 << 20 })
        .await
        .unwrap()
        .into_inner();
    let block = &chain(50, 1)[0];
    let slice = dynamo_kvblocks::pb::RegionSlice {
        region_id: region.region_id,
        offset: 0,
        len: BLOCK_BYTES as u64,
    };
    let message = dynamo_kvblocks::pb::Block::in_region(block, slice);
    let reply = raw
        .offload(futures::stream::iter([message]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.corrupt, 1, "the region holds zeros, not the payload");
    let elsewhere = dynamo_kvblocks::pb::RegionSlice {
        region_id: 999,
        ..slice
    };
    let message = dynamo_kvblocks::pb::Block::in_region(block, elsewhere);
    let status = raw
        .offload(futures::stream::iter([message]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);

    drop(sidecar);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(
        std::fs::read_dir(regions.path()).unwrap().count(),
        0,
        "regions are removed with the sidecar"
    );
}

#[tokio::test]
async fn an_engine_offloading_faster_than_the_disk_absorbs_is_never_held_up() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap().to_owned();
    // Room for four 64 KiB writes in flight: a burst of 64 overflows it.
    let (sidecar, mut client) = start(&[
        "--kv-disk-dir",
        &dir_arg,
        "--kv-disk-bytes",
        "64MiB",
        "--kv-write-buffer-bytes",
        "256KiB",
    ])
    .await;
    let blocks = chain_of(1, 64, 64 << 10);
    let reply = client.offload(blocks.clone()).await.unwrap();
    assert_eq!(reply.stored, 64, "every block was taken");
    let busy = metric(
        &sidecar,
        "dynamo_sidecar_kv_dropped_blocks_total",
        "reason=\"disk_busy\"",
    )
    .await;
    // How many find the buffer full depends on how fast this disk is; that a full one
    // drops rather than waits is the store's unit test
    // (`a_burst_past_the_write_buffer_is_dropped_without_waiting_for_the_disk`).
    let written = 64.0 - busy;
    eventually("the writes in flight land", || async {
        metric(&sidecar, "kvbm_offload_blocks_d2d_total", "").await == written
    })
    .await;
    // What landed reads back whole; what was dropped is simply not there.
    for block in &blocks {
        let back = client.onboard(&[block.hash]).await.unwrap();
        assert!(back.is_empty() || back == [block.clone()]);
    }
}

#[tokio::test]
async fn blocks_reach_the_object_store_and_a_store_that_goes_down_costs_only_hits() {
    let mut moto = support::moto::Moto::start("kv-tiers").await;
    let endpoint = moto.endpoint();
    let url = moto.url("pods/a");
    let flags = [
        "--engine-url",
        "http://127.0.0.1:1",
        "--engine-kv-events",
        "none",
        "--kv-host-bytes",
        &(2 * RECORD).to_string(),
        "--kv-object-url",
        &url,
        "--kv-object-bytes",
        "64MiB",
        "--kv-object-min-reuse",
        "1",
    ];
    let env = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
    ];
    let sidecar = SidecarProcess::start_with_env(&flags, &env);
    let mut client = BlockClient::new(&format!("http://{}", sidecar.grpc)).unwrap();
    let blocks = chain(1, 5);
    let chain = hashes(&blocks);
    assert_eq!(client.offload(blocks.clone()).await.unwrap().stored, 5);
    eventually("three blocks move down to the object store", || {
        let (mut client, chain) = (client.clone(), chain.clone());
        async move {
            held(&mut client, &chain).await
                == [
                    Tier::Object,
                    Tier::Object,
                    Tier::Object,
                    Tier::Host,
                    Tier::Host,
                ]
        }
    })
    .await;
    assert_eq!(client.onboard(&chain).await.unwrap(), blocks);
    // At least the three: copying them up to host memory pushes the other two down.
    assert!(metric_at(sidecar.metrics, "kvbm_onboard_blocks_o2d_total", "").await >= 3.0);

    // A new sidecar on the same prefix finds what the first one left there.
    drop(sidecar);
    let sidecar = SidecarProcess::start_with_env(&flags, &env);
    let mut client = BlockClient::new(&format!("http://{}", sidecar.grpc)).unwrap();
    eventually("the object tier is re-indexed", || {
        let (mut client, chain) = (client.clone(), chain.clone());
        async move { held(&mut client, &chain).await.len() >= 3 }
    })
    .await;

    moto.kill();
    let back = client.onboard(&chain).await.unwrap();
    assert!(
        back.len() < 3,
        "nothing is served from a store that is down"
    );
    assert_eq!(back, blocks[..back.len()]);
    assert!(metric_at(sidecar.metrics, "kvbm_object_read_failures_total", "").await >= 1.0);
    // Writes fail and are counted; the engine is never refused.
    let more = chain_of(100, 4, BLOCK_BYTES);
    assert_eq!(client.offload(more).await.unwrap().stored, 4);
    eventually("failed object writes are counted", || async {
        metric_at(sidecar.metrics, "kvbm_object_write_failures_total", "").await >= 1.0
    })
    .await;
}
