//! Follows a local graph's worker replicas during a live run (the runner's admin
//! `GET /graph`), so a run under a planner reports its replica timeline and what it cost.

use std::time::{Duration, Instant};

use dynamo_loadgen::report::ReplicaTimeline;
use serde::Deserialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Between two reads of the graph.
const EVERY: Duration = Duration::from_secs(1);

/// A watch in progress; [`GraphWatch::finish`] ends it.
pub struct GraphWatch {
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<ReplicaTimeline>>,
}

/// What is read of `GET /graph` (docs/local.md): each worker service's replicas.
#[derive(Deserialize)]
struct GraphStatus {
    services: std::collections::BTreeMap<String, Vec<ReplicaStatus>>,
}

#[derive(Deserialize)]
struct ReplicaStatus {
    ready: bool,
}

/// Worker replicas, and of them ready, in one answer of `GET /graph`.
fn count(graph: &GraphStatus) -> (u32, u32) {
    let replicas = graph.services.values().flatten();
    let total = replicas.clone().count() as u32;
    let ready = replicas.filter(|r| r.ready).count() as u32;
    (total, ready)
}

impl GraphWatch {
    /// Reads `url` now (an unreachable graph fails the run at once) and then every second.
    pub async fn start(http: &reqwest::Client, url: &str) -> anyhow::Result<Self> {
        let read = {
            let (http, url) = (http.clone(), url.to_owned());
            move || {
                let (http, url) = (http.clone(), url.clone());
                async move {
                    let graph: GraphStatus = http
                        .get(&url)
                        .send()
                        .await?
                        .error_for_status()?
                        .json()
                        .await?;
                    anyhow::Ok(count(&graph))
                }
            }
        };
        let first = read()
            .await
            .map_err(|e| anyhow::anyhow!("--watch-graph {url}: {e}"))?;
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut timeline = Timeline::new(first);
            let mut ticker = tokio::time::interval(EVERY);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = ticker.tick() => {}
                }
                // A missed read keeps the last count: the runner is busy, not gone.
                if let Ok(now) = read().await {
                    timeline.observe(started.elapsed().as_secs_f64(), now);
                }
            }
            Ok(timeline.end(started.elapsed().as_secs_f64()))
        });
        Ok(Self { stop, task })
    }

    pub async fn finish(self) -> anyhow::Result<ReplicaTimeline> {
        let _ = self.stop.send(());
        self.task.await?
    }
}

/// Replica changes and their integral, built from successive reads.
struct Timeline {
    changes: Vec<(f64, u32, u32)>,
    replica_seconds: f64,
}

impl Timeline {
    fn new((replicas, ready): (u32, u32)) -> Self {
        Self {
            changes: vec![(0.0, replicas, ready)],
            replica_seconds: 0.0,
        }
    }

    fn last(&self) -> (f64, u32, u32) {
        *self.changes.last().expect("starts with one")
    }

    fn observe(&mut self, t_s: f64, (replicas, ready): (u32, u32)) {
        let (since, was, was_ready) = self.last();
        if (replicas, ready) != (was, was_ready) {
            self.replica_seconds += f64::from(was) * (t_s - since);
            self.changes.push((t_s, replicas, ready));
        }
    }

    fn end(self, t_s: f64) -> ReplicaTimeline {
        let (since, was, _) = self.last();
        let counts = self.changes.iter().map(|c| c.1);
        ReplicaTimeline {
            min: counts.clone().min().unwrap_or(0),
            max: counts.max().unwrap_or(0),
            replica_seconds: self.replica_seconds + f64::from(was) * (t_s - since),
            changes: self.changes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_integral_counts_each_count_for_as_long_as_it_held() {
        let mut t = Timeline::new((2, 2));
        t.observe(1.0, (2, 2));
        t.observe(10.0, (3, 2));
        t.observe(15.0, (3, 3));
        t.observe(20.0, (1, 1));
        let r = t.end(30.0);
        // 2 x 10 s + 3 x 10 s + 1 x 10 s.
        assert_eq!(r.replica_seconds, 60.0);
        assert_eq!((r.min, r.max), (1, 3));
        assert_eq!(
            r.changes,
            [(0.0, 2, 2), (10.0, 3, 2), (15.0, 3, 3), (20.0, 1, 1)]
        );
    }
}
