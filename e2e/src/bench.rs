//! The load generator: sends a workload to an OpenAI endpoint on an arrival plan and
//! summarises what came back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use dynamo_mocker::replay::Percentiles;

use crate::arrivals::Arrivals;
use crate::client::{RequestRecord, Target, send};
use crate::disagg::Topology;
use crate::report::{DisaggStats, Report};
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

/// What the picker counted of disaggregated requests so far (cumulative), from its
/// `/metrics`: the KV transfer histogram and the prefill hops by outcome.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TransferCounts {
    /// `dynamo_epp_kv_transfer_seconds` buckets: upper bound (s), cumulative count.
    buckets: Vec<(f64, f64)>,
    sum_s: f64,
    count: f64,
    hops: BTreeMap<String, f64>,
}

/// The picker's counts at `base_url` now; empty when it has none (or no `/metrics`).
pub async fn scrape_transfers(http: &reqwest::Client, base_url: &str) -> TransferCounts {
    let url = format!("{}/metrics", base_url.trim_end_matches('/'));
    let text = async {
        http.get(&url)
            .send()
            .await?
            .error_for_status()?
            .text()
            .await
    };
    match text.await {
        Ok(text) => parse_transfers(&text),
        Err(_) => TransferCounts::default(),
    }
}

/// The value of label `name` in a sample's `{...}`.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

/// Reads the transfer histogram and the hop counter from Prometheus text.
pub fn parse_transfers(text: &str) -> TransferCounts {
    const HISTOGRAM: &str = "dynamo_epp_kv_transfer_seconds";
    const HOPS: &str = "dynamo_epp_prefill_hops_total";
    let mut c = TransferCounts::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        match name.strip_prefix(HISTOGRAM) {
            Some("_bucket") => {
                let le = label(labels, "le").and_then(|b| b.replace("Inf", "inf").parse().ok());
                if let Some(le) = le {
                    c.buckets.push((le, value));
                }
            }
            Some("_sum") => c.sum_s = value,
            Some("_count") => c.count = value,
            _ if name == HOPS => {
                if let Some(outcome) = label(labels, "outcome") {
                    *c.hops.entry(outcome.to_owned()).or_default() += value;
                }
            }
            _ => {}
        }
    }
    c.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    c
}

/// The `q` quantile of a cumulative histogram, interpolated linearly within its bucket
/// (Prometheus's `histogram_quantile`); in the `+Inf` bucket, the highest finite bound.
fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let Some(&(_, total)) = buckets.last() else {
        return 0.0;
    };
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank && count > 0.0 {
            if le.is_infinite() {
                return lower.0;
            }
            let within = count - lower.1;
            let share = if within > 0.0 {
                (rank - lower.1) / within
            } else {
                1.0
            };
            return lower.0 + (le - lower.0) * share;
        }
        lower = (le, count);
    }
    lower.0
}

/// A live run of a graph named `topology`: its engines, and the transfers and hops the
/// picker counted between `before` and `after`.
pub fn live_disagg(
    run: &Report,
    topology: Topology,
    before: TransferCounts,
    after: TransferCounts,
) -> DisaggStats {
    let (prefill_engines, decode_engines) = match topology {
        Topology::Aggregated { .. } => (0, 0),
        Topology::Disaggregated { prefill, decode } => (prefill, decode),
    };
    let old = |le: f64| {
        before
            .buckets
            .iter()
            .find(|b| b.0 == le)
            .map_or(0.0, |b| b.1)
    };
    let buckets: Vec<(f64, f64)> = after
        .buckets
        .iter()
        .map(|&(le, n)| (le, (n - old(le)).max(0.0)))
        .collect();
    let count = (after.count - before.count).max(0.0);
    let ms = |q: f64| bucket_quantile(&buckets, q) * 1000.0;
    let transfer_ms = if count > 0.0 {
        Percentiles {
            p50: ms(0.5),
            p90: ms(0.9),
            p99: ms(0.99),
            mean: (after.sum_s - before.sum_s) / count * 1000.0,
            count: count as usize,
        }
    } else {
        Percentiles::default()
    };
    let prefill_hops = after
        .hops
        .iter()
        .map(|(k, &n)| {
            (
                k.clone(),
                (n - before.hops.get(k).copied().unwrap_or(0.0)).max(0.0) as u64,
            )
        })
        .filter(|&(_, n)| n > 0)
        .collect();
    DisaggStats {
        topology: topology.to_string(),
        engines: topology.engines(),
        prefill_engines,
        decode_engines,
        output_tokens_per_s_per_engine: run.output_tokens_per_s / topology.engines() as f64,
        transfer_ms,
        kv_bytes_moved: None,
        link_bandwidth_gbps: None,
        prefill_hops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = r#"# HELP dynamo_epp_kv_transfer_seconds Seconds the KV blocks took.
# TYPE dynamo_epp_kv_transfer_seconds histogram
dynamo_epp_kv_transfer_seconds_sum 0.07
dynamo_epp_kv_transfer_seconds_count 10
dynamo_epp_kv_transfer_seconds_bucket{le="0.005"} 0
dynamo_epp_kv_transfer_seconds_bucket{le="0.01"} 8
dynamo_epp_kv_transfer_seconds_bucket{le="0.02"} 10
dynamo_epp_kv_transfer_seconds_bucket{le="+Inf"} 10
# TYPE dynamo_epp_prefill_hops counter
dynamo_epp_prefill_hops_total{outcome="remote"} 9
dynamo_epp_prefill_hops_total{outcome="fallback_timeout"} 1
dynamo_epp_picks_total{pod="127.0.0.1:1",role="decode"} 10
"#;

    #[test]
    fn the_pickers_transfer_histogram_is_read_and_differenced() {
        let after = parse_transfers(METRICS);
        assert_eq!((after.count, after.sum_s), (10.0, 0.07));
        assert_eq!(after.buckets.len(), 4);
        assert_eq!(after.hops["remote"], 9.0);
        // 10 transfers, 8 of them in (5, 10] ms: the median is 5 + 5 x 5/8 ms.
        let run = Report::from_records("2p2d", &[], 1.0);
        let s = live_disagg(
            &run,
            Topology::parse("2p2d").unwrap(),
            TransferCounts::default(),
            after.clone(),
        );
        assert_eq!((s.prefill_engines, s.decode_engines, s.engines), (2, 2, 4));
        assert_eq!(s.transfer_ms.count, 10);
        assert!(
            (s.transfer_ms.p50 - 8.125).abs() < 1e-9,
            "{:?}",
            s.transfer_ms
        );
        assert!(
            (s.transfer_ms.p99 - 19.5).abs() < 1e-9,
            "{:?}",
            s.transfer_ms
        );
        assert!((s.transfer_ms.mean - 7.0).abs() < 1e-9);
        assert_eq!(s.prefill_hops.get("fallback_timeout"), Some(&1));
        // Over a run that added nothing: no transfers, no hops.
        let same = live_disagg(&run, Topology::parse("agg4").unwrap(), after.clone(), after);
        assert_eq!(same.transfer_ms.count, 0);
        assert!(same.prefill_hops.is_empty());
        assert_eq!(parse_transfers("garbage\n"), TransferCounts::default());
    }
}
