//! Raw bytes as one peer's TCP stream into the ZMTP decoder, with tiny limits, fed in
//! pieces whose size the input picks. It must never panic, never hand out a message
//! over the limits, give the same frames and verdict whole or in pieces, and never hold
//! more memory than its limits and the bytes that really arrived allow, whatever the
//! frame headers declare.
#![no_main]

#[path = "counting_alloc.rs"]
mod counting_alloc;


use dynamo_zmtp::codec::{Decoder, Frame, Ready, SocketType, encode_ready, greeting};
use dynamo_zmtp::{Limits, Violation};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_frame_bytes: 512,
    max_message_frames: 4,
    max_message_bytes: 1024,
};

/// What the decoder may hold beyond message bytes: the frames' `Bytes` handles, the
/// vectors holding them, a violation's text.
const OVERHEAD: usize = 2048;


/// Every frame and the violation that ended the stream, if one did.
fn decode(stream: &[u8], piece: usize) -> (Vec<Frame>, Option<Violation>) {
    let mut decoder = Decoder::new(LIMITS);
    let mut frames = Vec::new();
    for mut input in stream.chunks(piece) {
        loop {
            match decoder.decode(&mut input) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => {
                    assert!(input.is_empty(), "more input is only asked for at its end");
                    break;
                }
                Err(violation) => return (frames, Some(violation)),
            }
        }
    }
    (frames, None)
}

/// Decodes in pieces, dropping each frame at once, and checks what the decoder held.
fn check_memory(stream: &[u8], piece: usize) {
    let baseline = counting_alloc::reset_peak();
    let mut decoder = Decoder::new(LIMITS);
    let mut fed = 0;
    for mut input in stream.chunks(piece) {
        fed += input.len();
        loop {
            match decoder.decode(&mut input) {
                Ok(Some(Frame::Message(frames))) => {
                    assert!(frames.len() <= LIMITS.max_message_frames);
                    let bytes: usize = frames.iter().map(|f| f.len()).sum();
                    assert!(bytes <= LIMITS.max_message_bytes);
                }
                Ok(Some(Frame::Command(c))) => assert!(c.data.len() < LIMITS.max_frame_bytes),
                Ok(None) => break,
                Err(_) => return,
            }
            let held = counting_alloc::peak() - baseline;
            // Bounded by the limits, and (bodies grow at most twofold at a time) by what
            // arrived: a header's claim alone reserves nothing.
            assert!(held <= LIMITS.max_message_bytes + OVERHEAD, "held {held}");
            assert!(held <= 2 * fed + OVERHEAD, "held {held} after {fed} bytes");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    // Half the inputs follow a good handshake, so most effort goes into the frames.
    let stream = if mode & 1 == 1 {
        let ready = encode_ready(&Ready {
            socket_type: SocketType::Pub,
            identity: None,
        });
        [&greeting()[..], &ready, rest].concat()
    } else {
        rest.to_vec()
    };
    let piece = usize::from(mode >> 1) + 1;
    check_memory(&stream, piece);
    assert_eq!(decode(&stream, stream.len().max(1)), decode(&stream, piece));
});
