//! What every server process of ours (picker, sidecar, mock engine, local runner, operator)
//! shares, so each one is hardened the same way:
//!
//! - [`ServerLimits`]: the flags (header, idle and body timeouts, concurrent connections);
//! - [`Server`]: the accept loops that apply them, for axum apps ([`Server::serve_http`])
//!   and, with the `grpc` feature, tonic servers ([`Server::grpc_incoming`]), whose
//!   request messages [`MessageLimitsLayer`] bounds;
//! - [`shutdown_signal`], [`init_logging`] with its [`LogArgs`], and [`parse_args`]
//!   (Dynamo's variable names beside ours): what every binary's `main` does;
//! - [`on_every_worker`]: per-thread set-up done before serving;
//! - [`metrics_endpoint`]: `/metrics` and `/healthz` on one port;
//! - [`Throttled`]: a warning that may repeat at a high rate, logged once per interval;
//! - [`free_port`]: a loopback port for a process that must be told it before it starts;
//! - [`upstream`]: a proxy's HTTP/1 connections to the server behind it.

mod budget;
mod connection;
pub mod endpoints_file;
#[cfg(feature = "grpc")]
mod grpc;
#[cfg(feature = "grpc")]
mod grpc_messages;
mod guarded;
mod http;
mod limits;
pub mod metrics_endpoint;
mod ports;
mod process;
mod throttled;
pub mod upstream;
mod workers;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use budget::{Budget, Slot};

pub use budget::PRESSURE_IDLE_TIMEOUT;
#[cfg(feature = "grpc")]
pub use grpc::{GrpcConnectInfo, GrpcConnection};
#[cfg(feature = "grpc")]
pub use grpc_messages::{MessageLimits, MessageLimitsLayer, MessageStats};
pub use guarded::Guarded;
pub use limits::{ServerLimits, parse_duration};
pub use ports::free_port;
pub use process::{
    DYNAMO_JSONL_ENV, LOG_FORMAT_ENV, LOG_FORMAT_ENVS, LogArgs, LogFormat, exit_code, init_logging,
    logged_shutdown_signal, parse_args, shutdown_signal, with_env_aliases,
};
pub use throttled::Throttled;
pub use workers::on_every_worker;

/// One process's serving policy: its [`ServerLimits`] and the connection budget every
/// listener of the process draws from. Clones share the budget.
#[derive(Clone, Debug)]
pub struct Server {
    limits: Arc<ServerLimits>,
    budget: Arc<Budget>,
}

impl Server {
    pub fn new(limits: &ServerLimits) -> Self {
        Self {
            limits: Arc::new(limits.clone()),
            budget: Budget::new(limits.max_connections),
        }
    }

    pub fn limits(&self) -> &ServerLimits {
        &self.limits
    }

    /// The next connection of `listener` with its share of the connection budget. It
    /// accepts first and then waits for budget, so a listener holds at most one
    /// connection beyond the budget and an idle listener none of it. A failed accept (out
    /// of file descriptors, a connection reset before it was accepted) is logged and
    /// tried again a moment later rather than in a spin.
    async fn accept(&self, listener: &TcpListener) -> (TcpStream, Slot) {
        let tcp = loop {
            match listener.accept().await {
                Ok((tcp, _)) => break tcp,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let slot = self.budget.take().await;
        // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm holds
        // them back waiting for ACKs.
        let _ = tcp.set_nodelay(true);
        (tcp, slot)
    }
}
