//! The proxy over real sockets: a client, the sidecar, and an HTTP engine stand-in.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use serde_json::Value;

#[tokio::test]
async fn sse_passes_chunk_by_chunk_with_headers_and_body_intact() {
    let upstream = Upstream::start().await;
    let sidecar = sidecar(&upstream.url, None, None).await;
    let body = r#"{"model":"m","stream":true,"messages":[]}"#;
    let mut response = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/chat/completions?x=1",
            sidecar.proxy_addr
        ))
        .header("content-type", "application/json")
        .header("x-request-id", "abc")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-engine"], "yes");
    assert_eq!(response.headers()["content-type"], "text/event-stream");

    // The first chunk arrives while the engine holds back the second.
    let mut so_far = String::new();
    read_until(&mut response, &mut so_far, "data: 1\n\n").await;
    assert_eq!(so_far, "data: 1\n\n");
    assert_eq!(sidecar.metrics.in_flight.get(), 1);
    upstream.release();
    read_until(&mut response, &mut so_far, "data: [DONE]\n\n").await;
    assert_eq!(so_far, "data: 1\n\ndata: 2\n\ndata: [DONE]\n\n");
    assert!(response.chunk().await.unwrap().is_none());

    let (headers, seen_body) = upstream.state.seen.lock().unwrap().clone().unwrap();
    assert_eq!(seen_body, body.as_bytes());
    assert_eq!(headers["x-request-id"], "abc");
    // The engine sees itself as the host, not the sidecar.
    assert_eq!(
        headers["host"].to_str().unwrap(),
        upstream.url.trim_start_matches("http://")
    );
    eventually(
        "the finished request leaves the in-flight gauge",
        || async { sidecar.metrics.in_flight.get() == 0 },
    )
    .await;
    assert_eq!(
        metric(&sidecar, "dynamo_sidecar_requests_total", "status=\"2xx\"").await,
        1.0
    );
}

#[tokio::test]
async fn any_path_reaches_the_engine_including_its_metrics() {
    let upstream = Upstream::start().await;
    let sidecar = sidecar(&upstream.url, None, None).await;
    let base = format!("http://{}", sidecar.proxy_addr);
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap();
    assert_eq!(
        metrics.text().await.unwrap(),
        "vllm:num_requests_running 3\n"
    );
    let missing = reqwest::get(format!("{base}/no/such/path")).await.unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(
        metric(&sidecar, "dynamo_sidecar_requests_total", "status=\"4xx\"").await,
        1.0
    );
}

#[tokio::test]
async fn a_client_that_leaves_cancels_the_engine_request() {
    let upstream = Upstream::start().await;
    let sidecar = sidecar(&upstream.url, None, None).await;
    let mut response = reqwest::get(format!("http://{}/forever", sidecar.proxy_addr))
        .await
        .unwrap();
    let mut so_far = String::new();
    read_until(&mut response, &mut so_far, "data: tick\n\n").await;
    assert!(!upstream.state.forever_dropped.load(Ordering::SeqCst));
    drop(response);
    eventually("the engine sees its connection dropped", || async {
        upstream.state.forever_dropped.load(Ordering::SeqCst)
    })
    .await;
    eventually("the in-flight gauge returns to 0", || async {
        sidecar.metrics.in_flight.get() == 0
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_engine_gets_a_clear_openai_error() {
    // A port nobody listens on.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let sidecar = sidecar(&format!("http://127.0.0.1:{port}"), None, None).await;
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", sidecar.proxy_addr))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "service_unavailable", "{body}");
    assert_eq!(body["error"]["code"], "engine_unreachable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");

    let ready = reqwest::get(format!("http://{}/ready", sidecar.metrics_addr))
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let ready: Value = ready.json().await.unwrap();
    assert!(
        ready["engine"].as_str().unwrap().starts_with("unreachable"),
        "{ready}"
    );
    assert_eq!(
        metric(&sidecar, "dynamo_sidecar_requests_total", "status=\"5xx\"").await,
        1.0
    );
}

#[tokio::test]
async fn shutdown_stops_accepting_and_lets_in_flight_requests_finish() {
    let upstream = Upstream::start().await;
    let sidecar = sidecar(&upstream.url, None, None).await;
    let (proxy, metrics_addr) = (sidecar.proxy_addr, sidecar.metrics_addr);
    let mut response = reqwest::Client::new()
        .post(format!("http://{proxy}/v1/chat/completions"))
        .body("{}")
        .send()
        .await
        .unwrap();
    let mut so_far = String::new();
    read_until(&mut response, &mut so_far, "data: 1\n\n").await;

    let shutdown = tokio::spawn(sidecar.shutdown(WAIT));
    eventually("the proxy stops accepting connections", || async {
        tokio::net::TcpStream::connect(proxy).await.is_err()
    })
    .await;
    let ready = reqwest::get(format!("http://{metrics_addr}/ready"))
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    assert_eq!(ready.json::<Value>().await.unwrap()["draining"], true);
    assert!(!shutdown.is_finished(), "shutdown waits for the request");

    upstream.release();
    read_until(&mut response, &mut so_far, "data: [DONE]\n\n").await;
    tokio::time::timeout(WAIT, shutdown)
        .await
        .expect("shutdown ends once the request is done")
        .unwrap();
}

#[tokio::test]
async fn shutdown_gives_up_on_requests_after_the_grace_period() {
    let upstream = Upstream::start().await;
    let sidecar = sidecar(&upstream.url, None, None).await;
    let mut response = reqwest::get(format!("http://{}/forever", sidecar.proxy_addr))
        .await
        .unwrap();
    let mut so_far = String::new();
    read_until(&mut response, &mut so_far, "data: tick\n\n").await;
    tokio::time::timeout(WAIT, sidecar.shutdown(Duration::from_millis(300)))
        .await
        .expect("shutdown ends after its grace although the stream never does");
}
