//! Raw bytes as a request message of the KV block API, decoded as the sidecar's gRPC
//! service decodes it (prost, from the `Bytes` tonic hands over), then turned into the
//! block the sidecar would store or lend. The first byte picks the message: an Offload
//! stream's `Block`, `LookupRequest`, `OnboardRequest`, a Lend stream's `LendRequest` or
//! `OpenRegionRequest`. Decoding must never panic and may hold only what the input
//! itself spells out (a payload is a slice of the input, not a copy, and no declared
//! length makes it reserve more); a block that converts and verifies has the payload its
//! layout declares and the checksum of that payload, and survives re-encoding.
#![no_main]

#[path = "counting_alloc.rs"]
mod counting_alloc;

use bytes::Bytes;
use dynamo_kvblocks::{Block, checksum, pb};
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// What decoding may hold per input byte: a packed varint of one byte becomes a `u64`
/// in a vector that may have doubled past its length, and held its old buffer while it
/// moved (1 + 2 of them), plus slack for small allocations. Linear in the input: no
/// length a message declares makes it hold more.
const ALLOC_PER_BYTE: usize = 3 * std::mem::size_of::<u64>();
const ALLOC_SLACK: usize = 1024;

/// Decodes `input` as `M`, checking what decoding held.
fn decode<M: Message + Default>(input: &Bytes) -> Option<M> {
    let baseline = counting_alloc::reset_peak();
    let decoded = M::decode(input.clone());
    let held = counting_alloc::peak() - baseline;
    assert!(
        held <= ALLOC_PER_BYTE * input.len() + ALLOC_SLACK,
        "decoding {} bytes as {} held {held}",
        input.len(),
        std::any::type_name::<M>()
    );
    decoded.ok()
}

/// What the sidecar does with a block message whose payload is inline.
fn check_block(message: pb::Block) {
    let Ok(block) = Block::try_from(message) else {
        return;
    };
    if !block.verify() {
        return;
    }
    assert_eq!(block.payload.len() as u64, block.layout.block_bytes);
    assert_eq!(checksum(&block.payload), block.checksum);
    let again = pb::Block::from(&block).encode_to_vec();
    let back = pb::Block::decode(Bytes::from(again)).expect("re-encoded block decodes");
    assert_eq!(Block::try_from(back).ok(), Some(block));
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let input = Bytes::copy_from_slice(rest);
    match kind % 5 {
        0 => {
            if let Some(block) = decode::<pb::Block>(&input) {
                check_block(block);
            }
        }
        1 => {
            decode::<pb::LookupRequest>(&input);
        }
        2 => {
            decode::<pb::OnboardRequest>(&input);
        }
        3 => {
            if let Some(block) = decode::<pb::LendRequest>(&input).and_then(|l| l.block) {
                check_block(block);
            }
        }
        _ => {
            decode::<pb::OpenRegionRequest>(&input);
        }
    }
});
