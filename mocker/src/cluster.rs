//! One simulated cluster: engines on simulated clocks, the feed of their steps, and the
//! discrete-event loop every replay drives (the trace replay here, `dynamo-e2e`'s
//! conversation, closed-loop, disaggregated and planner replays, the profiler's engine
//! runs).
//!
//! The loop: until the next event is due, step the busy engine whose clock is furthest
//! behind, so engines advance together and a step that brings an event forward (a
//! request ending frees a client, a prefill ending starts a transfer) is seen before
//! later steps; an engine may overshoot an event by part of one step (the request then
//! joins at its next step, as in vLLM). Then every clock moves to the event and the
//! driver handles it. What differs between replays (the events, routing, what a step
//! means to them) is the [`Driver`]'s.

use thiserror::Error;

use crate::clock::Clock;
use crate::engine::{Engine, StepOutcome};

/// Step outcomes on their way to the router, each shown once simulated time reaches the
/// end of its step.
///
/// The replays run an engine's step that straddles the next arrival to its end, but a
/// live router hears of a step's tokens, finished requests and KV events only when the
/// step is over: a request arriving mid-step is routed without them. Shown early, they
/// let the router see prefills end and blocks land before they have, and steer requests
/// to an engine still busy with a long prefill step (workload B's closed loop,
/// `dynamo-e2e replay --concurrency 16`: TTFT p90 94 ms seen early, 85 ms at the end).
#[derive(Debug)]
struct StepFeed<T> {
    /// (end of the step in ms, engine, what it did), in no particular order.
    steps: Vec<(f64, usize, T)>,
}

impl<T> StepFeed<T> {
    /// Hands `show` every step that ended by `now_ms`, in the order they ended (engine
    /// order at equal ends).
    fn release(&mut self, now_ms: f64, mut show: impl FnMut(usize, T)) {
        self.steps
            .sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let ended = self.steps.partition_point(|s| s.0 <= now_ms);
        for (_, k, step) in self.steps.drain(..ended) {
            show(k, step);
        }
    }
}

/// A busy engine could schedule nothing and no event is due to change that (cannot
/// happen with admitted requests).
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("engine {engine} is stuck: nothing can be scheduled")]
pub struct Stuck {
    pub engine: usize,
}

/// Engines on simulated clocks and what their steps show, `T` per step (the
/// [`StepOutcome`] itself, or what a driver makes of it).
#[derive(Debug)]
pub struct SimCluster<T = StepOutcome> {
    engines: Vec<Engine>,
    feed: StepFeed<T>,
}

impl<T> SimCluster<T> {
    pub fn new(engines: Vec<Engine>) -> Self {
        Self {
            engines,
            feed: StepFeed { steps: Vec::new() },
        }
    }

    pub fn engines(&self) -> &[Engine] {
        &self.engines
    }

    pub fn engine_mut(&mut self, k: usize) -> &mut Engine {
        &mut self.engines[k]
    }

    /// Adds an engine (a scale-up); returns its number.
    pub fn add(&mut self, engine: Engine) -> usize {
        self.engines.push(engine);
        self.engines.len() - 1
    }

    pub fn into_engines(self) -> Vec<Engine> {
        self.engines
    }

    /// Hands `show` every step that ended by `now_ms` and was not shown yet, in the
    /// order they ended (engine order at equal ends).
    pub fn release(&mut self, now_ms: f64, show: impl FnMut(usize, T)) {
        self.feed.release(now_ms, show);
    }

    /// The busy engine whose clock is furthest behind, if any is before `next_ms`.
    fn furthest_behind(&self, next_ms: f64) -> Option<usize> {
        self.engines
            .iter()
            .enumerate()
            .filter(|(_, e)| e.has_work() && e.clock().now_ms() < next_ms)
            .min_by(|a, b| a.1.clock().now_ms().total_cmp(&b.1.clock().now_ms()))
            .map(|(k, _)| k)
    }
}

/// What a replay adds to the loop: its events, and what it does with each step.
pub trait Driver {
    /// What the feed shows of a step once it has ended.
    type Shown;
    type Error: From<Stuck>;

    fn cluster(&mut self) -> &mut SimCluster<Self::Shown>;

    /// When the next event is due: infinity once none is left (the engines then run
    /// dry), `None` to end the run at once.
    fn next_event_ms(&self) -> Option<f64>;

    /// Engine `k` ran step `o`: take in what it did, and say what the feed shows of it.
    fn stepped(&mut self, k: usize, o: StepOutcome) -> Result<Self::Shown, Self::Error>;

    /// After engine `k`'s step is in the feed (a router may pick now and see it).
    fn after_step(&mut self, _k: usize) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The event due at `now_ms`; every engine's clock is there.
    fn event(&mut self, now_ms: f64) -> Result<(), Self::Error>;

    /// Runs the loop (module doc) until no event is left and the engines have run dry,
    /// or [`Driver::next_event_ms`] ends it.
    fn run(&mut self) -> Result<(), Self::Error> {
        while let Some(next_ms) = self.next_event_ms() {
            if let Some(k) = self.cluster().furthest_behind(next_ms) {
                let o = self.cluster().engines[k].step();
                let (end, stuck) = (o.ended_ms(), o.duration_ms == 0.0);
                let shown = self.stepped(k, o)?;
                self.cluster().feed.steps.push((end, k, shown));
                self.after_step(k)?;
                if stuck {
                    if !next_ms.is_finite() {
                        return Err(Stuck { engine: k }.into());
                    }
                    self.cluster().engines[k].clock_mut().advance_to(next_ms);
                }
                continue;
            }
            if next_ms == f64::INFINITY {
                break;
            }
            for e in &mut self.cluster().engines {
                e.clock_mut().advance_to(next_ms);
            }
            self.event(next_ms)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feed_shows_steps_in_the_order_they_ended_once_they_have() {
        let mut feed = StepFeed { steps: Vec::new() };
        for (end, k) in [(5.0, 1), (3.0, 0), (5.0, 0), (9.0, 2)] {
            feed.steps.push((end, k, (end, k)));
        }
        let mut shown = Vec::new();
        feed.release(5.0, |_, s| shown.push(s));
        assert_eq!(shown, [(3.0, 0), (5.0, 0), (5.0, 1)]);
        feed.release(f64::INFINITY, |_, s| shown.push(s));
        assert_eq!(shown.last(), Some(&(9.0, 2)));
    }
}
