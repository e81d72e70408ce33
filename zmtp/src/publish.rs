//! A PUB socket (rfc.zeromq.org/spec/29, "The PUB Socket Type"): it binds, serves every
//! subscriber that connects, and sends each message to those subscribed to it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::codec::{SocketType, Subscription, Violation, encode_message, subscription};
use crate::conn::Connection;
use crate::{Endpoint, Error, Options};

/// Messages queued for one subscriber before it misses the next ones: libzmq's default
/// send high-water mark.
const SEND_QUEUE: usize = 1000;

/// Subscriptions one subscriber may hold; more is refused as a violation.
const MAX_SUBSCRIPTIONS: usize = 1024;

/// A bound PUB socket. [`Pub::send`] never waits: it "SHALL silently drop the message if
/// the queue for a subscriber is full" and "SHALL NOT block on sending" (spec 29); the
/// drops are counted. Dropping the `Pub` closes every connection.
pub struct Pub {
    shared: Arc<Shared>,
    endpoint: Endpoint,
    accept: JoinHandle<()>,
}

struct Shared {
    options: Options,
    subscribers: Mutex<Vec<Arc<Subscriber>>>,
    /// How many subscribers hold at least one subscription.
    subscribed: watch::Sender<usize>,
    dropped: AtomicU64,
}

struct Subscriber {
    /// Every subscription, repeated ones repeated: "Subscribing to "A" and "A" counts as
    /// two subscriptions, and would require two unsubscribe messages to undo" (spec 23).
    prefixes: Mutex<Vec<Bytes>>,
    queue: mpsc::Sender<Bytes>,
}

impl Pub {
    /// Binds `endpoint` (port 0 picks a free port; see [`Pub::endpoint`]) and accepts
    /// subscribers in the background. Must be called inside a tokio runtime.
    pub async fn bind(endpoint: &Endpoint, options: Options) -> Result<Self, Error> {
        let listener = TcpListener::bind(endpoint.bind_addr()).await?;
        let endpoint = Endpoint::from(listener.local_addr()?);
        let shared = Arc::new(Shared {
            options,
            subscribers: Mutex::new(Vec::new()),
            subscribed: watch::Sender::new(0),
            dropped: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept(listener, shared.clone()));
        Ok(Self {
            shared,
            endpoint,
            accept,
        })
    }

    /// The bound endpoint, with the port the system picked.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Queues `frames` as one message for every subscriber with a subscription that is
    /// a prefix of the first frame ("SHALL perform a binary comparison of the
    /// subscription against the start of the first frame of the message"). An empty
    /// message is not sent.
    pub fn send(&self, frames: &[Bytes]) {
        let Some(topic) = frames.first() else { return };
        let mut wire = None;
        for subscriber in lock(&self.shared.subscribers).iter() {
            if !lock(&subscriber.prefixes)
                .iter()
                .any(|p| topic.starts_with(p))
            {
                continue;
            }
            // Encoded once, shared by every queue.
            let wire = wire.get_or_insert_with(|| Bytes::from(encode_message(frames)));
            if let Err(mpsc::error::TrySendError::Full(_)) = subscriber.queue.try_send(wire.clone())
            {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits until at least `n` subscribers hold a subscription.
    pub async fn wait_subscribers(&self, n: usize) {
        let mut subscribed = self.shared.subscribed.subscribe();
        // The sender lives in `shared`, which `self` holds: this cannot fail.
        let _ = subscribed.wait_for(|&count| count >= n).await;
    }

    /// Messages a subscriber missed because its queue was full.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for Pub {
    fn drop(&mut self) {
        // The accept task owns the subscribers' tasks; they end with it.
        self.accept.abort();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut subscribers = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    subscribers.spawn(serve(stream, peer, shared.clone()));
                }
                // Out of file descriptors, say: wait rather than spin.
                Err(error) => {
                    tracing::warn!(%error, "cannot accept a ZMTP subscriber");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = subscribers.join_next() => {}
        }
    }
}

/// Serves one subscriber: sends what is queued for it, reads its subscriptions.
async fn serve(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let options = &shared.options;
    let mut conn = match Connection::open(stream, SocketType::Pub, options.limits).await {
        Ok(conn) => conn,
        Err(error) => return options.ended(peer, &error),
    };
    options.connected(peer);
    let (tx, mut queue) = mpsc::channel(SEND_QUEUE);
    let me = Arc::new(Subscriber {
        prefixes: Mutex::new(Vec::new()),
        queue: tx,
    });
    lock(&shared.subscribers).push(me.clone());
    let error = loop {
        tokio::select! {
            // `me` holds the sender, so the queue stays open.
            Some(wire) = queue.recv() => {
                if let Err(error) = conn.send(&wire).await {
                    break error;
                }
            }
            message = conn.next_message() => match message {
                Ok(message) => {
                    if let Err(violation) = shared.apply(&me, &message) {
                        break violation.into();
                    }
                }
                Err(error) => break error,
            },
        }
    };
    shared.remove(&me);
    options.ended(peer, &error);
}

impl Shared {
    /// Applies a subscriber's message if it is a subscription; others are discarded.
    fn apply(&self, subscriber: &Subscriber, message: &[Bytes]) -> Result<(), Violation> {
        let Some(change) = subscription(message) else {
            return Ok(());
        };
        let mut prefixes = lock(&subscriber.prefixes);
        let was_subscribed = !prefixes.is_empty();
        match change {
            Subscription::Subscribe(prefix) => {
                if prefixes.len() >= MAX_SUBSCRIPTIONS {
                    return Err(Violation::TooManySubscriptions {
                        limit: MAX_SUBSCRIPTIONS,
                    });
                }
                prefixes.push(prefix);
            }
            Subscription::Cancel(prefix) => {
                if let Some(i) = prefixes.iter().position(|p| *p == prefix) {
                    prefixes.swap_remove(i);
                }
            }
        }
        match (was_subscribed, !prefixes.is_empty()) {
            (false, true) => self.subscribed.send_modify(|n| *n += 1),
            (true, false) => self.subscribed.send_modify(|n| *n -= 1),
            _ => {}
        }
        Ok(())
    }

    fn remove(&self, subscriber: &Arc<Subscriber>) {
        lock(&self.subscribers).retain(|s| !Arc::ptr_eq(s, subscriber));
        if !lock(&subscriber.prefixes).is_empty() {
            self.subscribed.send_modify(|n| *n -= 1);
        }
    }
}

/// Nothing panics while holding these locks; a poisoned one is still consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
