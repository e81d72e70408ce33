//! A proxy's connections to the server behind it (the sidecar's to its engine, the
//! picker's to each pod): hyper's HTTP/1 client connections, each driven by the request
//! it carries and then by that request's response body, not by a task of its own.
//!
//! A pooled client (reqwest's, hyper-util's) runs every connection in a task that hands
//! the response body over one chunk at a time, each hand-over a wake-up of both tasks:
//! an answer's SSE frames went to the client one write each even when the server had
//! sent them all in one packet. Polled by the body instead, the connection decodes
//! every frame already received, and the body passes them on in one write; what it has
//! goes out as soon as nothing more has arrived, so no token waits for the next.
//!
//! Idle connections wait in a small pool (most recently used first); one the server
//! closed meanwhile is noticed when taken, and a request it could not send is sent on
//! a new connection.

use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::TrySendError;
use hyper::client::conn::http1::{Connection, SendRequest, handshake};
use hyper::{Request, Response, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// How long connecting may take, and how long an idle connection is kept: shorter than
/// the server keeps it, since a request sent on a connection the server is closing
/// fails.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect: Duration,
    pub idle: Duration,
}

/// Most bytes of a response passed on in one piece.
const MAX_BATCH: usize = 64 << 10;

/// Why no answer came.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("connecting to {0} timed out")]
    ConnectTimeout(String),
    #[error("connecting to {authority}")]
    Connect {
        authority: String,
        source: std::io::Error,
    },
    /// The HTTP exchange failed (the server closed, reset or answered garbage).
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// The server at one base URL and the connections to it.
pub struct Upstream {
    /// `host:port`, to connect to and as the `Host` header.
    authority: String,
    /// The base URL's path without its trailing `/`, which every request path follows.
    base_path: String,
    timeouts: Timeouts,
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

struct Conn {
    sender: SendRequest<Body>,
    /// Reads and writes the connection when polled; `None` once it has ended.
    driver: Option<Connection<TokioIo<TcpStream>, Body>>,
}

impl Conn {
    /// Lets the connection read and write what it can now.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(driver) = &mut self.driver {
            // Its end, failed or not, reaches the request or the body waiting on it.
            if Pin::new(driver).poll(cx).is_ready() {
                self.driver = None;
            }
        }
    }

    /// Can take a request now (as far as a look without waiting tells).
    fn ready(&mut self) -> bool {
        self.drive(&mut Context::from_waker(Waker::noop()));
        self.driver.is_some() && self.sender.is_ready()
    }

    async fn exchange(
        &mut self,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, TrySendError<Request<Body>>> {
        let mut response = std::pin::pin!(self.sender.try_send_request(request));
        poll_fn(|cx| {
            self.drive(cx);
            response.as_mut().poll(cx)
        })
        .await
    }
}

impl Upstream {
    /// The server at `base`, an `http://` URL: `Err` says why it is not one.
    pub fn new(base: &str, timeouts: Timeouts) -> Result<Self, String> {
        let uri: Uri = base.parse().map_err(|e| format!("{base}: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("{base} is not an http:// URL"));
        }
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("{base} names no host"))?;
        // An IPv6 host comes in brackets, as an authority has it.
        let port = uri.port_u16().unwrap_or(80);
        Ok(Self::at(format!("{host}:{port}"), uri.path(), timeouts))
    }

    /// The server at `address`, its paths as they are.
    pub fn at_address(address: SocketAddr, timeouts: Timeouts) -> Self {
        Self::at(address.to_string(), "", timeouts)
    }

    fn at(authority: String, base_path: &str, timeouts: Timeouts) -> Self {
        Self {
            authority,
            base_path: base_path.trim_end_matches('/').to_owned(),
            timeouts,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The request line's target for `path_and_query` (from its leading `/`).
    pub fn target(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.base_path)
    }

    /// `Host` of the requests.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Sends `request` (origin-form target, `Host` set) and gives the response head
    /// with a body that drives its connection.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<Body>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        loop {
            let (mut conn, reused) = match self.checkout() {
                Some(conn) => (conn, true),
                None => (self.connect().await?, false),
            };
            match conn.exchange(request).await {
                Ok(response) => {
                    let upstream = self.clone();
                    return Ok(response.map(|incoming| UpstreamBody::new(incoming, conn, upstream)));
                }
                Err(mut failed) => match failed.take_message() {
                    // An idle connection the server had closed: the request never went
                    // out, so it goes on a new one.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(failed.into_error().into()),
                },
            }
        }
    }

    /// The most recently used idle connection still open.
    fn checkout(&self) -> Option<Conn> {
        loop {
            let Idle { mut conn, since } = self.idle.lock().expect("not poisoned").pop()?;
            if since.elapsed() < self.timeouts.idle && conn.ready() {
                return Some(conn);
            }
        }
    }

    /// Holds a connection not yet expired (those that have are closed).
    pub fn has_idle(&self) -> bool {
        let mut idle = self.idle.lock().expect("not poisoned");
        idle.retain(|i| i.since.elapsed() < self.timeouts.idle);
        !idle.is_empty()
    }

    fn checkin(&self, conn: Conn) {
        let mut idle = self.idle.lock().expect("not poisoned");
        // The oldest are at the bottom and may never be taken again: closed here.
        idle.retain(|i| i.since.elapsed() < self.timeouts.idle);
        idle.push(Idle {
            conn,
            since: Instant::now(),
        });
    }

    async fn connect(&self) -> Result<Conn, UpstreamError> {
        let authority = &self.authority;
        let tcp = tokio::time::timeout(self.timeouts.connect, TcpStream::connect(authority))
            .await
            .map_err(|_| UpstreamError::ConnectTimeout(authority.clone()))?
            .map_err(|source| UpstreamError::Connect {
                authority: authority.clone(),
                source,
            })?;
        // Frames are small and must not wait for more.
        let _ = tcp.set_nodelay(true);
        let (sender, driver) = handshake(TokioIo::new(tcp)).await?;
        Ok(Conn {
            sender,
            driver: Some(driver),
        })
    }
}

/// A response body from the server. Polling it drives its connection; each poll gives
/// everything received by then (up to [`MAX_BATCH`]) as one frame. At its end the
/// connection goes back to the pool; dropped before, it is closed, which cancels the
/// request in an engine.
pub struct UpstreamBody {
    incoming: Incoming,
    conn: Option<Conn>,
    upstream: Arc<Upstream>,
    /// What came after the last batch (an error, trailers), for the next poll.
    held: Option<Result<Frame<Bytes>, hyper::Error>>,
}

impl UpstreamBody {
    fn new(incoming: Incoming, conn: Conn, upstream: Arc<Upstream>) -> Self {
        Self {
            incoming,
            conn: Some(conn),
            upstream,
            held: None,
        }
    }

    /// The body ended: its connection is reused if it can take another request.
    fn release(&mut self, cx: &mut Context<'_>) {
        if let Some(mut conn) = self.conn.take() {
            // Having seen the end of this exchange, it becomes ready for the next.
            conn.drive(cx);
            if conn.driver.is_some() && conn.sender.is_ready() {
                self.upstream.checkin(conn);
            }
        }
    }
}

/// Data frames joined as they come: the first as it is, copies only past it.
#[derive(Default)]
struct Batch {
    first: Option<Bytes>,
    more: Option<BytesMut>,
}

impl Batch {
    fn push(&mut self, data: Bytes) {
        match (&self.first, &mut self.more) {
            (None, _) => self.first = Some(data),
            (Some(first), None) => {
                let mut more = BytesMut::with_capacity(first.len() + data.len());
                more.extend_from_slice(first);
                more.extend_from_slice(&data);
                self.more = Some(more);
            }
            (Some(_), Some(more)) => more.extend_from_slice(&data),
        }
    }

    fn len(&self) -> usize {
        match (&self.first, &self.more) {
            (_, Some(more)) => more.len(),
            (Some(first), None) => first.len(),
            (None, None) => 0,
        }
    }

    fn take(&mut self) -> Option<Bytes> {
        let first = self.first.take();
        self.more.take().map(BytesMut::freeze).or(first)
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(held) = this.held.take() {
            return Poll::Ready(Some(held));
        }
        let mut batch = Batch::default();
        let ready = |batch: &mut Batch| batch.take().map(|data| Ok(Frame::data(data)));
        while batch.len() < MAX_BATCH {
            if let Some(conn) = &mut this.conn {
                conn.drive(cx);
            }
            match Pin::new(&mut this.incoming).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => batch.push(data),
                    Err(trailers) => {
                        this.held = Some(Ok(trailers));
                        break;
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    this.held = Some(Err(e));
                    break;
                }
                Poll::Ready(None) => {
                    this.release(cx);
                    return Poll::Ready(ready(&mut batch));
                }
                // Nothing more has arrived: what came goes now.
                Poll::Pending if batch.len() == 0 => return Poll::Pending,
                Poll::Pending => break,
            }
        }
        match ready(&mut batch) {
            Some(data) => Poll::Ready(Some(data)),
            None => Poll::Ready(this.held.take()),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        connect: Duration::from_secs(1),
        idle: Duration::from_secs(1),
    };

    #[test]
    fn a_base_url_gives_the_authority_and_the_path_requests_follow() {
        let u = Upstream::new("http://127.0.0.1:8000", T).unwrap();
        assert_eq!(
            (u.authority(), u.target("/v1/models")),
            ("127.0.0.1:8000", "/v1/models".into())
        );
        let u = Upstream::new("http://engine/base/", T).unwrap();
        assert_eq!(
            (u.authority(), u.target("/health")),
            ("engine:80", "/base/health".into())
        );
        let u = Upstream::new("http://[::1]:9000", T).unwrap();
        assert_eq!(u.authority(), "[::1]:9000");
        let u = Upstream::at_address("[::1]:7000".parse().unwrap(), T);
        assert_eq!((u.authority(), u.target("/x")), ("[::1]:7000", "/x".into()));
        for bad in ["https://engine:8000", "engine:8000", "http://", "not a url"] {
            assert!(Upstream::new(bad, T).is_err(), "{bad}");
        }
    }
}
