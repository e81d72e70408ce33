//! The proxy over real sockets: a client, the sidecar, and an HTTP engine stand-in.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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
async fn only_allowed_paths_reach_the_engine() {
    let upstream = Upstream::start().await;
    let sidecar = sidecar(&upstream.url, None, None).await;
    let base = format!("http://{}", sidecar.proxy_addr);
    // The engine's metrics are allowed: the picker reads each pod's load there.
    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap();
    assert_eq!(
        metrics.text().await.unwrap(),
        "vllm:num_requests_running 3\n"
    );
    // An engine admin route is refused by the sidecar itself.
    let admin = reqwest::Client::new()
        .post(format!("{base}/reset_prefix_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(admin.status(), 404);
    let body: Value = admin.json().await.unwrap();
    assert_eq!(body["error"]["code"], "path_not_proxied", "{body}");
    assert_eq!(
        metric(&sidecar, "dynamo_sidecar_requests_total", "status=\"4xx\"").await,
        1.0
    );

    // `*` passes everything: now the engine answers (it has no such route).
    let open = sidecar_with(&upstream.url, None, None, &["--proxy-paths", "*"]).await;
    let missing = reqwest::Client::new()
        .post(format!("http://{}/reset_prefix_cache", open.proxy_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "engine_error", "{body}");
}

/// An engine at a free port answering every request with `status` and a plain-text body,
/// as an HTTP server does for a body over its limit.
async fn plain_text_engine(status: u16, text: &'static str) -> (String, AbortOnDrop) {
    let app = axum::Router::new()
        .fallback(move || async move { (axum::http::StatusCode::from_u16(status).unwrap(), text) });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, AbortOnDrop(server))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[tokio::test]
async fn a_plain_text_engine_error_reaches_the_client_as_an_openai_error() {
    let (engine, _server) = plain_text_engine(413, "Payload Too Large").await;
    let sidecar = sidecar(&engine, None, None).await;
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", sidecar.proxy_addr))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(body["error"]["code"], "engine_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("413") && message.contains("Payload Too Large"),
        "{message}"
    );
}

#[tokio::test]
async fn an_aborted_upload_is_counted_as_the_clients_not_the_engines() {
    use tokio::io::AsyncWriteExt;
    let upstream = Upstream::start().await;
    let sidecar = sidecar(&upstream.url, None, None).await;
    let mut tcp = tokio::net::TcpStream::connect(sidecar.proxy_addr)
        .await
        .unwrap();
    tcp.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{\"model\"",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(tcp);
    eventually("the aborted request is counted", || async {
        metric(&sidecar, "dynamo_sidecar_requests_total", "").await == 1.0
    })
    .await;
    assert_eq!(
        metric(
            &sidecar,
            "dynamo_sidecar_requests_total",
            "status=\"client_aborted\""
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn silent_connections_are_closed_on_every_port() {
    use tokio::io::AsyncReadExt;
    let upstream = Upstream::start().await;
    let sidecar = sidecar_with(
        &upstream.url,
        None,
        None,
        &["--idle-timeout", "300ms", "--header-timeout", "300ms"],
    )
    .await;
    for addr in [sidecar.proxy_addr, sidecar.metrics_addr, sidecar.grpc_addr] {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(WAIT, tcp.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{addr} keeps a silent connection"));
        assert!(matches!(read, Ok(0) | Err(_)), "{addr}: {read:?}");
    }
}

#[tokio::test]
async fn a_client_that_leaves_cancels_the_engine_request() {
    let upstream = Upstream::start().await;
    let sidecar = sidecar_with(&upstream.url, None, None, &["--proxy-paths", "*"]).await;
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
    let sidecar = sidecar_with(&upstream.url, None, None, &["--proxy-paths", "*"]).await;
    let mut response = reqwest::get(format!("http://{}/forever", sidecar.proxy_addr))
        .await
        .unwrap();
    let mut so_far = String::new();
    read_until(&mut response, &mut so_far, "data: tick\n\n").await;
    tokio::time::timeout(WAIT, sidecar.shutdown(Duration::from_millis(300)))
        .await
        .expect("shutdown ends after its grace although the stream never does");
}

/// An engine at a free port that reads each request's head and then does `then` to the
/// connection instead of answering.
async fn raw_engine(
    then: fn(tokio::net::TcpStream) -> Option<tokio::net::TcpStream>,
) -> (String, AbortOnDrop) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        loop {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match tcp.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            if let Some(tcp) = then(tcp) {
                // Kept open until the sidecar gives up on it.
                tokio::spawn(async move {
                    let _tcp = tcp;
                    tokio::time::sleep(Duration::from_secs(30)).await;
                });
            }
        }
    });
    (url, AbortOnDrop(server))
}

async fn post_completion(sidecar: &dynamo_sidecar::Sidecar) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", sidecar.proxy_addr))
        .header("content-type", "application/json")
        .body(r#"{"model":"m","prompt":"hi"}"#)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn an_engine_that_dies_before_answering_is_unreachable_so_the_picker_retries() {
    // Closed, then reset (linger 0), after taking the request: a killed engine.
    let closed: fn(tokio::net::TcpStream) -> Option<tokio::net::TcpStream> = |tcp| {
        drop(tcp);
        None
    };
    let reset: fn(tokio::net::TcpStream) -> Option<tokio::net::TcpStream> = |tcp| {
        tcp.set_zero_linger().unwrap();
        drop(tcp);
        None
    };
    for (how, then) in [("closed", closed), ("reset", reset)] {
        let (engine, _server) = raw_engine(then).await;
        let sidecar = sidecar(&engine, None, None).await;
        let (status, body) = post_completion(&sidecar).await;
        assert_eq!(status, 503, "{how}: {body}");
        assert_eq!(body["error"]["code"], "engine_unreachable", "{how}: {body}");
    }
}

#[tokio::test]
async fn an_engine_that_answers_garbage_is_an_engine_error_not_retried() {
    let garbage: fn(tokio::net::TcpStream) -> Option<tokio::net::TcpStream> = |tcp| {
        tcp.try_write(b"HTTP/1.1 abc nonsense\r\n\r\n").unwrap();
        Some(tcp)
    };
    let (engine, _server) = raw_engine(garbage).await;
    let sidecar = sidecar(&engine, None, None).await;
    let (status, body) = post_completion(&sidecar).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["code"], "engine_error", "{body}");
}

/// An engine at a free port that answers each request on a connection with `answer`,
/// written whole at once, and then keeps the connection for the next request
/// (`keep_alive`) or closes it without saying so; it counts the connections it took.
async fn canned_engine(
    answer: &'static str,
    keep_alive: bool,
) -> (String, Arc<AtomicUsize>, AbortOnDrop) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    let server = tokio::spawn(async move {
        loop {
            let (mut tcp, _) = listener.accept().await.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // One request: its head, then its `content-length` bytes of body.
                    let mut chunk = [0u8; 4096];
                    let head_end = loop {
                        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                        match tcp.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while buf.len() < head_end + length {
                        match tcp.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..head_end + length);
                    tcp.write_all(answer.as_bytes()).await.unwrap();
                    if !keep_alive {
                        return;
                    }
                }
            });
        }
    });
    (url, connections, AbortOnDrop(server))
}

/// Five SSE frames, each its own HTTP chunk, as an engine streams tokens.
const FIVE_FRAMES: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
    transfer-encoding: chunked\r\n\r\n\
    9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n9\r\ndata: 3\n\n\r\n9\r\ndata: 4\n\n\r\n\
    e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";

#[tokio::test]
async fn frames_the_engine_sent_together_reach_the_client_together() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (engine, _, _server) = canned_engine(FIVE_FRAMES, true).await;
    let sidecar = sidecar(&engine, None, None).await;
    let mut tcp = tokio::net::TcpStream::connect(sidecar.proxy_addr)
        .await
        .unwrap();
    tcp.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, mut body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{raw}");
    // The chunked body as the client gets it: the frames, in fewer chunks than the
    // engine's five (one, unless the engine's single write reached the sidecar cut).
    let (mut chunks, mut frames) = (0, String::new());
    loop {
        let (size, rest) = body.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size, 16).unwrap();
        if size == 0 {
            break;
        }
        frames.push_str(&rest[..size]);
        body = &rest[size + 2..];
        chunks += 1;
    }
    assert_eq!(
        frames,
        "data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\ndata: [DONE]\n\n"
    );
    assert!(chunks < 5, "{chunks} chunks: {raw:?}");
}

#[tokio::test]
async fn engine_connections_are_reused_and_one_the_engine_closed_is_replaced() {
    const ANSWER: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    for keep_alive in [true, false] {
        let (engine, connections, _server) = canned_engine(ANSWER, keep_alive).await;
        let sidecar = sidecar(&engine, None, None).await;
        for _ in 0..3 {
            let (status, body) = post_completion(&sidecar).await;
            assert_eq!((status, body), (200, serde_json::json!({})));
            // Time for the engine's close to reach the sidecar.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let expected = if keep_alive { 1 } else { 3 };
        assert_eq!(connections.load(Ordering::SeqCst), expected, "{keep_alive}");
    }
}

/// A request sent straight to a sidecar (no prefill hop) with transfer parameters
/// naming a lease and a host reaches the engine without them.
#[tokio::test]
async fn a_clients_own_transfer_parameters_never_reach_the_engine() {
    let upstream = Upstream::start().await;
    let sidecar = sidecar(&upstream.url, None, None).await;
    let body = serde_json::json!({"model": "m", "messages": [], "kv_transfer_params": {
        "do_remote_prefill": true, "remote_request_id": "stolen-lease",
        "remote_host": "10.0.0.9", "remote_port": 9100, "remote_block_ids": [1, 2]}});
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", sidecar.proxy_addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (_, seen) = upstream.state.seen.lock().unwrap().clone().unwrap();
    let seen: Value = serde_json::from_slice(&seen).unwrap();
    assert_eq!(seen, serde_json::json!({"model": "m", "messages": []}));
    upstream.release();
}
