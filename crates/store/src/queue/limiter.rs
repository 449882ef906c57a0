//! [`RateLimiter`]: atomic rate limits keyed by string, with the store's clock (SPEC Part 3).
//!
//! The maths are `rankgate_core::limiter`'s. On Redis each call is one Lua script (sorted set with a unique
//! member per request for the log; a hash of bucket counts for the counter), reading `TIME` and a stored
//! high-water mark as the monotonic guard.

use async_trait::async_trait;
use rankgate_core::limiter::{RateDecision, RateLimit};

use super::StoreError;

/// Which algorithm a call uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimiterKind {
    /// Exact sliding log, capped at the limit.
    SlidingLog,
    /// Sliding-window counter over this many buckets.
    SlidingWindow {
        /// Buckets per window.
        buckets: u32,
    },
}

/// A rate limiter shared by every instance that uses the same store.
#[async_trait]
pub trait RateLimiter: Send + Sync + 'static {
    /// Decides one request against `key`'s limit and records it if allowed.
    async fn try_acquire(
        &self,
        key: &str,
        limit: RateLimit,
        kind: RateLimiterKind,
    ) -> Result<RateDecision, StoreError>;
}
