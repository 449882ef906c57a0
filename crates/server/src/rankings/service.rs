//! [`RankingService`]: what the HTTP routes, the ingest sources and the command line call.
//!
//! It owns the engine (shared, behind a read-write lock: reads of clean spans only take the shared side),
//! the writer thread (the only writer of the source of truth), the ranker policy state
//! ([`super::policies`]) and the catalogue ([`super::catalog`]). Reads over HTTP go through
//! [`super::reader::RankingsReader`], which owns routing, fallback, staleness, the response cache and the
//! reported policy version.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use parking_lot::{Mutex, RwLock};

use rankgate_core::event::Event;
use rankgate_core::ids::ProductId;
use rankgate_core::period::Hour;
use rankgate_core::policy::PolicyState;
use rankgate_core::ranker::RankerName;
use rankgate_store::clock::Clock;
use rankgate_store::ranking::catalog::CatalogEntry;
use rankgate_store::ranking::engine::{EngineConfig, RankAnswer, RankingEngine, RankingQuery, TopPage};
use rankgate_store::ranking::ingest::{EventOutcome, IngestConfig, Ingestor};
use rankgate_store::ranking::postgres::PostgresSource;
use rankgate_store::ranking::serving_store::{EngineRead, EngineServing};
use rankgate_store::ranking::source::SourceOfTruth;
use rankgate_store::ranking::sqlite::SqliteSource;

use super::config::RankingsConfig;
use super::serving;
use super::writer::WriterHandle;
use super::Storage;

/// The rankings half of rankgate.
pub struct RankingService {
    pub(super) engine: Arc<RwLock<RankingEngine>>,
    pub(super) writer: WriterHandle,
    /// The policy state of each configurable ranker ([`RankerName::CONFIGURABLE`] order) shared by every
    /// instance, as last committed here or read from the change feed (never older than what this instance
    /// has seen: [`PolicyState::observe`]).
    pub(super) policies: [Mutex<PolicyState>; RankerName::CONFIGURABLE.len()],
    /// Every catalogue entry (display fields and listing flag) as stored, kept current by this instance's
    /// writes and the change feed; the engine holds the listing flags it ranks by.
    pub(super) catalog: RwLock<HashMap<ProductId, CatalogEntry>>,
    /// Serializes this instance's builds (switches, rollbacks, rebuilds, following other instances), so
    /// two never interleave and the engine is installed in the order the builds decide.
    pub(super) switch_lock: tokio::sync::Mutex<()>,
    /// Wakes [`RankingService::run_policy_driver`] when the shared policy state changed.
    pub(super) policy_changed: tokio::sync::Notify,
    /// Bumped on every catalogue change (responses embed catalogue data).
    pub(super) catalog_generation: std::sync::atomic::AtomicU64,
    /// Redis serving (`--redis`), attached after opening.
    pub(super) serving: std::sync::OnceLock<Arc<serving::Serving>>,
    /// The source of truth's health for `/readyz`: commits (the writer records them) and probes.
    pub source_health: Arc<crate::readiness::SourceHealth>,
}

/// Per-batch counts, as `POST /v1/events` reports them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IngestCounts {
    /// Counted and durable.
    pub accepted: usize,
    /// Already counted before.
    pub duplicates: usize,
    /// Dropped for lateness.
    pub too_old: usize,
    /// Refused.
    pub rejected: usize,
}

impl IngestCounts {
    /// Adds one outcome.
    pub fn count(&mut self, outcome: &EventOutcome) {
        match outcome {
            EventOutcome::Accepted => self.accepted += 1,
            EventOutcome::Duplicate => self.duplicates += 1,
            EventOutcome::TooOld => self.too_old += 1,
            EventOutcome::Rejected(_) => self.rejected += 1,
        }
    }
}

impl RankingService {
    /// Opens the configured source of truth (SQLite in `storage.data_dir`, or PostgreSQL with
    /// `--database`) and rebuilds serving state from it. Blocking: call it off the async runtime.
    pub fn open(
        config: &RankingsConfig,
        storage: &Storage,
    ) -> anyhow::Result<(Arc<RankingService>, std::thread::JoinHandle<()>)> {
        let mut source = open_source(config, storage)?;
        // A no-op transition: stores the initial state of a ranker never configured, and reads the
        // shared one otherwise. A version still building (this instance crashed mid-build, or another
        // instance is building it now) is built again by the policy driver, which then completes it.
        let mut policies = Vec::new();
        for ranker in RankerName::CONFIGURABLE {
            policies.push(source.transition_policies(ranker, &mut |_| Ok(()))?);
        }
        let policies: [PolicyState; RankerName::CONFIGURABLE.len()] =
            policies.try_into().expect("one state per configurable ranker");
        let mut engine = RankingEngine::new(
            EngineConfig {
                zone: config.zone.clone(),
                max_cached_members: config.max_cached_members,
            },
            policies[configurable_index(RankerName::Popular)].active,
        );
        engine.set_trending_policy(policies[configurable_index(RankerName::Trending)].active);
        // The application moves it to its own clock; the command line (`rankgate top`, the demo) runs on
        // the system's.
        engine.advance_to_hour(Hour::from_millis(rankgate_store::clock::SystemClock.now_millis()));
        let engine = Arc::new(RwLock::new(engine));
        let mut ingestor = Ingestor::open(
            source,
            engine.clone(),
            IngestConfig {
                max_lateness_millis: config.max_lateness_millis,
            },
        )?;
        // The snapshot the engine was loaded from, so the change feed continues it exactly.
        let catalog = ingestor.take_loaded_catalog().into_iter().collect();
        let source_health = Arc::new(crate::readiness::SourceHealth::new(
            if config.database.is_some() {
                "postgres"
            } else {
                "sqlite"
            },
            config.database.clone(),
        ));
        let (writer, thread) = WriterHandle::spawn(ingestor, source_health.clone());
        let service = RankingService {
            engine,
            writer,
            policies: policies.map(Mutex::new),
            catalog: RwLock::new(catalog),
            switch_lock: tokio::sync::Mutex::new(()),
            policy_changed: tokio::sync::Notify::new(),
            catalog_generation: std::sync::atomic::AtomicU64::new(0),
            serving: std::sync::OnceLock::new(),
            source_health,
        };
        Ok((Arc::new(service), thread))
    }

    /// The shared engine.
    pub fn engine(&self) -> &Arc<RwLock<RankingEngine>> {
        &self.engine
    }

    /// Serves hot rankings from Redis from now on.
    pub fn attach_serving(&self, serving: Arc<serving::Serving>) {
        if self.serving.set(serving).is_err() {
            tracing::warn!("redis serving was already attached");
        }
    }

    /// Redis serving, when configured.
    pub fn serving(&self) -> Option<&Arc<serving::Serving>> {
        self.serving.get()
    }

    /// The writer handle.
    pub fn writer(&self) -> &WriterHandle {
        &self.writer
    }

    /// Ingests validated events; resolves once accepted events are durable.
    pub async fn ingest(&self, events: Vec<Event>, now_millis: i64) -> anyhow::Result<Vec<EventOutcome>> {
        let outcomes = self.writer.ingest(events, now_millis).await?;
        let mut counts = IngestCounts::default();
        outcomes.iter().for_each(|o| counts.count(o));
        metrics::counter!("rankgate_events_accepted_total").increment(counts.accepted as u64);
        metrics::counter!("rankgate_events_duplicate_total").increment(counts.duplicates as u64);
        metrics::counter!("rankgate_events_too_old_total").increment(counts.too_old as u64);
        metrics::counter!("rankgate_events_rejected_total").increment(counts.rejected as u64);
        Ok(outcomes)
    }

    /// A page of a ranking, building its span first when needed (in short lock holds, so ingest goes on
    /// meanwhile). Blocking: call it off the async runtime. Reads over HTTP go through
    /// [`reader::RankingsReader`].
    pub fn top(&self, query: &RankingQuery, offset: usize, limit: usize) -> TopPage {
        EngineServing::new(self.engine.clone())
            .top_with(query, offset, limit, EngineRead::BuildIfNeeded)
            .expect("a read allowed to build answers")
    }

    /// A product's rank; see [`RankingService::top`].
    pub fn rank(&self, query: &RankingQuery, product: &ProductId) -> RankAnswer {
        EngineServing::new(self.engine.clone())
            .rank_with(query, product, EngineRead::BuildIfNeeded)
            .expect("a read allowed to build answers")
    }

    /// Applies retention relative to the watermark, and drops cached spans no read may ask for any more
    /// by the server clock at `now_millis` (older than `metric_retention`, or ahead of the next hour).
    pub async fn apply_retention(
        &self,
        event_retention_millis: i64,
        metric_retention_millis: i64,
        now_millis: i64,
    ) -> anyhow::Result<usize> {
        let now = Hour::from_millis(now_millis);
        let oldest = Hour::from_millis(now_millis.saturating_sub(metric_retention_millis));
        self.engine.write().evict_spans_outside(oldest..now.plus(2));
        self.writer
            .run(move |ingestor| -> anyhow::Result<usize> {
                let Some(watermark) = ingestor.watermark_millis() else {
                    return Ok(0);
                };
                let events_before = Hour::from_millis(watermark - event_retention_millis);
                let metrics_before = Hour::from_millis(watermark - metric_retention_millis);
                Ok(ingestor.evict(events_before, metrics_before)?)
            })
            .await?
    }

    /// Waits for the writer to drain (every earlier command has been applied).
    pub async fn barrier(&self) -> anyhow::Result<()> {
        self.writer.run(|_| ()).await
    }

    /// Probes the source of truth on the writer thread (see [`crate::readiness`]) and records the outcome:
    /// a read probe, or a write probe while the last write failed. A probe that does not answer within
    /// [`crate::readiness::PROBE_TIMEOUT`] counts as down; it is still awaited, so probes never pile up
    /// behind a stuck writer.
    pub async fn probe_source_of_truth(&self) {
        let health = &self.source_health;
        let write = health.probe_must_write();
        let probe = self.writer.run(move |ingestor| {
            ingestor
                .source_mut()
                .probe(write)
                .map_err(|error| format!("probe failed: {error}"))
        });
        tokio::pin!(probe);
        let answer = match tokio::time::timeout(crate::readiness::PROBE_TIMEOUT, &mut probe).await {
            Ok(answer) => answer,
            Err(_) => {
                health.record_probe(
                    write,
                    Err(format!(
                        "no answer within {} s (the writer is stuck on the database)",
                        crate::readiness::PROBE_TIMEOUT.as_secs()
                    )),
                );
                probe.await
            }
        };
        let result = answer.map_err(|error| error.to_string()).and_then(|inner| inner);
        health.record_probe(write, result);
    }
}

/// Counts events refused as invalid before they reached the writer (a body's unparseable items, a
/// stream's or a topic's poison records): `rankgate_events_rejected_total` counts every refusal,
/// whichever stage made it ([`RankingService::ingest`] counts the writer's own).
pub(crate) fn count_events_rejected_before_ingest(count: usize) {
    if count > 0 {
        metrics::counter!("rankgate_events_rejected_total").increment(count as u64);
    }
}

/// Position of a configurable ranker in [`RankerName::CONFIGURABLE`] (and in the service's states).
/// `units` and `revenue` have no policy state; they map to `popular`'s, whose version they never report.
pub(super) fn configurable_index(ranker: RankerName) -> usize {
    RankerName::CONFIGURABLE
        .iter()
        .position(|r| *r == ranker)
        .unwrap_or(0)
}

/// Opens the configured source of truth: PostgreSQL when `--database` is set, else SQLite in the data
/// dir. Blocking (the PostgreSQL client runs its own small runtime): never call it from async code.
pub fn open_source(config: &RankingsConfig, storage: &Storage) -> anyhow::Result<Box<dyn SourceOfTruth>> {
    match &config.database {
        Some(url) => Ok(Box::new(
            PostgresSource::connect(url, &config.database_schema)
                .context("connecting to the PostgreSQL source of truth (check --database)")?,
        )),
        None => Ok(Box::new(
            SqliteSource::open_with(&storage.data_dir, storage.sqlite_synchronous)
                .with_context(|| format!("opening the source of truth in {}", storage.data_dir.display()))?,
        )),
    }
}
