//! Continuity of the engine's message sequence. vLLM's `ZmqEventPublisher` numbers its
//! messages 0, 1, 2, ... (`itertools.count()`, the 8-byte big-endian second frame;
//! vllm-project/vllm `vllm/distributed/kv_events.py`), so a jump forward means lost
//! messages and a step back means a new publisher: the engine restarted.

/// How a message's sequence number relates to what came before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Continuity {
    Next,
    /// Messages `from..seq` were lost (also when the first message seen is not 0).
    Missed {
        from: u64,
    },
    /// The sequence went back: a new publisher, whose cache starts empty.
    Restarted,
}

/// The next sequence number expected; a fresh tracker expects 0.
#[derive(Clone, Copy, Debug, Default)]
pub struct SequenceTracker {
    next: u64,
}

impl SequenceTracker {
    pub fn classify(&self, seq: u64) -> Continuity {
        match seq {
            s if s == self.next => Continuity::Next,
            s if s > self.next => Continuity::Missed { from: self.next },
            _ => Continuity::Restarted,
        }
    }

    /// Marks `seq` as handled: `seq + 1` comes next.
    pub fn accept(&mut self, seq: u64) {
        self.next = seq.saturating_add(1);
    }

    /// Starts over, for a new publisher.
    pub fn restart(&mut self) {
        self.next = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_jumps_are_misses_and_steps_back_are_restarts() {
        let mut t = SequenceTracker::default();
        assert_eq!(t.classify(0), Continuity::Next);
        assert_eq!(t.classify(3), Continuity::Missed { from: 0 });
        t.accept(0);
        assert_eq!(t.classify(1), Continuity::Next);
        t.accept(1);
        assert_eq!(t.classify(5), Continuity::Missed { from: 2 });
        t.accept(5);
        assert_eq!(t.classify(5), Continuity::Restarted);
        assert_eq!(t.classify(0), Continuity::Restarted);
        t.restart();
        assert_eq!(t.classify(0), Continuity::Next);
        assert_eq!(t.classify(2), Continuity::Missed { from: 0 });
    }
}
