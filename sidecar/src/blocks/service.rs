//! The block API on the sidecar's gRPC port (`kvblocks/proto/.../kv_blocks.proto`): the
//! tiers, when any is configured, and the leases of disaggregated serving, always.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dynamo_kvblocks::pb::kv_blocks_server::{KvBlocks, KvBlocksServer};
use dynamo_kvblocks::pb::{
    self, Held, LendReply, LendRequest, LookupReply, LookupRequest, OffloadReply, OnboardRequest,
    OpenRegionReply, OpenRegionRequest,
};
use dynamo_kvblocks::region::Region;
use dynamo_kvblocks::{Block, Credential, MAX_MESSAGE_BYTES, from_region, wire_tier};
use dynamo_kvcache::SeqHash;
use futures::{Stream, StreamExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use super::budget::peer_of;
use super::guard::{Guard, caller};
use super::lease::Leases;
use super::store::{BlockStore, OffloadCounts, Outcome};

/// Most hashes one lookup or onboard may name: a 1M-token context in 16-token blocks.
const MAX_CHAIN: usize = 1 << 16;
/// Blocks read ahead of a slow onboarding client.
const ONBOARD_AHEAD: usize = 4;
/// Largest shared region granted: a few hundred blocks of a large model.
const MAX_REGION_BYTES: u64 = 1 << 30;
/// Regions kept open; opening one more closes the oldest (a client that restarted
/// opens new ones, and its old ones must not pile up in shared memory).
const MAX_REGIONS: usize = 8;

/// The block API as served: behind its guard.
pub type BlockApiServer = InterceptedService<KvBlocksServer<BlockApi>, Guard>;

/// The gRPC service of `store` (the tiers, if any) and `leases`, for holders of
/// `credential` (none: callers on this host); with `region_dir`, it shares memory with
/// clients there.
pub fn service(
    store: Option<BlockStore>,
    leases: Leases,
    region_dir: Option<PathBuf>,
    credential: Option<Credential>,
) -> BlockApiServer {
    if let Some(dir) = &region_dir {
        remove_orphans(dir);
    }
    let regions = Arc::new(Regions {
        dir: region_dir,
        open: Mutex::new(BTreeMap::new()),
        next: AtomicU64::new(1),
    });
    let api = KvBlocksServer::new(BlockApi {
        store,
        leases,
        regions,
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    InterceptedService::new(api, Guard::new(credential))
}

pub struct BlockApi {
    store: Option<BlockStore>,
    leases: Leases,
    regions: Arc<Regions>,
}

impl BlockApi {
    /// The block a message carries, verified; `None` if it does not check out.
    fn received(&self, message: pb::Block) -> Result<Option<Block>, Status> {
        Ok(match &message.region {
            Some(slice) => {
                let region = self.regions.get(slice.region_id)?;
                from_region(message, &region).ok().flatten()
            }
            None => Block::try_from(message).ok().filter(Block::verify),
        })
    }
}

/// Removes the regions of sidecars that are gone (killed before they could remove
/// their own), so restarts do not fill shared memory.
fn remove_orphans(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(REGION_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok());
        if let Some(pid) = pid
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Region files are named `dynamo-kv-PID-ID`.
const REGION_PREFIX: &str = "dynamo-kv-";

/// The shared regions this sidecar created, by id (ids grow, so the first is the oldest).
struct Regions {
    dir: Option<PathBuf>,
    open: Mutex<BTreeMap<u64, Arc<Region>>>,
    next: AtomicU64,
}

impl Regions {
    fn get(&self, id: u64) -> Result<Arc<Region>, Status> {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&id).cloned().ok_or_else(|| {
            Status::failed_precondition(format!("no shared region {id}: open one again"))
        })
    }

    fn create(&self, bytes: u64) -> Result<(u64, PathBuf, u64), Status> {
        let Some(dir) = &self.dir else {
            return Err(Status::unimplemented(
                "this sidecar carries block payloads inline",
            ));
        };
        let bytes = bytes.clamp(1, MAX_REGION_BYTES);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{REGION_PREFIX}{}-{id}", std::process::id()));
        let region =
            Region::create(&path, bytes).map_err(|e| Status::resource_exhausted(e.to_string()))?;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while open.len() >= MAX_REGIONS {
            open.pop_first();
        }
        open.insert(id, Arc::new(region));
        Ok((id, path, bytes))
    }
}

/// Where an onboarding's blocks come from: the tiers (none configured: nothing), or a
/// lease's blocks, each served only where it is the block asked for at its position.
enum Source {
    Tiers(Option<BlockStore>),
    Lease(Vec<Block>),
}

impl Source {
    async fn get(&mut self, position: usize, hash: SeqHash) -> Option<Block> {
        match self {
            Source::Tiers(store) => store.as_ref()?.onboard(hash).await,
            Source::Lease(blocks) => blocks.get(position).filter(|b| b.hash == hash).cloned(),
        }
    }
}

type BlockStream = Pin<Box<dyn Stream<Item = Result<pb::Block, Status>> + Send>>;

fn chain(hashes: &[u64]) -> Result<Vec<SeqHash>, Status> {
    if hashes.len() > MAX_CHAIN {
        return Err(Status::invalid_argument(format!(
            "{} hashes in one request; at most {MAX_CHAIN}",
            hashes.len()
        )));
    }
    Ok(hashes.iter().copied().map(SeqHash).collect())
}

#[tonic::async_trait]
impl KvBlocks for BlockApi {
    async fn offload(
        &self,
        request: Request<Streaming<pb::Block>>,
    ) -> Result<Response<OffloadReply>, Status> {
        let mut blocks = request.into_inner();
        let mut counts = OffloadCounts::default();
        while let Some(message) = blocks.next().await {
            let outcome = match (&self.store, self.received(message?)?) {
                (Some(store), Some(block)) => store.offload_verified(block),
                (Some(store), None) => store.refuse_corrupt(),
                (None, _) => Outcome::Dropped,
            };
            counts.count(outcome);
        }
        Ok(Response::new(OffloadReply {
            stored: counts.stored,
            duplicates: counts.duplicates,
            dropped: counts.dropped,
            corrupt: counts.corrupt,
        }))
    }

    async fn lookup(
        &self,
        request: Request<LookupRequest>,
    ) -> Result<Response<LookupReply>, Status> {
        let chain = chain(&request.get_ref().hashes)?;
        let Some(store) = &self.store else {
            return Ok(Response::new(LookupReply::default()));
        };
        let held = store
            .lookup(&chain)
            .into_iter()
            .map(|(hash, tier)| Held {
                hash: hash.0,
                tier: wire_tier(tier).into(),
            })
            .collect();
        Ok(Response::new(LookupReply { held }))
    }

    type OnboardStream = BlockStream;

    async fn onboard(
        &self,
        request: Request<OnboardRequest>,
    ) -> Result<Response<Self::OnboardStream>, Status> {
        let chain = chain(&request.get_ref().hashes)?;
        let region = match request.get_ref().region_id {
            Some(id) => Some((id, self.regions.get(id)?)),
            None => None,
        };
        let mut source = match &request.get_ref().lease {
            Some(lease) => Source::Lease(self.leases.fetch(lease).ok_or_else(|| {
                Status::not_found(format!(
                    "lease {lease:?} is gone (expired, fetched or never lent): recompute"
                ))
            })?),
            None => Source::Tiers(self.store.clone()),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(ONBOARD_AHEAD);
        tokio::spawn(async move {
            // Payloads go back to back into the region; what does not fit goes inline.
            let mut offset = 0;
            for (i, hash) in chain.into_iter().enumerate() {
                let Some(block) = source.get(i, hash).await else {
                    break;
                };
                let len = block.payload.len() as u64;
                let message = match &region {
                    Some((region_id, region)) if region.write(offset, &block.payload).is_ok() => {
                        let slice = pb::RegionSlice {
                            region_id: *region_id,
                            offset,
                            len,
                        };
                        offset += len;
                        pb::Block::in_region(&block, slice)
                    }
                    _ => pb::Block::from(&block),
                };
                if tx.send(Ok(message)).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lend(
        &self,
        request: Request<Streaming<LendRequest>>,
    ) -> Result<Response<LendReply>, Status> {
        let lender = peer_of(caller(&request));
        let mut messages = request.into_inner();
        let (mut name, mut blocks, mut bytes) = (None::<String>, Vec::new(), 0u64);
        let mut refused = None;
        while let Some(message) = messages.next().await {
            let LendRequest { lease, block } = message?;
            if *name.get_or_insert_with(|| lease.clone()) != lease {
                return Err(Status::invalid_argument(
                    "every message of one Lend call names the same lease",
                ));
            }
            let Some(message) = block else {
                return Err(Status::invalid_argument("a Lend message without a block"));
            };
            let hash = message.hash;
            match self.received(message)? {
                Some(block) => {
                    bytes += block.payload.len() as u64;
                    blocks.push(block);
                }
                None => refused = Some(format!("block {hash:016x} did not check out")),
            }
            if refused.is_some() || bytes > self.leases.budget() {
                break;
            }
        }
        let (name, count) = (name.unwrap_or_default(), blocks.len() as u64);
        let refused = refused.or_else(|| {
            let lent = self.leases.lend(&name, blocks, lender);
            lent.err().map(|e| e.to_string())
        });
        let lent = if refused.is_some() { 0 } else { count };
        Ok(Response::new(LendReply {
            lent,
            refused,
            expires_in_ms: self.leases.duration().as_millis() as u64,
        }))
    }

    async fn open_region(
        &self,
        request: Request<OpenRegionRequest>,
    ) -> Result<Response<OpenRegionReply>, Status> {
        let (region_id, path, bytes) = self.regions.create(request.get_ref().bytes)?;
        Ok(Response::new(OpenRegionReply {
            region_id,
            path: path.display().to_string(),
            bytes,
        }))
    }
}
