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
    let url = url(engine, "/v1/models");
    loop {
        match first_model(client, &url).await {
            Ok(name) => return name,
            Err(e) => {
                tracing::debug!(%url, error = %e, "engine model not known yet");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

async fn first_model(client: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    let list: Value = client
        .get(url)
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
