//! What the sidecar itself asks the engine's HTTP API, apart from the proxied traffic.

use std::time::Duration;

use serde_json::Value;

/// How long the engine gets to answer one of these requests.
const TIMEOUT: Duration = Duration::from_secs(2);

/// `path` (from its leading `/`) on the engine whose base URL is `engine`.
pub fn url(engine: &reqwest::Url, path: &str) -> String {
    format!("{}{path}", engine.as_str().trim_end_matches('/'))
}

/// `Ok` when the engine's `/health` answers 2xx (vLLM's and the mocker's do once up).
pub async fn check_health(client: &reqwest::Client, engine: &reqwest::Url) -> Result<(), String> {
    let answer = client
        .get(url(engine, "/health"))
        .timeout(TIMEOUT)
        .send()
        .await
        .map_err(|e| format!("unreachable: {e}"))?;
    match answer.status() {
        s if s.is_success() => Ok(()),
        s => Err(format!("answered {s}")),
    }
}

/// The engine's served model name: the first model of its OpenAI `/v1/models` list
/// (vLLM lists the base model first, then LoRA adapters). Waits until the engine answers.
pub async fn served_model(client: &reqwest::Client, engine: &reqwest::Url) -> String {
    loop {
        match first_model(client, engine).await {
            Ok(name) => return name,
            Err(e) => {
                tracing::debug!(%engine, error = %e, "engine model not known yet");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// The first model of the engine's `/v1/models`, asked once.
pub async fn first_model(
    client: &reqwest::Client,
    engine: &reqwest::Url,
) -> anyhow::Result<String> {
    let list: Value = client
        .get(url(engine, "/v1/models"))
        .timeout(TIMEOUT)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    list["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no model in {list}"))
}

/// Tokens per KV block as the engine's metrics say: the `block_size` label of vLLM's
/// `vllm:cache_config_info` gauge (`vllm/v1/metrics/loggers.py`; the mock engine exports
/// it too). `None` when the engine has no such metric.
pub async fn block_size(client: &reqwest::Client, engine: &reqwest::Url) -> Option<u32> {
    let text = client
        .get(url(engine, "/metrics"))
        .timeout(TIMEOUT)
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let labels = text
        .lines()
        .find_map(|line| line.strip_prefix("vllm:cache_config_info{"))?;
    let value = labels.split("block_size=\"").nth(1)?;
    value[..value.find('"')?].parse().ok()
}
