//! The connection budget every listener of a process draws from, and the pressure signal
//! that tells connections to make room when it is nearly used.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, futures::Notified};

/// The idle timeout of connections without a request while the connection budget is
/// nearly used (fewer than a tenth of `--max-connections` free): long enough for a client
/// that just connected to send its first bytes, short enough that a flood of silent
/// connections cannot keep active clients out for more than a moment.
pub const PRESSURE_IDLE_TIMEOUT: Duration = Duration::from_secs(1);

/// `--max-connections` slots; under pressure while fewer than a tenth of them are free.
#[derive(Debug)]
pub struct Budget {
    slots: Semaphore,
    reserve: usize,
    /// Pressure as last seen, so that only its rise wakes every connection.
    pressed: Mutex<bool>,
    rises: Notify,
}

/// One connection's slot, given back when it drops.
#[derive(Debug)]
pub struct Slot(Arc<Budget>);

impl Budget {
    pub fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Semaphore::new(max_connections),
            reserve: max_connections.div_ceil(10),
            pressed: Mutex::new(false),
            rises: Notify::new(),
        })
    }

    /// Waits for a free slot.
    pub async fn take(self: &Arc<Self>) -> Slot {
        self.slots
            .acquire()
            .await
            .expect("the connection budget is never closed")
            .forget();
        self.update();
        Slot(self.clone())
    }

    pub fn pressed(&self) -> bool {
        self.slots.available_permits() < self.reserve
    }

    /// The idle timeout of connections without a request, `timeout` unless pressed.
    pub fn idle_timeout(&self, timeout: Duration) -> Duration {
        match self.pressed() {
            true => timeout.min(PRESSURE_IDLE_TIMEOUT),
            false => timeout,
        }
    }

    /// Resolves at the next rise of pressure; `enable` it before reading [`Self::pressed`]
    /// so that no rise falls between the two.
    pub fn pressure_rises(&self) -> Notified<'_> {
        self.rises.notified()
    }

    fn update(&self) {
        // Under the lock the last reader of the slots also writes the flag, so a rise
        // is never mistaken for pressure that was already there.
        let mut pressed = self.pressed.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.pressed();
        if now && !*pressed {
            self.rises.notify_waiters();
        }
        *pressed = now;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.slots.add_permits(1);
        self.0.update();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pressure_rises_once_the_last_tenth_is_taken_and_falls_when_freed() {
        let budget = Budget::new(20);
        let mut slots = Vec::new();
        for _ in 0..18 {
            slots.push(budget.take().await);
        }
        assert!(!budget.pressed());
        let rise = budget.pressure_rises();
        tokio::pin!(rise);
        rise.as_mut().enable();
        let idle = Duration::from_secs(60);
        assert_eq!(budget.idle_timeout(idle), idle);
        slots.push(budget.take().await);
        assert!(budget.pressed());
        assert_eq!(budget.idle_timeout(idle), PRESSURE_IDLE_TIMEOUT);
        let short = Duration::from_millis(100);
        assert_eq!(budget.idle_timeout(short), short);
        tokio::time::timeout(Duration::from_secs(1), rise)
            .await
            .expect("the rise wakes waiters");
        slots.truncate(18);
        assert!(!budget.pressed());
    }
}
