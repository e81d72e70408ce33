//! Hash maps keyed by values that are already hashes.
//!
//! `SeqHash` is an XXH3 output, so SipHash would only add latency to every lookup of the
//! hot path. A bare identity hash, though, would let anyone who can choose prompts pick
//! tokens whose hashes share low bits and degrade the table; mixing with a key drawn per
//! map (from std's `RandomState`) keeps that out of reach at the cost of one multiply.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher, RandomState};

/// A `BuildHasher` for keys that are (or wrap) one `u64` hash.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyedMix {
    key: u64,
}

impl Default for KeyedMix {
    fn default() -> Self {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0x9E37_79B9_7F4A_7C15);
        Self { key: h.finish() }
    }
}

impl BuildHasher for KeyedMix {
    type Hasher = MixHasher;

    fn build_hasher(&self) -> MixHasher {
        MixHasher { state: self.key }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct MixHasher {
    state: u64,
}

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        // Folded 128-bit multiply: every input bit reaches the high and low output bits.
        let m = u128::from(self.state) * 0x9E37_79B9_7F4A_7C15_u128;
        (m as u64) ^ ((m >> 64) as u64)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys that are not one integer; fold them 8 bytes at a time.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.state = (self.state ^ n)
            .rotate_left(29)
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

pub(crate) type FastMap<K, V> = HashMap<K, V, KeyedMix>;
pub(crate) type FastSet<K> = HashSet<K, KeyedMix>;
