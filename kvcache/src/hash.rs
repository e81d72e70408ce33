//! Token block hashing: the one definition of a block's identity.
//!
//! A prompt is cut into full blocks of `block_size` tokens (a trailing partial block has
//! no identity and is never cached or routed on). Each block gets
//! - a *local hash*: XXH3-64 of its token ids written as little-endian `u32`, and
//! - a *sequence hash*: the local hash of the first block, then for every later block
//!   XXH3-64 of `parent_seq_hash.to_le_bytes() ++ local_hash.to_le_bytes()`,
//!
//! so equal sequence hashes mean equal prefixes. The seed is 1337, salted by the model
//! and LoRA name so that two models never share blocks. The router, the sidecar and the
//! mock engine all call this module, which is what makes their hashes comparable.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of every hash when nothing salts it (`DESIGN.md`, "Block hashing").
pub const BASE_SEED: u64 = 1337;

/// Hash of one block's tokens alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LocalHash(pub u64);

/// Hash of a block and every block before it: the identity of a prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SeqHash(pub u64);

/// Hashes token sequences for one (model, LoRA, block size).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockHasher {
    block_size: usize,
    seed: u64,
}

impl BlockHasher {
    /// A hasher for `block_size`-token blocks of `model`, optionally under a LoRA adapter.
    ///
    /// # Panics
    /// When `block_size` is 0.
    pub fn new(block_size: usize, model: &str, lora: Option<&str>) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        Self {
            block_size,
            seed: salted_seed(model, lora),
        }
    }

    /// A hasher with the bare seed 1337, for engines and tests that do not salt.
    pub fn unsalted(block_size: usize) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        Self {
            block_size,
            seed: BASE_SEED,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Local hash of one block's tokens (any length; callers pass full blocks).
    pub fn local_hash(&self, tokens: &[u32]) -> LocalHash {
        let mut bytes = Vec::with_capacity(tokens.len() * 4);
        for t in tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        LocalHash(xxh3_64_with_seed(&bytes, self.seed))
    }

    /// Sequence hash of a block whose parent prefix is `parent` (`None` for the first block).
    pub fn chain(&self, parent: Option<SeqHash>, local: LocalHash) -> SeqHash {
        match parent {
            None => SeqHash(local.0),
            Some(SeqHash(p)) => {
                let mut bytes = [0u8; 16];
                bytes[..8].copy_from_slice(&p.to_le_bytes());
                bytes[8..].copy_from_slice(&local.0.to_le_bytes());
                SeqHash(xxh3_64_with_seed(&bytes, self.seed))
            }
        }
    }

    /// Local hashes of every full block of `tokens`.
    pub fn local_hashes(&self, tokens: &[u32]) -> Vec<LocalHash> {
        tokens
            .chunks_exact(self.block_size)
            .map(|block| self.local_hash(block))
            .collect()
    }

    /// Sequence hashes of every full block of `tokens`, continuing after `parent`.
    pub fn seq_hashes_from(&self, parent: Option<SeqHash>, tokens: &[u32]) -> Vec<SeqHash> {
        let mut parent = parent;
        tokens
            .chunks_exact(self.block_size)
            .map(|block| {
                let seq = self.chain(parent, self.local_hash(block));
                parent = Some(seq);
                seq
            })
            .collect()
    }

    /// Sequence hashes of every full block of a prompt.
    pub fn seq_hashes(&self, tokens: &[u32]) -> Vec<SeqHash> {
        self.seq_hashes_from(None, tokens)
    }
}

fn salted_seed(model: &str, lora: Option<&str>) -> u64 {
    // The NUL separator keeps ("ab", "c") and ("a", "bc") apart.
    let mut salt = Vec::with_capacity(model.len() + 1 + lora.map_or(0, str::len));
    salt.extend_from_slice(model.as_bytes());
    if let Some(lora) = lora {
        salt.push(0);
        salt.extend_from_slice(lora.as_bytes());
    }
    xxh3_64_with_seed(&salt, BASE_SEED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn local_hash_is_xxh3_of_little_endian_u32() {
        let h = BlockHasher::unsalted(2);
        let expected = xxh3_64_with_seed(&[1, 0, 0, 0, 0, 1, 0, 0], 1337);
        assert_eq!(h.local_hash(&[1, 256]), LocalHash(expected));
    }

    #[test]
    fn first_block_sequence_hash_is_its_local_hash_and_later_ones_chain() {
        let h = BlockHasher::unsalted(2);
        let seq = h.seq_hashes(&[1, 2, 3, 4, 5]);
        assert_eq!(seq.len(), 2, "the trailing partial block has no hash");
        assert_eq!(seq[0].0, h.local_hash(&[1, 2]).0);
        let mut pair = Vec::new();
        pair.extend_from_slice(&seq[0].0.to_le_bytes());
        pair.extend_from_slice(&h.local_hash(&[3, 4]).0.to_le_bytes());
        assert_eq!(seq[1], SeqHash(xxh3_64_with_seed(&pair, 1337)));
    }

    #[test]
    fn model_and_lora_salt_the_hashes() {
        let tokens = [7u32; 4];
        let base = BlockHasher::new(4, "qwen", None).seq_hashes(&tokens);
        assert_ne!(base, BlockHasher::new(4, "llama", None).seq_hashes(&tokens));
        assert_ne!(
            base,
            BlockHasher::new(4, "qwen", Some("a")).seq_hashes(&tokens)
        );
        assert_ne!(
            BlockHasher::new(4, "ab", Some("c")).seq_hashes(&tokens),
            BlockHasher::new(4, "a", Some("bc")).seq_hashes(&tokens)
        );
    }

    proptest! {
        #[test]
        fn equal_prefixes_give_equal_hashes_until_they_differ(
            prefix in proptest::collection::vec(any::<u32>(), 0..64),
            a in proptest::collection::vec(any::<u32>(), 1..32),
            b in proptest::collection::vec(any::<u32>(), 1..32),
        ) {
            prop_assume!(a[0] != b[0]);
            let h = BlockHasher::unsalted(4);
            let ta: Vec<u32> = prefix.iter().chain(&a).copied().collect();
            let tb: Vec<u32> = prefix.iter().chain(&b).copied().collect();
            let (ha, hb) = (h.seq_hashes(&ta), h.seq_hashes(&tb));
            let shared = prefix.len() / 4;
            prop_assert_eq!(&ha[..shared], &hb[..shared]);
            // The first block that contains a differing token differs, and so does every
            // block after it, because the chain carries the difference forward.
            for i in shared..ha.len().min(hb.len()) {
                prop_assert_ne!(ha[i], hb[i]);
            }
        }

        #[test]
        fn hashing_in_pieces_equals_hashing_at_once(
            tokens in proptest::collection::vec(any::<u32>(), 0..200),
            cut_blocks in 0usize..50,
        ) {
            let h = BlockHasher::unsalted(4);
            let whole = h.seq_hashes(&tokens);
            let cut = (cut_blocks * 4).min(tokens.len() / 4 * 4);
            let mut pieces = h.seq_hashes(&tokens[..cut]);
            let rest = h.seq_hashes_from(pieces.last().copied(), &tokens[cut..]);
            pieces.extend(rest);
            prop_assert_eq!(whole, pieces);
        }
    }
}
