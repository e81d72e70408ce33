//! A DEALER socket with one connection (rfc.zeromq.org/spec/28), for request-reply
//! exchanges with a ROUTER such as vLLM's KV event replay socket.

use bytes::Bytes;
use tokio::net::TcpStream;

use crate::codec::{Limits, SocketType, encode_message};
use crate::conn::Connection;
use crate::{Endpoint, Error};

/// One connection to a ROUTER, DEALER or REP peer, without reconnection: after an error,
/// drop it and connect again. Messages go out as given; a ROUTER peer prepends the
/// sender's routing id on its side, so a REQ-style request starts with an empty frame.
pub struct Dealer {
    conn: Connection,
}

impl Dealer {
    /// Connects and completes the handshake, within a bounded time.
    pub async fn connect(endpoint: &Endpoint, limits: Limits) -> Result<Self, Error> {
        let stream = TcpStream::connect(endpoint.connect_addr()).await?;
        let conn = Connection::open(stream, SocketType::Dealer, limits).await?;
        Ok(Self { conn })
    }

    pub async fn send(&mut self, frames: &[Bytes]) -> Result<(), Error> {
        self.conn.send(&encode_message(frames)).await
    }

    /// The next whole message. Cancel-safe.
    pub async fn recv(&mut self) -> Result<Vec<Bytes>, Error> {
        self.conn.next_message().await
    }
}
