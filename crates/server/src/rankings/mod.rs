//! The rankings (SPEC Part 1): events → source of truth → serving → reads.
//!
//! # Layout
//! - [`Rankings`]: the product as the application holds it: opened from its settings, it owns the
//!   service, the reader, the streams, the webhooks and the ingest sources, and offers its routes
//!   ([`Rankings::public_routes`], [`Rankings::ingest_routes`], [`Rankings::admin_routes`]), its rank
//!   read for the fast path ([`Rankings::rank_reply`]) and its workers ([`Rankings::spawn_workers`]).
//! - [`service`]: [`RankingService`], the engine, the writer thread and what ingest and the command line
//!   call; [`policies`] (ranker versions as fleet state, the policy driver) and [`catalog`] (the
//!   catalogue and listing flags) are its other two jobs.
//! - [`writer`]: the one writer thread and its group commit.
//! - [`reader`]: every HTTP ranking read: routing between the engine and Redis, staleness, the response
//!   cache, the bodies.
//! - [`serving`]: Redis serving: the publisher and what this instance knows of the served generation.
//! - [`top_streams`]: `GET …/top/events`, ranking change streams (on [`crate::http::sse`]).
//! - [`webhooks`]: `[[webhook]]`, top-N changes detected, signed and delivered.
//! - [`routes`]: the HTTP handlers, one module per route group.
//! - [`workers`]: the background loops: refresher, follower of other instances, retention.
//! - [`ingest`]: the ingest sources besides HTTP: a file (`rankgate ingest`), Redis Streams and Kafka
//!   consumer groups.
//! - [`relay`]: `rankgate relay`, the transactional outbox relay.
//! - [`verify`]: the batch recompute compared with what is served; [`replay`]: the metrics rebuilt
//!   from the raw event log.
//! - [`config`]: the settings, [`RankingsConfig`].

pub mod catalog;
pub mod config;
pub mod ingest;
pub mod policies;
pub mod reader;
pub mod relay;
pub mod replay;
pub mod routes;
pub mod service;
pub mod serving;
pub mod top_streams;
pub mod verify;
pub mod webhooks;
pub mod workers;
pub mod writer;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::http::{HeaderValue, Method};
use axum::Router;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use rankgate_core::period::Hour;
use rankgate_store::clock::Clock;
use rankgate_store::queue::JobStore;
use rankgate_store::synchronous::Synchronous;

pub use self::config::RankingsConfig;
use self::ingest::kafka::consumer::KafkaConsumer;
use self::ingest::kafka::status::KafkaStatus;
use self::ingest::redis_streams::{StreamConfig, StreamConsumer};
pub use self::policies::PolicyChangeError;
use self::reader::RankingsReader;
pub use self::service::{open_source, IngestCounts, RankingService};
use self::serving::Serving;
use self::top_streams::{TopStreamLimits, TopStreams};
use self::webhooks::Webhooks;
use crate::http::direct_reply::DirectReply;
use crate::http::entity_tag::IfNoneMatch;
use crate::http::route_table;

/// Where the rankings keep what they keep, in the infrastructure both products share.
#[derive(Debug, Clone)]
pub struct Storage {
    /// The data directory (`rankings.sqlite3` without `--database`, `webhooks.json`).
    pub data_dir: PathBuf,
    /// `synchronous` of the embedded SQLite database.
    pub sqlite_synchronous: Synchronous,
    /// Redis URL(s) for serving; empty: every read is the engine's.
    pub redis: Vec<String>,
    /// Key prefix of every Redis key.
    pub redis_prefix: String,
}

/// The rankings as the application holds them; cloned into every handler (each field is shared).
#[derive(Clone)]
pub struct Rankings {
    /// The service: engine, writer, policies, catalogue.
    pub service: Arc<RankingService>,
    /// Answers ranking reads (routing, fallback, staleness, response cache).
    pub reader: Arc<RankingsReader>,
    /// Ranking change streams (`GET …/top/events`): one watcher per watched ranking.
    pub top_streams: Arc<TopStreams>,
    /// `[[webhook]]`: change detection and delivery.
    pub webhooks: Arc<Webhooks>,
    /// The Kafka consumer's assignment and lag (`--kafka`), for `/readyz` and `/metrics`.
    pub kafka: Option<Arc<KafkaStatus>>,
    /// The settings.
    pub config: Arc<RankingsConfig>,
    /// Server clock (a manual one in tests).
    pub clock: Arc<dyn Clock>,
    /// `Cache-Control` of cacheable reads, made once from `cache_max_age_seconds`.
    pub cache_control: HeaderValue,
    /// Largest request body (an ingest body inflates to at most this).
    pub max_body_bytes: usize,
    /// The consumers of `--stream` and `--kafka`, started with the workers.
    sources: Arc<parking_lot::Mutex<IngestSources>>,
}

/// Ingest sources opened with the rankings, run by [`Rankings::spawn_workers`].
#[derive(Default)]
struct IngestSources {
    kafka: Option<KafkaConsumer>,
    stream: Option<StreamConsumer>,
}

impl Rankings {
    /// Opens the source of truth (restoring the engine from it), Redis serving with `storage.redis`, the
    /// webhooks (delivered through `jobs`, the waiting room's job store) and the ingest sources. Nothing
    /// runs until [`Rankings::spawn_workers`].
    pub async fn open(
        config: RankingsConfig,
        storage: &Storage,
        jobs: &Arc<dyn JobStore>,
        max_body_bytes: usize,
        clock: Arc<dyn Clock>,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Rankings> {
        let started = std::time::Instant::now();
        let (service, _writer_thread) = {
            let (config, storage) = (config.clone(), storage.clone());
            tokio::task::spawn_blocking(move || RankingService::open(&config, &storage)).await??
        };
        // `trending` ends running periods at the current hour of this server's clock.
        service
            .engine()
            .write()
            .advance_to_hour(Hour::from_millis(clock.now_millis()));
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "rankings restored from the source of truth"
        );
        if !storage.redis.is_empty() {
            let serving = Serving::connect(&config, storage)
                .await
                .context("opening the rankings serving store on Redis (check --redis)")?;
            service.attach_serving(serving);
        }
        let reader = Arc::new(RankingsReader::new(
            service.clone(),
            clock.clone(),
            config.zone.clone(),
        ));
        let top_streams = Arc::new(TopStreams::new(
            reader.clone(),
            clock.clone(),
            config.zone.clone(),
            config.metric_retention_millis,
            TopStreamLimits {
                max_streams: config.top_streams.max_streams,
                buffer: config.top_streams.buffer,
                heartbeat: Duration::from_millis(config.top_streams.heartbeat_millis),
                freshness: Duration::from_millis(config.freshness_millis.max(1)),
            },
            shutdown.clone(),
        ));
        let webhooks = Arc::new(webhooks::open(&config, storage, jobs, &reader, &clock).await?);
        let kafka = match &config.kafka {
            Some(kafka) => Some(
                KafkaConsumer::connect(
                    kafka.clone(),
                    service.clone(),
                    clock.clone(),
                    config.max_future_millis,
                )
                .await?,
            ),
            None => None,
        };
        let stream = match &config.stream {
            Some(url) => Some(
                StreamConsumer::connect(
                    StreamConfig {
                        min_idle: Duration::from_millis(config.stream_claim_idle_millis),
                        ..StreamConfig::from_url(url)?
                    },
                    service.clone(),
                    clock.clone(),
                    config.max_future_millis,
                )
                .await?,
            ),
            None => None,
        };
        Ok(Rankings {
            kafka: kafka.as_ref().map(KafkaConsumer::status),
            cache_control: routes::reads::cache_control(config.cache_max_age_seconds),
            service,
            reader,
            top_streams,
            webhooks,
            config: Arc::new(config),
            clock,
            max_body_bytes,
            sources: Arc::new(parking_lot::Mutex::new(IngestSources { kafka, stream })),
        })
    }

    /// Starts the background work: the refresher, retention, the policy driver, the Redis publisher,
    /// the follower of other instances (with a shared source of truth), webhook detection and delivery,
    /// and the ingest sources. Each stops when `shutdown` is cancelled.
    pub fn spawn_workers(&self, shutdown: &CancellationToken) -> Vec<JoinHandle<()>> {
        let mut spawned = vec![
            tokio::spawn(workers::run_refresher_until_stopped(
                self.clone(),
                shutdown.clone(),
            )),
            tokio::spawn(workers::run_retention_until_stopped(
                self.clone(),
                shutdown.clone(),
            )),
            // Keeps the engine on the shared policy state (and resumes a build a crash interrupted).
            tokio::spawn(self.service.clone().run_policy_driver(shutdown.clone())),
        ];
        if let Some(serving) = self.service.serving() {
            spawned.push(tokio::spawn(serving::run_until_stopped(
                self.service.clone(),
                serving.clone(),
                self.clock.clone(),
                self.config.freshness_millis,
                shutdown.clone(),
            )));
        }
        if self.config.database.is_some() {
            spawned.push(tokio::spawn(workers::run_follower_until_stopped(
                self.clone(),
                shutdown.clone(),
            )));
        }
        if !self.webhooks.is_empty() {
            spawned.extend(self.webhooks.spawn_workers(shutdown.clone()));
        }
        let mut sources = self.sources.lock();
        if let Some(stream) = sources.stream.take() {
            spawned.push(tokio::spawn(stream.run_until_stopped(shutdown.clone())));
        }
        if let Some(kafka) = sources.kafka.take() {
            spawned.push(tokio::spawn(kafka.run_until_stopped(shutdown.clone())));
        }
        spawned
    }

    /// Reads and their streams, open to anyone.
    pub fn public_routes(&self) -> Router {
        route_table::router_of(routes::PUBLIC).with_state(self.clone())
    }

    /// `POST /v1/events`; the caller adds the ingest guard.
    pub fn ingest_routes(&self) -> Router {
        route_table::router_of(routes::INGEST).with_state(self.clone())
    }

    /// Rankers, rebuilds, webhooks and the catalogue; the caller adds the admin guard.
    pub fn admin_routes(&self) -> Router {
        route_table::router_of(routes::ADMIN).with_state(self.clone())
    }

    /// The (method, path) pairs of every route above, from the tables they are built from.
    pub fn endpoints() -> impl Iterator<Item = (Method, &'static str)> {
        route_table::methods_and_paths(routes::PUBLIC)
            .chain(route_table::methods_and_paths(routes::INGEST))
            .chain(route_table::methods_and_paths(routes::ADMIN))
    }

    /// The rank read as its route answers it, for the fast path: `product` is the path segment,
    /// `query` the raw query string.
    pub async fn rank_reply(
        &self,
        product: &str,
        query: Option<&str>,
        if_none_match: &IfNoneMatch,
    ) -> DirectReply {
        routes::reads::rank_reply(self, product, query, if_none_match).await
    }

    /// The product id of a rank read the fast path may answer (see [`routes::reads::direct_rank_product`]).
    pub fn direct_rank_product(path: &str) -> Option<&str> {
        routes::reads::direct_rank_product(path)
    }

    /// Redis serving's state by the one staleness rule (see [`serving`]), when Redis serves.
    pub fn serving_status(&self) -> Option<serving::ServingStatus> {
        let serving = self.service.serving()?;
        Some(serving.status(self.service.engine().read().as_of_millis()))
    }

    /// Waits for the writer to drain (every earlier command has been applied): whether ingest works.
    pub async fn barrier(&self) -> anyhow::Result<()> {
        self.service.barrier().await
    }
}
