//! vLLM's ZMQ KV event wire format, as bytes (no sockets here): the sidecar decodes what
//! an engine publishes, the mock engine encodes what it publishes.
//!
//! A message is three ZMQ frames: `[topic, sequence (8-byte big-endian), payload]`; the
//! payload is a MessagePack `EventBatch` `[ts, events, data_parallel_rank]`. Events are
//! msgspec structs with `tag=True`: in the array layout (`array_like=True`) an event is
//! `[tag, field...]` in declaration order, and `omit_defaults` does not shorten arrays
//! (jcrist/msgspec#720), so older engines send fewer trailing fields, newer ones more:
//!
//! - `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//!   medium, lora_name, extra_keys, group_idx, ...]` (`medium` and `lora_name` arrived
//!   in later versions; the first versions ended at `lora_id`);
//! - `["BlockRemoved", block_hashes, medium, group_idx, ...]`;
//! - `["AllBlocksCleared"]`.
//!
//! Source: vllm-project/vllm `vllm/distributed/kv_events.py` (struct definitions and
//! `ZmqEventPublisher._publisher_thread` for the frames). The newest revisions dropped
//! `array_like` from the event base class, so events there are maps tagged by a `type`
//! key; this decoder accepts both layouts. Hashes are `ExternalBlockHash = bytes | int`;
//! bytes are reduced as vLLM's `maybe_convert_block_hash` does
//! (`int.from_bytes(h, "big") & (2**64 - 1)`, vllm/v1/core/kv_cache_utils.py), so both
//! forms of one hash decode to the same `u64`.
//!
//! The encoder writes the array layout up to `medium` (plus `lora_name` when set), the
//! shape `DESIGN.md` names for engine events.
//!
//! MessagePack itself is read and written by `rmpv`. Decoding untrusted bytes stays
//! bounded: nesting is capped (32 containers), and rmpv never preallocates an array or
//! map from its declared length and caps a string or binary preallocation at 64 KiB
//! (3Hren/msgpack-rust#151), so a hostile length costs at most that before the reader
//! runs out of bytes and the payload is refused as truncated. (rmpv reads the reserved
//! marker `0xc1` as nil rather than refusing it.)

use rmpv::Value;
use thiserror::Error;

/// Storage medium of blocks in GPU memory, as vLLM names it (`MEDIUM_GPU`).
pub const MEDIUM_GPU: &str = "GPU";

/// One KV cache event. Hashes are the engine's block hashes as `u64`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
        lora_id: Option<i64>,
        medium: Option<String>,
        lora_name: Option<String>,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        medium: Option<String>,
    },
    AllBlocksCleared,
}

/// The MessagePack payload of one ZMQ message.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventBatch {
    /// Seconds since the Unix epoch (vLLM uses `time.time()`).
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub dp_rank: Option<i64>,
}

/// A decoded batch, with the number of events of kinds this decoder does not know.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedBatch {
    pub batch: KvEventBatch,
    pub skipped_unknown: usize,
}

/// A decoded three-frame ZMQ message.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedMessage {
    pub topic: Vec<u8>,
    pub seq: u64,
    pub batch: DecodedBatch,
}

/// Containers nested deeper than this are refused: KV event batches are 4 levels deep,
/// and a recursive reader must not overflow the stack on hostile input.
const MAX_NESTING: usize = 32;

/// The same limit in rmpv's units: it spends one level on each value, one more on each
/// container body (2 per array or map) and up to 2 more on a string, binary or extension
/// body. So `MAX_NESTING` containers hold any value, and one more container is let
/// through only around a nil, bool or number; nothing deeper passes.
const RMPV_MAX_DEPTH: usize = 2 * MAX_NESTING + 3;

/// Why a payload is not exactly one well-formed MessagePack value.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum MsgpackError {
    /// The input ended inside a value, including a string, binary, array or map whose
    /// declared length runs past the end of the payload.
    #[error("unexpected end of input")]
    Truncated,
    #[error("nesting deeper than {MAX_NESTING} levels")]
    TooDeep,
    #[error("{0} trailing bytes after the value")]
    TrailingBytes(usize),
    /// Any other read error from the MessagePack reader (none is expected from a slice).
    #[error("read error: {0}")]
    Read(std::io::ErrorKind),
}

#[derive(Debug, Error, PartialEq)]
pub enum KvEventDecodeError {
    #[error("expected 3 frames (topic, sequence, payload), got {0}")]
    FrameCount(usize),
    #[error("sequence frame has {0} bytes, expected 8")]
    SequenceLength(usize),
    #[error("payload is not MessagePack: {0}")]
    Msgpack(#[from] MsgpackError),
    #[error("event batch: {0}")]
    Batch(&'static str),
    #[error("event {index}: {reason}")]
    Event { index: usize, reason: &'static str },
}

/// Encodes a batch as vLLM's msgpack payload (array layout), every value in its smallest
/// form (as msgspec writes it).
pub fn encode_batch(batch: &KvEventBatch) -> Vec<u8> {
    let value = Value::Array(vec![
        Value::F64(batch.ts),
        Value::Array(batch.events.iter().map(event_value).collect()),
        batch.dp_rank.map_or(Value::Nil, Value::from),
    ]);
    let mut buf = Vec::new();
    rmpv::encode::write_value(&mut buf, &value).expect("writing to a Vec cannot fail");
    buf
}

fn event_value(event: &KvEvent) -> Value {
    match event {
        KvEvent::BlockStored {
            block_hashes,
            parent_hash,
            token_ids,
            block_size,
            lora_id,
            medium,
            lora_name,
        } => {
            let mut fields = vec![
                Value::from("BlockStored"),
                hashes_value(block_hashes),
                parent_hash.map_or(Value::Nil, Value::from),
                Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
                Value::from(*block_size),
                lora_id.map_or(Value::Nil, Value::from),
                opt_str_value(medium.as_deref()),
            ];
            if let Some(name) = lora_name {
                fields.push(Value::from(name.as_str()));
            }
            Value::Array(fields)
        }
        KvEvent::BlockRemoved {
            block_hashes,
            medium,
        } => Value::Array(vec![
            Value::from("BlockRemoved"),
            hashes_value(block_hashes),
            opt_str_value(medium.as_deref()),
        ]),
        KvEvent::AllBlocksCleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
    }
}

fn hashes_value(hs: &[u64]) -> Value {
    Value::Array(hs.iter().map(|&h| Value::from(h)).collect())
}

fn opt_str_value(s: Option<&str>) -> Value {
    s.map_or(Value::Nil, Value::from)
}

/// The three frames of one ZMQ message: topic, 8-byte big-endian sequence, payload.
pub fn encode_message(topic: &[u8], seq: u64, batch: &KvEventBatch) -> [Vec<u8>; 3] {
    [
        topic.to_vec(),
        seq.to_be_bytes().to_vec(),
        encode_batch(batch),
    ]
}

/// Numbers messages from 0 as vLLM's publisher does (`itertools.count()`).
#[derive(Clone, Debug)]
pub struct KvEventEncoder {
    topic: Vec<u8>,
    next_seq: u64,
    dp_rank: Option<i64>,
}

impl KvEventEncoder {
    pub fn new(topic: impl Into<Vec<u8>>, dp_rank: Option<i64>) -> Self {
        Self {
            topic: topic.into(),
            next_seq: 0,
            dp_rank,
        }
    }

    /// Frames for `events` stamped `ts`; consumes one sequence number.
    pub fn encode(&mut self, ts: f64, events: Vec<KvEvent>) -> [Vec<u8>; 3] {
        let batch = KvEventBatch {
            ts,
            events,
            dp_rank: self.dp_rank,
        };
        let frames = encode_message(&self.topic, self.next_seq, &batch);
        self.next_seq += 1;
        frames
    }
}

/// Decodes the three frames of one message.
pub fn decode_message(frames: &[&[u8]]) -> Result<DecodedMessage, KvEventDecodeError> {
    let [topic, seq, payload] = frames else {
        return Err(KvEventDecodeError::FrameCount(frames.len()));
    };
    let seq: [u8; 8] = (*seq)
        .try_into()
        .map_err(|_| KvEventDecodeError::SequenceLength(seq.len()))?;
    Ok(DecodedMessage {
        topic: topic.to_vec(),
        seq: u64::from_be_bytes(seq),
        batch: decode_batch(payload)?,
    })
}

/// Decodes a msgpack payload in either layout; unknown event kinds are counted and skipped.
pub fn decode_batch(payload: &[u8]) -> Result<DecodedBatch, KvEventDecodeError> {
    use KvEventDecodeError::Batch;
    let (ts, events, dp_rank) = match read_value(payload)? {
        Value::Array(items) => {
            let mut it = items.into_iter();
            let ts = it.next().ok_or(Batch("missing ts"))?;
            let events = it.next().ok_or(Batch("missing events"))?;
            (ts, events, it.next().unwrap_or(Value::Nil))
        }
        Value::Map(entries) => {
            let mut ts = None;
            let mut events = None;
            let mut dp = Value::Nil;
            for (k, v) in entries {
                match k.as_str() {
                    Some("ts") => ts = Some(v),
                    Some("events") => events = Some(v),
                    Some("data_parallel_rank") => dp = v,
                    _ => {}
                }
            }
            (
                ts.ok_or(Batch("missing ts"))?,
                events.ok_or(Batch("missing events"))?,
                dp,
            )
        }
        _ => return Err(Batch("not an array or map")),
    };
    let ts = match ts {
        Value::F64(f) => f,
        Value::F32(f) => f as f64,
        v => int(&v).ok_or(Batch("ts is not a number"))? as f64,
    };
    let dp_rank = match dp_rank {
        Value::Nil => None,
        v => {
            let i = int(&v).ok_or(Batch("dp_rank is not an integer"))?;
            Some(i64::try_from(i).map_err(|_| Batch("dp_rank out of range"))?)
        }
    };
    let Value::Array(raw_events) = events else {
        return Err(Batch("events is not an array"));
    };
    let mut out = Vec::with_capacity(raw_events.len());
    let mut skipped_unknown = 0;
    for (index, raw) in raw_events.into_iter().enumerate() {
        match decode_event(raw).map_err(|reason| KvEventDecodeError::Event { index, reason })? {
            Some(e) => out.push(e),
            None => skipped_unknown += 1,
        }
    }
    Ok(DecodedBatch {
        batch: KvEventBatch {
            ts,
            events: out,
            dp_rank,
        },
        skipped_unknown,
    })
}

/// Fields of one event by position, whichever layout it came in.
struct Fields {
    values: Vec<Value>,
}

impl Fields {
    fn get(&mut self, i: usize) -> Value {
        self.values
            .get_mut(i)
            .map(|v| std::mem::replace(v, Value::Nil))
            .unwrap_or(Value::Nil)
    }
}

const STORED_FIELDS: [&str; 7] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
];
const REMOVED_FIELDS: [&str; 2] = ["block_hashes", "medium"];

/// `Ok(None)` for a well-formed event of an unknown kind.
fn decode_event(raw: Value) -> Result<Option<KvEvent>, &'static str> {
    let (tag, mut fields, positional_len) = match raw {
        Value::Array(items) => {
            let mut it = items.into_iter();
            let tag = it
                .next()
                .and_then(string)
                .ok_or("array event without a string tag")?;
            let values: Vec<Value> = it.collect();
            let n = values.len();
            (tag, Fields { values }, n)
        }
        Value::Map(entries) => {
            let mut tag = None;
            let mut named = Vec::new();
            for (k, v) in entries {
                if let Some(k) = string(k) {
                    if k == "type" {
                        if let Some(t) = string(v) {
                            tag = Some(t);
                        }
                    } else {
                        named.push((k, v));
                    }
                }
            }
            let tag = tag.ok_or("map event without a string `type`")?;
            let order: &[&str] = match tag.as_str() {
                "BlockStored" => &STORED_FIELDS,
                "BlockRemoved" => &REMOVED_FIELDS,
                _ => &[],
            };
            let mut values = vec![Value::Nil; order.len()];
            let mut present = 0;
            for (k, v) in named {
                if let Some(i) = order.iter().position(|f| *f == k) {
                    values[i] = v;
                    present = present.max(i + 1);
                }
            }
            (tag, Fields { values }, present)
        }
        _ => return Err("event is not an array or map"),
    };
    Ok(Some(match tag.as_str() {
        "BlockStored" => {
            if positional_len < 4 {
                return Err("BlockStored needs block_hashes, parent, token_ids, block_size");
            }
            let block_hashes = hash_list(fields.get(0))?;
            let parent_hash = match fields.get(1) {
                Value::Nil => None,
                v => Some(hash(v)?),
            };
            let Value::Array(tokens) = fields.get(2) else {
                return Err("token_ids is not an array");
            };
            let token_ids = tokens
                .into_iter()
                .map(|t| {
                    let i = int(&t).ok_or("token id is not an integer")?;
                    u32::try_from(i).map_err(|_| "token id out of range")
                })
                .collect::<Result<_, _>>()?;
            let block_size = int(&fields.get(3)).ok_or("block_size is not an integer")?;
            let block_size = u32::try_from(block_size).map_err(|_| "block_size out of range")?;
            let lora_id = match fields.get(4) {
                Value::Nil => None,
                v => {
                    let i = int(&v).ok_or("lora_id is not an integer")?;
                    Some(i64::try_from(i).map_err(|_| "lora_id out of range")?)
                }
            };
            KvEvent::BlockStored {
                block_hashes,
                parent_hash,
                token_ids,
                block_size,
                lora_id,
                medium: opt_string(fields.get(5), "medium is not a string")?,
                lora_name: opt_string(fields.get(6), "lora_name is not a string")?,
            }
        }
        "BlockRemoved" => {
            if positional_len < 1 {
                return Err("BlockRemoved needs block_hashes");
            }
            KvEvent::BlockRemoved {
                block_hashes: hash_list(fields.get(0))?,
                medium: opt_string(fields.get(1), "medium is not a string")?,
            }
        }
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        _ => return Ok(None),
    }))
}

fn hash_list(v: Value) -> Result<Vec<u64>, &'static str> {
    let Value::Array(items) = v else {
        return Err("block_hashes is not an array");
    };
    items.into_iter().map(hash).collect()
}

/// A hash given as an integer (signed or unsigned, low 64 bits kept) or as bytes
/// (big-endian, low 64 bits kept, as `maybe_convert_block_hash`).
fn hash(v: Value) -> Result<u64, &'static str> {
    match v {
        Value::Binary(b) => {
            let tail = &b[b.len().saturating_sub(8)..];
            Ok(tail.iter().fold(0u64, |acc, &x| (acc << 8) | x as u64))
        }
        v => int(&v)
            .map(|i| i as u64)
            .ok_or("block hash is neither an integer nor bytes"),
    }
}

fn opt_string(v: Value, err: &'static str) -> Result<Option<String>, &'static str> {
    match v {
        Value::Nil => Ok(None),
        v => string(v).map(Some).ok_or(err),
    }
}

/// Any MessagePack integer (uint64 or int64 family) as `i128`, which holds both.
fn int(v: &Value) -> Option<i128> {
    let Value::Integer(i) = v else { return None };
    i.as_u64()
        .map(i128::from)
        .or_else(|| i.as_i64().map(i128::from))
}

/// A UTF-8 string value (rmpv keeps invalid UTF-8 as a string too; that is not one here).
fn string(v: Value) -> Option<String> {
    match v {
        Value::String(s) => s.into_str(),
        _ => None,
    }
}

/// Reads exactly one value spanning all of `payload`, nesting bounded.
fn read_value(payload: &[u8]) -> Result<Value, MsgpackError> {
    use rmpv::decode::Error;
    let mut rd = payload;
    let value =
        rmpv::decode::read_value_with_max_depth(&mut rd, RMPV_MAX_DEPTH).map_err(|e| match e {
            Error::DepthLimitExceeded => MsgpackError::TooDeep,
            Error::InvalidMarkerRead(e) | Error::InvalidDataRead(e) => match e.kind() {
                std::io::ErrorKind::UnexpectedEof => MsgpackError::Truncated,
                kind => MsgpackError::Read(kind),
            },
        })?;
    match rd.len() {
        0 => Ok(value),
        n => Err(MsgpackError::TrailingBytes(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn stored(hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>) -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: hashes,
            parent_hash: parent,
            token_ids: tokens,
            block_size: 4,
            lora_id: None,
            medium: Some(MEDIUM_GPU.into()),
            lora_name: None,
        }
    }

    // [1.5, [["BlockStored", [1, 2], nil, [1..8], 4, nil, "GPU"]], 0], written from
    // the published struct order, byte by byte.
    const STORED_BATCH: &str = "93 cb3ff8000000000000 91
        97 ab 426c6f636b53746f726564 92 01 02 c0 98 0102030405060708 04 c0 a3 475055
        00";

    #[test]
    fn decodes_hand_written_block_stored_batch() {
        let d = decode_batch(&hex(STORED_BATCH)).unwrap();
        assert_eq!(d.skipped_unknown, 0);
        assert_eq!(d.batch.ts, 1.5);
        assert_eq!(d.batch.dp_rank, Some(0));
        assert_eq!(
            d.batch.events,
            vec![stored(vec![1, 2], None, (1..=8).collect())]
        );
    }

    #[test]
    fn encoder_writes_the_same_bytes_as_the_published_format() {
        let batch = KvEventBatch {
            ts: 1.5,
            events: vec![stored(vec![1, 2], None, (1..=8).collect())],
            dp_rank: Some(0),
        };
        assert_eq!(encode_batch(&batch), hex(STORED_BATCH));
    }

    #[test]
    fn accepts_oldest_layout_without_medium_or_dp_rank() {
        // [2.0, [["BlockStored", [u64::MAX], 7, [9,9,9,9], 4, nil], ["BlockRemoved", [5]]]]
        let bytes = hex("92 cb4000000000000000 92
             96 ab426c6f636b53746f726564 91 cfffffffffffffffff 07 94 09090909 04 c0
             92 ac 426c6f636b52656d6f766564 91 05");
        let d = decode_batch(&bytes).unwrap();
        assert_eq!(d.batch.dp_rank, None);
        assert_eq!(
            d.batch.events,
            vec![
                KvEvent::BlockStored {
                    block_hashes: vec![u64::MAX],
                    parent_hash: Some(7),
                    token_ids: vec![9; 4],
                    block_size: 4,
                    lora_id: None,
                    medium: None,
                    lora_name: None,
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![5],
                    medium: None,
                },
            ]
        );
    }

    #[test]
    fn byte_hashes_keep_the_low_64_bits_big_endian_and_negative_ints_wrap() {
        // ["BlockRemoved", [bin(32 bytes ..0102030405060708), -1], "GPU"]
        let bytes = hex(&format!(
            "93 cb3ff0000000000000 91 93 ac426c6f636b52656d6f766564
             92 c420 {}0102030405060708 ff a3475055 c0",
            "ab".repeat(24)
        ));
        let d = decode_batch(&bytes).unwrap();
        assert_eq!(
            d.batch.events,
            vec![KvEvent::BlockRemoved {
                block_hashes: vec![0x0102030405060708, u64::MAX],
                medium: Some("GPU".into()),
            }]
        );
    }

    #[test]
    fn newer_trailing_fields_are_read_or_ignored_and_unknown_kinds_are_counted() {
        // [1.0, [["BlockStored", [3], nil, [1,2,3,4], 4, nil, "GPU", "ad", nil, 0],
        //        ["BlockMigrated", [5], "peer"], ["AllBlocksCleared"]], 1]
        let bytes = hex("93 cb3ff0000000000000 93
             9a ab426c6f636b53746f726564 91 03 c0 94 01020304 04 c0 a3475055 a26164 c0 00
             93 ad 426c6f636b4d69677261746564 91 05 a4 70656572
             91 b0 416c6c426c6f636b73436c6561726564
             01");
        let d = decode_batch(&bytes).unwrap();
        assert_eq!(d.skipped_unknown, 1);
        assert_eq!(d.batch.dp_rank, Some(1));
        assert_eq!(d.batch.events.len(), 2);
        assert!(matches!(
            &d.batch.events[0],
            KvEvent::BlockStored { lora_name: Some(n), .. } if n == "ad"
        ));
        assert_eq!(d.batch.events[1], KvEvent::AllBlocksCleared);
    }

    #[test]
    fn accepts_map_layout_of_newest_vllm() {
        // [1.0, [{"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}], nil]
        let bytes = hex("93 cb3ff0000000000000 91
             83 a4 74797065 ac 426c6f636b52656d6f766564
                ac 626c6f636b5f686173686573 91 07
                a6 6d656469756d a3 475055
             c0");
        let d = decode_batch(&bytes).unwrap();
        assert_eq!(
            d.batch.events,
            vec![KvEvent::BlockRemoved {
                block_hashes: vec![7],
                medium: Some("GPU".into())
            }]
        );
    }

    #[test]
    fn malformed_events_and_frames_are_typed_errors() {
        // BlockStored whose hashes are a string.
        let bytes = hex("92 cb3ff0000000000000 91 95 ab426c6f636b53746f726564 a1 78 c0 90 04");
        assert!(matches!(
            decode_batch(&bytes),
            Err(KvEventDecodeError::Event { index: 0, .. })
        ));
        assert_eq!(
            decode_message(&[b"t", b"123", b""]),
            Err(KvEventDecodeError::SequenceLength(3))
        );
        assert_eq!(
            decode_message(&[b"t"]),
            Err(KvEventDecodeError::FrameCount(1))
        );
    }

    #[test]
    fn message_round_trip_with_sequence_numbers() {
        let mut enc = KvEventEncoder::new("kv", Some(2));
        let events = vec![
            stored(vec![10, 11], Some(9), (0..8).collect()),
            KvEvent::BlockRemoved {
                block_hashes: vec![u64::MAX - 3],
                medium: Some(MEDIUM_GPU.into()),
            },
            KvEvent::AllBlocksCleared,
        ];
        let _ = enc.encode(0.0, vec![]);
        let frames = enc.encode(12.25, events.clone());
        assert_eq!(frames[1], 1u64.to_be_bytes());
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let m = decode_message(&refs).unwrap();
        assert_eq!(m.topic, b"kv");
        assert_eq!(m.seq, 1);
        assert_eq!(m.batch.batch.events, events);
        assert_eq!(m.batch.batch.dp_rank, Some(2));
        assert_eq!(m.batch.batch.ts, 12.25);
    }

    #[test]
    fn hostile_declared_lengths_are_truncation_errors() {
        use KvEventDecodeError::Msgpack;
        // array32, map32, str32, bin32, ext32 claiming 4 GiB, alone and as the events
        // of a batch, then nothing (or a little) behind them.
        for header in [
            "dd ffffffff",
            "df ffffffff",
            "db ffffffff",
            "c6 ffffffff",
            "c9 ffffffff 01",
        ] {
            assert_eq!(
                decode_batch(&hex(header)),
                Err(Msgpack(MsgpackError::Truncated)),
                "{header}"
            );
            let batch = hex(&format!(
                "93 cb3ff0000000000000 {header} {}",
                "c0".repeat(1000)
            ));
            assert_eq!(
                decode_batch(&batch),
                Err(Msgpack(MsgpackError::Truncated)),
                "{header} in a batch"
            );
        }
        // Nested: every level claims u32::MAX elements.
        let bytes = hex(&"dd ffffffff".repeat(20));
        assert!(matches!(decode_batch(&bytes), Err(Msgpack(_))));
    }

    #[test]
    fn nesting_is_bounded_at_32_containers() {
        use KvEventDecodeError::Msgpack;
        assert_eq!(
            decode_batch(&[0x91; 100]),
            Err(Msgpack(MsgpackError::TooDeep))
        );
        // 32 nested containers around a string still parse (then fail as a batch).
        let mut ok = vec![0x91; 16];
        ok.extend([0x81, 0xa1, b'k'].repeat(16));
        ok.extend(hex("a1 78"));
        assert!(matches!(
            decode_batch(&ok),
            Err(KvEventDecodeError::Batch(_))
        ));
        // 33 around a string, or 34 around anything, are refused.
        let mut deep = vec![0x91; 33];
        deep.extend(hex("a1 78"));
        assert_eq!(decode_batch(&deep), Err(Msgpack(MsgpackError::TooDeep)));
        let mut deep = vec![0x91; 34];
        deep.push(0xc0);
        assert_eq!(decode_batch(&deep), Err(Msgpack(MsgpackError::TooDeep)));
    }

    #[test]
    fn truncated_trailing_and_non_utf8_payloads_are_typed_errors() {
        use KvEventDecodeError::Msgpack;
        assert_eq!(decode_batch(&[]), Err(Msgpack(MsgpackError::Truncated)));
        let mut bytes = hex(STORED_BATCH);
        bytes.push(0xc0);
        assert_eq!(
            decode_batch(&bytes),
            Err(Msgpack(MsgpackError::TrailingBytes(1)))
        );
        bytes.truncate(bytes.len() - 2);
        assert_eq!(decode_batch(&bytes), Err(Msgpack(MsgpackError::Truncated)));
        // An event tag that is not UTF-8.
        let bytes = hex("92 cb3ff0000000000000 91 91 a2 ff fe");
        assert!(matches!(
            decode_batch(&bytes),
            Err(KvEventDecodeError::Event { index: 0, .. })
        ));
    }

    fn arb_event() -> impl Strategy<Value = KvEvent> {
        let hashes = proptest::collection::vec(any::<u64>(), 0..20);
        prop_oneof![
            (
                hashes.clone(),
                proptest::option::of(any::<u64>()),
                proptest::collection::vec(any::<u32>(), 0..40),
                any::<u32>(),
                proptest::option::of(any::<i64>()),
                proptest::option::of("[A-Z]{1,4}"),
                proptest::option::of("[a-z]{0,40}"),
            )
                .prop_map(|(h, p, t, bs, l, m, n)| KvEvent::BlockStored {
                    block_hashes: h,
                    parent_hash: p,
                    token_ids: t,
                    block_size: bs,
                    lora_id: l,
                    medium: m,
                    lora_name: n,
                }),
            (hashes, proptest::option::of("[A-Z]{1,4}")).prop_map(|(h, m)| {
                KvEvent::BlockRemoved {
                    block_hashes: h,
                    medium: m,
                }
            }),
            Just(KvEvent::AllBlocksCleared),
        ]
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_batch(&bytes);
            let _ = decode_message(&[b"t", &[0u8; 8], &bytes]);
        }

        #[test]
        fn mutated_valid_payloads_never_panic(pos in 0usize..200, byte in any::<u8>()) {
            let mut bytes = hex(STORED_BATCH);
            let i = pos % bytes.len();
            bytes[i] = byte;
            let _ = decode_batch(&bytes);
            bytes.truncate(i);
            let _ = decode_batch(&bytes);
        }

        #[test]
        fn batches_round_trip(
            events in proptest::collection::vec(arb_event(), 0..8),
            ts in -1e12f64..1e12,
            dp in proptest::option::of(any::<i64>()),
        ) {
            let batch = KvEventBatch { ts, events, dp_rank: dp };
            let d = decode_batch(&encode_batch(&batch)).unwrap();
            prop_assert_eq!(d.skipped_unknown, 0);
            prop_assert_eq!(d.batch, batch);
        }
    }
}
