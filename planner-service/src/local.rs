//! A local graph's replicas, through the runner's admin API (`GET /graph`, `POST /scale`):
//! the stand-in for the scaling adapters when `dynamo run` runs the graph.

use std::time::Duration;

use dynamo_names::Role;
use reqwest::StatusCode;

use super::target::{GraphView, ScaleError, ServiceView};
use dynamo_wiring::admin::GraphStatus;

pub struct LocalTarget {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl LocalTarget {
    /// `base` is the admin API's URL (`http://127.0.0.1:PORT`); `token` its bearer token.
    pub fn new(base: &str, token: Option<String>) -> Self {
        Self {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("a plain HTTP client builds"),
            base: base.trim_end_matches('/').to_string(),
            token,
        }
    }

    fn request(&self, builder: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    pub async fn read(&self) -> Result<GraphView, ScaleError> {
        let response = self
            .request(self.client.get(format!("{}/graph", self.base)))
            .send()
            .await
            .map_err(|e| ScaleError::Other(format!("admin API {}: {e}", self.base)))?;
        let status: GraphStatus = checked(response).await?.json().await.map_err(|e| {
            ScaleError::Other(format!("admin API answered GET /graph unreadably: {e}"))
        })?;
        view(&status)
    }

    pub async fn write(&self, service: &str, replicas: u32) -> Result<(), ScaleError> {
        let response = self
            .request(self.client.post(format!("{}/scale", self.base)))
            .json(&serde_json::json!({ "service": service, "replicas": replicas }))
            .send()
            .await
            .map_err(|e| ScaleError::Other(format!("admin API {}: {e}", self.base)))?;
        checked(response).await.map(drop)
    }
}

/// The response, or its status and body as the matching error.
async fn checked(response: reqwest::Response) -> Result<reqwest::Response, ScaleError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let message = format!("admin API: {status}: {}", body.trim());
    Err(match status {
        StatusCode::NOT_FOUND => ScaleError::NotFound(message),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ScaleError::Forbidden(message),
        StatusCode::CONFLICT => ScaleError::Conflict(message),
        _ => ScaleError::Other(message),
    })
}

/// The engine services of a runner's status: replicas running, rolling out while one is
/// not ready yet.
fn view(status: &GraphStatus) -> Result<GraphView, ScaleError> {
    let services = status
        .roles
        .iter()
        .map(|(name, role)| {
            let role: Role = role
                .parse()
                .map_err(|e| ScaleError::Other(format!("admin API: service {name:?}: {e}")))?;
            let replicas = status.services.get(name).map(Vec::as_slice).unwrap_or(&[]);
            Ok(ServiceView {
                name: name.clone(),
                role,
                replicas: replicas.len() as u32,
                rolling_out: replicas.iter().any(|r| !r.ready),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(GraphView { services })
}
