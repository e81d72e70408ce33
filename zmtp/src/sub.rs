//! A SUB socket with one publisher (rfc.zeromq.org/spec/29, "The SUB Socket Type").

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
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
///
/// Either side of a ZeroMQ connection may bind: a `Sub` may also listen for its
/// publisher to connect ([`Sub::listen`]), one publisher at a time; the next is taken
/// once the current one is gone.
pub struct Sub {
    dial: Dial,
    prefixes: Vec<Bytes>,
    options: Options,
    connection: Option<(Connection, SocketAddr)>,
    /// When the next connection attempt may start, and the wait after a failure.
    next_attempt: Instant,
    delay: Duration,
}

/// How a [`Sub`] reaches its publisher.
enum Dial {
    Connect(Endpoint),
    Listen(TcpListener),
}

impl Sub {
    /// A subscriber to every prefix in `prefixes` (the empty prefix matches every
    /// message) of the publisher at `endpoint`; it connects on the first [`Sub::recv`].
    pub fn connect(endpoint: Endpoint, prefixes: Vec<Bytes>, options: Options) -> Self {
        Self::new(Dial::Connect(endpoint), prefixes, options)
    }

    /// Like [`Sub::connect`], but bound to `endpoint`, where the publisher connects.
    pub async fn listen(
        endpoint: &Endpoint,
        prefixes: Vec<Bytes>,
        options: Options,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(endpoint.bind_addr()).await?;
        Ok(Self::new(Dial::Listen(listener), prefixes, options))
    }

    /// Where it listens, if it does.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.dial {
            Dial::Listen(listener) => listener.local_addr().ok(),
            Dial::Connect(_) => None,
        }
    }

    fn new(dial: Dial, prefixes: Vec<Bytes>, options: Options) -> Self {
        Self {
            dial,
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

    /// Makes one connection attempt, when the back-off allows: connects (or takes the
    /// next publisher that connected), greets and subscribes.
    async fn establish(&mut self) {
        tokio::time::sleep_until(self.next_attempt).await;
        let (stream, peer) = match &self.dial {
            Dial::Connect(endpoint) => {
                let stream = match TcpStream::connect(endpoint.connect_addr()).await {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::debug!(%endpoint, %error, "cannot connect to the ZMTP publisher");
                        return self.retry_after(false);
                    }
                };
                match stream.peer_addr() {
                    Ok(peer) => (stream, peer),
                    Err(error) => {
                        tracing::debug!(%error, "the ZMTP publisher's connection is already gone");
                        return self.retry_after(false);
                    }
                }
            }
            Dial::Listen(listener) => match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::debug!(%error, "cannot take a ZMTP publisher's connection");
                    return self.retry_after(false);
                }
            },
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
