//! The graph's block API credential: one secret per graph, shared by every process that
//! speaks the block API (each sidecar, each engine) and by no one else. Each reads it
//! from the file [`CREDENTIAL_FILE_ENV`] names; the operator keeps it in a Secret of the
//! graph, mounted into its engine pods, and `dynamo run` in a file of its own run.

use std::fmt::Write;

/// `dynamo_kvblocks::CREDENTIAL_FILE_ENV` (a test checks they agree): the sidecar's
/// `--block-api-token-file` and the mock engine's `--kv-blocks-token-file` read it. Spelled
/// out here so the wiring does not link the block API's gRPC client.
pub const CREDENTIAL_FILE_ENV: &str = "DYNAMO_BLOCK_API_TOKEN_FILE";

/// A fresh token: 256 bits from the thread's CSPRNG (ChaCha, seeded by the OS), in hex.
pub fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_is_the_one_the_block_api_reads() {
        assert_eq!(CREDENTIAL_FILE_ENV, dynamo_kvblocks::CREDENTIAL_FILE_ENV);
    }

    #[test]
    fn tokens_are_256_bits_of_hex_and_differ() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
