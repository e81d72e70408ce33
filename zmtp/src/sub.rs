//! A SUB socket with one publisher (rfc.zeromq.org/spec/29, "The SUB Socket Type").

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::codec::{SocketType, encode_message, subscribe};
use crate::conn::Connection;
use crate::{Endpoint, Error, Options};

/// Waits before connecting again: the first, and the longest after repeated failures
/// ("if a peer reconnects more than once, it should increase the delay between
/// reconnects", spec 23 "Error Handling"). libzmq waits 100 ms.
const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// Subscribes to the publisher at one endpoint. The socket is driven by [`Sub::recv`]:
/// it connects there, and after the publisher goes away or breaks the protocol it
/// connects again, waiting longer after each failure; [`Options::monitor`] sees every
/// connection come and go. It reads only while `recv` runs, so it never holds more than
/// the message in progress; a publisher that is not read from drops for this subscriber,
/// as PUB sockets do. Dropping the `Sub` closes its connection.
pub struct Sub {
    endpoint: Endpoint,
    prefixes: Vec<Bytes>,
    options: Options,
    connection: Option<(Connection, SocketAddr)>,
    /// When the next connection attempt may start, and the wait after a failure.
    next_attempt: Instant,
    delay: Duration,
}

impl Sub {
    /// A subscriber to every prefix in `prefixes` (the empty prefix matches every
    /// message) of the publisher at `endpoint`; it connects on the first [`Sub::recv`].
    pub fn connect(endpoint: Endpoint, prefixes: Vec<Bytes>, options: Options) -> Self {
        Self {
            endpoint,
            prefixes,
            options,
            connection: None,
            next_attempt: Instant::now(),
            delay: RECONNECT_MIN,
        }
    }

    /// The next whole message whose first frame starts with a subscribed prefix,
    /// connecting first as needed. Cancel-safe: a message partly read stays buffered,
    /// and a connection cancelled before it was up is simply made again.
    pub async fn recv(&mut self) -> Vec<Bytes> {
        loop {
            let Some((connection, peer)) = &mut self.connection else {
                self.establish().await;
                continue;
            };
            let peer = *peer;
            let error = match connection.next_message().await {
                // Filtering happens at the publisher; a SUB "MAY" filter again (spec 29).
                Ok(message) if subscribed(&self.prefixes, &message) => return message,
                Ok(_) => continue,
                Err(error) => error,
            };
            self.options.ended(peer, &error);
            self.connection = None;
            // A connection that ended without breaking a rule resets the back-off.
            let healthy = error.violation().is_none();
            self.retry_after(healthy);
        }
    }

    /// Makes one connection attempt, when the back-off allows: connects, greets and
    /// subscribes.
    async fn establish(&mut self) {
        tokio::time::sleep_until(self.next_attempt).await;
        let stream = match TcpStream::connect(self.endpoint.connect_addr()).await {
            Ok(stream) => stream,
            Err(error) => {
                let endpoint = &self.endpoint;
                tracing::debug!(%endpoint, %error, "cannot connect to the ZMTP publisher");
                return self.retry_after(false);
            }
        };
        let peer = match stream.peer_addr() {
            Ok(peer) => peer,
            Err(error) => {
                tracing::debug!(%error, "the ZMTP publisher's connection is already gone");
                return self.retry_after(false);
            }
        };
        match self.open(stream).await {
            Ok(connection) => {
                self.options.connected(peer);
                self.connection = Some((connection, peer));
            }
            Err(error) => {
                self.options.ended(peer, &error);
                self.retry_after(false);
            }
        }
    }

    async fn open(&self, stream: TcpStream) -> Result<Connection, Error> {
        let mut connection = Connection::open(stream, SocketType::Sub, self.options.limits).await?;
        let subscriptions: Vec<u8> = self
            .prefixes
            .iter()
            .flat_map(|prefix| encode_message(&[subscribe(prefix)]))
            .collect();
        connection.send(&subscriptions).await?;
        Ok(connection)
    }

    /// Schedules the next attempt: soon after a healthy connection, else after the
    /// current delay, which doubles.
    fn retry_after(&mut self, healthy: bool) {
        if healthy {
            self.delay = RECONNECT_MIN;
        }
        self.next_attempt = Instant::now() + self.delay;
        if !healthy {
            self.delay = (self.delay * 2).min(RECONNECT_MAX);
        }
    }
}

fn subscribed(prefixes: &[Bytes], message: &[Bytes]) -> bool {
    message
        .first()
        .is_some_and(|topic| prefixes.iter().any(|p| topic.starts_with(p)))
}
