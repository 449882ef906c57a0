//! [`WaitingRoom::open_redis`]: the waiting room on Redis (standalone or Cluster) instead of the embedded
//! store, so several `rankgate serve` instances share one queue, one admission budget and one set of tokens.
//!
//! Scripts read Redis `TIME`, so instances agree on order and expiry whatever their own clocks say; the
//! room's `clock` still paces this instance's scheduler loop. Every instance must derive the same entry
//! tokens, so they need the same token secret: `token_secret` from the config when given (recommended:
//! then a Redis dump holds only nonces and token hashes and can forge nothing); otherwise the first
//! instance generates one and stores it in Redis with `SET NX`, and every instance reads back that one.

use std::sync::Arc;

use anyhow::Context as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rankgate_store::clock::Clock;
use rankgate_store::queue::redis::{RedisOptions, RedisStore, RedisTime};
use rankgate_store::queue::token::TokenSecret;

use super::config::WaitingRoomConfig;
use super::service::WaitingRoom;

/// Name of the shared secret in Redis (`<prefix>{rg}:token-secret`).
const SHARED_SECRET: &str = "token-secret";

fn configured_secret(config: &WaitingRoomConfig) -> anyhow::Result<Option<TokenSecret>> {
    let Some(encoded) = &config.token_secret else {
        return Ok(None);
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(encoded.trim())
        .context("waiting_room.token_secret: not URL-safe base64")?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("waiting_room.token_secret: must be 32 bytes"))?;
    Ok(Some(TokenSecret::from_bytes(bytes)))
}

impl WaitingRoom {
    /// Opens the waiting room on Redis. `urls`: one URL for a standalone server (a cluster node is
    /// detected and used as the cluster's seed), or several cluster nodes. `prefix` starts every key (e.g.
    /// `rankgate:`; no braces). Fails if Redis cannot be reached at startup; later outages make requests
    /// fail closed (503) until Redis is back.
    pub async fn open_redis(
        urls: &[String],
        prefix: &str,
        config: WaitingRoomConfig,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Arc<WaitingRoom>> {
        WaitingRoom::open_redis_timed(urls, prefix, config, clock, RedisTime::Server).await
    }

    /// [`WaitingRoom::open_redis`] on a simulated clock: the scripts take "now" from `clock` instead of
    /// Redis `TIME` (the flash-sale demo runs minutes of admissions in seconds). Never for a shared queue:
    /// instances must agree on one clock.
    pub async fn open_redis_simulated(
        urls: &[String],
        prefix: &str,
        config: WaitingRoomConfig,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Arc<WaitingRoom>> {
        let time = RedisTime::Injected(Arc::clone(&clock));
        WaitingRoom::open_redis_timed(urls, prefix, config, clock, time).await
    }

    async fn open_redis_timed(
        urls: &[String],
        prefix: &str,
        config: WaitingRoomConfig,
        clock: Arc<dyn Clock>,
        time: RedisTime,
    ) -> anyhow::Result<Arc<WaitingRoom>> {
        let options = RedisOptions {
            prefix: prefix.to_string(),
            default_settings: config.default_settings()?,
            consumed_memory_ms: config.consumed_memory_seconds as i64 * 1000,
            time,
            ..RedisOptions::default()
        };
        let store = RedisStore::connect(urls, options)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| {
                let shown: Vec<String> = urls
                    .iter()
                    .map(|u| rankgate_store::redact::redact_url(u))
                    .collect();
                format!("connecting to redis at {shown:?}")
            })?;
        let secret = match configured_secret(&config)? {
            Some(secret) => secret,
            None => {
                let candidate = TokenSecret::generate().context("reading the OS random number generator")?;
                let shared = store
                    .get_or_init_shared(SHARED_SECRET, &candidate.to_bytes())
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))
                    .context("agreeing on the token secret through redis")?;
                let bytes: [u8; 32] = shared
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("the token secret stored in redis is not 32 bytes"))?;
                tracing::warn!(
                    "waiting_room.token_secret is not configured: using a secret shared through redis; \
                     configure one so a redis dump alone cannot forge entry tokens"
                );
                TokenSecret::from_bytes(bytes)
            }
        };
        let mut room =
            WaitingRoom::from_stores(store.clone(), store.clone(), store.clone(), clock, config, secret)?;
        room.redis = Some(store);
        Ok(Arc::new(room))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rankgate_core::ids::MemberId;
    use rankgate_core::queue::{MemberStatus, QueueName};
    use rankgate_store::clock::SystemClock;

    /// Two instances opened on the same Redis without a configured secret agree on one secret: a token
    /// admitted through one is shown identically by the other, and a member entered on one is seen by both.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_instances_on_one_redis_share_queue_and_tokens() {
        let prefix = format!("rgtest:room:{}:", std::process::id());
        let urls = vec!["redis://127.0.0.1:6379".to_string()];
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let a = WaitingRoom::open_redis(&urls, &prefix, WaitingRoomConfig::default(), Arc::clone(&clock))
            .await
            .expect("redis at 127.0.0.1:6379");
        let b = WaitingRoom::open_redis(&urls, &prefix, WaitingRoomConfig::default(), clock)
            .await
            .unwrap();
        let q = QueueName::parse("shared").unwrap();
        let m = MemberId::parse("m-1").unwrap();
        a.enter(&q, &m).await.unwrap();
        let secret = TokenSecret::generate().unwrap();
        a.queues.admit(&q, vec![secret.prepare().unwrap()]).await.unwrap();
        let (seen_by_a, _) = a.poll(&q, &m).await.unwrap();
        let seen_by_b = b.queues.position(&q, &m).await.unwrap();
        assert_eq!(seen_by_a.status, MemberStatus::Ready);
        assert_eq!(seen_by_b.status, MemberStatus::Ready);
        let token_a = seen_by_a.entry_token.expect("a READY member is shown its token");
        let (nonce, _) = seen_by_b.token.unwrap();
        // Both rooms derived their secret from the one value stored in Redis.
        let store = RedisStore::connect(
            &urls,
            RedisOptions {
                prefix: prefix.clone(),
                ..RedisOptions::default()
            },
        )
        .await
        .unwrap();
        let shared: [u8; 32] = store
            .get_or_init_shared(SHARED_SECRET, &[0u8; 32])
            .await
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(TokenSecret::from_bytes(shared).token_for(&nonce), token_a);
        assert!(
            store.purge_prefix().await.unwrap() > 0,
            "this test's keys are removed"
        );
    }

    /// On Redis a poll is one script (position + poll limit): the member API still answers 429 with
    /// `Retry-After` and the `RateLimit` headers once `poll_burst` polls are spent, per member, and a
    /// refused poll is not recorded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn polls_on_redis_are_limited_per_member_in_one_script() {
        let prefix = format!("rgtest:room-poll:{}:", std::process::id());
        let urls = vec!["redis://127.0.0.1:6379".to_string()];
        let config = WaitingRoomConfig {
            poll_burst: 3,
            ..WaitingRoomConfig::default()
        };
        let room = WaitingRoom::open_redis(&urls, &prefix, config, Arc::new(SystemClock))
            .await
            .expect("redis at 127.0.0.1:6379");
        assert!(room.redis.is_some(), "the one-script poll is used");
        let q = QueueName::parse("sale").unwrap();
        let m = MemberId::parse("eager").unwrap();
        room.enter(&q, &m).await.unwrap();
        let mut outcomes = Vec::new();
        for _ in 0..6 {
            outcomes.push(room.poll(&q, &m).await);
        }
        let (first, headers) = outcomes[0].as_ref().expect("first poll allowed");
        assert_eq!(first.status, MemberStatus::Waiting);
        assert_eq!(first.rank, Some(0));
        assert_eq!(headers.policy, "\"poll\";q=3;w=3");
        assert_eq!(headers.limit, "\"poll\";r=2;t=3");
        assert!(outcomes[..3].iter().all(Result::is_ok));
        for refused in &outcomes[3..] {
            match refused {
                Err(crate::error::ApiError::TooManyRequests {
                    retry_after_secs,
                    headers,
                    ..
                }) => {
                    assert!((1..=3).contains(retry_after_secs));
                    assert_eq!(headers[0], ("ratelimit-policy", "\"poll\";q=3;w=3".to_string()));
                    assert!(headers[1].1.starts_with("\"poll\";r=0;t="));
                }
                other => panic!("expected 429, got {other:?}"),
            }
        }
        let other = MemberId::parse("someone-else").unwrap();
        assert!(room.poll(&q, &other).await.is_ok(), "limits are per member");
        let store = room.redis.clone().unwrap();
        assert!(store.purge_prefix().await.unwrap() > 0);
    }
}
