//! What a block's layout may be: a receiver checks it before it stores or serves a block,
//! so that a peer cannot fill the tiers with blocks no engine of this graph could use
//! (a block size of 2^32-1, a dtype name of 100 KB, a block that is its own parent, an
//! empty payload).

/// Most layers a block may span (the largest models have a few hundred).
pub const MAX_LAYERS: u32 = 1024;

/// KV dtype names as Hugging Face configs and vLLM's `--kv-cache-dtype` spell them.
pub const KNOWN_DTYPES: &[&str] = &[
    "bfloat16",
    "float16",
    "float32",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
];

/// Why a block's layout is refused; [`Self::label`] is its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("block size differs from this graph's")]
    BlockSize,
    #[error("unknown dtype")]
    Dtype,
    #[error("payload empty or not the layout's block_bytes")]
    Payload,
    #[error("block is its own parent")]
    OwnParent,
    #[error("layers zero or past {MAX_LAYERS}")]
    Layers,
}

impl LayoutError {
    pub fn label(self) -> &'static str {
        match self {
            LayoutError::BlockSize => "block_size",
            LayoutError::Dtype => "dtype",
            LayoutError::Payload => "payload",
            LayoutError::OwnParent => "own_parent",
            LayoutError::Layers => "layers",
        }
    }
}

/// What this receiver knows of the graph's blocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct LayoutRules {
    /// Tokens per block, when known (the sidecar's `--block-size`); otherwise any
    /// positive size up to [`MAX_BLOCK_SIZE`].
    pub block_size: Option<u32>,
}

/// Largest block size accepted when the graph's is not known.
pub const MAX_BLOCK_SIZE: u32 = 1 << 16;

impl LayoutRules {
    pub fn check(&self, block: &crate::Block) -> Result<(), LayoutError> {
        let layout = &block.layout;
        let size_ok = match self.block_size {
            Some(size) => layout.block_size == size,
            None => (1..=MAX_BLOCK_SIZE).contains(&layout.block_size),
        };
        if !size_ok {
            return Err(LayoutError::BlockSize);
        }
        if !KNOWN_DTYPES.contains(&layout.dtype.as_str()) {
            return Err(LayoutError::Dtype);
        }
        if layout.block_bytes == 0 || block.payload.len() as u64 != layout.block_bytes {
            return Err(LayoutError::Payload);
        }
        if block.parent == Some(block.hash) {
            return Err(LayoutError::OwnParent);
        }
        if !(1..=MAX_LAYERS).contains(&layout.layers) {
            return Err(LayoutError::Layers);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::{Block, Layout, test_block};

    #[test]
    fn each_bad_layout_is_refused_with_its_reason() {
        let rules = LayoutRules {
            block_size: Some(16),
        };
        assert_eq!(rules.check(&test_block()), Ok(()));
        let bad = |edit: fn(&mut Block)| {
            let mut b = test_block();
            edit(&mut b);
            rules.check(&b).unwrap_err()
        };
        assert_eq!(
            bad(|b| b.layout.block_size = u32::MAX),
            LayoutError::BlockSize
        );
        assert_eq!(
            bad(|b| b.layout.dtype = "x".repeat(100_000)),
            LayoutError::Dtype
        );
        assert_eq!(bad(|b| b.parent = Some(b.hash)), LayoutError::OwnParent);
        assert_eq!(
            bad(|b| {
                b.payload = Bytes::new();
                b.layout.block_bytes = 0;
            }),
            LayoutError::Payload
        );
        assert_eq!(bad(|b| b.layout.layers = 0), LayoutError::Layers);
        assert_eq!(
            bad(|b| b.layout.layers = MAX_LAYERS + 1),
            LayoutError::Layers
        );
        let unknown_size = LayoutRules::default();
        assert_eq!(unknown_size.check(&test_block()), Ok(()));
        assert_eq!(
            unknown_size.check(&Block {
                layout: Layout {
                    block_size: u32::MAX,
                    ..test_block().layout
                },
                ..test_block()
            }),
            Err(LayoutError::BlockSize)
        );
    }
}
