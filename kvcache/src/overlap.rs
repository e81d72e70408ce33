//! The answer of an index: how many leading blocks of a prompt each pod holds, per tier.

use serde::{Deserialize, Serialize};

use crate::{Tier, WorkerId};

/// Matched blocks of one pod, counted at each block's best tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TierCounts(pub [u32; 4]);

impl TierCounts {
    pub fn get(&self, tier: Tier) -> u32 {
        self.0[tier.index()]
    }

    pub fn add(&mut self, tier: Tier, blocks: u32) {
        self.0[tier.index()] += blocks;
    }

    /// Matched blocks in every tier together: the length of the matched prefix.
    pub fn total(&self) -> u32 {
        self.0.iter().sum()
    }

    /// Sum over tiers of matched blocks times the tier's credit.
    pub fn credited(&self, credits: &TierCredits) -> f64 {
        Tier::ALL
            .into_iter()
            .map(|t| f64::from(self.get(t)) * credits.get(t))
            .sum()
    }
}

/// How much one matched block of each tier is worth, in GPU blocks.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TierCredits(pub [f64; 4]);

impl TierCredits {
    pub fn get(&self, tier: Tier) -> f64 {
        self.0[tier.index()]
    }
}

impl Default for TierCredits {
    /// [`Tier::default_credit`] of every tier.
    fn default() -> Self {
        Self(Tier::ALL.map(Tier::default_credit))
    }
}

/// Per pod, the matched prefix of one prompt. Pods that match nothing are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverlapScores {
    /// Sorted by worker id, one entry per pod.
    scores: Vec<(WorkerId, TierCounts)>,
}

impl OverlapScores {
    /// Builds the scores from entries in any order; a pod listed twice keeps its last entry.
    pub fn from_entries(mut scores: Vec<(WorkerId, TierCounts)>) -> Self {
        scores.reverse();
        scores.sort_by_key(|(w, _)| *w); // stable: the last entry of a pod comes first
        scores.dedup_by_key(|(w, _)| *w);
        Self { scores }
    }

    /// Builds the scores from entries with distinct workers, in any order.
    pub(crate) fn from_unique(mut scores: Vec<(WorkerId, TierCounts)>) -> Self {
        scores.sort_unstable_by_key(|(w, _)| *w);
        debug_assert!(scores.windows(2).all(|p| p[0].0 < p[1].0));
        Self { scores }
    }

    /// The matched blocks of `worker` (all zero when it matched nothing).
    pub fn get(&self, worker: WorkerId) -> TierCounts {
        self.scores
            .binary_search_by_key(&worker, |(w, _)| *w)
            .map(|i| self.scores[i].1)
            .unwrap_or_default()
    }

    /// Pods with at least one matched block, by increasing worker id.
    pub fn iter(&self) -> impl Iterator<Item = (WorkerId, TierCounts)> + '_ {
        self.scores.iter().copied()
    }

    pub fn len(&self) -> usize {
        self.scores.len()
    }

    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// The longest matched prefix over all pods.
    pub fn max_total(&self) -> u32 {
        self.scores
            .iter()
            .map(|(_, c)| c.total())
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credited_overlap_weighs_each_tier() {
        let counts = TierCounts([4, 2, 4, 10]);
        // 4*1.0 + 2*0.75 + 4*0.25 + 10*0.1 = 4 + 1.5 + 1 + 1
        assert!((counts.credited(&TierCredits::default()) - 7.5).abs() < 1e-9);
        assert_eq!(counts.total(), 20);
    }

    #[test]
    fn scores_are_sorted_and_keep_the_last_entry_of_a_pod() {
        let s = OverlapScores::from_entries(vec![
            (WorkerId(3), TierCounts([1, 0, 0, 0])),
            (WorkerId(1), TierCounts([2, 0, 0, 0])),
            (WorkerId(3), TierCounts([5, 0, 0, 0])),
        ]);
        let ids: Vec<_> = s.iter().map(|(w, _)| w.0).collect();
        assert_eq!(ids, [1, 3]);
        assert_eq!(s.get(WorkerId(3)).total(), 5);
        assert_eq!(s.get(WorkerId(2)), TierCounts::default());
        assert_eq!(s.max_total(), 5);
    }
}
