//! The HTTP accept loop: axum's `serve` applies no timeouts and no connection limit, so
//! every HTTP listener of ours goes through this one instead.

use std::future::Future;
use std::io;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::timeout::RequestBodyTimeout;

use crate::Server;
use crate::budget::Slot;
use crate::connection::{Activity, Track, Tracked, Waiting};

/// The shortest period the deadlines are checked at, whatever the timeouts (which may be 0).
const MIN_CHECK_PERIOD: Duration = Duration::from_millis(10);

/// HTTP/2 keepalive pings find peers that vanished without closing the connection.
const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

impl Server {
    /// Serves `app` on `listener` (HTTP/1.1 and cleartext HTTP/2) until `shutdown`
    /// resolves, then stops accepting, lets every connection finish its requests, and
    /// returns once all are closed. Applies the header, idle and body timeouts and draws
    /// each connection from the process's connection budget.
    pub async fn serve_http(
        &self,
        listener: TcpListener,
        app: axum::Router,
        shutdown: impl Future<Output = ()> + Send,
    ) -> io::Result<()> {
        let stop = CancellationToken::new();
        let connections = TaskTracker::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let (tcp, slot) = tokio::select! {
                () = &mut shutdown => break,
                accepted = self.accept(&listener) => accepted,
            };
            connections.spawn(
                self.clone()
                    .serve_connection(tcp, app.clone(), stop.clone(), slot),
            );
        }
        drop(listener);
        stop.cancel();
        connections.close();
        connections.wait().await;
        Ok(())
    }

    async fn serve_connection(
        self,
        tcp: TcpStream,
        app: axum::Router,
        stop: CancellationToken,
        _slot: Slot,
    ) {
        let limits = &self.limits;
        let activity = Activity::new();
        let peer = tcp.peer_addr().ok();
        let io = TokioIo::new(Tracked {
            io: tcp,
            activity: activity.clone(),
        });
        let service = TowerToHyperService::new(Track {
            inner: RequestBodyTimeout::new(app, limits.body_timeout),
            activity: activity.clone(),
            peer,
        });
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // Our own header timer (`connection`) replaces hyper's.
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(HTTP2_KEEPALIVE_INTERVAL)
            .keep_alive_timeout(HTTP2_KEEPALIVE_TIMEOUT);
        let connection = builder.serve_connection_with_upgrades(io, service);
        let mut connection = std::pin::pin!(connection);
        let expired = self.expiry(&activity);
        tokio::select! {
            result = connection.as_mut() => return log_end(result),
            waiting_for = expired => match waiting_for {
                // Nothing to finish: hyper would wait for the rest of the head.
                Waiting::Silent | Waiting::Head => {
                    tracing::debug!(?waiting_for, "dropping a connection without a request");
                    return;
                }
                Waiting::Idle => tracing::debug!("closing an idle connection"),
            },
            () = stop.cancelled() => {}
        }
        connection.as_mut().graceful_shutdown();
        // Requests in flight finish; then hyper closes the connection itself, or it is
        // dropped once a header timeout has passed with none in flight.
        let closing = Instant::now();
        let dropped = async {
            tokio::time::sleep_until(closing + limits.header_timeout).await;
            while activity.in_flight() {
                tokio::time::sleep(limits.header_timeout.max(MIN_CHECK_PERIOD)).await;
            }
        };
        tokio::select! {
            result = connection => log_end(result),
            () = dropped => {}
        }
    }

    /// Resolves, with what the connection waited for, once its deadline passes. It sleeps
    /// until the deadline, or at most the shortest timeout from now since no deadline set
    /// by a later head or request can fall sooner; a rise of pressure wakes it at once.
    /// So a deadline is met to the timer's precision, and a request sets no timer.
    async fn expiry(&self, activity: &Activity) -> Waiting {
        loop {
            let rise = self.budget.pressure_rises();
            let mut rise = std::pin::pin!(rise);
            rise.as_mut().enable();
            let idle_timeout = self.budget.idle_timeout(self.limits.idle_timeout);
            let horizon = idle_timeout
                .min(self.limits.header_timeout)
                .max(MIN_CHECK_PERIOD);
            let now = Instant::now();
            let wake = match activity.deadline(self.limits.header_timeout, idle_timeout) {
                Some(deadline) if deadline.at <= now => return deadline.waiting_for,
                Some(deadline) => deadline.at.min(now + horizon),
                None => now + horizon,
            };
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                () = rise => {}
            }
        }
    }
}

fn log_end(result: Result<(), Box<dyn std::error::Error + Send + Sync>>) {
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}
