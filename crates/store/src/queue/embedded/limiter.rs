//! The embedded [`RateLimiter`]: limiter state in sharded maps, never persisted (it covers seconds).
//!
//! Keys are spread over shards so concurrent polls of different members rarely share a lock; each shard is
//! swept of idle keys every few thousand calls, so a crowd of a million members that stopped polling does
//! not stay in memory.

use async_trait::async_trait;
use hashbrown::HashMap;
use parking_lot::Mutex;
use rankgate_core::limiter::{MonotonicGuard, RateDecision, RateLimit, SlidingLog, SlidingWindowCounter};

use super::EmbeddedStore;
use crate::queue::limiter::{RateLimiter, RateLimiterKind};
use crate::queue::StoreError;

const SHARDS: usize = 32;
const SWEEP_EVERY_CALLS: u64 = 4_096;

enum Entry {
    Log(SlidingLog, i64),
    Window(SlidingWindowCounter, i64),
}

/// One key's state and its own monotonic guard. Per key, as on Redis (each key's `meta` hash holds its
/// guard): a guard shared by a shard would let one key's clock reading move another key's window, so after
/// the clock stepped back two keys would be decided at different times than on Redis.
struct Keyed {
    entry: Entry,
    guard: MonotonicGuard,
}

#[derive(Default)]
struct Shard {
    entries: HashMap<String, Keyed>,
    /// The shard's guarded time, for sweeping idle keys only.
    guard: MonotonicGuard,
    calls: u64,
}

pub(crate) struct EmbeddedLimiter {
    shards: Vec<Mutex<Shard>>,
    // One hasher for the limiter's life: a fresh `RandomState` per call would scatter a key over shards.
    hasher: hashbrown::DefaultHashBuilder,
}

impl Default for EmbeddedLimiter {
    fn default() -> Self {
        EmbeddedLimiter {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: hashbrown::DefaultHashBuilder::default(),
        }
    }
}

impl EmbeddedLimiter {
    fn shard_of(&self, key: &str) -> &Mutex<Shard> {
        use std::hash::BuildHasher;
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }

    fn try_acquire(&self, key: &str, now_ms: i64, limit: RateLimit, kind: RateLimiterKind) -> RateDecision {
        let mut shard = self.shard_of(key).lock();
        let sweep_now_ms = shard.guard.observe(now_ms);
        shard.calls += 1;
        if shard.calls.is_multiple_of(SWEEP_EVERY_CALLS) {
            shard.entries.retain(|_, keyed| match &keyed.entry {
                Entry::Log(log, window) => !log.is_idle(sweep_now_ms, *window),
                Entry::Window(counter, window) => !counter.is_idle(sweep_now_ms, *window),
            });
        }
        let keyed = shard.entries.entry_ref(key).or_insert_with(|| Keyed {
            entry: match kind {
                RateLimiterKind::SlidingLog => Entry::Log(SlidingLog::default(), limit.window_ms),
                RateLimiterKind::SlidingWindow { .. } => {
                    Entry::Window(SlidingWindowCounter::default(), limit.window_ms)
                }
            },
            guard: MonotonicGuard::default(),
        });
        let now_ms = keyed.guard.observe(now_ms);
        match (&mut keyed.entry, kind) {
            (Entry::Log(log, window), RateLimiterKind::SlidingLog) => {
                *window = limit.window_ms;
                log.try_acquire(now_ms, limit)
            }
            (Entry::Window(counter, window), RateLimiterKind::SlidingWindow { buckets }) => {
                *window = limit.window_ms;
                counter.try_acquire(now_ms, limit, buckets)
            }
            (entry, kind) => {
                // The same key used with another algorithm: start that algorithm afresh.
                *entry = match kind {
                    RateLimiterKind::SlidingLog => Entry::Log(SlidingLog::default(), limit.window_ms),
                    RateLimiterKind::SlidingWindow { .. } => {
                        Entry::Window(SlidingWindowCounter::default(), limit.window_ms)
                    }
                };
                match (entry, kind) {
                    (Entry::Log(log, _), _) => log.try_acquire(now_ms, limit),
                    (Entry::Window(counter, _), RateLimiterKind::SlidingWindow { buckets }) => {
                        counter.try_acquire(now_ms, limit, buckets)
                    }
                    (Entry::Window(counter, _), _) => counter.try_acquire(now_ms, limit, 1),
                }
            }
        }
    }
}

#[async_trait]
impl RateLimiter for EmbeddedStore {
    async fn try_acquire(
        &self,
        key: &str,
        limit: RateLimit,
        kind: RateLimiterKind,
    ) -> Result<RateDecision, StoreError> {
        self.check()?;
        Ok(self
            .limiter
            .try_acquire(key, self.clock.now_millis(), limit, kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_with_prefix(limiter: &EmbeddedLimiter, prefix: &str) -> usize {
        limiter
            .shards
            .iter()
            .map(|shard| {
                shard
                    .lock()
                    .entries
                    .keys()
                    .filter(|key| key.starts_with(prefix))
                    .count()
            })
            .sum()
    }

    #[test]
    fn idle_keys_are_swept_from_every_shard_while_live_ones_stay() {
        let limiter = EmbeddedLimiter::default();
        let limit = RateLimit {
            limit: 1,
            window_ms: 1_000,
        };
        for i in 0..5_000 {
            limiter.try_acquire(&format!("idle-{i}"), 0, limit, RateLimiterKind::SlidingLog);
        }
        assert_eq!(keys_with_prefix(&limiter, "idle-"), 5_000);
        // Long after their window: enough calls on fresh keys that every shard reaches its sweep (on
        // average four times over).
        let calls = 4 * SHARDS as u64 * SWEEP_EVERY_CALLS;
        for i in 0..calls {
            limiter.try_acquire(&format!("live-{i}"), 60_000, limit, RateLimiterKind::SlidingLog);
        }
        assert_eq!(
            keys_with_prefix(&limiter, "idle-"),
            0,
            "idle keys outlived their sweeps"
        );
        // Nothing live was swept: the last calls are inside their window.
        assert_eq!(keys_with_prefix(&limiter, "live-"), calls as usize);
    }
}
