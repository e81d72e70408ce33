//! The HTTP listener's limits on real sockets.

mod common;

use std::time::Duration;

use common::*;
use dynamo_server::{PRESSURE_IDLE_TIMEOUT, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_idle_timeout() {
    let running = serve(&Server::new(&limits(60_000, 300, 60_000, 16))).await;
    let mut tcp = TcpStream::connect(running.addr).await.unwrap();
    assert!(closed_by_server(&mut tcp).await.is_empty());
}

#[tokio::test]
async fn a_slow_head_is_cut_at_the_header_timeout_though_idle_allows_longer() {
    let running = serve(&Server::new(&limits(300, 60_000, 60_000, 16))).await;
    let mut tcp = TcpStream::connect(running.addr).await.unwrap();
    // Before any byte, only the (long) idle timeout applies.
    assert!(still_open(&mut tcp, Duration::from_millis(900)).await);
    tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    closed_by_server(&mut tcp).await;
}

#[tokio::test]
async fn keep_alive_serves_requests_until_idle_then_closes() {
    let running = serve(&Server::new(&limits(60_000, 600, 60_000, 16))).await;
    let mut tcp = TcpStream::connect(running.addr).await.unwrap();
    for _ in 0..3 {
        let response = request(&mut tcp, "/").await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }
    // A request longer than the idle timeout is not cut: only idle time counts.
    let response = request(&mut tcp, "/slow").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    closed_by_server(&mut tcp).await;
}

#[tokio::test]
async fn a_stalled_body_fails_the_request_at_the_body_timeout() {
    let mut running = serve(&Server::new(&limits(60_000, 60_000, 300, 16))).await;
    let mut tcp = TcpStream::connect(running.addr).await.unwrap();
    tcp.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    let read = tokio::time::timeout(WAIT, running.bodies.recv())
        .await
        .expect("the handler's body read ends")
        .unwrap();
    assert!(read.is_err(), "{read:?}");

    // A body that keeps coming is read whole.
    let mut tcp = TcpStream::connect(running.addr).await.unwrap();
    tcp.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 20\r\n\r\n0123456789")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    tcp.write_all(b"0123456789").await.unwrap();
    let read = tokio::time::timeout(WAIT, running.bodies.recv())
        .await
        .unwrap();
    assert_eq!(read, Some(Ok(20)));
}

#[tokio::test]
async fn connections_over_the_budget_wait_for_one_to_close() {
    let server = Server::new(&limits(60_000, 60_000, 60_000, 1));
    let running = serve(&server).await;
    let mut first = TcpStream::connect(running.addr).await.unwrap();
    assert!(request(&mut first, "/").await.starts_with("HTTP/1.1 200"));

    // The kernel completes the second connection, but it is not served yet.
    let mut second = TcpStream::connect(running.addr).await.unwrap();
    second
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(still_open(&mut second, Duration::from_millis(500)).await);

    drop(first);
    let mut got = vec![0u8; 64];
    let n = tokio::time::timeout(WAIT, second.read(&mut got))
        .await
        .expect("served once the first closed")
        .unwrap();
    assert!(got[..n].starts_with(b"HTTP/1.1 200"));
}

#[tokio::test]
async fn shutdown_lets_requests_in_flight_finish_and_closes_idle_connections() {
    let mut running = serve(&Server::new(&limits(60_000, 60_000, 60_000, 16))).await;
    let mut idle = TcpStream::connect(running.addr).await.unwrap();
    assert!(request(&mut idle, "/").await.starts_with("HTTP/1.1 200"));
    // One that never sent a byte has nothing to finish: it does not hold the shutdown
    // for its (minute-long) timeouts.
    let mut silent = TcpStream::connect(running.addr).await.unwrap();
    let mut busy = TcpStream::connect(running.addr).await.unwrap();
    busy.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    running.stop.take().unwrap().send(()).unwrap();
    let answer = closed_by_server(&mut busy).await;
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
    assert!(answer.ends_with(b"done"));
    closed_by_server(&mut idle).await;
    closed_by_server(&mut silent).await;
    tokio::time::timeout(WAIT, running.served)
        .await
        .expect("serving ends once every connection closed")
        .unwrap()
        .unwrap();
    assert!(TcpStream::connect(running.addr).await.is_err());
}

/// The bound the docs promise for every deadline of a connection without a request.
const SLACK: f64 = 1.2;

#[tokio::test]
async fn a_head_sent_byte_by_byte_is_dropped_within_the_header_timeout() {
    let header = Duration::from_secs(2);
    let running = serve(&Server::new(&limits(2_000, 60_000, 60_000, 16))).await;
    let mut tcp = TcpStream::connect(running.addr).await.unwrap();
    let head = b"GET / HTTP/1.1\r\nx-slow: ";
    let started = Instant::now();
    // A byte every 200 ms: progress, but the head never completes.
    for byte in head.iter().chain(std::iter::repeat(&b'a')) {
        if tcp.write_all(&[*byte]).await.is_err() || !still_open(&mut tcp, BYTE_GAP).await {
            break;
        }
        assert!(started.elapsed() < WAIT, "the slow head was never dropped");
    }
    let dropped = started.elapsed();
    assert!(dropped >= header, "dropped after {dropped:?}");
    assert!(
        dropped <= header.mul_f64(SLACK),
        "dropped after {dropped:?}, more than {SLACK} x {header:?}"
    );
}

const BYTE_GAP: Duration = Duration::from_millis(200);

#[tokio::test]
async fn a_flood_of_silent_connections_leaves_room_for_a_normal_request() {
    let budget = 64;
    let mut running = serve(&Server::new(&limits(2_000, 60_000, 60_000, budget))).await;
    // A request in flight (its body still coming) is never closed to make room.
    let mut active = TcpStream::connect(running.addr).await.unwrap();
    active
        .write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 20\r\n\r\n0123456789")
        .await
        .unwrap();
    // Silent connections past the budget: the last ones wait in the kernel's queue.
    let mut flood = Vec::new();
    for _ in 0..budget + 16 {
        flood.push(TcpStream::connect(running.addr).await.unwrap());
    }
    let started = Instant::now();
    let mut normal = TcpStream::connect(running.addr).await.unwrap();
    let response = request(&mut normal, "/").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let waited = started.elapsed();
    let bound = PRESSURE_IDLE_TIMEOUT.mul_f64(SLACK) + Duration::from_secs(1);
    assert!(
        waited <= bound,
        "answered after {waited:?}, more than {bound:?}"
    );

    active.write_all(b"0123456789").await.unwrap();
    let read = tokio::time::timeout(WAIT, running.bodies.recv())
        .await
        .unwrap();
    assert_eq!(read, Some(Ok(20)));
    drop(flood);
}
