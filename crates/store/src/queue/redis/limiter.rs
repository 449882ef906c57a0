//! [`RateLimiter`] on Redis: one script per decision over the key's hash-tagged log, window and meta keys.
//!
//! The maths are `rankgate_core::limiter`'s (window `(now - window, now]`, refused requests not recorded,
//! partial weighting of the oldest bucket), run inside the script with Redis `TIME` behind a per-key
//! monotonic guard. Using a key with the other algorithm starts that algorithm afresh, as the embedded
//! limiter does. Keys expire once idle, so a million members who stopped polling leave nothing behind.

use async_trait::async_trait;
use rankgate_core::limiter::{RateDecision, RateLimit};

use super::{RedisStore, Reply};
use crate::queue::limiter::{RateLimiter, RateLimiterKind};
use crate::queue::StoreError;

/// How long past twice the window an idle limiter key is kept (ms), so a slow caller never sees it vanish.
pub(super) const IDLE_SLACK_MS: i64 = 10_000;

#[async_trait]
impl RateLimiter for RedisStore {
    async fn try_acquire(
        &self,
        key: &str,
        limit: RateLimit,
        kind: RateLimiterKind,
    ) -> Result<RateDecision, StoreError> {
        self.check()?;
        let (script, buckets) = match kind {
            RateLimiterKind::SlidingLog => (&self.scripts.limiter_log, 1),
            RateLimiterKind::SlidingWindow { buckets } => (&self.scripts.limiter_window, buckets),
        };
        let mut call = script.prepare_invoke();
        for key in self.limiter_keys(key) {
            call.key(key);
        }
        call.arg(self.now_arg())
            .arg(limit.limit)
            .arg(limit.window_ms.max(1))
            .arg(buckets)
            .arg(IDLE_SLACK_MS);
        let mut reply = Reply::new(self.connection.invoke(&call).await?)?;
        Ok(if reply.int()? == 1 {
            RateDecision::Allowed {
                remaining: reply.int()?.clamp(0, i64::from(u32::MAX)) as u32,
                reset_ms: reply.int()?,
            }
        } else {
            RateDecision::Limited {
                retry_after_ms: reply.int()?,
            }
        })
    }
}
