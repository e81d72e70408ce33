//! Leases (`DESIGN.md`, "Disaggregated request"): blocks held for one remote decode,
//! outside the tiers, until fetched, released or expired. A prefill pod's sidecar holds
//! what its engine lent until the decode pod's sidecar fetches it; the decode pod's
//! sidecar holds what it fetched until its engine onboards it. Expiry means no block is
//! ever stranded by a decode that was cancelled or died; a byte budget bounds what all
//! leases hold at once, and what those of one peer hold (`super::budget`), and a lease
//! past either is refused whole.
//!
//! A lease is charged to the peer whose request made it. On a prefill pod that is the
//! client of the prefill leg, which [`Leases::claim`]s the lease its engine will lend
//! under the leg's request id; otherwise the caller that lends it. The charge runs from
//! the first block of a `Lend` to the last block of the fetch's answer taken.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dynamo_kvblocks::Block;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::budget::{Charge, LeaseBudget, OverBudget};
use crate::metrics::{Label, Metrics};

/// How a lease ended, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Fetched,
    Released,
    Expired,
}

impl Ended {
    fn label(self) -> Label {
        let how = match self {
            Ended::Fetched => "fetched",
            Ended::Released => "released",
            Ended::Expired => "expired",
        };
        [("how", how)]
    }
}

/// Why a lease was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
    #[error("lease {0:?} is already held")]
    InUse(String),
    #[error("a lease needs a name")]
    Unnamed,
}

impl Refused {
    fn label(&self) -> Label {
        let reason = match self {
            Refused::OverBudget(OverBudget::Total { .. }) => "over_budget",
            Refused::OverBudget(OverBudget::Peer { .. }) => "peer_over_budget",
            Refused::InUse(_) => "in_use",
            Refused::Unnamed => "unnamed",
        };
        [("reason", reason)]
    }
}

#[derive(Clone, Debug, Default)]
pub struct LeaseMetrics {
    /// Leases held now, and their bytes.
    pub held: Gauge,
    pub held_bytes: Gauge,
    /// Leases taken, and refused by `reason` (`over_budget`, `peer_over_budget`,
    /// `in_use`, `unnamed`).
    pub lent: Counter,
    pub refused: Family<Label, Counter>,
    /// Leases ended, by `how` (`fetched`, `released`, `expired`).
    pub ended: Family<Label, Counter>,
    /// Block API answers whose client stopped taking their blocks, cut.
    pub answers_cut: Counter,
}

impl LeaseMetrics {
    pub fn register(metrics: &mut Metrics) -> Self {
        let m = Self::default();
        let r = metrics.registry();
        r.register(
            "kv_leases",
            "Leases of KV blocks held for a remote decode",
            m.held.clone(),
        );
        r.register(
            "kv_lease_bytes",
            "Payload bytes held under the lease budget: leases, lends arriving, answers' blocks on their way",
            m.held_bytes.clone(),
        );
        r.register("kv_leases_lent", "Leases taken", m.lent.clone());
        r.register(
            "kv_leases_refused",
            "Leases refused, by reason (over the budget or the peer's share of it, a name in use)",
            m.refused.clone(),
        );
        r.register(
            "kv_leases_ended",
            "Leases ended, by how (fetched, released, expired)",
            m.ended.clone(),
        );
        r.register(
            "kv_answers_cut",
            "Block API answers whose client stopped taking their blocks, cut with its connection",
            m.answers_cut.clone(),
        );
        m
    }
}

/// Why a lease's blocks are not described for reading over NIXL.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NotDescribed {
    #[error("lease {0:?} is gone (expired, fetched or never lent): recompute")]
    Gone(String),
    #[error("lease {0:?} is not this peer's")]
    OtherPeer(String),
    #[error("lease {0:?} is described already")]
    Twice(String),
}

/// Every lease of one sidecar. Cheap to clone: clones share the table.
#[derive(Clone)]
pub struct Leases {
    inner: Arc<Mutex<Table>>,
    duration: Duration,
    budget: LeaseBudget,
    metrics: LeaseMetrics,
}

#[derive(Default)]
struct Table {
    leases: HashMap<String, Lease>,
    /// The peer each lease about to be lent is charged to, by lease name.
    claims: HashMap<String, IpAddr>,
}

struct Lease {
    blocks: Vec<Block>,
    /// The blocks' bytes.
    charge: Charge,
    expires: Instant,
    /// Described for a NIXL read (once).
    described: bool,
    /// What the description keeps alive while the lease lives (its exposed memory).
    kept: Option<Box<dyn Send>>,
}

/// A lease name claimed for a peer, until dropped.
pub struct Claim {
    leases: Leases,
    name: String,
}

impl Leases {
    /// Leases that last `duration` unless fetched, holding at most `budget` bytes, and
    /// at most `peer_share` of them for one peer.
    pub fn new(duration: Duration, budget: u64, peer_share: u64, metrics: LeaseMetrics) -> Self {
        Self {
            inner: Arc::default(),
            duration,
            budget: LeaseBudget::new(budget, peer_share, metrics.held_bytes.clone()),
            metrics,
        }
    }

    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// The budget every lease, lend and answer is charged to.
    pub fn budget(&self) -> &LeaseBudget {
        &self.budget
    }

    pub fn metrics(&self) -> &LeaseMetrics {
        &self.metrics
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Charges the lease that will be lent as `name` to `peer` while the claim lives
    /// (a prefill leg's request id, for its client); `None` if `name` is claimed already.
    pub fn claim(&self, name: &str, peer: IpAddr) -> Option<Claim> {
        let mut table = self.table();
        if table.claims.contains_key(name) {
            return None;
        }
        table.claims.insert(name.to_owned(), peer);
        Some(Claim {
            leases: self.clone(),
            name: name.to_owned(),
        })
    }

    /// A charge, empty so far, for the blocks of the lease to be lent as `name`: to the
    /// peer that claimed `name`, else to `lender`. It grows as they arrive.
    pub fn lending(&self, name: &str, lender: IpAddr) -> Charge {
        let peer = self.table().claims.get(name).copied().unwrap_or(lender);
        self.budget.open(Some(peer))
    }

    /// Holds `blocks` under `name` until fetched, released or expired; `charge` (from
    /// [`Self::lending`]) grows to their bytes if short of them.
    pub fn lend(&self, name: &str, blocks: Vec<Block>, charge: Charge) -> Result<(), Refused> {
        let result = self.try_lend(name, blocks, charge);
        match result {
            Ok(()) => {
                self.metrics.lent.inc();
                Ok(())
            }
            Err(refused) => Err(self.refuse(refused)),
        }
    }

    /// Counts a lease refused.
    pub fn refuse(&self, why: Refused) -> Refused {
        self.metrics.refused.get_or_create(&why.label()).inc();
        why
    }

    fn try_lend(&self, name: &str, blocks: Vec<Block>, mut charge: Charge) -> Result<(), Refused> {
        if name.is_empty() {
            return Err(Refused::Unnamed);
        }
        let bytes: u64 = blocks.iter().map(|b| b.payload.len() as u64).sum();
        charge.grow(bytes.saturating_sub(charge.bytes()))?;
        let mut table = self.table();
        if table.leases.contains_key(name) {
            return Err(Refused::InUse(name.to_owned()));
        }
        let expires = Instant::now() + self.duration;
        table.leases.insert(
            name.to_owned(),
            Lease {
                blocks,
                charge,
                expires,
                described: false,
                kept: None,
            },
        );
        self.publish(&table);
        Ok(())
    }

    /// Ends the lease and hands over its blocks, with their charge (held until they are
    /// sent); `None` when it is gone (never lent, fetched, released or expired).
    pub fn fetch(&self, name: &str) -> Option<(Vec<Block>, Charge)> {
        let lease = self.end(name, Instant::now(), Ended::Fetched)?;
        Some((lease.blocks, lease.charge))
    }

    /// The blocks of lease `name` for `peer` to read some other way than `Onboard`
    /// ([`Self::keep`] what makes them readable): only for the peer the lease is charged
    /// to, once, while the lease lives. The lease stays held.
    pub fn describe(&self, name: &str, peer: IpAddr) -> Result<Vec<Block>, NotDescribed> {
        let mut table = self.table();
        let lease = match table.leases.get_mut(name) {
            Some(lease) if lease.expires > Instant::now() => lease,
            _ => return Err(NotDescribed::Gone(name.to_owned())),
        };
        if lease.charge.peer() != Some(peer) {
            return Err(NotDescribed::OtherPeer(name.to_owned()));
        }
        if std::mem::replace(&mut lease.described, true) {
            return Err(NotDescribed::Twice(name.to_owned()));
        }
        Ok(lease.blocks.clone())
    }

    /// Keeps `kept` until lease `name` ends; false (and `kept` dropped) if it has
    /// ended already.
    pub fn keep(&self, name: &str, kept: Box<dyn Send>) -> bool {
        match self.table().leases.get_mut(name) {
            Some(lease) => {
                lease.kept = Some(kept);
                true
            }
            None => false,
        }
    }

    /// Ends the lease without using it (its holder no longer wants the blocks).
    pub fn release(&self, name: &str) -> bool {
        self.end(name, Instant::now(), Ended::Released).is_some()
    }

    fn end(&self, name: &str, now: Instant, how: Ended) -> Option<Lease> {
        let mut table = self.table();
        let lease = table.leases.remove(name)?;
        self.publish(&table);
        drop(table);
        // A lease past its time is gone even if the sweep has not reached it yet.
        if lease.expires <= now {
            self.metrics
                .ended
                .get_or_create(&Ended::Expired.label())
                .inc();
            return None;
        }
        self.metrics.ended.get_or_create(&how.label()).inc();
        Some(lease)
    }

    /// Ends every lease whose time is up by `now`; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let mut table = self.table();
        let expired: Vec<String> = table
            .leases
            .iter()
            .filter(|(_, l)| l.expires <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for name in &expired {
            // Its charge is given back as it drops (the budget has a lock of its own).
            let lease = table.leases.remove(name).expect("listed");
            tracing::info!(
                lease = %name,
                blocks = lease.blocks.len(),
                "releasing expired KV blocks: no decode fetched them within {:?}",
                self.duration
            );
        }
        self.publish(&table);
        let n = expired.len();
        self.metrics
            .ended
            .get_or_create(&Ended::Expired.label())
            .inc_by(n as u64);
        n
    }

    /// Sweeps expired leases until the table is dropped everywhere else.
    pub async fn sweep(self) {
        // Often enough that a lease outlives its duration by a quarter at most.
        let period = (self.duration / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.expire(Instant::now());
        }
    }

    /// Leases held now, and the bytes the lease budget holds.
    pub fn held(&self) -> (usize, u64) {
        let leases = self.table().leases.len();
        (leases, self.budget.held())
    }

    fn publish(&self, table: &Table) {
        self.metrics.held.set(table.leases.len() as i64);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.leases.table().claims.remove(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::test_block;

    const ENGINE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 7));

    fn leases(duration_ms: u64, budget: u64) -> Leases {
        Leases::new(
            Duration::from_millis(duration_ms),
            budget,
            budget,
            LeaseMetrics::default(),
        )
    }

    /// Lends `blocks` as the engine on this host does.
    fn lend(l: &Leases, name: &str, blocks: Vec<Block>) -> Result<(), Refused> {
        l.lend(name, blocks, l.lending(name, ENGINE))
    }

    fn ended(l: &Leases, how: Ended) -> u64 {
        l.metrics.ended.get_or_create(&how.label()).get()
    }

    #[test]
    fn a_lease_is_fetched_once_then_gone() {
        let l = leases(60_000, 1 << 20);
        let blocks = vec![
            test_block(1, None, b"abcd"),
            test_block(2, Some(1), b"efgh"),
        ];
        lend(&l, "r1", blocks.clone()).unwrap();
        assert_eq!(l.held(), (1, 8));
        let (fetched, charge) = l.fetch("r1").unwrap();
        assert_eq!((fetched, charge.bytes()), (blocks, 8));
        assert!(l.fetch("r1").is_none(), "a fetched lease is gone");
        assert_eq!(l.held(), (0, 8), "charged until sent");
        drop(charge);
        assert_eq!(l.held(), (0, 0));
        assert_eq!(ended(&l, Ended::Fetched), 1);
        assert!(!l.release("r1"));
    }

    #[test]
    fn leases_past_the_budget_or_with_a_taken_name_are_refused_whole() {
        let l = leases(60_000, 10);
        lend(&l, "a", vec![test_block(1, None, b"abcdef")]).unwrap();
        let err = lend(&l, "b", vec![test_block(2, None, b"ghijkl")]).unwrap_err();
        let over = OverBudget::Total {
            bytes: 6,
            held: 6,
            budget: 10,
        };
        assert_eq!(err, Refused::OverBudget(over));
        let err = lend(&l, "a", vec![test_block(3, None, b"x")]).unwrap_err();
        assert_eq!(err, Refused::InUse("a".into()));
        assert_eq!(lend(&l, "", vec![]), Err(Refused::Unnamed));
        assert_eq!(l.held(), (1, 6), "refused leases hold nothing");
        assert!(l.release("a"));
        lend(&l, "b", vec![test_block(2, None, b"ghijkl")]).unwrap();
        assert_eq!(l.metrics.lent.get(), 2);
        for (reason, n) in [("over_budget", 1), ("in_use", 1), ("unnamed", 1)] {
            let refused = l.metrics.refused.get_or_create(&[("reason", reason)]);
            assert_eq!(refused.get(), n, "{reason}");
        }
        assert_eq!(ended(&l, Ended::Released), 1);
    }

    #[test]
    fn a_lease_is_charged_to_the_peer_that_claimed_its_name() {
        let l = Leases::new(Duration::from_secs(60), 12, 6, LeaseMetrics::default());
        let first = l.claim("leg-1", PEER).unwrap();
        assert!(l.claim("leg-1", ENGINE).is_none(), "one claim a name");
        lend(&l, "leg-1", vec![test_block(1, None, b"abcdef")]).unwrap();
        let second = l.claim("leg-2", PEER).unwrap();
        let err = lend(&l, "leg-2", vec![test_block(2, None, b"g")]).unwrap_err();
        assert!(
            matches!(
                err,
                Refused::OverBudget(OverBudget::Peer { peer: PEER, .. })
            ),
            "{err}"
        );
        lend(&l, "own", vec![test_block(3, None, b"h")]).unwrap();
        assert_eq!(l.held(), (2, 7), "the lender's own lease had room");
        drop((first, second));
        assert!(l.table().claims.is_empty());
    }

    #[test]
    fn a_lease_is_described_once_for_its_own_peer_while_it_lives() {
        let l = leases(50, 1 << 20);
        let claim = l.claim("leg", PEER).unwrap();
        lend(&l, "leg", vec![test_block(1, None, b"ab")]).unwrap();
        let other = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 8));
        let not = |name: &str| NotDescribed::OtherPeer(name.into());
        assert_eq!(l.describe("leg", other), Err(not("leg")));
        assert_eq!(l.describe("leg", PEER).unwrap().len(), 1);
        assert_eq!(
            l.describe("leg", PEER),
            Err(NotDescribed::Twice("leg".into()))
        );
        let dropped = std::sync::Arc::new(());
        assert!(l.keep("leg", Box::new(dropped.clone())));
        assert_eq!(std::sync::Arc::strong_count(&dropped), 2);
        assert!(
            l.fetch("leg").is_some(),
            "a described lease is still fetched"
        );
        assert_eq!(
            std::sync::Arc::strong_count(&dropped),
            1,
            "kept until it ends"
        );
        assert!(!l.keep("leg", Box::new(())));
        assert_eq!(
            l.describe("unknown", PEER),
            Err(NotDescribed::Gone("unknown".into()))
        );
        drop(claim);
        lend(&l, "late", vec![test_block(2, None, b"cd")]).unwrap();
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(
            l.describe("late", ENGINE),
            Err(NotDescribed::Gone("late".into()))
        );
    }

    #[test]
    fn expired_leases_are_gone_swept_or_not() {
        let l = leases(50, 1 << 20);
        lend(&l, "swept", vec![test_block(1, None, b"ab")]).unwrap();
        lend(&l, "late", vec![test_block(2, None, b"cd")]).unwrap();
        let later = Instant::now() + Duration::from_millis(51);
        // Fetching after expiry, before a sweep: gone, and counted as expired.
        assert!(l.end("late", later, Ended::Fetched).is_none());
        assert_eq!(l.expire(later), 1);
        assert_eq!(l.held(), (0, 0));
        assert_eq!(ended(&l, Ended::Expired), 2);
        assert_eq!(ended(&l, Ended::Fetched), 0);
    }
}
