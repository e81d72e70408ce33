//! The frontend's HTTP connections to the pods (their sidecars): a pool per pod of
//! connections driven by the answers' bodies ([`dynamo_server::upstream`]), so an answer's
//! frames that arrived together reach the client together, without a hand-over between
//! a connection task and the request's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynamo_server::upstream::{Timeouts, Upstream};

/// A pod that does not accept within 2 s is tried no longer (the request goes to
/// another); idle connections are kept 90 s, under the 120 s our servers keep them
/// (`dynamo_server::ServerLimits::idle_timeout`).
const TIMEOUTS: Timeouts = Timeouts {
    connect: Duration::from_secs(2),
    idle: Duration::from_secs(90),
};

#[derive(Default)]
pub struct PodConnections {
    pools: Mutex<HashMap<SocketAddr, Arc<Upstream>>>,
}

impl PodConnections {
    /// The connections to the pod at `address`.
    pub fn to(&self, address: SocketAddr) -> Arc<Upstream> {
        let mut pools = self.pools.lock().expect("not poisoned");
        if let Some(pool) = pools.get(&address) {
            return pool.clone();
        }
        // Pools of pods that left go once no request holds them and their idle
        // connections have expired.
        pools.retain(|_, pool| Arc::strong_count(pool) > 1 || pool.has_idle());
        let pool = Arc::new(Upstream::at_address(address, TIMEOUTS));
        pools.insert(address, pool.clone());
        pool
    }

    /// Pods with a pool.
    #[cfg(test)]
    fn pods(&self) -> usize {
        self.pools.lock().expect("not poisoned").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_keeps_its_pool_and_a_pool_no_one_holds_goes_with_a_new_pod() {
        let connections = PodConnections::default();
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let held = connections.to(a);
        assert!(Arc::ptr_eq(&held, &connections.to(a)));
        assert_eq!(held.authority(), "127.0.0.1:1");
        // Held by a request: kept when another pod comes.
        connections.to("127.0.0.1:2".parse().unwrap());
        assert_eq!(connections.pods(), 2);
        // Neither held nor with an idle connection: both go when a third comes.
        drop(held);
        connections.to("127.0.0.1:3".parse().unwrap());
        assert_eq!(connections.pods(), 1);
    }
}
