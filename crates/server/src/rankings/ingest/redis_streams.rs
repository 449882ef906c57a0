//! Redis Streams ingest (`--stream redis://host:port/<stream key>`): a consumer group that delivers at
//! least once, made exactly-once in effect by event-id dedupe.
//!
//! # Format
//! Each stream entry carries one event as JSON in the field `event`, exactly the object `POST /v1/events`
//! accepts: `XADD events * event '{"id":"o1-l1","type":"payment_succeeded",...}'`.
//!
//! # Delivery
//! - Entries are read with `XREADGROUP` in batches and **acked only after their batch is durable** in the
//!   source of truth. A crash before the ack leaves them pending; they are delivered again and deduped.
//! - Entries stuck with a dead consumer are taken over with `XAUTOCLAIM` once idle for `min_idle`.
//! - Poison entries (not JSON, or an invalid event) are written to the dead-letter stream `<key>:dead`
//!   with their error, then acked, so they never block the group.
//! - Duplicates and too-old events are acked like accepted ones: they are handled, not failures.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply,
};
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use rankgate_core::event::{parse_event, ParseLimits};
use rankgate_store::clock::Clock;
use rankgate_store::redact::{redact_url, scrub_credentials};

use crate::rankings::RankingService;

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// `redis://host:port` of the server holding the stream.
    pub redis_url: String,
    /// The stream key, e.g. `events`.
    pub key: String,
    /// Consumer group name (shared by every rankgate instance).
    pub group: String,
    /// This instance's consumer name (unique per instance).
    pub consumer: String,
    /// Entries read per batch.
    pub batch: usize,
    /// Pending entries idle this long are reclaimed from their consumer.
    pub min_idle: Duration,
    /// How long one read blocks waiting for entries.
    pub block: Duration,
}

impl StreamConfig {
    /// Parses `redis://host:port/<key>`; the path names the stream.
    pub fn from_url(url: &str) -> anyhow::Result<StreamConfig> {
        // The consumer holds one plain connection: following a Sentinel failover would need the store's
        // rediscovering connection, so the form is refused rather than half supported.
        anyhow::ensure!(
            !rankgate_store::redis_sentinel::is_sentinel_url(url),
            "--stream {}: a redis+sentinel:// stream is not supported; give the stream's server as \
             redis://host:port/<stream key>",
            redact_url(url)
        );
        let (base, key) = url
            .rsplit_once('/')
            .filter(|(base, key)| base.contains("://") && !base.ends_with('/') && !key.is_empty())
            .with_context(|| {
                format!(
                    "--stream {}: expected redis://host:port/<stream key>",
                    redact_url(url)
                )
            })?;
        Ok(StreamConfig {
            redis_url: base.to_string(),
            key: key.to_string(),
            group: "rankgate".into(),
            consumer: format!("rankgate-{}-{}", std::process::id(), rand::random::<u32>()),
            batch: 2_000,
            min_idle: Duration::from_secs(30),
            block: Duration::from_millis(500),
        })
    }

    fn dead_letter_key(&self) -> String {
        format!("{}:dead", self.key)
    }
}

/// What one pass over a batch of entries did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchReport {
    /// Entries read.
    pub entries: usize,
    /// Entries sent to the dead-letter stream.
    pub dead_lettered: usize,
}

/// The consumer: connection, config and the rankings service it ingests into.
pub struct StreamConsumer {
    config: StreamConfig,
    connection: MultiplexedConnection,
    rankings: Arc<RankingService>,
    clock: Arc<dyn Clock>,
    max_future_millis: i64,
}

impl StreamConsumer {
    /// Connects and creates the consumer group (and the stream) if missing.
    pub async fn connect(
        config: StreamConfig,
        rankings: Arc<RankingService>,
        clock: Arc<dyn Clock>,
        max_future_millis: i64,
    ) -> anyhow::Result<StreamConsumer> {
        let client = redis::Client::open(config.redis_url.as_str()).map_err(|error| {
            anyhow::anyhow!(
                "stream: bad Redis URL {}: {}",
                redact_url(&config.redis_url),
                scrub_credentials(&error.to_string(), &config.redis_url)
            )
        })?;
        let mut connection = client.get_multiplexed_tokio_connection().await.map_err(|error| {
            anyhow::anyhow!(
                "stream: connecting to {}: {}",
                redact_url(&config.redis_url),
                scrub_credentials(&error.to_string(), &config.redis_url)
            )
        })?;
        let created: redis::RedisResult<()> = connection
            .xgroup_create_mkstream(&config.key, &config.group, "0")
            .await;
        if let Err(error) = created {
            if error.code() != Some("BUSYGROUP") {
                return Err(error).context("stream: creating the consumer group");
            }
        }
        Ok(StreamConsumer {
            config,
            connection,
            rankings,
            clock,
            max_future_millis,
        })
    }

    /// Reads and handles one batch: first entries reclaimed from idle consumers, then new ones.
    pub async fn poll_once(&mut self) -> anyhow::Result<BatchReport> {
        let claimed: StreamAutoClaimReply = self
            .connection
            .xautoclaim_options(
                &self.config.key,
                &self.config.group,
                &self.config.consumer,
                self.config.min_idle.as_millis() as u64,
                "0-0",
                StreamAutoClaimOptions::default().count(self.config.batch),
            )
            .await
            .context("stream: XAUTOCLAIM")?;
        if !claimed.claimed.is_empty() {
            return self.handle(claimed.claimed).await;
        }
        // Our own pending entries (delivered before a restart of this consumer name) come first.
        let options = StreamReadOptions::default()
            .group(&self.config.group, &self.config.consumer)
            .count(self.config.batch)
            .block(self.config.block.as_millis() as usize);
        let reply: Option<StreamReadReply> = self
            .connection
            .xread_options(&[&self.config.key], &[">"], &options)
            .await
            .context("stream: XREADGROUP")?;
        let entries: Vec<StreamId> = reply
            .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
            .unwrap_or_default();
        if entries.is_empty() {
            return Ok(BatchReport::default());
        }
        self.handle(entries).await
    }

    async fn handle(&mut self, entries: Vec<StreamId>) -> anyhow::Result<BatchReport> {
        let now = self.clock.now_millis();
        let limits = ParseLimits {
            max_future_millis: self.max_future_millis,
            ..ParseLimits::at(now)
        };
        let mut events = Vec::with_capacity(entries.len());
        let mut poison = Vec::new();
        for entry in &entries {
            let parsed = match entry.get::<String>("event") {
                None => Err("event: the entry has no `event` field".to_string()),
                Some(body) => parse_event(body.as_bytes(), &limits).map_err(|e| e.to_string()),
            };
            match parsed {
                Ok(event) => events.push(event),
                Err(error) => poison.push((entry, error)),
            }
        }
        if !events.is_empty() {
            // Durable first; only then ack. A failure here leaves every entry pending for a retry.
            self.rankings
                .ingest(events, now)
                .await
                .context("stream: ingesting a batch")?;
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (entry, error) in &poison {
            let body = entry.get::<String>("event").unwrap_or_default();
            pipe.xadd(
                self.config.dead_letter_key(),
                "*",
                &[("entry", entry.id.as_str()), ("event", &body), ("error", error)],
            )
            .ignore();
        }
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        pipe.xack(&self.config.key, &self.config.group, &ids).ignore();
        let _: () = pipe
            .query_async(&mut self.connection)
            .await
            .context("stream: XACK")?;
        metrics::counter!("rankgate_stream_entries_total").increment(entries.len() as u64);
        metrics::counter!("rankgate_stream_dead_lettered_total").increment(poison.len() as u64);
        crate::rankings::service::count_events_rejected_before_ingest(poison.len());
        Ok(BatchReport {
            entries: entries.len(),
            dead_lettered: poison.len(),
        })
    }

    /// Consumes until `shutdown`; on errors (Redis or the source of truth down) waits and retries.
    pub async fn run_until_stopped(mut self, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let result = tokio::select! {
                _ = shutdown.cancelled() => return,
                result = self.poll_once() => result,
            };
            match result {
                Ok(_) => backoff = Duration::from_millis(100),
                Err(error) => {
                    tracing::warn!(error = format!("{error:#}"), "stream consumer: retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_stream_url_is_refused_naming_the_flag_without_the_password() {
        let error = StreamConfig::from_url("redis+sentinel://:hunter22@h:26379/mymaster/events")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--stream") && error.contains("sentinel"),
            "{error}"
        );
        assert!(!error.contains("hunter22"), "{error}");
        assert!(StreamConfig::from_url("redis://127.0.0.1:6379/events").is_ok());
    }
}
