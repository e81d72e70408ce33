//! What the planner reads from Prometheus, over its HTTP API: the frontend's traffic and
//! latencies over the last interval (throughput mode) and each engine's load now (load
//! mode), in Dynamo's metric names, which the endpoint picker exports.
//!
//! Queries follow Dynamo's planner (`../shared/research/pillars.md` section 4): a mean is
//! `increase(m_sum[I]) / increase(m_count[I])`, a count `increase(m_total[I])`, summed over
//! the matching series (every picker replica). Unlike Dynamo, an absent series is `None`,
//! never 0: the planner holds rather than reading "no data" as "no traffic".

use std::collections::BTreeMap;

use dynamo_names::metrics::frontend::{
    ENGINE_KV_BLOCKS, INPUT_SEQUENCE_TOKENS as ISL, INTER_TOKEN_LATENCY as ITL,
    MODEL_KV_CACHE_BLOCK_SIZE as BLOCK_SIZE, OUTPUT_SEQUENCE_TOKENS as OSL,
    REQUEST_DURATION as DURATION, REQUESTS, TIME_TO_FIRST_TOKEN as TTFT,
    WORKER_ACTIVE_DECODE_BLOCKS as ACTIVE_DECODE, WORKER_ACTIVE_PREFILL_TOKENS as ACTIVE_PREFILL,
};
use prometheus_http_query::Client;
use prometheus_http_query::response::Data;

use super::cycle::{EngineReading, Traffic, WorkerKind};

#[derive(Debug, thiserror::Error)]
#[error("Prometheus at {url}: {message}")]
pub struct SourceError {
    url: String,
    message: String,
}

pub struct Prometheus {
    client: Client,
    url: String,
    /// `{model="..."}` or empty.
    selector: String,
}

impl Prometheus {
    /// `url` is Prometheus' base URL; `model`, when given, keeps only that model's series.
    pub fn new(url: &str, model: Option<&str>) -> Result<Self, SourceError> {
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(10))
            .build()
            .expect("a plain HTTP client builds");
        let client = Client::from(client, url).map_err(|e| SourceError {
            url: url.into(),
            message: e.to_string(),
        })?;
        let selector = model
            .map(|m| {
                format!(
                    "{{model=\"{}\"}}",
                    m.replace('\\', "\\\\").replace('"', "\\\"")
                )
            })
            .unwrap_or_default();
        Ok(Self {
            client,
            url: url.into(),
            selector,
        })
    }

    fn error(&self, message: impl ToString) -> SourceError {
        SourceError {
            url: self.url.clone(),
            message: message.to_string(),
        }
    }

    /// Every sample of an instant query, with its labels. An empty answer is `[]`.
    async fn query(
        &self,
        promql: &str,
    ) -> Result<Vec<(BTreeMap<String, String>, f64)>, SourceError> {
        let result = self
            .client
            .query(promql)
            .get()
            .await
            .map_err(|e| self.error(e))?;
        match result.data() {
            Data::Vector(v) => Ok(v
                .iter()
                .map(|s| {
                    let labels = s
                        .metric()
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    (labels, s.sample().value())
                })
                .collect()),
            Data::Scalar(s) => Ok(vec![(BTreeMap::new(), s.value())]),
            other => Err(self.error(format!("{promql}: unexpected result {other:?}"))),
        }
    }

    /// One number, or `None` when the query matched no series.
    async fn scalar(&self, promql: &str) -> Result<Option<f64>, SourceError> {
        Ok(self.query(promql).await?.first().map(|(_, v)| *v))
    }

    /// The mean of histogram `m` over the window: NaN when it had no observations.
    async fn mean(&self, m: &str, window: &str) -> Result<Option<f64>, SourceError> {
        let s = &self.selector;
        self.scalar(&format!(
            "sum(increase({m}_sum{s}[{window}])) / sum(increase({m}_count{s}[{window}]))"
        ))
        .await
    }

    /// The frontend's traffic over the last `interval_s` seconds.
    pub async fn traffic(&self, interval_s: f64) -> Result<Traffic, SourceError> {
        let window = format!("{}s", interval_s.round().max(1.0) as u64);
        let s = &self.selector;
        let ms = |v: Option<f64>| v.map(|x| x * 1000.0);
        Ok(Traffic {
            requests: self
                .scalar(&format!("sum(increase({REQUESTS}_total{s}[{window}]))"))
                .await?,
            isl: self.mean(ISL, &window).await?,
            osl: self.mean(OSL, &window).await?,
            ttft_ms: ms(self.mean(TTFT, &window).await?),
            itl_ms: ms(self.mean(ITL, &window).await?),
            duration_s: self.mean(DURATION, &window).await?,
        })
    }

    /// Each engine's load now. Active prefill tokens are summed over the picker replicas
    /// (each counts only what it sent); active decode blocks already include what other
    /// replicas sent (the picker corrects its view with the engine's own usage), so the
    /// largest view is taken. KV capacity is the engine's reported block count.
    pub async fn engines(&self) -> Result<Vec<EngineReading>, SourceError> {
        let prefill = self
            .query(&format!(
                "sum by (worker_id, worker_type) ({ACTIVE_PREFILL})"
            ))
            .await?;
        let decode = self
            .query(&format!("max by (worker_id) ({ACTIVE_DECODE})"))
            .await?;
        let capacity = self
            .query(&format!("max by (pod) ({ENGINE_KV_BLOCKS})"))
            .await?;
        let block_size = self
            .scalar(&format!("max({BLOCK_SIZE}{})", self.selector))
            .await?;
        let label = |l: &BTreeMap<String, String>, k: &str| l.get(k).cloned().unwrap_or_default();
        let by = |rows: &[(BTreeMap<String, String>, f64)], key: &str, id: &str| {
            rows.iter()
                .find(|(l, _)| l.get(key).map(String::as_str) == Some(id))
                .map(|(_, v)| *v)
        };
        Ok(prefill
            .iter()
            .map(|(labels, tokens)| {
                let id = label(labels, "worker_id");
                let kind = if label(labels, "worker_type") == "prefill" {
                    WorkerKind::Prefill
                } else {
                    WorkerKind::Decode
                };
                EngineReading {
                    prefill_tokens: *tokens,
                    decode_kv_tokens: by(&decode, "worker_id", &id)
                        .zip(block_size)
                        .map(|(b, s)| b * s),
                    max_kv_tokens: by(&capacity, "pod", &id)
                        .zip(block_size)
                        .map(|(b, s)| b * s),
                    worker_id: id,
                    kind,
                }
            })
            .collect())
    }
}
