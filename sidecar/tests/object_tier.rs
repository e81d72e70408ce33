//! The object tier (G4) against a real S3-compatible server (moto, `support/moto.rs`):
//! round trips of real-sized records, what rot and truncation in the store turn into, the
//! size limit enforced before a download, a store that is down or silent, and listing
//! among foreign objects.

mod support {
    pub mod moto;
}

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use dynamo_kvblocks::{Block, Layout, record};
use dynamo_kvcache::SeqHash;
use dynamo_sidecar::blocks::object::{Listed, ObjectError, ObjectTier};
use object_store::ObjectStoreExt;
use object_store::path::Path;
use support::moto::Moto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MIB: usize = 1 << 20;
const MAX: u64 = 4 * MIB as u64;
const PREFIX: &str = "pods/a";
const BUCKET: &str = "kv-blocks";

/// A block with `len` bytes of deterministic noise.
fn block(hash: u64, parent: Option<u64>, len: usize) -> Block {
    let mut x = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let payload: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let layout = Layout {
        block_bytes: len as u64,
        block_size: 16,
        layers: 28,
        dtype: "bfloat16".into(),
    };
    Block::new(
        SeqHash(hash),
        parent.map(SeqHash),
        16,
        layout,
        Bytes::from(payload),
    )
}

fn tier(moto: &Moto) -> ObjectTier {
    ObjectTier::from_s3(&moto.url(PREFIX), moto.builder(), MAX).unwrap()
}

fn raw_path(b: &Block) -> Path {
    Path::from(format!("{PREFIX}/{}", record::name(b.hash, b.parent)))
}

#[tokio::test]
async fn blocks_round_trip_and_listing_skips_foreign_objects() {
    let moto = Moto::start(BUCKET).await;
    let tier = tier(&moto);
    let blocks = [
        block(1, None, MIB),
        block(2, Some(1), MIB),
        block(3, Some(2), 1000),
    ];
    for b in &blocks {
        tier.put(b).await.unwrap();
    }
    for b in &blocks {
        let back = tier.get(b.hash, b.parent).await.unwrap().expect("stored");
        assert!(back.verify());
        assert_eq!(&back, b);
    }
    assert_eq!(tier.get(SeqHash(1), Some(SeqHash(9))).await.unwrap(), None);

    // Foreign objects: not a record name, a record name deeper than the prefix, a record
    // name beside the prefix (`pods/ab`), one outside it, and names `parse_name` takes
    // that are not the names the tier writes.
    let raw = moto.raw();
    let record = record::encode(&blocks[0]);
    for name in [
        format!("{PREFIX}/notes.txt"),
        format!("{PREFIX}/old/0000000000000007.kvb"),
        "pods/ab/0000000000000008.kvb".to_owned(),
        "0000000000000009.kvb".to_owned(),
        format!("{PREFIX}/00000000000000FF.kvb"),
        format!("{PREFIX}/+00000000000000f.kvb"),
    ] {
        raw.put(&Path::from(name), record.clone().into())
            .await
            .unwrap();
    }
    let mut listed = tier.list(100).await.unwrap();
    listed.sort_by_key(|l| l.hash.0);
    let expected: Vec<Listed> = blocks
        .iter()
        .map(|b| Listed {
            hash: b.hash,
            parent: b.parent,
            bytes: record::encoded_len(b),
        })
        .collect();
    assert_eq!(listed, expected);
    assert_eq!(tier.list(2).await.unwrap().len(), 2, "at most `limit`");

    // The bucket's root as the prefix sees only the record at the root.
    let root = ObjectTier::from_s3(&moto.url(""), moto.builder(), MAX).unwrap();
    let at_root = root.list(100).await.unwrap();
    assert_eq!(
        at_root.iter().map(|l| l.hash).collect::<Vec<_>>(),
        [SeqHash(9)]
    );

    tier.delete(blocks[1].hash, blocks[1].parent).await.unwrap();
    tier.delete(blocks[1].hash, blocks[1].parent).await.unwrap(); // already gone: fine
    assert_eq!(
        tier.get(blocks[1].hash, blocks[1].parent).await.unwrap(),
        None
    );
    assert_eq!(tier.list(100).await.unwrap().len(), 2);
}

#[tokio::test]
async fn rot_is_caught_by_the_checksum_and_truncation_is_an_error() {
    let moto = Moto::start(BUCKET).await;
    let tier = tier(&moto);
    let raw = moto.raw();
    let b = block(5, Some(4), MIB);
    tier.put(&b).await.unwrap();

    let stored = raw.get(&raw_path(&b)).await.unwrap().bytes().await.unwrap();
    assert_eq!(stored, record::encode(&b));
    let mut flipped = stored.to_vec();
    flipped[stored.len() - MIB / 2] ^= 0x40;
    raw.put(&raw_path(&b), Bytes::from(flipped).into())
        .await
        .unwrap();
    let rotten = tier
        .get(b.hash, b.parent)
        .await
        .unwrap()
        .expect("still a record");
    assert!(
        !rotten.verify(),
        "the checksum catches a flipped payload byte"
    );

    for len in [stored.len() - 1, stored.len() / 2, 10] {
        raw.put(&raw_path(&b), stored.slice(..len).into())
            .await
            .unwrap();
        let err = tier.get(b.hash, b.parent).await.unwrap_err();
        assert!(
            matches!(err, ObjectError::Record { .. }),
            "{len} bytes: {err}"
        );
        assert!(err.is_corrupt());
    }
    // An empty object, which S3 answers a ranged GET of with 416.
    raw.put(&raw_path(&b), Bytes::new().into()).await.unwrap();
    let err = tier.get(b.hash, b.parent).await.unwrap_err();
    assert!(err.is_corrupt(), "{err}");
}

/// A TCP relay to `upstream` counting the bytes that come back from it.
async fn counting_proxy(upstream: String) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let down = Arc::new(AtomicU64::new(0));
    let counted = down.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&upstream).await else {
                continue;
            };
            let counted = counted.clone();
            tokio::spawn(async move {
                let (mut client_rx, mut client_tx) = client.into_split();
                let (mut server_rx, mut server_tx) = server.into_split();
                let up = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_rx, &mut server_tx).await;
                });
                let mut buf = vec![0; 64 << 10];
                while let Ok(n @ 1..) = server_rx.read(&mut buf).await {
                    counted.fetch_add(n as u64, Ordering::Relaxed);
                    if client_tx.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                up.abort();
            });
        }
    });
    (format!("http://{addr}"), down)
}

#[tokio::test]
async fn an_object_over_the_limit_is_refused_without_downloading_it() {
    let moto = Moto::start(BUCKET).await;
    let upstream = moto.endpoint().trim_start_matches("http://").to_owned();
    let (proxied, down) = counting_proxy(upstream).await;
    let tier = ObjectTier::from_s3(&moto.url(PREFIX), Moto::builder_for(&proxied), MAX).unwrap();

    let huge = block(6, None, 32 * MIB);
    moto.raw()
        .put(&raw_path(&huge), record::encode(&huge).into())
        .await
        .unwrap();
    let err = tier.get(huge.hash, huge.parent).await.unwrap_err();
    match &err {
        ObjectError::TooLarge { bytes, max, .. } => {
            assert_eq!(*bytes, record::encoded_len(&huge));
            assert_eq!(*max, MAX);
        }
        other => panic!("expected TooLarge, got {other}"),
    }
    assert!(err.is_corrupt());
    // The GET asked for at most MAX + 1 bytes, so the server sent no more than that
    // (plus headers), whatever the object's size.
    let received = down.load(Ordering::Relaxed);
    assert!(
        received <= MAX + 64 * 1024,
        "{received} bytes came back for a refused object"
    );

    // One at the limit is served.
    let fits = block(7, None, MAX as usize - 200);
    assert!(record::encoded_len(&fits) <= MAX);
    tier.put(&fits).await.unwrap();
    assert_eq!(tier.get(fits.hash, None).await.unwrap(), Some(fits));
}

#[tokio::test]
async fn a_store_that_is_down_or_silent_fails_calls_instead_of_hanging() {
    let mut moto = Moto::start(BUCKET).await;
    let tier = tier(&moto);
    let b = block(8, None, 4096);
    tier.put(&b).await.unwrap();

    moto.kill();
    assert!(tier.put(&block(9, None, 4096)).await.is_err());
    let err = tier.get(b.hash, None).await.unwrap_err();
    assert!(!err.is_corrupt(), "a store that is down is not rot: {err}");
    assert!(tier.delete(b.hash, None).await.is_err());
    assert!(tier.list(10).await.is_err());

    // Back up (empty: moto keeps its state in memory), the same tier works again.
    moto.restart().await;
    assert_eq!(tier.get(b.hash, None).await.unwrap(), None);
    tier.put(&b).await.unwrap();
    assert_eq!(tier.get(b.hash, None).await.unwrap(), Some(b.clone()));

    // A server that accepts connections and never answers: the call's own bound ends it.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            open.push(conn);
        }
    });
    let stuck = ObjectTier::from_s3("s3://kv-blocks/x", Moto::builder_for(&endpoint), MAX)
        .unwrap()
        .with_call_timeout(Duration::from_millis(500));
    let err = stuck.get(b.hash, None).await.unwrap_err();
    assert!(
        matches!(err, ObjectError::Timeout { op: "get", .. }),
        "{err}"
    );
    assert!(matches!(
        stuck.put(&b).await.unwrap_err(),
        ObjectError::Timeout { op: "put", .. }
    ));
    assert!(matches!(
        stuck.list(10).await.unwrap_err(),
        ObjectError::Timeout { op: "list", .. }
    ));
    held.abort();
}
