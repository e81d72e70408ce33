//! The block API's client: what an engine (the mock engine, a future connector of a real
//! one) uses to offload blocks to its sidecar and bring them back.

use std::path::Path;
use std::sync::Arc;

use dynamo_kvcache::{SeqHash, Tier};
use futures::StreamExt;
use tokio::sync::Mutex;
use tonic::Request;
use tonic::transport::{Channel, Endpoint};

use crate::credential::Credential;
use crate::mac::{BlockKey, authentic};
use crate::pb::kv_blocks_client::KvBlocksClient;
use crate::pb::{
    self, DescribeReply, DescribeRequest, LendReply, LendRequest, LookupRequest, OffloadReply,
    OnboardRequest, OpenRegionRequest,
};
use crate::region::Region;
use crate::{
    Block, BlockError, HTTP2_FRAME_BYTES, HTTP2_WINDOW_BYTES, MAX_MESSAGE_BYTES, from_region,
    tier_of,
};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0:?} is not a gRPC endpoint: {1}")]
    Endpoint(String, tonic::transport::Error),
    #[error("the sidecar's block API: {0}")]
    Status(#[from] tonic::Status),
    #[error(transparent)]
    Block(#[from] BlockError),
    #[error("the sidecar's shared region: {0}")]
    Region(#[from] crate::region::RegionError),
}

impl ClientError {
    /// The sidecar no longer has what was asked for (an expired or fetched lease).
    pub fn is_gone(&self) -> bool {
        matches!(self, ClientError::Status(s) if s.code() == tonic::Code::NotFound)
    }
}

/// `blocks` as messages: payloads in `region` (its id and memory) while they fit, then
/// inline; with `key`, each block not sealed yet is sealed (a caller may seal off the
/// async workers first, as the mock engine does).
fn outgoing(
    region: Option<&(u64, Region)>,
    key: Option<&BlockKey>,
    blocks: Vec<Block>,
) -> Result<Vec<pb::Block>, ClientError> {
    let blocks: Vec<Block> = match key {
        Some(key) => blocks
            .into_iter()
            .map(|b| if b.mac.is_some() { b } else { key.seal(b) })
            .collect(),
        None => blocks,
    };
    let Some((id, shared)) = region else {
        return Ok(blocks.iter().map(pb::Block::from).collect());
    };
    let mut offset = 0;
    let mut messages = Vec::with_capacity(blocks.len());
    for block in &blocks {
        let len = block.payload.len() as u64;
        if offset + len <= shared.len() {
            shared.write(offset, &block.payload)?;
            let slice = pb::RegionSlice {
                region_id: *id,
                offset,
                len,
            };
            messages.push(pb::Block::in_region(block, slice));
            offset += len;
        } else {
            messages.push(pb::Block::from(block));
        }
    }
    Ok(messages)
}

/// A connection to one sidecar's block API. Cheap to clone: clones share the channel
/// and the shared regions.
#[derive(Clone, Debug)]
pub struct BlockClient {
    inner: KvBlocksClient<Channel>,
    regions: Option<Arc<Regions>>,
    /// Sent with every call (the graph's, when the sidecar requires one).
    credential: Option<Credential>,
    /// The credential's: seals what is sent, and what comes back must carry its MAC.
    key: Option<BlockKey>,
}

/// One region per direction, each used by one call at a time; a call that finds its
/// region busy carries its payloads inline.
#[derive(Debug)]
struct Regions {
    offload: Mutex<(u64, Region)>,
    onboard: Mutex<(u64, Region)>,
}

impl BlockClient {
    /// A client of the sidecar at `url` (`http://127.0.0.1:9100`); it connects on first
    /// use and reconnects as needed, so a sidecar that is not up yet is not an error here.
    pub fn new(url: &str) -> Result<Self, ClientError> {
        let channel = Endpoint::from_shared(url.to_owned())
            .map_err(|e| ClientError::Endpoint(url.to_owned(), e))?
            .tcp_nodelay(true)
            .initial_stream_window_size(HTTP2_WINDOW_BYTES)
            .initial_connection_window_size(HTTP2_WINDOW_BYTES)
            .max_frame_size(HTTP2_FRAME_BYTES)
            .connect_lazy();
        let inner = KvBlocksClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Self {
            inner,
            regions: None,
            credential: None,
            key: None,
        })
    }

    /// The client, sending `credential` with every call and sealing and checking
    /// blocks with its key.
    pub fn with_credential(self, credential: Credential) -> Self {
        Self {
            key: Some(BlockKey::of(&credential)),
            credential: Some(credential),
            ..self
        }
    }

    /// The key blocks are sealed with, if the client has a credential.
    pub fn block_key(&self) -> Option<&BlockKey> {
        self.key.as_ref()
    }

    /// `message` as a call, with the credential.
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(credential) = &self.credential {
            credential.attach(request.metadata_mut());
        }
        request
    }

    /// Asks the sidecar for two shared memory regions of up to `bytes` each (one per
    /// direction), so that payloads cross by memory copy: for an engine on the sidecar's
    /// host. A sidecar that does not share memory leaves the client as it was (`false`).
    pub async fn share_memory(&mut self, bytes: u64) -> Result<bool, ClientError> {
        let mut open = async || -> Result<Option<(u64, Region)>, ClientError> {
            match self
                .inner
                .open_region(self.request(OpenRegionRequest { bytes }))
                .await
            {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    Ok(Some((
                        reply.region_id,
                        Region::open(Path::new(&reply.path))?,
                    )))
                }
                Err(s) if s.code() == tonic::Code::Unimplemented => Ok(None),
                Err(s) => Err(s.into()),
            }
        };
        let (Some(offload), Some(onboard)) = (open().await?, open().await?) else {
            return Ok(false);
        };
        self.regions = Some(Arc::new(Regions {
            offload: Mutex::new(offload),
            onboard: Mutex::new(onboard),
        }));
        Ok(true)
    }

    /// Hands `blocks` to the sidecar's tiers: payloads through the shared region where
    /// they fit, inline otherwise.
    pub async fn offload(&mut self, blocks: Vec<Block>) -> Result<OffloadReply, ClientError> {
        let regions = self.regions.clone();
        let region = regions.as_ref().and_then(|r| r.offload.try_lock().ok());
        let messages = outgoing(region.as_deref(), self.key.as_ref(), blocks)?;
        // The sidecar has copied every payload out before it replies.
        let reply = self
            .inner
            .offload(self.request(futures::stream::iter(messages)))
            .await;
        drop(region);
        Ok(reply?.into_inner())
    }

    /// Has the sidecar hold `blocks` under `lease` for a peer to fetch (a prefill for
    /// its remote decode). A refused lease is `Ok` with `refused` set.
    pub async fn lend(
        &mut self,
        lease: &str,
        blocks: Vec<Block>,
    ) -> Result<LendReply, ClientError> {
        let regions = self.regions.clone();
        let region = regions.as_ref().and_then(|r| r.offload.try_lock().ok());
        let lease = lease.to_owned();
        let messages = outgoing(region.as_deref(), self.key.as_ref(), blocks)?
            .into_iter()
            .map(move |block| LendRequest {
                lease: lease.clone(),
                block: Some(block),
            });
        let reply = self
            .inner
            .lend(self.request(futures::stream::iter(messages)))
            .await;
        drop(region);
        Ok(reply?.into_inner())
    }

    /// The longest prefix of the chain `hashes` the sidecar holds, with the tier of each.
    pub async fn lookup(
        &mut self,
        hashes: &[SeqHash],
    ) -> Result<Vec<(SeqHash, Tier)>, ClientError> {
        let request = LookupRequest {
            hashes: hashes.iter().map(|h| h.0).collect(),
        };
        let reply = self.inner.lookup(self.request(request)).await?.into_inner();
        Ok(reply
            .held
            .into_iter()
            .filter_map(|h| Some((SeqHash(h.hash), tier_of(h.tier())?)))
            .collect())
    }

    /// The blocks `hashes` names, in order, up to the first one the sidecar no longer
    /// holds or that fails its checksum or (with a credential) its MAC here: never a
    /// block that is not what a writer of this graph wrote.
    pub async fn onboard(&mut self, hashes: &[SeqHash]) -> Result<Vec<Block>, ClientError> {
        self.onboard_from(hashes, None).await
    }

    /// The blocks `hashes` names from the sidecar's `lease` (checked as [`Self::onboard`]
    /// checks them), which ends the lease. A lease the sidecar no longer has is an
    /// error that [`ClientError::is_gone`].
    pub async fn fetch_lease(
        &mut self,
        lease: &str,
        hashes: &[SeqHash],
    ) -> Result<Vec<Block>, ClientError> {
        self.onboard_from(hashes, Some(lease.to_owned())).await
    }

    /// Where the sidecar's `lease` lets the blocks `hashes` names be read over NIXL;
    /// `None` from a sidecar that has no NIXL agent (fetch with [`Self::fetch_lease`]).
    /// The lease stays held: end it with [`Self::end_lease`]. The answer is the peer's
    /// word: check it with [`crate::described::described`].
    pub async fn describe(
        &mut self,
        lease: &str,
        hashes: &[SeqHash],
    ) -> Result<Option<DescribeReply>, ClientError> {
        let request = DescribeRequest {
            lease: lease.to_owned(),
            hashes: hashes.iter().map(|h| h.0).collect(),
        };
        match self.inner.describe(self.request(request)).await {
            Ok(reply) => Ok(Some(reply.into_inner())),
            Err(s) if s.code() == tonic::Code::Unimplemented => Ok(None),
            Err(s) => Err(s.into()),
        }
    }

    /// Ends the sidecar's `lease` once its blocks were read some other way (an
    /// `Onboard` of the lease naming no block: the holder's "done").
    pub async fn end_lease(&mut self, lease: &str) -> Result<(), ClientError> {
        self.onboard_from(&[], Some(lease.to_owned())).await?;
        Ok(())
    }

    /// `message`, whose payload is inline, as a block if it is the one expected: its
    /// checksum and length, its place in the chain (`expected`) and, with a
    /// credential, its MAC. What every block fetched passes, whatever carried it.
    pub fn accept(
        &self,
        expected: Option<SeqHash>,
        message: pb::Block,
    ) -> Result<Option<Block>, ClientError> {
        let block = Some(Block::try_from(message)?).filter(Block::verify);
        Ok(self.in_chain(expected, block))
    }

    fn in_chain(&self, expected: Option<SeqHash>, block: Option<Block>) -> Option<Block> {
        block.filter(|b| expected == Some(b.hash) && authentic(self.key.as_ref(), b))
    }

    async fn onboard_from(
        &mut self,
        hashes: &[SeqHash],
        lease: Option<String>,
    ) -> Result<Vec<Block>, ClientError> {
        let region = match &self.regions {
            Some(r) => r.onboard.try_lock().ok(),
            None => None,
        };
        let request = OnboardRequest {
            hashes: hashes.iter().map(|h| h.0).collect(),
            region_id: region.as_ref().map(|r| r.0),
            lease,
        };
        let mut stream = self
            .inner
            .onboard(self.request(request))
            .await?
            .into_inner();
        let mut blocks = Vec::with_capacity(hashes.len());
        while let Some(message) = stream.next().await {
            let message = message?;
            let expected = hashes.get(blocks.len()).copied();
            let block = match (&message.region, &region) {
                (Some(_), Some(region)) => {
                    self.in_chain(expected, from_region(message, &region.1)?)
                }
                _ => self.accept(expected, message)?,
            };
            match block {
                Some(block) => blocks.push(block),
                None => break,
            }
        }
        Ok(blocks)
    }
}
