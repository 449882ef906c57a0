//! The rankings service: what the HTTP routes and the command line call.
//!
//! It owns the engine (shared, behind a read-write lock: reads of clean spans only take the shared side),
//! the writer thread (the only writer of the source of truth), the ranker policy state and the catalogue.
//! Ranking reads over HTTP go through [`reader::RankingsReader`], which owns routing, fallback, staleness,
//! the response cache and the reported policy version.

pub mod reader;
pub mod serving;
pub mod writer;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use parking_lot::{Mutex, RwLock};

use rankgate_core::event::Event;
use rankgate_core::ids::ProductId;
use rankgate_core::period::Hour;
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};
use rankgate_store::ranking::engine::{EngineConfig, RankAnswer, RankingEngine, RankingQuery, TopPage};
use rankgate_store::ranking::ingest::{EventOutcome, IngestConfig, Ingestor};
use rankgate_store::ranking::postgres::PostgresSource;
use rankgate_store::ranking::serving_store::{EngineRead, EngineServing};
use rankgate_store::ranking::source::{RankerPolicies, SourceOfTruth};
use rankgate_store::ranking::sqlite::SqliteSource;

use crate::config::Config;
use writer::WriterHandle;

/// A ranker's policy state as the admin API shows it.
#[derive(Debug, Clone)]
pub struct RankerState {
    /// Stored versions.
    pub policies: RankerPolicies,
    /// A version being built, not yet switched to.
    pub building: Option<Policy>,
}

/// The rankings half of rankgate.
pub struct RankingService {
    engine: Arc<RwLock<RankingEngine>>,
    writer: WriterHandle,
    popular: Mutex<RankerState>,
    catalog: RwLock<HashMap<ProductId, serde_json::Value>>,
    /// Serializes policy switches so two PUTs never interleave their builds.
    switch_lock: tokio::sync::Mutex<()>,
    /// Bumped on every catalogue change (responses embed catalogue data).
    catalog_generation: std::sync::atomic::AtomicU64,
    /// Redis serving (`--redis`), attached after opening.
    serving: std::sync::OnceLock<Arc<serving::Serving>>,
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
    /// Opens the configured source of truth (SQLite in `config.data_dir`, or PostgreSQL with
    /// `--database`) and rebuilds serving state from it. Blocking: call it off the async runtime.
    pub fn open(config: &Config) -> anyhow::Result<(Arc<RankingService>, std::thread::JoinHandle<()>)> {
        let mut source = open_source(config)?;
        let policies = match source.load_policies(RankerName::Popular)? {
            Some(policies) => policies,
            None => {
                let initial = RankerPolicies {
                    ranker: RankerName::Popular,
                    active: Policy::default(),
                    previous: None,
                    latest_version: 1,
                };
                source.save_policies(&initial)?;
                initial
            }
        };
        let catalog = source.load_catalog()?.into_iter().collect();
        let engine = Arc::new(RwLock::new(RankingEngine::new(
            EngineConfig {
                zone: config.zone.clone(),
                max_cached_members: config.max_cached_members,
            },
            policies.active,
        )));
        let ingestor = Ingestor::open(
            source,
            engine.clone(),
            IngestConfig {
                max_lateness_millis: config.max_lateness_millis,
            },
        )?;
        let (writer, thread) = WriterHandle::spawn(ingestor);
        let service = RankingService {
            engine,
            writer,
            popular: Mutex::new(RankerState {
                policies,
                building: None,
            }),
            catalog: RwLock::new(catalog),
            switch_lock: tokio::sync::Mutex::new(()),
            catalog_generation: std::sync::atomic::AtomicU64::new(0),
            serving: std::sync::OnceLock::new(),
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

    /// Bumped on every catalogue change.
    pub fn catalog_generation(&self) -> u64 {
        self.catalog_generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Catalogue data of a product, if loaded.
    pub fn catalog_entry(&self, product: &ProductId) -> Option<serde_json::Value> {
        self.catalog.read().get(product).cloned()
    }

    /// Whether any catalogue entry exists (saves a lock per item when none does).
    pub fn has_catalog(&self) -> bool {
        !self.catalog.read().is_empty()
    }

    /// Stores catalogue entries durably, then serves them.
    ///
    /// Runs as a task of its own: a caller dropped between the two steps (an HTTP client hanging up)
    /// would otherwise leave entries stored but not served until the next restart.
    pub async fn put_catalog(
        self: &Arc<Self>,
        entries: Vec<(ProductId, serde_json::Value)>,
    ) -> anyhow::Result<()> {
        let service = Arc::clone(self);
        tokio::spawn(async move {
            let stored = entries.clone();
            service
                .writer
                .run(move |ingestor| ingestor.source_mut().put_catalog(&stored))
                .await??;
            service.catalog.write().extend(entries);
            service
                .catalog_generation
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            Ok(())
        })
        .await?
    }

    /// The `popular` ranker's policy state.
    pub fn popular_state(&self) -> RankerState {
        self.popular.lock().clone()
    }

    /// Creates a new `popular` policy version with `weights`, builds it off to the side and switches to
    /// it atomically. Returns the new version at once; the build finishes in the background.
    pub async fn change_popular_weights(self: &Arc<Self>, weights: PopularWeights) -> anyhow::Result<u32> {
        let policy = {
            let mut state = self.popular.lock();
            let version = state
                .policies
                .latest_version
                .max(state.building.map_or(0, |p| p.version))
                + 1;
            let policy = Policy { version, weights };
            state.building = Some(policy);
            policy
        };
        let service = self.clone();
        tokio::spawn(async move {
            if let Err(error) = service.switch_to(policy, false).await {
                tracing::error!(error = format!("{error:#}"), "building policy version failed");
            }
        });
        Ok(policy.version)
    }

    /// Switches back to the previous version. Returns the version now active, or `None` if there is none.
    pub async fn rollback_popular(self: &Arc<Self>) -> anyhow::Result<Option<u32>> {
        let Some(previous) = self.popular.lock().policies.previous else {
            return Ok(None);
        };
        self.switch_to_detached(previous, true).await?;
        Ok(Some(previous.version))
    }

    /// Rebuilds every cached ranking from the source of truth under the active policy, then switches.
    pub async fn rebuild(self: &Arc<Self>) -> anyhow::Result<u32> {
        let active = self.popular.lock().policies.active;
        self.switch_to_detached(active, true).await?;
        Ok(active.version)
    }

    /// [`RankingService::switch_to`] in a task of its own, so a caller dropped mid-switch (an HTTP client
    /// hanging up) cannot leave the stored policies saying one version while the engine serves another.
    async fn switch_to_detached(
        self: &Arc<Self>,
        policy: Policy,
        is_rollback_or_rebuild: bool,
    ) -> anyhow::Result<()> {
        let service = Arc::clone(self);
        tokio::spawn(async move { service.switch_to(policy, is_rollback_or_rebuild).await }).await?
    }

    async fn switch_to(self: &Arc<Self>, policy: Policy, is_rollback_or_rebuild: bool) -> anyhow::Result<()> {
        let _switching = self.switch_lock.lock().await;
        let engine = self.engine.clone();
        // Build under the shared lock: reads go on, serving the old version, until the switch.
        let rebuilt = tokio::task::spawn_blocking(move || engine.read().rebuild_with(policy)).await?;
        let new_state = {
            let state = self.popular.lock();
            let old_active = state.policies.active;
            let mut policies = state.policies.clone();
            if old_active.version != policy.version {
                policies.previous = Some(old_active);
            }
            policies.active = policy;
            policies.latest_version = policies.latest_version.max(policy.version);
            policies
        };
        let stored = new_state.clone();
        self.writer
            .run(move |ingestor| ingestor.source_mut().save_policies(&stored))
            .await??;
        self.engine.write().install(rebuilt);
        let mut state = self.popular.lock();
        state.policies = new_state;
        if !is_rollback_or_rebuild || state.building.is_some_and(|b| b.version == policy.version) {
            state.building = None;
        }
        tracing::info!(version = policy.version, "popular now served from policy version");
        Ok(())
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
}

/// Opens the configured source of truth: PostgreSQL when `--database` is set, else SQLite in the data
/// dir. Blocking (the PostgreSQL client runs its own small runtime): never call it from async code.
pub fn open_source(config: &Config) -> anyhow::Result<Box<dyn SourceOfTruth>> {
    match &config.database {
        Some(url) => Ok(Box::new(
            PostgresSource::connect(url, &config.database_schema)
                .context("connecting to the PostgreSQL source of truth (check --database)")?,
        )),
        None => Ok(Box::new(
            SqliteSource::open_with(&config.data_dir, config.sqlite_synchronous)
                .with_context(|| format!("opening the source of truth in {}", config.data_dir.display()))?,
        )),
    }
}

/// Opens a data dir for exclusive use by one process: the embedded stores are single-writer.
pub fn lock_data_dir(data_dir: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating data dir {}", data_dir.display()))?;
    let path = data_dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    file.try_lock().map_err(|_| {
        anyhow::anyhow!(
            "{} is in use by another rankgate process; stop it, or use --url to talk to it",
            data_dir.display()
        )
    })?;
    Ok(file)
}
