//! Serving rankings from Redis (`--redis`): the publisher that keeps Redis current, and what this instance
//! knows of the active-version pointer (by which the reader routes reads).
//!
//! # Publishers (every instance, each for its share)
//! Every instance runs [`run_until_stopped`]. Each tick (freshness / 4) it registers as a publisher and
//! holds its share of the span groups (`RedisServing::hold_groups`: the hot spans are dealt into 36 groups
//! by category and span kind, and the groups among the live instances by measured cost), then publishes
//! those groups only; its engine forgets the spans of any group it gave up. For its groups it:
//! - after any failure, when a group's entry in the pointer is gone or names another generation (Redis
//!   restarted empty or was flushed) or when the engine installed a `popular` policy (switched here, or
//!   followed from another instance through the change feed;
//!   [`rankgate_store::ranking::engine::RankingEngine::policy_epoch`]), and when it had no group before:
//!   **rebuilds**: every hot span of its groups, whole, into a fresh generation of its own; checks the
//!   totals Redis holds against the engine's; points its groups' entries at it (fenced by their leases);
//!   lets its old generation expire after the grace period;
//! - on gaining a group while it publishes others (a new deal, a publisher gone): writes the gained
//!   groups' hot spans whole into its current generation, beside the changes of the others, checks their
//!   totals and switches only the gained groups' entries to it. A deal that moves a few groups then costs
//!   their spans once, not a rebuild of everything the gainer holds;
//! - otherwise publishes **changes**: [`publication`] reads the engine's change log of each hot span, the
//!   products whose key moved per ranker since the last round (one entry per product however many events
//!   touched it; a view moves `popular` and the detail only), taking the engine lock one category at a
//!   time so ingest interleaves; Lua calls of at most `max_writes_per_call` member writes each, categories
//!   in parallel; then stamps its groups' entries and bumps the pointer's sequence number, which tells
//!   every instance to drop its cached responses.
//!
//! Hot spans are the current hour, day, ISO week, month and year and the four windows ending at the current
//! hour, for `all` and every category. Older spans are answered by each instance's engine, which is
//! built from the source of truth ("computed on first read, cached after").
//!
//! # Demand: only the hot spans somebody reads
//! A shop reads a few of its hundreds of hot rankings (`all` and the big categories, by day and week);
//! keeping every one current in Redis cost the publisher a re-score and a Redis write per span an event
//! touches. So with `serving_idle_seconds` > 0 (default 600) a hot span is published only while it was
//! read within that time on some instance:
//! - every instance notes the hot (category, span) pairs its reads ask for ([`Serving::note_read`], a
//!   lock and a hash lookup per read; bounded, and only `all` and categories the engine knows) and adds
//!   them to the shared `P{rk}:demand` sorted set (score: last read) once per tick;
//! - the publisher publishes the hot spans in that set and read within the idle time: one newly asked for
//!   goes out whole the next tick (its first change-log take says `Rebuilt`), which bounds the catch-up to
//!   one tick plus one whole-span write; one no longer read is taken out of Redis (its totals field
//!   first, so reads decline it from then on) and out of the publisher's engine
//!   ([`rankgate_store::ranking::engine::RankingEngine::forget_span`]), so it costs nothing per event;
//! - a read of a span Redis does not hold is declined by the read script and answered by the reading
//!   instance's engine, fresh (as an older span is), so no answer waits for the publisher.
//!
//! `serving_idle_seconds = 0` publishes every hot span, read or not.
//!
//! # Reads, and the one staleness rule
//! [`Serving::state`] decides whether hot reads are served from Redis now, and if not, why: Redis holds
//! no pointer (nothing published yet, or lost), a read or poll failed to reach it since the last
//! successful poll, or the served generation lags this instance's newest ingest by more than twice the
//! freshness bound (its publisher died and the lease has not moved yet, or a rebuild is under way). The
//! [`RankingsReader`](super::reader::RankingsReader) routes each read by it, by the entry of the span's
//! group (a dead publisher's groups lag while the others stay current), answering from the in-process
//! engine with `stale: true` while it is stale; `/readyz` reports the worst group, and the gauge
//! `rankgate_serving_stale` is set from that whenever `/metrics` is rendered.
//! Ingest never waits for Redis.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use parking_lot::{Mutex, RwLock};
use tokio_util::sync::CancellationToken;

use rankgate_core::ids::CategoryOrAll;
use rankgate_core::period::{Hour, Span, Zone};
use rankgate_store::clock::Clock;
use rankgate_store::ranking::publication::{self, PublicationScope, SpanPublication};
use rankgate_store::ranking::redis_serving::{
    demand_member, is_hot, span_field, span_group, Active, Pointer, Published, RedisServing, ServingOptions,
    StampKind, Stamped, SPAN_GROUPS,
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
    pointer: Option<Pointer>,
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
    /// `serving_idle_seconds` in ms: how long a hot span stays published after its last read; 0
    /// publishes every hot span.
    idle_millis: i64,
    /// Hot spans this instance's reads asked for since the last tick, by span then category (so a
    /// read looks itself up without allocating); sent to `P{rk}:demand` each tick.
    reads: Mutex<HashMap<Span, HashSet<CategoryOrAll>>>,
}

/// Most distinct hot spans one instance notes between two ticks (about 9 spans × 1,000 categories); more
/// are dropped until the next tick, so hostile reads cannot grow the set.
const MAX_NOTED_READS: usize = 10_000;

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
            idle_millis: config.serving_idle_millis,
            reads: Mutex::default(),
        }))
    }

    /// Notes that a read asked for `category` over the hot `span` (module docs: demand), if `known`
    /// says the category is `all` or one the engine has seen (asked only for a span not noted yet this
    /// tick).
    pub fn note_read(&self, category: &CategoryOrAll, span: &Span, known: impl FnOnce() -> bool) {
        if self.idle_millis == 0 {
            return;
        }
        let mut reads = self.reads.lock();
        if reads.get(span).is_some_and(|noted| noted.contains(category)) {
            return;
        }
        if reads.values().map(HashSet::len).sum::<usize>() >= MAX_NOTED_READS || !known() {
            return;
        }
        reads.entry(*span).or_default().insert(category.clone());
    }

    /// The reads noted since the last call, as demand set members.
    fn take_reads(&self) -> Vec<String> {
        let reads = std::mem::take(&mut *self.reads.lock());
        reads
            .iter()
            .flat_map(|(span, categories)| {
                categories
                    .iter()
                    .map(move |category| demand_member(category, span))
            })
            .collect()
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
    pub fn state(
        &self,
        category: &CategoryOrAll,
        span: &Span,
        engine_as_of: impl FnOnce() -> Option<i64>,
    ) -> ServingState {
        if self.unreachable.load(Ordering::Acquire) {
            return ServingState::Stale(StaleReason::Unreachable);
        }
        let stamp = self.stamp.load(Ordering::Acquire);
        let active = {
            let view = self.view.read();
            view.pointer
                .as_ref()
                .and_then(|pointer| pointer.active(span_group(category, span)))
        };
        let Some(active) = active else {
            return ServingState::Stale(StaleReason::NoPointer);
        };
        if lags(active.as_of_millis, engine_as_of(), self.max_lag_millis) {
            return ServingState::Stale(StaleReason::Lagging);
        }
        ServingState::Current { active, stamp }
    }

    /// What `/readyz` reports: the worst of [`Serving::state`] over the span groups (a group whose
    /// publisher died lags until another takes it over); also sets the gauge `rankgate_serving_stale`.
    pub fn status(&self, engine_as_of: Option<i64>) -> ServingStatus {
        let (stale_reason, generation) = {
            let view = self.view.read();
            let entries: Vec<_> = view
                .pointer
                .iter()
                .flat_map(|pointer| pointer.groups.iter().flatten())
                .collect();
            let reason = if self.unreachable.load(Ordering::Acquire) {
                Some(StaleReason::Unreachable)
            } else if entries.is_empty() {
                Some(StaleReason::NoPointer)
            } else if entries
                .iter()
                .any(|entry| lags(entry.as_of_millis, engine_as_of, self.max_lag_millis))
            {
                Some(StaleReason::Lagging)
            } else {
                None
            };
            (reason, entries.iter().map(|entry| entry.generation).max())
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
            generation,
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

    fn set_view(&self, pointer: Option<Pointer>) {
        let was_unreachable = self.unreachable.swap(false, Ordering::AcqRel);
        let mut view = self.view.write();
        if view.pointer != pointer || was_unreachable {
            if view.pointer.is_some() && pointer.is_none() {
                tracing::warn!("redis serving pointer is gone (restarted empty or flushed?); serving stale until rebuilt");
            }
            view.pointer = pointer;
            self.stamp.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The publisher's own state, kept by the loop.
#[derive(Debug, Default)]
struct Publisher {
    /// The span groups this instance holds the leases of, ascending; empty when it publishes nothing.
    groups: Vec<usize>,
    /// The generation this publisher writes its groups into; `None` until it has rebuilt them once.
    generation: Option<u64>,
    /// `popular` policy version of that generation.
    popular_version: u32,
    /// The engine's [`rankgate_store::ranking::engine::RankingEngine::policy_epoch`] its scores were read under: any other epoch means an
    /// install (switch, rollback, rebuild, also one learned from another instance) and a rebuild here.
    policy_epoch: u64,
    /// The rebuild request (`rankgate rebuild`) that generation answers.
    rebuilt: u64,
    /// The groups' asOf after the last publication.
    as_of_millis: Option<i64>,
    /// The hot spans written into `generation` and kept current there (those of its groups that are in
    /// demand, or all of them when the idle time is 0).
    published: HashSet<(CategoryOrAll, Span)>,
    /// Groups held but not yet written into `generation`: taken over since the last round, their entries
    /// still name their former holder's generation until the next round writes them whole and switches them.
    gained: Vec<usize>,
}

impl Publisher {
    /// The groups held and already written into `generation` (not [`Publisher::gained`]).
    fn kept_groups(&self) -> Vec<usize> {
        self.groups
            .iter()
            .filter(|group| !self.gained.contains(group))
            .copied()
            .collect()
    }
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
    // Short, so a dead publisher's groups are taken over within seconds (until then Redis holds its last
    // data); the holder renews its leases every tick and right before switching, so a rebuild that
    // outlives them only loses its switch if another instance took a group meanwhile (and then rebuilds
    // it itself).
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
            if !publisher.groups.is_empty() {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "publishing rankings to redis failed; will rebuild"
                );
            }
            // Whatever was half-written is replaced by a rebuild once Redis answers again, by whichever
            // instances then hold the groups (warned once: the groups are dealt again on recovery).
            let _ = forget_groups(&service, &mut publisher, &[]);
            publisher.generation = None;
        }
        metrics::gauge!("rankgate_serving_groups").set(publisher.groups.len() as f64);
        metrics::gauge!("rankgate_serving_spans").set(publisher.published.len() as f64);
    }
    if !publisher.groups.is_empty() {
        let _ = serving.store.leave_groups(&serving.owner).await;
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
    let now_millis = clock.now_millis();
    store
        .note_demand(&serving.take_reads(), now_millis, 2 * serving.idle_millis)
        .await?;
    let held = store.hold_groups(&serving.owner, lease_millis).await?;
    if held != publisher.groups {
        let gained: Vec<usize> = held
            .iter()
            .filter(|group| !publisher.groups.contains(group))
            .copied()
            .collect();
        tracing::info!(groups = ?held, "this instance's share of the redis publication changed");
        let gone = forget_groups(service, publisher, &held);
        // What this generation holds of a group given up is taken out, so that if the group comes back
        // its spans are written whole into it again, never served from what was left. Until the new
        // holder switches the group, its reads are declined and answered by the engines.
        if let Some(generation) = publisher.generation {
            unpublish_hot(serving, generation, &gone, now_millis).await?;
        }
        // Groups taken over come with no change log here: the next round writes them whole.
        publisher.gained.extend(gained);
    }
    let pointer = store.pointer().await?;
    if !publisher.groups.is_empty() {
        let epoch = service.engine().read().policy_epoch();
        // Rebuild after a failure (generation forgotten), when a kept group's pointer moved or vanished,
        // when the engine installed a policy (whoever switched it), when an operator asked (`rankgate
        // rebuild`), or when every group held is new here (nothing to keep).
        let kept = publisher.kept_groups();
        let current = publisher.generation.filter(|generation| {
            !kept.is_empty()
                && pointer.as_ref().is_some_and(|pointer| {
                    kept.iter().all(|group| {
                        pointer.groups[*group].is_some_and(|entry| {
                            entry.generation == *generation && entry.rebuilt >= pointer.rebuild
                        })
                    })
                })
                && publisher.policy_epoch == epoch
        });
        match current {
            Some(generation) => publish_changes(service, serving, generation, now_millis, publisher).await?,
            None => {
                let request = pointer.as_ref().map_or(0, |pointer| pointer.rebuild);
                rebuild(service, serving, request, now_millis, lease_millis, publisher).await?
            }
        }
        serving.set_view(store.pointer().await?);
    } else {
        serving.set_view(pointer);
    }
    Ok(())
}

/// Keeps the publisher to the groups `held`: the spans of any other group leave the engine (another
/// instance keeps them current now) and the published set, and are returned.
fn forget_groups(
    service: &RankingService,
    publisher: &mut Publisher,
    held: &[usize],
) -> Vec<(CategoryOrAll, Span)> {
    let gone: Vec<(CategoryOrAll, Span)> = publisher
        .published
        .iter()
        .filter(|(category, span)| !held.contains(&span_group(category, span)))
        .cloned()
        .collect();
    forget_in_engine(service, &gone);
    for key in &gone {
        publisher.published.remove(key);
    }
    publisher.groups = held.to_vec();
    publisher.gained.retain(|group| held.contains(group));
    gone
}

/// Takes `spans` out of `generation` in Redis, those still hot: a span that left the hot set is no
/// longer read from Redis and expires with its period.
async fn unpublish_hot(
    serving: &Serving,
    generation: u64,
    spans: &[(CategoryOrAll, Span)],
    now_millis: i64,
) -> anyhow::Result<()> {
    let now_hour = Hour::from_millis(now_millis);
    let still_hot: Vec<(CategoryOrAll, Span)> = spans
        .iter()
        .filter(|(_, span)| is_hot(span, now_hour, &serving.zone))
        .cloned()
        .collect();
    if !still_hot.is_empty() {
        serving.store.unpublish(generation, &still_hot).await?;
    }
    Ok(())
}

/// Drops `spans` from the engine's cache (and their change logs): this instance no longer publishes
/// them, so they would cost it per event for nobody.
fn forget_in_engine(service: &RankingService, spans: &[(CategoryOrAll, Span)]) {
    if spans.is_empty() {
        return;
    }
    let mut engine = service.engine().write();
    for (category, span) in spans {
        engine.forget_span(category, *span);
    }
}

/// What a publication round covers: the hot spans of this publisher's groups for every category the
/// engine knows, and with an idle time only those read within it on some instance (module docs:
/// demand).
async fn hot_requests(
    service: &RankingService,
    serving: &Serving,
    groups: &[usize],
    now_millis: i64,
) -> anyhow::Result<Vec<(CategoryOrAll, Span)>> {
    let mut requests = publication::hot_requests(
        &service.engine().read(),
        Hour::from_millis(now_millis),
        &serving.zone,
    );
    requests.retain(|(category, span)| groups.contains(&span_group(category, span)));
    if serving.idle_millis > 0 {
        let demand = serving
            .store
            .demand_since(now_millis.saturating_sub(serving.idle_millis))
            .await?;
        requests.retain(|(category, span)| demand.contains(&demand_member(category, span)));
    }
    Ok(requests)
}

/// Takes the spans published but no longer asked for out of Redis (when `generation` stays served) and
/// out of the engine, so they cost nothing per event; `publisher.published` becomes `requests` (the
/// spans about to be published). A span that left the hot set (the hour turned) is left in Redis to
/// expire with its period; only the engine forgets it.
async fn drop_idle_spans(
    service: &RankingService,
    serving: &Serving,
    generation: Option<u64>,
    requests: &[(CategoryOrAll, Span)],
    now_millis: i64,
    publisher: &mut Publisher,
) -> anyhow::Result<()> {
    let wanted: HashSet<(CategoryOrAll, Span)> = requests.iter().cloned().collect();
    let idle: Vec<(CategoryOrAll, Span)> = publisher.published.difference(&wanted).cloned().collect();
    if !idle.is_empty() {
        if let Some(generation) = generation {
            unpublish_hot(serving, generation, &idle, now_millis).await?;
        }
        forget_in_engine(service, &idle);
        tracing::debug!(
            spans = idle.len(),
            "hot spans nobody read lately taken out of redis"
        );
    }
    publisher.published = wanted;
    Ok(())
}

async fn publish_changes(
    service: &Arc<RankingService>,
    serving: &Arc<Serving>,
    generation: u64,
    now_millis: i64,
    publisher: &mut Publisher,
) -> anyhow::Result<()> {
    let requests = hot_requests(service, serving, &publisher.groups, now_millis).await?;
    drop_idle_spans(
        service,
        serving,
        Some(generation),
        &requests,
        now_millis,
        publisher,
    )
    .await?;
    // The spans of groups taken over go out whole; the others as changes since the last round.
    let gained = publisher.gained.clone();
    let kept = publisher.kept_groups();
    let (whole, changed): (Vec<_>, Vec<_>) = requests
        .into_iter()
        .partition(|(category, span)| gained.contains(&span_group(category, span)));
    let engine = service.engine().clone();
    let depth = serving.depth;
    let epoch = publisher.policy_epoch;
    let (publications, as_of, mixed) = tokio::task::spawn_blocking(move || {
        // asOf first: every slice then includes at least what it claims.
        let as_of = engine.read().as_of_millis();
        let mut publications =
            publication::take_publication_in_slices(&engine, &changed, depth, PublicationScope::Changes);
        publications.extend(publication::take_publication_in_slices(
            &engine,
            &whole,
            depth,
            PublicationScope::Everything,
        ));
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
    if publications.is_empty() && as_of == publisher.as_of_millis && gained.is_empty() {
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
    serving.store.add_group_costs(&publications).await?;
    let active = Active {
        generation,
        seq: 0,
        as_of_millis: as_of,
        popular_version: publisher.popular_version,
        depth: serving.depth,
        rebuild_requested: false,
    };
    if !gained.is_empty() {
        let written: Vec<SpanPublication> = publications
            .into_iter()
            .filter(|p| gained.contains(&span_group(&p.category, &p.span)))
            .collect();
        check_totals(&serving.store, generation, &written).await?;
        match serving
            .store
            .stamp(
                &serving.owner,
                &gained,
                &active,
                publisher.rebuilt,
                StampKind::SwitchGeneration,
            )
            .await?
        {
            Stamped::Done(_) => publisher.gained.retain(|group| !gained.contains(group)),
            // A lease ran out meanwhile: the next tick holds the groups again, or forgets them.
            Stamped::NotLeader | Stamped::Lost => return Ok(()),
        }
    }
    if kept.is_empty() {
        publisher.as_of_millis = as_of;
        return Ok(());
    }
    match serving
        .store
        .stamp(
            &serving.owner,
            &kept,
            &active,
            publisher.rebuilt,
            StampKind::NewerDataInCurrent,
        )
        .await?
    {
        Stamped::Done(_) => {
            publisher.as_of_millis = as_of;
            Ok(())
        }
        Stamped::NotLeader => {
            // A lease ran out while the round ran (an overloaded core): the writes are in this
            // generation, unstamped. The next tick holds the groups again; if nobody took one over
            // meanwhile its entry still names this generation and publishing goes on, else the
            // pointer check there rebuilds. Rebuilding here would only make the next round slower.
            Ok(())
        }
        Stamped::Lost => anyhow::bail!("the active serving pointer is gone"),
    }
}

/// Checks, before switching groups to `generation`, that Redis holds exactly the totals the engine has
/// for every span of `publications` (written whole); returns their categories.
async fn check_totals(
    store: &RedisServing,
    generation: u64,
    publications: &[SpanPublication],
) -> anyhow::Result<Vec<CategoryOrAll>> {
    let mut categories: Vec<CategoryOrAll> = publications.iter().map(|p| p.category.clone()).collect();
    categories.sort_unstable();
    categories.dedup();
    for category in &categories {
        let stored = store.totals(category, generation).await?;
        for publication in publications.iter().filter(|p| &p.category == category) {
            let field = span_field(&publication.span);
            anyhow::ensure!(
                stored.get(&field) == Some(&publication.totals),
                "generation {generation} holds {:?} for {category}/{field}, the engine {:?}; not switching",
                stored.get(&field),
                publication.totals
            );
        }
    }
    Ok(categories)
}

/// Rebuilds every group this publisher holds into a fresh generation, checks the totals, and points
/// the groups at it; `request` is the rebuild request (`rankgate rebuild`) this answers.
async fn rebuild(
    service: &Arc<RankingService>,
    serving: &Arc<Serving>,
    request: u64,
    now_millis: i64,
    lease_millis: u64,
    publisher: &mut Publisher,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let store = &serving.store;
    let previous = publisher.generation.take();
    let generation = store.new_generation().await?;
    let requests = hot_requests(service, serving, &publisher.groups, now_millis).await?;
    // The old generation is retired whole: only the engine must forget what is no longer read.
    drop_idle_spans(service, serving, None, &requests, now_millis, publisher).await?;
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
        return Ok(());
    }
    let published = store
        .publish(generation, &publications, &serving.zone, now_millis)
        .await?;
    anyhow::ensure!(
        published != Published::Lost,
        "rebuilt generation {generation} lost keys while it was written (Redis restarted or was flushed?); not switching"
    );
    let categories = check_totals(store, generation, &publications).await?;
    let active = Active {
        generation,
        seq: 0,
        as_of_millis: as_of,
        popular_version: policy,
        depth: serving.depth,
        rebuild_requested: false,
    };
    // Renewed right before switching, so a long rebuild does not switch groups it no longer holds.
    if store.hold_groups(&serving.owner, lease_millis).await? != publisher.groups {
        return Ok(());
    }
    match store
        .stamp(
            &serving.owner,
            &publisher.groups,
            &active,
            request,
            StampKind::SwitchGeneration,
        )
        .await?
    {
        Stamped::Done(_) => {}
        Stamped::NotLeader | Stamped::Lost => return Ok(()),
    }
    publisher.generation = Some(generation);
    publisher.gained.clear();
    publisher.popular_version = policy;
    publisher.policy_epoch = epoch;
    publisher.rebuilt = request;
    publisher.as_of_millis = as_of;
    metrics::counter!("rankgate_serving_rebuilds_total").increment(1);
    if let Published::Applied { writes, calls } = published {
        metrics::counter!("rankgate_serving_writes_total").increment(writes);
        metrics::counter!("rankgate_serving_calls_total").increment(calls);
        tracing::info!(
            generation,
            groups = publisher.groups.len(),
            spans = publications.len(),
            writes,
            calls,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "rankings rebuilt into redis and switched"
        );
    }
    if let Some(old) = previous.filter(|old| *old != generation) {
        store.retire(old, &categories).await?;
    }
    Ok(())
}

/// `rankgate rebuild` with `--redis`: asks for a rebuild of the serving store and waits until every span
/// group was rebuilt after the request. When no instance publishes (no server running), this process
/// takes every group and rebuilds them from `service` itself. Returns the newest generation served.
pub async fn rebuild_now(
    service: &Arc<RankingService>,
    serving: &Arc<Serving>,
    clock: &dyn Clock,
) -> anyhow::Result<u64> {
    let store = &serving.store;
    let request = store.request_rebuild().await?;
    let lease_millis = 60_000;
    if store.live_publishers().await? == 0 {
        let groups = store.hold_groups(&serving.owner, lease_millis).await?;
        let mut publisher = Publisher {
            groups,
            ..Publisher::default()
        };
        let result = if publisher.groups.len() == SPAN_GROUPS {
            rebuild(
                service,
                serving,
                request,
                clock.now_millis(),
                lease_millis,
                &mut publisher,
            )
            .await
        } else {
            Err(anyhow::anyhow!(
                "{} of the {SPAN_GROUPS} span groups are still leased by an instance that stopped \
                 moments ago; run the rebuild again in a few seconds",
                SPAN_GROUPS - publisher.groups.len()
            ))
        };
        store.leave_groups(&serving.owner).await?;
        result?;
        return publisher
            .generation
            .context("the rebuild could not switch (an instance started and took a group meanwhile)");
    }
    // Running instances publish: each sees the request at its next tick.
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    loop {
        if let Some(pointer) = store.pointer().await? {
            let entries: Vec<_> = pointer.groups.iter().flatten().collect();
            if entries.len() == SPAN_GROUPS && entries.iter().all(|entry| entry.rebuilt >= request) {
                return Ok(entries.iter().map(|entry| entry.generation).max().unwrap_or(0));
            }
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the publishing instances did not rebuild within 10 minutes; check their logs"
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
