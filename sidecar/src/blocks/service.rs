//! The block API on the sidecar's gRPC port (`kvblocks/proto/.../kv_blocks.proto`): the
//! tiers, when any is configured, and the leases of disaggregated serving, always.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_kvblocks::pb::kv_blocks_server::{KvBlocks, KvBlocksServer};
use dynamo_kvblocks::pb::{
    self, DescribeReply, DescribeRequest, Held, LendReply, LendRequest, LookupReply, LookupRequest,
    OffloadReply, OnboardRequest, OpenRegionReply, OpenRegionRequest,
};
use dynamo_kvblocks::region::Region;
use dynamo_kvblocks::{Block, MAX_MESSAGE_BYTES, from_region, wire_tier};
use dynamo_kvcache::SeqHash;
use dynamo_server::GrpcConnectInfo;
use futures::{Stream, StreamExt};
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use super::admission::{Admission, Refusal};
use super::answer;
use super::budget::{Charge, LeaseBudget, peer_of};
use super::exposure;
use super::guard::{Guard, caller, on_this_host};
use super::lease::{Leases, NotDescribed, Refused};
use super::store::{BlockStore, OffloadCounts, Outcome};
use crate::nixl::NixlAgent;

/// Most hashes one lookup or onboard may name: a 1M-token context in 16-token blocks.
const MAX_CHAIN: usize = 1 << 16;
/// Largest shared region granted: a few hundred blocks of a large model.
const MAX_REGION_BYTES: u64 = 1 << 30;
/// Regions kept open; opening one more closes the oldest (a client that restarted
/// opens new ones, and its old ones must not pile up in shared memory).
const MAX_REGIONS: usize = 8;

/// The block API as served: behind its guard.
pub type BlockApiServer = InterceptedService<KvBlocksServer<BlockApi>, Guard>;

/// The gRPC service of `store` (the tiers, if any) and `leases`, for whom `guard` admits;
/// with `region_dir`, it shares memory with clients there; with `nixl`, peers may read
/// their leases' payloads over NIXL. A client must take each block of an answer within
/// `take_timeout`.
pub fn service(
    store: Option<BlockStore>,
    admission: Arc<Admission>,
    leases: Leases,
    region_dir: Option<PathBuf>,
    nixl: Option<Arc<NixlAgent>>,
    guard: Guard,
    take_timeout: Duration,
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
        admission,
        leases,
        regions,
        nixl,
        take_timeout,
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    InterceptedService::new(api, guard)
}

pub struct BlockApi {
    store: Option<BlockStore>,
    admission: Arc<Admission>,
    leases: Leases,
    regions: Arc<Regions>,
    nixl: Option<Arc<NixlAgent>>,
    take_timeout: Duration,
}

impl BlockApi {
    /// The block a message carries if it is admitted (checksum, layout, MAC).
    fn received(&self, message: pb::Block) -> Result<Result<Block, Refusal>, Status> {
        let block = match &message.region {
            Some(slice) => {
                let region = self.regions.get(slice.region_id)?;
                from_region(message, &region).ok().flatten()
            }
            None => Block::try_from(message).ok(),
        };
        Ok(match block {
            Some(block) => self.admission.check(&block).map(|()| block),
            None => Err(Refusal::Corrupt),
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

/// Where an onboarding's blocks come from, in chain order, each with its charge to the
/// lease budget: the tiers (none configured: nothing), each block charged as it is read
/// (none past the budget: the answer ends there); or a lease's blocks, each served only
/// where it is the block asked for at its position, under the lease's charge.
enum Source {
    Tiers(Option<BlockStore>, LeaseBudget),
    Lease(std::vec::IntoIter<Block>, Charge),
}

impl Source {
    async fn next(&mut self, hash: SeqHash) -> Option<(Block, Charge)> {
        match self {
            Source::Tiers(store, budget) => {
                let block = store.as_ref()?.onboard(hash).await?;
                let bytes = block.payload.len() as u64;
                match budget.charge(None, bytes) {
                    Ok(charge) => Some((block, charge)),
                    Err(over) => {
                        tracing::debug!(%over, "ending an onboard early");
                        None
                    }
                }
            }
            Source::Lease(blocks, charge) => {
                let block = blocks.next().filter(|b| b.hash == hash)?;
                let charge = charge.split_off(block.payload.len() as u64);
                Some((block, charge))
            }
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
        let (mut counts, mut refused) = (OffloadCounts::default(), 0);
        while let Some(message) = blocks.next().await {
            let outcome = match (&self.store, self.received(message?)?) {
                (Some(store), Ok(block)) => store.offload_verified(block),
                (Some(store), Err(Refusal::Corrupt)) => store.refuse_corrupt(),
                (None, Ok(_) | Err(Refusal::Corrupt)) => Outcome::Dropped,
                (_, Err(_)) => {
                    refused += 1;
                    continue;
                }
            };
            counts.count(outcome);
        }
        Ok(Response::new(OffloadReply {
            stored: counts.stored,
            duplicates: counts.duplicates,
            dropped: counts.dropped,
            corrupt: counts.corrupt,
            refused,
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
            Some(lease) => {
                let (blocks, charge) = self.leases.fetch(lease).ok_or_else(|| {
                    Status::not_found(format!(
                        "lease {lease:?} is gone (expired, fetched or never lent): recompute"
                    ))
                })?;
                Source::Lease(blocks.into_iter(), charge)
            }
            None => Source::Tiers(self.store.clone(), self.leases.budget().clone()),
        };
        let connection = GrpcConnectInfo::of(request.extensions()).cloned();
        let cut = self.leases.metrics().answers_cut.clone();
        let (mut answer, taken) = answer::answer(self.take_timeout, connection, cut);
        tokio::spawn(async move {
            // Payloads go back to back into the region; what does not fit goes inline.
            let mut offset = 0;
            for hash in chain {
                let Some((block, charge)) = source.next(hash).await else {
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
                if !answer.send(message, charge).await {
                    return;
                }
            }
            drop(source);
            answer.finish().await;
        });
        Ok(Response::new(Box::pin(taken)))
    }

    async fn lend(
        &self,
        request: Request<Streaming<LendRequest>>,
    ) -> Result<Response<LendReply>, Status> {
        let lender = peer_of(caller(&request));
        let mut messages = request.into_inner();
        // Blocks are charged as they arrive, so a lend still arriving counts too.
        let (mut lending, mut blocks) = (None::<(String, Charge)>, Vec::new());
        let mut refused = None;
        while let Some(message) = messages.next().await {
            let LendRequest { lease, block } = message?;
            let (name, charge) =
                lending.get_or_insert_with(|| (lease.clone(), self.leases.lending(&lease, lender)));
            if *name != lease {
                return Err(Status::invalid_argument(
                    "every message of one Lend call names the same lease",
                ));
            }
            let Some(message) = block else {
                return Err(Status::invalid_argument("a Lend message without a block"));
            };
            let hash = message.hash;
            match self.received(message)? {
                Ok(block) => match charge.grow(block.payload.len() as u64) {
                    Ok(()) => blocks.push(block),
                    Err(over) => {
                        refused = Some(self.leases.refuse(Refused::from(over)).to_string())
                    }
                },
                Err(why) => refused = Some(format!("block {hash:016x} refused: {why}")),
            }
            if refused.is_some() {
                break;
            }
        }
        let (name, charge) =
            lending.unwrap_or_else(|| (String::new(), self.leases.lending("", lender)));
        let count = blocks.len() as u64;
        let refused = refused.or_else(|| {
            let lent = self.leases.lend(&name, blocks, charge);
            lent.err().map(|e| e.to_string())
        });
        let lent = if refused.is_some() { 0 } else { count };
        Ok(Response::new(LendReply {
            lent,
            refused,
            expires_in_ms: self.leases.duration().as_millis() as u64,
        }))
    }

    async fn describe(
        &self,
        request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeReply>, Status> {
        let Some(agent) = self.nixl.clone() else {
            return Err(Status::unimplemented(
                "this sidecar has no NIXL agent: fetch the lease with Onboard",
            ));
        };
        let peer = peer_of(caller(&request));
        let chain = chain(&request.get_ref().hashes)?;
        let name = &request.get_ref().lease;
        let held = self.leases.describe(name, peer).map_err(|why| match why {
            NotDescribed::Gone(_) => Status::not_found(why.to_string()),
            NotDescribed::OtherPeer(_) => Status::permission_denied(why.to_string()),
            NotDescribed::Twice(_) => Status::failed_precondition(why.to_string()),
        })?;
        // As Onboard serves a lease: the prefix of the chain asked for that it holds.
        let blocks: Vec<Block> = held
            .into_iter()
            .zip(&chain)
            .take_while(|(block, hash)| block.hash == **hash)
            .map(|(block, _)| block)
            .collect();
        let budget = self.leases.budget().clone();
        let (exposure, reply) =
            tokio::task::spawn_blocking(move || exposure::expose(&agent, &budget, &blocks))
                .await
                .map_err(|e| Status::internal(e.to_string()))??;
        if !self.leases.keep(name, Box::new(exposure)) {
            return Err(Status::not_found(format!("lease {name:?} ended meanwhile")));
        }
        Ok(Response::new(reply))
    }

    async fn open_region(
        &self,
        request: Request<OpenRegionRequest>,
    ) -> Result<Response<OpenRegionReply>, Status> {
        // Shared memory serves the engine beside this sidecar only: a caller elsewhere
        // could not map it, and could only push the engine's regions out.
        if !on_this_host(caller(&request)) {
            return Err(Status::permission_denied(
                "shared memory regions are for the engine on this sidecar's host",
            ));
        }
        let (region_id, path, bytes) = self.regions.create(request.get_ref().bytes)?;
        Ok(Response::new(OpenRegionReply {
            region_id,
            path: path.display().to_string(),
            bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::lease::LeaseMetrics;

    /// (The guard's tests say which addresses are this host's; a real loopback client
    /// gets its region in `tests/block_auth.rs`.)
    #[tokio::test]
    async fn a_caller_the_sidecar_cannot_place_on_its_host_gets_no_shared_memory() {
        let dir = tempfile::tempdir().unwrap();
        let api = BlockApi {
            store: None,
            admission: Arc::default(),
            leases: Leases::new(
                Duration::from_secs(1),
                1 << 20,
                1 << 20,
                LeaseMetrics::default(),
            ),
            regions: Arc::new(Regions {
                dir: Some(dir.path().to_owned()),
                open: Mutex::new(BTreeMap::new()),
                next: AtomicU64::new(1),
            }),
            nixl: None,
            take_timeout: Duration::from_secs(1),
        };
        let refused = api
            .open_region(Request::new(OpenRegionRequest { bytes: 4096 }))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
