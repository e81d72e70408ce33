//! KV events as the router sees them, after the sidecar has replaced the engine's block
//! hashes by our own chained sequence hashes (`DESIGN.md`, "Sidecar -> EPP: KV event
//! stream"). The engine's hash travels along only as an opaque key.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::SeqHash;

/// Where a pod holds a block. Lower tiers are slower to bring back into GPU memory, so a
/// router credits a hit there less than a GPU hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// G1: the engine's own GPU KV cache; a hit costs nothing.
    Gpu,
    /// G2: pinned host memory, one PCIe copy away.
    Host,
    /// G3: local disk (NVMe).
    Disk,
    /// G4: S3-compatible object store, a network round trip per block.
    Object,
}

impl Tier {
    /// Every tier, best (fastest) first; `Tier::ALL[t.index()] == t`.
    pub const ALL: [Tier; 4] = [Tier::Gpu, Tier::Host, Tier::Disk, Tier::Object];

    /// Position in [`Tier::ALL`], usable as an array index.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Default overlap credit of a hit in this tier: 1.0 GPU, 0.75 host, 0.25 disk
    /// (`DESIGN.md`, "Scheduling (EPP)"), and 0.1 object store. The object value is our
    /// choice: fetching a block from S3 costs a network round trip plus a disk-like copy,
    /// so it must be credited below disk, yet above zero because it still saves the
    /// block's prefill compute when the store is near (same region).
    pub const fn default_credit(self) -> f64 {
        match self {
            Tier::Gpu => 1.0,
            Tier::Host => 0.75,
            Tier::Disk => 0.25,
            Tier::Object => 0.1,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::Gpu => "gpu",
            Tier::Host => "host",
            Tier::Disk => "disk",
            Tier::Object => "object",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tier name that is not one of `gpu`, `host`, `disk`, `object`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tier {0:?}: expected gpu, host, disk or object")]
pub struct UnknownTier(pub String);

impl FromStr for Tier {
    type Err = UnknownTier;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownTier(s.to_owned()))
    }
}

/// One block of a [`KvEvent::Stored`] event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StoredBlock {
    pub seq_hash: SeqHash,
    /// The engine's own key for the block; meaningful only to that engine.
    pub engine_hash: u64,
    pub tier: Tier,
}

/// One block of a [`KvEvent::Removed`] event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemovedBlock {
    pub seq_hash: SeqHash,
    pub engine_hash: u64,
}

/// A change of one pod's KV cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KvEvent {
    /// `blocks` were stored as a chain: `blocks[0]` under `parent` (`None`: it is the
    /// first block of a sequence), every later block under the one before it.
    Stored {
        parent: Option<SeqHash>,
        blocks: Vec<StoredBlock>,
    },
    /// `blocks` left `tier` (they may still be held in another tier).
    Removed {
        blocks: Vec<RemovedBlock>,
        tier: Tier,
    },
    /// The pod dropped every block in every tier (engine restart, cache reset).
    Cleared,
}

/// A [`KvEvent`] with its place in one pod's stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEventEnvelope {
    /// Identifies one start of the pod's sidecar; a new value means the event ids start
    /// over and the subscriber's view of the pod is void.
    pub instance_id: u64,
    /// Monotonic per pod and per `instance_id`, with no holes: each event is the
    /// previous one plus one.
    pub event_id: u64,
    pub event: KvEvent,
}

/// What a subscriber must do with the next envelope of a pod's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Continuity {
    /// The expected next event: apply it.
    Next,
    /// Already applied (a redelivery after reconnecting): skip it.
    Duplicate,
    /// Events `expected..got` were lost: the view of the pod is stale; resubscribe and
    /// take a snapshot.
    Gap { expected: u64, got: u64 },
    /// The sidecar restarted (or this is the first envelope): drop the pod's blocks and
    /// rebuild from this stream, which starts with a snapshot.
    NewInstance,
}

/// Tracks one pod's stream so gaps are detected, never silently ignored
/// (`DESIGN.md`, "Sidecar -> EPP: KV event stream").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamCursor {
    last: Option<(u64, u64)>,
}

impl StreamCursor {
    /// The `(instance_id, event_id)` of the last accepted envelope.
    pub fn last(&self) -> Option<(u64, u64)> {
        self.last
    }

    /// Classifies `envelope` and, unless it is a duplicate or follows a gap, accepts it as
    /// the new position. After a `Gap` the cursor stays where it was, so every later
    /// envelope keeps reporting the gap until the caller [`reset`](Self::reset)s it.
    pub fn advance(&mut self, envelope: &KvEventEnvelope) -> Continuity {
        let here = (envelope.instance_id, envelope.event_id);
        let verdict = match self.last {
            Some((instance, last_id)) if instance == envelope.instance_id => {
                match envelope.event_id {
                    id if id <= last_id => Continuity::Duplicate,
                    id if id == last_id + 1 => Continuity::Next,
                    got => Continuity::Gap {
                        expected: last_id + 1,
                        got,
                    },
                }
            }
            _ => Continuity::NewInstance,
        };
        if matches!(verdict, Continuity::Next | Continuity::NewInstance) {
            self.last = Some(here);
        }
        verdict
    }

    /// Sets the position to a snapshot's: `event_id` is the last event it includes.
    pub fn restart_at(&mut self, instance_id: u64, event_id: u64) {
        self.last = Some((instance_id, event_id));
    }

    /// Forgets the position, e.g. before resubscribing after a gap.
    pub fn reset(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(instance_id: u64, event_id: u64) -> KvEventEnvelope {
        KvEventEnvelope {
            instance_id,
            event_id,
            event: KvEvent::Cleared,
        }
    }

    #[test]
    fn tiers_parse_case_insensitively_and_credit_decreases() {
        assert_eq!("GPU".parse::<Tier>().unwrap(), Tier::Gpu);
        assert_eq!("object".parse::<Tier>().unwrap(), Tier::Object);
        assert!("tape".parse::<Tier>().is_err());
        for pair in Tier::ALL.windows(2) {
            assert!(pair[0].default_credit() > pair[1].default_credit());
        }
        for (i, t) in Tier::ALL.into_iter().enumerate() {
            assert_eq!(t.index(), i);
        }
    }

    #[test]
    fn events_round_trip_through_json() {
        let event = KvEventEnvelope {
            instance_id: 7,
            event_id: 3,
            event: KvEvent::Stored {
                parent: Some(SeqHash(1)),
                blocks: vec![StoredBlock {
                    seq_hash: SeqHash(2),
                    engine_hash: 99,
                    tier: Tier::Host,
                }],
            },
        };
        let json = serde_json::to_string(&event).unwrap();
        assert!(json.contains(r#""type":"stored""#), "{json}");
        assert!(json.contains(r#""tier":"host""#), "{json}");
        assert_eq!(
            serde_json::from_str::<KvEventEnvelope>(&json).unwrap(),
            event
        );
    }

    #[test]
    fn cursor_accepts_successors_skips_duplicates_and_reports_gaps() {
        let mut c = StreamCursor::default();
        assert_eq!(c.advance(&env(1, 10)), Continuity::NewInstance);
        assert_eq!(c.advance(&env(1, 11)), Continuity::Next);
        assert_eq!(c.advance(&env(1, 11)), Continuity::Duplicate);
        assert_eq!(c.advance(&env(1, 5)), Continuity::Duplicate);
        assert_eq!(
            c.advance(&env(1, 14)),
            Continuity::Gap {
                expected: 12,
                got: 14
            }
        );
        // Still stuck at 11 until reset.
        assert_eq!(
            c.advance(&env(1, 15)),
            Continuity::Gap {
                expected: 12,
                got: 15
            }
        );
        assert_eq!(c.last(), Some((1, 11)));
        assert_eq!(c.advance(&env(2, 0)), Continuity::NewInstance);
        assert_eq!(c.advance(&env(2, 1)), Continuity::Next);
        c.reset();
        assert_eq!(c.advance(&env(2, 9)), Continuity::NewInstance);
        c.restart_at(3, 40);
        assert_eq!(c.advance(&env(3, 41)), Continuity::Next);
    }
}
