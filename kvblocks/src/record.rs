//! A block at rest: the bytes of one block as the disk and object tiers store it (one
//! file or object per block), and its name there.
//!
//! Layout, little-endian: magic `DKVB`, version (1 byte), flags (bit 0: has a parent,
//! bit 1: has a MAC), 2 reserved bytes, hash (8), parent (8), tokens (4), block_size (4),
//! layers (4), dtype length (2) and dtype (UTF-8, at most [`MAX_DTYPE_BYTES`]), payload
//! length (8), checksum (8), the MAC (32, only with bit 1), then the payload. A record is
//! read back only when the whole of it is there; the checksum and MAC are carried and
//! checked by the reader (`Block::verify`, `BlockKey::admits`), so a torn, rotten or
//! forged record is never served. Version 1 records (no MAC) read as
//! [`RecordError::Version`]: the tiers are a cache, and recomputing is always correct.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use dynamo_kvcache::SeqHash;

use crate::{Block, Layout, MAC_BYTES, Mac};

const MAGIC: &[u8; 4] = b"DKVB";
const VERSION: u8 = 2;
const HAS_PARENT: u8 = 1;
const HAS_MAC: u8 = 2;
/// Longest dtype name a record may carry ("float8_e4m3fnuz" is 15).
pub const MAX_DTYPE_BYTES: usize = 64;
/// Bytes before the dtype name.
const FIXED_HEAD: usize = 4 + 1 + 1 + 2 + 8 + 8 + 4 + 4 + 4 + 2;
/// File and object names end with this.
pub const EXTENSION: &str = "kvb";

/// Why bytes are not a block record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("truncated: {0} bytes")]
    Truncated(usize),
    #[error("not a block record (bad magic)")]
    Magic,
    #[error("record version {0}, expected {VERSION}")]
    Version(u8),
    #[error("dtype name of {0} bytes (at most {MAX_DTYPE_BYTES})")]
    Dtype(usize),
    #[error("payload of {declared} bytes declared, {present} present")]
    PayloadLength { declared: u64, present: usize },
}

/// The record of `block`: one allocation, the payload copied once.
pub fn encode(block: &Block) -> Bytes {
    let dtype = block.layout.dtype.as_bytes();
    let dtype = &dtype[..dtype.len().min(MAX_DTYPE_BYTES)];
    let mac_len = block.mac.map_or(0, |_| MAC_BYTES);
    let mut out = BytesMut::with_capacity(header_len(dtype.len()) + mac_len + block.payload.len());
    out.put_slice(MAGIC);
    out.put_u8(VERSION);
    let parent_flag = if block.parent.is_some() {
        HAS_PARENT
    } else {
        0
    };
    let mac_flag = if block.mac.is_some() { HAS_MAC } else { 0 };
    out.put_u8(parent_flag | mac_flag);
    out.put_u16_le(0);
    out.put_u64_le(block.hash.0);
    out.put_u64_le(block.parent.map_or(0, |p| p.0));
    out.put_u32_le(block.tokens);
    out.put_u32_le(block.layout.block_size);
    out.put_u32_le(block.layout.layers);
    out.put_u16_le(dtype.len() as u16);
    out.put_slice(dtype);
    out.put_u64_le(block.payload.len() as u64);
    out.put_u64_le(block.checksum);
    if let Some(mac) = &block.mac {
        out.put_slice(mac);
    }
    out.put_slice(&block.payload);
    out.freeze()
}

/// Bytes of `block`'s record: what it takes on disk or in the object store.
pub fn encoded_len(block: &Block) -> u64 {
    let mac_len = block.mac.map_or(0, |_| MAC_BYTES);
    (header_len(block.layout.dtype.len().min(MAX_DTYPE_BYTES)) + mac_len + block.payload.len())
        as u64
}

fn header_len(dtype_len: usize) -> usize {
    FIXED_HEAD + dtype_len + 8 + 8
}

/// The block in `record`; its payload shares `record`'s memory. Nothing is allocated for
/// what a header declares: lengths are checked against the bytes present.
pub fn decode(record: Bytes) -> Result<Block, RecordError> {
    let total = record.len();
    if total < FIXED_HEAD {
        return Err(RecordError::Truncated(total));
    }
    let mut head = &record[..];
    if &head[..4] != MAGIC {
        return Err(RecordError::Magic);
    }
    head.advance(4);
    let version = head.get_u8();
    if version != VERSION {
        return Err(RecordError::Version(version));
    }
    let flags = head.get_u8();
    head.advance(2);
    let hash = SeqHash(head.get_u64_le());
    let parent = head.get_u64_le();
    let parent = (flags & HAS_PARENT != 0).then_some(SeqHash(parent));
    let tokens = head.get_u32_le();
    let block_size = head.get_u32_le();
    let layers = head.get_u32_le();
    let dtype_len = head.get_u16_le() as usize;
    if dtype_len > MAX_DTYPE_BYTES {
        return Err(RecordError::Dtype(dtype_len));
    }
    let mac_len = if flags & HAS_MAC != 0 { MAC_BYTES } else { 0 };
    let start = header_len(dtype_len) + mac_len;
    if total < start {
        return Err(RecordError::Truncated(total));
    }
    let dtype = String::from_utf8_lossy(&head[..dtype_len]).into_owned();
    head.advance(dtype_len);
    let declared = head.get_u64_le();
    let checksum = head.get_u64_le();
    let mac = (mac_len > 0).then(|| {
        let mut mac: Mac = [0; MAC_BYTES];
        head.copy_to_slice(&mut mac);
        mac
    });
    let present = total - start;
    if declared != present as u64 {
        return Err(RecordError::PayloadLength { declared, present });
    }
    Ok(Block {
        hash,
        parent,
        tokens,
        layout: Layout {
            block_bytes: declared,
            block_size,
            layers,
            dtype,
        },
        payload: record.slice(start..),
        checksum,
        mac,
    })
}

/// The name of a block's record: its hash and its parent's, so that a tier is re-indexed
/// (chains and all) from a directory listing without reading a byte of any record.
pub fn name(hash: SeqHash, parent: Option<SeqHash>) -> String {
    match parent {
        Some(p) => format!("{:016x}-{:016x}.{EXTENSION}", hash.0, p.0),
        None => format!("{:016x}.{EXTENSION}", hash.0),
    }
}

/// The hash and parent a record name stands for; `None` for any other name.
pub fn parse_name(name: &str) -> Option<(SeqHash, Option<SeqHash>)> {
    let stem = name.strip_suffix(EXTENSION)?.strip_suffix('.')?;
    // Exactly what `name` writes: 16 lower-case hex digits (no sign, no upper case), so
    // that a name and its parse map one to one.
    let hex = |s: &str| {
        (s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| u64::from_str_radix(s, 16).ok())
            .flatten()
            .map(SeqHash)
    };
    match stem.split_once('-') {
        Some((hash, parent)) => Some((hex(hash)?, Some(hex(parent)?))),
        None => Some((hex(stem)?, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(parent: Option<SeqHash>) -> Block {
        let layout = Layout {
            block_bytes: 5,
            block_size: 16,
            layers: 28,
            dtype: "bfloat16".into(),
        };
        Block::new(
            SeqHash(0xabc),
            parent,
            16,
            layout,
            Bytes::from_static(b"hello"),
        )
    }

    #[test]
    fn a_record_reads_back_as_its_block() {
        let parents = [None, Some(SeqHash(u64::MAX))];
        for (parent, mac) in parents.into_iter().zip([None, Some([7; MAC_BYTES])]) {
            let b = Block {
                mac,
                ..block(parent)
            };
            let record = encode(&b);
            assert_eq!(record.len() as u64, encoded_len(&b));
            let back = decode(record).unwrap();
            assert_eq!(back, b);
            assert!(back.verify());
        }
    }

    #[test]
    fn every_truncation_and_a_flipped_payload_byte_are_caught() {
        let record = encode(&block(Some(SeqHash(1))));
        for len in 0..record.len() {
            assert!(decode(record.slice(..len)).is_err(), "{len} bytes accepted");
        }
        let mut flipped = record.to_vec();
        *flipped.last_mut().unwrap() ^= 1;
        let b = decode(Bytes::from(flipped)).unwrap();
        assert!(!b.verify(), "the checksum catches what the framing cannot");
    }

    #[test]
    fn a_version_1_record_is_refused() {
        let mut record = encode(&block(None)).to_vec();
        record[4] = 1;
        assert_eq!(decode(Bytes::from(record)), Err(RecordError::Version(1)));
    }

    #[test]
    fn a_huge_declared_payload_allocates_nothing() {
        let mut record = encode(&block(None)).to_vec();
        let at = header_len(8) - 16;
        record[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            decode(Bytes::from(record)),
            Err(RecordError::PayloadLength { .. })
        ));
    }

    #[test]
    fn names_carry_the_chain() {
        for parent in [None, Some(SeqHash(0x1234))] {
            let n = name(SeqHash(0xfeed), parent);
            assert_eq!(parse_name(&n), Some((SeqHash(0xfeed), parent)));
        }
        for other in [
            "x.kvb",
            "0000000000000001.tmp",
            "0000000000000001-zz.kvb",
            ".kvb",
            "00000000000000FF.kvb",
            "+00000000000000f.kvb",
        ] {
            assert_eq!(parse_name(other), None, "{other}");
        }
    }
}
