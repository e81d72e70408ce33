//! The block API lets no stranger in (`docs/sidecar.md`, "Security"), against the real
//! binary over real sockets: a sidecar given the graph's credential answers every call
//! without it, or with another, `UNAUTHENTICATED`, and nothing is stored, lent, fetched
//! or created, and its KV event stream tells nothing; with it, everything works as before.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use dynamo_kvblocks::{BlockClient, BlockKey, CREDENTIAL_FILE_ENV, ClientError, Credential};
use dynamo_kvcache::SeqHash;
use dynamo_kvstream::pb::SubscribeRequest;
use dynamo_kvstream::pb::kv_event_stream_client::KvEventStreamClient;
use dynamo_kvstream::{PodUpdate, SubscriberConfig, follow};

const BLOCK_BYTES: usize = 4096;

/// A chain of `n` blocks, hashes `first..`.
fn chain(first: u64, n: u64) -> Vec<dynamo_kvblocks::Block> {
    block_chain(first, n, BLOCK_BYTES)
}

fn hashes(blocks: &[dynamo_kvblocks::Block]) -> Vec<SeqHash> {
    blocks.iter().map(|b| b.hash).collect()
}

fn token_file(dir: &Path, name: &str, token: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path
}

#[track_caller]
fn unauthenticated<T: std::fmt::Debug>(call: &str, result: Result<T, ClientError>) {
    match result {
        Err(ClientError::Status(status)) => {
            assert_eq!(
                status.code(),
                tonic::Code::Unauthenticated,
                "{call}: {status}"
            )
        }
        other => panic!("{call}: {other:?}"),
    }
}

#[tokio::test]
async fn a_client_without_the_graphs_credential_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let regions = tempfile::tempdir().unwrap();
    let ours = token_file(dir.path(), "graph", "graph-secret-0123456789");
    let theirs = token_file(dir.path(), "other", "graph-secret-0123456780");
    let sidecar = SidecarProcess::start_with_env(
        &[
            "--kv-host-bytes",
            "64MiB",
            "--kv-region-dir",
            regions.path().to_str().unwrap(),
        ],
        &[(CREDENTIAL_FILE_ENV, ours.to_str().unwrap())],
    );
    let url = format!("http://{}", sidecar.grpc);
    let mut member = BlockClient::new(&url)
        .unwrap()
        .with_credential(Credential::read(&ours).unwrap());
    // Sealed as the client seals them, so that what comes back compares equal.
    let key = BlockKey::of(&Credential::read(&ours).unwrap());
    let lent: Vec<_> = chain(100, 2).into_iter().map(|b| key.seal(b)).collect();
    let reply = member.lend("lease-1", lent.clone()).await.unwrap();
    assert_eq!((reply.lent, reply.refused), (2, None));
    let blocks = chain(1, 3);

    let strangers = [
        ("no credential", BlockClient::new(&url).unwrap()),
        (
            "another graph's",
            BlockClient::new(&url)
                .unwrap()
                .with_credential(Credential::read(&theirs).unwrap()),
        ),
    ];
    for (who, mut stranger) in strangers {
        let call = |method: &str| format!("{who}: {method}");
        unauthenticated(&call("offload"), stranger.offload(blocks.clone()).await);
        unauthenticated(&call("lookup"), stranger.lookup(&hashes(&blocks)).await);
        unauthenticated(&call("onboard"), stranger.onboard(&hashes(&lent)).await);
        unauthenticated(
            &call("fetch"),
            stranger.fetch_lease("lease-1", &hashes(&lent)).await,
        );
        unauthenticated(&call("lend"), stranger.lend("junk", chain(200, 2)).await);
        unauthenticated(&call("open region"), stranger.share_memory(4096).await);
    }
    // Nor may a stranger learn which prompts the pod holds from its KV event stream.
    let mut events = KvEventStreamClient::connect(url.clone()).await.unwrap();
    let refused = events.subscribe(SubscribeRequest::default()).await;
    assert_eq!(
        refused.err().map(|s| s.code()),
        Some(tonic::Code::Unauthenticated)
    );

    // Nothing stored, taken, lent or created.
    assert!(member.lookup(&hashes(&blocks)).await.unwrap().is_empty());
    assert!(
        member
            .fetch_lease("junk", &hashes(&chain(200, 2)))
            .await
            .unwrap_err()
            .is_gone()
    );
    assert_eq!(std::fs::read_dir(regions.path()).unwrap().count(), 0);
    assert_eq!(
        member.fetch_lease("lease-1", &hashes(&lent)).await.unwrap(),
        lent,
        "the lease is still there for its rightful fetch"
    );

    // With the credential, everything works as before.
    assert!(member.share_memory(1 << 20).await.unwrap());
    assert_eq!(member.offload(blocks.clone()).await.unwrap().stored, 3);
    assert_eq!(member.lookup(&hashes(&blocks)).await.unwrap().len(), 3);
    let sealed: Vec<_> = blocks.into_iter().map(|b| key.seal(b)).collect();
    assert_eq!(member.onboard(&hashes(&sealed)).await.unwrap(), sealed);
    let config = SubscriberConfig {
        credential: Some(Credential::read(&ours).unwrap()),
        ..SubscriberConfig::default()
    };
    let (first, update) = tokio::sync::oneshot::channel();
    let mut first = Some(first);
    let follower = tokio::spawn(follow(url, config, move |u| {
        if let Some(tx) = first.take() {
            let _ = tx.send(u);
        }
    }));
    let update = tokio::time::timeout(std::time::Duration::from_secs(10), update).await;
    follower.abort();
    assert!(
        matches!(update, Ok(Ok(PodUpdate::Snapshot(_)))),
        "{update:?}"
    );
}

#[tokio::test]
async fn a_sidecar_whose_credential_cannot_be_read_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let empty = token_file(dir.path(), "empty", "");
    for (path, why) in [
        (
            dir.path().join("missing"),
            "reading the block API credential",
        ),
        (empty, "is empty"),
    ] {
        let flags = ["--block-api-token-file", path.to_str().unwrap()];
        let refused = try_sidecar_with("http://127.0.0.1:1", None, None, &flags).await;
        let error = refused.err().expect("no sidecar").to_string();
        assert!(error.contains(why), "{error}");
    }
}
