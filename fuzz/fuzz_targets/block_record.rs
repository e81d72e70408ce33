//! Raw bytes as a KV block record read back from the disk or object tier
//! (`dynamo_kvblocks::record::decode`), and as an object or file name
//! (`record::parse_name`), both of which something other than the sidecar may have
//! written. Decoding must never panic nor allocate for what a header declares (it may
//! only copy the dtype name); a record it accepts has the payload its layout declares
//! and reads back the same once re-encoded; a name it accepts is exactly the name of
//! the hash and parent it stands for.
#![no_main]

#[path = "counting_alloc.rs"]
mod counting_alloc;


use bytes::Bytes;
use dynamo_kvblocks::record::{self, MAX_DTYPE_BYTES};
use libfuzzer_sys::fuzz_target;

/// What decoding may allocate: the dtype name (at most [`MAX_DTYPE_BYTES`], tripled when
/// invalid UTF-8 is replaced by U+FFFD) and slack for the `String`'s growth.
const DECODE_ALLOC: usize = 4 * MAX_DTYPE_BYTES + 256;


fn check_record(data: &[u8]) {
    let input = Bytes::copy_from_slice(data);
    let baseline = counting_alloc::reset_peak();
    let decoded = record::decode(input.clone());
    let held = counting_alloc::peak() - baseline;
    assert!(
        held <= DECODE_ALLOC,
        "decoding {} bytes held {held}",
        data.len()
    );
    let Ok(block) = decoded else { return };
    assert_eq!(block.payload.len() as u64, block.layout.block_bytes);
    assert_eq!(
        block.payload,
        input.slice(data.len() - block.payload.len()..)
    );
    // A dtype that was not UTF-8 may have grown past the limit when made lossless; the
    // writer cuts it then, so only a name within the limit reads back unchanged.
    if block.layout.dtype.len() <= MAX_DTYPE_BYTES {
        let again = record::encode(&block);
        assert_eq!(again.len() as u64, record::encoded_len(&block));
        assert_eq!(record::decode(again).as_ref(), Ok(&block));
    }
}

fn check_name(data: &[u8]) {
    let Ok(name) = std::str::from_utf8(data) else {
        return;
    };
    let Some((hash, parent)) = record::parse_name(name) else {
        return;
    };
    // Names and what they stand for map one to one.
    assert_eq!(record::name(hash, parent), name);
}

fuzz_target!(|data: &[u8]| {
    check_record(data);
    check_name(data);
});
