//! The rankings' settings (SPEC Part 1), as `crate::config` merges them from the file, the environment
//! and the flags. The infrastructure both products share (the data directory, Redis, SQLite's
//! durability) stays in `crate::config::Config` and is handed to the rankings where they open their
//! stores.

use rankgate_core::period::Zone;

use super::ingest::kafka::KafkaConfig;
use super::webhooks::config::WebhookConfig;

/// What the rankings half of rankgate is configured with.
#[derive(Debug, Clone)]
pub struct RankingsConfig {
    /// Time zone of calendar periods.
    pub zone: Zone,
    /// Events stamped further than this in the future of the server clock are rejected.
    pub max_future_millis: i64,
    /// Events older than this behind the watermark are dropped (`tooOld`).
    pub max_lateness_millis: i64,
    /// How long raw events and processed ids are kept behind the watermark.
    pub event_retention_millis: i64,
    /// How long hourly metric rows are kept behind the watermark.
    pub metric_retention_millis: i64,
    /// Largest number of events in one ingest request.
    pub max_batch: usize,
    /// An acknowledged event is visible in reads within this time.
    pub freshness_millis: u64,
    /// `Cache-Control: public, max-age=` of ranking reads (SPEC 1.5): how long a CDN or browser may reuse
    /// an answer unasked. Default: the freshness bound rounded up to whole seconds, so a cached answer is
    /// never older than the freshness the service promises by more than that bound again.
    pub cache_max_age_seconds: u64,
    /// Upper bound on product entries across cached ranking spans.
    pub max_cached_members: usize,
    /// `redis://host:port/<stream key>`: also ingest from this Redis stream (consumer group).
    pub stream: Option<String>,
    /// Stream entries pending this long with another consumer (a dead instance) are reclaimed.
    pub stream_claim_idle_millis: u64,
    /// `postgres://…`: PostgreSQL as the rankings source of truth instead of SQLite in the data dir.
    pub database: Option<String>,
    /// PostgreSQL schema holding rankgate's tables.
    pub database_schema: String,
    /// Top-N-only serving (SPEC 1.7): Redis holds the top K of each ranking; `None` keeps every member.
    pub serving_depth: Option<usize>,
    /// How long serving keys outlive their span, and a replaced version stays readable.
    pub serving_grace_millis: i64,
    /// How long a hot span stays published in Redis after its last read on any instance; 0 publishes
    /// every hot span whether read or not (see [`super::serving`]'s demand).
    pub serving_idle_millis: i64,
    /// Ranking change streams (`GET …/top/events`): how many, how much buffer, how often a heartbeat.
    pub top_streams: TopStreamConfig,
    /// `[[webhook]]` tables, checked (secrets inside, never shown).
    pub webhooks: Vec<WebhookConfig>,
    /// `--kafka` / `kafka*` keys: also ingest from a Kafka topic (consumer group); `None` without brokers.
    pub kafka: Option<KafkaConfig>,
}

/// Bounds of the ranking change streams (see [`super::top_streams`]).
#[derive(Debug, Clone, Copy)]
pub struct TopStreamConfig {
    /// `max_top_streams`: streams open at once on this instance; past it, 429.
    pub max_streams: usize,
    /// `top_stream_buffer`: messages queued per stream; a client that lets more pile up is dropped.
    pub buffer: usize,
    /// `top_stream_heartbeat_millis`: between heartbeat comments.
    pub heartbeat_millis: u64,
}

impl Default for TopStreamConfig {
    fn default() -> Self {
        TopStreamConfig {
            max_streams: 10_000,
            buffer: 8,
            heartbeat_millis: 15_000,
        }
    }
}
