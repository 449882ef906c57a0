//! Serving rankings from Redis (`--redis`): the publisher that keeps Redis current, and what this instance
//! knows of the active-version pointer (by which the reader routes reads).
//!
//! # Publisher (one instance at a time)
//! Every instance runs [`run_until_stopped`]. Each tick (freshness / 4) it tries to take or renew the
//! publisher lease; the holder publishes, the others only watch the active-version pointer. The holder:
//! - on taking the lease, after any failure, when the pointer is gone (Redis restarted empty or was
//!   flushed) or when the engine installed a `popular` policy (switched here, or followed from another
//!   instance through the change feed; [`rankgate_store::ranking::engine::RankingEngine::policy_epoch`]): **rebuilds** — every hot span, whole, into a fresh
//!   generation beside the served one; checks the totals Redis holds against the engine's; switches the
//!   pointer (fenced by the lease); lets the old generation expire after the grace period;
//! - otherwise publishes **changes**: [`publication`] reads the engine's change log of each hot span, the
//!   products whose key moved per ranker since the last round (one entry per product however many events
//!   touched it; a view moves `popular` and the detail only), taking the engine lock one category at a
//!   time so ingest interleaves; Lua calls of at most `max_writes_per_call` member writes each, categories
//!   in parallel; then bumps the pointer's sequence number, which tells every instance to drop its cached
//!   responses.
//!
//! Hot spans are the current hour, day, ISO week, month and year and the four windows ending at the current
//! hour, for `all` and every category. Older spans are answered by each instance's engine, which is
//! built from the source of truth ("computed on first read, cached after").
//!
//! # Reads, and the one staleness rule
//! [`Serving::state`] decides whether hot reads are served from Redis now, and if not, why: Redis holds
//! no pointer (nothing published yet, or lost), a read or poll failed to reach it since the last
//! successful poll, or the served generation lags this instance's newest ingest by more than twice the
//! freshness bound (its publisher died and the lease has not moved yet, or a rebuild is under way). The
//! [`RankingsReader`](super::reader::RankingsReader) routes each read by it (answering from the
//! in-process engine with `stale: true` while it is stale), `/readyz` reports it, and the gauge
//! `rankgate_serving_stale` is set from it whenever `/metrics` is rendered, so the three never disagree.
//! Ingest never waits for Redis.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;

use rankgate_core::ids::CategoryOrAll;
use rankgate_core::period::{Hour, Span, Zone};
use rankgate_store::clock::Clock;
use rankgate_store::ranking::publication::{self, PublicationScope};
use rankgate_store::ranking::redis_serving::{
    span_field, Active, Published, RedisServing, ServingOptions, StampKind, Stamped,
};

use super::config::RankingsConfig;
use super::RankingService;
use super::Storage;

/// Whether hot reads are served from Redis now (module docs: the one staleness rule).
#[derive(Debug, Clone)]
pub enum ServingState {
    /// Redis serves `active`; `stamp` changes whenever the served data may have, so answers cached
    /// under an older one are not served.
    Current {
        /// The served generation.
        active: Active,
        /// The view's stamp when it was read.
        stamp: u64,
    },
    /// Reads are the engine's, marked stale.
    Stale(StaleReason),
}

/// Why hot reads are stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StaleReason {
    /// Redis holds no pointer: nothing published yet, or the data was lost (restarted empty, flushed).
    NoPointer,
    /// A read or a poll failed to reach Redis since the last successful poll.
    Unreachable,
    /// The served generation lags this instance's newest ingest by more than twice the freshness bound.
    Lagging,
}

/// What `/readyz` shows of Redis serving.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServingStatus {
    /// `redis` or `redis-cluster`.
    pub store: &'static str,
    /// Whether hot reads are answered stale now.
    pub stale: bool,
    /// Why, when they are.
    #[serde(rename = "staleReason", skip_serializing_if = "Option::is_none")]
    pub stale_reason: Option<StaleReason>,
    /// The served generation, if any.
    pub generation: Option<u64>,
    /// Top-N-only depth.
    pub depth: Option<usize>,
}

/// What this instance knows of the shared pointer.
#[derive(Debug, Default)]
struct View {
    active: Option<Active>,
}

/// Redis serving, attached to the rankings service.
pub struct Serving {
    store: Arc<RedisServing>,
    /// This instance's lease identity (random, never reused).
    owner: String,
    depth: Option<usize>,
    zone: Zone,
    /// The lag past which the served generation is stale: twice the freshness bound.
    max_lag_millis: i64,
    view: RwLock<View>,
    /// Bumped whenever the view changes, so cached responses made under an older pointer are never served.
    stamp: AtomicU64,
    /// Set by a read that failed to reach Redis; cleared by the next successful poll.
    unreachable: AtomicBool,
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serving")
            .field("store", &self.store)
            .field("depth", &self.depth)
            .finish_non_exhaustive()
    }
}

impl Serving {
    /// Connects to Redis (standalone or Cluster).
    pub async fn connect(config: &RankingsConfig, storage: &Storage) -> anyhow::Result<Arc<Serving>> {
        let store = RedisServing::connect(
            &storage.redis,
            ServingOptions {
                prefix: storage.redis_prefix.clone(),
                grace_millis: config.serving_grace_millis,
                ..ServingOptions::default()
            },
        )
        .await?;
        let owner = {
            use rand::Rng;
            let bytes: [u8; 16] = rand::rng().random();
            hex::encode(bytes)
        };
        Ok(Arc::new(Serving {
            store,
            owner,
            depth: config.serving_depth,
            zone: config.zone.clone(),
            max_lag_millis: 2 * config.freshness_millis as i64,
            view: RwLock::default(),
            stamp: AtomicU64::new(1),
            unreachable: AtomicBool::new(false),
        }))
    }

    /// The store.
    pub fn store(&self) -> &Arc<RedisServing> {
        &self.store
    }

    /// Top-N-only depth.
    pub fn depth(&self) -> Option<usize> {
        self.depth
    }

    /// The one staleness rule (module docs), given this instance's newest ingest (`engine_as_of`, asked
    /// only when it matters: it takes the engine's lock).
    pub fn state(&self, engine_as_of: impl FnOnce() -> Option<i64>) -> ServingState {
        if self.unreachable.load(Ordering::Acquire) {
            return ServingState::Stale(StaleReason::Unreachable);
        }
        let stamp = self.stamp.load(Ordering::Acquire);
        let Some(active) = self.view.read().active.clone() else {
            return ServingState::Stale(StaleReason::NoPointer);
        };
        if lags(active.as_of_millis, engine_as_of(), self.max_lag_millis) {
            return ServingState::Stale(StaleReason::Lagging);
        }
        ServingState::Current { active, stamp }
    }

    /// What `/readyz` reports, by [`Serving::state`]; also sets the gauge `rankgate_serving_stale`.
    pub fn status(&self, engine_as_of: Option<i64>) -> ServingStatus {
        let state = self.state(|| engine_as_of);
        let stale_reason = match &state {
            ServingState::Current { .. } => None,
            ServingState::Stale(reason) => Some(*reason),
        };
        metrics::gauge!("rankgate_serving_stale").set(if stale_reason.is_some() { 1.0 } else { 0.0 });
        ServingStatus {
            store: if self.store.is_cluster() {
                "redis-cluster"
            } else {
                "redis"
            },
            stale: stale_reason.is_some(),
            stale_reason,
            generation: self.view.read().active.as_ref().map(|a| a.generation),
            depth: self.depth,
        }
    }

    /// A read could not reach Redis: serve stale until the next successful poll.
    pub fn note_unreachable(&self, error: &dyn std::fmt::Display) {
        if !self.unreachable.swap(true, Ordering::AcqRel) {
            tracing::warn!(error = %error, "redis serving store unreachable; serving stale rankings from memory");
            self.stamp.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn set_view(&self, active: Option<Active>) {
        let was_unreachable = self.unreachable.swap(false, Ordering::AcqRel);
        let mut view = self.view.write();
        if view.active != active || was_unreachable {
            if view.active.is_some() && active.is_none() {
                tracing::warn!("redis serving pointer is gone (restarted empty or flushed?); serving stale until rebuilt");
            }
            view.active = active;
            self.stamp.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The publisher's own state, kept by the loop.
#[derive(Debug, Default)]
struct Publisher {
    leader: bool,
    /// The generation this publisher writes into; `None` until it has rebuilt once as leader.
    generation: Option<u64>,
    /// `popular` policy version of that generation.
    popular_version: u32,
    /// The engine's [`rankgate_store::ranking::engine::RankingEngine::policy_epoch`] its scores were read under: any other epoch means an
    /// install (switch, rollback, rebuild, also one learned from another instance) and a rebuild here.
    policy_epoch: u64,
    /// The pointer's asOf after the last publication.
    as_of_millis: Option<i64>,
}

/// Runs the publisher / watcher loop until shutdown.
pub async fn run_until_stopped(
    service: Arc<RankingService>,
    serving: Arc<Serving>,
    clock: Arc<dyn Clock>,
    freshness_millis: u64,
    shutdown: CancellationToken,
) {
    let tick = Duration::from_millis((freshness_millis / 4).clamp(10, 250));
    // Short, so a dead publisher is replaced within seconds (until then Redis holds its last data); the
    // holder renews it every tick and right before switching, so a rebuild that outlives it only loses
    // its switch if another instance took the lease meanwhile (and then rebuilds itself).
    let lease_millis = (tick.as_millis() as u64 * 8).max(3_000);
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut publisher = Publisher::default();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        if let Err(error) = tick_once(&service, &serving, clock.as_ref(), lease_millis, &mut publisher).await
        {
            serving.note_unreachable(&error);
            if publisher.leader {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "publishing rankings to redis failed; will rebuild"
                );
            }
            // Whatever was half-written is replaced by a rebuild once Redis answers again, by whichever
            // instance then holds the lease (warned once: `leader` is re-established on recovery).
            publisher.leader = false;
            publisher.generation = None;
        }
    }
    if publisher.leader {
        let _ = serving.store.release_lease(&serving.owner).await;
    }
}

async fn tick_once(
    service: &Arc<RankingService>,
    serving: &Arc<Serving>,
    clock: &dyn Clock,
    lease_millis: u64,
    publisher: &mut Publisher,
) -> anyhow::Result<()> {
    let store = &serving.store;
    let held = store.hold_lease(&serving.owner, lease_millis).await?;
    if held && !publisher.leader {
        tracing::info!("this instance now publishes rankings to redis");
        publisher.generation = None;
    }
    publisher.leader = held;
    let active = store.active().await?;
    if held {
        let epoch = service.engine().read().policy_epoch();
        // Rebuild on taking the lease, after a failure (generation forgotten), when the pointer moved
        // or vanished, when the engine installed a policy (whoever switched it), or when an operator
        // asked (`rankgate rebuild`).
        let current = publisher.generation.filter(|g| {
            active
                .as_ref()
                .is_some_and(|a| a.generation == *g && !a.rebuild_requested)
                && publisher.policy_epoch == epoch
        });
        let now_millis = clock.now_millis();
        match current {
            Some(generation) => publish_changes(service, serving, generation, now_millis, publisher).await?,
            None => {
                rebuild(
                    service,
                    serving,
                    active.as_ref(),
                    now_millis,
                    lease_millis,
                    publisher,
                )
                .await?
            }
        }
        serving.set_view(store.active().await?);
    } else {
        serving.set_view(active);
    }
    Ok(())
}

/// What a publication round covers: every hot span of every category the engine knows.
fn hot_requests(service: &RankingService, zone: &Zone, now_millis: i64) -> Vec<(CategoryOrAll, Span)> {
    publication::hot_requests(&service.engine().read(), Hour::from_millis(now_millis), zone)
}

async fn publish_changes(
    service: &Arc<RankingService>,
    serving: &Arc<Serving>,
    generation: u64,
    now_millis: i64,
    publisher: &mut Publisher,
) -> anyhow::Result<()> {
    let requests = hot_requests(service, &serving.zone, now_millis);
    let engine = service.engine().clone();
    let depth = serving.depth;
    let epoch = publisher.policy_epoch;
    let (publications, as_of, mixed) = tokio::task::spawn_blocking(move || {
        // asOf first: every slice then includes at least what it claims.
        let as_of = engine.read().as_of_millis();
        let publications =
            publication::take_publication_in_slices(&engine, &requests, depth, PublicationScope::Changes);
        // A policy installed before or between the slices: these scores are not all of this
        // generation's version, so none of them is written.
        let mixed = engine.read().policy_epoch() != epoch;
        (publications, as_of, mixed)
    })
    .await?;
    if mixed {
        publisher.generation = None;
        return Ok(());
    }
    if publications.is_empty() && as_of == publisher.as_of_millis {
        return Ok(());
    }
    let published = serving
        .store
        .publish(generation, &publications, &serving.zone, now_millis)
        .await?;
    if published == Published::Lost {
        anyhow::bail!(
            "serving keys of generation {generation} are gone (Redis restarted empty or was flushed?)"
        );
    }
    if let Published::Applied { writes, calls } = published {
        metrics::counter!("rankgate_serving_writes_total").increment(writes);
        metrics::counter!("rankgate_serving_calls_total").increment(calls);
    }
    let active = Active {
        generation,
        seq: 0,
        as_of_millis: as_of,
        popular_version: publisher.popular_version,
        depth: serving.depth,
        rebuild_requested: false,
    };
    match serving
        .store
        .stamp(&serving.owner, &active, StampKind::NewerDataInCurrent)
        .await?
    {
        Stamped::Done(_) => {
            publisher.as_of_millis = as_of;
            Ok(())
        }
        Stamped::NotLeader => {
            publisher.leader = false;
            publisher.generation = None;
            Ok(())
        }
        Stamped::Lost => anyhow::bail!("the active serving pointer is gone"),
    }
}

async fn rebuild(
    service: &Arc<RankingService>,
    serving: &Arc<Serving>,
    previous: Option<&Active>,
    now_millis: i64,
    lease_millis: u64,
    publisher: &mut Publisher,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let store = &serving.store;
    let generation = store.new_generation().await?;
    let requests = hot_requests(service, &serving.zone, now_millis);
    let engine = service.engine().clone();
    let depth = serving.depth;
    let (publications, as_of, policy, epoch, mixed) = tokio::task::spawn_blocking(move || {
        let (as_of, policy, epoch) = {
            let engine = engine.read();
            (
                engine.as_of_millis(),
                engine.policy().version,
                engine.policy_epoch(),
            )
        };
        let publications =
            publication::take_publication_in_slices(&engine, &requests, depth, PublicationScope::Everything);
        // An install between the slices would mix two versions under one pointer.
        let mixed = engine.read().policy_epoch() != epoch;
        (publications, as_of, policy, epoch, mixed)
    })
    .await?;
    if mixed {
        tracing::info!("a policy was installed during the redis rebuild; rebuilding again");
        publisher.generation = None;
        return Ok(());
    }
    let published = store
        .publish(generation, &publications, &serving.zone, now_millis)
        .await?;
    anyhow::ensure!(
        published != Published::Lost,
        "rebuilt generation {generation} lost keys while it was written (Redis restarted or was flushed?); not switching"
    );
    // Check before switching: Redis must hold exactly the totals the engine has.
    let mut categories: Vec<CategoryOrAll> = publications.iter().map(|p| p.category.clone()).collect();
    categories.sort_unstable();
    categories.dedup();
    for category in &categories {
        let stored = store.totals(category, generation).await?;
        for publication in publications.iter().filter(|p| &p.category == category) {
            let field = span_field(&publication.span);
            anyhow::ensure!(
                stored.get(&field) == Some(&publication.totals),
                "rebuilt generation {generation} holds {:?} for {category}/{field}, the engine {:?}; not switching",
                stored.get(&field),
                publication.totals
            );
        }
    }
    let active = Active {
        generation,
        seq: 0,
        as_of_millis: as_of,
        popular_version: policy,
        depth: serving.depth,
        rebuild_requested: false,
    };
    store.hold_lease(&serving.owner, lease_millis).await?;
    match store
        .stamp(&serving.owner, &active, StampKind::SwitchGeneration)
        .await?
    {
        Stamped::Done(_) => {}
        Stamped::NotLeader | Stamped::Lost => {
            publisher.leader = false;
            publisher.generation = None;
            return Ok(());
        }
    }
    publisher.generation = Some(generation);
    publisher.popular_version = policy;
    publisher.policy_epoch = epoch;
    publisher.as_of_millis = as_of;
    metrics::counter!("rankgate_serving_rebuilds_total").increment(1);
    if let Published::Applied { writes, calls } = published {
        metrics::counter!("rankgate_serving_writes_total").increment(writes);
        metrics::counter!("rankgate_serving_calls_total").increment(calls);
        tracing::info!(
            generation,
            spans = publications.len(),
            writes,
            calls,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "rankings rebuilt into redis and switched"
        );
    }
    if let Some(old) = previous.filter(|old| old.generation != generation) {
        store.retire(old.generation, &categories).await?;
    }
    Ok(())
}

/// `rankgate rebuild` with `--redis`: asks for a rebuild of the serving store and waits until a new
/// generation is active. When no instance holds the publisher lease (no server running), this process
/// takes it and rebuilds from `service` itself. Returns the generation now served.
pub async fn rebuild_now(
    service: &Arc<RankingService>,
    serving: &Arc<Serving>,
    clock: &dyn Clock,
) -> anyhow::Result<u64> {
    let store = &serving.store;
    let before = store.active().await?;
    store.request_rebuild().await?;
    let lease_millis = 60_000;
    if store.hold_lease(&serving.owner, lease_millis).await? {
        let mut publisher = Publisher {
            leader: true,
            ..Publisher::default()
        };
        let result = rebuild(
            service,
            serving,
            before.as_ref(),
            clock.now_millis(),
            lease_millis,
            &mut publisher,
        )
        .await;
        store.release_lease(&serving.owner).await?;
        result?;
        return publisher
            .generation
            .context("the rebuild could not switch (another instance took the lease meanwhile)");
    }
    // A running instance publishes: it sees the request at its next tick.
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    loop {
        if let Some(active) = store.active().await? {
            if !active.rebuild_requested && before.as_ref().is_none_or(|b| b.generation != active.generation)
            {
                return Ok(active.generation);
            }
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the publishing instance did not rebuild within 10 minutes; check its log"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
/// Whether a generation as of `served` lags the newest ingest (`newest`) by more than `limit`. Nothing
/// ingested here: nothing to lag behind.
fn lags(served: Option<i64>, newest: Option<i64>, limit: i64) -> bool {
    match (served, newest) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(served), Some(newest)) => newest - served > limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_data_lags_only_beyond_the_limit() {
        assert!(
            !lags(Some(1_000), None, 2_000),
            "nothing ingested here: nothing to trail"
        );
        assert!(!lags(Some(1_000), Some(3_000), 2_000), "within the limit");
        assert!(
            lags(Some(1_000), Some(3_001), 2_000),
            "a publisher that stopped publishing"
        );
        assert!(
            lags(None, Some(1), 2_000),
            "a pointer with no data behind ingested data"
        );
        assert!(
            !lags(Some(5_000), Some(4_000), 2_000),
            "redis ahead (another instance ingested)"
        );
    }
}
