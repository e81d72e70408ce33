//! Raw bytes as one engine's TCP stream on the KV event port, down the sidecar's own
//! path: ZMTP decoding with the sidecar's default limits, the NULL handshake as a SUB,
//! and every message through `Relay::handle` into the pod's `KvEventHub`. It must never
//! panic, handling must never wait (there is no replay socket), and the hub must stay
//! consistent: its snapshot holds the blocks it counts, and it numbered every event
//! the relay published.
//!
//! The first input byte picks how the rest is read: bit 0 puts a good handshake first;
//! bit 1 reads the rest as vLLM messages (`seq` octet, 2-octet size, msgpack batch)
//! that this target frames itself, so the fuzzer also spends its time on the batches.
#![no_main]

use std::pin::pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use dynamo_kvstream::pb::event_message::Body;
use dynamo_kvstream::{HubConfig, KvEventHub};
use dynamo_sidecar::Config;
use dynamo_sidecar::metrics::Metrics;
use dynamo_sidecar::relay::{self, Relay};
use dynamo_zmtp::Limits;
use dynamo_zmtp::codec::{
    Decoder, Ready, SocketType, encode_message, encode_ready, expect_ready, greeting, traffic,
};
use libfuzzer_sys::fuzz_target;

static LIMITS: LazyLock<Limits> = LazyLock::new(|| relay::limits(&Config::defaults()));

/// A good publisher's greeting and READY.
fn handshake() -> Vec<u8> {
    let ready = encode_ready(&Ready {
        socket_type: SocketType::Pub,
        identity: None,
    });
    [&greeting()[..], &ready].concat()
}

/// `[seq, size (2 octets), payload]...` as ZMTP messages `[b"", seq, payload]`.
fn framed(mut rest: &[u8]) -> Vec<u8> {
    let mut stream = handshake();
    while let [seq, hi, lo, tail @ ..] = rest {
        let size = usize::from(u16::from_be_bytes([*hi, *lo])).min(tail.len());
        let (payload, tail) = tail.split_at(size);
        let seq = Bytes::copy_from_slice(&u64::from(*seq).to_be_bytes());
        stream.extend(encode_message(&[
            Bytes::new(),
            seq,
            Bytes::copy_from_slice(payload),
        ]));
        rest = tail;
    }
    stream
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let stream = match mode & 3 {
        0 => rest.to_vec(),
        1 => [handshake(), rest.to_vec()].concat(),
        _ => framed(rest),
    };
    let hub = KvEventHub::new(HubConfig::default());
    let metrics = Arc::new(Metrics::new());
    let mut relay = Relay::new("fuzz".into(), None, hub.clone(), metrics.clone());
    let mut decoder = Decoder::new(*LIMITS);
    let mut input = &stream[..];
    let Ok(Some(first)) = decoder.decode(&mut input) else {
        return;
    };
    if expect_ready(first, SocketType::Sub).is_err() {
        return;
    }
    while let Ok(Some(frame)) = decoder.decode(&mut input) {
        let Ok(message) = traffic(frame) else { break };
        let Some(message) = message else { continue };
        let handled = pin!(relay.handle(&message)).poll(&mut Context::from_waker(Waker::noop()));
        assert_eq!(
            handled,
            Poll::Ready(()),
            "handling waited without a replay socket"
        );
    }

    let stats = hub.stats();
    let Some(Body::Snapshot(snapshot)) = hub.snapshot().body else {
        panic!("a snapshot");
    };
    let blocks: usize = snapshot.chains.iter().map(|c| c.blocks.len()).sum();
    assert_eq!(blocks as u64, stats.blocks);
    let published: u64 = ["stored", "removed", "cleared"]
        .iter()
        .map(|kind| metrics.events_out.get_or_create(&[("kind", *kind)]).get())
        .sum();
    assert_eq!(published, stats.last_event_id);
});
