//! Blocks a peer cannot forge (`docs/sidecar.md`, "Security"), against the real binary:
//! a block whose layout this graph could not use, whose payload or hash changed after
//! it was MAC-ed, or that another graph's key MAC-ed, is refused on offload and lend,
//! never served from a tampered disk file, and dropped by a fetching client.

mod common;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use common::*;
use dynamo_kvblocks::{Block, BlockClient, BlockKey, CREDENTIAL_FILE_ENV, Credential, record};
use dynamo_kvcache::{SeqHash, Tier};

const BLOCK_BYTES: usize = 4096;

fn token_file(dir: &Path, name: &str, token: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path
}

fn block(hash: u64) -> Block {
    block_chain(hash, 1, BLOCK_BYTES).remove(0)
}

/// `block` sealed by `key`, then changed by `edit` with its checksum made right again:
/// only the MAC can tell.
fn tampered(key: &BlockKey, block: Block, edit: fn(&mut Block)) -> Block {
    let mut b = key.seal(block);
    edit(&mut b);
    b.checksum = dynamo_kvblocks::checksum(&b.payload);
    b
}

/// A change made to a block.
type Edit = fn(&mut Block);

fn flip_payload(b: &mut Block) {
    let mut payload = b.payload.to_vec();
    payload[0] ^= 1;
    b.payload = Bytes::from(payload);
}

struct Graph {
    _dir: tempfile::TempDir,
    sidecar: SidecarProcess,
    member: BlockClient,
    key: BlockKey,
    other_key: BlockKey,
}

fn graph(args: &[&str]) -> Graph {
    let dir = tempfile::tempdir().unwrap();
    let ours = token_file(dir.path(), "graph", "graph-secret-0123456789");
    let theirs = token_file(dir.path(), "other", "graph-secret-0123456780");
    let sidecar =
        SidecarProcess::start_with_env(args, &[(CREDENTIAL_FILE_ENV, ours.to_str().unwrap())]);
    let credential = Credential::read(&ours).unwrap();
    let member = BlockClient::new(&format!("http://{}", sidecar.grpc))
        .unwrap()
        .with_credential(credential.clone());
    Graph {
        key: BlockKey::of(&credential),
        other_key: BlockKey::of(&Credential::read(&theirs).unwrap()),
        member,
        sidecar,
        _dir: dir,
    }
}

#[tokio::test]
async fn each_bad_layout_is_refused_and_nothing_stored() {
    let mut g = graph(&["--kv-host-bytes", "64MiB", "--block-size", "16"]);
    let bad: [(&str, Edit); 6] = [
        ("block_size", |b| b.layout.block_size = u32::MAX),
        ("dtype", |b| b.layout.dtype = "x".repeat(100_000)),
        ("own_parent", |b| b.parent = Some(b.hash)),
        ("payload", |b| {
            b.payload = Bytes::new();
            b.layout.block_bytes = 0;
        }),
        ("layers", |b| b.layout.layers = 0),
        ("layers", |b| b.layout.layers = u32::MAX),
    ];
    for (i, (reason, edit)) in bad.into_iter().enumerate() {
        let mut b = block(10 + i as u64);
        edit(&mut b);
        b.checksum = dynamo_kvblocks::checksum(&b.payload);
        let hash = b.hash;
        let reply = g.member.offload(vec![b]).await.unwrap();
        assert_eq!((reply.refused, reply.stored), (1, 0), "{reason}");
        assert!(
            g.member.lookup(&[hash]).await.unwrap().is_empty(),
            "{reason}"
        );
        let counted = metric_at(
            g.sidecar.metrics,
            "dynamo_sidecar_kv_blocks_refused_total",
            reason,
        );
        assert!(counted.await >= 1.0, "{reason} counted");
    }
    let reply = g.member.offload(vec![block(1)]).await.unwrap();
    assert_eq!(
        (reply.refused, reply.stored),
        (0, 1),
        "a good block still goes in"
    );
}

#[tokio::test]
async fn a_tampered_or_foreign_block_is_refused_on_offload_and_lend() {
    let mut g = graph(&["--kv-host-bytes", "64MiB"]);
    let forged = [
        tampered(&g.key, block(1), flip_payload),
        tampered(&g.key, block(2), |b| b.hash = SeqHash(b.hash.0 + 100)),
        g.other_key.seal(block(3)),
    ];
    for b in forged.clone() {
        let hash = b.hash;
        let reply = g.member.offload(vec![b]).await.unwrap();
        assert_eq!((reply.refused, reply.stored), (1, 0), "{hash:?}");
        assert!(g.member.lookup(&[hash]).await.unwrap().is_empty());
    }
    for (i, b) in forged.into_iter().enumerate() {
        let reply = g.member.lend(&format!("lease-{i}"), vec![b]).await.unwrap();
        assert_eq!(reply.lent, 0);
        assert!(reply.refused.unwrap().contains("MAC"));
    }
    let metric = metric_at(
        g.sidecar.metrics,
        "dynamo_sidecar_kv_blocks_refused_total",
        "mac",
    );
    assert_eq!(metric.await, 6.0);
    let good = block_chain(20, 2, BLOCK_BYTES);
    let reply = g.member.offload(good.clone()).await.unwrap();
    assert_eq!(reply.stored, 2);
    let back = g.member.onboard(&[SeqHash(20), SeqHash(21)]).await.unwrap();
    assert_eq!(back.len(), 2);
    assert!(
        back.iter().all(|b| g.key.admits(b)),
        "served with their MAC"
    );
}

#[tokio::test]
async fn a_fetching_client_drops_blocks_without_its_graphs_mac() {
    // A sidecar without a credential checks checksums only, so it lends anything: the
    // client that fetches with the graph's credential is what refuses the forgery.
    let lender = SidecarProcess::start(&[]);
    let url = format!("http://{}", lender.grpc);
    let dir = tempfile::tempdir().unwrap();
    let ours = Credential::read(&token_file(dir.path(), "graph", "graph-secret-0123456789"));
    let ours = ours.unwrap();
    let theirs = Credential::read(&token_file(dir.path(), "other", "another-graph-secret"));
    let mut stranger = BlockClient::new(&url).unwrap();
    let chain = block_chain(1, 2, BLOCK_BYTES);
    let sealed: Vec<Block> = chain
        .iter()
        .cloned()
        .map(|b| BlockKey::of(theirs.as_ref().unwrap()).seal(b))
        .collect();
    let reply = stranger.lend("forged", sealed).await.unwrap();
    assert_eq!(reply.lent, 2);
    let mut fetcher = BlockClient::new(&url)
        .unwrap()
        .with_credential(ours.clone());
    let hashes = [SeqHash(1), SeqHash(2)];
    assert!(
        fetcher
            .fetch_lease("forged", &hashes)
            .await
            .unwrap()
            .is_empty()
    );
    let reply = stranger
        .lend(
            "ours",
            block_chain(1, 2, BLOCK_BYTES)
                .into_iter()
                .map(|b| BlockKey::of(&ours).seal(b))
                .collect(),
        )
        .await
        .unwrap();
    assert_eq!(reply.lent, 2);
    assert_eq!(fetcher.fetch_lease("ours", &hashes).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_tampered_disk_record_is_never_served() {
    let disk = tempfile::tempdir().unwrap();
    let dir_arg = disk.path().to_str().unwrap();
    let mut g = graph(&[
        "--kv-disk-dir",
        dir_arg,
        "--kv-disk-bytes",
        "64MiB",
        "--kv-disk-min-reuse",
        "1",
    ]);
    let chain = block_chain(1, 2, BLOCK_BYTES);
    assert_eq!(g.member.offload(chain).await.unwrap().stored, 2);
    let hashes = [SeqHash(1), SeqHash(2)];
    eventually("both blocks on disk", || {
        let mut client = g.member.clone();
        async move {
            let held = client.lookup(&hashes).await.unwrap();
            held.iter().filter(|(_, t)| *t == Tier::Disk).count() == 2
        }
    })
    .await;
    // Rewrite the second record with another payload and a checksum that matches it.
    let path = disk.path().join(record::name(SeqHash(2), Some(SeqHash(1))));
    let mut b = record::decode(Bytes::from(std::fs::read(&path).unwrap())).unwrap();
    flip_payload(&mut b);
    b.checksum = dynamo_kvblocks::checksum(&b.payload);
    std::fs::write(&path, record::encode(&b)).unwrap();
    let back = g.member.onboard(&hashes).await.unwrap();
    assert_eq!(
        back.iter().map(|b| b.hash).collect::<Vec<_>>(),
        [SeqHash(1)]
    );
    let metric = metric_at(
        g.sidecar.metrics,
        "dynamo_sidecar_kv_blocks_refused_total",
        "mac",
    );
    assert_eq!(metric.await, 1.0);
}
