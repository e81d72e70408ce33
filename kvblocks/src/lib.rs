//! The KV block API (`DESIGN.md`, "KV blocks in the sidecar"): the block format and its
//! checksum, the gRPC protocol an engine speaks to its sidecar (offload, lookup,
//! onboard) and a peer sidecar to another (fetch), and a client for it. The sidecar
//! serves it ([`pb::kv_blocks_server`]); the mock engine uses [`BlockClient`].

pub mod client;
pub mod credential;
pub mod described;
pub mod layout_rules;
pub mod mac;
pub mod placement;
pub mod record;
pub mod region;

use bytes::Bytes;
use dynamo_kvcache::{SeqHash, Tier};

pub use client::{BlockClient, ClientError};
pub use credential::{CREDENTIAL_FILE_ENV, Credential, CredentialError};
pub use layout_rules::{LayoutError, LayoutRules};
pub use mac::{BlockKey, MAC_BYTES, Mac, authentic};

/// Generated from `proto/dynamo/kvblocks/v1/kv_blocks.proto`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("dynamo.kvblocks.v1");
}

/// The proto's descriptors (a `FileDescriptorSet` without source info), from which the
/// Python client builds its messages (`connectors/python/dynamo_kv/kv_blocks.binpb`).
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kv_blocks.binpb"));

/// Largest gRPC message of the block API, either way: one block of a large model is several
/// MB (Llama 3 70B: 16 tokens x 80 layers x 8 KV heads x 128 x K and V x 2 bytes = 5.2 MB),
/// above tonic's 4 MiB default.
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// HTTP/2 flow-control window of block API connections, each side. The protocol's
/// default of 64 KiB (RFC 9113, 6.9.2) lets a few MB-sized blocks through per round trip
/// at best; a window of several blocks keeps the stream moving.
pub const HTTP2_WINDOW_BYTES: u32 = 32 << 20;

/// Largest HTTP/2 frame either side of a block API connection accepts. The default,
/// 16 KiB (RFC 9113, 6.5.2), cuts a 2 MiB block into 128 frames, each with its own
/// header and wake-up; 1 MiB frames carry a block in two.
pub const HTTP2_FRAME_BYTES: u32 = 1 << 20;

/// A byte size as tier flags take it: a plain number of bytes, or one with a unit: `K`, `M`, `G`, `T`
/// (powers of 1000) or `Ki`, `Mi`, `Gi`, `Ti` (powers of 1024), each with an optional `B`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let unit = unit.trim();
    let unit = unit.strip_suffix(['B', 'b']).unwrap_or(unit);
    let scale: u64 = match unit {
        "" => 1,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit (use K, M, G, T, Ki, Mi, Gi or Ti)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a byte size"))?;
    let bytes = value * scale as f64;
    if !(0.0..=u64::MAX as f64).contains(&bytes) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(bytes as u64)
}

/// The checksum of a payload: XXH3-64, seed 0 (the proto's `Block.checksum`).
pub fn checksum(payload: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(payload)
}

/// How a block's payload is laid out (the proto's `Layout`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub block_bytes: u64,
    pub block_size: u32,
    pub layers: u32,
    pub dtype: String,
}

/// One block with its payload in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub hash: SeqHash,
    pub parent: Option<SeqHash>,
    pub tokens: u32,
    pub layout: Layout,
    pub payload: Bytes,
    /// [`checksum`] of `payload` as its writer computed it.
    pub checksum: u64,
    /// Its writer's [`BlockKey::mac`]; `None` in a graph without a credential.
    pub mac: Option<Mac>,
}

impl Block {
    /// A block whose checksum is computed from `payload`.
    pub fn new(
        hash: SeqHash,
        parent: Option<SeqHash>,
        tokens: u32,
        layout: Layout,
        payload: Bytes,
    ) -> Self {
        Self {
            checksum: checksum(&payload),
            hash,
            parent,
            tokens,
            layout,
            payload,
            mac: None,
        }
    }

    /// Whether the payload is what its writer wrote, and as long as its layout says.
    pub fn verify(&self) -> bool {
        self.payload.len() as u64 == self.layout.block_bytes
            && checksum(&self.payload) == self.checksum
    }
}

impl From<&Layout> for pb::Layout {
    fn from(l: &Layout) -> Self {
        Self {
            block_bytes: l.block_bytes,
            block_size: l.block_size,
            layers: l.layers,
            dtype: l.dtype.clone(),
        }
    }
}

impl From<pb::Layout> for Layout {
    fn from(l: pb::Layout) -> Self {
        Self {
            block_bytes: l.block_bytes,
            block_size: l.block_size,
            layers: l.layers,
            dtype: l.dtype,
        }
    }
}

impl From<&Block> for pb::Block {
    /// The block with its payload inline.
    fn from(b: &Block) -> Self {
        Self {
            hash: b.hash.0,
            parent: b.parent.map(|p| p.0),
            tokens: b.tokens,
            checksum: b.checksum,
            layout: Some((&b.layout).into()),
            payload: b.payload.clone(),
            region: None,
            mac: b.mac.map_or_else(Vec::new, |m| m.to_vec()),
        }
    }
}

/// The block of `message`, whose payload is in `region` at the slice it names: copied
/// out and checksummed on the way. `None` when the copy does not match the checksum or
/// the layout (a block never to be used).
pub fn from_region(
    message: pb::Block,
    region: &region::Region,
) -> Result<Option<Block>, BlockError> {
    let slice = message
        .region
        .ok_or(BlockError::NotInRegion(message.hash))?;
    let layout: Layout = message
        .layout
        .ok_or(BlockError::NoLayout(message.hash))?
        .into();
    let (payload, sum) = region
        .read(slice.offset, slice.len)
        .map_err(|e| BlockError::Region(message.hash, e.to_string()))?;
    if sum != message.checksum || slice.len != layout.block_bytes {
        return Ok(None);
    }
    let mac = mac_of(message.hash, &message.mac)?;
    Ok(Some(Block {
        hash: SeqHash(message.hash),
        parent: message.parent.map(SeqHash),
        tokens: message.tokens,
        layout,
        payload,
        checksum: sum,
        mac,
    }))
}

/// The MAC a message carries: none (empty) or [`MAC_BYTES`] bytes.
fn mac_of(hash: u64, bytes: &[u8]) -> Result<Option<Mac>, BlockError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    bytes
        .try_into()
        .map(Some)
        .map_err(|_| BlockError::MacLength(hash, bytes.len()))
}

impl pb::Block {
    /// The message of `block` whose payload sits at `slice` of a shared region.
    pub fn in_region(block: &Block, slice: pb::RegionSlice) -> Self {
        Self {
            payload: Bytes::new(),
            region: Some(slice),
            ..Self::from(block)
        }
    }
}

/// Why a message is not a block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("block {0:#x} has no layout")]
    NoLayout(u64),
    #[error("block {0:#x} names a shared region slice; read it with its region first")]
    InRegion(u64),
    #[error("block {0:#x} names no shared region slice")]
    NotInRegion(u64),
    #[error("block {0:#x}: {1}")]
    Region(u64, String),
    #[error("block {0:#x} carries a MAC of {1} bytes, not {MAC_BYTES}")]
    MacLength(u64, usize),
}

impl TryFrom<pb::Block> for Block {
    type Error = BlockError;

    /// The block of a message whose payload is inline (a region slice must be read out
    /// of its region first). The checksum is carried, not checked: see [`Block::verify`].
    fn try_from(b: pb::Block) -> Result<Self, BlockError> {
        if b.region.is_some() {
            return Err(BlockError::InRegion(b.hash));
        }
        let layout = b.layout.ok_or(BlockError::NoLayout(b.hash))?.into();
        let mac = mac_of(b.hash, &b.mac)?;
        Ok(Self {
            hash: SeqHash(b.hash),
            parent: b.parent.map(SeqHash),
            tokens: b.tokens,
            layout,
            payload: b.payload,
            checksum: b.checksum,
            mac,
        })
    }
}

/// The tier of the wire enum (`None` for GPU, which a sidecar never holds).
pub fn tier_of(tier: pb::Tier) -> Option<Tier> {
    match tier {
        pb::Tier::Gpu => None,
        pb::Tier::Host => Some(Tier::Host),
        pb::Tier::Disk => Some(Tier::Disk),
        pb::Tier::Object => Some(Tier::Object),
    }
}

/// The wire enum of a tier.
pub fn wire_tier(tier: Tier) -> pb::Tier {
    match tier {
        Tier::Gpu => pb::Tier::Gpu,
        Tier::Host => pb::Tier::Host,
        Tier::Disk => pb::Tier::Disk,
        Tier::Object => pb::Tier::Object,
    }
}

/// A small valid block (hash 7, parent 6, 4 bytes) for this crate's tests.
#[cfg(test)]
pub(crate) fn test_block() -> Block {
    let layout = Layout {
        block_bytes: 4,
        block_size: 16,
        layers: 2,
        dtype: "bfloat16".into(),
    };
    Block::new(
        SeqHash(7),
        Some(SeqHash(6)),
        16,
        layout,
        Bytes::from_static(b"abcd"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_survives_the_wire_and_a_flipped_byte_is_caught() {
        let mut block = test_block();
        assert!(block.verify());
        let back = Block::try_from(pb::Block::from(&block)).unwrap();
        assert_eq!(back, block);
        block.mac = Some([9; MAC_BYTES]);
        let back = Block::try_from(pb::Block::from(&block)).unwrap();
        assert_eq!(back, block, "the MAC crosses the wire");
        let mut short_mac = pb::Block::from(&block);
        short_mac.mac = b"short".to_vec();
        assert_eq!(Block::try_from(short_mac), Err(BlockError::MacLength(7, 5)));
        let flipped = Block {
            payload: Bytes::from_static(b"abce"),
            ..block.clone()
        };
        assert!(!flipped.verify());
        let short = Block {
            payload: Bytes::from_static(b"abc"),
            checksum: checksum(b"abc"),
            ..block
        };
        assert!(
            !short.verify(),
            "a payload of the wrong length is refused too"
        );
    }

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5G"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("2 GiB"), Ok(2 << 30));
        assert!(parse_bytes("12 apples").is_err());
        assert!(parse_bytes("-1").is_err());
    }

    #[test]
    fn tiers_map_both_ways() {
        for tier in [Tier::Host, Tier::Disk, Tier::Object] {
            assert_eq!(tier_of(wire_tier(tier)), Some(tier));
        }
        assert_eq!(tier_of(pb::Tier::Gpu), None);
    }
}
