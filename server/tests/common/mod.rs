//! What the listener tests share: an axum app served by [`Server`] on a free port, and
//! raw TCP clients that stall where attackers and broken clients do.
#![allow(dead_code)] // each test binary uses its own part of this

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::routing::{get, post};
use dynamo_server::{Server, ServerLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Generous: the machine running the tests may be loaded.
pub const WAIT: Duration = Duration::from_secs(20);

pub fn limits(header: u64, idle: u64, body: u64, connections: usize) -> ServerLimits {
    ServerLimits {
        header_timeout: Duration::from_millis(header),
        idle_timeout: Duration::from_millis(idle),
        body_timeout: Duration::from_millis(body),
        max_connections: connections,
    }
}

pub struct Running {
    pub addr: SocketAddr,
    pub stop: Option<oneshot::Sender<()>>,
    pub served: JoinHandle<std::io::Result<()>>,
    /// What the `/echo` handler got from each body: its length, or the error.
    pub bodies: mpsc::UnboundedReceiver<Result<usize, String>>,
}

pub async fn serve(server: &Server) -> Running {
    let (bodies_tx, bodies) = mpsc::unbounded_channel();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "done"
            }),
        )
        .route(
            "/echo",
            post(move |body: axum::body::Body| {
                let bodies = bodies_tx.clone();
                async move {
                    let read = axum::body::to_bytes(body, usize::MAX).await;
                    let _ = bodies.send(read.as_ref().map(Bytes::len).map_err(|e| e.to_string()));
                    "ok"
                }
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = server.clone();
    let served = tokio::spawn(async move {
        server
            .serve_http(listener, app, async {
                let _ = stopped.await;
            })
            .await
    });
    Running {
        addr,
        stop: Some(stop),
        served,
        bodies,
    }
}

/// Reads until the server closes the connection; panics if it stays open past [`WAIT`].
pub async fn closed_by_server(tcp: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    tokio::time::timeout(WAIT, async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the server closes the connection");
    got
}

/// True when nothing arrives and the connection stays open for `period`.
pub async fn still_open(tcp: &mut TcpStream, period: Duration) -> bool {
    let mut buf = [0u8; 1];
    tokio::time::timeout(period, tcp.read(&mut buf))
        .await
        .is_err()
}

pub async fn request(tcp: &mut TcpStream, path: &str) -> String {
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        while !String::from_utf8_lossy(&got).contains("\r\n\r\n")
            || !got.ends_with(b"hello") && !got.ends_with(b"done")
        {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed mid-response");
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("a response");
    String::from_utf8(got).unwrap()
}
