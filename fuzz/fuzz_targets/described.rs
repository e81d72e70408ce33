//! Raw bytes as a peer's `Describe` answer, decoded as the block client decodes it
//! (prost), then checked as the decode sidecar checks it before anything reaches NIXL
//! (`dynamo_kvblocks::described`). The first byte picks the chain asked for: the
//! answer's own hashes (so the deeper checks run) or a fixed one. Neither may panic, and
//! a plan that passes is bounded: a prefix of the chain, each slice its layout's length
//! and within memory, the metadata and the total within their limits.
#![no_main]

use bytes::Bytes;
use dynamo_kvblocks::described::{MAX_AGENT_METADATA, MAX_AGENT_NAME, described};
use dynamo_kvblocks::pb;
use dynamo_kvcache::SeqHash;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// The read budget: small, so that inputs reach it.
const MAX_BYTES: u64 = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let Ok(reply) = pb::DescribeReply::decode(Bytes::copy_from_slice(rest)) else {
        return;
    };
    let hashes: Vec<SeqHash> = match kind % 2 {
        0 => reply
            .blocks
            .iter()
            .map(|b| SeqHash(b.block.as_ref().map_or(0, |b| b.hash)))
            .collect(),
        _ => (1..=4).map(SeqHash).collect(),
    };
    let Ok(plan) = described(reply, &hashes, MAX_BYTES) else {
        return;
    };
    assert!(!plan.agent.is_empty() && plan.agent.len() <= MAX_AGENT_NAME);
    assert!(!plan.metadata.is_empty() && plan.metadata.len() <= MAX_AGENT_METADATA);
    assert!(plan.blocks.len() <= hashes.len());
    assert!(plan.bytes() <= MAX_BYTES);
    for ((block, slice), hash) in plan.blocks.iter().zip(&hashes) {
        assert_eq!(block.hash, hash.0);
        assert!(block.payload.is_empty() && block.region.is_none());
        assert_eq!(Some(slice.len), block.layout.as_ref().map(|l| l.block_bytes));
        assert!(slice.addr.checked_add(slice.len).is_some());
    }
});
