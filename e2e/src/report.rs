//! The figures of one run, from live requests or a replay, and their Markdown tables.

use std::fmt::Write;

use dynamo_mocker::replay::{Percentiles, ReplayReport};
use serde::Serialize;

use crate::client::RequestRecord;

/// At most this many distinct error messages are kept per run.
const ERROR_SAMPLES: usize = 5;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The router mode, or what the run was pointed at.
    pub label: String,
    pub requests: usize,
    pub completed: usize,
    pub errors: usize,
    /// A few distinct error messages, to say what went wrong.
    pub error_samples: Vec<String>,
    /// First request sent to last token received (simulated time for a replay).
    pub duration_s: f64,
    pub ttft_ms: Percentiles,
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
    pub requests_per_s: f64,
    pub output_tokens: u64,
    pub output_tokens_per_s: f64,
    /// Prompt tokens served from the prefix cache / prompt tokens, over the requests
    /// whose answer said (`usage.prompt_tokens_details.cached_tokens`); `None` when none did.
    pub kv_hit_rate: Option<f64>,
    /// Engine-side figures of a replay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayDetails>,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ReplayDetails {
    pub preemptions: u64,
    pub engine_steps: u64,
    /// How long the simulation took to compute.
    pub wall_s: f64,
}

impl Report {
    /// Summarises live requests; `duration_s` is the run's length.
    pub fn from_records(label: &str, records: &[RequestRecord], duration_s: f64) -> Self {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.error.is_none()).collect();
        let mut error_samples: Vec<String> = Vec::new();
        for e in records.iter().filter_map(|r| r.error.as_ref()) {
            if error_samples.len() < ERROR_SAMPLES && !error_samples.contains(e) {
                error_samples.push(e.clone());
            }
        }
        let mut ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft_ms).collect();
        let mut itl: Vec<f64> = ok.iter().flat_map(|r| r.itl_ms.iter().copied()).collect();
        let mut e2e: Vec<f64> = ok.iter().map(|r| r.e2e_ms).collect();
        let output_tokens: u64 = ok.iter().map(|r| r.output_tokens).sum();
        let (cached, prompt) = ok
            .iter()
            .filter_map(|r| Some((r.cached_tokens?, r.prompt_tokens?)))
            .fold((0u64, 0u64), |(c, p), (rc, rp)| (c + rc, p + rp));
        let per_s = |x: f64| {
            if duration_s > 0.0 {
                x / duration_s
            } else {
                0.0
            }
        };
        Self {
            label: label.to_owned(),
            requests: records.len(),
            completed: ok.len(),
            errors: records.len() - ok.len(),
            error_samples,
            duration_s,
            ttft_ms: Percentiles::of(&mut ttft),
            itl_ms: Percentiles::of(&mut itl),
            e2e_ms: Percentiles::of(&mut e2e),
            requests_per_s: per_s(ok.len() as f64),
            output_tokens,
            output_tokens_per_s: per_s(output_tokens as f64),
            kv_hit_rate: (prompt > 0).then(|| cached as f64 / prompt as f64),
            replay: None,
        }
    }

    pub fn from_replay(label: &str, r: &ReplayReport, wall_s: f64) -> Self {
        let rejected = (r.rejected > 0).then(|| {
            format!(
                "{} requests can never fit in an engine's KV cache (rejected)",
                r.rejected
            )
        });
        Self {
            label: label.to_owned(),
            requests: r.requests,
            completed: r.completed,
            errors: r.rejected,
            error_samples: rejected.into_iter().collect(),
            duration_s: r.sim_duration_ms / 1000.0,
            ttft_ms: r.ttft_ms,
            itl_ms: r.itl_ms,
            e2e_ms: r.e2e_ms,
            requests_per_s: r.requests_per_s,
            output_tokens: r.output_tokens,
            output_tokens_per_s: r.output_tokens_per_s,
            kv_hit_rate: Some(r.prefix_cache_hit_rate),
            replay: Some(ReplayDetails {
                preemptions: r.preemptions,
                engine_steps: r.steps,
                wall_s,
            }),
        }
    }
}

/// One row per run: latencies in ms, throughput, KV hit rate.
pub fn markdown_table(reports: &[Report]) -> String {
    let mut out = String::from(
        "| run | requests | errors | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 | ITL p99 | E2E p50 | E2E p99 | req/s | output tok/s | KV hit rate |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        let hit = r
            .kv_hit_rate
            .map_or_else(|| "n/a".to_owned(), |h| format!("{:.1}%", h * 100.0));
        writeln!(
            out,
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.0} | {:.0} | {:.2} | {:.0} | {hit} |",
            r.label,
            r.requests,
            r.errors,
            r.ttft_ms.p50,
            r.ttft_ms.p90,
            r.ttft_ms.p99,
            r.itl_ms.p50,
            r.itl_ms.p99,
            r.e2e_ms.p50,
            r.e2e_ms.p99,
            r.requests_per_s,
            r.output_tokens_per_s,
        )
        .expect("writing to a String");
    }
    out
}

/// Each run against the run labelled `baseline` (round-robin): its hit rate over the
/// baseline's, and the baseline's TTFT over its own (above 1: better than the baseline).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ratio {
    pub label: String,
    pub baseline: String,
    pub kv_hit_rate: Option<f64>,
    pub ttft_p50: f64,
    pub ttft_p90: f64,
}

/// Ratios of every run but the baseline; empty without a baseline run.
pub fn ratios(reports: &[Report], baseline: &str) -> Vec<Ratio> {
    let Some(base) = reports.iter().find(|r| r.label == baseline) else {
        return Vec::new();
    };
    reports
        .iter()
        .filter(|r| r.label != baseline)
        .map(|r| Ratio {
            label: r.label.clone(),
            baseline: baseline.to_owned(),
            kv_hit_rate: match (r.kv_hit_rate, base.kv_hit_rate) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            },
            ttft_p50: base.ttft_ms.p50 / r.ttft_ms.p50,
            ttft_p90: base.ttft_ms.p90 / r.ttft_ms.p90,
        })
        .collect()
}

pub fn ratio_table(ratios: &[Ratio]) -> String {
    let mut out = String::from(
        "| run | KV hit rate / baseline's | baseline TTFT p50 / run's | baseline TTFT p90 / run's |\n\
         |---|---|---|---|\n",
    );
    for r in ratios {
        let hit = r
            .kv_hit_rate
            .map_or_else(|| "n/a".to_owned(), |h| format!("{h:.2}x"));
        writeln!(
            out,
            "| {} vs {} | {hit} | {:.2}x | {:.2}x |",
            r.label, r.baseline, r.ttft_p50, r.ttft_p90
        )
        .expect("writing to a String");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ttft: f64, itl: &[f64], prompt: u64, cached: Option<u64>) -> RequestRecord {
        RequestRecord {
            sent_ms: 0.0,
            ttft_ms: Some(ttft),
            itl_ms: itl.to_vec(),
            e2e_ms: ttft + itl.iter().sum::<f64>(),
            output_tokens: itl.len() as u64 + 1,
            prompt_tokens: Some(prompt),
            cached_tokens: cached,
            error: None,
        }
    }

    fn failed(message: &str) -> RequestRecord {
        RequestRecord {
            error: Some(message.to_owned()),
            ..RequestRecord::default()
        }
    }

    #[test]
    fn records_summarise_by_hand() {
        let records = vec![
            record(10.0, &[2.0, 4.0], 100, Some(50)),
            record(30.0, &[6.0], 100, Some(0)),
            record(20.0, &[], 200, None), // no usage detail: left out of the hit rate
            failed("HTTP 400: too long"),
            failed("HTTP 400: too long"),
            failed("timed out"),
        ];
        let r = Report::from_records("live", &records, 2.0);
        assert_eq!((r.requests, r.completed, r.errors), (6, 3, 3));
        assert_eq!(r.error_samples, ["HTTP 400: too long", "timed out"]);
        assert_eq!(
            (r.ttft_ms.p50, r.ttft_ms.p90, r.ttft_ms.count),
            (20.0, 30.0, 3)
        );
        assert_eq!((r.itl_ms.p50, r.itl_ms.p99, r.itl_ms.mean), (4.0, 6.0, 4.0));
        assert_eq!(r.e2e_ms.p50, 20.0); // e2e: 16, 36, 20
        assert_eq!(r.output_tokens, 3 + 2 + 1);
        assert_eq!((r.requests_per_s, r.output_tokens_per_s), (1.5, 3.0));
        assert_eq!(r.kv_hit_rate, Some(0.25));
        assert_eq!(
            Report::from_records("x", &[failed("e")], 1.0).kv_hit_rate,
            None
        );
    }

    #[test]
    fn percentiles_take_the_nearest_rank_even_for_tiny_samples() {
        let one = Report::from_records("x", &[record(7.0, &[], 1, None)], 1.0);
        assert_eq!((one.ttft_ms.p50, one.ttft_ms.p99), (7.0, 7.0));
        let none = Report::from_records("x", &[], 0.0);
        assert_eq!((none.ttft_ms.count, none.requests_per_s), (0, 0.0));
        // Ten values 1..=10: p50 is the 5th, p90 the 9th, p99 the 10th.
        let ten: Vec<_> = (1..=10)
            .map(|t| record(f64::from(t), &[], 1, None))
            .collect();
        let r = Report::from_records("x", &ten, 1.0);
        assert_eq!(
            (r.ttft_ms.p50, r.ttft_ms.p90, r.ttft_ms.p99),
            (5.0, 9.0, 10.0)
        );
    }

    #[test]
    fn ratios_compare_with_round_robin() {
        let mut kv = Report::from_records("kv", &[record(10.0, &[], 100, Some(60))], 1.0);
        let rr = Report::from_records("round-robin", &[record(25.0, &[], 100, Some(20))], 1.0);
        kv.ttft_ms.p90 = 5.0;
        let r = ratios(&[kv.clone(), rr.clone()], "round-robin");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].label, "kv");
        assert!((r[0].kv_hit_rate.unwrap() - 3.0).abs() < 1e-12);
        assert_eq!((r[0].ttft_p50, r[0].ttft_p90), (2.5, 5.0));
        let table = ratio_table(&r);
        assert!(
            table.contains("| kv vs round-robin | 3.00x | 2.50x | 5.00x |"),
            "{table}"
        );
        assert!(ratios(&[kv.clone()], "round-robin").is_empty());
        let rows = markdown_table(&[kv, rr]);
        assert_eq!(rows.lines().count(), 4);
        assert!(rows.contains("| round-robin | 1 | 0 | 25.0 |"), "{rows}");
    }
}
