//! The local-disk tier (G3): one file per block, in the record format of
//! `dynamo_kvblocks::record`, named after the block's hash and its parent's.
//!
//! Crash safety: a record is written whole to `.partial/` and renamed into place, so the
//! directory holds only complete records; what a crash leaves in `.partial/` is removed
//! at the next start. Records are not fsynced: after a power loss a renamed file may
//! still be torn, which its checksum catches on the read that would have served it.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;
use dynamo_kvblocks::{Block, record};
use dynamo_kvcache::SeqHash;

const PARTIAL: &str = ".partial";

/// A record found on disk at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub hash: SeqHash,
    pub parent: Option<SeqHash>,
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {source}")]
    Record {
        path: PathBuf,
        source: record::RecordError,
    },
    #[error("{path}: {bytes} bytes, more than a block may take ({max})")]
    TooLarge { path: PathBuf, bytes: u64, max: u64 },
}

#[derive(Debug)]
pub struct DiskTier {
    dir: PathBuf,
    partial: PathBuf,
    /// Largest record read back: a file grown by something else is not slurped.
    max_record: u64,
    next_partial: AtomicU64,
}

impl DiskTier {
    /// Opens (creating) `dir` and clears what an interrupted write left behind.
    pub fn open(dir: &Path, max_record: u64) -> Result<Self, DiskError> {
        let partial = dir.join(PARTIAL);
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| DiskError::Io { path, source }
        };
        fs::create_dir_all(&partial).map_err(io(&partial))?;
        for entry in fs::read_dir(&partial).map_err(io(&partial))? {
            let path = entry.map_err(io(&partial))?.path();
            fs::remove_file(&path).map_err(io(&path))?;
        }
        Ok(Self {
            dir: dir.to_owned(),
            partial,
            max_record,
            next_partial: AtomicU64::new(0),
        })
    }

    /// The records in the directory, least recently written first (their LRU order).
    pub fn scan(&self) -> Result<Vec<Found>, DiskError> {
        let io = |source| DiskError::Io {
            path: self.dir.clone(),
            source,
        };
        let mut found = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            let Some((hash, parent)) = name.to_str().and_then(record::parse_name) else {
                continue;
            };
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_file() {
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                found.push((
                    modified,
                    Found {
                        hash,
                        parent,
                        bytes: meta.len(),
                    },
                ));
            }
        }
        found.sort_by_key(|(modified, f)| (*modified, f.hash.0));
        Ok(found.into_iter().map(|(_, f)| f).collect())
    }

    /// Writes `block`'s record (blocking: call from a blocking thread).
    pub fn put(&self, block: &Block) -> Result<(), DiskError> {
        let name = record::name(block.hash, block.parent);
        let n = self.next_partial.fetch_add(1, Ordering::Relaxed);
        let partial = self.partial.join(format!("{name}.{n}"));
        let path = self.dir.join(&name);
        let written = fs::File::create(&partial)
            .and_then(|mut f| f.write_all(&record::encode(block)))
            .and_then(|()| fs::rename(&partial, &path));
        written.map_err(|source| {
            let _ = fs::remove_file(&partial);
            DiskError::Io { path, source }
        })
    }

    /// The block's record, decoded (not verified), or `None` when there is none
    /// (blocking).
    pub fn get(&self, hash: SeqHash, parent: Option<SeqHash>) -> Result<Option<Block>, DiskError> {
        let path = self.dir.join(record::name(hash, parent));
        let io = |source| DiskError::Io {
            path: path.clone(),
            source,
        };
        let mut file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        let bytes = file.metadata().map_err(io)?.len();
        if bytes > self.max_record {
            return Err(DiskError::TooLarge {
                path,
                bytes,
                max: self.max_record,
            });
        }
        let mut buf = Vec::with_capacity(bytes as usize);
        io::Read::read_to_end(&mut io::Read::take(&mut file, self.max_record), &mut buf)
            .map_err(io)?;
        record::decode(Bytes::from(buf))
            .map(Some)
            .map_err(|source| DiskError::Record { path, source })
    }

    /// Removes the block's record; one already gone is fine (blocking).
    pub fn delete(&self, hash: SeqHash, parent: Option<SeqHash>) -> Result<(), DiskError> {
        let path = self.dir.join(record::name(hash, parent));
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(DiskError::Io { path, source: e }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::test_block as block;

    #[test]
    fn records_survive_a_reopen_and_leftover_partials_are_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let disk = DiskTier::open(dir.path(), 1 << 20).unwrap();
        let (a, b) = (block(1, None, b"first"), block(2, Some(1), b"second"));
        disk.put(&a).unwrap();
        disk.put(&b).unwrap();
        fs::write(
            dir.path().join(PARTIAL).join("0000000000000003.kvb.0"),
            b"torn",
        )
        .unwrap();
        fs::write(dir.path().join("notes.txt"), b"not a record").unwrap();

        let disk = DiskTier::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(fs::read_dir(dir.path().join(PARTIAL)).unwrap().count(), 0);
        let mut found = disk.scan().unwrap();
        found.sort_by_key(|f| f.hash.0);
        assert_eq!(
            found.iter().map(|f| (f.hash, f.parent)).collect::<Vec<_>>(),
            [(SeqHash(1), None), (SeqHash(2), Some(SeqHash(1)))]
        );
        assert_eq!(found[1].bytes, record::encoded_len(&b));
        assert_eq!(disk.get(b.hash, b.parent).unwrap(), Some(b.clone()));
        disk.delete(b.hash, b.parent).unwrap();
        disk.delete(b.hash, b.parent).unwrap();
        assert_eq!(disk.get(b.hash, b.parent).unwrap(), None);
    }

    #[test]
    fn a_truncated_or_oversized_file_is_an_error_and_a_flipped_byte_fails_verify() {
        let dir = tempfile::tempdir().unwrap();
        let disk = DiskTier::open(dir.path(), 200).unwrap();
        let a = block(1, None, b"payload bytes");
        disk.put(&a).unwrap();
        let path = dir.path().join(record::name(a.hash, None));
        let whole = fs::read(&path).unwrap();

        fs::write(&path, &whole[..whole.len() - 1]).unwrap();
        assert!(matches!(
            disk.get(a.hash, None),
            Err(DiskError::Record { .. })
        ));

        let mut flipped = whole.clone();
        *flipped.last_mut().unwrap() ^= 0x80;
        fs::write(&path, &flipped).unwrap();
        assert!(!disk.get(a.hash, None).unwrap().unwrap().verify());

        fs::write(&path, vec![0u8; 201]).unwrap();
        assert!(matches!(
            disk.get(a.hash, None),
            Err(DiskError::TooLarge { .. })
        ));
    }
}
