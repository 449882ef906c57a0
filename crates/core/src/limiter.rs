//! Rate-limiter maths (SPEC Part 3): a capped sliding log and a bucketed sliding-window counter.
//!
//! Both are plain data plus a decision function that takes the store's current time, so a backend runs the
//! same maths inside its atomic step (a Lua script on Redis, a lock in the embedded store).
//!
//! - [`SlidingLog`] keeps one timestamp per allowed request inside the window, each a distinct entry (Redis
//!   uses a unique member per request, so two requests in the same millisecond count twice). It is capped at
//!   `limit` entries: refused requests are not recorded, so a client hammering the endpoint cannot grow it.
//!   Exact, at `O(limit)` memory per key.
//! - [`SlidingWindowCounter`] keeps per-bucket counts and weights the oldest, partly expired bucket by the
//!   fraction still inside the window. Approximate, at `O(buckets)` memory whatever the limit.
//!
//! Clocks: callers pass the store's time through a monotonic guard ([`MonotonicGuard`]) so a clock that
//! steps backwards can neither refund nor double-charge a window.

use std::collections::VecDeque;

/// A limit: at most `limit` requests per `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests allowed per window.
    pub limit: u32,
    /// Window length (ms).
    pub window_ms: i64,
}

/// The answer to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    /// Let it through.
    Allowed {
        /// Requests left in the current window after this one.
        remaining: u32,
        /// Milliseconds until the window has room for the full limit again.
        reset_ms: i64,
    },
    /// Refuse it.
    Limited {
        /// Milliseconds until a request would be allowed.
        retry_after_ms: i64,
    },
}

impl RateDecision {
    /// True when allowed.
    #[must_use]
    pub fn is_allowed(&self) -> bool {
        matches!(self, RateDecision::Allowed { .. })
    }
}

/// Keeps a time source from going backwards: returns the larger of `now` and the last value seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MonotonicGuard {
    last_ms: i64,
}

impl MonotonicGuard {
    /// The guarded time.
    pub fn observe(&mut self, now_ms: i64) -> i64 {
        self.last_ms = self.last_ms.max(now_ms);
        self.last_ms
    }
}

/// An exact sliding log, capped at the limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingLog {
    entries: VecDeque<i64>,
}

impl SlidingLog {
    /// Decides one request at `now_ms` and records it if allowed.
    pub fn try_acquire(&mut self, now_ms: i64, limit: RateLimit) -> RateDecision {
        self.forget_before(now_ms - limit.window_ms);
        if self.entries.len() as u32 >= limit.limit {
            // The oldest entry leaves the window at oldest + window; then there is room.
            let oldest = self.entries.front().copied().unwrap_or(now_ms);
            return RateDecision::Limited {
                retry_after_ms: (oldest + limit.window_ms - now_ms).max(1),
            };
        }
        self.entries.push_back(now_ms);
        while self.entries.len() as u32 > limit.limit {
            self.entries.pop_front();
        }
        let oldest = self.entries.front().copied().unwrap_or(now_ms);
        RateDecision::Allowed {
            remaining: limit.limit - self.entries.len() as u32,
            reset_ms: (oldest + limit.window_ms - now_ms).max(0),
        }
    }

    fn forget_before(&mut self, cutoff_ms: i64) {
        // Entries at exactly `now - window` are outside: the window is (now - window, now].
        while self.entries.front().is_some_and(|t| *t <= cutoff_ms) {
            self.entries.pop_front();
        }
    }

    /// True when nothing in the log is inside a window ending at `now_ms`, so the key can be dropped.
    #[must_use]
    pub fn is_idle(&self, now_ms: i64, window_ms: i64) -> bool {
        self.entries.back().is_none_or(|t| *t <= now_ms - window_ms)
    }

    /// Entries held (never more than the limit).
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A bucketed sliding-window counter.
///
/// Buckets are a set keyed by their start (as the Redis script's hash is): a request counts in the
/// bucket of its start wherever that bucket sits, every bucket wholly before the window is dropped, and
/// the oldest bucket is the one with the smallest start. That is what keeps the counter well defined when
/// one key is used with another window or bucket count than before (the buckets then lie on two grids).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingWindowCounter {
    /// `(bucket start ms, count)`, ascending by start, one entry per start.
    buckets: VecDeque<(i64, u32)>,
}

impl SlidingWindowCounter {
    /// Decides one request at `now_ms` with the window split into `bucket_count` buckets.
    pub fn try_acquire(&mut self, now_ms: i64, limit: RateLimit, bucket_count: u32) -> RateDecision {
        let bucket_ms = (limit.window_ms / bucket_count.max(1) as i64).max(1);
        let current_start = now_ms.div_euclid(bucket_ms) * bucket_ms;
        let window_start = now_ms - limit.window_ms;
        self.buckets.retain(|(start, _)| start + bucket_ms > window_start);
        let estimate = self.estimate(window_start, bucket_ms);
        if estimate + 1.0 > limit.limit as f64 + 1e-9 {
            // Room appears when the oldest bucket slides out.
            let oldest_end = self
                .buckets
                .front()
                .map_or(now_ms + bucket_ms, |(start, _)| start + bucket_ms);
            let retry_after_ms = (oldest_end + limit.window_ms - now_ms).max(1);
            return RateDecision::Limited { retry_after_ms };
        }
        match self
            .buckets
            .binary_search_by_key(&current_start, |(start, _)| *start)
        {
            Ok(at) => self.buckets[at].1 += 1,
            Err(at) => self.buckets.insert(at, (current_start, 1)),
        }
        let used = (estimate + 1.0).ceil() as u32;
        RateDecision::Allowed {
            remaining: limit.limit.saturating_sub(used),
            reset_ms: limit.window_ms,
        }
    }

    fn estimate(&self, window_start: i64, bucket_ms: i64) -> f64 {
        self.buckets
            .iter()
            .map(|(start, count)| {
                if *start >= window_start {
                    *count as f64
                } else {
                    // Partly outside: weight by the part still inside the window.
                    let inside = (start + bucket_ms - window_start) as f64 / bucket_ms as f64;
                    *count as f64 * inside.clamp(0.0, 1.0)
                }
            })
            .sum()
    }

    /// True when nothing is inside a window ending at `now_ms`.
    #[must_use]
    pub fn is_idle(&self, now_ms: i64, window_ms: i64) -> bool {
        self.buckets
            .back()
            .is_none_or(|(start, _)| *start + window_ms <= now_ms - window_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Found by the backend-equivalence test: a key used with another window or bucket count puts its
    /// buckets on two grids. The counter pushed the new bucket at the back, behind a later start, and
    /// then took the back as the newest and the front as the oldest; the Redis script (a hash of buckets
    /// by start) took the smallest start as the oldest. Buckets are now a sorted set by start.
    #[test]
    fn buckets_on_two_grids_stay_one_set_ordered_by_start() {
        let mut counter = SlidingWindowCounter::default();
        let now = 1_000_000;
        let limit = |limit, window_ms| RateLimit { limit, window_ms };
        // 12 ms buckets: this request counts in the bucket starting at 999,996.
        assert!(counter.try_acquire(now, limit(1, 100), 8).is_allowed());
        // 750 ms buckets: this one in the bucket starting at 999,750, before the first.
        assert!(counter.try_acquire(now, limit(2, 3_000), 4).is_allowed());
        assert_eq!(
            counter.try_acquire(now, limit(1, 1_000), 1),
            RateDecision::Limited {
                retry_after_ms: 999_750 + 1_000 + 1_000 - now
            },
            "room appears when the bucket with the smallest start slides out"
        );
        // A request in a bucket that exists already counts there, wherever it sits.
        let mut counter = SlidingWindowCounter::default();
        assert!(counter.try_acquire(now, limit(5, 3_000), 4).is_allowed());
        assert!(counter.try_acquire(now + 1, limit(5, 3_000), 12).is_allowed());
        assert!(counter.try_acquire(now + 2, limit(5, 3_000), 4).is_allowed());
        assert_eq!(counter.buckets, VecDeque::from([(999_750, 2), (1_000_000, 1)]));
    }

    #[test]
    fn sliding_log_counts_same_millisecond_requests_and_caps_itself() {
        let limit = RateLimit {
            limit: 3,
            window_ms: 1000,
        };
        let mut log = SlidingLog::default();
        assert_eq!(
            log.try_acquire(0, limit),
            RateDecision::Allowed {
                remaining: 2,
                reset_ms: 1000
            }
        );
        assert!(log.try_acquire(0, limit).is_allowed());
        assert!(log.try_acquire(0, limit).is_allowed());
        assert_eq!(
            log.try_acquire(0, limit),
            RateDecision::Limited { retry_after_ms: 1000 }
        );
        for _ in 0..100 {
            log.try_acquire(10, limit);
        }
        assert_eq!(log.len(), 3, "refused requests are not recorded");
        assert!(log.try_acquire(1000, limit).is_allowed());
    }

    #[test]
    fn monotonic_guard_ignores_a_clock_going_back() {
        let mut guard = MonotonicGuard::default();
        assert_eq!(guard.observe(100), 100);
        assert_eq!(guard.observe(50), 100);
        assert_eq!(guard.observe(150), 150);
    }

    #[test]
    fn sliding_window_counter_weights_the_old_bucket() {
        let limit = RateLimit {
            limit: 10,
            window_ms: 1000,
        };
        let mut counter = SlidingWindowCounter::default();
        for _ in 0..10 {
            assert!(counter.try_acquire(900, limit, 10).is_allowed());
        }
        assert!(!counter.try_acquire(950, limit, 10).is_allowed());
        // At 1950 the 900-bucket is half outside the window: 5 count, so 5 more fit.
        let allowed = (0..10)
            .filter(|_| counter.try_acquire(1950, limit, 10).is_allowed())
            .count();
        assert_eq!(allowed, 5);
    }

    proptest! {
        /// The sliding log never allows more than `limit` in any window, whatever the request times.
        #[test]
        fn sliding_log_never_exceeds_the_limit(mut times in proptest::collection::vec(0i64..10_000, 1..300), limit in 1u32..10, window in 1i64..2000) {
            times.sort();
            let rate = RateLimit { limit, window_ms: window };
            let mut log = SlidingLog::default();
            let allowed: Vec<i64> = times.iter().copied().filter(|t| log.try_acquire(*t, rate).is_allowed()).collect();
            for (i, t) in allowed.iter().enumerate() {
                let in_window = allowed[..=i].iter().filter(|u| **u > t - window).count();
                prop_assert!(in_window as u32 <= limit);
            }
        }
    }
}
