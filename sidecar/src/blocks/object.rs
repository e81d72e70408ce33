//! The object-storage tier (G4): one object per block on S3 or an S3-compatible server
//! (`object_store`), in the record format of `dynamo_kvblocks::record` and named after
//! the block's hash and its parent's, under a prefix of one bucket.
//!
//! A store that is down or slow must not stall the block API: the S3 client has short
//! connect and request timeouts and a small retry budget ([`ObjectTier::s3_builder`]),
//! and every call is also bounded by a timeout of its own. A read never takes more than
//! `max_object_bytes` from the store, whatever the object holds.
//!
//! Configuration from the environment ([`ObjectTier::from_url`]), read the way
//! `AmazonS3Builder::from_env` reads it in object_store 0.14.2 (`aws/builder.rs`: every
//! `AWS_*` variable, lowercased, parsed as an `AmazonS3ConfigKey`):
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` (or `AWS_TOKEN`),
//! `AWS_REGION` (`AWS_DEFAULT_REGION` when that is unset), `AWS_ENDPOINT_URL` or
//! `AWS_ENDPOINT` (`AWS_ENDPOINT_URL_S3` takes precedence), `AWS_ALLOW_HTTP=true` for a
//! plain-HTTP endpoint, `AWS_VIRTUAL_HOSTED_STYLE_REQUEST`, the web-identity and container
//! credential variables (`AWS_WEB_IDENTITY_TOKEN_FILE`, `AWS_ROLE_ARN`,
//! `AWS_CONTAINER_CREDENTIALS_*`), and the HTTP client's keys with an `AWS_` prefix, among
//! them `AWS_TIMEOUT` and `AWS_CONNECT_TIMEOUT` (humantime, e.g. `30s`), which replace
//! this tier's defaults.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dynamo_kvblocks::{Block, record};
use dynamo_kvcache::SeqHash;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientConfigKey, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload,
    RetryConfig,
};

/// Connect timeout of the S3 client: a store that does not accept fails fast.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Whole-request timeout of the S3 client, body included (object_store's default is
/// 30 s). The largest block, 64 MiB, needs 6.4 MB/s to make it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Retries of one request (object_store's default is 10, over up to 3 minutes).
pub const MAX_RETRIES: usize = 2;
/// No retry starts later than this after the first attempt.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(10);
/// The bound on one call of the tier (one page of a listing), whatever the client does:
/// a retry that starts just before [`RETRY_TIMEOUT`] and runs its whole
/// [`REQUEST_TIMEOUT`] ends by then. An `AWS_TIMEOUT` above it is cut to it; see
/// [`ObjectTier::with_call_timeout`].
pub const CALL_TIMEOUT: Duration = Duration::from_secs(25);

/// A record found in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listed {
    pub hash: SeqHash,
    pub parent: Option<SeqHash>,
    /// Bytes of the record (what it takes in the store).
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object store configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Store(#[from] object_store::Error),
    #[error("{path}: {source}")]
    Record {
        path: Path,
        source: record::RecordError,
    },
    #[error("{path}: {bytes} bytes, more than a block may take ({max})")]
    TooLarge { path: Path, bytes: u64, max: u64 },
    #[error("object store {op} did not finish within {after:?}")]
    Timeout { op: &'static str, after: Duration },
}

impl ObjectError {
    /// Whether the object is there but is not a block record the tier would serve (as
    /// opposed to a store that could not be asked).
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Self::Record { .. } | Self::TooLarge { .. })
    }
}

/// Cheap to clone: clones share the client.
#[derive(Clone, Debug)]
pub struct ObjectTier {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// Largest object read back: a record grown or planted by something else is refused
    /// before it is downloaded.
    max_object_bytes: u64,
    call_timeout: Duration,
}

impl ObjectTier {
    /// The tier at `s3://bucket` or `s3://bucket/some/prefix`, with credentials, region
    /// and endpoint from the environment (see the module's documentation).
    pub fn from_url(url: &str, max_object_bytes: u64) -> Result<Self, ObjectError> {
        Self::from_s3(url, with_env(Self::s3_builder()), max_object_bytes)
    }

    /// The tier at `url` (as [`Self::from_url`]) through `builder`, which supplies
    /// everything but the bucket: for tests and embedding (start from
    /// [`Self::s3_builder`] to keep the tier's timeouts).
    pub fn from_s3(
        url: &str,
        builder: AmazonS3Builder,
        max_object_bytes: u64,
    ) -> Result<Self, ObjectError> {
        let (bucket, prefix) = parse_url(url)?;
        let store = builder
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| ObjectError::Config(format!("{url}: {e}")))?;
        Ok(Self::new(Arc::new(store), prefix, max_object_bytes))
    }

    /// The S3 client settings the tier starts from: the timeouts and retry budget above.
    pub fn s3_builder() -> AmazonS3Builder {
        let secs = |d: Duration| format!("{}s", d.as_secs());
        AmazonS3Builder::new()
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                secs(CONNECT_TIMEOUT),
            )
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                secs(REQUEST_TIMEOUT),
            )
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(1),
                    base: 2.,
                },
                max_retries: MAX_RETRIES,
                retry_timeout: RETRY_TIMEOUT,
            })
    }

    /// For tests and embedding: any store, the tier's objects under `prefix`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: Path, max_object_bytes: u64) -> Self {
        Self {
            store,
            prefix,
            max_object_bytes,
            call_timeout: CALL_TIMEOUT,
        }
    }

    /// Replaces [`CALL_TIMEOUT`], the bound on each call.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Where the block's record lives.
    pub fn path(&self, hash: SeqHash, parent: Option<SeqHash>) -> Path {
        self.prefix.clone().join(record::name(hash, parent))
    }

    /// Writes `block`'s record (one PUT: S3 makes it visible whole or not at all).
    pub async fn put(&self, block: &Block) -> Result<(), ObjectError> {
        let path = self.path(block.hash, block.parent);
        let payload = PutPayload::from(record::encode(block));
        self.bounded("put", self.store.put(&path, payload))
            .await??;
        Ok(())
    }

    /// The block's record, decoded but not checksum-verified (the caller verifies), or
    /// `None` when there is no such object.
    pub async fn get(
        &self,
        hash: SeqHash,
        parent: Option<SeqHash>,
    ) -> Result<Option<Block>, ObjectError> {
        let path = self.path(hash, parent);
        self.bounded("get", async {
            // One ranged GET rather than HEAD then GET (which a replaced object could
            // race): the body is at most one byte over the limit, and the response's
            // Content-Range gives the whole object's size (`meta.size`), checked before
            // a byte of the body is read. object_store rejects a reply that ignores the
            // range (`GetResultError::NotPartial`).
            let options = GetOptions {
                range: Some(GetRange::Bounded(
                    0..self.max_object_bytes.saturating_add(1),
                )),
                ..GetOptions::default()
            };
            let got = match self.store.get_opts(&path, options).await {
                Ok(got) => got,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                // S3 answers any range of an empty object with 416 (which object_store
                // 0.14 reports as a `Generic` error): an empty object is a torn record,
                // not a store that is down, so look before blaming the store.
                Err(e) => {
                    return Err(match self.store.head(&path).await {
                        Ok(meta) if meta.size == 0 => ObjectError::Record {
                            path: path.clone(),
                            source: record::RecordError::Truncated(0),
                        },
                        _ => e.into(),
                    });
                }
            };
            if got.meta.size > self.max_object_bytes {
                return Err(ObjectError::TooLarge {
                    path: path.clone(),
                    bytes: got.meta.size,
                    max: self.max_object_bytes,
                });
            }
            let bytes: Bytes = got.bytes().await?;
            record::decode(bytes)
                .map(Some)
                .map_err(|source| ObjectError::Record {
                    path: path.clone(),
                    source,
                })
        })
        .await?
    }

    /// Removes the block's record; one already gone is fine.
    pub async fn delete(&self, hash: SeqHash, parent: Option<SeqHash>) -> Result<(), ObjectError> {
        let path = self.path(hash, parent);
        match self.bounded("delete", self.store.delete(&path)).await? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The records stored directly under the prefix, at most `limit` of them, least
    /// recently written first (their LRU order, as the disk tier's scan). Other objects,
    /// and records in sub-"directories" of the prefix (not this tier's), are skipped.
    pub async fn list(&self, limit: usize) -> Result<Vec<Listed>, ObjectError> {
        let prefix = (!self.prefix.is_root()).then_some(&self.prefix);
        // Streamed a page (S3: 1000 keys) at a time, so a bucket with many foreign
        // objects costs time, not memory; the bound is per page, since re-indexing a
        // large tier takes many.
        let mut stream = self.store.list(prefix);
        let mut listed = Vec::new();
        while listed.len() < limit {
            let Some(meta) = self.bounded("list", stream.try_next()).await?? else {
                break;
            };
            let Some(mut rest) = meta.location.prefix_match(&self.prefix) else {
                continue;
            };
            let (Some(name), None) = (rest.next(), rest.next()) else {
                continue;
            };
            // `parse_name` takes exactly the names `record::name` writes.
            let Some((hash, parent)) = record::parse_name(name.as_ref()) else {
                continue;
            };
            let entry = Listed {
                hash,
                parent,
                bytes: meta.size,
            };
            listed.push((meta.last_modified, entry));
        }
        listed.sort_by_key(|(modified, l)| (*modified, l.hash.0));
        Ok(listed.into_iter().map(|(_, l)| l).collect())
    }

    /// `call` bounded by the tier's call timeout.
    async fn bounded<T>(
        &self,
        op: &'static str,
        call: impl Future<Output = T>,
    ) -> Result<T, ObjectError> {
        tokio::time::timeout(self.call_timeout, call)
            .await
            .map_err(|_| ObjectError::Timeout {
                op,
                after: self.call_timeout,
            })
    }
}

/// `builder` with the `AWS_*` environment applied over it, exactly as
/// `AmazonS3Builder::from_env` applies it to a default builder (object_store 0.14.2
/// `aws/builder.rs`), so the tier's own defaults give way to an explicit `AWS_TIMEOUT`.
fn with_env(mut builder: AmazonS3Builder) -> AmazonS3Builder {
    for (key, value) in std::env::vars_os() {
        let (Some(key), Some(value)) = (key.to_str(), value.to_str()) else {
            continue;
        };
        if key.starts_with("AWS_")
            && let Ok(key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>()
        {
            builder = builder.with_config(key, value);
        }
    }
    builder
}

/// The bucket and prefix of `s3://bucket[/prefix]`.
fn parse_url(url: &str) -> Result<(&str, Path), ObjectError> {
    let bad = |why: &str| ObjectError::Config(format!("{url:?}: {why}"));
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| bad("expected s3://bucket or s3://bucket/prefix"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket"));
    }
    let prefix = Path::parse(prefix.trim_end_matches('/')).map_err(|e| bad(&e.to_string()))?;
    Ok((bucket, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::test_block as block;
    use object_store::memory::InMemory;

    #[test]
    fn urls_give_a_bucket_and_a_prefix() {
        let (bucket, prefix) = parse_url("s3://kv").unwrap();
        assert_eq!((bucket, prefix.as_ref()), ("kv", ""));
        let (bucket, prefix) = parse_url("s3://kv/pods/a/").unwrap();
        assert_eq!((bucket, prefix.as_ref()), ("kv", "pods/a"));
        for bad in ["kv", "http://kv/x", "s3://", "s3:///x", "s3://kv/a//b"] {
            assert!(
                matches!(parse_url(bad), Err(ObjectError::Config(_))),
                "{bad}"
            );
        }
        // Without credentials the client still builds: they are looked up per request.
        assert!(ObjectTier::from_url("s3://kv/prefix", 1 << 20).is_ok());
    }

    #[tokio::test]
    async fn in_memory_round_trip_and_limits() {
        let store = Arc::new(InMemory::new());
        let tier = ObjectTier::new(store.clone(), Path::from("p"), 200);
        let (a, b) = (block(1, None, b"first"), block(2, Some(1), b"second"));
        tier.put(&a).await.unwrap();
        tier.put(&b).await.unwrap();
        store
            .put(&Path::from("p/notes.txt"), Bytes::from_static(b"x").into())
            .await
            .unwrap();
        store
            .put(
                &Path::from("p/sub/0000000000000003.kvb"),
                record::encode(&a).into(),
            )
            .await
            .unwrap();
        let mut listed = tier.list(10).await.unwrap();
        listed.sort_by_key(|l| l.hash.0);
        assert_eq!(
            listed,
            [
                Listed {
                    hash: a.hash,
                    parent: None,
                    bytes: record::encoded_len(&a)
                },
                Listed {
                    hash: b.hash,
                    parent: b.parent,
                    bytes: record::encoded_len(&b)
                }
            ]
        );
        assert_eq!(tier.list(1).await.unwrap().len(), 1);
        assert_eq!(tier.get(b.hash, b.parent).await.unwrap(), Some(b.clone()));
        assert_eq!(tier.get(b.hash, None).await.unwrap(), None);

        let big = Bytes::from(vec![7u8; 201]);
        store
            .put(&tier.path(SeqHash(9), None), big.into())
            .await
            .unwrap();
        let err = tier.get(SeqHash(9), None).await.unwrap_err();
        assert!(
            matches!(
                err,
                ObjectError::TooLarge {
                    bytes: 201,
                    max: 200,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.is_corrupt());

        tier.delete(b.hash, b.parent).await.unwrap();
        tier.delete(b.hash, b.parent).await.unwrap();
        assert_eq!(tier.get(b.hash, b.parent).await.unwrap(), None);
    }
}
