//! Each command's own options, so `--help` lists what that command reads and nothing else: `ingest` takes
//! the data's whereabouts ([`StoreOptions`]), `serve` takes those plus the server's ([`ServeOptions`]).
//! Every group turns into the one [`Overrides`] that [`Config::load`](crate::config::Config::load) merges
//! over the file and the defaults.
//!
//! Every option that has a `RANKGATE_*` variable hides the variable's value in `--help` (it may hold a
//! password or a key), so the hint reads `[env: RANKGATE_X]`.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::Overrides;
use crate::rankings::ingest::kafka::KafkaOverrides;

/// Where the data lives: what every command that opens the stores takes.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct StoreOptions {
    /// TOML configuration file
    #[arg(long, hide_env_values = true, env = "RANKGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data directory of the embedded stores [default: ./rankgate-data]
    #[arg(long, hide_env_values = true, env = "RANKGATE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// IANA time zone of calendar periods, whole-hour offsets only [default: UTC]
    #[arg(long, hide_env_values = true, env = "RANKGATE_TIME_ZONE")]
    pub time_zone: Option<String>,
    /// PostgreSQL source of truth instead of the data dir's SQLite, e.g.
    /// postgres://postgres@127.0.0.1:5432/shop (never logged)
    #[arg(long, hide_env_values = true, env = "RANKGATE_DATABASE")]
    pub database: Option<String>,
    /// PostgreSQL schema for rankgate's tables [default: rankgate]
    #[arg(long, hide_env_values = true, env = "RANKGATE_DATABASE_SCHEMA")]
    pub database_schema: Option<String>,
    /// Durability of the embedded SQLite databases: "full" fsyncs every commit (survives power loss),
    /// "normal" only at checkpoints (survives a process crash) [default: full]
    #[arg(long, hide_env_values = true, env = "RANKGATE_SQLITE_SYNCHRONOUS")]
    pub sqlite_synchronous: Option<String>,
}

impl From<StoreOptions> for Overrides {
    fn from(options: StoreOptions) -> Overrides {
        let StoreOptions {
            config,
            data_dir,
            time_zone,
            database,
            database_schema,
            sqlite_synchronous,
        } = options;
        Overrides {
            config,
            data_dir,
            time_zone,
            database,
            database_schema,
            sqlite_synchronous,
            ..Overrides::default()
        }
    }
}

/// `--redis`, for the commands that reach the Redis store (`serve`, `rebuild`).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct RedisOption {
    /// Redis for waiting-room state, serving rankings and jobs: one URL (redis://host:port), comma-separated
    /// Cluster node URLs, or redis+sentinel://host:port[,host:port…]/<master name> for Sentinel (never
    /// logged)
    #[arg(long, hide_env_values = true, env = "RANKGATE_REDIS", value_delimiter = ',')]
    pub redis: Option<Vec<String>>,
}

/// `rebuild`'s options: the stores, and the Redis serving store to rebuild too.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct RebuildOptions {
    #[command(flatten)]
    pub(crate) store: StoreOptions,
    #[command(flatten)]
    pub(crate) redis: RedisOption,
}

impl From<RebuildOptions> for Overrides {
    fn from(options: RebuildOptions) -> Overrides {
        Overrides {
            redis: options.redis.redis,
            ..options.store.into()
        }
    }
}

/// `serve`'s options: the stores, and everything only a running server reads.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeOptions {
    /// Address to listen on, e.g. 0.0.0.0:8080 for every interface [default: 127.0.0.1:8080]
    #[arg(long, hide_env_values = true, env = "RANKGATE_LISTEN")]
    pub listen: Option<SocketAddr>,
    #[command(flatten)]
    pub(crate) store: StoreOptions,
    #[command(flatten)]
    pub(crate) redis: RedisOption,
    /// Comma-separated admin bearer keys (never logged)
    #[arg(
        long,
        hide_env_values = true,
        env = "RANKGATE_ADMIN_KEYS",
        value_delimiter = ','
    )]
    pub admin_keys: Option<Vec<String>>,
    /// Comma-separated ingest bearer keys (never logged)
    #[arg(
        long,
        hide_env_values = true,
        env = "RANKGATE_INGEST_KEYS",
        value_delimiter = ','
    )]
    pub ingest_keys: Option<Vec<String>>,
    /// Also ingest from a Redis stream: redis://host:port/<stream key> (consumer group `rankgate`)
    #[arg(long, hide_env_values = true, env = "RANKGATE_STREAM")]
    pub stream: Option<String>,
    /// Waiting-room token secret, 32 bytes in URL-safe base64 (never logged; prefer --token-secret-file)
    #[arg(long, hide_env_values = true, env = "RANKGATE_TOKEN_SECRET")]
    pub token_secret: Option<String>,
    /// File holding the waiting-room token secret, outside the data directory; required with --redis
    #[arg(long, hide_env_values = true, env = "RANKGATE_TOKEN_SECRET_FILE")]
    pub token_secret_file: Option<PathBuf>,
    /// `Cache-Control: public, max-age=N` seconds of ranking reads, 0 to 31536000 [default: the
    /// freshness bound rounded up to whole seconds]
    #[arg(long, hide_env_values = true, env = "RANKGATE_CACHE_MAX_AGE_SECONDS")]
    pub cache_max_age_seconds: Option<u64>,
    #[command(flatten)]
    pub(crate) kafka: KafkaOverrides,
    /// Not an option: says to use --listen (a common guess, answered with the right one)
    #[arg(long, hide = true)]
    pub port: Option<String>,
}

impl ServeOptions {
    /// The overrides `serve` hands to the configuration, or what to type instead of `--port`.
    pub fn into_overrides(self) -> anyhow::Result<Overrides> {
        if let Some(port) = self.port {
            let port = port.trim();
            let port = if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && port.len() <= 5 {
                port
            } else {
                "<port>"
            };
            anyhow::bail!(
                "serve has no --port: use --listen 127.0.0.1:{port} (or --listen 0.0.0.0:{port} to listen on \
                 every interface)"
            );
        }
        Ok(Overrides {
            listen: self.listen,
            admin_keys: self.admin_keys,
            redis: self.redis.redis,
            stream: self.stream,
            ingest_keys: self.ingest_keys,
            token_secret: self.token_secret,
            token_secret_file: self.token_secret_file,
            cache_max_age_seconds: self.cache_max_age_seconds,
            kafka: self.kafka,
            ..self.store.into()
        })
    }
}
