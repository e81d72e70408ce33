//! Hostile peers on the engine's KV event sockets, against the sidecar in-process and
//! against the real `dynamo-sidecar` binary: whatever they send, the sidecar cuts them
//! off and counts them, its memory stays bounded, its proxy keeps answering, and a good
//! publisher is relayed again afterwards.
//!
//! The hostile peer writes ZMTP 3.0 (rfc.zeromq.org/spec/23) byte by byte here rather
//! than through `dynamo_zmtp`, so these tests do not share the codec's assumptions.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use dynamo_kvcache::vllm_events::{KvEventBatch, encode_message};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::task::AbortOnDropHandle;

/// A ZMTP 3.0 greeting: signature, version `major`.0, mechanism NULL, as-server 0.
fn greeting(major: u8) -> Vec<u8> {
    let mut g = vec![0; 64];
    (g[0], g[9], g[10]) = (0xFF, 0x7F, major);
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// One frame: flags, a one-octet size (or LONG and eight octets), the body.
fn frame(flags: u8, body: &[u8]) -> Vec<u8> {
    let mut f = match u8::try_from(body.len()) {
        Ok(size) => vec![flags, size],
        Err(_) => [
            vec![flags | 0x02],
            (body.len() as u64).to_be_bytes().to_vec(),
        ]
        .concat(),
    };
    f.extend_from_slice(body);
    f
}

/// A greeting and a READY command naming `socket_type`.
fn hello(socket_type: &str) -> Vec<u8> {
    let mut ready = b"\x05READY\x0bSocket-Type".to_vec();
    ready.extend((socket_type.len() as u32).to_be_bytes());
    ready.extend(socket_type.as_bytes());
    [greeting(3), frame(0x04, &ready)].concat()
}

/// What the hostile engine does with one connection the sidecar makes.
enum Script {
    /// A PUB that announces a frame of 2^40 octets.
    HugeFrame { socket_type: &'static str },
    /// A PUB that sends one message that never ends (`frame`-octet frames, all with
    /// MORE) to every connection, until `lasting` has passed.
    Endless { frame: usize, lasting: Duration },
    /// Something that is not ZMTP 3: an HTTP request, or a ZMTP 2.0 greeting.
    Garbage(&'static [u8]),
    /// A good PUB: one vLLM message storing one block, numbered 0.
    Good,
}

impl Script {
    async fn play(&self, stream: &mut TcpStream) {
        match self {
            Self::HugeFrame { socket_type } => {
                let mut bytes = hello(socket_type);
                bytes.push(0x02); // a LONG message frame
                bytes.extend((1u64 << 40).to_be_bytes());
                let _ = stream.write_all(&bytes).await;
            }
            Self::Endless { frame: size, .. } => {
                let _ = stream.write_all(&hello("PUB")).await;
                let chunk = frame(0x01, &vec![b'x'; *size]).repeat((1 << 20) / (size + 9) + 1);
                // Until the sidecar cuts us off.
                while stream.write_all(&chunk).await.is_ok() {}
            }
            Self::Garbage(bytes) => {
                let _ = stream.write_all(bytes).await;
            }
            Self::Good => {
                let batch = KvEventBatch {
                    ts: 0.0,
                    events: vec![stored(&[1], None, tokens(0, 1))],
                    dp_rank: Some(0),
                };
                let frames = encode_message(b"", 0, &batch);
                let mut bytes = hello("PUB");
                bytes.extend(frame(0x01, &frames[0]));
                bytes.extend(frame(0x01, &frames[1]));
                bytes.extend(frame(0x00, &frames[2]));
                let _ = stream.write_all(&bytes).await;
            }
        }
    }
}

/// A fake engine on a loopback port that plays its scripts, one per connection, in
/// order (an `Endless` one for every connection until its time is up), holding each
/// connection open afterwards.
struct HostileEngine {
    endpoint: String,
    _task: AbortOnDropHandle<()>,
}

impl HostileEngine {
    async fn start(scripts: Vec<Script>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            for script in scripts {
                let started = Instant::now();
                loop {
                    let (mut stream, _) = listener.accept().await.unwrap();
                    script.play(&mut stream).await;
                    held.push(stream);
                    match script {
                        Script::Endless { lasting, .. } if started.elapsed() < lasting => {}
                        _ => break,
                    }
                }
            }
            std::future::pending::<()>().await;
        });
        Self {
            endpoint,
            _task: AbortOnDropHandle::new(task),
        }
    }
}

/// The scripts every test plays: the `endless` attack between a huge frame and two
/// garbage greetings, then a good publisher.
fn scripts(endless: Script) -> Vec<Script> {
    vec![
        Script::HugeFrame { socket_type: "PUB" },
        endless,
        Script::Garbage(b"GET / HTTP/1.1\r\nHost: sidecar\r\n\r\n"),
        Script::Garbage(&[0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 1, 0, 0, 0]),
        Script::Good,
    ]
}

/// Waits for `count` violations of `reason` on the sidecar at `metrics`.
async fn violations(metrics: SocketAddr, reason: &str, count: f64) {
    let labels = format!("reason=\"{reason}\"");
    eventually(&format!("{count} {reason} violations"), || async {
        metric_at(metrics, "dynamo_sidecar_kv_zmq_violations_total", &labels).await >= count
    })
    .await;
}

async fn proxy_answers(proxy: SocketAddr) {
    let response = reqwest::get(format!("http://{proxy}/health"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "ok");
}

/// Plays [`scripts`] against the sidecar with these ports and checks, along the way,
/// that each attack is cut off and counted as `endless_reason` says, that the proxy
/// answers meanwhile, and that the good publisher's event is relayed at the end.
async fn survive(proxy: SocketAddr, metrics: SocketAddr, endless_reason: &str) {
    violations(metrics, "frame_too_large", 1.0).await;
    violations(metrics, endless_reason, 1.0).await;
    proxy_answers(proxy).await;
    violations(metrics, "greeting", 2.0).await;
    eventually("the good publisher's event is relayed", || async {
        metric_at(
            metrics,
            "dynamo_sidecar_engine_events_total",
            "kind=\"stored\"",
        )
        .await
            == 1.0
    })
    .await;
    assert_eq!(
        metric_at(metrics, "dynamo_sidecar_relay_connected", "").await,
        1.0
    );
    proxy_answers(proxy).await;
}

#[tokio::test]
async fn hostile_publishers_cannot_stop_the_sidecar_in_process() {
    let upstream = Upstream::start().await;
    // 100-octet frames, as in the libzmq experiment (see `dynamo_zmtp`'s docs).
    let endless = Script::Endless {
        frame: 100,
        lasting: Duration::from_secs(2),
    };
    let engine = HostileEngine::start(scripts(endless)).await;
    let sidecar = sidecar(&upstream.url, Some(&engine.endpoint), None).await;
    let mut follower = Follower::start(sidecar.grpc_addr);
    assert_eq!(follower.snapshot().await, vec![]);
    survive(sidecar.proxy_addr, sidecar.metrics_addr, "too_many_frames").await;
    assert!(matches!(
        follower.event().await,
        dynamo_kvcache::KvEvent::Stored { .. }
    ));
}

#[tokio::test]
async fn a_hostile_replay_socket_is_cut_off_and_the_view_reset() {
    let mut engine = EnginePublisher::bind().await;
    let replay = HostileEngine::start(vec![Script::HugeFrame {
        socket_type: "ROUTER",
    }])
    .await;
    let sidecar = sidecar(
        "http://127.0.0.1:9",
        Some(&engine.endpoint),
        Some(&replay.endpoint),
    )
    .await;
    engine.wait_subscriber().await;
    let mut follower = Follower::start(sidecar.grpc_addr);
    assert_eq!(follower.snapshot().await, vec![]);
    engine.publish(vec![stored(&[1], None, tokens(0, 1))]).await;
    assert!(matches!(
        follower.event().await,
        dynamo_kvcache::KvEvent::Stored { .. }
    ));
    engine.lose(vec![removed(&[1])]);
    engine.publish(vec![stored(&[2], None, tokens(8, 1))]).await;
    assert_eq!(follower.event().await, dynamo_kvcache::KvEvent::Cleared);
    violations(sidecar.metrics_addr, "frame_too_large", 1.0).await;
    assert_eq!(
        metric(
            &sidecar,
            "dynamo_sidecar_zmq_gaps_total",
            "outcome=\"reset\""
        )
        .await,
        1.0
    );
    assert!(matches!(
        follower.event().await,
        dynamo_kvcache::KvEvent::Stored { .. }
    ));
}

#[tokio::test]
async fn the_sidecar_binary_survives_hostile_publishers_with_bounded_memory() {
    let upstream = Upstream::start().await;
    // 64 KiB frames, and a frame limit so high that the byte limit (32 MiB) must stop
    // the endless message: the worst a message in progress can hold.
    let endless = Script::Endless {
        frame: 64 << 10,
        lasting: Duration::from_secs(3),
    };
    let engine = HostileEngine::start(scripts(endless)).await;
    let mut sidecar = SidecarProcess::start(&[
        "--engine-url",
        &upstream.url,
        "--engine-kv-events",
        &engine.endpoint,
        "--kv-events-max-message-frames",
        "1000000",
    ]);
    survive(sidecar.proxy, sidecar.metrics, "message_too_large").await;
    assert!(
        sidecar.child.try_wait().unwrap().is_none(),
        "the sidecar is alive"
    );
    let peak = sidecar.status_bytes("VmHWM:");
    assert!(peak < 200 << 20, "peak RSS {} MiB", peak >> 20);
}
