//! Between `dynamo_kvcache` events and their protobuf form.

use dynamo_kvcache::{KvEvent, RemovedBlock, SeqHash, StoredBlock, Tier};

use crate::pb;

/// A message that a sidecar of ours would never send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidMessage {
    #[error("event message without a body")]
    NoBody,
    #[error("unknown tier value {0}")]
    UnknownTier(i32),
}

pub(crate) fn tier_to_pb(tier: Tier) -> pb::Tier {
    match tier {
        Tier::Gpu => pb::Tier::Gpu,
        Tier::Host => pb::Tier::Host,
        Tier::Disk => pb::Tier::Disk,
        Tier::Object => pb::Tier::Object,
    }
}

fn tier_from_pb(value: i32) -> Result<Tier, InvalidMessage> {
    Ok(
        match pb::Tier::try_from(value).map_err(|_| InvalidMessage::UnknownTier(value))? {
            pb::Tier::Gpu => Tier::Gpu,
            pb::Tier::Host => Tier::Host,
            pb::Tier::Disk => Tier::Disk,
            pb::Tier::Object => Tier::Object,
        },
    )
}

pub(crate) fn stored_to_pb(parent: Option<SeqHash>, blocks: &[StoredBlock]) -> pb::Stored {
    pb::Stored {
        parent: parent.map(|p| p.0),
        blocks: blocks
            .iter()
            .map(|b| pb::StoredBlock {
                seq_hash: b.seq_hash.0,
                engine_hash: b.engine_hash,
                tier: tier_to_pb(b.tier).into(),
            })
            .collect(),
    }
}

pub(crate) fn stored_from_pb(stored: pb::Stored) -> Result<KvEvent, InvalidMessage> {
    let blocks = stored
        .blocks
        .into_iter()
        .map(|b| {
            Ok(StoredBlock {
                seq_hash: SeqHash(b.seq_hash),
                engine_hash: b.engine_hash,
                tier: tier_from_pb(b.tier)?,
            })
        })
        .collect::<Result<_, InvalidMessage>>()?;
    Ok(KvEvent::Stored {
        parent: stored.parent.map(SeqHash),
        blocks,
    })
}

pub(crate) fn event_to_body(event: &KvEvent) -> pb::event_message::Body {
    use pb::event_message::Body;
    match event {
        KvEvent::Stored { parent, blocks } => Body::Stored(stored_to_pb(*parent, blocks)),
        KvEvent::Removed { blocks, tier } => Body::Removed(pb::Removed {
            blocks: blocks
                .iter()
                .map(|b| pb::RemovedBlock {
                    seq_hash: b.seq_hash.0,
                    engine_hash: b.engine_hash,
                })
                .collect(),
            tier: tier_to_pb(*tier).into(),
        }),
        KvEvent::Cleared => Body::Cleared(pb::Cleared {}),
    }
}

/// The events of a snapshot: its stored chains, in order.
pub(crate) fn snapshot_from_pb(snapshot: pb::Snapshot) -> Result<Vec<KvEvent>, InvalidMessage> {
    snapshot.chains.into_iter().map(stored_from_pb).collect()
}

pub(crate) fn removed_from_pb(removed: pb::Removed) -> Result<KvEvent, InvalidMessage> {
    Ok(KvEvent::Removed {
        tier: tier_from_pb(removed.tier)?,
        blocks: removed
            .blocks
            .into_iter()
            .map(|b| RemovedBlock {
                seq_hash: SeqHash(b.seq_hash),
                engine_hash: b.engine_hash,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::event_message::Body;

    #[test]
    fn events_survive_the_round_trip() {
        let events = [
            KvEvent::Stored {
                parent: None,
                blocks: vec![StoredBlock {
                    seq_hash: SeqHash(u64::MAX),
                    engine_hash: 7,
                    tier: Tier::Disk,
                }],
            },
            KvEvent::Stored {
                parent: Some(SeqHash(0)),
                blocks: vec![],
            },
            KvEvent::Removed {
                blocks: vec![RemovedBlock {
                    seq_hash: SeqHash(3),
                    engine_hash: 4,
                }],
                tier: Tier::Object,
            },
            KvEvent::Cleared,
        ];
        for event in events {
            let back = match event_to_body(&event) {
                Body::Stored(s) => stored_from_pb(s).unwrap(),
                Body::Removed(r) => removed_from_pb(r).unwrap(),
                Body::Cleared(_) => KvEvent::Cleared,
                Body::Snapshot(_) => unreachable!("an event never becomes a snapshot"),
            };
            assert_eq!(back, event);
        }
    }

    #[test]
    fn unknown_tiers_are_refused() {
        let removed = pb::Removed {
            blocks: vec![],
            tier: 9,
        };
        assert_eq!(
            removed_from_pb(removed),
            Err(InvalidMessage::UnknownTier(9))
        );
    }
}
