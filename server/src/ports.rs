//! Loopback ports for processes that must be told their port before they start (what
//! `dynamo run` launches, and the harnesses of our tests and benchmarks).
//!
//! A port the kernel hands out for `bind(:0)` comes from its ephemeral range, the same
//! range an outgoing connection takes its source port from; between choosing such a port
//! and the child binding it, any connection on the machine may take it (CI met it:
//! "Address already in use" from a sidecar on a port chosen a moment before). Ports here
//! come from below that range, where only a listener can take them, each process walking
//! them from its own random start so that parallel test processes rarely meet.

use std::hash::{BuildHasher, RandomState};
use std::net::TcpListener;
use std::ops::Range;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// Below the usual defaults of servers a test may start without naming a port (8000,
/// 8080, 9090, 9100, 10250, ...).
const LOWEST: u16 = 15_000;

/// Where the kernel's ephemeral range starts when `/proc` does not say (Linux's default).
const EPHEMERAL_START: u16 = 32_768;

/// The next offset into [`range`] this process tries, from a random start.
static NEXT: LazyLock<AtomicU32> =
    LazyLock::new(|| AtomicU32::new(RandomState::new().hash_one(std::process::id()) as u32));

/// A loopback port nothing listens on now, outside the ephemeral range when the machine's
/// range leaves room below it; each call of a process gets another port.
pub fn free_port() -> std::io::Result<u16> {
    let range = range();
    let span = u32::from(range.end - range.start);
    let walk = (0..span.min(4_096))
        .map(|_| range.start + (NEXT.fetch_add(1, Ordering::Relaxed) % span) as u16);
    match first_free(walk) {
        Some(port) => Ok(port),
        None => Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()),
    }
}

/// The first of `ports` a loopback listener can bind now.
fn first_free(mut ports: impl Iterator<Item = u16>) -> Option<u16> {
    ports.find(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
}

/// `[LOWEST, start of the ephemeral range)`, empty when the range starts lower.
fn range() -> Range<u16> {
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| ephemeral_start(&text))
        .unwrap_or(EPHEMERAL_START);
    LOWEST..start.max(LOWEST)
}

/// The first number of `ip_local_port_range` ("32768\t60999").
fn ephemeral_start(text: &str) -> Option<u16> {
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_below_the_ephemeral_range_and_differ_per_call() {
        let range = range();
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        if !range.is_empty() {
            assert!(
                ports.iter().all(|p| range.contains(p)),
                "{ports:?} {range:?}"
            );
        }
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    }

    #[test]
    fn a_port_held_by_a_listener_is_passed_over() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let held_port = held.local_addr().unwrap().port();
        let next = free_port().unwrap();
        assert_eq!(first_free([held_port, next].into_iter()), Some(next));
        assert_eq!(first_free([held_port].into_iter()), None);
    }

    #[test]
    fn the_kernel_range_is_read_from_its_first_number() {
        assert_eq!(ephemeral_start("32768\t60999\n"), Some(32768));
        assert_eq!(ephemeral_start(""), None);
    }
}
