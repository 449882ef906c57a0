//! The rankings service: what the HTTP routes and the command line call.
//!
//! It owns the engine (shared, behind a read-write lock: reads of clean spans only take the shared side),
//! the writer thread (the only writer of the source of truth), the ranker policy state and the catalogue.
//!
//! Policy versions are fleet state, per configurable ranker (`popular`, `trending`:
//! [`RankerName::CONFIGURABLE`]). The rules are [`PolicyState`]'s (core); every transition is one
//! transaction in the source of truth ([`SourceOfTruth::transition_policies`], which PostgreSQL runs on
//! the locked row, so concurrent PUTs through several instances apply in one order), and the stored
//! state reaches every instance through the change feed ([`RankingService::observe_policies`]). One
//! policy driver per instance ([`RankingService::run_policy_driver`]) keeps the engine on that state:
//! every instance builds a version being built and tries to complete it (the first finisher switches
//! the shared state, the others find it active), and builds the active version when its engine serves
//! another (a rollback, or a switch it missed). Builds run off to the side; installs are atomic.
//!
//! Ranking reads over HTTP go through [`reader::RankingsReader`], which owns routing, fallback, staleness,
//! the response cache and the reported policy version.

pub mod entity_tag;
pub mod reader;
pub mod serving;
pub mod top_streams;
pub mod writer;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use parking_lot::{Mutex, RwLock};

use rankgate_core::event::Event;
use rankgate_core::ids::ProductId;
use rankgate_core::period::Hour;
use rankgate_core::policy::{Observed, PolicyError, PolicyState};
use rankgate_core::ranker::{Policy, PopularWeights, RankerName};
use rankgate_store::clock::Clock;
use rankgate_store::ranking::engine::{
    EngineConfig, RankAnswer, RankingEngine, RankingQuery, RebuiltSpans, TopPage,
};
use rankgate_store::ranking::ingest::{EventOutcome, IngestConfig, Ingestor};
use rankgate_store::ranking::postgres::PostgresSource;
use rankgate_store::ranking::serving_store::{EngineRead, EngineServing};
use rankgate_store::ranking::source::{SourceError, SourceOfTruth};
use rankgate_store::ranking::sqlite::SqliteSource;

use crate::config::Config;
use writer::WriterHandle;

/// Why a policy change through this instance did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PolicyChangeError {
    /// The version rules refuse it in the shared state (409): no previous version, superseded, ...
    #[error(transparent)]
    Refused(PolicyError),
    /// The source of truth or the writer failed (500); nothing changed, or the change is retried.
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// The rankings half of rankgate.
pub struct RankingService {
    engine: Arc<RwLock<RankingEngine>>,
    writer: WriterHandle,
    /// The policy state of each configurable ranker ([`RankerName::CONFIGURABLE`] order) shared by every
    /// instance, as last committed here or read from the change feed (never older than what this instance
    /// has seen: [`PolicyState::observe`]).
    policies: [Mutex<PolicyState>; RankerName::CONFIGURABLE.len()],
    catalog: RwLock<HashMap<ProductId, serde_json::Value>>,
    /// Serializes this instance's builds (switches, rollbacks, rebuilds, following other instances), so
    /// two never interleave and the engine is installed in the order the builds decide.
    switch_lock: tokio::sync::Mutex<()>,
    /// Wakes [`RankingService::run_policy_driver`] when the shared policy state changed.
    policy_changed: tokio::sync::Notify,
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
        // A no-op transition: stores the initial state of a ranker never configured, and reads the
        // shared one otherwise. A version still building (this instance crashed mid-build, or another
        // instance is building it now) is built again by the policy driver, which then completes it.
        let mut policies = Vec::new();
        for ranker in RankerName::CONFIGURABLE {
            policies.push(source.transition_policies(ranker, &mut |_| Ok(()))?);
        }
        let policies: [PolicyState; RankerName::CONFIGURABLE.len()] =
            policies.try_into().expect("one state per configurable ranker");
        let catalog = source.load_catalog()?.into_iter().collect();
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
            policies: policies.map(Mutex::new),
            catalog: RwLock::new(catalog),
            switch_lock: tokio::sync::Mutex::new(()),
            policy_changed: tokio::sync::Notify::new(),
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

    /// The shared state of `ranker`, one of [`RankerName::CONFIGURABLE`].
    fn policy_cell(&self, ranker: RankerName) -> &Mutex<PolicyState> {
        &self.policies[configurable_index(ranker)]
    }

    /// A configurable ranker's policy state shared by every instance (as this instance last saw it).
    pub fn policy_state(&self, ranker: RankerName) -> PolicyState {
        *self.policy_cell(ranker).lock()
    }

    /// Creates a new policy version of `ranker` (`popular` or `trending`) with `weights` in the shared
    /// state (building) and returns it at once. The policy driver of every instance builds it off to the
    /// side; the first to finish switches the shared state, and each installs its own build atomically
    /// (see [`RankingService::run_policy_driver`]).
    pub async fn change_weights(
        self: &Arc<Self>,
        ranker: RankerName,
        weights: PopularWeights,
    ) -> Result<u32, PolicyChangeError> {
        let state = self
            .transition(ranker, move |state| state.create(weights).map(|_| ()), None)
            .await?;
        self.policy_changed.notify_one();
        // The transaction that stored `state` created its latest version.
        Ok(state.latest_version)
    }

    /// Switches back to the previous version: builds it off to the side, then rolls the shared state
    /// back (refused if another instance changed the previous version meanwhile: then retried on the
    /// new state, a few times) and installs the build in the same writer turn. Returns the version now
    /// active. Other instances follow through the change feed.
    pub async fn rollback(self: &Arc<Self>, ranker: RankerName) -> Result<Policy, PolicyChangeError> {
        let service = Arc::clone(self);
        // A task of its own: a caller dropped mid-rollback (an HTTP client hanging up) cannot leave the
        // shared state saying one version while this engine serves another.
        tokio::spawn(async move {
            let _switching = service.switch_lock.lock().await;
            let mut attempts = 0;
            loop {
                attempts += 1;
                let previous = service
                    .policy_cell(ranker)
                    .lock()
                    .previous
                    .ok_or(PolicyChangeError::Refused(PolicyError::NoPrevious))?;
                let rebuilt = service.build(ranker, previous).await?;
                match service
                    .transition(
                        ranker,
                        move |state| state.rollback_to(previous.version).map(|_| ()),
                        Some(rebuilt),
                    )
                    .await
                {
                    Ok(_) => return Ok(previous),
                    Err(PolicyChangeError::Refused(PolicyError::PreviousChanged { .. })) if attempts < 3 => {}
                    Err(error) => return Err(error),
                }
            }
        })
        .await
        .map_err(|e| PolicyChangeError::Failed(e.into()))?
    }

    /// Rebuilds every cached ranking from the source of truth under the active policy, then installs it
    /// (unless another version became active meanwhile; the policy driver then follows that one).
    pub async fn rebuild(self: &Arc<Self>) -> anyhow::Result<u32> {
        let service = Arc::clone(self);
        tokio::spawn(async move {
            let _switching = service.switch_lock.lock().await;
            let active = service.policy_state(RankerName::Popular).active;
            let rebuilt = service.build(RankerName::Popular, active).await?;
            service.install_if_active_blocking(rebuilt).await?;
            Ok(active.version)
        })
        .await?
    }

    /// Adopts policy states read from the shared source of truth (the follower loop, every tick): a newer
    /// one wakes the policy driver, which builds and installs what it names.
    pub fn observe_policies(&self, stored: &[(RankerName, PolicyState)]) {
        for (ranker, state) in stored {
            if !ranker.is_configurable() {
                continue;
            }
            match self.policy_cell(*ranker).lock().observe(state) {
                Ok(Observed::Newer) => self.policy_changed.notify_one(),
                Ok(Observed::Unchanged) => {}
                // A transition committed here is newer than what this read saw.
                Err(PolicyError::Stale { .. }) => {}
                Err(error) => tracing::warn!(%error, %ranker, "ignoring a stored policy state"),
            }
        }
    }

    /// Keeps this instance's engine on the shared policy state until `shutdown`: builds the version
    /// being built (whoever created it) and completes it, or builds the active version when the engine
    /// serves another one (a switch or rollback made through another instance), each off to the side,
    /// installed atomically. Woken by local transitions and by the follower; failures are retried.
    pub async fn run_policy_driver(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        loop {
            match self.converge_once().await {
                Ok(true) => continue,
                Ok(false) => {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = self.policy_changed.notified() => {}
                    }
                }
                Err(error) => {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "following the shared policies failed; will retry"
                    );
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    }

    /// One step towards the shared policy state. Returns whether it did anything (then the state may
    /// have moved again: call it again).
    async fn converge_once(self: &Arc<Self>) -> anyhow::Result<bool> {
        for ranker in RankerName::CONFIGURABLE {
            if self.converge_ranker_once(ranker).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// [`RankingService::converge_once`] for one ranker.
    async fn converge_ranker_once(self: &Arc<Self>, ranker: RankerName) -> anyhow::Result<bool> {
        let _switching = self.switch_lock.lock().await;
        let shared = self.policy_state(ranker);
        if let Some(building) = shared.building {
            // Every instance builds the version being built and tries to complete it: the first to
            // finish switches the shared state (so a builder killed mid-build delays nobody), the
            // others find it active and install their own build at once.
            let rebuilt = self.build(ranker, building).await?;
            return match self
                .transition(
                    ranker,
                    move |state| state.complete_build(building.version).map(|_| ()),
                    Some(rebuilt),
                )
                .await
            {
                Ok(_) => Ok(true),
                Err(PolicyChangeError::Refused(error)) => {
                    tracing::info!(%error, "discarding a policy build");
                    Ok(true)
                }
                Err(PolicyChangeError::Failed(error)) => Err(error),
            };
        }
        if self.engine.read().policy_of(ranker) != shared.active {
            let rebuilt = self.build(ranker, shared.active).await?;
            self.install_if_active_blocking(rebuilt).await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Builds every cached span under `policy` on the blocking pool, in short holds of the engine's shared
    /// lock ([`RankingEngine::rebuild_in_steps`]): reads and ingest go on, served from the installed
    /// version, until the install.
    async fn build(&self, ranker: RankerName, policy: Policy) -> anyhow::Result<RebuiltSpans> {
        let engine = self.engine.clone();
        let started = std::time::Instant::now();
        let rebuilt =
            tokio::task::spawn_blocking(move || RankingEngine::rebuild_in_steps(&engine, ranker, policy))
                .await?;
        let elapsed = started.elapsed();
        metrics::histogram!("rankgate_policy_build_seconds").record(elapsed.as_secs_f64());
        tracing::info!(
            %ranker,
            version = policy.version,
            elapsed_ms = elapsed.as_millis() as u64,
            "built policy version"
        );
        Ok(rebuilt)
    }

    /// Installs `rebuilt` if its policy is the shared active one; else drops it (the driver follows).
    fn install_if_active(&self, rebuilt: RebuiltSpans) {
        let ranker = rebuilt.ranker();
        let shared = self.policy_cell(ranker).lock();
        if shared.active == rebuilt.policy() {
            self.engine.write().install(rebuilt);
            tracing::info!(%ranker, version = shared.active.version, "now served from policy version");
        }
    }

    /// [`RankingService::install_if_active`] on the blocking pool (an install re-scores the spans that
    /// changed during the build, under the write lock).
    async fn install_if_active_blocking(self: &Arc<Self>, rebuilt: RebuiltSpans) -> anyhow::Result<()> {
        let service = Arc::clone(self);
        tokio::task::spawn_blocking(move || service.install_if_active(rebuilt)).await?;
        Ok(())
    }

    /// Runs `step` as one transition of `ranker`'s shared state (one transaction, on the writer
    /// thread), adopts the state it stored and, in the same writer turn, installs `rebuilt` when that
    /// state makes its policy active. A refused step adopts the stored state instead, so the next
    /// decision is made on it.
    async fn transition(
        self: &Arc<Self>,
        ranker: RankerName,
        mut step: impl FnMut(&mut PolicyState) -> Result<(), PolicyError> + Send + 'static,
        rebuilt: Option<RebuiltSpans>,
    ) -> Result<PolicyState, PolicyChangeError> {
        let service = Arc::clone(self);
        self.writer
            .run(move |ingestor| {
                let source = ingestor.source_mut();
                match source.transition_policies(ranker, &mut step) {
                    Ok(state) => {
                        service.adopt(ranker, &state);
                        if let Some(rebuilt) = rebuilt {
                            service.install_if_active(rebuilt);
                        }
                        Ok(state)
                    }
                    Err(SourceError::Policy(refused)) => {
                        if let Ok(Some(state)) = source.load_policies(ranker) {
                            service.adopt(ranker, &state);
                        }
                        Err(PolicyChangeError::Refused(refused))
                    }
                    Err(error) => Err(PolicyChangeError::Failed(
                        anyhow::Error::new(error).context(format!("storing the {ranker} policy transition")),
                    )),
                }
            })
            .await?
    }

    /// Adopts a state this instance read or stored, unless it has seen a newer one.
    fn adopt(&self, ranker: RankerName, state: &PolicyState) {
        match self.policy_cell(ranker).lock().observe(state) {
            Ok(_) | Err(PolicyError::Stale { .. }) => {}
            Err(error) => tracing::warn!(%error, %ranker, "ignoring a stored policy state"),
        }
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

/// Position of a configurable ranker in [`RankerName::CONFIGURABLE`] (and in the service's states).
/// `units` and `revenue` have no policy state; they map to `popular`'s, whose version they never report.
fn configurable_index(ranker: RankerName) -> usize {
    RankerName::CONFIGURABLE
        .iter()
        .position(|r| *r == ranker)
        .unwrap_or(0)
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
