//! The load generator: sends a workload to an OpenAI endpoint on an arrival plan and
//! summarises what came back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::arrivals::Arrivals;
use crate::client::{RequestRecord, Target, send};
use crate::report::Report;
use crate::workload::{Sessions, Workload};

/// An HTTP client for many concurrent streams; `timeout` bounds each whole request.
pub fn http_client(timeout: Duration) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .tcp_nodelay(true)
        .build()?)
}

/// Sends every request of `workload` to `target` as `arrivals` says and waits for all.
///
/// For a conversation workload `arrivals` plans sessions, not requests: `At` gives each
/// session's start, `Concurrency(n)` keeps `n` sessions going; within a session, turn
/// k+1 is sent when turn k's stream has ended (failed or not) and the think time passed.
pub async fn run(
    http: &reqwest::Client,
    target: &Target,
    workload: Arc<Workload>,
    arrivals: &Arrivals,
    label: &str,
) -> anyhow::Result<Report> {
    let records = run_records(http, target, workload, arrivals).await?;
    Ok(report(label, &records))
}

/// The figures of a run's records; it lasted until its last answer ended.
pub fn report(label: &str, records: &[RequestRecord]) -> Report {
    let end_ms = records
        .iter()
        .map(|r| r.sent_ms + r.e2e_ms)
        .fold(0.0, f64::max);
    Report::from_records(label, records, end_ms / 1000.0)
}

/// [`run`]'s requests, as measured, in no particular order.
pub async fn run_records(
    http: &reqwest::Client,
    target: &Target,
    workload: Arc<Workload>,
    arrivals: &Arrivals,
) -> anyhow::Result<Vec<RequestRecord>> {
    if let Some(&spec) = workload.conversations() {
        return run_sessions(http, target, workload, spec, arrivals).await;
    }
    let start = Instant::now();
    let mut tasks: JoinSet<Vec<RequestRecord>> = JoinSet::new();
    match arrivals {
        Arrivals::At(times_ms) => {
            anyhow::ensure!(
                times_ms.len() == workload.len(),
                "{} arrival times for {} requests",
                times_ms.len(),
                workload.len()
            );
            for (i, &t) in times_ms.iter().enumerate() {
                tokio::time::sleep_until((start + Duration::from_secs_f64(t / 1000.0)).into())
                    .await;
                let (http, target, item) = (http.clone(), target.clone(), workload.request(i));
                tasks.spawn(async move { vec![send(&http, &target, &item, start).await] });
            }
        }
        Arrivals::Concurrency(clients) => {
            anyhow::ensure!(*clients > 0, "the concurrency must be at least 1");
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..*clients {
                let (http, target) = (http.clone(), target.clone());
                let (workload, next) = (workload.clone(), next.clone());
                tasks.spawn(async move {
                    let mut records = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= workload.len() {
                            return records;
                        }
                        records.push(send(&http, &target, &workload.request(i), start).await);
                    }
                });
            }
        }
    }
    collect(tasks, workload.len()).await
}

async fn collect(
    mut tasks: JoinSet<Vec<RequestRecord>>,
    n: usize,
) -> anyhow::Result<Vec<RequestRecord>> {
    let mut records: Vec<RequestRecord> = Vec::with_capacity(n);
    while let Some(done) = tasks.join_next().await {
        records.extend(done?);
    }
    Ok(records)
}

/// Every turn of session `session`, one after the other.
async fn converse(
    http: &reqwest::Client,
    target: &Target,
    workload: &Workload,
    spec: Sessions,
    session: usize,
    start: Instant,
) -> Vec<RequestRecord> {
    let mut records = Vec::with_capacity(spec.turns);
    for turn in 0..spec.turns {
        if turn > 0 && spec.think_time_ms > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(spec.think_time_ms / 1000.0)).await;
        }
        let item = workload.request(session * spec.turns + turn);
        let mut record = send(http, target, &item, start).await;
        record.session = Some(session);
        record.turn = Some(turn);
        records.push(record);
    }
    records
}

async fn run_sessions(
    http: &reqwest::Client,
    target: &Target,
    workload: Arc<Workload>,
    spec: Sessions,
    arrivals: &Arrivals,
) -> anyhow::Result<Vec<RequestRecord>> {
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    match arrivals {
        Arrivals::At(times_ms) => {
            anyhow::ensure!(
                times_ms.len() == spec.sessions,
                "{} start times for {} sessions",
                times_ms.len(),
                spec.sessions
            );
            for (session, &t) in times_ms.iter().enumerate() {
                tokio::time::sleep_until((start + Duration::from_secs_f64(t / 1000.0)).into())
                    .await;
                let (http, target, workload) = (http.clone(), target.clone(), workload.clone());
                tasks.spawn(async move {
                    converse(&http, &target, &workload, spec, session, start).await
                });
            }
        }
        Arrivals::Concurrency(users) => {
            anyhow::ensure!(*users > 0, "the concurrency must be at least 1");
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..*users {
                let (http, target) = (http.clone(), target.clone());
                let (workload, next) = (workload.clone(), next.clone());
                tasks.spawn(async move {
                    let mut records = Vec::new();
                    loop {
                        let session = next.fetch_add(1, Ordering::Relaxed);
                        if session >= spec.sessions {
                            return records;
                        }
                        records.extend(
                            converse(&http, &target, &workload, spec, session, start).await,
                        );
                    }
                });
            }
        }
    }
    collect(tasks, workload.len()).await
}
