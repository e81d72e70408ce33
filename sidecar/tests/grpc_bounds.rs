//! The gRPC port bounds what a client can make the sidecar hold with the requests it
//! sends (`docs/sidecar.md`, "Security"): a message must arrive whole in time, none may
//! be larger than a limit, and those arriving on one connection not larger together
//! than another. The half-sent messages go over a raw HTTP/2 connection, as no gRPC
//! client sends them.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use dynamo_sidecar::Sidecar;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::task::AbortOnDropHandle;
use tonic::Code;

const OFFLOAD: &str = "/dynamo.kvblocks.v1.KvBlocks/Offload";
const RECEIVING: &str = "dynamo_sidecar_grpc_receiving_bytes";
const REFUSED: &str = "dynamo_sidecar_grpc_messages_refused_total";
/// Generous for an answer that comes at once, or after a timeout of a second or less.
const ENDS: Duration = Duration::from_secs(10);

/// An HTTP/2 connection to the sidecar's gRPC port.
struct Connection {
    addr: SocketAddr,
    send: SendRequest<axum::body::Body>,
    _driver: AbortOnDropHandle<()>,
}

/// A call whose request body the test writes, and its answer's head.
struct Call {
    body: mpsc::Sender<std::io::Result<Bytes>>,
    answer: JoinHandle<hyper::Response<hyper::body::Incoming>>,
}

impl Connection {
    async fn open(addr: SocketAddr) -> Self {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, driver) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        let driver = tokio::spawn(async move {
            let _ = driver.await;
        });
        Self {
            addr,
            send,
            _driver: AbortOnDropHandle::new(driver),
        }
    }

    /// Starts a call of `path` that sends `first`, then whatever the test sends.
    async fn call(&mut self, path: &str, first: &[Bytes]) -> Call {
        let (body, chunks) = mpsc::channel(16);
        for chunk in first {
            body.send(Ok(chunk.clone())).await.unwrap();
        }
        let stream = tokio_stream::wrappers::ReceiverStream::new(chunks);
        let request = hyper::Request::post(format!("http://{}{path}", self.addr))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(axum::body::Body::from_stream(stream))
            .unwrap();
        self.send.ready().await.unwrap();
        let answer = self.send.send_request(request);
        let answer = tokio::spawn(async move { answer.await.unwrap() });
        Call { body, answer }
    }
}

impl Call {
    /// The gRPC status the call ended with (a trailers-only answer's).
    async fn status(self) -> Code {
        let answer = tokio::time::timeout(ENDS, self.answer)
            .await
            .expect("the call ends")
            .unwrap();
        let status = answer.headers()["grpc-status"].to_str().unwrap();
        Code::from_i32(status.parse().unwrap())
    }
}

/// The 5-byte prefix of a gRPC message of `len` bytes.
fn prefix(len: u32) -> Bytes {
    let mut prefix = vec![0];
    prefix.extend(len.to_be_bytes());
    prefix.into()
}

fn zeros(len: usize) -> Bytes {
    Bytes::from(vec![0; len])
}

async fn receiving_is(sidecar: &Sidecar, bytes: u32) {
    eventually(&format!("{bytes} bytes being received"), || async {
        metric(sidecar, RECEIVING, "").await == f64::from(bytes)
    })
    .await;
}

async fn refused(sidecar: &Sidecar, reason: &str) -> f64 {
    metric(sidecar, REFUSED, &format!("reason=\"{reason}\"")).await
}

#[tokio::test]
async fn a_message_not_whole_in_time_ends_its_call_and_frees_its_bytes() {
    let flags = ["--grpc-message-timeout", "500ms"];
    let sidecar = sidecar_with("http://127.0.0.1:1", None, None, &flags).await;
    let mut connection = Connection::open(sidecar.grpc_addr).await;
    // Half of a 1 MiB message, and then nothing.
    let half = [prefix(1 << 20), zeros(512 << 10)];
    let call = connection.call(OFFLOAD, &half).await;
    receiving_is(&sidecar, 1 << 20).await;
    let _still_open = call.body.clone();
    assert_eq!(call.status().await, Code::DeadlineExceeded);
    assert_eq!(metric(&sidecar, RECEIVING, "").await, 0.0);
    assert_eq!(refused(&sidecar, "timeout").await, 1.0);
}

#[tokio::test]
async fn messages_past_the_size_limits_are_refused_before_they_are_read() {
    let flags = [
        "--grpc-max-message-bytes",
        "1MiB",
        "--grpc-max-connection-bytes",
        "1536KiB",
    ];
    let sidecar = sidecar_with("http://127.0.0.1:1", None, None, &flags).await;
    let mut one = Connection::open(sidecar.grpc_addr).await;
    let too_large = one.call(OFFLOAD, &[prefix((1 << 20) + 1)]).await;
    assert_eq!(too_large.status().await, Code::ResourceExhausted);

    // A message in progress on a connection leaves it room for half a megabyte more.
    let started = [prefix(1 << 20), zeros(100 << 10)];
    let _in_progress = one.call(OFFLOAD, &started).await;
    receiving_is(&sidecar, 1 << 20).await;
    let past_the_connection = one.call(OFFLOAD, &[prefix(1 << 20)]).await;
    assert_eq!(past_the_connection.status().await, Code::ResourceExhausted);
    // Another connection has room of its own.
    let mut two = Connection::open(sidecar.grpc_addr).await;
    let _elsewhere = two.call(OFFLOAD, &[prefix(1 << 20), zeros(1)]).await;
    receiving_is(&sidecar, 2 << 20).await;
    assert_eq!(refused(&sidecar, "too_large").await, 1.0);
    assert_eq!(refused(&sidecar, "connection_full").await, 1.0);

    // Clients that go away take what they were sending with them.
    drop((one, two, _in_progress, _elsewhere));
    receiving_is(&sidecar, 0).await;
}
