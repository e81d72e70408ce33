//! Deterministic token streams: SplitMix64 (Steele, Lea & Flood, "Fast splittable
//! pseudorandom number generators", OOPSLA 2014), keyed by a seed and a position so a
//! token can be recomputed after preemption without keeping generator state.

/// One SplitMix64 output for state `x`.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of one token stream, from the engine seed and the request's own seed.
pub fn stream_key(engine_seed: u64, request_seed: u64) -> u64 {
    splitmix64(engine_seed ^ splitmix64(request_seed))
}

/// Token `index` of stream `key`, in `0..vocab_size`.
pub fn token_at(key: u64, index: u64, vocab_size: u32) -> u32 {
    // Multiply-shift maps 32 random bits onto the range without a modulo.
    let bits = splitmix64(key.wrapping_add(index.wrapping_mul(0xD1B5_4A32_D192_ED03))) >> 32;
    ((bits * vocab_size as u64) >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_in_range_and_depend_on_key_and_index() {
        let k = stream_key(1, 2);
        let a: Vec<u32> = (0..100).map(|i| token_at(k, i, 50)).collect();
        assert!(a.iter().all(|&t| t < 50));
        assert_eq!(a, (0..100).map(|i| token_at(k, i, 50)).collect::<Vec<_>>());
        assert_ne!(
            a,
            (0..100)
                .map(|i| token_at(stream_key(1, 3), i, 50))
                .collect::<Vec<_>>()
        );
    }
}
