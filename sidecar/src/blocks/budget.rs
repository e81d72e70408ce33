//! The lease budget (`--kv-lease-bytes`): the block bytes the sidecar holds for clients
//! outside its tiers, in all and per peer: leases, lends still arriving, and answers'
//! blocks on their way out. A lease's peer is the address whose request made it; its
//! share (`--kv-lease-bytes-per-peer`) keeps one peer's junk from leaving no room for
//! the others'. An answer's blocks are charged to no peer's share, only to the budget.

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

/// Bytes charged to the budget (and to a peer's share) until dropped.
#[derive(Debug)]
pub struct Charge {
    account: Arc<Account>,
    peer: Option<IpAddr>,
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

    /// Bytes held now, in all.
    pub fn held(&self) -> u64 {
        self.0.held().bytes
    }

    /// `bytes` charged to `peer` (none: to the budget only), if both the budget and the
    /// peer's share have room.
    pub fn charge(&self, peer: Option<IpAddr>, bytes: u64) -> Result<Charge, OverBudget> {
        let mut charge = self.open(peer);
        charge.grow(bytes)?;
        Ok(charge)
    }

    /// A charge to `peer` of nothing yet, to [`Charge::grow`].
    pub fn open(&self, peer: Option<IpAddr>) -> Charge {
        Charge {
            account: self.0.clone(),
            peer,
            bytes: 0,
        }
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

    /// The peer whose share it is charged to, if any.
    pub fn peer(&self) -> Option<IpAddr> {
        self.peer
    }

    /// Charges `bytes` more, or nothing if they do not fit.
    pub fn grow(&mut self, bytes: u64) -> Result<(), OverBudget> {
        let account = &self.account;
        let mut held = account.held();
        if held.bytes + bytes > account.budget {
            return Err(OverBudget::Total {
                bytes,
                held: held.bytes,
                budget: account.budget,
            });
        }
        if let Some(peer) = self.peer {
            let peer_held = held.by_peer.get(&peer).copied().unwrap_or(0);
            if peer_held + bytes > account.share {
                return Err(OverBudget::Peer {
                    peer,
                    bytes,
                    held: peer_held,
                    share: account.share,
                });
            }
            held.by_peer.insert(peer, peer_held + bytes);
        }
        held.bytes += bytes;
        account.gauge.set(held.bytes as i64);
        self.bytes += bytes;
        Ok(())
    }

    /// `bytes` of this charge (at most all of it) as a charge of its own, to go with
    /// part of what it pays for.
    pub fn split_off(&mut self, bytes: u64) -> Charge {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Charge {
            account: self.account.clone(),
            peer: self.peer,
            bytes,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut held = self.account.held();
        held.bytes -= self.bytes;
        if let Some(peer) = self.peer
            && let Some(peer_held) = held.by_peer.get_mut(&peer)
        {
            *peer_held -= self.bytes;
            if *peer_held == 0 {
                held.by_peer.remove(&peer);
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
        let a = budget.charge(Some(A), 30).unwrap();
        assert_eq!(
            budget.charge(Some(A), 20).unwrap_err(),
            OverBudget::Peer {
                peer: A,
                bytes: 20,
                held: 30,
                share: 40
            }
        );
        let mut b = budget.charge(Some(B), 40).unwrap();
        let c = budget.charge(None, 30).unwrap();
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
        let part = b.split_off(15);
        drop(b);
        assert_eq!(
            (part.bytes(), budget.held()),
            (15, 15),
            "the part still held"
        );
        assert!(budget.charge(Some(B), 26).is_err(), "and still B's");
        drop(part);
        assert_eq!(budget.held(), 0);
        assert!(budget.0.held().by_peer.is_empty(), "no peer is left behind");
    }
}
