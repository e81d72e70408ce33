//! Load correction from the engines themselves: each pod's `/metrics` is read every
//! `--metrics-poll-interval` for vLLM's `vllm:num_requests_waiting`,
//! `vllm:kv_cache_usage_perc` and `vllm:cache_config_info{num_gpu_blocks}` (names from
//! vLLM v1's Prometheus logger, `vllm/v1/metrics/loggers.py`), and the router's load view
//! is raised to what the engine reports (EPP replicas each see only their share).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dynamo_kvcache::{EngineMetrics, WorkerId};
use tokio::time::MissedTickBehavior;

use crate::router::Router;

/// Reads the engine's metrics text; `None` when it has neither load metric.
pub fn parse(text: &str) -> Option<EngineMetrics> {
    let mut waiting = None;
    let mut usage: Option<f64> = None;
    let mut blocks = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = match line.rsplit_once(' ') {
            Some((s, v)) => (s.trim(), v.trim()),
            None => continue,
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        match name {
            // One series per engine (model, data-parallel rank): waiting adds up, usage
            // is the fullest engine's.
            "vllm:num_requests_waiting" => *waiting.get_or_insert(0.0) += value,
            "vllm:kv_cache_usage_perc" => usage = Some(usage.map_or(value, |u| u.max(value))),
            "vllm:cache_config_info" => blocks = label(labels, "num_gpu_blocks").or(blocks),
            _ => {}
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
                Some(m) => {
                    metrics.engine(&pod, m.kv_cache_usage_perc, m.num_gpu_blocks);
                    router.observe_engine(worker, m);
                    "ok"
                }
                None => "no_vllm_metrics",
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

    #[test]
    fn reads_vllm_load_metrics() {
        let text = "\
# HELP vllm:num_requests_waiting Requests waiting
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name=\"m\"} 3
vllm:num_requests_waiting{model_name=\"m\",engine=\"1\"} 2.0
vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25
vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"1\"} 0.5
vllm:cache_config_info{block_size=\"16\",model_name=\"m\",num_gpu_blocks=\"1024\"} 1
vllm:num_requests_running{model_name=\"m\"} 7
";
        assert_eq!(
            parse(text),
            Some(EngineMetrics {
                num_requests_waiting: 5,
                kv_cache_usage_perc: 0.5,
                num_gpu_blocks: Some(1024),
            })
        );
        assert_eq!(parse("# EOF\nother_metric 1\n"), None);
    }
}
