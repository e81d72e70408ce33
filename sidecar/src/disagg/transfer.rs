//! Moving a prompt's KV blocks from the prefill pod's sidecar to this one, under the
//! prefill's lease: by NIXL READ when both sidecars have an agent (`Describe`, then the
//! read, then `Onboard` of the lease with no block to end it), else the portable
//! transport, the block API's `Onboard` with the lease over gRPC/TCP. Whatever carried
//! them, every block is checked against its checksum, its place in the chain and, with
//! the graph's credential, its MAC on arrival (the block client's `accept` does all
//! three), so a block that is not the one the prefill produced never reaches the engine.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dynamo_kvblocks::described::{DescribeError, described};
use dynamo_kvblocks::{Block, BlockClient, ClientError, Credential};
use dynamo_kvcache::SeqHash;
use tokio::time::Instant;

use crate::nixl::{NixlAgent, ReadError};

/// Peer sidecars whose connections are kept (an xPyD graph has a handful of prefill
/// pods; past this the cache starts over).
const MAX_PEERS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("the prefill pod's blocks are gone (the lease expired or was fetched)")]
    Gone,
    #[error("no blocks within {0:?}")]
    Timeout(Duration),
    #[error("fetching from {0}: {1}")]
    Failed(SocketAddr, ClientError),
}

/// How blocks moved, as `dynamo_sidecar_kv_transfers{transport}` counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Nixl,
    Grpc,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Nixl => "nixl",
            Transport::Grpc => "grpc",
        }
    }
}

/// Why a NIXL transfer did not happen; all but `Gone` fall back to gRPC.
#[derive(Debug, thiserror::Error)]
enum NixlFailure {
    #[error("the peer has no NIXL agent")]
    NoAgent,
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the peer's description: {0}")]
    Described(#[from] DescribeError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("the read's thread: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// Block API clients of peer sidecars, one connection each, and this sidecar's NIXL
/// agent, if it has one.
pub struct Transfer {
    peers: Mutex<HashMap<SocketAddr, BlockClient>>,
    timeout: Duration,
    /// The graph's, which the peers require.
    credential: Option<Credential>,
    nixl: Option<Arc<NixlAgent>>,
    /// Most payload bytes one NIXL read takes (this sidecar's lease budget: what it
    /// could hold of them).
    max_read_bytes: u64,
    /// Whether falling back to gRPC for a peer without an agent was logged already.
    said_no_agent: AtomicBool,
}

impl Transfer {
    pub fn new(timeout: Duration, credential: Option<Credential>) -> Self {
        Self {
            peers: Mutex::default(),
            timeout,
            credential,
            nixl: None,
            max_read_bytes: 0,
            said_no_agent: AtomicBool::new(false),
        }
    }

    /// Reads over NIXL with `agent` (when there is one), at most `max_read_bytes` a read.
    pub fn with_nixl(self, agent: Option<Arc<NixlAgent>>, max_read_bytes: u64) -> Self {
        Self {
            nixl: agent,
            max_read_bytes,
            ..self
        }
    }

    /// The blocks `hashes` names from the lease `lease` of the sidecar at `from` (a
    /// prefix of them if the rest is missing or corrupt), and how they came; the fetch
    /// ends that lease.
    pub async fn fetch(
        &self,
        from: SocketAddr,
        lease: &str,
        hashes: &[SeqHash],
    ) -> Result<(Vec<Block>, Transport), TransferError> {
        let mut client = self.client(from)?;
        let deadline = Instant::now() + self.timeout;
        if let Some(agent) = &self.nixl {
            let read = self.over_nixl(agent, &mut client, lease, hashes, deadline);
            match tokio::time::timeout_at(deadline, read).await {
                Err(_) => return Err(TransferError::Timeout(self.timeout)),
                Ok(Ok(blocks)) => return Ok((blocks, Transport::Nixl)),
                Ok(Err(NixlFailure::Client(e))) if e.is_gone() => return Err(TransferError::Gone),
                Ok(Err(NixlFailure::NoAgent)) => {
                    if !self.said_no_agent.swap(true, Ordering::Relaxed) {
                        tracing::info!(peer = %from, "a prefill peer has no NIXL agent: KV blocks from such peers move over gRPC");
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(peer = %from, error = %e, "NIXL transfer failed; fetching over gRPC");
                }
            }
        }
        match tokio::time::timeout_at(deadline, client.fetch_lease(lease, hashes)).await {
            Err(_) => Err(TransferError::Timeout(self.timeout)),
            Ok(Err(e)) if e.is_gone() => Err(TransferError::Gone),
            Ok(Err(e)) => {
                // A broken connection is not reused.
                self.peers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&from);
                Err(TransferError::Failed(from, e))
            }
            Ok(Ok(blocks)) => Ok((blocks, Transport::Grpc)),
        }
    }

    /// The lease's blocks read over NIXL and checked, the lease then ended. Until the
    /// read is checked the lease stays held, so a failure leaves it to gRPC.
    async fn over_nixl(
        &self,
        agent: &Arc<NixlAgent>,
        client: &mut BlockClient,
        lease: &str,
        hashes: &[SeqHash],
        deadline: Instant,
    ) -> Result<Vec<Block>, NixlFailure> {
        let reply = client
            .describe(lease, hashes)
            .await?
            .ok_or(NixlFailure::NoAgent)?;
        let plan = described(reply, hashes, self.max_read_bytes)?;
        let slices: Vec<_> = plan.blocks.iter().map(|(_, slice)| *slice).collect();
        let (agent, peer, metadata) = (agent.clone(), plan.agent, plan.metadata);
        let until = deadline.into_std();
        let memory =
            tokio::task::spawn_blocking(move || agent.read(&peer, &metadata, &slices, until))
                .await??;
        // Each payload a slice of the memory read into, without a copy: the arena's
        // slot returns when the last block drops.
        let memory = Bytes::from_owner(memory);
        let mut blocks = Vec::with_capacity(plan.blocks.len());
        let mut offset = 0;
        for (i, (mut message, slice)) in plan.blocks.into_iter().enumerate() {
            let len = slice.len as usize;
            message.payload = memory.slice(offset..offset + len);
            offset += len;
            match client.accept(hashes.get(i).copied(), message)? {
                Some(block) => blocks.push(block),
                None => break,
            }
        }
        // The blocks are here: the lease has served its purpose.
        if let Err(e) = client.end_lease(lease).await {
            tracing::debug!(%lease, error = %e, "ending a lease read over NIXL (it expires)");
        }
        Ok(blocks)
    }

    fn client(&self, peer: SocketAddr) -> Result<BlockClient, TransferError> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = peers.get(&peer) {
            return Ok(client.clone());
        }
        if peers.len() >= MAX_PEERS {
            peers.clear();
        }
        let mut client = BlockClient::new(&format!("http://{peer}"))
            .map_err(|e| TransferError::Failed(peer, e))?;
        if let Some(credential) = &self.credential {
            client = client.with_credential(credential.clone());
        }
        peers.insert(peer, client.clone());
        Ok(client)
    }
}
