//! The lease budget (`--kv-lease-bytes`): the block bytes the sidecar holds for peers
//! outside its tiers, in all and per peer. A peer is the address whose request made the
//! bytes be held; its share (`--kv-lease-bytes-per-peer`) keeps one peer's junk from
//! leaving no room for the others'.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::metrics::gauge::Gauge;

/// Why bytes were not charged.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OverBudget {
    #[error("{bytes} bytes would pass the lease budget of {budget} bytes ({held} held)")]
    Total { bytes: u64, held: u64, budget: u64 },
    #[error(
        "{bytes} bytes would pass {peer}'s share of the lease budget, {share} bytes ({held} held)"
    )]
    Peer {
        peer: IpAddr,
        bytes: u64,
        held: u64,
        share: u64,
    },
}

/// The peer of a client at `addr` (its IP; IPv4 mapped into IPv6 as plain IPv4), or the
/// unspecified address for a client whose address is not known.
pub fn peer_of(addr: Option<SocketAddr>) -> IpAddr {
    addr.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |addr| {
        addr.ip().to_canonical()
    })
}

/// Cheap to clone: clones share the account.
#[derive(Clone, Debug)]
pub struct LeaseBudget(Arc<Account>);

#[derive(Debug)]
struct Account {
    budget: u64,
    share: u64,
    held: Mutex<Held>,
    /// `dynamo_sidecar_kv_lease_bytes`: every charge, as it changes.
    gauge: Gauge,
}

#[derive(Debug, Default)]
struct Held {
    bytes: u64,
    by_peer: HashMap<IpAddr, u64>,
}

/// Bytes charged to the budget and to a peer's share until dropped.
#[derive(Debug)]
pub struct Charge {
    account: Arc<Account>,
    peer: IpAddr,
    bytes: u64,
}

impl LeaseBudget {
    /// `budget` bytes in all, `share` of them at most for one peer; `gauge` shows what
    /// is held.
    pub fn new(budget: u64, share: u64, gauge: Gauge) -> Self {
        Self(Arc::new(Account {
            budget,
            share,
            held: Mutex::default(),
            gauge,
        }))
    }

    pub fn budget(&self) -> u64 {
        self.0.budget
    }

    /// Bytes held now, in all.
    pub fn held(&self) -> u64 {
        self.0.held().bytes
    }

    /// `bytes` charged to `peer`, if both the budget and the peer's share have room.
    pub fn charge(&self, peer: IpAddr, bytes: u64) -> Result<Charge, OverBudget> {
        let mut charge = Charge {
            account: self.0.clone(),
            peer,
            bytes: 0,
        };
        charge.grow(bytes)?;
        Ok(charge)
    }
}

impl Account {
    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Charge {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Charges `bytes` more, or nothing if they do not fit.
    pub fn grow(&mut self, bytes: u64) -> Result<(), OverBudget> {
        let account = &self.account;
        let mut held = account.held();
        let peer_held = held.by_peer.get(&self.peer).copied().unwrap_or(0);
        if held.bytes + bytes > account.budget {
            return Err(OverBudget::Total {
                bytes,
                held: held.bytes,
                budget: account.budget,
            });
        }
        if peer_held + bytes > account.share {
            return Err(OverBudget::Peer {
                peer: self.peer,
                bytes,
                held: peer_held,
                share: account.share,
            });
        }
        held.bytes += bytes;
        *held.by_peer.entry(self.peer).or_default() += bytes;
        account.gauge.set(held.bytes as i64);
        self.bytes += bytes;
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut held = self.account.held();
        held.bytes -= self.bytes;
        if let Some(peer_held) = held.by_peer.get_mut(&self.peer) {
            *peer_held -= self.bytes;
            if *peer_held == 0 {
                held.by_peer.remove(&self.peer);
            }
        }
        self.account.gauge.set(held.bytes as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn a_peer_gets_its_share_and_the_others_the_rest() {
        let gauge = Gauge::default();
        let budget = LeaseBudget::new(100, 40, gauge.clone());
        let a = budget.charge(A, 30).unwrap();
        assert_eq!(
            budget.charge(A, 20).unwrap_err(),
            OverBudget::Peer {
                peer: A,
                bytes: 20,
                held: 30,
                share: 40
            }
        );
        let mut b = budget.charge(B, 40).unwrap();
        let c = budget.charge(IpAddr::from([10, 0, 0, 3]), 30).unwrap();
        assert_eq!(gauge.get(), 100);
        assert_eq!(
            b.grow(1).unwrap_err(),
            OverBudget::Total {
                bytes: 1,
                held: 100,
                budget: 100
            }
        );
        drop((a, c));
        assert_eq!((budget.held(), gauge.get()), (40, 40));
        b.grow(0).unwrap();
        drop(b);
        assert_eq!(budget.held(), 0);
        assert!(budget.0.held().by_peer.is_empty(), "no peer is left behind");
    }
}
