//! ZMTP 3.0, ZeroMQ's wire protocol (rfc.zeromq.org/spec/23, "ZMTP 3.0"), over tokio
//! TCP with the NULL security mechanism, and with hard bounds on what a peer can make
//! this side hold. It speaks to libzmq (which vLLM's KV event publisher uses) as a
//! 3.0 peer: libzmq 4.x talks 3.0 to it, subscriptions included.
//!
//! - [`Sub`] connects (or listens for its publisher), reconnects with back-off,
//!   subscribes to topic prefixes and hands out whole messages, reading only while
//!   asked for one; [`Event`]s tell when it is connected.
//! - [`Dealer`] holds one connection for request-reply exchanges (vLLM's replay ROUTER).
//! - [`Pub`] binds, serves many subscribers by their subscriptions, and drops messages
//!   for a subscriber whose queue is full rather than wait or grow.
//! - [`codec`] is the wire format without I/O.
//!
//! # Why not the `zeromq` crate, or libzmq
//!
//! The `zeromq` 0.7 crate allocates what a frame header declares: one header announcing
//! 2^40 bytes aborts the process ("memory allocation of 1099511693321 bytes failed"),
//! and it has no other size limit. libzmq is not a fix either: a libzmq 4.3.5 SUB
//! (through pyzmq) with `ZMQ_MAXMSGSIZE` set to 1 MiB, facing a raw TCP peer that
//! completes a NULL handshake as PUB and then sends one endless message of 100-byte
//! frames (each with MORE), grew from 411 MiB to 5.2 GiB of RSS in 20 s: `MAXMSGSIZE` is
//! checked per frame, and the pipe high-water marks count whole messages only, so the
//! frames of an unfinished message queue without bound.
//!
//! # Bounds
//!
//! Every connection reads through a fixed 64 KiB buffer into a [`codec::Decoder`],
//! which checks each frame header against the [`Limits`] (frame size, frames per
//! message, bytes per message) before it stores any of the body, and grows a body only
//! as its bytes arrive. A peer that breaks a limit or the protocol is disconnected,
//! logged, and reported as [`Event::Disconnected`] with an [`Error::violation`] reason.
//! So a connection holds at most one message in progress; a [`Sub`] holds nothing
//! else (between its caller's reads TCP pushes back to the publisher, whose own queue
//! drops); a [`Pub`] queues at most 1000 messages per subscriber (libzmq's default
//! high-water mark).

pub mod codec;
mod conn;
mod dealer;
mod endpoint;
mod publish;
mod sub;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use codec::{Limits, SocketType, Violation};
pub use dealer::Dealer;
pub use endpoint::{Endpoint, EndpointError};
pub use publish::Pub;
pub use sub::Sub;

/// Why a connection ended or could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("protocol violation: {0}")]
    Violation(#[from] Violation),
    #[error("no ZMTP handshake within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("the peer closed the connection")]
    Closed,
}

impl Error {
    /// The reason (a short stable name) when the peer was cut off for what it sent or
    /// failed to send; `None` when the connection simply ended.
    pub fn violation(&self) -> Option<&'static str> {
        match self {
            Self::Violation(v) => Some(v.reason()),
            Self::HandshakeTimeout(_) => Some("handshake_timeout"),
            Self::Io(_) | Self::Closed => None,
        }
    }
}

/// What happened to one connection of a [`Sub`] or [`Pub`].
#[derive(Debug)]
pub enum Event<'a> {
    /// The handshake with this peer succeeded.
    Connected(SocketAddr),
    /// The connection to this peer ended, or its handshake failed, because of this.
    Disconnected(SocketAddr, &'a Error),
}

/// Called on every [`Event`], on the connection's task: it must not block.
pub type Monitor = Arc<dyn Fn(&Event<'_>) + Send + Sync>;

/// Settings of a [`Sub`] or [`Pub`].
#[derive(Clone, Default)]
pub struct Options {
    /// Bounds on what a peer may send.
    pub limits: Limits,
    pub monitor: Option<Monitor>,
}

impl Options {
    fn connected(&self, peer: SocketAddr) {
        tracing::debug!(%peer, "ZMTP peer connected");
        self.notify(&Event::Connected(peer));
    }

    fn ended(&self, peer: SocketAddr, error: &Error) {
        match error.violation() {
            Some(reason) => tracing::warn!(
                %peer, reason, %error, "disconnected a ZMTP peer that broke the protocol"
            ),
            None => tracing::debug!(%peer, %error, "ZMTP connection ended"),
        }
        self.notify(&Event::Disconnected(peer, error));
    }

    fn notify(&self, event: &Event<'_>) {
        if let Some(monitor) = &self.monitor {
            monitor(event);
        }
    }
}
