//! Load correction from the engines themselves: each pod's `/metrics` is read every
//! `--metrics-poll-interval` for the requests waiting in the engine's queue, its KV cache
//! usage (0 to 1) and, where the engine says it, its KV cache size in blocks; the router's
//! load view is raised to what the engine reports (EPP replicas each see only their
//! share). vLLM, SGLang and TensorRT-LLM name these differently: [`ENGINES`] lists each
//! kind's names, and a pod is read by the first kind whose names its text carries.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dynamo_kvcache::{EngineMetrics, WorkerId};
use tokio::time::MissedTickBehavior;

use crate::router::Router;

/// Where an engine states its KV cache size in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlocksSource {
    /// A label of an info series (`series{label="n"} 1`).
    Label {
        series: &'static str,
        label: &'static str,
    },
    /// A gauge's value.
    Gauge(&'static str),
    /// Not stated in blocks.
    Unstated,
}

/// One engine kind's metric names for the load the picker reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineNames {
    pub kind: &'static str,
    /// Gauge: requests waiting to be scheduled.
    pub waiting: &'static str,
    /// Gauge: fraction (0 to 1) of the KV cache in use.
    pub kv_usage: &'static str,
    pub kv_blocks: BlocksSource,
}

/// The engine kinds the operator wires, with their names:
/// - vLLM v1, `vllm/v1/metrics/loggers.py`: `vllm:num_requests_waiting`,
///   `vllm:kv_cache_usage_perc`, `vllm:cache_config_info{num_gpu_blocks}`.
/// - SGLang, `python/sglang/srt/metrics/collector.py` (`SchedulerMetricsCollector`):
///   `sglang:num_queue_reqs`, `sglang:token_usage` (tokens in use over the pool's
///   tokens); its size is stated in tokens (`sglang:max_total_num_tokens`), not blocks.
/// - TensorRT-LLM, `tensorrt_llm/metrics/collector.py` (`MetricsCollector`, as
///   `trtllm-serve` and Dynamo's trtllm worker export it): `trtllm_num_requests_waiting`,
///   `trtllm_kv_cache_utilization` (used over max blocks), `trtllm_kv_cache_max_blocks`.
pub const ENGINES: [EngineNames; 3] = [
    EngineNames {
        kind: "vllm",
        waiting: "vllm:num_requests_waiting",
        kv_usage: "vllm:kv_cache_usage_perc",
        kv_blocks: BlocksSource::Label {
            series: "vllm:cache_config_info",
            label: "num_gpu_blocks",
        },
    },
    EngineNames {
        kind: "sglang",
        waiting: "sglang:num_queue_reqs",
        kv_usage: "sglang:token_usage",
        kv_blocks: BlocksSource::Unstated,
    },
    EngineNames {
        kind: "trtllm",
        waiting: "trtllm_num_requests_waiting",
        kv_usage: "trtllm_kv_cache_utilization",
        kv_blocks: BlocksSource::Gauge("trtllm_kv_cache_max_blocks"),
    },
];

/// One sample line: metric name, label text (without braces) and value.
fn samples(text: &str) -> impl Iterator<Item = (&str, &str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, labels) = series.trim().split_once('{').unwrap_or((series.trim(), ""));
            Some((name, labels, value.trim().parse::<f64>().ok()?))
        })
}

/// Reads the engine's metrics text: which kind wrote it and its load; `None` when no
/// kind's load metrics are there.
pub fn parse(text: &str) -> Option<(&'static str, EngineMetrics)> {
    ENGINES
        .iter()
        .find_map(|names| read(text, names).map(|metrics| (names.kind, metrics)))
}

fn read(text: &str, names: &EngineNames) -> Option<EngineMetrics> {
    let mut waiting = None;
    let mut usage: Option<f64> = None;
    let mut blocks = None;
    for (name, labels, value) in samples(text) {
        // One series per engine (model, data-parallel rank): waiting adds up, usage is
        // the fullest engine's.
        if name == names.waiting {
            *waiting.get_or_insert(0.0) += value;
        } else if name == names.kv_usage {
            usage = Some(usage.map_or(value, |u| u.max(value)));
        } else {
            match names.kv_blocks {
                BlocksSource::Label { series, label: key } if name == series => {
                    blocks = label(labels, key).or(blocks);
                }
                BlocksSource::Gauge(series) if name == series && value >= 0.0 => {
                    blocks = Some(value as u64);
                }
                _ => {}
            }
        }
    }
    if waiting.is_none() && usage.is_none() {
        return None;
    }
    Some(EngineMetrics {
        num_requests_waiting: waiting.unwrap_or(0.0).max(0.0) as u64,
        kv_cache_usage_perc: usage.unwrap_or(0.0),
        num_gpu_blocks: blocks,
    })
}

fn label(labels: &str, key: &str) -> Option<u64> {
    let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
    let rest = &labels[start..];
    rest[..rest.find('"')?].parse().ok()
}

/// Polls `http://{address}/metrics` every `interval` until the task is aborted.
pub async fn poll(
    router: Arc<Router>,
    worker: WorkerId,
    address: SocketAddr,
    interval: Duration,
    client: reqwest::Client,
) {
    let url = format!("http://{address}/metrics");
    let metrics = router.metrics().clone();
    let pod = address.to_string();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let read = async {
            let response = client
                .get(&url)
                .timeout(interval.max(Duration::from_secs(1)))
                .send()
                .await?
                .error_for_status()?;
            response.text().await
        };
        let result = match read.await {
            Ok(text) => match parse(&text) {
                Some((_, m)) => {
                    metrics.engine(&pod, &m);
                    router.observe_engine(worker, m);
                    "ok"
                }
                None => "no_engine_metrics",
            },
            Err(e) => {
                tracing::debug!(%url, error = %e, "engine metrics unavailable");
                "error"
            }
        };
        metrics
            .engine_polls
            .get_or_create(&vec![("result", result.to_owned())])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each engine kind's exposition text as it writes it (names, labels and types from
    /// the sources cited on [`ENGINES`]), with other metrics around the load ones.
    const VLLM: &str = include_str!("../tests/engine_metrics/vllm.txt");
    const SGLANG: &str = include_str!("../tests/engine_metrics/sglang.txt");
    const TRTLLM: &str = include_str!("../tests/engine_metrics/trtllm.txt");

    fn load(waiting: u64, usage: f64, blocks: Option<u64>) -> EngineMetrics {
        EngineMetrics {
            num_requests_waiting: waiting,
            kv_cache_usage_perc: usage,
            num_gpu_blocks: blocks,
        }
    }

    #[test]
    fn reads_vllm_load_metrics() {
        assert_eq!(parse(VLLM), Some(("vllm", load(5, 0.5, Some(1024)))));
        assert_eq!(parse("# EOF\nother_metric 1\n"), None);
    }

    #[test]
    fn reads_sglang_load_metrics() {
        assert_eq!(parse(SGLANG), Some(("sglang", load(4, 0.62, None))));
    }

    #[test]
    fn reads_tensorrt_llm_load_metrics() {
        assert_eq!(parse(TRTLLM), Some(("trtllm", load(6, 0.375, Some(8192)))));
    }
}
