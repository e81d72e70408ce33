//! The gRPC listener's limits on real sockets.

mod common;

use std::time::Duration;

use common::*;
use dynamo_server::{PRESSURE_IDLE_TIMEOUT, Server};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

#[tokio::test]
async fn grpc_connections_share_the_budget_and_silent_ones_are_dropped() {
    let server = Server::new(&limits(300, 60_000, 60_000, 1));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut incoming = Box::pin(server.grpc_incoming(listener));

    let mut silent = TcpStream::connect(addr).await.unwrap();
    closed_by_server(&mut silent).await;

    let mut speaking = TcpStream::connect(addr).await.unwrap();
    speaking.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let connection = tokio::time::timeout(WAIT, incoming.next())
        .await
        .expect("a connection that speaks is handed on")
        .unwrap()
        .unwrap();

    // The budget of one is taken: an HTTP connection of the same process waits.
    let running = serve(&server).await;
    let mut http = TcpStream::connect(running.addr).await.unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(still_open(&mut http, Duration::from_millis(500)).await);
    drop(connection);
    let mut got = vec![0u8; 64];
    let n = tokio::time::timeout(WAIT, http.read(&mut got))
        .await
        .expect("served once the gRPC connection closed")
        .unwrap();
    assert!(got[..n].starts_with(b"HTTP/1.1 200"));
}

#[tokio::test]
async fn silent_grpc_connections_make_room_when_the_budget_is_nearly_used() {
    let server = Server::new(&limits(60_000, 60_000, 60_000, 10));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _incoming = Box::pin(server.grpc_incoming(listener));
    let started = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    for tcp in &mut silent {
        closed_by_server(tcp).await;
    }
    let waited = started.elapsed();
    let bound = PRESSURE_IDLE_TIMEOUT.mul_f64(1.2);
    assert!(
        waited <= bound,
        "dropped after {waited:?}, more than {bound:?}"
    );
}
