//! Configuration: defaults, then a TOML file, then `RANKGATE_*` environment variables, then flags.
//!
//! Flags and environment variables share one layer through clap (`#[arg(env)]`), so a flag wins over
//! its variable, and both win over the file. Secrets (bearer keys) are hashed as soon as they are read
//! and never printed: [`Config`]'s `Debug` shows only how many keys there are. `--help` never shows the
//! values of `RANKGATE_*` variables (a Redis or PostgreSQL URL may hold a password).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use rankgate_core::period::Zone;
use rankgate_store::synchronous::Synchronous;

pub use crate::http::auth::BearerKeys;
use crate::rankings::config::{RankingsConfig, TopStreamConfig};
use crate::rankings::ingest::kafka::{KafkaConfig, KafkaFile, KafkaOverrides, FILE_KEYS as KAFKA_FILE_KEYS};
use crate::rankings::webhooks::config::{webhooks_from_file, WebhookFile};
use crate::waiting_room::config::MemberAuth;
use crate::waiting_room::{GateConfig, WaitingRoomConfig};

/// The settings of a running service, after every layer is merged.
#[derive(Clone)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Directory of the embedded stores.
    pub data_dir: PathBuf,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// SHA-256 of each admin key; empty means admin endpoints answer loopback peers only.
    pub admin_keys: BearerKeys,
    /// SHA-256 of each ingest key; empty means ingest is open. Admin keys may ingest too.
    pub ingest_keys: BearerKeys,
    /// Waiting-room defaults and `[[gate]]` routes.
    pub waiting_room: WaitingRoomConfig,
    /// Redis URL(s) (one URL, several Cluster nodes, or one `redis+sentinel://` URL) for waiting-room state,
    /// jobs and the rankings serving store; embedded when empty.
    pub redis: Vec<String>,
    /// Key prefix of every Redis key rankgate writes.
    pub redis_prefix: String,
    /// Async runtime worker threads of `rankgate serve`; `None` = one per core.
    pub worker_threads: Option<usize>,
    /// Listener bounds: header and body deadlines, connection limit.
    pub http: HttpConfig,
    /// `synchronous` level of the embedded SQLite databases (`rankings.sqlite3`, `queue.sqlite3`).
    pub sqlite_synchronous: Synchronous,
    /// The rankings' settings (SPEC Part 1).
    pub rankings: RankingsConfig,
}

/// `value` of config key `key` within `range`, or an error naming the key.
pub(crate) fn bounded<T: PartialOrd + std::fmt::Display + Copy>(
    key: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
) -> anyhow::Result<T> {
    anyhow::ensure!(
        range.contains(&value),
        "{key} must be {} to {}, got {value}",
        range.start(),
        range.end()
    );
    Ok(value)
}

/// The HTTP listener's bounds (issue 9, defect 6); see [`crate::http::edge`].
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct HttpConfig {
    /// `http_header_timeout_millis`: a request head must arrive within this; also the keep-alive idle
    /// timeout.
    #[serde(rename = "http_header_timeout_millis")]
    pub header_timeout_millis: u64,
    /// `http_body_timeout_millis`: a request body must arrive in full within this of its head (408).
    #[serde(rename = "http_body_timeout_millis")]
    pub body_timeout_millis: u64,
    /// `max_connections`: connections served at once; past it a connection waits briefly, then 503.
    pub max_connections: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            header_timeout_millis: 10_000,
            body_timeout_millis: 30_000,
            max_connections: 4_096,
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("data_dir", &self.data_dir)
            .field("admin_keys", &self.admin_keys.len())
            .field("ingest_keys", &self.ingest_keys.len())
            .field(
                "database",
                &self.rankings.database.as_ref().map(|_| "postgres (url hidden)"),
            )
            .field("redis", &self.redis.len())
            .finish_non_exhaustive()
    }
}

/// The TOML file's shape. Every field is optional; missing ones keep their defaults. Unknown keys are
/// reported in the log rather than refused, so a config written for a newer version still starts.
#[derive(Debug, Default, Deserialize)]
pub struct FileConfig {
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    time_zone: Option<String>,
    max_future_seconds: Option<i64>,
    max_lateness_hours: Option<i64>,
    event_retention_hours: Option<i64>,
    metric_retention_days: Option<i64>,
    max_batch: Option<usize>,
    max_body_bytes: Option<usize>,
    freshness_millis: Option<u64>,
    cache_max_age_seconds: Option<u64>,
    max_cached_members: Option<usize>,
    #[serde(default)]
    admin_keys: Vec<String>,
    #[serde(default)]
    ingest_keys: Vec<String>,
    #[serde(default)]
    waiting_room: WaitingRoomConfig,
    #[serde(default)]
    gate: Vec<GateConfig>,
    stream: Option<String>,
    stream_claim_idle_millis: Option<u64>,
    database: Option<String>,
    database_schema: Option<String>,
    #[serde(default)]
    redis: Vec<String>,
    redis_prefix: Option<String>,
    serving_depth: Option<usize>,
    serving_grace_seconds: Option<i64>,
    serving_idle_seconds: Option<i64>,
    worker_threads: Option<usize>,
    #[serde(flatten)]
    http: HttpConfig,
    sqlite_synchronous: Option<String>,
    max_top_streams: Option<usize>,
    top_stream_buffer: Option<usize>,
    top_stream_heartbeat_millis: Option<u64>,
    #[serde(default)]
    webhook: Vec<WebhookFile>,
    #[serde(flatten)]
    kafka: KafkaFile,
}

/// Values given on the command line or in `RANKGATE_*` variables, whichever command took them: each command
/// takes only its own options (see [`crate::cli::options`]), then hands them over as one `Overrides`.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--config`.
    pub config: Option<PathBuf>,
    /// `--time-zone`.
    pub time_zone: Option<String>,
    /// `--admin-keys` (never logged).
    pub admin_keys: Option<Vec<String>>,
    /// `--database` (never logged).
    pub database: Option<String>,
    /// `--database-schema`.
    pub database_schema: Option<String>,
    /// `--redis`.
    pub redis: Option<Vec<String>>,
    /// `--stream`.
    pub stream: Option<String>,
    /// `--ingest-keys` (never logged).
    pub ingest_keys: Option<Vec<String>>,
    /// `--token-secret` (never logged).
    pub token_secret: Option<String>,
    /// `--token-secret-file`.
    pub token_secret_file: Option<PathBuf>,
    /// `--sqlite-synchronous`.
    pub sqlite_synchronous: Option<String>,
    /// `--cache-max-age-seconds`.
    pub cache_max_age_seconds: Option<u64>,
    /// `--kafka`, `--kafka-topic`, `--kafka-group` (see [`crate::rankings::ingest::kafka`]).
    pub kafka: KafkaOverrides,
}

const HOUR_MILLIS: i64 = 3_600_000;
/// Largest `max_future_seconds`: a week (see where it is read).
const MAX_FUTURE_SECONDS: i64 = 7 * 24 * 3600;

/// Largest `cache_max_age_seconds`: a year, the most RFC 9111 caches are expected to honour anyway.
const MAX_CACHE_MAX_AGE_SECONDS: u64 = 31_536_000;

impl Config {
    /// Merges defaults, the file named by `overrides.config` (if any), and the overrides.
    pub fn load(overrides: &Overrides) -> anyhow::Result<Config> {
        let file = match &overrides.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        Config::merge(file, overrides)
    }

    fn merge(file: FileConfig, overrides: &Overrides) -> anyhow::Result<Config> {
        let zone_name = overrides
            .time_zone
            .clone()
            .or(file.time_zone)
            .unwrap_or_else(|| "UTC".into());
        let zone = Zone::parse(&zone_name).map_err(|e| anyhow::anyhow!("time_zone: {e}"))?;
        let max_lateness_millis = millis_of(
            "max_lateness_hours",
            file.max_lateness_hours.unwrap_or(35 * 24),
            HOUR_MILLIS,
        )?;
        let event_retention_millis = millis_of(
            "event_retention_hours",
            file.event_retention_hours.unwrap_or(35 * 24),
            HOUR_MILLIS,
        )?;
        anyhow::ensure!(
            event_retention_millis >= max_lateness_millis,
            "event_retention_hours must be at least max_lateness_hours, or a late event could be counted twice"
        );
        let sqlite_synchronous = match (&overrides.sqlite_synchronous, &file.sqlite_synchronous) {
            (Some(raw), _) => raw.parse::<Synchronous>().map_err(|e| {
                anyhow::anyhow!(
                    "sqlite_synchronous (--sqlite-synchronous / RANKGATE_SQLITE_SYNCHRONOUS): {e}"
                )
            })?,
            (None, Some(raw)) => raw
                .parse::<Synchronous>()
                .map_err(|e| anyhow::anyhow!("sqlite_synchronous: {e}"))?,
            (None, None) => Synchronous::default(),
        };
        let mut waiting_room = file.waiting_room;
        waiting_room.gates.extend(file.gate);
        waiting_room.validate_pages()?;
        waiting_room.member_auth = MemberAuth::from_file(&mut waiting_room.member_auth_file)?;
        waiting_room.resolve_entry_guards()?;
        // A secret from the command line or the environment replaces the file's, in whichever form.
        if overrides.token_secret.is_some() || overrides.token_secret_file.is_some() {
            waiting_room.token_secret = overrides.token_secret.clone();
            waiting_room.token_secret_file = overrides.token_secret_file.clone();
        }
        // The legacy `[waiting_room] fsync_every_commit` still decides for the queue database when given.
        waiting_room.synchronous = match waiting_room.fsync_every_commit {
            Some(true) => Synchronous::Full,
            Some(false) => Synchronous::Normal,
            None => sqlite_synchronous,
        };
        let metric_retention_millis = millis_of(
            "metric_retention_days",
            file.metric_retention_days.unwrap_or(400),
            24 * HOUR_MILLIS,
        )?;
        let stream_defaults = TopStreamConfig::default();
        let top_streams = TopStreamConfig {
            max_streams: bounded(
                "max_top_streams",
                file.max_top_streams.unwrap_or(stream_defaults.max_streams),
                1..=1_000_000,
            )?,
            buffer: bounded(
                "top_stream_buffer",
                file.top_stream_buffer.unwrap_or(stream_defaults.buffer),
                1..=1_024,
            )?,
            heartbeat_millis: bounded(
                "top_stream_heartbeat_millis",
                file.top_stream_heartbeat_millis
                    .unwrap_or(stream_defaults.heartbeat_millis),
                100..=3_600_000,
            )?,
        };
        let webhooks = webhooks_from_file(file.webhook, &zone, metric_retention_millis)?;
        let kafka = KafkaConfig::merge(&overrides.kafka, file.kafka)?;
        let freshness_millis = file.freshness_millis.unwrap_or(1000);
        let cache_max_age_seconds = match overrides.cache_max_age_seconds.or(file.cache_max_age_seconds) {
            Some(seconds) if seconds > MAX_CACHE_MAX_AGE_SECONDS => anyhow::bail!(
                "cache_max_age_seconds (--cache-max-age-seconds / RANKGATE_CACHE_MAX_AGE_SECONDS) must be at \
                 most {MAX_CACHE_MAX_AGE_SECONDS} (one year), got {seconds}"
            ),
            Some(seconds) => seconds,
            None => freshness_millis.div_ceil(1000),
        };
        Ok(Config {
            listen: overrides
                .listen
                .or(file.listen)
                .unwrap_or_else(|| "127.0.0.1:8080".parse().expect("valid")),
            data_dir: overrides
                .data_dir
                .clone()
                .or(file.data_dir)
                .unwrap_or_else(|| "./rankgate-data".into()),
            max_body_bytes: file.max_body_bytes.unwrap_or(16 * 1024 * 1024),
            admin_keys: BearerKeys::from_plain(overrides.admin_keys.as_deref().unwrap_or(&file.admin_keys)),
            ingest_keys: BearerKeys::from_plain(
                overrides.ingest_keys.as_deref().unwrap_or(&file.ingest_keys),
            ),
            waiting_room,
            redis: redis_urls(overrides.redis.clone(), file.redis)?,
            redis_prefix: file.redis_prefix.unwrap_or_else(|| "rankgate:".into()),
            worker_threads: match file.worker_threads {
                Some(0) => anyhow::bail!("worker_threads must be at least 1 (leave it out for one per core)"),
                threads => threads,
            },
            http: file.http,
            sqlite_synchronous,
            rankings: RankingsConfig {
                zone,
                // Bounded to a week: `trending` weighs an hour after its span's end hour by 2^(hours / half-life),
                // so events far in the future with a short half-life would overflow a score to infinity.
                max_future_millis: millis_of(
                    "max_future_seconds",
                    bounded(
                        "max_future_seconds",
                        file.max_future_seconds.unwrap_or(300),
                        0..=MAX_FUTURE_SECONDS,
                    )?,
                    1000,
                )?,
                max_lateness_millis,
                event_retention_millis,
                metric_retention_millis,
                max_batch: file.max_batch.unwrap_or(10_000),
                freshness_millis,
                cache_max_age_seconds,
                max_cached_members: file.max_cached_members.unwrap_or(5_000_000),
                stream: overrides.stream.clone().or(file.stream),
                stream_claim_idle_millis: file.stream_claim_idle_millis.unwrap_or(30_000).max(1),
                database: overrides.database.clone().or(file.database),
                database_schema: overrides
                    .database_schema
                    .clone()
                    .or(file.database_schema)
                    .unwrap_or_else(|| "rankgate".into()),
                serving_depth: match file.serving_depth {
                    Some(0) => {
                        anyhow::bail!("serving_depth must be at least 1 (leave it out to serve every member)")
                    }
                    depth => depth,
                },
                serving_grace_millis: millis_of(
                    "serving_grace_seconds",
                    file.serving_grace_seconds.unwrap_or(3600).max(1),
                    1000,
                )?,
                serving_idle_millis: millis_of(
                    "serving_idle_seconds",
                    file.serving_idle_seconds.unwrap_or(DEFAULT_SERVING_IDLE_SECONDS),
                    1000,
                )?,
                top_streams,
                webhooks,
                kafka,
            },
        })
    }

    /// Where the rankings keep their data: the data dir, SQLite's durability, Redis.
    pub fn rankings_storage(&self) -> crate::rankings::Storage {
        crate::rankings::Storage {
            data_dir: self.data_dir.clone(),
            sqlite_synchronous: self.sqlite_synchronous,
            redis: self.redis.clone(),
            redis_prefix: self.redis_prefix.clone(),
        }
    }

    /// Defaults for tests and tools: everything embedded under `data_dir`, listening on port 0.
    pub fn for_data_dir(data_dir: &Path) -> Config {
        let overrides = Overrides {
            listen: Some("127.0.0.1:0".parse().expect("valid")),
            data_dir: Some(data_dir.to_path_buf()),
            ..Overrides::default()
        };
        Config::merge(FileConfig::default(), &overrides).expect("defaults are valid")
    }
}

/// The `redis` setting, from the flag (split at commas by clap, so a sentinel URL's own list of sentinels
/// is joined back) or the file, checked before anything connects: a bad URL stops the start with an error
/// naming the setting and never showing a password.
fn redis_urls(flag: Option<Vec<String>>, file: Vec<String>) -> anyhow::Result<Vec<String>> {
    let (urls, source) = match flag {
        Some(urls) => (
            rankgate_store::redis_sentinel::join_split_sentinel_url(urls),
            " (--redis / RANKGATE_REDIS)",
        ),
        None => (file, ""),
    };
    rankgate_store::redis_sentinel::check_redis_urls(&urls)
        .map_err(|error| anyhow::anyhow!("{error}{source}"))?;
    Ok(urls)
}

/// A duration given in whole `unit_millis` as milliseconds. A negative one, or one whose milliseconds do not
/// fit an `i64` (it would wrap into a negative or tiny bound in a release build), is refused naming `key`.
/// How long a hot span stays published in Redis after its last read (`serving_idle_seconds`): long
/// enough that a ranking a shop shows at all is read again well within it.
const DEFAULT_SERVING_IDLE_SECONDS: i64 = 600;

fn millis_of(key: &str, value: i64, unit_millis: i64) -> anyhow::Result<i64> {
    anyhow::ensure!(value >= 0, "{key} must not be negative, got {value}");
    value.checked_mul(unit_millis).ok_or_else(|| {
        anyhow::anyhow!(
            "{key} is too large: at most {}, got {value}",
            i64::MAX / unit_millis
        )
    })
}

/// Top-level keys of the config file.
const KNOWN_KEYS: [&str; 34] = [
    "listen",
    "data_dir",
    "time_zone",
    "max_future_seconds",
    "max_lateness_hours",
    "event_retention_hours",
    "metric_retention_days",
    "max_batch",
    "max_body_bytes",
    "freshness_millis",
    "cache_max_age_seconds",
    "max_cached_members",
    "admin_keys",
    "ingest_keys",
    "waiting_room",
    "gate",
    "stream",
    "stream_claim_idle_millis",
    "database",
    "database_schema",
    "redis",
    "redis_prefix",
    "serving_depth",
    "serving_grace_seconds",
    "serving_idle_seconds",
    "worker_threads",
    "http_header_timeout_millis",
    "http_body_timeout_millis",
    "max_connections",
    "sqlite_synchronous",
    "max_top_streams",
    "top_stream_buffer",
    "top_stream_heartbeat_millis",
    "webhook",
];

fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))?;
    let known = |key: &str| KNOWN_KEYS.contains(&key) || KAFKA_FILE_KEYS.contains(&key);
    for key in table.keys().filter(|key| !known(key.as_str())) {
        tracing::warn!(key = key.as_str(), file = %path.display(), "unknown config key ignored");
    }
    toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_url_split_by_the_flag_is_joined_and_bad_ones_are_refused_without_the_password() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            options: crate::cli::options::ServeOptions,
        }
        let parsed = Flags::try_parse_from([
            "rankgate",
            "--redis",
            "redis+sentinel://:pw@127.0.0.1:26379,127.0.0.1:26380/mymaster",
        ])
        .unwrap();
        let overrides = parsed.options.into_overrides().unwrap();
        let config = Config::merge(FileConfig::default(), &overrides).unwrap();
        assert_eq!(
            config.redis,
            vec!["redis+sentinel://:pw@127.0.0.1:26379,127.0.0.1:26380/mymaster".to_string()]
        );
        let file: FileConfig = toml::from_str("redis = [\"redis+sentinel://h:1,h:2/m\"]").unwrap();
        assert_eq!(Config::merge(file, &Overrides::default()).unwrap().redis.len(), 1);
        for bad in [
            "redis+sentinel://:hunter22@h:1,h:70000/mymaster",
            "redis+sentinel://:hunter22@h:1",
            "redis+sentinel://:hunter22@/mymaster",
        ] {
            let overrides = Overrides {
                redis: Some(bad.split(',').map(str::to_string).collect()),
                ..Overrides::default()
            };
            let error = Config::merge(FileConfig::default(), &overrides)
                .unwrap_err()
                .to_string();
            assert!(error.contains("redis") && error.contains("--redis"), "{error}");
            assert!(!error.contains("hunter22"), "{error}");
        }
    }

    #[test]
    fn flags_win_over_the_file() {
        let file: FileConfig =
            toml::from_str("listen = \"127.0.0.1:9000\"\ntime_zone = \"Asia/Tokyo\"").unwrap();
        let overrides = Overrides {
            listen: Some("127.0.0.1:9100".parse().unwrap()),
            ..Overrides::default()
        };
        let config = Config::merge(file, &overrides).unwrap();
        assert_eq!(config.listen.port(), 9100);
    }

    #[test]
    fn gate_tables_accept_the_shorthand_and_unknown_keys_do_not_stop_a_start() {
        let file: FileConfig = toml::from_str(
            "some_future_key = 1\n[[gate]]\nqueue = \"sale\"\nupstream_url = \"http://127.0.0.1:9\"\nmethod = \"POST\"\npath = \"/orders\"\n",
        )
        .unwrap();
        let config = Config::merge(file, &Overrides::default()).unwrap();
        let gate = &config.waiting_room.gates[0];
        assert_eq!(gate.upstream, "http://127.0.0.1:9");
        assert_eq!(
            (gate.routes[0].method.as_str(), gate.routes[0].path.as_str()),
            ("POST", "/orders")
        );
    }

    #[test]
    fn cache_max_age_defaults_to_the_freshness_bound_rounded_up_and_is_bounded() {
        let config = |text: &str, overrides: &Overrides| {
            Config::merge(toml::from_str(text).unwrap(), overrides).map(|c| c.rankings.cache_max_age_seconds)
        };
        let none = Overrides::default();
        assert_eq!(config("", &none).unwrap(), 1);
        assert_eq!(config("freshness_millis = 1500", &none).unwrap(), 2);
        assert_eq!(config("freshness_millis = 200", &none).unwrap(), 1);
        assert_eq!(config("cache_max_age_seconds = 0", &none).unwrap(), 0);
        let flag = Overrides {
            cache_max_age_seconds: Some(30),
            ..Overrides::default()
        };
        assert_eq!(
            config("cache_max_age_seconds = 5", &flag).unwrap(),
            30,
            "the flag wins"
        );
        let error = config("cache_max_age_seconds = 31536001", &none)
            .unwrap_err()
            .to_string();
        assert!(error.contains("cache_max_age_seconds"), "{error}");
    }

    #[test]
    fn retention_shorter_than_lateness_is_refused() {
        let file: FileConfig = toml::from_str("event_retention_hours = 10\nmax_lateness_hours = 20").unwrap();
        let error = Config::merge(file, &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(error.contains("event_retention_hours"), "{error}");
    }

    #[test]
    fn config_durations_that_overflow_or_are_negative_are_refused_naming_the_key() {
        // Found writing the config-file fuzz target: `max_lateness_hours = 9223372036854775807` overflowed the
        // multiplication to milliseconds (a panic in debug builds, a wrapped bound in release builds).
        for (text, key) in [
            ("max_lateness_hours = 9223372036854775807", "max_lateness_hours"),
            (
                "event_retention_hours = 9223372036854775807",
                "event_retention_hours",
            ),
            ("metric_retention_days = 106751991167301", "metric_retention_days"),
            ("max_future_seconds = 9223372036854775807", "max_future_seconds"),
            (
                "serving_grace_seconds = 9223372036854775807",
                "serving_grace_seconds",
            ),
            (
                "serving_idle_seconds = 9223372036854775807",
                "serving_idle_seconds",
            ),
            ("serving_idle_seconds = -1", "serving_idle_seconds"),
            ("max_future_seconds = -1", "max_future_seconds"),
            ("max_future_seconds = 604801", "max_future_seconds"),
            ("max_lateness_hours = -5", "max_lateness_hours"),
            ("metric_retention_days = -1", "metric_retention_days"),
        ] {
            let file: FileConfig = toml::from_str(text).unwrap();
            let error = Config::merge(file, &Overrides::default())
                .unwrap_err()
                .to_string();
            assert!(error.starts_with(key), "{text}: {error}");
        }
        let file: FileConfig = toml::from_str("metric_retention_days = 106751991167").unwrap();
        assert!(
            Config::merge(file, &Overrides::default()).is_ok(),
            "the largest that fits is accepted"
        );
    }

    #[test]
    fn http_limits_come_from_the_file_and_default_when_absent() {
        let defaults = Config::merge(FileConfig::default(), &Overrides::default()).unwrap();
        assert_eq!(
            (
                defaults.http.header_timeout_millis,
                defaults.http.body_timeout_millis,
                defaults.http.max_connections
            ),
            (10_000, 30_000, 4_096)
        );
        let file: FileConfig = toml::from_str(
            "http_header_timeout_millis = 500\nhttp_body_timeout_millis = 700\nmax_connections = 9",
        )
        .unwrap();
        let config = Config::merge(file, &Overrides::default()).unwrap();
        assert_eq!(
            (
                config.http.header_timeout_millis,
                config.http.body_timeout_millis,
                config.http.max_connections
            ),
            (500, 700, 9)
        );
    }

    #[test]
    fn member_auth_is_resolved_at_load_and_a_bad_one_is_refused_naming_the_key() {
        let parse = |text: &str| Config::merge(toml::from_str(text).unwrap(), &Overrides::default());
        assert_eq!(parse("").unwrap().waiting_room.member_auth.name(), "ticket");
        let config = parse(
            "[waiting_room]\nmember_auth = \"gateway\"\ngateway_keys = [\"gw-topsecret\"]\n\
             trusted_proxies = [\"10.0.0.0/8\"]",
        )
        .unwrap();
        assert_eq!(config.waiting_room.member_auth.name(), "gateway");
        assert!(
            config.waiting_room.member_auth_file.gateway_keys.is_empty(),
            "only the hashes stay"
        );
        assert!(!format!("{config:?} {:?}", config.waiting_room).contains("topsecret"));
        for (text, key) in [
            (
                "[waiting_room]\nmember_auth = \"none\"",
                "waiting_room.member_auth",
            ),
            (
                "[waiting_room]\nmember_auth = \"gateway\"",
                "waiting_room.member_auth",
            ),
            (
                "[waiting_room]\nmember_auth = \"gateway\"\ntrusted_proxies = [\"10.0.0.0/40\"]",
                "waiting_room.trusted_proxies[0]",
            ),
            (
                "[waiting_room]\nmember_auth = \"jwt\"",
                "waiting_room.member_auth",
            ),
            (
                "[waiting_room]\nmember_auth = \"jwt\"\n[waiting_room.jwt]\nalgorithms = [\"none\"]",
                "waiting_room.jwt.algorithms[0]",
            ),
        ] {
            let error = format!("{:#}", parse(text).unwrap_err());
            assert!(error.starts_with(key), "{text}: {error}");
        }
    }

    #[test]
    fn sqlite_synchronous_defaults_to_full_and_an_invalid_value_is_refused_naming_the_key() {
        let config = Config::merge(FileConfig::default(), &Overrides::default()).unwrap();
        assert_eq!(config.sqlite_synchronous, Synchronous::Full);
        assert_eq!(
            config.waiting_room.synchronous,
            Synchronous::Full,
            "one key for both databases"
        );

        let file: FileConfig = toml::from_str("sqlite_synchronous = \"normal\"").unwrap();
        let config = Config::merge(file, &Overrides::default()).unwrap();
        assert_eq!(config.sqlite_synchronous, Synchronous::Normal);
        assert_eq!(config.waiting_room.synchronous, Synchronous::Normal);

        // The environment / flag layer wins over the file.
        let file: FileConfig = toml::from_str("sqlite_synchronous = \"normal\"").unwrap();
        let overrides = Overrides {
            sqlite_synchronous: Some("FULL".into()),
            ..Overrides::default()
        };
        assert_eq!(
            Config::merge(file, &overrides).unwrap().sqlite_synchronous,
            Synchronous::Full
        );

        // The deprecated queue-only key still decides for the queue database.
        let file: FileConfig =
            toml::from_str("sqlite_synchronous = \"full\"\n[waiting_room]\nfsync_every_commit = false")
                .unwrap();
        let config = Config::merge(file, &Overrides::default()).unwrap();
        assert_eq!(
            (config.sqlite_synchronous, config.waiting_room.synchronous),
            (Synchronous::Full, Synchronous::Normal)
        );

        let file: FileConfig = toml::from_str("sqlite_synchronous = \"off\"").unwrap();
        let error = Config::merge(file, &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("sqlite_synchronous: "), "{error}");
        assert!(error.contains("\"full\""), "the hint names the values: {error}");
        let overrides = Overrides {
            sqlite_synchronous: Some("sometimes".into()),
            ..Overrides::default()
        };
        let error = Config::merge(FileConfig::default(), &overrides)
            .unwrap_err()
            .to_string();
        assert!(error.contains("RANKGATE_SQLITE_SYNCHRONOUS"), "{error}");
    }

    #[test]
    fn top_stream_bounds_come_from_the_file_and_a_bad_one_is_refused_naming_its_key() {
        let parse = |text: &str| Config::merge(toml::from_str(text).unwrap(), &Overrides::default());
        let defaults = parse("").unwrap().rankings.top_streams;
        assert_eq!(
            (defaults.max_streams, defaults.buffer, defaults.heartbeat_millis),
            (10_000, 8, 15_000)
        );
        let set = parse("max_top_streams = 5\ntop_stream_buffer = 2\ntop_stream_heartbeat_millis = 500\n")
            .unwrap()
            .rankings
            .top_streams;
        assert_eq!((set.max_streams, set.buffer, set.heartbeat_millis), (5, 2, 500));
        for (text, key) in [
            ("max_top_streams = 0", "max_top_streams"),
            ("top_stream_buffer = 0", "top_stream_buffer"),
            ("top_stream_buffer = 100000", "top_stream_buffer"),
            ("top_stream_heartbeat_millis = 1", "top_stream_heartbeat_millis"),
            ("[[webhook]]\nname = \"x\"", "webhook[0].url"),
        ] {
            let error = format!("{:#}", parse(text).err().unwrap());
            assert!(error.starts_with(key), "{text}: {error}");
        }
    }

    #[test]
    fn debug_never_shows_keys() {
        let overrides = Overrides {
            admin_keys: Some(vec!["topsecret".into()]),
            ..Overrides::default()
        };
        let config = Config::merge(FileConfig::default(), &overrides).unwrap();
        assert!(!format!("{config:?}").contains("topsecret"));
    }
}
