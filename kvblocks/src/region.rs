//! Shared memory regions of the block API (`OpenRegion`): a file both processes map,
//! through which payloads cross between an engine and its sidecar on the same host by
//! memory copy instead of through a socket. The sidecar creates a region; its client
//! maps it by path.
//!
//! The two processes write and read the same pages, so neither trusts what it reads:
//! every payload read out of a region is checksummed as it is copied, and a block whose
//! checksum does not match is refused like any other corrupt block.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use memmap2::MmapRaw;
use xxhash_rust::xxh3::Xxh3Default;

/// Bytes copied (and hashed) at a time: the chunk is still in cache when it is hashed,
/// so verifying costs little more than the copy.
const CHUNK: usize = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("bytes {offset}..{offset}+{len} are outside the region's {size}")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
}

/// One mapping of a region.
#[derive(Debug)]
pub struct Region {
    map: MmapRaw,
    path: PathBuf,
}

// SAFETY: the mapping is plain memory for the region's lifetime; concurrent access is
// byte copies through raw pointers, whose results are checksummed before use.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    /// Creates a region of `bytes` at `path` (the sidecar's side); the file is removed
    /// again when the region is dropped. Mode 0600: only this user (the sidecar's, which
    /// its engine shares in our pods and local runs; a root engine reads it all the same)
    /// may map what it holds.
    pub fn create(path: &Path, bytes: u64) -> Result<Self, RegionError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let io = |source| RegionError::Io {
            path: path.to_owned(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        let mapped = file.set_len(bytes).and_then(|()| MmapRaw::map_raw(&file));
        match mapped {
            Ok(map) => Ok(Self {
                map,
                path: path.to_owned(),
            }),
            Err(e) => {
                let _ = std::fs::remove_file(path);
                Err(io(e))
            }
        }
    }

    /// Maps the region the sidecar created at `path` (the client's side).
    pub fn open(path: &Path) -> Result<Self, RegionError> {
        let io = |source| RegionError::Io {
            path: path.to_owned(),
            source,
        };
        let file: File = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?;
        Ok(Self {
            map: MmapRaw::map_raw(&file).map_err(io)?,
            path: PathBuf::new(),
        })
    }

    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    fn check(&self, offset: u64, len: u64) -> Result<usize, RegionError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(offset as usize),
            _ => Err(RegionError::OutOfBounds {
                offset,
                len,
                size: self.len(),
            }),
        }
    }

    /// Copies `bytes` into the region at `offset`.
    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), RegionError> {
        let at = self.check(offset, bytes.len() as u64)?;
        // SAFETY: in bounds of a live mapping; the source is our own memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.map.as_mut_ptr().add(at),
                bytes.len(),
            )
        };
        Ok(())
    }

    /// Copies `len` bytes at `offset` out of the region, with the XXH3-64 checksum of
    /// what was copied (which may differ from what the writer meant, if it raced us).
    pub fn read(&self, offset: u64, len: u64) -> Result<(Bytes, u64), RegionError> {
        let at = self.check(offset, len)?;
        let len = len as usize;
        let mut out = Vec::<u8>::with_capacity(len);
        let mut hasher = Xxh3Default::new();
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            // SAFETY: both ranges are in bounds (checked above; `out` has the capacity),
            // and they do not overlap (`out` is our own allocation).
            let chunk = unsafe {
                let dst = out.as_mut_ptr().add(done);
                std::ptr::copy_nonoverlapping(self.map.as_ptr().add(at + done), dst, n);
                std::slice::from_raw_parts(dst, n)
            };
            hasher.update(chunk);
            done += n;
        }
        // SAFETY: every byte up to `len` was written above.
        unsafe { out.set_len(len) };
        Ok((Bytes::from(out), hasher.digest()))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_one_side_writes_the_other_reads_with_its_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("region");
        let sidecar = Region::create(&path, 1 << 20).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "only the sidecar's user may map it");
        let engine = Region::open(&path).unwrap();
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        engine.write(4096, &payload).unwrap();
        let (back, sum) = sidecar.read(4096, payload.len() as u64).unwrap();
        assert_eq!(&back[..], &payload[..]);
        assert_eq!(sum, crate::checksum(&payload));
        assert!(matches!(
            sidecar.read(u64::MAX, 2),
            Err(RegionError::OutOfBounds { .. })
        ));
        assert!(engine.write((1 << 20) - 1, b"ab").is_err());
        drop(sidecar);
        assert!(!path.exists(), "the creator removes the file");
    }
}
