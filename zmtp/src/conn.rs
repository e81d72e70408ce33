//! One ZMTP connection over TCP: the NULL handshake, then frames read through a fixed
//! read buffer into the [`Decoder`].

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::Error;
use crate::codec::{
    Decoder, Frame, Limits, Ready, SocketType, Violation, encode_error, encode_ready, expect_ready,
    greeting, traffic,
};

/// Bytes asked of the socket per read; the read buffer never grows past it.
const READ_CHUNK: usize = 64 << 10;

/// A peer gets this long to greet and send READY (libzmq allows 30 s).
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct Connection {
    stream: TcpStream,
    decoder: Decoder,
    buf: Box<[u8]>,
    /// `buf[start..end]` is read but not yet decoded.
    start: usize,
    end: usize,
}

impl Connection {
    /// Greets `stream` as a socket of type `ours` and checks the peer's greeting and
    /// READY. Both sides send their greeting and READY without waiting for the other's
    /// ("each peer MUST send its READY command before attempting to receive a READY from
    /// the other peer").
    pub(crate) async fn open(
        stream: TcpStream,
        ours: SocketType,
        limits: Limits,
    ) -> Result<Self, Error> {
        stream.set_nodelay(true)?;
        let mut conn = Self {
            stream,
            decoder: Decoder::new(limits),
            buf: vec![0; READ_CHUNK].into_boxed_slice(),
            start: 0,
            end: 0,
        };
        let handshake = async {
            let mut hello = greeting().to_vec();
            hello.extend(encode_ready(&Ready {
                socket_type: ours,
                identity: None,
            }));
            conn.stream.write_all(&hello).await?;
            let frame = conn.next_frame().await?;
            match expect_ready(frame, ours) {
                Ok(_) => Ok(()),
                // "it SHOULD handle errors by returning an ERROR command, and then
                // disconnecting the peer" ("The Socket-Type Property"); best effort.
                Err(v @ Violation::SocketType { .. }) => {
                    let _ = conn.stream.write_all(&encode_error(&v.to_string())).await;
                    Err(v.into())
                }
                Err(v) => Err(v.into()),
            }
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(())) => Ok(conn),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::HandshakeTimeout(HANDSHAKE_TIMEOUT)),
        }
    }

    /// The next command or whole message. Cancel-safe: what was read stays buffered.
    async fn next_frame(&mut self) -> Result<Frame, Error> {
        loop {
            let mut input = &self.buf[self.start..self.end];
            let frame = self.decoder.decode(&mut input)?;
            self.start = self.end - input.len();
            if let Some(frame) = frame {
                return Ok(frame);
            }
            let n = self.stream.read(&mut self.buf).await?;
            if n == 0 {
                return Err(Error::Closed);
            }
            (self.start, self.end) = (0, n);
        }
    }

    /// The next message; commands after the handshake are skipped, ERROR ends it.
    /// Cancel-safe.
    pub(crate) async fn next_message(&mut self) -> Result<Vec<Bytes>, Error> {
        loop {
            if let Some(message) = traffic(self.next_frame().await?)? {
                return Ok(message);
            }
        }
    }

    /// Writes bytes already encoded (a message, or several).
    pub(crate) async fn send(&mut self, wire: &[u8]) -> Result<(), Error> {
        self.stream.write_all(wire).await?;
        Ok(())
    }
}
