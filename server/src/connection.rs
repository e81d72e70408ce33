//! What one HTTP connection is doing, for its header and idle deadlines.
//!
//! hyper's own HTTP/1 header timer starts as soon as a connection waits for a request
//! head, so it cannot tell a slow head from an idle keep-alive connection, and HTTP/2
//! has no such timer at all. So the connection's bytes ([`Tracked`]) and requests
//! ([`Track`]) are watched here, and the connection's task asks [`Activity::deadline`]
//! when to close it:
//! - requests in flight: no deadline (the body timeout and the handlers take over);
//! - none, and an HTTP/1 head has begun to arrive: `header_timeout` after its first byte;
//! - none otherwise: `idle_timeout` after the last request ended (or the connection
//!   opened), shorter while the connection budget is nearly used (`Budget::idle_timeout`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::Guarded;

/// The client preface every HTTP/2 connection opens with (RFC 9113 section 3.4).
const HTTP2_PREFACE_START: &[u8] = b"PRI * HTTP/2.0";

/// When a connection without requests in flight is closed, and what it waits for.
#[derive(Debug, PartialEq)]
pub struct Deadline {
    pub at: Instant,
    pub waiting_for: Waiting,
}

#[derive(Debug, PartialEq)]
pub enum Waiting {
    /// Its first bytes: nothing was ever read.
    Silent,
    /// The rest of a request head.
    Head,
    /// The next request, after one or more were served.
    Idle,
}

#[derive(Debug)]
pub struct Activity {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    in_flight: usize,
    idle_since: Instant,
    head_started: Option<Instant>,
    protocol: Protocol,
}

/// Told apart by the first bytes of the connection.
#[derive(Debug, PartialEq)]
enum Protocol {
    /// The bytes so far, all a prefix of the HTTP/2 preface.
    Unknown(Vec<u8>),
    Http1,
    Http2,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                in_flight: 0,
                idle_since: Instant::now(),
                head_started: None,
                protocol: Protocol::Unknown(Vec::new()),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the connection should be closed, if nothing changes before then; `idle_timeout`:
    /// the one that applies now.
    pub fn deadline(&self, header_timeout: Duration, idle_timeout: Duration) -> Option<Deadline> {
        let state = self.state();
        if state.in_flight > 0 {
            return None;
        }
        if let Some(start) = state.head_started {
            return Some(Deadline {
                at: start + header_timeout,
                waiting_for: Waiting::Head,
            });
        }
        let silent = state.protocol == Protocol::Unknown(Vec::new());
        Some(Deadline {
            at: state.idle_since + idle_timeout,
            waiting_for: if silent {
                Waiting::Silent
            } else {
                Waiting::Idle
            },
        })
    }

    pub fn in_flight(&self) -> bool {
        self.state().in_flight > 0
    }

    fn on_read(&self, bytes: &[u8]) {
        let mut state = self.state();
        if let Protocol::Unknown(seen) = &mut state.protocol {
            let wanted = HTTP2_PREFACE_START.len() - seen.len();
            seen.extend_from_slice(&bytes[..bytes.len().min(wanted)]);
            if !HTTP2_PREFACE_START.starts_with(seen) {
                state.protocol = Protocol::Http1;
            } else if seen.len() == HTTP2_PREFACE_START.len() {
                state.protocol = Protocol::Http2;
            }
        }
        // HTTP/2 sends frames (pings, window updates) between requests: only HTTP/1
        // bytes outside a request are the start of a head.
        let head_starts = state.in_flight == 0 && state.protocol != Protocol::Http2;
        state.head_started = match state.head_started {
            _ if !head_starts => None,
            Some(start) => Some(start),
            None => Some(Instant::now()),
        };
    }

    fn request_started(self: &Arc<Self>) -> RequestGuard {
        let mut state = self.state();
        state.in_flight += 1;
        state.head_started = None;
        RequestGuard(self.clone())
    }
}

/// A request in flight, until its response body is sent or dropped.
struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.in_flight -= 1;
        if state.in_flight == 0 {
            state.idle_since = Instant::now();
        }
    }
}

/// The connection's IO, reporting what it reads to its [`Activity`].
pub struct Tracked<T> {
    pub io: T,
    pub activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.on_read(&buf.filled()[before..]);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The app, counting each request in flight until its response body is done. Each
/// request carries the client's address (axum's `ConnectInfo<SocketAddr>`).
#[derive(Clone)]
pub struct Track<S> {
    pub inner: S,
    pub activity: Arc<Activity>,
    pub peer: Option<SocketAddr>,
}

impl<S, B> tower::Service<Request<B>> for Track<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if let Some(peer) = self.peer {
            request.extensions_mut().insert(ConnectInfo(peer));
        }
        let guard = self.activity.request_started();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Body::new(Guarded::new(body, guard))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: Duration = Duration::from_secs(1);
    const IDLE: Duration = Duration::from_secs(10);
    /// An idle timeout shortened for room.
    const SHORT: Duration = Duration::from_millis(500);

    fn deadline(at: Instant, waiting_for: Waiting) -> Option<Deadline> {
        Some(Deadline { at, waiting_for })
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_follow_requests_and_heads() {
        let activity = Activity::new();
        let opened = Instant::now();
        assert_eq!(
            activity.deadline(HEADER, IDLE),
            deadline(opened + IDLE, Waiting::Silent)
        );

        tokio::time::advance(Duration::from_secs(3)).await;
        activity.on_read(b"GET / HT");
        let head = Instant::now();
        assert_eq!(
            activity.deadline(HEADER, IDLE),
            deadline(head + HEADER, Waiting::Head)
        );
        activity.on_read(b"TP/1.1\r\n");
        // A shorter idle timeout does not shorten a head's time.
        assert_eq!(
            activity.deadline(HEADER, SHORT),
            deadline(head + HEADER, Waiting::Head)
        );

        let guard = activity.request_started();
        assert_eq!(activity.deadline(HEADER, IDLE), None);
        assert_eq!(activity.deadline(HEADER, SHORT), None);
        tokio::time::advance(Duration::from_secs(60)).await;
        // Bytes read during a request (its body) start no head.
        activity.on_read(b"body");
        drop(guard);
        let ended = Instant::now();
        assert_eq!(
            activity.deadline(HEADER, IDLE),
            deadline(ended + IDLE, Waiting::Idle)
        );
        assert_eq!(
            activity.deadline(HEADER, SHORT),
            deadline(ended + SHORT, Waiting::Idle)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn http2_frames_between_requests_are_not_a_head() {
        let activity = Activity::new();
        let opened = Instant::now();
        activity.on_read(b"PRI * HTTP/");
        activity.on_read(b"2.0\r\n\r\nSM\r\n\r\n");
        tokio::time::advance(Duration::from_secs(1)).await;
        activity.on_read(b"\x00\x00\x08\x06\x00ping");
        assert_eq!(
            activity.deadline(HEADER, IDLE),
            deadline(opened + IDLE, Waiting::Idle)
        );
    }
}
