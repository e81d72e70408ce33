//! A lease's payloads exposed for a peer's NIXL READ (`Describe`): copied back to back
//! into fresh host memory registered with the agent, for as long as the lease lives.
//! Every descriptor is computed here from that memory, never from the request, so no
//! read reaches past it. The copy is charged to the lease budget (to no peer's share,
//! as an answer's blocks on their way out are).

use dynamo_kvblocks::Block;
use dynamo_kvblocks::pb::{self, DescribeReply, DescribedBlock};
use tonic::Status;

use super::budget::{Charge, LeaseBudget};
use crate::nixl::{Exposed, HostMemory, NixlAgent};

/// What keeps the payloads readable: dropped with the lease (deregistered, unmapped,
/// uncharged).
pub struct Exposure {
    _memory: Exposed,
    _charge: Charge,
}

/// `blocks` exposed by `agent`, and the answer that tells a peer where they are.
pub fn expose(
    agent: &NixlAgent,
    budget: &LeaseBudget,
    blocks: &[Block],
) -> Result<(Exposure, DescribeReply), Status> {
    let total: u64 = blocks.iter().map(|b| b.payload.len() as u64).sum();
    let charge = budget
        .charge(None, total)
        .map_err(|over| Status::resource_exhausted(over.to_string()))?;
    let mut memory = HostMemory::new(total as usize)
        .map_err(|e| Status::resource_exhausted(format!("host memory for NIXL: {e}")))?;
    let mut offsets = Vec::with_capacity(blocks.len());
    let mut offset = 0;
    for block in blocks {
        let len = block.payload.len();
        memory.as_mut_slice()[offset..offset + len].copy_from_slice(&block.payload);
        offsets.push(offset as u64);
        offset += len;
    }
    let nixl = |e: nixl_sys::NixlError| Status::internal(format!("NIXL: {e}"));
    let exposed = agent.expose(memory).map_err(nixl)?;
    let agent_metadata = agent.metadata().map_err(nixl)?;
    let base = exposed.addr();
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
        _memory: exposed,
        _charge: charge,
    };
    Ok((exposure, reply))
}
