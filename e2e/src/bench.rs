//! The load generator: sends a workload to an OpenAI endpoint on an arrival plan and
//! summarises what came back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::arrivals::Arrivals;
use crate::client::{RequestRecord, Target, send};
use crate::report::Report;
use crate::workload::Workload;

/// An HTTP client for many concurrent streams; `timeout` bounds each whole request.
pub fn http_client(timeout: Duration) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .tcp_nodelay(true)
        .build()?)
}

/// Sends every request of `workload` to `target` as `arrivals` says and waits for all.
pub async fn run(
    http: &reqwest::Client,
    target: &Target,
    workload: Arc<Workload>,
    arrivals: &Arrivals,
    label: &str,
) -> anyhow::Result<Report> {
    let start = Instant::now();
    let mut tasks = JoinSet::new();
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
    let mut records: Vec<RequestRecord> = Vec::with_capacity(workload.len());
    while let Some(done) = tasks.join_next().await {
        records.extend(done?);
    }
    let end_ms = records
        .iter()
        .map(|r| r.sent_ms + r.e2e_ms)
        .fold(0.0, f64::max);
    Ok(Report::from_records(label, &records, end_ms / 1000.0))
}
