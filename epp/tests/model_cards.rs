//! A picker started without a model directory, as the operator starts it: it loads the
//! model from a pod's model card (a real sidecar in front of a real mock engine), serves
//! 503 until then, and never routes to a pod whose card names another model.

mod common;

use clap::Parser;
use common::*;
use dynamo_epp::config::RouterConfig;
use dynamo_epp::start;
use dynamo_sidecar::{Config as SidecarConfig, Sidecar};
use serde_json::{Value, json};

/// A real sidecar in front of `pod`'s engine, serving its model card as `name`.
async fn sidecar(pod: &Pod, name: &str) -> Sidecar {
    let model = model_dir();
    let engine = format!("http://{}", pod.address);
    let config = SidecarConfig::parse_from([
        "dynamo-sidecar",
        "--listen",
        "127.0.0.1:0",
        "--host",
        "127.0.0.1",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        "--engine-url",
        &engine,
        "--engine-kv-events",
        "none",
        "--model-name",
        name,
        "--model-source",
        model.to_str().unwrap(),
    ]);
    Sidecar::start(&config).await.expect("the sidecar starts")
}

fn entry(pod: &Pod, sidecar: &Sidecar) -> Value {
    json!({
        "address": sidecar.proxy_addr.to_string(),
        "kv_events": pod.kv_events(),
        "sidecar_metrics": format!("http://{}", sidecar.metrics_addr),
    })
}

#[tokio::test]
async fn the_model_comes_from_the_first_pods_card_and_a_pod_of_another_model_is_avoided() {
    let file = EndpointsFile::new();
    let mut config = config(&file, RouterConfig::default());
    config.model_path = None;
    config.model_name = Some(MODEL.into());
    let epp = start(config).await.unwrap();
    let base = format!("http://{}", epp.http_addr);
    let client = reqwest::Client::new();

    // No pod yet: no model, and the picker says what it waits for.
    let health = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(health.status(), 503);
    let refused = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat("hello", 4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_loaded", "{body}");

    let (good, stray) = (Pod::start().await, Pod::start().await);
    let (good_sidecar, stray_sidecar) = (
        sidecar(&good, MODEL).await,
        sidecar(&stray, "another").await,
    );
    // The pod of another model comes first: the picker must not load the model from it.
    file.write(&[entry(&stray, &stray_sidecar)]);
    let stray_series = format!(
        "dynamo_epp_model_card_mismatch{{pod=\"{}\"}}",
        stray_sidecar.proxy_addr
    );
    eventually("the stray pod is reported", || async {
        let text = reqwest::get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        metric_value(&text, &stray_series) == Some(1)
    })
    .await;
    let health: Value = reqwest::get(format!("{base}/health"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        health["reason"]
            .as_str()
            .unwrap()
            .contains("has not loaded"),
        "{health}"
    );

    file.write(&[entry(&good, &good_sidecar), entry(&stray, &stray_sidecar)]);
    eventually("the model is loaded from the good pod's card", || async {
        reqwest::get(format!("{base}/v1/models"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    let models: Value = reqwest::get(format!("{base}/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    eventually("the picker is ready", || async {
        reqwest::get(format!("{base}/health"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;

    for i in 0..6 {
        let answer = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat(&text(40, i), 4, false))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{:?}", answer.text().await);
    }
    assert_eq!(good.served().await, 6);
    assert_eq!(
        stray.served().await,
        0,
        "a pod of another model is never picked"
    );
    epp.shutdown().await.unwrap();
}
