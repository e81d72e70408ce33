//! `/health`, `/ready` and the relay's connection state over real sockets.

mod common;

use common::*;
use serde_json::Value;

async fn ready(sidecar: &dynamo_sidecar::Sidecar) -> (u16, Value) {
    let response = reqwest::get(format!("http://{}/ready", sidecar.metrics_addr))
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn ready_follows_the_engine_and_the_event_subscription() {
    let upstream = Upstream::start().await;
    let mut engine = EnginePublisher::bind().await;
    let sidecar = sidecar(&upstream.url, Some(&engine.endpoint), None).await;
    let health = reqwest::get(format!("http://{}/health", sidecar.metrics_addr))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);

    engine.wait_subscriber().await;
    eventually("ready once subscribed", || async {
        ready(&sidecar).await
            == (
                200,
                serde_json::json!({
                    "ready": true, "engine": "ok", "kv_events": "connected", "draining": false,
                }),
            )
    })
    .await;
    assert_eq!(
        metric(&sidecar, "dynamo_sidecar_relay_connected", "").await,
        1.0
    );

    // The engine's event socket goes away: the pod is not ready until it is back.
    drop(engine);
    eventually("not ready without the event subscription", || async {
        let (status, body) = ready(&sidecar).await;
        status == 503 && body["kv_events"] == "not connected"
    })
    .await;
    assert_eq!(
        metric(&sidecar, "dynamo_sidecar_relay_connected", "").await,
        0.0
    );
}

#[tokio::test]
async fn a_disabled_relay_does_not_hold_readiness_back() {
    let upstream = Upstream::start().await;
    let sidecar = sidecar(&upstream.url, None, None).await;
    let (status, body) = ready(&sidecar).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["kv_events"], "disabled");
}
