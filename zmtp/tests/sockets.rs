//! Our sockets over real loopback TCP: subscriptions, slow subscribers, reconnection,
//! socket type checks, and publishers that break the protocol.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dynamo_zmtp::codec::{
    Decoder, Frame, Ready, SocketType, encode_message, encode_ready, greeting, subscribe,
};
use dynamo_zmtp::{Dealer, Endpoint, Error, Event, Limits, Options, Pub, Sub, Violation};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Generous: the machine running the tests may be loaded.
const WAIT: Duration = Duration::from_secs(30);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Keeps `sub` reading (a Sub connects and reads only while asked for a message) and
/// hands over what it gets.
fn forward(mut sub: Sub) -> mpsc::UnboundedReceiver<Vec<Bytes>> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move { while tx.send(sub.recv().await).is_ok() {} });
    rx
}

async fn next(messages: &mut mpsc::UnboundedReceiver<Vec<Bytes>>) -> Vec<Bytes> {
    within("a message", messages.recv()).await.unwrap()
}

async fn bind_pub(options: Options) -> Pub {
    Pub::bind(&"tcp://127.0.0.1:0".parse().unwrap(), options)
        .await
        .unwrap()
}

fn b(s: &'static str) -> Bytes {
    Bytes::from_static(s.as_bytes())
}

/// What a monitor saw, in order: `connected`, or the violation reason (`ended` for an
/// ordinary end).
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<&'static str>>>);

impl Seen {
    fn options(&self, limits: Limits) -> Options {
        let seen = self.0.clone();
        Options {
            limits,
            monitor: Some(Arc::new(move |event: &Event| {
                let what = match event {
                    Event::Connected(_) => "connected",
                    Event::Disconnected(_, error) => error.violation().unwrap_or("ended"),
                };
                seen.lock().unwrap().push(what);
            })),
        }
    }

    fn get(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().clone()
    }

    async fn until(&self, what: &str, check: impl Fn(&[&'static str]) -> bool) {
        within(what, async {
            while !check(&self.get()) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }
}

#[tokio::test]
async fn a_pub_sends_each_subscriber_what_it_subscribed_to() {
    let publisher = bind_pub(Options::default()).await;
    let endpoint = publisher.endpoint().clone();
    let sub = |prefixes: &[&'static str]| {
        let prefixes = prefixes.iter().map(|p| b(p)).collect();
        forward(Sub::connect(endpoint.clone(), prefixes, Options::default()))
    };
    let (mut a, mut b_or_c, mut all) = (sub(&["a"]), sub(&["b", "c"]), sub(&[""]));
    within("three subscribers", publisher.wait_subscribers(3)).await;
    for topic in ["a1", "b1", "c1", "d1", "a2"] {
        publisher.send(&[b(topic), b("body")]);
    }
    assert_eq!(next(&mut a).await[0], "a1");
    assert_eq!(next(&mut a).await[0], "a2");
    assert_eq!(next(&mut b_or_c).await[0], "b1");
    assert_eq!(next(&mut b_or_c).await[0], "c1");
    for topic in ["a1", "b1", "c1", "d1", "a2"] {
        assert_eq!(next(&mut all).await[0], topic);
    }
    assert_eq!(publisher.dropped(), 0);
}

#[tokio::test]
async fn a_slow_subscriber_misses_whole_messages_and_the_publisher_never_waits() {
    let publisher = bind_pub(Options::default()).await;
    // A subscriber that subscribes to everything and then reads nothing.
    let mut slow = TcpStream::connect(
        publisher
            .endpoint()
            .to_string()
            .trim_start_matches("tcp://"),
    )
    .await
    .unwrap();
    let mut hello = greeting().to_vec();
    hello.extend(encode_ready(&Ready {
        socket_type: SocketType::Sub,
        identity: None,
    }));
    hello.extend(encode_message(&[subscribe(b"")]));
    slow.write_all(&hello).await.unwrap();
    within("the subscription", publisher.wait_subscribers(1)).await;

    // 80 MB: far more than its queue (1000 messages) and the socket buffers hold.
    let body = Bytes::from(vec![b'x'; 4096]);
    const SENT: u64 = 20_000;
    for seq in 0..SENT {
        publisher.send(&[Bytes::copy_from_slice(&seq.to_be_bytes()), body.clone()]);
    }
    let dropped = publisher.dropped();
    assert!(dropped > SENT / 2, "dropped {dropped}");

    // What it does get are whole messages: the first ones, which filled its queue.
    let mut decoder = Decoder::new(Limits::default());
    let mut buf = vec![0; 1 << 16];
    let mut next = 0;
    while next < 100 {
        let n = within("more bytes", slow.read(&mut buf)).await.unwrap();
        assert!(n > 0, "the publisher keeps the connection");
        let mut input = &buf[..n];
        while let Some(frame) = decoder.decode(&mut input).unwrap() {
            let Frame::Message(message) = frame else {
                continue; // the publisher's READY
            };
            let seq = u64::from_be_bytes(message[0][..].try_into().unwrap());
            assert_eq!(seq, next);
            assert_eq!(message[1], body);
            next += 1;
        }
    }
}

#[tokio::test]
async fn a_sub_reconnects_when_its_publisher_comes_back() {
    let seen = Seen::default();
    let publisher = bind_pub(Options::default()).await;
    let endpoint = publisher.endpoint().clone();
    let mut messages = forward(Sub::connect(
        endpoint.clone(),
        vec![Bytes::new()],
        seen.options(Limits::default()),
    ));
    within("subscribed", publisher.wait_subscribers(1)).await;
    publisher.send(&[b("first")]);
    assert_eq!(next(&mut messages).await, [b("first")]);

    drop(publisher);
    seen.until("the disconnect", |s| s == ["connected", "ended"])
        .await;
    let publisher = within("the port again", async {
        loop {
            match Pub::bind(&endpoint, Options::default()).await {
                Ok(publisher) => break publisher,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    within("subscribed again", publisher.wait_subscribers(1)).await;
    publisher.send(&[b("second")]);
    assert_eq!(next(&mut messages).await, [b("second")]);
    assert_eq!(seen.get(), ["connected", "ended", "connected"]);
}

#[tokio::test]
async fn a_peer_of_the_wrong_type_is_refused_on_both_sides() {
    let seen = Seen::default();
    let publisher = bind_pub(seen.options(Limits::default())).await;
    let error = Dealer::connect(publisher.endpoint(), Limits::default())
        .await
        .err()
        .expect("a DEALER cannot talk to a PUB");
    // Each side checks the other's READY; the PUB may answer with ERROR first.
    assert!(
        matches!(
            error,
            Error::Violation(Violation::SocketType { .. } | Violation::PeerError(_))
        ),
        "{error}"
    );
    seen.until("the PUB refused it", |s| s == ["socket_type"])
        .await;
}

/// One scripted connection of a fake publisher: a PUB greeting and READY, then `then`.
async fn serve_one(listener: &TcpListener, then: &[u8]) -> TcpStream {
    let (mut stream, _) = within("a connection", listener.accept()).await.unwrap();
    let mut hello = greeting().to_vec();
    hello.extend(encode_ready(&Ready {
        socket_type: SocketType::Pub,
        identity: None,
    }));
    hello.extend(then);
    // The subscriber may already have cut us off: a failed write is part of the test.
    let _ = stream.write_all(&hello).await;
    stream
}

#[tokio::test]
async fn hostile_publishers_are_cut_off_then_a_good_one_is_heard() {
    let seen = Seen::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = Endpoint::from(listener.local_addr().unwrap());
    let limits = Limits {
        max_frame_bytes: 1024,
        max_message_frames: 4,
        max_message_bytes: 2048,
    };
    let mut messages = forward(Sub::connect(
        endpoint,
        vec![Bytes::new()],
        seen.options(limits),
    ));

    // A LONG frame declaring 2^40 octets.
    let mut huge = vec![0x02];
    huge.extend((1u64 << 40).to_be_bytes());
    let _kept = serve_one(&listener, &huge).await;
    seen.until("cut off", |s| s.ends_with(&["frame_too_large"]))
        .await;
    // A message that never ends: one-octet frames, each with MORE.
    let endless = [0x01, 1, b'x'].repeat(100);
    let _kept = serve_one(&listener, &endless).await;
    seen.until("cut off", |s| s.ends_with(&["too_many_frames"]))
        .await;
    // Frames of 1000 octets: each under the frame limit, together over the message's.
    let mut big = Vec::new();
    for _ in 0..3 {
        big.extend([0x03, 0, 0, 0, 0, 0, 0, 0x03, 0xe8]);
        big.extend([0; 1000]);
    }
    let _kept = serve_one(&listener, &big).await;
    seen.until("cut off", |s| s.ends_with(&["message_too_large"]))
        .await;
    // Not ZMTP at all.
    let (mut http, _) = within("a connection", listener.accept()).await.unwrap();
    let _ = http.write_all(&[b'G'; 64]).await;
    seen.until("cut off", |s| s.ends_with(&["greeting"])).await;

    let _good = serve_one(&listener, &encode_message(&[b("kv"), b("event")])).await;
    assert_eq!(next(&mut messages).await, [b("kv"), b("event")]);
    assert_eq!(
        seen.get(),
        [
            "connected",
            "frame_too_large",
            "connected",
            "too_many_frames",
            "connected",
            "message_too_large",
            "greeting",
            "connected",
        ]
    );
}
