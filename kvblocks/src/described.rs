//! A peer's `Describe` answer, checked before anything of it reaches NIXL: where the
//! payloads of a lease's blocks can be read, and the agent to read them from. Every
//! field is the peer's word, so sizes are bounded here and the blocks must be the
//! prefix of the chain asked for; the payloads read are then checked as `Onboard`'s
//! blocks are ([`crate::BlockClient::accept`]).

use dynamo_kvcache::SeqHash;

use crate::pb::{self, DescribeReply};
use crate::{BlockError, MAX_MESSAGE_BYTES};

/// Largest agent metadata loaded: a UCX agent's is a few KiB.
pub const MAX_AGENT_METADATA: usize = 1 << 20;
/// Longest agent name taken.
pub const MAX_AGENT_NAME: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescribeError {
    #[error("the peer names no NIXL agent, or one of {0} bytes")]
    AgentName(usize),
    #[error("the peer's agent metadata is {0} bytes (at most {MAX_AGENT_METADATA}, not empty)")]
    Metadata(usize),
    #[error("the peer describes {0} blocks for {1} asked")]
    TooMany(usize, usize),
    #[error("described block {0} is {1:#x}, not the chain's {2:#x}")]
    OutOfChain(usize, u64, u64),
    #[error("described block {0:#x} carries its payload or a region")]
    Inline(u64),
    #[error("described block {0:#x} is {1} bytes where its layout says {2}")]
    Length(u64, u64, u64),
    #[error("described block {0:#x} is {1} bytes, over {MAX_MESSAGE_BYTES}")]
    TooLarge(u64, u64),
    #[error("described block {0:#x} wraps past the end of memory")]
    Wraps(u64),
    #[error("the described blocks total {0} bytes, over the {1} this read may take")]
    OverBudget(u64, u64),
    #[error("a described entry without a block")]
    NoBlock,
    #[error(transparent)]
    Block(#[from] BlockError),
}

/// What to read: the peer's agent, and each block (its payload empty) with where its
/// payload lies in the peer's registered memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Described {
    pub agent: String,
    pub metadata: Vec<u8>,
    pub blocks: Vec<(pb::Block, Slice)>,
}

/// `len` bytes at `addr` of the peer's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub addr: u64,
    pub len: u64,
}

impl Described {
    /// Payload bytes of every block.
    pub fn bytes(&self) -> u64 {
        self.blocks.iter().map(|(_, s)| s.len).sum()
    }
}

/// `reply` to a request for the chain `hashes`, if it is a plan this side can follow:
/// bounded metadata, the blocks a prefix of `hashes`, each as long as its layout says,
/// all within `max_bytes`.
pub fn described(
    reply: DescribeReply,
    hashes: &[SeqHash],
    max_bytes: u64,
) -> Result<Described, DescribeError> {
    if reply.agent.is_empty() || reply.agent.len() > MAX_AGENT_NAME {
        return Err(DescribeError::AgentName(reply.agent.len()));
    }
    let md = reply.agent_metadata.len();
    if md == 0 || md > MAX_AGENT_METADATA {
        return Err(DescribeError::Metadata(md));
    }
    if reply.blocks.len() > hashes.len() {
        return Err(DescribeError::TooMany(reply.blocks.len(), hashes.len()));
    }
    let mut total = 0u64;
    let mut blocks = Vec::with_capacity(reply.blocks.len());
    for (i, (entry, want)) in reply.blocks.into_iter().zip(hashes).enumerate() {
        let block = entry.block.ok_or(DescribeError::NoBlock)?;
        let hash = block.hash;
        if hash != want.0 {
            return Err(DescribeError::OutOfChain(i, hash, want.0));
        }
        if !block.payload.is_empty() || block.region.is_some() {
            return Err(DescribeError::Inline(hash));
        }
        let layout = block.layout.as_ref().ok_or(BlockError::NoLayout(hash))?;
        if entry.len != layout.block_bytes {
            return Err(DescribeError::Length(hash, entry.len, layout.block_bytes));
        }
        if entry.len > MAX_MESSAGE_BYTES as u64 {
            return Err(DescribeError::TooLarge(hash, entry.len));
        }
        if entry.addr.checked_add(entry.len).is_none() {
            return Err(DescribeError::Wraps(hash));
        }
        total += entry.len;
        if total > max_bytes {
            return Err(DescribeError::OverBudget(total, max_bytes));
        }
        let slice = Slice {
            addr: entry.addr,
            len: entry.len,
        };
        blocks.push((block, slice));
    }
    Ok(Described {
        agent: reply.agent,
        metadata: reply.agent_metadata,
        blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_block;

    fn reply(blocks: Vec<pb::DescribedBlock>) -> DescribeReply {
        DescribeReply {
            agent: "prefill".into(),
            agent_metadata: vec![1; 64],
            blocks,
        }
    }

    fn entry(addr: u64, len: u64) -> pb::DescribedBlock {
        let mut block = pb::Block::from(&test_block());
        block.payload = Default::default();
        pb::DescribedBlock {
            block: Some(block),
            addr,
            len,
        }
    }

    #[test]
    fn a_plan_is_the_chain_asked_for_within_bounds() {
        let chain = [SeqHash(7)];
        let plan = described(reply(vec![entry(4096, 4)]), &chain, 4).unwrap();
        assert_eq!(plan.blocks[0].1, Slice { addr: 4096, len: 4 });
        assert_eq!(plan.bytes(), 4);
    }

    #[test]
    fn forged_fields_are_refused() {
        let chain = [SeqHash(7)];
        let check = |r: DescribeReply| described(r, &chain, 1 << 20).unwrap_err();
        assert_eq!(
            check(reply(vec![entry(0, 5)])),
            DescribeError::Length(7, 5, 4)
        );
        assert_eq!(
            check(reply(vec![entry(u64::MAX - 1, 4)])),
            DescribeError::Wraps(7)
        );
        assert_eq!(
            check(reply(vec![entry(0, 4), entry(4, 4)])),
            DescribeError::TooMany(2, 1)
        );
        let mut other = entry(0, 4);
        other.block.as_mut().unwrap().hash = 8;
        assert_eq!(
            check(reply(vec![other])),
            DescribeError::OutOfChain(0, 8, 7)
        );
        let mut inline = entry(0, 4);
        inline.block.as_mut().unwrap().payload = bytes::Bytes::from_static(b"abcd");
        assert_eq!(check(reply(vec![inline])), DescribeError::Inline(7));
        let mut huge = entry(0, 1 << 40);
        huge.block
            .as_mut()
            .unwrap()
            .layout
            .as_mut()
            .unwrap()
            .block_bytes = 1 << 40;
        assert_eq!(
            check(reply(vec![huge])),
            DescribeError::TooLarge(7, 1 << 40)
        );
        let mut big_md = reply(vec![]);
        big_md.agent_metadata = vec![0; MAX_AGENT_METADATA + 1];
        assert_eq!(
            check(big_md),
            DescribeError::Metadata(MAX_AGENT_METADATA + 1)
        );
        let mut nameless = reply(vec![]);
        nameless.agent.clear();
        assert_eq!(check(nameless), DescribeError::AgentName(0));
        assert_eq!(
            described(reply(vec![entry(0, 4)]), &chain, 3).unwrap_err(),
            DescribeError::OverBudget(4, 3)
        );
    }
}
