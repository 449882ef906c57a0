//! [`WaitingRoom::open_redis`]: the waiting room on Redis (standalone or Cluster) instead of the embedded
//! store, so several `rankgate serve` instances share one queue, one admission budget and one set of tokens.
//!
//! Scripts read Redis `TIME`, so instances agree on order and expiry whatever their own clocks say; the
//! room's `clock` still paces this instance's scheduler loop. Every instance must derive the same entry
//! tokens, so they need the same token secret, and it must not live in Redis (SPEC 2.3: a dump would then
//! yield every live token; defect 7 found it there, under `{rg}:token-secret`). So `token_secret` or
//! `token_secret_file` is required here and a start without one fails, saying what to set. Redis holds
//! only nonces and token hashes and can forge nothing.

use std::sync::Arc;

use anyhow::Context as _;
use rankgate_store::clock::Clock;
use rankgate_store::queue::redis::{RedisOptions, RedisStore, RedisTime};

use super::config::WaitingRoomConfig;
use super::secret::configured_token_secret;
use super::service::WaitingRoom;

/// What a start on Redis without a token secret is told.
pub(crate) const MISSING_SECRET: &str = "the waiting room on Redis needs a token secret shared by every \
instance and kept out of Redis: set --token-secret-file (RANKGATE_TOKEN_SECRET_FILE, waiting_room.token_secret_file) to a file \
outside the data directory holding 32 random bytes in URL-safe base64 (e.g. `openssl rand 32 | basenc \
--base64url > /etc/rankgate/token-secret`), or waiting_room.token_secret (RANKGATE_TOKEN_SECRET) to that value";

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
        let secret = configured_token_secret(&config)?.ok_or_else(|| anyhow::anyhow!(MISSING_SECRET))?;
        let options = RedisOptions {
            prefix: prefix.to_string(),
            default_settings: config.default_settings()?,
            consumed_memory_ms: config.consumed_memory_seconds as i64 * 1000,
            time,
            max_queues: config.max_queues,
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
        let mut room =
            WaitingRoom::from_stores(store.clone(), store.clone(), store.clone(), clock, config, secret)?;
        room.adaptive.use_store(store.clone());
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

    /// A config with a fixed token secret, as every instance sharing a Redis must have.
    pub(crate) fn config_with_secret() -> WaitingRoomConfig {
        WaitingRoomConfig {
            token_secret: Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into()),
            ..WaitingRoomConfig::default()
        }
    }

    /// Defect 7: with no configured secret the first instance wrote one into Redis (`{rg}:token-secret`),
    /// so a Redis dump yielded every live token. Now a start on Redis without `token_secret` /
    /// `token_secret_file` fails and says what to set, and nothing secret is written to Redis.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn token_secret_in_redis_is_gone_a_start_without_one_fails_clearly() {
        let prefix = format!("rgtest:room-nokey:{}:", std::process::id());
        let urls = vec![rankgate_testkit::redis_servers::standalone_url()];
        let error = WaitingRoom::open_redis(
            &urls,
            &prefix,
            WaitingRoomConfig::default(),
            Arc::new(SystemClock),
        )
        .await
        .expect_err("no secret, no start");
        let message = format!("{error:#}");
        assert!(message.contains("token_secret_file"), "{message}");
        assert!(message.contains("RANKGATE_TOKEN_SECRET"), "{message}");
        // With a secret it starts, and neither the start nor an admission writes a secret key.
        let room = WaitingRoom::open_redis(&urls, &prefix, config_with_secret(), Arc::new(SystemClock))
            .await
            .expect("the shared Redis");
        let q = QueueName::parse("sale").unwrap();
        room.enter(&q, &MemberId::parse("m-1").unwrap()).await.unwrap();
        room.admit_queue_now(&q).await.unwrap();
        let mut connection = redis::Client::open(urls[0].as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(!keys.is_empty(), "the queue's keys are there");
        assert!(
            keys.iter().all(|key| !key[prefix.len()..].contains("secret")),
            "no secret in redis: {keys:?}"
        );
        // A secret given both inline and as a file is refused rather than guessed at.
        let both = WaitingRoomConfig {
            token_secret_file: Some("/nonexistent".into()),
            ..config_with_secret()
        };
        let error = WaitingRoom::open_redis(&urls, &prefix, both, Arc::new(SystemClock))
            .await
            .expect_err("ambiguous secret");
        assert!(format!("{error:#}").contains("both set"), "{error:#}");
        room.redis.clone().unwrap().purge_prefix().await.unwrap();
    }

    /// Two instances with the same configured secret share queue and tokens: a token admitted through one
    /// is shown identically by the other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_instances_on_one_redis_share_queue_and_tokens() {
        let prefix = format!("rgtest:room:{}:", std::process::id());
        let urls = vec![rankgate_testkit::redis_servers::standalone_url()];
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let a = WaitingRoom::open_redis(&urls, &prefix, config_with_secret(), Arc::clone(&clock))
            .await
            .expect("the shared Redis");
        let b = WaitingRoom::open_redis(&urls, &prefix, config_with_secret(), clock)
            .await
            .unwrap();
        let q = QueueName::parse("shared").unwrap();
        let m = MemberId::parse("m-1").unwrap();
        a.enter(&q, &m).await.unwrap();
        a.admit_queue_now(&q).await.unwrap();
        let (seen_by_a, _) = a.poll(&q, &m).await.unwrap();
        let (seen_by_b, _) = b.poll(&q, &m).await.unwrap();
        assert_eq!(seen_by_a.status, MemberStatus::Ready);
        assert_eq!(seen_by_b.status, MemberStatus::Ready);
        assert!(seen_by_a.entry_token.is_some());
        assert_eq!(seen_by_a.entry_token, seen_by_b.entry_token);
        assert!(
            a.redis.clone().unwrap().purge_prefix().await.unwrap() > 0,
            "this test's keys are removed"
        );
    }

    /// On Redis a poll is one script (position + poll limit): the member API still answers 429 with
    /// `Retry-After` and the `RateLimit` headers once `poll_burst` polls are spent, per member, and a
    /// refused poll is not recorded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn polls_on_redis_are_limited_per_member_in_one_script() {
        let prefix = format!("rgtest:room-poll:{}:", std::process::id());
        let urls = vec![rankgate_testkit::redis_servers::standalone_url()];
        let config = WaitingRoomConfig {
            poll_burst: 3,
            ..WaitingRoomConfig::default()
        };
        let room = WaitingRoom::open_redis(
            &urls,
            &prefix,
            WaitingRoomConfig {
                poll_burst: config.poll_burst,
                ..config_with_secret()
            },
            Arc::new(SystemClock),
        )
        .await
        .expect("the shared Redis");
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
                Err(crate::http::error::ApiError::TooManyRequests {
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
        let coalescing = room
            .queues
            .coalescing()
            .expect("the Redis store counts its poll scripts");
        assert_eq!(
            coalescing.polls, 7,
            "every poll went through poll.lua, none through the limiter"
        );
        let store = room.redis.clone().unwrap();
        assert!(store.purge_prefix().await.unwrap() > 0);
    }
}
