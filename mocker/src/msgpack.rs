//! Just enough MessagePack for vLLM's KV event batches, written here so that decoding
//! untrusted bytes is bounded (depth, preallocation) and can never panic.
//!
//! Format reference: <https://github.com/msgpack/msgpack/blob/master/spec.md>.

use thiserror::Error;

/// Nesting deeper than this is refused: KV event batches are 4 levels deep, and a
/// recursive reader must not overflow the stack on hostile input.
const MAX_DEPTH: usize = 32;

/// A decoded MessagePack value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Nil,
    Bool(bool),
    /// Every integer family fits in `i128` (uint64 and int64 both).
    Int(i128),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
    /// Extension types are kept opaque; nothing in the event format uses them.
    Ext(i8, Vec<u8>),
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum MsgpackError {
    #[error("unexpected end of input at byte {0}")]
    Truncated(usize),
    #[error("reserved marker byte 0xc1 at byte {0}")]
    ReservedMarker(usize),
    #[error("string at byte {0} is not UTF-8")]
    InvalidUtf8(usize),
    #[error("nesting deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("{0} trailing bytes after the value")]
    TrailingBytes(usize),
}

/// Decodes exactly one value that spans all of `bytes`.
pub fn decode(bytes: &[u8]) -> Result<Value, MsgpackError> {
    let mut r = Reader { bytes, pos: 0 };
    let v = r.value(0)?;
    match bytes.len() - r.pos {
        0 => Ok(v),
        n => Err(MsgpackError::TrailingBytes(n)),
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MsgpackError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(MsgpackError::Truncated(self.pos))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], MsgpackError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn len8(&mut self) -> Result<usize, MsgpackError> {
        Ok(self.be::<1>()?[0] as usize)
    }
    fn len16(&mut self) -> Result<usize, MsgpackError> {
        Ok(u16::from_be_bytes(self.be()?) as usize)
    }
    fn len32(&mut self) -> Result<usize, MsgpackError> {
        Ok(u32::from_be_bytes(self.be()?) as usize)
    }

    fn str(&mut self, n: usize) -> Result<Value, MsgpackError> {
        let at = self.pos;
        let raw = self.take(n)?;
        String::from_utf8(raw.to_vec())
            .map(Value::Str)
            .map_err(|_| MsgpackError::InvalidUtf8(at))
    }

    fn bin(&mut self, n: usize) -> Result<Value, MsgpackError> {
        Ok(Value::Bin(self.take(n)?.to_vec()))
    }

    fn ext(&mut self, n: usize) -> Result<Value, MsgpackError> {
        let ty = self.be::<1>()?[0] as i8;
        Ok(Value::Ext(ty, self.take(n)?.to_vec()))
    }

    fn array(&mut self, n: usize, depth: usize) -> Result<Value, MsgpackError> {
        // Each element takes at least one byte, so the remaining input bounds the
        // allocation whatever length the header claims.
        let mut items = Vec::with_capacity(n.min(self.bytes.len() - self.pos));
        for _ in 0..n {
            items.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, n: usize, depth: usize) -> Result<Value, MsgpackError> {
        let mut items = Vec::with_capacity(n.min((self.bytes.len() - self.pos) / 2));
        for _ in 0..n {
            let k = self.value(depth + 1)?;
            let v = self.value(depth + 1)?;
            items.push((k, v));
        }
        Ok(Value::Map(items))
    }

    fn value(&mut self, depth: usize) -> Result<Value, MsgpackError> {
        if depth > MAX_DEPTH {
            return Err(MsgpackError::TooDeep);
        }
        let at = self.pos;
        let marker = self.be::<1>()?[0];
        Ok(match marker {
            0x00..=0x7f => Value::Int(marker as i128),
            0x80..=0x8f => return self.map((marker & 0x0f) as usize, depth),
            0x90..=0x9f => return self.array((marker & 0x0f) as usize, depth),
            0xa0..=0xbf => return self.str((marker & 0x1f) as usize),
            0xc0 => Value::Nil,
            0xc1 => return Err(MsgpackError::ReservedMarker(at)),
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4 => {
                let n = self.len8()?;
                return self.bin(n);
            }
            0xc5 => {
                let n = self.len16()?;
                return self.bin(n);
            }
            0xc6 => {
                let n = self.len32()?;
                return self.bin(n);
            }
            0xc7 => {
                let n = self.len8()?;
                return self.ext(n);
            }
            0xc8 => {
                let n = self.len16()?;
                return self.ext(n);
            }
            0xc9 => {
                let n = self.len32()?;
                return self.ext(n);
            }
            0xca => Value::Float(f32::from_be_bytes(self.be()?) as f64),
            0xcb => Value::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Value::Int(u8::from_be_bytes(self.be()?) as i128),
            0xcd => Value::Int(u16::from_be_bytes(self.be()?) as i128),
            0xce => Value::Int(u32::from_be_bytes(self.be()?) as i128),
            0xcf => Value::Int(u64::from_be_bytes(self.be()?) as i128),
            0xd0 => Value::Int(i8::from_be_bytes(self.be()?) as i128),
            0xd1 => Value::Int(i16::from_be_bytes(self.be()?) as i128),
            0xd2 => Value::Int(i32::from_be_bytes(self.be()?) as i128),
            0xd3 => Value::Int(i64::from_be_bytes(self.be()?) as i128),
            0xd4 => return self.ext(1),
            0xd5 => return self.ext(2),
            0xd6 => return self.ext(4),
            0xd7 => return self.ext(8),
            0xd8 => return self.ext(16),
            0xd9 => {
                let n = self.len8()?;
                return self.str(n);
            }
            0xda => {
                let n = self.len16()?;
                return self.str(n);
            }
            0xdb => {
                let n = self.len32()?;
                return self.str(n);
            }
            0xdc => {
                let n = self.len16()?;
                return self.array(n, depth);
            }
            0xdd => {
                let n = self.len32()?;
                return self.array(n, depth);
            }
            0xde => {
                let n = self.len16()?;
                return self.map(n, depth);
            }
            0xdf => {
                let n = self.len32()?;
                return self.map(n, depth);
            }
            0xe0..=0xff => Value::Int((marker as i8) as i128),
        })
    }
}

/// Appends MessagePack to a buffer, always in the smallest form (as msgspec does).
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn nil(&mut self) {
        self.buf.push(0xc0);
    }

    pub fn array_header(&mut self, n: usize) {
        if n < 16 {
            self.buf.push(0x90 | n as u8);
        } else if n <= u16::MAX as usize {
            self.buf.push(0xdc);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(0xdd);
            self.buf.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }

    pub fn str(&mut self, s: &str) {
        let n = s.len();
        if n < 32 {
            self.buf.push(0xa0 | n as u8);
        } else if n <= u8::MAX as usize {
            self.buf.push(0xd9);
            self.buf.push(n as u8);
        } else if n <= u16::MAX as usize {
            self.buf.push(0xda);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(0xdb);
            self.buf.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self.buf.extend_from_slice(s.as_bytes());
    }

    pub fn uint(&mut self, v: u64) {
        if v < 0x80 {
            self.buf.push(v as u8);
        } else if v <= u8::MAX as u64 {
            self.buf.push(0xcc);
            self.buf.push(v as u8);
        } else if v <= u16::MAX as u64 {
            self.buf.push(0xcd);
            self.buf.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= u32::MAX as u64 {
            self.buf.push(0xce);
            self.buf.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.buf.push(0xcf);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v as u64);
        } else if v >= -32 {
            self.buf.push(v as i8 as u8);
        } else if v >= i8::MIN as i64 {
            self.buf.push(0xd0);
            self.buf.push(v as i8 as u8);
        } else if v >= i16::MIN as i64 {
            self.buf.push(0xd1);
            self.buf.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i32::MIN as i64 {
            self.buf.push(0xd2);
            self.buf.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            self.buf.push(0xd3);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn f64(&mut self, v: f64) {
        self.buf.push(0xcb);
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_round_trip_in_every_width() {
        for v in [
            0i64,
            1,
            127,
            128,
            255,
            256,
            65535,
            65536,
            -1,
            -32,
            -33,
            -129,
            -40000,
            i64::MIN,
        ] {
            let mut w = Writer::default();
            w.int(v);
            assert_eq!(decode(&w.buf), Ok(Value::Int(v as i128)), "{v}");
        }
        let mut w = Writer::default();
        w.uint(u64::MAX);
        assert_eq!(w.buf[0], 0xcf);
        assert_eq!(decode(&w.buf), Ok(Value::Int(u64::MAX as i128)));
    }

    #[test]
    fn hostile_lengths_and_depth_are_errors() {
        // array32 claiming 4 billion elements, then nothing.
        assert!(matches!(
            decode(&[0xdd, 0xff, 0xff, 0xff, 0xff]),
            Err(MsgpackError::Truncated(_))
        ));
        assert_eq!(decode(&[0x91; 100]), Err(MsgpackError::TooDeep));
        assert_eq!(decode(&[0xc1]), Err(MsgpackError::ReservedMarker(0)));
        assert_eq!(decode(&[0xc0, 0xc0]), Err(MsgpackError::TrailingBytes(1)));
    }
}
