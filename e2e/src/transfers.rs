//! A live run's disaggregated figures: the KV transfers and prefill hops the picker
//! counted (its `/metrics`), differenced over the run.

use std::collections::BTreeMap;

use dynamo_loadgen::report::{DisaggStats, Report};
use dynamo_mocker::replay::Percentiles;

use crate::disagg::Topology;

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
        // Live mock engines are one GPU's worth each.
        gpus: topology.engines(),
        output_tokens_per_s_per_gpu: run.output_tokens_per_s / topology.engines() as f64,
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
