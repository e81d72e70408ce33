//! What a block must be to enter this sidecar (offload, lend) or leave a tier it was
//! written to (disk, object): a checksum that matches, a layout this graph could use
//! (`dynamo_kvblocks::layout_rules`) and, in a graph with a credential, the graph's MAC.

use std::sync::Arc;

use dynamo_kvblocks::{Block, BlockKey, LayoutError, LayoutRules, authentic};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::metrics::{Label, Metrics};

/// Why a block is not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("payload does not match its checksum")]
    Corrupt,
    #[error("layout: {0}")]
    Layout(#[from] LayoutError),
    #[error("MAC missing or not this graph's")]
    Mac,
}

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Refusal::Corrupt => "corrupt",
            Refusal::Layout(e) => e.label(),
            Refusal::Mac => "mac",
        }
    }
}

/// The checks, and the count of what they refused.
#[derive(Clone, Debug, Default)]
pub struct Admission {
    rules: LayoutRules,
    key: Option<BlockKey>,
    /// Blocks refused, by `reason`.
    refused: Family<Label, Counter>,
}

impl Admission {
    pub fn new(rules: LayoutRules, key: Option<BlockKey>) -> Self {
        Self {
            rules,
            key,
            refused: Family::default(),
        }
    }

    /// The admission, its refusals counted in `metrics`.
    pub fn registered(self, metrics: &mut Metrics) -> Arc<Self> {
        metrics.registry().register(
            "kv_blocks_refused",
            "KV blocks refused on arrival or tier read-back, by reason (corrupt, mac, block_size, dtype, payload, own_parent, layers)",
            self.refused.clone(),
        );
        Arc::new(self)
    }

    /// Whether `block` may be stored or served; a refusal is counted.
    pub fn check(&self, block: &Block) -> Result<(), Refusal> {
        let checked = if !block.verify() {
            Err(Refusal::Corrupt)
        } else if let Err(e) = self.rules.check(block) {
            Err(Refusal::Layout(e))
        } else if !authentic(self.key.as_ref(), block) {
            Err(Refusal::Mac)
        } else {
            Ok(())
        };
        if let Err(refusal) = checked {
            self.refused
                .get_or_create(&[("reason", refusal.label())])
                .inc();
        }
        checked
    }
}
