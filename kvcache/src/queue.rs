//! Where requests wait while every pod is saturated.
//!
//! Order: higher `priority` first (`nvext.agent_hints.priority`, `DESIGN.md`, "Scheduling
//! (EPP)"), then the policy, then arrival. Keys are fixed at push, so the queue is a
//! sorted map and every operation is O(log n) and deterministic.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueuePolicy {
    /// First come, first served: fair, and bounds every request's wait.
    #[default]
    Fcfs,
    /// Last come, first served: the newest request, whose client is least likely to have
    /// timed out, goes first when the backlog is hopeless.
    Lcfs,
    /// Weighted shortest processing time: largest weight / expected time first, which
    /// minimises the weighted sum of completion times on one machine (Smith's rule,
    /// W. E. Smith, 1956) and so mean latency when weights are equal.
    Wspt,
}

impl QueuePolicy {
    pub const ALL: [QueuePolicy; 3] = [Self::Fcfs, Self::Lcfs, Self::Wspt];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Fcfs => "fcfs",
            Self::Lcfs => "lcfs",
            Self::Wspt => "wspt",
        }
    }
}

impl fmt::Display for QueuePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown queue policy {0:?}: expected fcfs, lcfs or wspt")]
pub struct UnknownQueuePolicy(pub String);

impl FromStr for QueuePolicy {
    type Err = UnknownQueuePolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownQueuePolicy(s.to_owned()))
    }
}

/// Relative cost of a request's work, for WSPT. Units cancel out in the ordering, only
/// the ratio of the two matters; tune it from profiling (prefill throughput in blocks/s
/// against decode speed in tokens/s).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkModel {
    /// Time to prefill one uncached prompt block.
    pub per_uncached_block: f64,
    /// Time to decode one output token.
    pub per_output_token: f64,
}

impl Default for WorkModel {
    /// One uncached 64-token block is taken to cost about one output token: a batched
    /// engine prefills thousands of tokens per iteration and decodes one token per
    /// iteration per request.
    fn default() -> Self {
        Self {
            per_uncached_block: 1.0,
            per_output_token: 1.0,
        }
    }
}

/// A request waiting for a pod, with what the queue needs to order it.
#[derive(Clone, Debug, PartialEq)]
pub struct QueuedRequest<T> {
    pub payload: T,
    /// Higher goes first, whatever the policy.
    pub priority: i32,
    /// Prompt blocks no pod has cached (prompt blocks minus the best overlap).
    pub uncached_blocks: u64,
    /// Requested output length (`max_tokens`).
    pub output_tokens: u64,
    /// WSPT weight; 1.0 when all requests matter equally.
    pub weight: f64,
}

impl<T> QueuedRequest<T> {
    /// A request with priority 0 and weight 1.
    pub fn new(payload: T, uncached_blocks: u64, output_tokens: u64) -> Self {
        Self {
            payload,
            priority: 0,
            uncached_blocks,
            output_tokens,
            weight: 1.0,
        }
    }

    /// Expected processing time under `model`.
    pub fn expected_time(&self, model: &WorkModel) -> f64 {
        model.per_uncached_block * self.uncached_blocks as f64
            + model.per_output_token * self.output_tokens as f64
    }
}

/// Sort key: priority (higher first), policy rank (lower first), arrival number.
type Key = (Reverse<i32>, u64, u64);

/// Handle of a queued request, to cancel it or change its priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket(Key);

/// The queue refused a request because it holds `capacity` already; the request is
/// handed back so the caller can answer 429.
#[derive(Debug, thiserror::Error)]
#[error("waiting queue full at {capacity} requests")]
pub struct QueueFull<T: fmt::Debug> {
    pub capacity: usize,
    pub request: QueuedRequest<T>,
}

/// A bounded, deterministic waiting queue. See the module documentation.
#[derive(Debug)]
pub struct WaitingQueue<T> {
    policy: QueuePolicy,
    model: WorkModel,
    capacity: usize,
    items: BTreeMap<Key, QueuedRequest<T>>,
    arrivals: u64,
}

impl<T: fmt::Debug> WaitingQueue<T> {
    pub fn new(policy: QueuePolicy, model: WorkModel, capacity: usize) -> Self {
        Self {
            policy,
            model,
            capacity,
            items: BTreeMap::new(),
            arrivals: 0,
        }
    }

    pub fn policy(&self) -> QueuePolicy {
        self.policy
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn push(&mut self, request: QueuedRequest<T>) -> Result<Ticket, QueueFull<T>> {
        if self.items.len() >= self.capacity {
            return Err(QueueFull {
                capacity: self.capacity,
                request,
            });
        }
        let arrival = self.arrivals;
        self.arrivals += 1;
        let rank = match self.policy {
            QueuePolicy::Fcfs => 0,
            QueuePolicy::Lcfs => u64::MAX - arrival,
            QueuePolicy::Wspt => {
                // Larger ratio first; a zero-time request has an infinite ratio.
                let ratio = request.weight / request.expected_time(&self.model);
                !ordered_bits(ratio)
            }
        };
        let key = (Reverse(request.priority), rank, arrival);
        self.items.insert(key, request);
        Ok(Ticket(key))
    }

    /// The request that should run next.
    pub fn peek(&self) -> Option<&QueuedRequest<T>> {
        self.items.values().next()
    }

    pub fn pop(&mut self) -> Option<QueuedRequest<T>> {
        self.items.pop_first().map(|(_, r)| r)
    }

    /// Takes a request out (client gone); `None` when it already left.
    pub fn cancel(&mut self, ticket: Ticket) -> Option<QueuedRequest<T>> {
        self.items.remove(&ticket.0)
    }

    /// Gives a waiting request a new priority; it keeps its policy rank and arrival
    /// among requests of that priority. Returns its new ticket.
    pub fn set_priority(&mut self, ticket: Ticket, priority: i32) -> Option<Ticket> {
        let mut request = self.items.remove(&ticket.0)?;
        request.priority = priority;
        let (_, rank, arrival) = ticket.0;
        let key = (Reverse(priority), rank, arrival);
        self.items.insert(key, request);
        Some(Ticket(key))
    }
}

/// Maps an `f64` to a `u64` with the same order (NaN above +inf).
fn ordered_bits(x: f64) -> u64 {
    let bits = x.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain<T: fmt::Debug + Copy>(q: &mut WaitingQueue<T>) -> Vec<T> {
        std::iter::from_fn(|| q.pop().map(|r| r.payload)).collect()
    }

    fn queue(policy: QueuePolicy) -> WaitingQueue<&'static str> {
        WaitingQueue::new(policy, WorkModel::default(), 10)
    }

    #[test]
    fn fcfs_and_lcfs_follow_arrival() {
        for (policy, expected) in [
            (QueuePolicy::Fcfs, ["a", "b", "c"]),
            (QueuePolicy::Lcfs, ["c", "b", "a"]),
        ] {
            let mut q = queue(policy);
            for name in ["a", "b", "c"] {
                q.push(QueuedRequest::new(name, 1, 1)).unwrap();
            }
            assert_eq!(drain(&mut q), expected, "{policy}");
        }
    }

    #[test]
    fn wspt_runs_short_and_heavy_work_first() {
        let mut q = queue(QueuePolicy::Wspt);
        // Expected times (1 per block, 1 per token): long 10+90 = 100, short 2+8 = 10,
        // mid 20+30 = 50 but weight 10 -> ratio 0.2 beats short's 0.1.
        q.push(QueuedRequest::new("long", 10, 90)).unwrap();
        q.push(QueuedRequest::new("short", 2, 8)).unwrap();
        q.push(QueuedRequest {
            weight: 10.0,
            ..QueuedRequest::new("mid-heavy", 20, 30)
        })
        .unwrap();
        q.push(QueuedRequest::new("short-too", 5, 5)).unwrap(); // ties with short: arrival
        assert_eq!(drain(&mut q), ["mid-heavy", "short", "short-too", "long"]);
    }

    #[test]
    fn priority_moves_a_request_ahead_under_every_policy() {
        for policy in QueuePolicy::ALL {
            let mut q = queue(policy);
            q.push(QueuedRequest::new("a", 1, 1)).unwrap();
            let late = q.push(QueuedRequest::new("vip", 50, 500)).unwrap();
            q.push(QueuedRequest::new("b", 1, 1)).unwrap();
            q.set_priority(late, 5).unwrap();
            assert_eq!(q.peek().unwrap().payload, "vip", "{policy}");
            q.push(QueuedRequest {
                priority: 9,
                ..QueuedRequest::new("vvip", 1, 1)
            })
            .unwrap();
            assert_eq!(drain(&mut q)[..2], ["vvip", "vip"], "{policy}");
        }
    }

    #[test]
    fn full_queue_hands_the_request_back_and_cancel_removes() {
        let mut q = WaitingQueue::new(QueuePolicy::Fcfs, WorkModel::default(), 2);
        let a = q.push(QueuedRequest::new("a", 1, 1)).unwrap();
        q.push(QueuedRequest::new("b", 1, 1)).unwrap();
        let err = q.push(QueuedRequest::new("c", 1, 1)).unwrap_err();
        assert_eq!((err.capacity, err.request.payload), (2, "c"));
        assert_eq!(q.cancel(a).unwrap().payload, "a");
        assert!(q.cancel(a).is_none());
        assert_eq!(drain(&mut q), ["b"]);
    }

    #[test]
    fn policies_parse() {
        for p in QueuePolicy::ALL {
            assert_eq!(p.to_string().parse::<QueuePolicy>().unwrap(), p);
        }
        assert_eq!("WSPT".parse::<QueuePolicy>().unwrap(), QueuePolicy::Wspt);
        assert!("sjf".parse::<QueuePolicy>().is_err());
    }

    #[test]
    fn ordered_bits_keep_float_order() {
        let xs = [
            f64::NEG_INFINITY,
            -2.0,
            -0.0,
            0.0,
            1e-300,
            0.5,
            3.0,
            f64::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(ordered_bits(w[0]) <= ordered_bits(w[1]), "{w:?}");
        }
    }
}
