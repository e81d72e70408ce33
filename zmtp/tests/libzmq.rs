//! Interop with libzmq (pyzmq 27, libzmq 4.3.5, installed by `make pyenv`) as vLLM uses
//! it: our Sub and Dealer against a PUB and replay ROUTER written like vLLM's
//! `ZmqEventPublisher`, and our Pub against a libzmq SUB.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use dynamo_zmtp::{Dealer, Endpoint, Event, Limits, Options, Pub, Sub};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// Generous: the machine running the tests may be loaded.
const WAIT: Duration = Duration::from_secs(30);
const TOPIC: &[u8] = b"kv@127.0.0.1:8001@model";

/// `tests/vllm_peer.py` with `args`, under the tests' Python environment.
fn peer(args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/venv/bin/python");
    assert!(python.exists(), "run `make pyenv` first (installs pyzmq)");
    let mut child = Command::new(python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vllm_peer.py"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

async fn line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("a line within the wait")
        .unwrap()
        .expect("the peer is still running")
}

fn seq_of(frame: &[u8]) -> u64 {
    u64::from_be_bytes(frame.try_into().expect("8 octets"))
}

#[tokio::test]
async fn our_sub_and_dealer_talk_to_a_vllm_style_publisher_and_replay_router() {
    let (_publisher, mut lines) = peer(&["publish"]);
    let pub_endpoint: Endpoint = line(&mut lines).await["pub ".len()..].parse().unwrap();
    let replay_endpoint: Endpoint = line(&mut lines).await["replay ".len()..].parse().unwrap();

    let connected = Arc::new(AtomicUsize::new(0));
    let seen = connected.clone();
    let options = Options {
        monitor: Some(Arc::new(move |event: &Event| {
            if let Event::Connected(_) = event {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        })),
        ..Options::default()
    };
    // libzmq filters at the publisher: nothing arrives unless it took our subscription.
    let mut sub = Sub::connect(pub_endpoint, vec![Bytes::from_static(b"kv")], options);
    let mut last = None;
    for _ in 0..20 {
        let message = tokio::time::timeout(WAIT, sub.recv())
            .await
            .expect("a message within the wait");
        let [topic, seq, payload] = <[Bytes; 3]>::try_from(message).expect("three frames");
        assert_eq!(topic, TOPIC, "only the subscribed topic arrives");
        let seq = seq_of(&seq);
        assert_eq!(payload, format!("payload-{seq}").as_bytes());
        if let Some(last) = last {
            assert_eq!(seq, last + 1, "in order, none lost");
        }
        last = Some(seq);
    }
    assert_eq!(connected.load(Ordering::SeqCst), 1);

    // vLLM's replay: [b"", start] in, [b"", seq, payload] per buffered message, then
    // [b"", -1, b""].
    let mut dealer = Dealer::connect(&replay_endpoint, Limits::default())
        .await
        .unwrap();
    dealer
        .send(&[Bytes::new(), Bytes::copy_from_slice(&0u64.to_be_bytes())])
        .await
        .unwrap();
    let mut next = 0;
    loop {
        let reply = tokio::time::timeout(WAIT, dealer.recv())
            .await
            .expect("a reply within the wait")
            .unwrap();
        let [delimiter, seq, payload] = <[Bytes; 3]>::try_from(reply).expect("three frames");
        assert!(delimiter.is_empty());
        let seq = seq_of(&seq);
        if seq == u64::MAX {
            assert!(payload.is_empty());
            break;
        }
        assert_eq!((seq, payload), (next, format!("payload-{next}").into()));
        next += 1;
    }
    assert!(next > last.unwrap(), "the replay holds what the Sub saw");
}

#[tokio::test]
async fn our_listening_sub_takes_publishers_that_connect_one_after_another() {
    let endpoint: Endpoint = "tcp://127.0.0.1:0".parse().unwrap();
    let mut sub = Sub::listen(
        &endpoint,
        vec![Bytes::from_static(b"kv")],
        Options::default(),
    )
    .await
    .unwrap();
    let at = format!("tcp://{}", sub.local_addr().unwrap());
    // A publisher as vLLM 0.33's: it connects to the endpoint it is given.
    for _ in 0..2 {
        let (mut publisher, mut lines) = peer(&["connect", &at]);
        assert_eq!(line(&mut lines).await, "connected");
        let mut last: Option<u64> = None;
        for _ in 0..10 {
            let message = tokio::time::timeout(WAIT, sub.recv())
                .await
                .expect("a message within the wait");
            let [topic, seq, _] = <[Bytes; 3]>::try_from(message).expect("three frames");
            assert_eq!(topic, TOPIC);
            let seq = seq_of(&seq);
            assert!(
                last.is_none_or(|last| seq == last + 1),
                "in order, none lost"
            );
            last = Some(seq);
        }
        // Gone; the next publisher is taken in its place.
        publisher.kill().await.unwrap();
    }
}

#[tokio::test]
async fn a_libzmq_sub_gets_what_it_subscribed_to_from_our_pub() {
    let publisher = Pub::bind(&"tcp://127.0.0.1:0".parse().unwrap(), Options::default())
        .await
        .unwrap();
    let endpoint = publisher.endpoint().to_string();
    let (subscriber, mut lines) = peer(&["subscribe", &endpoint, "kv", "5"]);
    assert_eq!(line(&mut lines).await, "subscribed");
    tokio::time::timeout(WAIT, publisher.wait_subscribers(1))
        .await
        .expect("libzmq subscribes within the wait");
    for seq in 0..5u64 {
        let seq_frame = Bytes::copy_from_slice(&seq.to_be_bytes());
        publisher.send(&[Bytes::from_static(b"zz"), seq_frame.clone(), Bytes::new()]);
        publisher.send(&[
            Bytes::from_static(b"kv@x"),
            seq_frame,
            format!("payload-{seq}").into(),
        ]);
    }
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(line(&mut lines).await);
    }
    let expected: Vec<String> = (0..5).map(|s| format!("kv@x {s} payload-{s}")).collect();
    assert_eq!(got, expected);
    let status = tokio::time::timeout(WAIT, subscriber.wait_with_output())
        .await
        .expect("the subscriber exits")
        .unwrap()
        .status;
    assert!(status.success());
    assert_eq!(publisher.dropped(), 0);
}
