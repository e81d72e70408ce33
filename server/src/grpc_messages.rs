//! Bounds on the request messages of a tonic server, which tonic itself does not set: a
//! message must arrive whole within a deadline, no message may be larger than a limit,
//! and the messages being received on one connection may not together be larger than
//! another. tonic reserves a message's declared length as soon as its 5-byte prefix
//! arrives and then waits for the rest as long as the connection lives, so without
//! these a client holds up to the largest message per call for as long as it likes.
//!
//! [`MessageLimitsLayer`] wraps every request body in a [`Bounded`] body that follows
//! gRPC's framing (each message: a compressed flag, a 4-byte big-endian length, the
//! message) as the bytes pass on to tonic. A body past a bound fails with the
//! [`Status`] the client gets: `RESOURCE_EXHAUSTED` for a size, `DEADLINE_EXCEEDED`
//! for time, and the call ends, freeing what it held.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::http::Request;
use tokio::time::{Instant, Sleep};
use tonic::Status;
use tonic::body::Body;

use crate::grpc::GrpcConnectInfo;

/// Bytes of a gRPC message's prefix: a compressed flag and a 4-byte length.
const PREFIX_BYTES: usize = 5;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageLimits {
    /// Longest a request message may take to arrive whole, counted from when the server
    /// is first ready for it (a streamed call's next message included).
    pub timeout: Duration,
    /// Largest request message.
    pub max_message_bytes: u64,
    /// Largest sum of the declared sizes of the messages being received on one
    /// connection (its calls' messages arrive side by side).
    pub max_connection_bytes: u64,
}

/// What the bounds saw, for metrics.
#[derive(Debug, Default)]
pub struct MessageStats {
    receiving: AtomicU64,
    too_large: AtomicU64,
    connection_full: AtomicU64,
    timed_out: AtomicU64,
}

impl MessageStats {
    /// Declared bytes of the request messages being received, on every connection.
    pub fn receiving_bytes(&self) -> u64 {
        self.receiving.load(Ordering::Relaxed)
    }

    /// Calls failed, by why: a message over the size limit, over its connection's
    /// limit, or not whole in time.
    pub fn refused(&self) -> [(&'static str, u64); 3] {
        let n = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        [
            ("too_large", n(&self.too_large)),
            ("connection_full", n(&self.connection_full)),
            ("timeout", n(&self.timed_out)),
        ]
    }
}

/// A tower layer for `tonic::transport::Server::layer`.
#[derive(Clone, Debug)]
pub struct MessageLimitsLayer {
    limits: Arc<MessageLimits>,
    stats: Arc<MessageStats>,
}

impl MessageLimitsLayer {
    pub fn new(limits: MessageLimits) -> Self {
        Self {
            limits: Arc::new(limits),
            stats: Arc::default(),
        }
    }

    pub fn stats(&self) -> Arc<MessageStats> {
        self.stats.clone()
    }
}

impl<S> tower::Layer<S> for MessageLimitsLayer {
    type Service = MessageLimited<S>;

    fn layer(&self, inner: S) -> MessageLimited<S> {
        MessageLimited {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct MessageLimited<S> {
    inner: S,
    layer: MessageLimitsLayer,
}

impl<S> tower::Service<Request<Body>> for MessageLimited<S>
where
    S: tower::Service<Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> S::Future {
        let connection = GrpcConnectInfo::of(request.extensions()).cloned();
        let layer = self.layer.clone();
        self.inner
            .call(request.map(|body| Body::new(Bounded::new(body, layer, connection))))
    }
}

/// A request body whose messages are held to the limits.
pub struct Bounded {
    body: Body,
    layer: MessageLimitsLayer,
    connection: Option<GrpcConnectInfo>,
    /// The current message's prefix as far as it has arrived.
    prefix: [u8; PREFIX_BYTES],
    prefix_len: usize,
    /// Bytes of the current message's body still to come.
    remaining: u64,
    /// The current message's declared size, counted as being received.
    counted: u64,
    /// When the awaited message must be whole; set when the server first waits for it.
    deadline: Option<Pin<Box<Sleep>>>,
    failed: bool,
}

impl Bounded {
    fn new(body: Body, layer: MessageLimitsLayer, connection: Option<GrpcConnectInfo>) -> Self {
        Self {
            body,
            layer,
            connection,
            prefix: [0; PREFIX_BYTES],
            prefix_len: 0,
            remaining: 0,
            counted: 0,
            deadline: None,
            failed: false,
        }
    }

    /// Follows the framing through `data`; fails a message past a size limit as soon as
    /// its prefix says so. A message completed in `data` restarts the deadline.
    fn scan(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            if self.prefix_len < PREFIX_BYTES {
                let take = (PREFIX_BYTES - self.prefix_len).min(data.len());
                self.prefix[self.prefix_len..self.prefix_len + take].copy_from_slice(&data[..take]);
                self.prefix_len += take;
                data = &data[take..];
                if self.prefix_len == PREFIX_BYTES {
                    let declared = (&self.prefix[1..]).get_u32();
                    self.start(u64::from(declared))?;
                }
            } else {
                let take = self.remaining.min(data.len() as u64);
                self.remaining -= take;
                data = &data[take as usize..];
            }
            if self.prefix_len == PREFIX_BYTES && self.remaining == 0 {
                self.finish();
            }
        }
        Ok(())
    }

    /// A message of `declared` bytes begins.
    fn start(&mut self, declared: u64) -> Result<(), Status> {
        let (limits, stats) = (&self.layer.limits, &self.layer.stats);
        if declared > limits.max_message_bytes {
            stats.too_large.fetch_add(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "a message of {declared} bytes; at most {}",
                limits.max_message_bytes
            )));
        }
        if let Some(connection) = &self.connection
            && !connection.start_receiving(declared, limits.max_connection_bytes)
        {
            stats.connection_full.fetch_add(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "a message of {declared} bytes would pass the {} bytes of messages one \
                 connection may be sending at once",
                limits.max_connection_bytes
            )));
        }
        stats.receiving.fetch_add(declared, Ordering::Relaxed);
        self.counted = declared;
        self.remaining = declared;
        Ok(())
    }

    /// The current message is whole (or abandoned): its bytes are no longer counted.
    fn finish(&mut self) {
        self.uncount();
        self.prefix_len = 0;
        self.deadline = None;
    }

    fn uncount(&mut self) {
        let counted = std::mem::take(&mut self.counted);
        if counted > 0 {
            self.layer
                .stats
                .receiving
                .fetch_sub(counted, Ordering::Relaxed);
            if let Some(connection) = &self.connection {
                connection.done_receiving(counted);
            }
        }
    }

    fn fail(&mut self, status: Status) -> Poll<Option<Result<Frame<bytes::Bytes>, Status>>> {
        tracing::debug!(%status, "cutting a gRPC call short");
        self.failed = true;
        self.uncount();
        Poll::Ready(Some(Err(status)))
    }

    /// Whether the awaited message's time is up; starts its clock on first asking.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let timeout = self.layer.limits.timeout;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + timeout)));
        deadline.as_mut().poll(cx).is_ready()
    }
}

impl HttpBody for Bounded {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, Status>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        let Poll::Ready(frame) = polled else {
            if self.expired(cx) {
                self.layer.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                let timeout = self.layer.limits.timeout;
                return self.fail(Status::deadline_exceeded(format!(
                    "a request message did not arrive whole within {timeout:?}"
                )));
            }
            return Poll::Pending;
        };
        match frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref()
                    && let Err(status) = self.scan(data)
                {
                    return self.fail(status);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                self.uncount();
                Poll::Ready(Some(Err(e)))
            }
            None => {
                self.uncount();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Bounded {
    fn drop(&mut self) {
        self.uncount();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: MessageLimits = MessageLimits {
        timeout: Duration::from_secs(1),
        max_message_bytes: 100,
        max_connection_bytes: 150,
    };

    fn bounded() -> Bounded {
        Bounded::new(Body::empty(), MessageLimitsLayer::new(LIMITS), None)
    }

    fn message(len: u32) -> Vec<u8> {
        let mut out = vec![0];
        out.extend(len.to_be_bytes());
        out.extend(std::iter::repeat_n(7, len as usize));
        out
    }

    #[test]
    fn messages_are_counted_from_their_prefix_until_whole() {
        let mut body = bounded();
        let stats = body.layer.stats();
        let two: Vec<u8> = [message(10), message(0), message(40)].concat();
        // Split anywhere, the framing is followed: the first two messages pass whole,
        // the third is counted until its last byte.
        body.scan(&two[..3]).unwrap();
        assert_eq!(stats.receiving_bytes(), 0, "half a prefix");
        body.scan(&two[3..30]).unwrap();
        assert_eq!(stats.receiving_bytes(), 40);
        body.scan(&two[30..]).unwrap();
        assert_eq!(stats.receiving_bytes(), 0);
        body.scan(&message(60)[..20]).unwrap();
        assert_eq!(stats.receiving_bytes(), 60);
        drop(body);
        assert_eq!(stats.receiving_bytes(), 0, "a dropped call counts nothing");
    }

    #[test]
    fn a_message_over_the_limit_fails_at_its_prefix() {
        let mut body = bounded();
        let refused = body.scan(&message(101)[..PREFIX_BYTES]).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(body.layer.stats().refused()[0], ("too_large", 1));
    }

    async fn next(body: &mut Bounded) -> Option<Result<Frame<bytes::Bytes>, Status>> {
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_must_be_whole_in_time_from_when_it_is_awaited() {
        let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
        let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut bounded = Bounded::new(Body::new(body), MessageLimitsLayer::new(LIMITS), None);
        tx.try_send(Ok(message(10).into())).unwrap();
        assert!(next(&mut bounded).await.unwrap().is_ok());
        // Long after, the next message's bytes trickle in: its clock starts when
        // awaited, and no byte of it restarts the clock.
        tokio::time::advance(Duration::from_secs(5)).await;
        tx.try_send(Ok(message(20)[..15].to_vec().into())).unwrap();
        assert!(next(&mut bounded).await.unwrap().is_ok());
        let awaited = Instant::now();
        let waiting = tokio::time::timeout(Duration::from_millis(600), next(&mut bounded));
        assert!(waiting.await.is_err(), "the rest is awaited");
        tx.try_send(Ok(vec![7].into())).unwrap();
        assert!(next(&mut bounded).await.unwrap().is_ok());
        let failed = next(&mut bounded).await.unwrap().unwrap_err();
        assert_eq!(failed.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(awaited.elapsed(), LIMITS.timeout);
        let stats = bounded.layer.stats();
        assert_eq!(stats.refused()[2], ("timeout", 1));
        assert_eq!(stats.receiving_bytes(), 0);
        assert!(next(&mut bounded).await.is_none(), "the call is over");
    }
}
