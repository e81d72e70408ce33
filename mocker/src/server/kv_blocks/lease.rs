//! The block I/O of disaggregated serving (`DESIGN.md`, "Disaggregated request"): a
//! prefill lends its prompt's blocks to its sidecar under a lease; a decode takes a
//! lease's blocks from its own sidecar, keeps those that are its own prompt's, and
//! waits the modelled time to move them from the prefill engine's GPU.

use std::time::{Duration, Instant};

use dynamo_kvblocks::{Block, ClientError};
use dynamo_kvcache::SeqHash;

use super::KvBlocks;
use crate::kv_blocks::payload;
use crate::server::engine_loop::EngineHandle;

/// Why a lend or a lease fetch came to nothing.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("the sidecar refused the lease: {0}")]
    Refused(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// What a decode took from a lease.
#[derive(Debug, PartialEq, Eq)]
pub struct Taken {
    /// Leading blocks of the chain asked for that checked out.
    pub blocks: usize,
    /// The real KV bytes of those not already on this engine's GPU: what a real
    /// engine moves (vLLM reads only the blocks it does not cache).
    pub moved_bytes: u64,
}

impl KvBlocks {
    /// Has the sidecar hold the blocks of `chain` (a prompt's full blocks, first block
    /// first) under `lease` until a decode fetches them or the lease expires.
    pub async fn lend(&self, lease: &str, chain: &[SeqHash]) -> Result<(), LeaseError> {
        let (layout, chain) = (self.layout.clone(), chain.to_vec());
        // Payloads of a large model are megabytes each: built off the async workers.
        let blocks = tokio::task::spawn_blocking(move || {
            let parents = std::iter::once(None).chain(chain.iter().copied().map(Some));
            chain
                .iter()
                .zip(parents)
                .map(|(&hash, parent)| {
                    let bytes = payload(hash, layout.block_bytes as usize);
                    Block::new(hash, parent, layout.block_size, layout.clone(), bytes)
                })
                .collect()
        })
        .await
        .expect("building payloads does not panic");
        let mut client = self.client.clone();
        let reply = tokio::time::timeout(self.timeout, client.lend(lease, blocks))
            .await
            .map_err(|_| LeaseError::Timeout(self.timeout))??;
        match reply.refused {
            Some(reason) => Err(LeaseError::Refused(reason)),
            None => Ok(()),
        }
    }

    /// Takes the blocks of `chain` (this request's own prompt's full blocks, first
    /// block first, as far as the prefill lent them) from `lease` in this engine's
    /// sidecar, which ends the lease, and waits the modelled time to move them over
    /// the link (divided by the speedup ratio, counted from the start so the real
    /// fetch overlaps it). Only leading blocks that are exactly this prompt's count.
    pub async fn take_lease(
        &self,
        engine: &EngineHandle,
        lease: &str,
        chain: &[SeqHash],
    ) -> Result<Taken, LeaseError> {
        let started = Instant::now();
        let mut client = self.client.clone();
        let blocks = tokio::time::timeout(self.timeout, client.fetch_lease(lease, chain))
            .await
            .map_err(|_| LeaseError::Timeout(self.timeout))??;
        let checked = self.check(blocks, chain.to_vec(), None).await;
        let used = checked.iter().take_while(|(ok, _)| *ok).count();
        let on_gpu = match used {
            0 => 0,
            _ => engine
                .cached_prefix_blocks(chain[..used].to_vec())
                .await
                .unwrap_or(0),
        };
        let moved_bytes = (used - on_gpu) as u64 * self.real_block_bytes;
        let modelled_ms = self.config.link_ms(moved_bytes) / self.speedup_ratio;
        let modelled = Duration::from_secs_f64(modelled_ms / 1000.0);
        tokio::time::sleep_until((started + modelled).into()).await;
        Ok(Taken {
            blocks: used,
            moved_bytes,
        })
    }
}
