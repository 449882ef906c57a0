//! The clock every time-dependent store and worker takes, so tests control time instead of sleeping.
//!
//! Production uses [`SystemClock`]; tests share one [`ManualClock`] (behind an `Arc`) between the store,
//! the schedulers and the test body, and move it with [`ManualClock::advance`]. Stores still apply their own
//! monotonic guard on top: a clock is allowed to step backwards (NTP), a queue's sequence is not.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// A source of "now", in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time in milliseconds since the Unix epoch.
    fn now_millis(&self) -> i64;
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> i64 {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            // A clock set before 1970 is a broken machine; treat it as the epoch rather than panicking.
            .unwrap_or_default();
        since_epoch.as_millis() as i64
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    // An atomic rather than a mutex: readers on hot paths (every queue operation) never block.
    now_millis: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock reading `start_millis`.
    #[must_use]
    pub fn new(start_millis: i64) -> Self {
        ManualClock {
            now_millis: Arc::new(AtomicI64::new(start_millis)),
        }
    }

    /// Sets the time (it may go backwards, to test monotonic guards).
    pub fn set(&self, millis: i64) {
        self.now_millis.store(millis, Ordering::SeqCst);
    }

    /// Moves the time forward by `millis` and returns the new time.
    pub fn advance(&self, millis: i64) -> i64 {
        self.now_millis.fetch_add(millis, Ordering::SeqCst) + millis
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> i64 {
        self.now_millis.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time() {
        let clock = ManualClock::new(1_000);
        let shared = clock.clone();
        assert_eq!(clock.advance(500), 1_500);
        assert_eq!(shared.now_millis(), 1_500);
        shared.set(10);
        assert_eq!(clock.now_millis(), 10);
        let as_dyn: Arc<dyn Clock> = Arc::new(clock);
        assert_eq!(as_dyn.now_millis(), 10);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_millis() > 1_577_836_800_000);
    }
}
