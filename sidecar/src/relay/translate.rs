//! From the engine's KV events to ours: block identity is recomputed from the token ids
//! with our chained hash (`DESIGN.md`, "Block hashing"), so the router can compare the
//! pod's blocks with a prompt's; the engine's hash is kept as an opaque key, and a map
//! from it to our hash translates the events that carry only engine hashes
//! (`BlockRemoved`, and the parent of a `BlockStored`).

use std::collections::HashMap;

use dynamo_kvcache::vllm_events::KvEvent as EngineEvent;
use dynamo_kvcache::{BlockHasher, KvEvent, RemovedBlock, SeqHash, StoredBlock, Tier};

/// Why an engine event (or one block of a removal) was left out of the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// A store under a parent block this sidecar never saw stored (it was stored before
    /// the sidecar started, or in events lost to a gap): our hash cannot be chained.
    UnknownParent,
    /// The token ids do not fill exactly the stored blocks.
    TokenCount,
    /// A storage medium that maps to no tier.
    UnknownMedium,
    /// A LoRA block without the adapter's name, which salts the hash.
    LoraWithoutName,
    /// A removed block this sidecar does not hold in that tier, or a block stored by hash
    /// alone that it holds in no tier.
    UnknownBlock,
}

impl Skip {
    pub const fn as_str(self) -> &'static str {
        match self {
            Skip::UnknownParent => "unknown_parent",
            Skip::TokenCount => "token_count",
            Skip::UnknownMedium => "unknown_medium",
            Skip::LoraWithoutName => "lora_without_name",
            Skip::UnknownBlock => "unknown_block",
        }
    }
}

/// The tier of an engine event's `medium` (pillars.md 3.3): absent or `GPU` is the
/// GPU cache. vLLM sends `CPU` (its CPU offloading), `STORAGE` (0.33's offloading
/// connector's secondary tier, `MEDIUM_STORAGE` in vllm/distributed/kv_events.py), `FS`
/// and `OBJ` (its earlier tiered storage); SGLang `CPU_PINNED`, `DISK` and `EXTERNAL`;
/// the other names are those Dynamo's router also accepts (`CPU_TIER1`/`CPU_TIER2` from
/// an early SGLang).
fn tier_of(medium: Option<&str>) -> Option<Tier> {
    let Some(medium) = medium else {
        return Some(Tier::Gpu);
    };
    const MEDIUMS: [(&str, Tier); 15] = [
        ("GPU", Tier::Gpu),
        ("DEVICE", Tier::Gpu),
        ("CPU", Tier::Host),
        ("CPU_PINNED", Tier::Host),
        ("CPU_TIER1", Tier::Host),
        ("DISK", Tier::Disk),
        ("FS", Tier::Disk),
        ("NVME", Tier::Disk),
        ("CPU_TIER2", Tier::Disk),
        ("STORAGE", Tier::Disk),
        ("OBJ", Tier::Object),
        ("EXTERNAL", Tier::Object),
        ("NETWORK", Tier::Object),
        ("REMOTE", Tier::Object),
        ("SHARED", Tier::Object),
    ];
    MEDIUMS
        .into_iter()
        .find(|(name, _)| medium.eq_ignore_ascii_case(name))
        .map(|(_, tier)| tier)
}

/// What the pod holds under one engine hash.
#[derive(Clone, Copy, Debug)]
struct Known {
    seq: SeqHash,
    /// Our hash of the block before it, for stores that name the block by hash alone.
    parent: Option<SeqHash>,
    /// Bit `t.index()` set while the block is held in tier `t`.
    tiers: u8,
}

/// One engine's translation state: the engine hash -> our hash map of the blocks it
/// holds. Hashers are made per event (a hash of the model and LoRA names), so any
/// number of adapters costs nothing to keep.
pub struct Translator {
    model: String,
    blocks: HashMap<u64, Known>,
}

impl Translator {
    pub fn model(&self) -> &str {
        &self.model
    }

    /// `model` salts every hash; it must be what the router hashes prompts with.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            blocks: HashMap::new(),
        }
    }

    /// Engine blocks currently known.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Forgets every block (the pod's view was reset).
    pub fn clear(&mut self) {
        self.blocks.clear();
    }

    /// Our event for `event`, if any; `skip` hears of everything left out.
    pub fn translate(
        &mut self,
        event: EngineEvent,
        skip: &mut impl FnMut(Skip),
    ) -> Option<KvEvent> {
        match event {
            EngineEvent::BlockStored {
                block_hashes,
                parent_hash,
                token_ids,
                block_size,
                lora_id,
                medium,
                lora_name,
            } => {
                let stored = self.stored(
                    &block_hashes,
                    parent_hash,
                    &token_ids,
                    block_size,
                    (lora_id, lora_name),
                    medium.as_deref(),
                );
                stored.unwrap_or_else(|reason| {
                    skip(reason);
                    None
                })
            }
            EngineEvent::BlockRemoved {
                block_hashes,
                medium,
            } => match tier_of(medium.as_deref()) {
                Some(tier) => self.removed(&block_hashes, tier, skip),
                None => {
                    skip(Skip::UnknownMedium);
                    None
                }
            },
            EngineEvent::AllBlocksCleared => {
                self.clear();
                Some(KvEvent::Cleared)
            }
        }
    }

    fn stored(
        &mut self,
        engine_hashes: &[u64],
        engine_parent: Option<u64>,
        tokens: &[u32],
        block_size: u32,
        (lora_id, lora_name): (Option<i64>, Option<String>),
        medium: Option<&str>,
    ) -> Result<Option<KvEvent>, Skip> {
        let tier = tier_of(medium).ok_or(Skip::UnknownMedium)?;
        if tokens.is_empty() && !engine_hashes.is_empty() {
            return self.stored_by_hash(engine_hashes, tier);
        }
        if lora_id.is_some() && lora_name.is_none() {
            return Err(Skip::LoraWithoutName);
        }
        if block_size == 0 || tokens.len() != engine_hashes.len() * block_size as usize {
            return Err(Skip::TokenCount);
        }
        if engine_hashes.is_empty() {
            return Ok(None);
        }
        let parent = match engine_parent {
            None => None,
            Some(h) => Some(self.blocks.get(&h).ok_or(Skip::UnknownParent)?.seq),
        };
        let seqs = BlockHasher::new(block_size as usize, &self.model, lora_name.as_deref())
            .seq_hashes_from(parent, tokens);
        let mut block_parent = parent;
        let blocks = engine_hashes
            .iter()
            .zip(seqs)
            .map(|(&engine_hash, seq_hash)| {
                let known = self.blocks.entry(engine_hash).or_insert(Known {
                    seq: seq_hash,
                    parent: block_parent,
                    tiers: 0,
                });
                known.seq = seq_hash;
                known.parent = block_parent;
                known.tiers |= 1 << tier.index();
                block_parent = Some(seq_hash);
                StoredBlock {
                    seq_hash,
                    engine_hash,
                    tier,
                }
            })
            .collect();
        Ok(Some(KvEvent::Stored { parent, blocks }))
    }

    /// A store that names blocks by engine hash alone, without their tokens: vLLM 0.33's
    /// offloading connector stores a block it has no tokens for this way
    /// (`_placeholder_stored` in its `offloading/events.py`: no tokens, block size 0, no
    /// parent). A block the pod holds in another tier is now held in this one too; one
    /// it never saw stored cannot be named and is skipped.
    fn stored_by_hash(
        &mut self,
        engine_hashes: &[u64],
        tier: Tier,
    ) -> Result<Option<KvEvent>, Skip> {
        let mut found = Vec::with_capacity(engine_hashes.len());
        for &engine_hash in engine_hashes {
            found.push((
                engine_hash,
                *self.blocks.get(&engine_hash).ok_or(Skip::UnknownBlock)?,
            ));
        }
        let parent = found[0].1.parent;
        // One event holds one chain: each block must follow the one before it.
        if found.windows(2).any(|w| w[1].1.parent != Some(w[0].1.seq)) {
            return Err(Skip::UnknownParent);
        }
        let blocks = found
            .into_iter()
            .map(|(engine_hash, known)| {
                if let Some(k) = self.blocks.get_mut(&engine_hash) {
                    k.tiers |= 1 << tier.index();
                }
                StoredBlock {
                    seq_hash: known.seq,
                    engine_hash,
                    tier,
                }
            })
            .collect();
        Ok(Some(KvEvent::Stored { parent, blocks }))
    }

    fn removed(
        &mut self,
        engine_hashes: &[u64],
        tier: Tier,
        skip: &mut impl FnMut(Skip),
    ) -> Option<KvEvent> {
        let bit = 1 << tier.index();
        let mut blocks = Vec::with_capacity(engine_hashes.len());
        for &engine_hash in engine_hashes {
            let Some(known) = self
                .blocks
                .get_mut(&engine_hash)
                .filter(|k| k.tiers & bit != 0)
            else {
                skip(Skip::UnknownBlock);
                continue;
            };
            known.tiers &= !bit;
            blocks.push(RemovedBlock {
                seq_hash: known.seq,
                engine_hash,
            });
            if known.tiers == 0 {
                self.blocks.remove(&engine_hash);
            }
        }
        (!blocks.is_empty()).then_some(KvEvent::Removed { blocks, tier })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>) -> EngineEvent {
        EngineEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_hash: parent,
            token_ids: tokens,
            block_size: 2,
            lora_id: None,
            medium: Some("GPU".into()),
            lora_name: None,
        }
    }

    fn removed(hashes: &[u64], medium: &str) -> EngineEvent {
        EngineEvent::BlockRemoved {
            block_hashes: hashes.to_vec(),
            medium: Some(medium.into()),
        }
    }

    /// Translates `events`, returning our events and the skip reasons.
    fn run(t: &mut Translator, events: Vec<EngineEvent>) -> (Vec<KvEvent>, Vec<Skip>) {
        let mut skips = Vec::new();
        let out = events
            .into_iter()
            .filter_map(|e| t.translate(e, &mut |s| skips.push(s)))
            .collect();
        (out, skips)
    }

    #[test]
    fn stored_blocks_get_our_chained_hashes_under_a_translated_parent() {
        let hasher = BlockHasher::new(2, "m", None);
        let ours = hasher.seq_hashes(&[1, 2, 3, 4, 5, 6]);
        let mut t = Translator::new("m");
        // The engine stores the prompt in two events: [1,2,3,4] then [5,6] under 0xB.
        let (out, skips) = run(
            &mut t,
            vec![
                stored(&[0xA, 0xB], None, vec![1, 2, 3, 4]),
                stored(&[0xC], Some(0xB), vec![5, 6]),
            ],
        );
        assert!(skips.is_empty());
        let block = |i: usize, engine_hash| StoredBlock {
            seq_hash: ours[i],
            engine_hash,
            tier: Tier::Gpu,
        };
        assert_eq!(
            out,
            vec![
                KvEvent::Stored {
                    parent: None,
                    blocks: vec![block(0, 0xA), block(1, 0xB)],
                },
                KvEvent::Stored {
                    parent: Some(ours[1]),
                    blocks: vec![block(2, 0xC)],
                },
            ]
        );
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn removals_translate_per_tier_and_forget_blocks_left_in_no_tier() {
        let ours = BlockHasher::new(2, "m", None).seq_hashes(&[1, 2]);
        let mut t = Translator::new("m");
        let mut cpu = stored(&[0xA], None, vec![1, 2]);
        if let EngineEvent::BlockStored { medium, .. } = &mut cpu {
            *medium = Some("CPU".into());
        }
        let (out, skips) = run(
            &mut t,
            vec![
                stored(&[0xA], None, vec![1, 2]),
                cpu,
                removed(&[0xA, 0xF], "GPU"),
                removed(&[0xA], "GPU"),
                removed(&[0xA], "cpu"),
            ],
        );
        assert!(matches!(&out[1], KvEvent::Stored { blocks, .. } if blocks[0].tier == Tier::Host));
        let gone = |tier| KvEvent::Removed {
            blocks: vec![RemovedBlock {
                seq_hash: ours[0],
                engine_hash: 0xA,
            }],
            tier,
        };
        assert_eq!(out[2..], [gone(Tier::Gpu), gone(Tier::Host)]);
        // 0xF was never stored; 0xA left the GPU once already.
        assert_eq!(skips, vec![Skip::UnknownBlock, Skip::UnknownBlock]);
        assert!(t.is_empty());
    }

    #[test]
    fn blocks_stored_by_hash_alone_are_the_known_ones_in_a_new_tier() {
        let ours = BlockHasher::new(2, "m", None).seq_hashes(&[1, 2, 3, 4]);
        let mut t = Translator::new("m");
        // As vLLM 0.33's offloading connector writes a block it has no tokens for.
        let by_hash = |hashes: &[u64], medium: &str| EngineEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_hash: None,
            token_ids: Vec::new(),
            block_size: 0,
            lora_id: None,
            medium: Some(medium.into()),
            lora_name: None,
        };
        let (out, skips) = run(
            &mut t,
            vec![
                stored(&[0xA, 0xB], None, vec![1, 2, 3, 4]),
                by_hash(&[0xB], "CPU"),
                by_hash(&[0xA, 0xB], "STORAGE"),
                by_hash(&[0xF], "CPU"),
                by_hash(&[0xB, 0xA], "CPU"),
                removed(&[0xA, 0xB], "GPU"),
            ],
        );
        let block = |i: usize, engine_hash, tier| StoredBlock {
            seq_hash: ours[i],
            engine_hash,
            tier,
        };
        assert_eq!(
            out[1],
            KvEvent::Stored {
                parent: Some(ours[0]),
                blocks: vec![block(1, 0xB, Tier::Host)],
            }
        );
        assert_eq!(
            out[2],
            KvEvent::Stored {
                parent: None,
                blocks: vec![block(0, 0xA, Tier::Disk), block(1, 0xB, Tier::Disk)],
            }
        );
        // Never stored; and not one chain in that order.
        assert_eq!(skips, vec![Skip::UnknownBlock, Skip::UnknownParent]);
        // Gone from the GPU, still held in the host and disk tiers.
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn every_engines_medium_names_its_tier() {
        for (medium, tier) in [
            (None, Some(Tier::Gpu)),
            (Some("STORAGE"), Some(Tier::Disk)),
            (Some("cpu_pinned"), Some(Tier::Host)),
            (Some("FS"), Some(Tier::Disk)),
            (Some("DISK"), Some(Tier::Disk)),
            (Some("OBJ"), Some(Tier::Object)),
            (Some("EXTERNAL"), Some(Tier::Object)),
            (Some("TAPE"), None),
        ] {
            assert_eq!(tier_of(medium), tier, "{medium:?}");
        }
    }

    #[test]
    fn what_cannot_be_hashed_is_skipped_with_its_reason() {
        let mut t = Translator::new("m");
        let mut lora = stored(&[0xD], None, vec![1, 2]);
        if let EngineEvent::BlockStored { lora_id, .. } = &mut lora {
            *lora_id = Some(3);
        }
        let (out, skips) = run(
            &mut t,
            vec![
                stored(&[0xA], Some(0x99), vec![1, 2]),
                stored(&[0xB], None, vec![1, 2, 3]),
                stored(&[0xC], None, vec![1, 2]),
                removed(&[0xC], "TAPE"),
                lora,
            ],
        );
        assert_eq!(out.len(), 1, "only 0xC is stored: {out:?}");
        assert_eq!(
            skips,
            vec![
                Skip::UnknownParent,
                Skip::TokenCount,
                Skip::UnknownMedium,
                Skip::LoraWithoutName
            ]
        );
    }

    #[test]
    fn lora_names_salt_the_hash_and_clearing_forgets_everything() {
        let mut t = Translator::new("m");
        let mut lora = stored(&[0xB], None, vec![1, 2]);
        if let EngineEvent::BlockStored {
            lora_id, lora_name, ..
        } = &mut lora
        {
            *lora_id = Some(1);
            *lora_name = Some("adapter".into());
        }
        let (out, _) = run(
            &mut t,
            vec![
                stored(&[0xA], None, vec![1, 2]),
                lora,
                EngineEvent::AllBlocksCleared,
            ],
        );
        let seq = |e: &KvEvent| match e {
            KvEvent::Stored { blocks, .. } => blocks[0].seq_hash,
            other => panic!("{other:?}"),
        };
        assert_ne!(seq(&out[0]), seq(&out[1]));
        assert_eq!(
            seq(&out[1]),
            BlockHasher::new(2, "m", Some("adapter")).seq_hashes(&[1, 2])[0]
        );
        assert_eq!(out[2], KvEvent::Cleared);
        assert!(t.is_empty());
    }
}
