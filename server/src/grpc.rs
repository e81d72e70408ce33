//! Connections for tonic servers: tonic serves HTTP/2 on whatever stream of connections
//! it is given, so this is where the connection budget and the first-bytes deadline
//! apply. HTTP/2 keepalive (set on each tonic server) finds peers that vanish later.
//! Each call sees its connection as a [`GrpcConnectInfo`], which the bounds on request
//! messages (`grpc_messages`) keep their per-connection account in, and through which a
//! call can cut its connection (a client that stopped reading its answer: HTTP/2 flow
//! control stalls the answer where no handler can reach it, so only closing the
//! connection frees what waits there).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use futures::task::AtomicWaker;
use hyper::http::Extensions;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::Server;
use crate::budget::Slot;

/// An accepted connection holding its share of the connection budget.
pub struct GrpcConnection {
    tcp: TcpStream,
    shared: Arc<Shared>,
    _slot: Slot,
}

/// A gRPC connection as its calls see it: tonic's `ConnectInfo`, in every request's
/// extensions.
#[derive(Clone, Debug)]
pub struct GrpcConnectInfo {
    tcp: TcpConnectInfo,
    shared: Arc<Shared>,
}

/// What the calls of one connection share.
#[derive(Debug, Default)]
struct Shared {
    /// Declared bytes of the request messages being received.
    receiving: AtomicU64,
    cut: AtomicBool,
    /// The connection's reader, woken to see the cut.
    reader: AtomicWaker,
}

impl GrpcConnectInfo {
    /// The connection a request came on, if it came through [`Server::grpc_incoming`].
    pub fn of(extensions: &Extensions) -> Option<&Self> {
        extensions.get()
    }

    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.tcp.remote_addr()
    }

    /// Adds `bytes` to the bytes of messages being received on the connection, unless
    /// that would pass `limit`; returns whether it did.
    pub(crate) fn start_receiving(&self, bytes: u64, limit: u64) -> bool {
        self.shared
            .receiving
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(now + bytes).filter(|&total| total <= limit)
            })
            .is_ok()
    }

    /// Takes `bytes` back from the bytes being received.
    pub(crate) fn done_receiving(&self, bytes: u64) {
        self.shared.receiving.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Closes the connection, ending every call on it.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::Release);
        self.shared.reader.wake();
    }
}

impl GrpcConnection {
    fn check_cut(&self) -> io::Result<()> {
        match self.shared.cut.load(Ordering::Acquire) {
            true => Err(io::ErrorKind::ConnectionAborted.into()),
            false => Ok(()),
        }
    }
}

impl Server {
    /// The connections of `listener` for `Server::serve_with_incoming*`: each holds one
    /// unit of the process's connection budget while open, and one whose client sends
    /// nothing within the header timeout (1 s while the budget is nearly used) is dropped
    /// before tonic sees it. Accepting stops when tonic drops the stream.
    pub fn grpc_incoming(
        &self,
        listener: TcpListener,
    ) -> impl Stream<Item = io::Result<GrpcConnection>> + Send + 'static {
        let (ready, incoming) = mpsc::channel(16);
        let server = self.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, slot) = tokio::select! {
                    () = ready.closed() => return,
                    accepted = server.accept(&listener) => accepted,
                };
                let (ready, server) = (ready.clone(), server.clone());
                tokio::spawn(async move {
                    if server.first_bytes(&tcp).await {
                        let connection = GrpcConnection {
                            tcp,
                            shared: Arc::default(),
                            _slot: slot,
                        };
                        let _ = ready.send(Ok(connection)).await;
                    } else {
                        tracing::debug!("dropping a gRPC connection that sent nothing");
                    }
                });
            }
        });
        ReceiverStream::new(incoming)
    }

    /// Whether `tcp` sends its first bytes within the header timeout (the idle timeout
    /// under pressure, if shorter: `Budget::idle_timeout`).
    async fn first_bytes(&self, tcp: &TcpStream) -> bool {
        let opened = Instant::now();
        let mut first = [0u8; 1];
        loop {
            let rise = self.budget.pressure_rises();
            let mut rise = std::pin::pin!(rise);
            rise.as_mut().enable();
            let wait = self.budget.idle_timeout(self.limits.header_timeout);
            tokio::select! {
                peeked = tcp.peek(&mut first) => return matches!(peeked, Ok(n) if n > 0),
                () = tokio::time::sleep_until(opened + wait) => return false,
                () = rise => {}
            }
        }
    }
}

impl Connected for GrpcConnection {
    type ConnectInfo = GrpcConnectInfo;

    fn connect_info(&self) -> GrpcConnectInfo {
        GrpcConnectInfo {
            tcp: self.tcp.connect_info(),
            shared: self.shared.clone(),
        }
    }
}

impl AsyncRead for GrpcConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.shared.reader.register(cx.waker());
        self.check_cut()?;
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check_cut()?;
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check_cut()?;
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}
