//! Moving a prompt's KV blocks from the prefill pod's sidecar to this one: the portable
//! transport, the block API's `Onboard` with the prefill's lease over gRPC/TCP. Every
//! block is checked against its checksum, its place in the chain and, with the graph's
//! credential, its MAC on arrival (the block client does all three), so a block that is not the one the prefill produced never
//! reaches the engine.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use dynamo_kvblocks::{Block, BlockClient, ClientError, Credential};
use dynamo_kvcache::SeqHash;

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

/// Block API clients of peer sidecars, one connection each.
pub struct Transfer {
    peers: Mutex<HashMap<SocketAddr, BlockClient>>,
    timeout: Duration,
    /// The graph's, which the peers require.
    credential: Option<Credential>,
}

impl Transfer {
    pub fn new(timeout: Duration, credential: Option<Credential>) -> Self {
        Self {
            peers: Mutex::default(),
            timeout,
            credential,
        }
    }

    /// The blocks `hashes` names from the lease `lease` of the sidecar at `from` (a
    /// prefix of them if the rest is missing or corrupt); the fetch ends that lease.
    pub async fn fetch(
        &self,
        from: SocketAddr,
        lease: &str,
        hashes: &[SeqHash],
    ) -> Result<Vec<Block>, TransferError> {
        let mut client = self.client(from)?;
        match tokio::time::timeout(self.timeout, client.fetch_lease(lease, hashes)).await {
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
            Ok(Ok(blocks)) => Ok(blocks),
        }
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
