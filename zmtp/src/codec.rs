//! The ZMTP 3.0 wire format without I/O (rfc.zeromq.org/spec/23, "ZMTP 3.0"; the section
//! names in quotes below are that document's).
//!
//! The [`Decoder`] takes whatever bytes arrived and hands back whole commands and whole
//! messages. It checks every frame header against its [`Limits`] before it stores a byte
//! of the body, and it grows a body only as the body's bytes arrive, so what it holds is
//! bounded by the limits and by what the peer really sent, never by what a header claims.

use std::fmt;

use bytes::Bytes;

/// "Framing": "the greeting, which has a fixed size of 64 octets".
pub const GREETING_LEN: usize = 64;

/// Flag bits ("Framing"): bit 0 MORE, bit 1 LONG, bit 2 COMMAND.
const MORE: u8 = 0x01;
const LONG: u8 = 0x02;
const COMMAND: u8 = 0x04;
/// "Bits 7-3 are reserved for future use and MUST be zero."
const RESERVED: u8 = !(MORE | LONG | COMMAND);

/// The security mechanism, null-padded to 20 octets ("Formal Grammar": `mechanism`).
const NULL_MECHANISM: [u8; 20] = *b"NULL\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";

/// A socket type as the `Socket-Type` property names it ("The Socket-Type Property").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketType {
    Req,
    Rep,
    Dealer,
    Router,
    Pub,
    XPub,
    Sub,
    XSub,
    Push,
    Pull,
    Pair,
}

impl SocketType {
    const ALL: [Self; 11] = [
        Self::Req,
        Self::Rep,
        Self::Dealer,
        Self::Router,
        Self::Pub,
        Self::XPub,
        Self::Sub,
        Self::XSub,
        Self::Push,
        Self::Pull,
        Self::Pair,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Req => "REQ",
            Self::Rep => "REP",
            Self::Dealer => "DEALER",
            Self::Router => "ROUTER",
            Self::Pub => "PUB",
            Self::XPub => "XPUB",
            Self::Sub => "SUB",
            Self::XSub => "XSUB",
            Self::Push => "PUSH",
            Self::Pull => "PULL",
            Self::Pair => "PAIR",
        }
    }

    /// The type a `Socket-Type` value names. The names are ABNF strings in the spec,
    /// which match without regard to case.
    pub fn from_name(name: &[u8]) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str().as_bytes().eq_ignore_ascii_case(name))
    }

    /// Whether a peer of type `peer` may talk to this one: the table of legal
    /// combinations in "The Socket-Type Property".
    pub fn accepts(self, peer: Self) -> bool {
        use SocketType::*;
        matches!(
            (self, peer),
            (Req, Rep | Router)
                | (Rep, Req | Dealer)
                | (Dealer, Rep | Dealer | Router)
                | (Router, Req | Dealer | Router)
                | (Pub | XPub, Sub | XSub)
                | (Sub | XSub, Pub | XPub)
                | (Push, Pull)
                | (Pull, Push)
                | (Pair, Pair)
        )
    }
}

impl fmt::Display for SocketType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one peer can make a connection hold. A frame whose header declares more than
/// `max_frame_bytes`, or that would take its message past `max_message_frames` or
/// `max_message_bytes`, is refused as soon as its header is read, before its body is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_frame_bytes: usize,
    pub max_message_frames: usize,
    pub max_message_bytes: usize,
}

impl Default for Limits {
    /// Generous for vLLM's KV events (three frames; one engine step's batch, even a
    /// million-token prefill without chunking, is under 10 MiB of msgpack).
    fn default() -> Self {
        Self {
            max_frame_bytes: 32 << 20,
            max_message_frames: 16,
            max_message_bytes: 32 << 20,
        }
    }
}

/// Why a peer was cut off: something it sent broke the protocol or our limits.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("not a ZMTP greeting (bad signature)")]
    Signature,
    #[error("ZMTP major version {0}; this side speaks 3 and later only")]
    Version(u8),
    #[error("security mechanism {0:?}; this side speaks NULL only")]
    Mechanism(String),
    #[error("frame flags {0:#04x} (reserved bits, or MORE on a command)")]
    Flags(u8),
    #[error("a frame of {declared} bytes, over the limit of {limit}")]
    FrameTooLarge { declared: u64, limit: usize },
    #[error("a message of more than {limit} frames")]
    TooManyFrames { limit: usize },
    #[error("a message of more than {limit} bytes")]
    MessageTooLarge { limit: usize },
    #[error("a command between the frames of a message")]
    CommandInMessage,
    #[error("a malformed {0}")]
    Malformed(&'static str),
    #[error("{0} where READY was due")]
    NotReady(&'static str),
    #[error("a {peer} peer cannot talk to a {ours} socket")]
    SocketType { ours: SocketType, peer: String },
    #[error("the peer sent ERROR: {0}")]
    PeerError(String),
    #[error("more than {limit} subscriptions")]
    TooManySubscriptions { limit: usize },
}

impl Violation {
    /// A short stable name, for logs and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Signature | Self::Version(_) | Self::Mechanism(_) => "greeting",
            Self::FrameTooLarge { .. } => "frame_too_large",
            Self::TooManyFrames { .. } => "too_many_frames",
            Self::MessageTooLarge { .. } => "message_too_large",
            Self::Flags(_) | Self::CommandInMessage | Self::Malformed(_) | Self::NotReady(_) => {
                "malformed"
            }
            Self::SocketType { .. } => "socket_type",
            Self::PeerError(_) => "peer_error",
            Self::TooManySubscriptions { .. } => "too_many_subscriptions",
        }
    }
}

/// Our greeting ("Formal Grammar", `greeting`): the signature with zero padding,
/// version 3.0, mechanism NULL, as-server 0 ("When a peer uses the NULL security
/// mechanism, the as-server field MUST be zero") and the zero filler.
pub fn greeting() -> [u8; GREETING_LEN] {
    let mut g = [0; GREETING_LEN];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[12..32].copy_from_slice(&NULL_MECHANISM);
    g
}

/// Checks as much of the peer's greeting as has arrived, so garbage or an older
/// protocol is refused at its first telling octet rather than after 64.
fn check_greeting(g: &[u8]) -> Result<(), Violation> {
    // The padding (octets 1-8) "MUST NOT" be validated; as-server and the filler mean
    // nothing to the NULL mechanism.
    if g.first().is_some_and(|&b| b != 0xFF) || g.get(9).is_some_and(|&b| b != 0x7F) {
        return Err(Violation::Signature);
    }
    // "A peer MUST accept higher protocol versions as valid"; older ones would need
    // another framing, which this side does not speak ("Version Negotiation").
    if let Some(&major) = g.get(10)
        && major < 3
    {
        return Err(Violation::Version(major));
    }
    // "If the mechanism that the peer received does not exactly match the mechanism it
    // sent, it MUST close the connection."
    if let Some(mechanism) = g.get(12..32)
        && mechanism != NULL_MECHANISM
    {
        let name = mechanism.split(|&b| b == 0).next().unwrap_or_default();
        return Err(Violation::Mechanism(
            String::from_utf8_lossy(name).into_owned(),
        ));
    }
    Ok(())
}

/// One command frame split into its name and data ("Formal Grammar": `command-body`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub name: Bytes,
    pub data: Bytes,
}

/// What the decoder hands back: one command, or every frame of one message in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Command(Command),
    Message(Vec<Bytes>),
}

/// A READY command's metadata ("The NULL Security Mechanism", "Connection Metadata").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    pub socket_type: SocketType,
    /// "identity = 0*255OCTET", meaningful only to a ROUTER.
    pub identity: Option<Bytes>,
}

/// Appends one frame: the flags, then the body size in one octet up to 255, else LONG
/// and eight octets in network byte order, then the body ("Framing").
fn put_frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    match u8::try_from(body.len()) {
        Ok(size) => out.extend_from_slice(&[flags, size]),
        Err(_) => {
            out.push(flags | LONG);
            out.extend_from_slice(&(body.len() as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(body);
}

/// A message on the wire: every frame but the last carries MORE.
pub fn encode_message(frames: &[Bytes]) -> Vec<u8> {
    let size = frames.iter().map(|f| f.len() + 9).sum();
    let mut out = Vec::with_capacity(size);
    for (i, frame) in frames.iter().enumerate() {
        let more = if i + 1 < frames.len() { MORE } else { 0 };
        put_frame(&mut out, more, frame);
    }
    out
}

/// "command-name = OCTET 1*255command-name-char", then the data.
fn encode_command(name: &str, data: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(1 + name.len() + data.len());
    body.push(name.len() as u8);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(data);
    let mut out = Vec::with_capacity(body.len() + 9);
    put_frame(&mut out, COMMAND, &body);
    out
}

/// A READY command: each property is a one-octet name size, the name, a four-octet
/// value size in network byte order, the value ("The NULL Security Mechanism").
pub fn encode_ready(ready: &Ready) -> Vec<u8> {
    let mut data = Vec::new();
    let mut property = |name: &str, value: &[u8]| {
        data.push(name.len() as u8);
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&(value.len() as u32).to_be_bytes());
        data.extend_from_slice(value);
    };
    property("Socket-Type", ready.socket_type.as_str().as_bytes());
    if let Some(identity) = &ready.identity {
        property("Identity", identity);
    }
    encode_command("READY", &data)
}

/// An ERROR command: "error-reason = OCTET 0*255VCHAR" (longer reasons are cut).
pub fn encode_error(reason: &str) -> Vec<u8> {
    let reason = &reason.as_bytes()[..reason.len().min(255)];
    let mut data = vec![reason.len() as u8];
    data.extend_from_slice(reason);
    encode_command("ERROR", &data)
}

/// The handshake of the NULL mechanism ("The NULL Security Mechanism": `null = ready
/// *message | error`): the peer's first frame must be a READY whose socket type may
/// talk to `ours` ("The peer SHOULD enforce that the other peer is using a valid socket
/// type").
pub fn expect_ready(frame: Frame, ours: SocketType) -> Result<Ready, Violation> {
    match frame {
        Frame::Command(c) if c.name.eq_ignore_ascii_case(b"READY") => parse_ready(&c.data, ours),
        Frame::Command(c) if c.name.eq_ignore_ascii_case(b"ERROR") => Err(peer_error(&c.data)),
        Frame::Command(_) => Err(Violation::NotReady("another command")),
        Frame::Message(_) => Err(Violation::NotReady("a message")),
    }
}

/// After the handshake: messages pass, ERROR ends the connection ("The peer SHALL
/// treat an incoming ERROR command as fatal"), and other commands (ZMTP 3.1's PING or
/// SUBSCRIBE, which a newer peer may still send) are skipped.
pub fn traffic(frame: Frame) -> Result<Option<Vec<Bytes>>, Violation> {
    match frame {
        Frame::Message(frames) => Ok(Some(frames)),
        Frame::Command(c) if c.name.eq_ignore_ascii_case(b"ERROR") => Err(peer_error(&c.data)),
        Frame::Command(_) => Ok(None),
    }
}

/// "error-reason = OCTET 0*255VCHAR": a size, then the reason.
fn peer_error(data: &[u8]) -> Violation {
    let size = data.first().map_or(0, |&n| usize::from(n));
    let reason = data.get(1..).unwrap_or_default();
    let reason = &reason[..reason.len().min(size)];
    Violation::PeerError(String::from_utf8_lossy(reason).into_owned())
}

/// Splits `data` after `n` octets, or says the READY is malformed.
fn take(data: &[u8], n: usize) -> Result<(&[u8], &[u8]), Violation> {
    data.split_at_checked(n)
        .ok_or(Violation::Malformed("READY command"))
}

fn parse_ready(mut data: &[u8], ours: SocketType) -> Result<Ready, Violation> {
    let (mut socket_type, mut identity) = (None, None);
    while !data.is_empty() {
        let (size, rest) = take(data, 1)?;
        // "The name SHALL be 1 to 255 characters. Zero-sized names are not valid."
        if size[0] == 0 {
            return Err(Violation::Malformed("READY command"));
        }
        let (name, rest) = take(rest, usize::from(size[0]))?;
        let (size, rest) = take(rest, 4)?;
        let size = u32::from_be_bytes(size.try_into().expect("four octets"));
        // "The value SHALL be 0 to 2,147,483,647 ... octets."
        if size > i32::MAX as u32 {
            return Err(Violation::Malformed("READY command"));
        }
        let (value, rest) = take(rest, size as usize)?;
        // "The case (upper or lower) of names SHALL NOT be significant."
        if name.eq_ignore_ascii_case(b"Socket-Type") {
            socket_type = Some(value);
        } else if name.eq_ignore_ascii_case(b"Identity") {
            if value.len() > 255 {
                return Err(Violation::Malformed("READY command"));
            }
            identity = Some(Bytes::copy_from_slice(value));
        }
        data = rest;
    }
    match socket_type.and_then(SocketType::from_name) {
        Some(peer) if ours.accepts(peer) => Ok(Ready {
            socket_type: peer,
            identity,
        }),
        _ => {
            let named = socket_type.map_or("unnamed".into(), |name| {
                String::from_utf8_lossy(&name[..name.len().min(32)]).into_owned()
            });
            Err(Violation::SocketType { ours, peer: named })
        }
    }
}

/// A change a subscriber asks of a publisher ("The Publish-Subscribe Pattern").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subscription {
    Subscribe(Bytes),
    Cancel(Bytes),
}

/// The message that subscribes to `prefix`: one frame, %d1 then the prefix ("The
/// Publish-Subscribe Pattern": `subscribe = %x00 short-size %d1 subscription`). ZMTP 3.1
/// made it a command, but libzmq still takes this form, and sends it to a 3.0 peer.
pub fn subscribe(prefix: &[u8]) -> Bytes {
    let mut frame = Vec::with_capacity(1 + prefix.len());
    frame.push(1);
    frame.extend_from_slice(prefix);
    frame.into()
}

/// What a subscriber's message asks: a one-frame message starting with %d1 subscribes,
/// with %d0 cancels; anything else is not a subscription, and a PUB "SHALL silently
/// discard any messages that subscribers send it" (rfc.zeromq.org/spec/29).
pub fn subscription(message: &[Bytes]) -> Option<Subscription> {
    let [frame] = message else { return None };
    match frame.first()? {
        1 => Some(Subscription::Subscribe(frame.slice(1..))),
        0 => Some(Subscription::Cancel(frame.slice(1..))),
        _ => None,
    }
}

/// A frame whose header is read and whose body is arriving.
struct Body {
    flags: u8,
    size: usize,
    data: Vec<u8>,
}

/// Reads one peer's byte stream: the greeting, then frames, which it gathers into
/// commands and whole messages. It holds at most the message in progress, which its
/// limits bound before any of it is stored.
pub struct Decoder {
    limits: Limits,
    greeted: bool,
    /// The greeting while it arrives, then each frame header while it arrives.
    head: [u8; GREETING_LEN],
    head_len: usize,
    body: Option<Body>,
    /// The frames of the message in progress and their total size.
    parts: Vec<Bytes>,
    part_bytes: usize,
}

impl Decoder {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            greeted: false,
            head: [0; GREETING_LEN],
            head_len: 0,
            body: None,
            parts: Vec::new(),
            part_bytes: 0,
        }
    }

    /// Consumes `input` up to the end of the next command or message and returns it, or
    /// consumes all of `input` and returns `None` when it needs more. After an error the
    /// connection must be dropped.
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<Frame>, Violation> {
        if !self.greeted {
            let whole = self.fill_head(input, GREETING_LEN);
            check_greeting(&self.head[..self.head_len])?;
            if !whole {
                return Ok(None);
            }
            self.greeted = true;
            self.head_len = 0;
        }
        loop {
            let body = match &mut self.body {
                Some(body) => body,
                None => match self.header(input)? {
                    Some(body) => self.body.insert(body),
                    None => return Ok(None),
                },
            };
            let n = (body.size - body.data.len()).min(input.len());
            // Grow geometrically for few copies, but never past the declared size, and
            // only by what has arrived.
            if body.data.capacity() < body.data.len() + n {
                let target = (body.data.capacity() * 2)
                    .max(body.data.len() + n)
                    .min(body.size);
                body.data.reserve_exact(target - body.data.len());
            }
            let (now, rest) = input.split_at(n);
            body.data.extend_from_slice(now);
            *input = rest;
            if body.data.len() < body.size {
                return Ok(None);
            }
            let (flags, data) = (body.flags, Bytes::from(std::mem::take(&mut body.data)));
            self.body = None;
            if flags & COMMAND != 0 {
                return parse_command(data).map(|c| Some(Frame::Command(c)));
            }
            self.part_bytes += data.len();
            self.parts.push(data);
            if flags & MORE == 0 {
                self.part_bytes = 0;
                return Ok(Some(Frame::Message(std::mem::take(&mut self.parts))));
            }
        }
    }

    /// Copies from `input` into the head until it holds `len` octets; says whether it does.
    fn fill_head(&mut self, input: &mut &[u8], len: usize) -> bool {
        let n = (len - self.head_len).min(input.len());
        let (now, rest) = input.split_at(n);
        self.head[self.head_len..self.head_len + n].copy_from_slice(now);
        self.head_len += n;
        *input = rest;
        self.head_len == len
    }

    /// Reads a frame header and checks it against the limits; `None` until it is whole.
    fn header(&mut self, input: &mut &[u8]) -> Result<Option<Body>, Violation> {
        if self.head_len == 0 {
            if !self.fill_head(input, 1) {
                return Ok(None);
            }
            self.check_flags(self.head[0])?;
        }
        let flags = self.head[0];
        let long = flags & LONG != 0;
        if !self.fill_head(input, if long { 9 } else { 2 }) {
            return Ok(None);
        }
        self.head_len = 0;
        let declared = if long {
            u64::from_be_bytes(self.head[1..9].try_into().expect("eight octets"))
        } else {
            u64::from(self.head[1])
        };
        let limit = self.limits.max_frame_bytes;
        let size = usize::try_from(declared)
            .ok()
            .filter(|&size| size <= limit)
            .ok_or(Violation::FrameTooLarge { declared, limit })?;
        if flags & COMMAND == 0 {
            if self.parts.len() >= self.limits.max_message_frames {
                return Err(Violation::TooManyFrames {
                    limit: self.limits.max_message_frames,
                });
            }
            if self.part_bytes.saturating_add(size) > self.limits.max_message_bytes {
                return Err(Violation::MessageTooLarge {
                    limit: self.limits.max_message_bytes,
                });
            }
        }
        Ok(Some(Body {
            flags,
            size,
            data: Vec::new(),
        }))
    }

    fn check_flags(&self, flags: u8) -> Result<(), Violation> {
        // MORE "SHALL be zero on command frames".
        if flags & RESERVED != 0 || flags & (COMMAND | MORE) == COMMAND | MORE {
            return Err(Violation::Flags(flags));
        }
        // `traffic = *(command | message)`: a command cannot split a message.
        if flags & COMMAND != 0 && !self.parts.is_empty() {
            return Err(Violation::CommandInMessage);
        }
        Ok(())
    }
}

/// "command-name = OCTET 1*255command-name-char", "command-name-char = ALPHA".
fn parse_command(body: Bytes) -> Result<Command, Violation> {
    let size = usize::from(*body.first().ok_or(Violation::Malformed("command"))?);
    let name = body
        .get(1..1 + size)
        .filter(|name| size > 0 && name.iter().all(u8::is_ascii_alphabetic))
        .ok_or(Violation::Malformed("command name"))?;
    let name = body.slice_ref(name);
    Ok(Command {
        name,
        data: body.slice(1 + size..),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: Limits = Limits {
        max_frame_bytes: 300,
        max_message_frames: 3,
        max_message_bytes: 400,
    };

    fn ready_of(socket_type: SocketType) -> Vec<u8> {
        encode_ready(&Ready {
            socket_type,
            identity: None,
        })
    }

    /// A PUB's greeting and READY, as a SUB receives them.
    fn pub_hello() -> Vec<u8> {
        let mut bytes = greeting().to_vec();
        bytes.extend(ready_of(SocketType::Pub));
        bytes
    }

    /// Decodes `bytes` in pieces of `chunk` octets; every frame, then the error if any.
    fn decode_all(limits: Limits, bytes: &[u8], chunk: usize) -> (Vec<Frame>, Option<Violation>) {
        let mut decoder = Decoder::new(limits);
        let mut frames = Vec::new();
        for piece in bytes.chunks(chunk) {
            let mut input = piece;
            loop {
                match decoder.decode(&mut input) {
                    Ok(Some(frame)) => frames.push(frame),
                    Ok(None) => {
                        assert!(input.is_empty(), "None leaves no input behind");
                        break;
                    }
                    Err(v) => return (frames, Some(v)),
                }
            }
        }
        (frames, None)
    }

    fn b(s: &'static [u8]) -> Bytes {
        Bytes::from_static(s)
    }

    #[test]
    fn greeting_is_64_octets_of_version_3_0_null() {
        let g = greeting();
        assert_eq!((g[0], g[9], g[10], g[11]), (0xFF, 0x7F, 3, 0));
        assert_eq!(&g[12..16], b"NULL");
        assert!(g[16..].iter().all(|&b| b == 0));
        assert_eq!(check_greeting(&g), Ok(()));
    }

    #[test]
    fn greetings_of_other_protocols_versions_or_mechanisms_are_refused() {
        let mut http = [b' '; GREETING_LEN];
        http[..16].copy_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(check_greeting(&http), Err(Violation::Signature));
        // Refused at the first telling octet: a ZMTP 2.0 peer sends only 11 before
        // waiting for ours.
        assert_eq!(check_greeting(b"G"), Err(Violation::Signature));
        let zmtp2 = [0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 1];
        assert_eq!(check_greeting(&zmtp2), Err(Violation::Version(1)));
        assert_eq!(check_greeting(&greeting()[..11]), Ok(()));
        let mut curve = greeting();
        curve[12..17].copy_from_slice(b"CURVE");
        assert_eq!(
            check_greeting(&curve),
            Err(Violation::Mechanism("CURVE".into()))
        );
        // Newer versions, any padding and libzmq's as-server/filler are accepted.
        let mut newer = greeting();
        newer[1..9].copy_from_slice(b"anything");
        (newer[10], newer[11]) = (3, 1);
        assert_eq!(check_greeting(&newer), Ok(()));
    }

    #[test]
    fn messages_decode_the_same_whole_or_byte_by_byte() {
        let mut bytes = pub_hello();
        let long = Bytes::from(vec![7u8; 280]);
        bytes.extend(encode_message(&[
            b(b"topic"),
            b(b"\0\0\0\0\0\0\0\x01"),
            long.clone(),
        ]));
        bytes.extend(encode_message(&[Bytes::new()]));
        for chunk in [1, 2, 7, 64, 1000] {
            let (frames, error) = decode_all(TINY, &bytes, chunk);
            assert_eq!(error, None, "chunk {chunk}");
            let ready = frames[0].clone();
            assert_eq!(
                expect_ready(ready, SocketType::Sub),
                Ok(Ready {
                    socket_type: SocketType::Pub,
                    identity: None
                })
            );
            assert_eq!(
                frames[1..],
                [
                    Frame::Message(vec![b(b"topic"), b(b"\0\0\0\0\0\0\0\x01"), long.clone()]),
                    Frame::Message(vec![Bytes::new()]),
                ]
            );
        }
    }

    #[test]
    fn a_huge_frame_header_is_refused_before_its_body() {
        let mut bytes = pub_hello();
        // A LONG message frame declaring 2^40 octets, and no body at all.
        bytes.push(LONG);
        bytes.extend((1u64 << 40).to_be_bytes());
        let (_, error) = decode_all(TINY, &bytes, 1);
        assert_eq!(
            error,
            Some(Violation::FrameTooLarge {
                declared: 1 << 40,
                limit: 300
            })
        );
        // A command is bounded the same way.
        let mut bytes = greeting().to_vec();
        bytes.extend([COMMAND | LONG, 0, 0, 0, 0, 0, 0, 1, 0x2d]);
        let (_, error) = decode_all(TINY, &bytes, 64);
        assert!(matches!(error, Some(Violation::FrameTooLarge { .. })));
    }

    #[test]
    fn a_message_over_its_frame_or_byte_limit_is_refused_at_the_next_header() {
        let mut endless = pub_hello();
        let more = [MORE, 1, b'x'];
        for _ in 0..10 {
            endless.extend(more);
        }
        let (frames, error) = decode_all(TINY, &endless, 5);
        assert_eq!(frames.len(), 1, "the READY only");
        assert_eq!(error, Some(Violation::TooManyFrames { limit: 3 }));

        let mut big = pub_hello();
        big.extend(encode_message(&[
            Bytes::from(vec![0; 250]),
            Bytes::from(vec![0; 200]),
        ]));
        let (_, error) = decode_all(TINY, &big, 5);
        assert_eq!(error, Some(Violation::MessageTooLarge { limit: 400 }));
    }

    #[test]
    fn malformed_frames_are_refused() {
        let cases: [(&[u8], Violation); 4] = [
            (&[0x08, 0], Violation::Flags(0x08)),
            (&[COMMAND | MORE, 0], Violation::Flags(0x05)),
            (&[MORE, 1, b'x', COMMAND, 0], Violation::CommandInMessage),
            (&[COMMAND, 2, 1, b'1'], Violation::Malformed("command name")),
        ];
        for (frames, expected) in cases {
            let mut bytes = pub_hello();
            bytes.extend(frames);
            let (_, error) = decode_all(TINY, &bytes, 3);
            assert_eq!(error, Some(expected), "{frames:?}");
        }
    }

    #[test]
    fn the_handshake_wants_a_ready_of_a_legal_peer_type() {
        let frame = |bytes: Vec<u8>| {
            let mut all = greeting().to_vec();
            all.extend(bytes);
            decode_all(Limits::default(), &all, 1000).0.remove(0)
        };
        let ready = frame(ready_of(SocketType::XPub));
        assert!(expect_ready(ready.clone(), SocketType::Sub).is_ok());
        assert_eq!(
            expect_ready(ready, SocketType::Dealer),
            Err(Violation::SocketType {
                ours: SocketType::Dealer,
                peer: "XPUB".into()
            })
        );
        let with_identity = frame(encode_ready(&Ready {
            socket_type: SocketType::Dealer,
            identity: Some(b(b"me")),
        }));
        assert_eq!(
            expect_ready(with_identity, SocketType::Router)
                .unwrap()
                .identity,
            Some(b(b"me"))
        );
        assert_eq!(
            expect_ready(frame(encode_error("no thanks")), SocketType::Sub),
            Err(Violation::PeerError("no thanks".into()))
        );
        assert_eq!(
            expect_ready(frame(encode_message(&[b(b"hi")])), SocketType::Sub),
            Err(Violation::NotReady("a message"))
        );
        // A value size running past the command.
        let mut data = vec![11];
        data.extend(b"Socket-Type\0\0\0\x09PUB");
        let truncated = frame(encode_command("READY", &data));
        assert_eq!(
            expect_ready(truncated, SocketType::Sub),
            Err(Violation::Malformed("READY command"))
        );
    }

    #[test]
    fn the_socket_type_table_is_symmetric() {
        use SocketType::*;
        for a in SocketType::ALL {
            for b in SocketType::ALL {
                assert_eq!(a.accepts(b), b.accepts(a), "{a} {b}");
            }
            assert_eq!(SocketType::from_name(a.as_str().as_bytes()), Some(a));
        }
        assert!(Sub.accepts(Pub) && Sub.accepts(XPub) && !Sub.accepts(Sub));
        assert!(Dealer.accepts(Router) && !Dealer.accepts(Pub));
        assert_eq!(SocketType::from_name(b"xpub"), Some(XPub));
    }

    #[test]
    fn subscriptions_are_one_frame_messages_flagged_by_their_first_octet() {
        assert_eq!(subscribe(b"kv"), b(b"\x01kv"));
        assert_eq!(
            subscription(&[subscribe(b"kv")]),
            Some(Subscription::Subscribe(b(b"kv")))
        );
        assert_eq!(
            subscription(&[b(b"\x00kv")]),
            Some(Subscription::Cancel(b(b"kv")))
        );
        assert_eq!(subscription(&[b(b"\x02kv")]), None);
        assert_eq!(subscription(&[subscribe(b""), Bytes::new()]), None);
        assert_eq!(subscription(&[Bytes::new()]), None);
    }

    #[test]
    fn traffic_skips_unknown_commands_and_ends_on_error() {
        let ping = Frame::Command(Command {
            name: b(b"PING"),
            data: Bytes::new(),
        });
        assert_eq!(traffic(ping), Ok(None));
        let error = Frame::Command(Command {
            name: b(b"ERROR"),
            data: b(b"\x03bye"),
        });
        assert_eq!(traffic(error), Err(Violation::PeerError("bye".into())));
    }
}
