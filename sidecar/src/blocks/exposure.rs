//! A lease's payloads exposed for a peer's NIXL READ (`Describe`): copied back to back
//! into a slot of the agent's registered arena, for as long as the lease lives. Every
//! descriptor is computed here from that slot, never from the request, so no read
//! reaches past it into another lease's slot. The copy is charged to the lease budget
//! (to no peer's share, as an answer's blocks on their way out are).

use dynamo_kvblocks::Block;
use dynamo_kvblocks::pb::{self, DescribeReply, DescribedBlock};
use tonic::Status;

use super::budget::{Charge, LeaseBudget};
use crate::nixl::{NixlAgent, Slot};

/// What keeps the payloads readable: dropped with the lease (the slot returned to the
/// arena, uncharged).
pub struct Exposure {
    _slot: Slot,
    _charge: Charge,
}

/// `blocks` exposed by `agent`, and the answer that tells a peer where they are. With
/// no room in the arena, RESOURCE_EXHAUSTED: the peer fetches the lease over gRPC.
pub fn expose(
    agent: &NixlAgent,
    budget: &LeaseBudget,
    blocks: &[Block],
) -> Result<(Exposure, DescribeReply), Status> {
    let total: u64 = blocks.iter().map(|b| b.payload.len() as u64).sum();
    let charge = budget
        .charge(None, total)
        .map_err(|over| Status::resource_exhausted(over.to_string()))?;
    let mut slot = agent
        .expose(total as usize)
        .map_err(|e| Status::internal(format!("NIXL: {e}")))?
        .ok_or_else(|| {
            Status::resource_exhausted(format!(
                "no room for {total} bytes in the NIXL arena: fetch the lease with Onboard"
            ))
        })?;
    let mut offsets = Vec::with_capacity(blocks.len());
    let mut offset = 0;
    let memory = slot.as_mut_slice();
    for block in blocks {
        let len = block.payload.len();
        memory[offset..offset + len].copy_from_slice(&block.payload);
        offsets.push(offset as u64);
        offset += len;
    }
    let agent_metadata = agent
        .metadata()
        .map_err(|e| Status::internal(format!("NIXL: {e}")))?;
    let base = slot.addr();
    let described = blocks
        .iter()
        .zip(offsets)
        .map(|(block, offset)| DescribedBlock {
            block: Some(pb::Block {
                payload: Default::default(),
                ..pb::Block::from(block)
            }),
            addr: base + offset,
            len: block.payload.len() as u64,
        })
        .collect();
    let reply = DescribeReply {
        agent: agent.name().to_owned(),
        agent_metadata,
        blocks: described,
    };
    let exposure = Exposure {
        _slot: slot,
        _charge: charge,
    };
    Ok((exposure, reply))
}
