//! The HTTP accept loop: axum's `serve` applies no timeouts and no connection limit, so
//! every HTTP listener of ours goes through this one instead.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::timeout::RequestBodyTimeout;

use crate::connection::{Activity, Track, Tracked};
use crate::{Server, ServerLimits};

/// The shortest period the deadlines are checked at, whatever the timeouts.
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
            let (tcp, permit) = tokio::select! {
                () = &mut shutdown => break,
                accepted = self.accept(&listener) => accepted,
            };
            connections.spawn(serve_connection(
                tcp,
                app.clone(),
                self.limits.clone(),
                stop.clone(),
                permit,
            ));
        }
        drop(listener);
        stop.cancel();
        connections.close();
        connections.wait().await;
        Ok(())
    }
}

async fn serve_connection(
    tcp: TcpStream,
    app: axum::Router,
    limits: Arc<ServerLimits>,
    stop: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let activity = Activity::new();
    let io = TokioIo::new(Tracked {
        io: tcp,
        activity: activity.clone(),
    });
    let service = TowerToHyperService::new(Track {
        inner: RequestBodyTimeout::new(app, limits.body_timeout),
        activity: activity.clone(),
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
    // The deadlines are checked on a tick rather than re-armed on every request, which
    // would wake this task twice per request: a deadline is kept within half a timeout.
    let period = (limits.header_timeout.min(limits.idle_timeout) / 2).max(MIN_CHECK_PERIOD);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Once closing, a connection without requests in flight gets one more header timeout
    // to finish, then is dropped.
    let mut closing: Option<Instant> = None;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            now = ticks.tick() => {
                let expired = activity.deadline(&limits).is_some_and(|d| d <= now);
                match closing {
                    Some(since) if expired && now >= since + limits.header_timeout => return,
                    Some(_) => {}
                    None if expired => {
                        tracing::debug!("closing an idle or slow connection");
                        connection.as_mut().graceful_shutdown();
                        closing = Some(now);
                    }
                    None => {}
                }
            }
            () = stop.cancelled(), if closing.is_none() => {
                connection.as_mut().graceful_shutdown();
                closing = Some(Instant::now());
            }
        }
    }
}
