//! The in-process ranking engine: hourly metrics in memory, and one sorted set per served
//! (ranker, category, span), kept current micro-batch by micro-batch.
//!
//! # How a batch flows through
//! 1. [`RankingEngine::apply`] adds each coalesced (hour, product) delta to the hourly table and to the
//!    metric totals of every cached span that contains the hour, for `all` and each of the product's
//!    categories, and marks the product dirty in those spans. Carry that depends on the touched day is
//!    invalidated for the following days.
//! 2. A read (or the background refresher) flushes a span: each dirty product is re-scored **from its
//!    span metrics** (never incremented blindly) and moved in the sorted sets. Coalescing happens here:
//!    a product touched by a thousand events since the last flush is re-scored once.
//!
//! Sorted sets hold the negated score ([`ascending_key`]) so the engine's Redis order (score, then member
//! bytes) is exactly the ranking order (score descending, product id ascending).
//!
//! Spans are created on first read from the hourly table, then kept incrementally; a bounded number of
//! members stays cached, least recently used spans are dropped first. Every span counts against that
//! bound, an empty one too ([`SPAN_OVERHEAD_MEMBERS`]), and so does every cached carry day.
//!
//! # Delisted products
//! A product the catalogue delists ([`RankingEngine::set_listed`]) keeps its metrics in every span, but
//! no sorted set holds it, so it has no rank, `total` leaves it out and the products below it move up.
//! It is also left out of the day rankings carry is taken from (a delisted product neither gets carry nor
//! takes one of the `carry_top_n` places), exactly as the batch recompute does. A change of the flag
//! marks the product dirty in every cached span of its categories and drops the carry it could have
//! touched, so the lock is held for a few map operations per span; the re-scoring happens at the next
//! flush, and the change log carries it to Redis like any re-score.
//!
//! # Cold spans
//! A read of a span that is not cached builds it with [`RankingEngine::build_span_in_steps`]: the hours
//! are read a slice at a time and the sorted sets are built with no lock held, so ingest's
//! [`RankingEngine::apply`] never waits for more than one slice. `apply` feeds the part already read, so
//! the installed span is exactly what a build from scratch would give.
//!
//! # Trending: scores that depend on the span's end hour
//! `trending` decays each hour's metrics by its age relative to the span's end hour E
//! ([`Span::trending_end`]), so its score is not a function of the span totals. Every product's cells are
//! also kept by product ([`ProductTable::cells`]), and re-scoring a product computes its decayed metrics from all its
//! hours in the span, in ascending order, never by adding a delta: the result is bit-identical to the
//! batch recompute however events arrived. E of a running period is the engine's current hour, so when
//! the hour turns ([`RankingEngine::advance_to_hour`]) every running period's cached span is dropped and
//! built again, in steps ([`RankingEngine::build_span_in_steps`]), as on a first read. Windows end at a
//! fixed hour and past periods at their last one, so they never move. Until the engine is told the hour,
//! every period counts as over (E = its last hour), so no hour is ever weighed as in the future of E
//! by more than the clock says.
//!
//! # Change logs
//! The engine does not know about Redis. A span that a reader follows ([`RankingEngine::take_span_changes`],
//! called by [`publication`](super::publication)) keeps a change log: while flushing, the engine notes per
//! ranker the products whose key moved, and the products whose metrics or carry moved. A span built anew
//! starts without a log, which tells the reader it must take the span whole.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

// foldhash (hashbrown's default), not SipHash: the hot maps are keyed by interned indexes and by
// hours, and SipHash was ~1,900 instructions per ingested event in callgrind profiles of ingest.
use hashbrown::{HashMap, HashSet};

use rankgate_core::carry::next_day_carry;
use rankgate_core::ids::{Category, CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, Zone};
use rankgate_core::ranker::{
    ascending_key, is_listed, score, trending_decay, Decayed, Policy, PopularWeights, RankerName, ScoreInputs,
};
use rankgate_zset::SortedSet;

/// One entry per ranker, in [`RankerName::ALL`] order.
const RANKERS: usize = RankerName::ALL.len();

/// Dense index of a product in the engine's tables.
type ProductIdx = u32;
/// Dense index of a category; 0 is `all`.
type CatIdx = u32;
const ALL: CatIdx = 0;

/// What a reader asks for: one ranking.
#[derive(Debug, Clone, PartialEq)]
pub struct RankingQuery {
    /// Which scoring policy.
    pub ranker: RankerName,
    /// `all` or one category.
    pub category: CategoryOrAll,
    /// Calendar period or sliding window.
    pub span: Span,
}

/// One listed product in a page of a ranking.
#[derive(Debug, Clone, PartialEq)]
pub struct RankedItem {
    /// 1-based rank.
    pub rank: usize,
    /// The product.
    pub product: ProductId,
    /// Its score under the ranker.
    pub score: f64,
    /// Its metrics summed over the span.
    pub metrics: Metrics,
    /// Its carry (popular daily rankings; 0 elsewhere).
    pub carry: f64,
}

/// A page of a ranking.
#[derive(Debug, Clone, PartialEq)]
pub struct TopPage {
    /// Policy version the scores come from.
    pub policy_version: u32,
    /// Number of listed products.
    pub total: usize,
    /// The requested page, in ranking order.
    pub items: Vec<RankedItem>,
    /// Time of the latest ingest the data includes.
    pub as_of_millis: Option<i64>,
}

/// One product's position in a ranking.
#[derive(Debug, Clone, PartialEq)]
pub struct RankAnswer {
    /// Policy version the score comes from.
    pub policy_version: u32,
    /// 1-based rank, or `None` when the product is not listed.
    pub rank: Option<usize>,
    /// Score when listed.
    pub score: Option<f64>,
    /// Metrics over the span (zero when unknown).
    pub metrics: Metrics,
    /// Carry (popular daily rankings).
    pub carry: f64,
    /// Number of listed products.
    pub total: usize,
    /// Time of the latest ingest the data includes.
    pub as_of_millis: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct SpanKey {
    category: CatIdx,
    span: Span,
}

/// A cached ranking span: metric totals per product and one sorted set per ranker.
#[derive(Debug, Clone)]
struct SpanState {
    hours: Range<Hour>,
    /// Start hour of the day for daily periods: only these get carry.
    day_start: Option<Hour>,
    metrics: HashMap<ProductIdx, Metrics>,
    carry: Arc<HashMap<ProductIdx, f64>>,
    /// `trending`'s end hour E the span is scored for ([`Span::trending_end`]).
    trending_end: Hour,
    /// The engine [`generation`](RankingEngine::generation) of the last change applied to the span (or
    /// of its build): a rebuild of it under a new policy is installed only if none came in between
    /// (equal totals are not enough: `trending` depends on which hour moved).
    applied: u64,
    rankings: [SortedSet; RANKERS],
    dirty: HashSet<ProductIdx>,
    /// The carry for this day must be recomputed before the next read.
    carry_stale: bool,
    /// LRU clock value of the last read; atomic so cached reads can bump it under a shared lock.
    last_used: Arc<AtomicU64>,
    /// What the engine re-scored since a reader last took this span's changes
    /// ([`RankingEngine::take_span_changes`]); `None` until a reader first takes them, so spans nobody
    /// follows (cold reads) keep no log.
    change_log: Option<Box<ChangeLog>>,
}

/// A span's change log, kept apart per ranker: a view moves a product's `popular` key but not its `units`
/// or `revenue` one, and a reader (the Redis publication) writes only what moved. Sets, so a product
/// touched by a thousand events is logged once.
#[derive(Debug, Clone, Default)]
struct ChangeLog {
    /// Products whose key (or listing) changed, per ranker.
    rankings: [HashSet<ProductIdx>; RANKERS],
    /// Products whose metrics or carry changed.
    details: HashSet<ProductIdx>,
}

impl SpanState {
    fn is_clean(&self) -> bool {
        self.dirty.is_empty() && !self.carry_stale
    }

    /// What this span counts against `max_cached_members`: its products plus a fixed overhead, so a flood
    /// of distinct empty spans is bounded by the cap like any other.
    fn cost(&self) -> usize {
        SPAN_OVERHEAD_MEMBERS + self.metrics.len()
    }
}

/// What an empty cached span costs against `max_cached_members`, in member-equivalents: even with no
/// product its maps, three sorted sets and index entries take about as much memory as a few members.
pub const SPAN_OVERHEAD_MEMBERS: usize = 4;
/// What one cached carry day costs against `max_cached_members`, besides one per carried product.
pub const CARRY_DAY_OVERHEAD_MEMBERS: usize = 1;
/// Hourly cells a cold build reads per hold of the engine lock: ingest waits at most this long for one.
const BUILD_CELLS_PER_STEP: usize = 32_768;
/// Carry days a cold build computes per hold of the engine lock.
const BUILD_CARRY_DAYS_PER_STEP: usize = 2;

/// A span being built in steps, each under a short hold of the write lock, so ingest runs in between.
///
/// Exactness: hours before `scanned_until` are folded into `metrics`, and [`RankingEngine::apply`] adds
/// every later change of those hours here too; hours from `scanned_until` on are read from the hourly table
/// when the build gets to them, changes included. So each change is counted exactly once.
#[derive(Debug)]
struct SpanBuild {
    hours: Range<Hour>,
    /// The daily period for daily spans: only these get carry.
    day: Option<PeriodKey>,
    scanned_until: Hour,
    metrics: HashMap<ProductIdx, Metrics>,
    /// `trending`'s end hour E this build decays for; the engine drops the build when E moves.
    trending_end: Hour,
    /// Decayed metrics of the hours scanned so far, summed hour by hour in ascending order.
    decayed: HashMap<ProductIdx, Decayed>,
    /// Products whose cells in already scanned hours changed (a late event, a new membership): their
    /// running sum is no longer in ascending order, so it is recomputed from their hours before scoring.
    decayed_stale: HashSet<ProductIdx>,
    /// Set once the span is being scored off the lock: the scorer holds a clone, so a build whose scorer
    /// went away (strong count 1) can be taken over.
    scoring: Option<Arc<()>>,
    /// Carry the scorer used; set with `scoring`.
    carry: Arc<HashMap<ProductIdx, f64>>,
    /// The `popular` and `trending` policies the scorer used; set with `scoring`.
    scored_policies: Option<(Policy, Policy)>,
    /// Products whose metrics changed since scoring started: re-scored when the span is installed.
    changed: HashSet<ProductIdx>,
    /// The carry the scorer used went stale during scoring.
    carry_stale: bool,
}

impl SpanBuild {
    fn has_scanned(&self, hour: Hour) -> bool {
        self.hours.start <= hour && hour < self.scanned_until
    }

    fn note_changed(&mut self, product: ProductIdx) {
        if self.scoring.is_some() {
            self.changed.insert(product);
        }
    }
}

/// What a cold build scores off the lock: every product of the span with its score inputs.
struct ScoringInput {
    key: SpanKey,
    entries: Vec<(ProductId, ScoreInputs)>,
    /// The `popular` and `trending` policies.
    policies: (Policy, Policy),
    token: Arc<()>,
}

impl ScoringInput {
    /// The sorted sets, built with no lock held: the costly part of a cold build.
    fn score(&self) -> [SortedSet; RANKERS] {
        let mut rankings: [SortedSet; RANKERS] = Default::default();
        for (product, inputs) in &self.entries {
            insert_scores(&mut rankings, product, inputs, &self.policies);
        }
        rankings
    }
}

/// Inserts `product` into every ranking that lists it, scored from `inputs` under the `popular` and
/// `trending` policies.
fn insert_scores(
    rankings: &mut [SortedSet; RANKERS],
    product: &ProductId,
    inputs: &ScoreInputs,
    policies: &(Policy, Policy),
) {
    for ranker in RankerName::ALL {
        if is_listed(ranker, inputs) {
            let weights = weights_for(ranker, &policies.0, &policies.1);
            rankings[ranker.index()]
                .insert(
                    product.as_str().as_bytes(),
                    ascending_key(score(ranker, inputs, weights)),
                )
                .expect("scores of finite metrics and weights are never NaN");
        }
    }
}

/// The weights `ranker` scores with: `trending`'s policy for `trending`, `popular`'s otherwise (`units`
/// and `revenue` use none).
fn weights_for<'a>(ranker: RankerName, popular: &'a Policy, trending: &'a Policy) -> &'a PopularWeights {
    match ranker {
        RankerName::Trending => &trending.weights,
        RankerName::Popular | RankerName::Units | RankerName::Revenue => &popular.weights,
    }
}

/// Where a cold build stands after one step; see [`RankingEngine::build_span_in_steps`].
enum BuildStep {
    /// The span is cached: answer from it.
    Cached,
    /// More to do: take the lock again.
    Continue,
    /// Another reader is scoring this span: wait for it to install.
    Wait,
    /// Score this off the lock, then install it.
    Score(ScoringInput),
}

/// What a cold build is doing when [`RankingEngine::build_span_in_steps_observed`] calls its observer,
/// always with no lock held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildPhase {
    /// Between two steps that read hours or compute carry.
    Between,
    /// Scoring the span's products off the lock, before installing it.
    Scoring,
}

#[derive(Debug, Default, Clone)]
struct ProductTable {
    ids: Vec<ProductId>,
    index: HashMap<Box<str>, ProductIdx>,
    /// Categories (never `ALL`) each product belongs to: the union of every category seen.
    categories: Vec<Vec<CatIdx>>,
    /// The inverse: products of each category, so small categories are summed product by product.
    members: HashMap<CatIdx, Vec<ProductIdx>>,
    /// Each product's hourly cells by hour, ascending (a copy of its cells in
    /// [`RankingEngine::hours`]): `trending` re-scores a product from all its hours in a span without
    /// scanning the span's other products or looking each hour up.
    cells: Vec<BTreeMap<Hour, Metrics>>,
    /// Products the catalogue delisted: in no ranking, whatever their metrics.
    delisted: HashSet<ProductIdx>,
}

impl ProductTable {
    fn intern(&mut self, product: &ProductId) -> ProductIdx {
        if let Some(&idx) = self.index.get(product.as_str()) {
            return idx;
        }
        let idx = ProductIdx::try_from(self.ids.len()).expect("fewer than 2^32 products");
        self.ids.push(product.clone());
        self.index.insert(product.as_str().into(), idx);
        self.categories.push(Vec::new());
        self.cells.push(BTreeMap::new());
        idx
    }

    fn in_category(&self, product: ProductIdx, category: CatIdx) -> bool {
        category == ALL || self.categories[product as usize].contains(&category)
    }

    /// Whether `product` may appear in rankings (the catalogue has not delisted it).
    fn is_shown(&self, product: ProductIdx) -> bool {
        !self.delisted.contains(&product)
    }
}

#[derive(Debug, Default, Clone)]
struct CategoryTable {
    names: Vec<Option<Category>>,
    index: HashMap<Box<str>, CatIdx>,
}

impl CategoryTable {
    fn new() -> CategoryTable {
        CategoryTable {
            names: vec![None],
            index: HashMap::new(),
        }
    }

    fn intern(&mut self, category: &Category) -> CatIdx {
        if let Some(&idx) = self.index.get(category.as_str()) {
            return idx;
        }
        let idx = CatIdx::try_from(self.names.len()).expect("fewer than 2^32 categories");
        self.names.push(Some(category.clone()));
        self.index.insert(category.as_str().into(), idx);
        idx
    }

    fn lookup(&self, category: &CategoryOrAll) -> Option<CatIdx> {
        match category {
            CategoryOrAll::All => Some(ALL),
            CategoryOrAll::Category(category) => self.index.get(category.as_str()).copied(),
        }
    }
}

/// Carry per (category, day start hour). Entries are only ever valid; invalidation removes them.
type CarryCache = HashMap<CatIdx, BTreeMap<Hour, Arc<HashMap<ProductIdx, f64>>>>;

/// Engine tuning.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Time zone of calendar periods.
    pub zone: Zone,
    /// Upper bound on product entries across cached spans before least recently used spans are dropped.
    pub max_cached_members: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            zone: Zone::utc(),
            max_cached_members: 5_000_000,
        }
    }
}

/// The in-process ranking engine. See the module docs for the data flow.
#[derive(Debug)]
pub struct RankingEngine {
    config: EngineConfig,
    products: ProductTable,
    categories: CategoryTable,
    /// Every retained hourly metric row: the engine's copy of the source of truth.
    hours: BTreeMap<Hour, HashMap<ProductIdx, Metrics>>,
    /// The `popular` policy.
    policy: Policy,
    /// The `trending` policy.
    trending_policy: Policy,
    /// The hour `trending` treats as current: E of running periods ([`RankingEngine::advance_to_hour`]).
    current_hour: Hour,
    spans: HashMap<SpanKey, SpanState>,
    spans_by_category: HashMap<CatIdx, Vec<Span>>,
    carry_cache: CarryCache,
    /// Spans being built in steps by [`RankingEngine::build_span_in_steps`], not yet servable. Few: one
    /// per concurrent cold read at most, and concurrent reads of one span share its build.
    builds: HashMap<SpanKey, SpanBuild>,
    /// Hourly cells a build step reads ([`BUILD_CELLS_PER_STEP`]; tests make it tiny).
    build_cells_per_step: usize,
    /// Spans a step of [`RankingEngine::rebuild_in_steps`] builds at most (besides its time bound;
    /// tests make it 1 so batches land between steps).
    rebuild_spans_per_step: usize,
    /// Start hour of the earliest day with metrics; the carry chain starts there with no carry.
    earliest_day: Option<Hour>,
    as_of_millis: Option<i64>,
    lru_clock: AtomicU64,
    /// Bumped by every change a reader could observe; response caches key on it.
    generation: u64,
    /// Bumped by every [`RankingEngine::install`]: a publication that saw two values mixed scores of
    /// two installs (a version number alone cannot tell, since a rollback returns to an earlier one).
    policy_epoch: u64,
    /// Bumped by every change of a listing flag ([`RankingEngine::set_listed`]): spans rebuilt off to the
    /// side under another value may rank a product the wrong way, so [`RankingEngine::install`] rebuilds
    /// them.
    listing_epoch: u64,
}

/// Spans rebuilt under a new policy of one ranker, off to the side, ready for [`RankingEngine::install`].
#[derive(Debug)]
pub struct RebuiltSpans {
    ranker: RankerName,
    /// The `popular` and `trending` policies the spans were scored under (one of them the new one).
    policies: (Policy, Policy),
    spans: HashMap<SpanKey, SpanState>,
    carry_cache: CarryCache,
    /// [`RankingEngine::listing_epoch`] when the rebuild started.
    listing_epoch: u64,
}

impl RebuiltSpans {
    /// The ranker whose policy was rebuilt.
    pub fn ranker(&self) -> RankerName {
        self.ranker
    }

    /// The policy of [`RebuiltSpans::ranker`] these spans were scored under.
    pub fn policy(&self) -> Policy {
        match self.ranker {
            RankerName::Trending => self.policies.1,
            RankerName::Popular | RankerName::Units | RankerName::Revenue => self.policies.0,
        }
    }
}

fn add_metrics(into: &mut Metrics, delta: &Metrics) {
    // Hourly cells are overflow-checked at ingest; span totals saturate rather than wrap.
    *into = into.checked_add(delta).unwrap_or(Metrics {
        views: into.views.saturating_add(delta.views),
        likes: into.likes.saturating_add(delta.likes),
        units: into.units.saturating_add(delta.units),
        sales: into.sales.saturating_add(delta.sales),
    });
}

/// Adds `delta` to `product`'s entry, dropping the entry when it comes back to zero: spans only hold
/// products with non-zero metrics (a product with none is listed nowhere, or only through its carry).
fn add_metrics_keeping_nonzero(
    metrics: &mut HashMap<ProductIdx, Metrics>,
    product: ProductIdx,
    delta: &Metrics,
) {
    let entry = metrics.entry(product).or_default();
    add_metrics(entry, delta);
    if entry.is_zero() {
        metrics.remove(&product);
    }
}

/// Sets `product`'s entry to `total`, or drops it when `total` is zero.
fn set_metrics_keeping_nonzero(
    metrics: &mut HashMap<ProductIdx, Metrics>,
    product: ProductIdx,
    total: Metrics,
) {
    if total.is_zero() {
        metrics.remove(&product);
    } else {
        metrics.insert(product, total);
    }
}

/// Read-only inputs every span and carry computation needs; borrowed apart from the mutable caches.
struct Inputs<'a> {
    zone: &'a Zone,
    products: &'a ProductTable,
    hours: &'a BTreeMap<Hour, HashMap<ProductIdx, Metrics>>,
    earliest_day: Option<Hour>,
    /// The `popular` policy.
    policy: &'a Policy,
    /// The `trending` policy.
    trending: &'a Policy,
    /// The current hour: E of running periods.
    now: Hour,
}

impl Inputs<'_> {
    /// `product`'s decayed metrics over `hours` for a span ending at `end`: every hour it has a cell in,
    /// ascending, from the hourly table (never a running sum patched with deltas).
    fn decayed_of(&self, product: ProductIdx, hours: Range<Hour>, end: Hour) -> Decayed {
        let mut decayed = Decayed::default();
        for (hour, metrics) in self.products.cells[product as usize].range(hours) {
            decayed.add_hour(end, *hour, metrics, self.trending.weights.half_life_hours);
        }
        decayed
    }

    /// What `product` is scored from in `state`.
    fn score_inputs(&self, state: &SpanState, product: ProductIdx) -> ScoreInputs {
        ScoreInputs {
            metrics: state.metrics.get(&product).copied().unwrap_or_default(),
            carry: state.carry.get(&product).copied().unwrap_or(0.0),
            decayed: self.decayed_of(product, state.hours.clone(), state.trending_end),
        }
    }

    fn aggregate(&self, category: CatIdx, hours: Range<Hour>) -> HashMap<ProductIdx, Metrics> {
        let mut totals: HashMap<ProductIdx, Metrics> = HashMap::new();
        let span_cells = self.hours.range(hours.clone());
        let members = (category != ALL).then(|| {
            self.products
                .members
                .get(&category)
                .map_or(&[][..], Vec::as_slice)
        });
        match members {
            // A small category: look its products up hour by hour instead of scanning every cell.
            Some(members)
                if members.len() * span_cells.clone().count()
                    < span_cells.clone().map(|(_, c)| c.len()).sum() =>
            {
                for cells in span_cells.map(|(_, cells)| cells) {
                    for product in members {
                        if let Some(delta) = cells.get(product) {
                            add_metrics(totals.entry(*product).or_default(), delta);
                        }
                    }
                }
            }
            _ => {
                for cells in span_cells.map(|(_, cells)| cells) {
                    for (&product, delta) in cells {
                        if self.products.in_category(product, category) {
                            add_metrics(totals.entry(product).or_default(), delta);
                        }
                    }
                }
            }
        }
        totals.retain(|_, m| !m.is_zero());
        totals
    }

    /// Adds the cells of `hours` for `category` into `totals`, and decayed for a span ending at
    /// `trending_end` into `decayed`, hour by hour in ascending order, stopping before the first hour that
    /// would take it past `max_cells` cells read (always reading at least one hour). Returns the first hour
    /// not read: `hours.end` when done.
    fn aggregate_into(
        &self,
        totals: &mut HashMap<ProductIdx, Metrics>,
        decayed: &mut HashMap<ProductIdx, Decayed>,
        trending_end: Hour,
        category: CatIdx,
        hours: Range<Hour>,
        max_cells: usize,
    ) -> Hour {
        let half_life = self.trending.weights.half_life_hours;
        let members = (category != ALL).then(|| {
            self.products
                .members
                .get(&category)
                .map_or(&[][..], Vec::as_slice)
        });
        let mut cells_read = 0;
        for (hour, cells) in self.hours.range(hours.clone()) {
            if cells_read >= max_cells {
                return *hour;
            }
            let decay = trending_decay(trending_end, *hour, half_life);
            let mut add = |product: ProductIdx, delta: &Metrics| {
                add_metrics_keeping_nonzero(totals, product, delta);
                decayed.entry(product).or_default().add_decayed(delta, decay);
            };
            match members {
                // A small category: look its products up instead of scanning every cell of the hour.
                Some(members) if members.len() < cells.len() => {
                    for product in members {
                        if let Some(delta) = cells.get(product) {
                            add(*product, delta);
                        }
                    }
                    cells_read += members.len();
                }
                _ => {
                    for (&product, delta) in cells {
                        if self.products.in_category(product, category) {
                            add(product, delta);
                        }
                    }
                    cells_read += cells.len();
                }
            }
        }
        hours.end
    }

    /// carry(category, day): walks back to the nearest known day, then forward, caching each day.
    fn carry_for(
        &self,
        cache: &mut CarryCache,
        category: CatIdx,
        day: PeriodKey,
    ) -> Arc<HashMap<ProductIdx, f64>> {
        self.carry_for_within(cache, category, day, usize::MAX)
            .expect("an unlimited budget finishes the chain")
    }

    /// Like [`Inputs::carry_for`], but computes at most `budget` missing days (oldest first, each cached)
    /// and returns `None` when more remain: cold builds walk a long chain in short lock holds.
    fn carry_for_within(
        &self,
        cache: &mut CarryCache,
        category: CatIdx,
        day: PeriodKey,
        budget: usize,
    ) -> Option<Arc<HashMap<ProductIdx, f64>>> {
        let Some(earliest) = self.earliest_day else {
            return Some(Arc::default());
        };
        let per_category = cache.entry(category).or_default();
        let mut missing = Vec::new();
        let mut cursor = day;
        let mut known: Arc<HashMap<ProductIdx, f64>> = loop {
            let start = cursor.hours(self.zone).start;
            if start <= earliest {
                break Arc::default();
            }
            if let Some(carry) = per_category.get(&start) {
                break carry.clone();
            }
            missing.push(cursor);
            cursor = cursor.prev(self.zone);
        };
        let finishes = missing.len() <= budget;
        // `cursor` is the day whose carry is `known`; compute each following day from it.
        for target in missing.into_iter().rev().take(budget) {
            let metrics = self.aggregate(category, cursor.hours(self.zone));
            let mut candidates: Vec<(ProductIdx, Metrics, f64)> = metrics
                .iter()
                .map(|(&p, m)| (p, *m, known.get(&p).copied().unwrap_or(0.0)))
                .collect();
            candidates.extend(
                known
                    .iter()
                    .filter(|(p, _)| !metrics.contains_key(*p))
                    .map(|(&p, &c)| (p, Metrics::default(), c)),
            );
            let products = self.products;
            // A delisted product is in no day ranking, so it takes no carry place.
            let carried = next_day_carry(
                candidates
                    .into_iter()
                    .filter(|(p, _, _)| products.is_shown(*p))
                    .map(|(p, m, c)| (ProductKey(p, products), m, c)),
                &self.policy.weights,
            );
            known = Arc::new(carried.into_iter().map(|(key, carry)| (key.0, carry)).collect());
            per_category.insert(target.hours(self.zone).start, known.clone());
            cursor = target;
        }
        finishes.then_some(known)
    }

    fn build_span(&self, cache: &mut CarryCache, key: SpanKey) -> SpanState {
        let hours = key.span.hours(self.zone);
        let day = match key.span {
            Span::Period(period) if period.kind() == PeriodKind::Daily => Some(period),
            _ => None,
        };
        let carry = match day {
            Some(day) => self.carry_for(cache, key.category, day),
            None => Arc::default(),
        };
        let trending_end = key.span.trending_end(self.zone, self.now);
        let (mut metrics, mut decayed) = (HashMap::new(), HashMap::new());
        self.aggregate_into(
            &mut metrics,
            &mut decayed,
            trending_end,
            key.category,
            hours.clone(),
            usize::MAX,
        );
        let mut state = SpanState {
            hours,
            day_start: day.map(|d| d.hours(self.zone).start),
            metrics,
            carry,
            trending_end,
            applied: 0,
            rankings: Default::default(),
            dirty: HashSet::new(),
            carry_stale: false,
            last_used: Arc::new(AtomicU64::new(0)),
            change_log: None,
        };
        let policies = (*self.policy, *self.trending);
        // Delisted products keep their metrics in the span but are in no ranking.
        for (product, decayed) in decayed.iter().filter(|(p, _)| self.products.is_shown(**p)) {
            let inputs = ScoreInputs {
                metrics: state.metrics.get(product).copied().unwrap_or_default(),
                carry: state.carry.get(product).copied().unwrap_or(0.0),
                decayed: *decayed,
            };
            insert_scores(
                &mut state.rankings,
                &self.products.ids[*product as usize],
                &inputs,
                &policies,
            );
        }
        // Products listed only through their carry have no cell in the span.
        let carried_only: Vec<ProductIdx> = state
            .carry
            .keys()
            .filter(|p| !decayed.contains_key(*p) && self.products.is_shown(**p))
            .copied()
            .collect();
        for product in carried_only {
            let inputs = ScoreInputs {
                carry: state.carry[&product],
                ..ScoreInputs::default()
            };
            insert_scores(
                &mut state.rankings,
                &self.products.ids[product as usize],
                &inputs,
                &policies,
            );
        }
        state
    }

    fn rescore_dirty(&self, state: &mut SpanState) {
        if let Some(log) = &mut state.change_log {
            log.details.extend(state.dirty.iter().copied());
        }
        let dirty = std::mem::take(&mut state.dirty);
        for product in dirty {
            let inputs = self.score_inputs(state, product);
            let member = self.products.ids[product as usize].as_str().as_bytes();
            let shown = self.products.is_shown(product);
            for ranker in RankerName::ALL {
                let weights = weights_for(ranker, self.policy, self.trending);
                let ranking = &mut state.rankings[ranker.index()];
                let key = (shown && is_listed(ranker, &inputs))
                    .then(|| ascending_key(score(ranker, &inputs, weights)));
                if let Some(log) = &mut state.change_log {
                    if ranking.zscore(member).map(f64::to_bits) != key.map(f64::to_bits) {
                        log.rankings[ranker.index()].insert(product);
                    }
                }
                match key {
                    Some(key) => {
                        ranking
                            .insert(member, key)
                            .expect("scores of finite metrics and weights are never NaN");
                    }
                    None => {
                        ranking.zrem(member);
                    }
                }
            }
        }
    }
}

/// What the engine re-scored in a span since a reader last took its change log
/// ([`RankingEngine::take_span_changes`]).
#[derive(Debug, Clone, PartialEq)]
pub enum SpanChanges {
    /// The span was built since the last take (first read, a policy switch, rebuilt after eviction), so no
    /// log covers the time in between: only the whole span describes it. Its log starts now.
    Rebuilt,
    /// Products re-scored since the last take, each once however many events touched it, in product id
    /// order.
    Rescored {
        /// Per ranker, in [`RankerName::ALL`] order: products whose key moved, or that were listed or
        /// unlisted.
        rankings: [Vec<ProductId>; RANKERS],
        /// Products whose metrics or carry may have moved.
        details: Vec<ProductId>,
    },
}

impl SpanChanges {
    /// Nothing was re-scored since the last take.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        match self {
            SpanChanges::Rebuilt => false,
            SpanChanges::Rescored { rankings, details } => {
                details.is_empty() && rankings.iter().all(Vec::is_empty)
            }
        }
    }
}

/// One cached span, read-only, as [`RankingEngine::take_span_changes`] hands it out with its changes.
#[derive(Debug, Clone, Copy)]
pub struct CachedSpan<'a> {
    products: &'a ProductTable,
    state: &'a SpanState,
}

impl<'a> CachedSpan<'a> {
    /// Listed products of `ranker`.
    #[must_use]
    pub fn total(&self, ranker: RankerName) -> usize {
        self.state.rankings[ranker.index()].len()
    }

    /// `product`'s ascending key ([`ascending_key`]) under `ranker`, `None` when it is not listed.
    #[must_use]
    pub fn key(&self, ranker: RankerName, product: &ProductId) -> Option<f64> {
        self.state.rankings[ranker.index()].zscore(product.as_str().as_bytes())
    }

    /// `ranker`'s listed products in ranking order, with their ascending keys.
    pub fn ranked(&self, ranker: RankerName) -> impl Iterator<Item = (&'a ProductId, f64)> + 'a {
        let products = self.products;
        self.state.rankings[ranker.index()]
            .iter_from_rank(0)
            .map(move |(member, key)| {
                let member = std::str::from_utf8(member).expect("members are product ids");
                (&products.ids[products.index[member] as usize], key)
            })
    }

    /// `product`'s metrics over the span and its popular carry while any ranker lists it, else `None`.
    #[must_use]
    pub fn detail(&self, product: &ProductId) -> Option<(Metrics, f64)> {
        let idx = self.products.index.get(product.as_str())?;
        let member = product.as_str().as_bytes();
        let listed = self
            .state
            .rankings
            .iter()
            .any(|ranking| ranking.zscore(member).is_some());
        let metrics = self.state.metrics.get(idx).copied().unwrap_or_default();
        let carry = self.state.carry.get(idx).copied().unwrap_or(0.0);
        listed.then_some((metrics, carry))
    }
}

/// Orders candidates by product id bytes inside `next_day_carry` while carrying the dense index.
#[derive(Clone)]
struct ProductKey<'a>(ProductIdx, &'a ProductTable);

impl AsRef<[u8]> for ProductKey<'_> {
    fn as_ref(&self) -> &[u8] {
        self.1.ids[self.0 as usize].as_str().as_bytes()
    }
}

impl RankingEngine {
    /// An empty engine serving `policy` for `popular` and version 1 of `trending` (see
    /// [`RankingEngine::set_trending_policy`]).
    pub fn new(config: EngineConfig, policy: Policy) -> RankingEngine {
        RankingEngine {
            config,
            products: ProductTable::default(),
            categories: CategoryTable::new(),
            hours: BTreeMap::new(),
            policy,
            trending_policy: Policy::initial_for(RankerName::Trending),
            // No clock yet: every period counts as over (see the module docs).
            current_hour: Hour(i64::MAX),
            spans: HashMap::new(),
            spans_by_category: HashMap::new(),
            carry_cache: HashMap::new(),
            builds: HashMap::new(),
            build_cells_per_step: BUILD_CELLS_PER_STEP,
            rebuild_spans_per_step: usize::MAX,
            earliest_day: None,
            as_of_millis: None,
            lru_clock: AtomicU64::new(1),
            generation: 0,
            policy_epoch: 0,
            listing_epoch: 0,
        }
    }

    /// Sets how many hourly cells one step of a cold build reads under the lock (at least one hour is read
    /// per step whatever the value). Tests set it to 1, so batches land between every hour of a build.
    pub fn set_build_cells_per_step(&mut self, cells: usize) {
        self.build_cells_per_step = cells;
    }

    /// Caps the spans one step of [`RankingEngine::rebuild_in_steps`] builds (tests: 1).
    pub fn set_rebuild_spans_per_step(&mut self, spans: usize) {
        self.rebuild_spans_per_step = spans.max(1);
    }

    /// The active `popular` policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The active policy of a configurable ranker (`popular` or `trending`; `popular`'s for the others).
    pub fn policy_of(&self, ranker: RankerName) -> Policy {
        match ranker {
            RankerName::Trending => self.trending_policy,
            RankerName::Popular | RankerName::Units | RankerName::Revenue => self.policy,
        }
    }

    /// Starts the engine on `policy` for `trending` (before any span is cached: a running engine
    /// changes policies with [`RankingEngine::rebuild_in_steps`] and [`RankingEngine::install`]).
    pub fn set_trending_policy(&mut self, policy: Policy) {
        self.trending_policy = policy;
        self.spans.clear();
        self.spans_by_category.clear();
        self.builds.clear();
        self.generation += 1;
    }

    /// The hour `trending` treats as current.
    pub fn current_hour(&self) -> Hour {
        self.current_hour
    }

    /// Moves the current hour to `now` (the server clock's hour; the refresher calls it every tick).
    /// `trending`'s end hour E of a running period is the current hour, so every cached span whose E
    /// moves is dropped, and so is any build of one; the caller builds them again in steps
    /// ([`RankingEngine::build_span_in_steps`], in short lock holds) with the queries returned, as a first
    /// read would. Windows and past periods keep their E, and their spans.
    pub fn advance_to_hour(&mut self, now: Hour) -> Vec<RankingQuery> {
        let before = std::mem::replace(&mut self.current_hour, now);
        if before == now {
            return Vec::new();
        }
        // Answers of running periods change even when none of their spans is cached (a response cache
        // may still hold one).
        self.generation += 1;
        let zone = &self.config.zone;
        let moved = |key: &SpanKey| key.span.trending_end(zone, before) != key.span.trending_end(zone, now);
        self.builds.retain(|key, _| !moved(key));
        let dropped: Vec<SpanKey> = self.spans.keys().filter(|key| moved(key)).copied().collect();
        for key in &dropped {
            self.spans.remove(key);
        }
        for (category, spans) in &mut self.spans_by_category {
            spans.retain(|span| {
                !dropped.contains(&SpanKey {
                    category: *category,
                    span: *span,
                })
            });
        }
        dropped
            .into_iter()
            .map(|key| {
                let category = match &self.categories.names[key.category as usize] {
                    None => CategoryOrAll::All,
                    Some(category) => CategoryOrAll::Category(category.clone()),
                };
                RankingQuery {
                    ranker: RankerName::Trending,
                    category,
                    span: key.span,
                }
            })
            .collect()
    }

    /// Changes with every [`RankingEngine::install`] (a policy switch, a rollback or a rebuild): scores
    /// read under two different epochs may come from different policies.
    pub fn policy_epoch(&self) -> u64 {
        self.policy_epoch
    }

    /// A counter that changes whenever any answer could change (ingest, policy switch, eviction). Equal
    /// generations mean equal answers, so responses can be cached against it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Time of the latest ingest applied.
    pub fn as_of_millis(&self) -> Option<i64> {
        self.as_of_millis
    }

    /// Number of products ever seen.
    pub fn product_count(&self) -> usize {
        self.products.ids.len()
    }

    /// The hourly cell of (hour, product), zero if absent. Ingest uses it to reject overflowing events.
    pub fn hourly_metrics(&self, hour: Hour, product: &ProductId) -> Metrics {
        let Some(&idx) = self.products.index.get(product.as_str()) else {
            return Metrics::default();
        };
        self.hours
            .get(&hour)
            .and_then(|cells| cells.get(&idx))
            .copied()
            .unwrap_or_default()
    }

    /// Whether `product` is already known to belong to `category`.
    pub fn has_membership(&self, product: &ProductId, category: &Category) -> bool {
        let (Some(&p), Some(&c)) = (
            self.products.index.get(product.as_str()),
            self.categories.index.get(category.as_str()),
        ) else {
            return false;
        };
        self.products.categories[p as usize].contains(&c)
    }

    /// The range of hours that hold metrics.
    pub fn hour_range(&self) -> Option<Range<Hour>> {
        let first = *self.hours.keys().next()?;
        let last = *self.hours.keys().next_back()?;
        Some(first..Hour(last.0 + 1))
    }

    /// Every hourly row, for verification.
    pub fn hourly_rows(&self) -> impl Iterator<Item = (Hour, &ProductId, &Metrics)> + '_ {
        self.hours.iter().flat_map(move |(hour, cells)| {
            cells
                .iter()
                .map(move |(p, m)| (*hour, &self.products.ids[*p as usize], m))
        })
    }

    fn inputs(&self) -> Inputs<'_> {
        Inputs {
            zone: &self.config.zone,
            products: &self.products,
            hours: &self.hours,
            earliest_day: self.earliest_day,
            policy: &self.policy,
            trending: &self.trending_policy,
            now: self.current_hour,
        }
    }

    /// Applies one committed micro-batch: new memberships, then coalesced metric deltas.
    pub fn apply(
        &mut self,
        deltas: &[(Hour, ProductId, Metrics)],
        memberships: &[(ProductId, Category)],
        as_of_millis: Option<i64>,
    ) {
        self.generation += 1;
        let mut new_memberships = Vec::new();
        for (product, category) in memberships {
            let p = self.products.intern(product);
            let c = self.categories.intern(category);
            let categories = &mut self.products.categories[p as usize];
            if !categories.contains(&c) {
                categories.push(c);
                self.products.members.entry(c).or_default().push(p);
                new_memberships.push((p, c));
            }
        }
        // The cached spans of (category, hour), found once per batch rather than once per delta: a batch
        // mostly touches one or two hours, and a category can have many cached spans.
        let mut containing: HashMap<(CatIdx, Hour), Vec<Span>> = HashMap::new();
        for (hour, product, delta) in deltas {
            let p = self.products.intern(product);
            add_metrics(self.hours.entry(*hour).or_default().entry(p).or_default(), delta);
            add_metrics(self.products.cells[p as usize].entry(*hour).or_default(), delta);
            self.note_day_changed(*hour, p);
            let categories = std::iter::once(ALL).chain(self.products.categories[p as usize].iter().copied());
            for category in categories {
                let spans = containing.entry((category, *hour)).or_insert_with(|| {
                    self.spans_by_category
                        .get(&category)
                        .into_iter()
                        .flatten()
                        .filter(|span| {
                            self.spans[&SpanKey {
                                category,
                                span: **span,
                            }]
                                .hours
                                .contains(hour)
                        })
                        .copied()
                        .collect()
                });
                for span in spans.iter() {
                    let state = self
                        .spans
                        .get_mut(&SpanKey {
                            category,
                            span: *span,
                        })
                        .expect("indexed span");
                    add_metrics_keeping_nonzero(&mut state.metrics, p, delta);
                    state.dirty.insert(p);
                    state.applied = self.generation;
                }
                for (key, build) in &mut self.builds {
                    if key.category == category && build.has_scanned(*hour) {
                        add_metrics_keeping_nonzero(&mut build.metrics, p, delta);
                        build.decayed_stale.insert(p);
                        build.note_changed(p);
                    }
                }
            }
        }
        for (p, c) in new_memberships {
            // The product's past now counts in `c` too: recompute its totals in every cached span of `c`,
            // and in the part of every span of `c` being built that the build has already read.
            let sum_over = |hours: Range<Hour>| {
                let mut total = Metrics::default();
                for cells in self.hours.range(hours).map(|(_, cells)| cells) {
                    if let Some(m) = cells.get(&p) {
                        add_metrics(&mut total, m);
                    }
                }
                total
            };
            if let Some(spans) = self.spans_by_category.get(&c) {
                for span in spans {
                    let key = SpanKey {
                        category: c,
                        span: *span,
                    };
                    let total = sum_over(self.spans[&key].hours.clone());
                    let state = self.spans.get_mut(&key).expect("indexed span");
                    set_metrics_keeping_nonzero(&mut state.metrics, p, total);
                    state.dirty.insert(p);
                    state.applied = self.generation;
                }
            }
            for (key, build) in &mut self.builds {
                if key.category == c {
                    let total = sum_over(build.hours.start..build.scanned_until);
                    set_metrics_keeping_nonzero(&mut build.metrics, p, total);
                    build.decayed_stale.insert(p);
                    build.note_changed(p);
                }
            }
            self.invalidate_carry_after(c, None);
        }
        if as_of_millis.is_some() {
            self.as_of_millis = as_of_millis.max(self.as_of_millis);
        }
    }

    /// Applies absolute hourly values written by other instances (a change feed): each row becomes the
    /// delta from what this engine holds, so rows it already applied itself change nothing.
    pub fn apply_absolute(
        &mut self,
        rows: &[(Hour, ProductId, Metrics)],
        memberships: &[(ProductId, Category)],
        as_of_millis: Option<i64>,
    ) {
        let deltas: Vec<(Hour, ProductId, Metrics)> = rows
            .iter()
            .filter_map(|(hour, product, value)| {
                let delta = value.checked_sub(&self.hourly_metrics(*hour, product))?;
                (!delta.is_zero()).then(|| (*hour, product.clone(), delta))
            })
            .collect();
        let new_memberships: Vec<(ProductId, Category)> = memberships
            .iter()
            .filter(|(p, c)| !self.has_membership(p, c))
            .cloned()
            .collect();
        if deltas.is_empty() && new_memberships.is_empty() && as_of_millis <= self.as_of_millis {
            return;
        }
        self.apply(&deltas, &new_memberships, as_of_millis);
    }

    /// Applies catalogue listing flags: `false` takes the product out of every ranking (every ranker,
    /// category and span, cached or being built) while its metrics keep counting; `true` puts it back.
    /// Flags equal to the current ones change nothing. Holds the lock for a few map operations per cached
    /// span of the product's categories: the product is marked dirty where it has metrics or carry, and
    /// the carry of the days after its first active day is dropped (it may have held a carry place); the
    /// next flush re-scores.
    pub fn set_listed(&mut self, listings: &[(ProductId, bool)]) {
        for (product, listed) in listings {
            let p = self.products.intern(product);
            let changed = if *listed {
                self.products.delisted.remove(&p)
            } else {
                self.products.delisted.insert(p)
            };
            if !changed {
                continue;
            }
            self.generation += 1;
            self.listing_epoch += 1;
            // Nothing cached yet (the flags a start loads): nothing to mark or drop, so skip the scan.
            let anything_cached =
                !(self.spans.is_empty() && self.builds.is_empty() && self.carry_cache.is_empty());
            let first_active_day = anything_cached
                .then(|| self.hours.iter().find(|(_, cells)| cells.contains_key(&p)))
                .flatten()
                .map(|(hour, _)| {
                    PeriodKey::containing(PeriodKind::Daily, *hour, &self.config.zone)
                        .hours(&self.config.zone)
                        .start
                });
            let categories: Vec<CatIdx> = std::iter::once(ALL)
                .chain(self.products.categories[p as usize].iter().copied())
                .collect();
            for category in categories {
                for span in self.spans_by_category.get(&category).into_iter().flatten() {
                    let state = self
                        .spans
                        .get_mut(&SpanKey {
                            category,
                            span: *span,
                        })
                        .expect("indexed span");
                    // `trending` can list a product whose summed metrics are zero (a like and its
                    // unlike in different hours), so a cell in the span counts too.
                    let has_cell = self.products.cells[p as usize]
                        .range(state.hours.clone())
                        .next()
                        .is_some();
                    if has_cell || state.metrics.contains_key(&p) || state.carry.contains_key(&p) {
                        state.dirty.insert(p);
                    }
                }
                for (key, build) in &mut self.builds {
                    if key.category == category {
                        build.note_changed(p);
                    }
                }
                // Carry comes from earlier days' rankings: only days after the product's first active
                // day can differ (a product with no metrics has no score, so it held no carry place).
                if let Some(day_start) = first_active_day {
                    self.invalidate_carry_after(category, Some(day_start));
                }
            }
        }
    }

    /// Whether the catalogue has delisted `product`.
    pub fn is_delisted(&self, product: &ProductId) -> bool {
        self.products
            .index
            .get(product.as_str())
            .is_some_and(|p| !self.products.is_shown(*p))
    }

    fn note_day_changed(&mut self, hour: Hour, product: ProductIdx) {
        let day = PeriodKey::containing(PeriodKind::Daily, hour, &self.config.zone);
        let day_start = day.hours(&self.config.zone).start;
        if self.earliest_day.is_none_or(|earliest| day_start < earliest) {
            self.earliest_day = Some(day_start);
            // The chain now starts earlier: every carry is different.
            self.carry_cache.clear();
            for state in self.spans.values_mut() {
                state.carry_stale |= state.day_start.is_some();
            }
            for build in self.builds.values_mut() {
                build.carry_stale |= build.day.is_some();
            }
            return;
        }
        let categories: Vec<CatIdx> = std::iter::once(ALL)
            .chain(self.products.categories[product as usize].iter().copied())
            .collect();
        for category in categories {
            self.invalidate_carry_after(category, Some(day_start));
        }
    }

    /// Forgets carry of `category` for days after `day_start` (all days when `None`).
    fn invalidate_carry_after(&mut self, category: CatIdx, day_start: Option<Hour>) {
        if let Some(per_category) = self.carry_cache.get_mut(&category) {
            match day_start {
                Some(start) => drop(per_category.split_off(&Hour(start.0 + 1))),
                None => per_category.clear(),
            }
        }
        if let Some(spans) = self.spans_by_category.get(&category) {
            for span in spans {
                let state = self
                    .spans
                    .get_mut(&SpanKey {
                        category,
                        span: *span,
                    })
                    .expect("indexed span");
                if let Some(start) = state.day_start {
                    if day_start.is_none_or(|changed| start > changed) {
                        state.carry_stale = true;
                    }
                }
            }
        }
        let zone = &self.config.zone;
        for (key, build) in &mut self.builds {
            if let (true, Some(day)) = (key.category == category, build.day) {
                if day_start.is_none_or(|changed| day.hours(zone).start > changed) {
                    build.carry_stale = true;
                }
            }
        }
    }

    fn flush(&mut self, key: SpanKey) {
        let Some(state) = self.spans.get(&key) else { return };
        if state.is_clean() {
            return;
        }
        let new_carry = match (state.carry_stale, state.day_start) {
            (true, Some(start)) => {
                let day = PeriodKey::containing(PeriodKind::Daily, start, &self.config.zone);
                let mut cache = std::mem::take(&mut self.carry_cache);
                let carry = self.inputs().carry_for(&mut cache, key.category, day);
                self.carry_cache = cache;
                Some(carry)
            }
            _ => None,
        };
        let mut state = self.spans.remove(&key).expect("span exists");
        if let Some(new_carry) = new_carry {
            for (p, c) in new_carry.iter() {
                if state.carry.get(p) != Some(c) {
                    state.dirty.insert(*p);
                }
            }
            for p in state.carry.keys() {
                if !new_carry.contains_key(p) {
                    state.dirty.insert(*p);
                }
            }
            state.carry = new_carry;
        }
        state.carry_stale = false;
        self.inputs().rescore_dirty(&mut state);
        self.spans.insert(key, state);
    }

    /// Flushes every dirty span: the background refresher calls this so reads rarely have to.
    pub fn flush_all(&mut self) {
        let dirty: Vec<SpanKey> = self
            .spans
            .iter()
            .filter(|(_, state)| !state.is_clean())
            .map(|(key, _)| *key)
            .collect();
        for key in dirty {
            self.flush(key);
        }
    }

    fn span_key(&self, query: &RankingQuery) -> Option<SpanKey> {
        Some(SpanKey {
            category: self.categories.lookup(&query.category)?,
            span: query.span,
        })
    }

    fn ensure_span(&mut self, key: SpanKey) -> &SpanState {
        if !self.spans.contains_key(&key) {
            // A step-wise build of the same span, if any, is superseded by this one.
            self.builds.remove(&key);
            let mut cache = std::mem::take(&mut self.carry_cache);
            let mut state = self.inputs().build_span(&mut cache, key);
            state.applied = self.generation;
            self.carry_cache = cache;
            self.spans.insert(key, state);
            self.spans_by_category
                .entry(key.category)
                .or_default()
                .push(key.span);
            self.evict_least_recently_used(key);
        } else {
            self.flush(key);
        }
        let state = &self.spans[&key];
        state.last_used.store(
            self.lru_clock.fetch_add(1, AtomicOrdering::Relaxed),
            AtomicOrdering::Relaxed,
        );
        state
    }

    /// What the cached spans and carry days count against `max_cached_members` (see
    /// [`SPAN_OVERHEAD_MEMBERS`]): an empty span or carry day still costs its overhead.
    pub fn cached_cost(&self) -> usize {
        let spans: usize = self.spans.values().map(SpanState::cost).sum();
        spans + self.carry_cost()
    }

    /// Whether the span of (`category`, `span`) is cached (ready to serve, maybe dirty); `true` for a
    /// category the engine has never seen, which has nothing to build.
    pub fn is_span_cached(&self, category: &CategoryOrAll, span: Span) -> bool {
        match self.categories.lookup(category) {
            Some(category) => self.spans.contains_key(&SpanKey { category, span }),
            None => true,
        }
    }

    /// Number of cached spans (ready to serve; builds in progress not included).
    pub fn cached_span_count(&self) -> usize {
        self.spans.len()
    }

    fn carry_cost(&self) -> usize {
        self.carry_cache
            .values()
            .flat_map(BTreeMap::values)
            .map(|carry| CARRY_DAY_OVERHEAD_MEMBERS + carry.len())
            .sum()
    }

    /// Keeps what is cached within `max_cached_members`: once over the cap, drops least recently used
    /// spans (never `keep`) down to seven eighths of it, so the sort is paid once per many insertions;
    /// if carry days alone still exceed that, forgets them (carry is derived, and recomputed on demand).
    fn evict_least_recently_used(&mut self, keep: SpanKey) {
        let cap = self.config.max_cached_members;
        let mut cached = self.cached_cost();
        if cached <= cap {
            return;
        }
        let low_water = cap - cap / 8;
        let mut by_age: Vec<(u64, SpanKey, usize)> = self
            .spans
            .iter()
            .filter(|(key, _)| **key != keep)
            .map(|(key, state)| (state.last_used.load(AtomicOrdering::Relaxed), *key, state.cost()))
            .collect();
        by_age.sort_unstable_by_key(|(used, _, _)| *used);
        let mut evicted = HashSet::new();
        for (_, key, cost) in by_age {
            if cached <= low_water {
                break;
            }
            self.spans.remove(&key);
            evicted.insert(key);
            cached -= cost;
        }
        for (category, spans) in &mut self.spans_by_category {
            spans.retain(|span| {
                !evicted.contains(&SpanKey {
                    category: *category,
                    span: *span,
                })
            });
        }
        if cached > low_water {
            // Cached spans hold their own copy of their day's carry, so forgetting the chain loses nothing
            // that is being served.
            self.carry_cache.clear();
        }
    }

    /// Builds `query`'s span if it is not cached, in steps that each hold the write lock only briefly, so
    /// ingest ([`RankingEngine::apply`]) and other reads go on while a cold span is built: hours are read a
    /// slice at a time ([`BUILD_CELLS_PER_STEP`] cells), carry a couple of days at a time, and the sorted
    /// sets are built with no lock held, then installed with whatever was applied meanwhile re-scored.
    /// The result equals a build from scratch. Concurrent cold reads of one span share one build.
    ///
    /// Blocking: call it off the async runtime. On return the span is usually cached (a flood of other
    /// builds may have evicted it again; the caller's read then builds it in one hold).
    pub fn build_span_in_steps(engine: &parking_lot::RwLock<RankingEngine>, query: &RankingQuery) {
        Self::build_span_in_steps_observed(engine, query, |_| {});
    }

    /// [`RankingEngine::build_span_in_steps`], calling `observe` between steps, always with no lock
    /// held: tests use it to apply batches in the middle of a build.
    pub fn build_span_in_steps_observed(
        engine: &parking_lot::RwLock<RankingEngine>,
        query: &RankingQuery,
        mut observe: impl FnMut(BuildPhase),
    ) {
        /// Restarts allowed when retention or eviction drops a build midway, before building in one hold.
        const MAX_RESTARTS: usize = 8;
        /// Steps allowed before building in one hold: reading a month of hours takes at most 744 and the
        /// carry chain of a year's retention about 200, so only a build that ingest keeps undoing (late
        /// events invalidating the carry it just computed, batch after batch) gets there; it then finishes
        /// in one hold rather than never.
        const MAX_STEPS: usize = 4_096;
        let Some(key) = engine.read().span_key(query) else {
            return;
        };
        let (mut restarts, mut steps) = (0, 0);
        loop {
            let step = engine
                .write()
                .build_step(key, restarts >= MAX_RESTARTS || steps > MAX_STEPS);
            match step {
                BuildStep::Cached => return,
                BuildStep::Continue => {
                    steps += 1;
                    observe(BuildPhase::Between);
                }
                BuildStep::Wait => {
                    observe(BuildPhase::Between);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                BuildStep::Score(input) => {
                    let rankings = input.score();
                    observe(BuildPhase::Scoring);
                    if !engine.write().install_build(input, rankings) {
                        restarts += 1;
                    }
                }
            }
        }
    }

    /// One step of a cold build, under the write lock. `in_one_hold` finishes the span at once (the
    /// fallback after repeated restarts).
    fn build_step(&mut self, key: SpanKey, in_one_hold: bool) -> BuildStep {
        if self.spans.contains_key(&key) {
            self.builds.remove(&key);
            return BuildStep::Cached;
        }
        if in_one_hold {
            self.builds.remove(&key);
            self.ensure_span(key);
            return BuildStep::Cached;
        }
        let zone = self.config.zone.clone();
        let now = self.current_hour;
        let build = self.builds.entry(key).or_insert_with(|| {
            let hours = key.span.hours(&zone);
            SpanBuild {
                day: match key.span {
                    Span::Period(period) if period.kind() == PeriodKind::Daily => Some(period),
                    _ => None,
                },
                scanned_until: hours.start,
                hours,
                metrics: HashMap::new(),
                trending_end: key.span.trending_end(&zone, now),
                decayed: HashMap::new(),
                decayed_stale: HashSet::new(),
                scoring: None,
                carry: Arc::default(),
                scored_policies: None,
                changed: HashSet::new(),
                carry_stale: false,
            }
        });
        if let Some(token) = &build.scoring {
            if Arc::strong_count(token) > 1 {
                return BuildStep::Wait;
            }
            // Its scorer went away without installing: score it again from here.
            build.scoring = None;
            build.changed.clear();
        }
        if build.scanned_until < build.hours.end {
            let (from, end, trending_end) = (build.scanned_until, build.hours.end, build.trending_end);
            let mut metrics = std::mem::take(&mut build.metrics);
            let mut decayed = std::mem::take(&mut build.decayed);
            let scanned_until = self.inputs().aggregate_into(
                &mut metrics,
                &mut decayed,
                trending_end,
                key.category,
                from..end,
                self.build_cells_per_step,
            );
            let build = self.builds.get_mut(&key).expect("build registered");
            build.metrics = metrics;
            build.decayed = decayed;
            build.scanned_until = scanned_until;
            return BuildStep::Continue;
        }
        let day = build.day;
        let carry = match day {
            Some(day) => {
                let mut cache = std::mem::take(&mut self.carry_cache);
                let carry =
                    self.inputs()
                        .carry_for_within(&mut cache, key.category, day, BUILD_CARRY_DAYS_PER_STEP);
                self.carry_cache = cache;
                match carry {
                    Some(carry) => carry,
                    None => return BuildStep::Continue,
                }
            }
            None => Arc::default(),
        };
        let token = Arc::new(());
        let mut build = self.builds.remove(&key).expect("build registered");
        // Products changed in hours already scanned: their sums start again from all their hours, in
        // ascending order. As many as ingest touched during the build, like the re-scores at install.
        let inputs = self.inputs();
        for product in std::mem::take(&mut build.decayed_stale) {
            let decayed = inputs.decayed_of(product, build.hours.clone(), build.trending_end);
            build.decayed.insert(product, decayed);
        }
        build.scoring = Some(token.clone());
        build.carry = carry.clone();
        build.scored_policies = Some((self.policy, self.trending_policy));
        build.changed.clear();
        build.carry_stale = false;
        let products: HashSet<ProductIdx> = build
            .metrics
            .keys()
            .chain(build.decayed.keys())
            .chain(carry.keys())
            .copied()
            .collect();
        // Delisted products keep their metrics in the span but are scored into no ranking; a flag
        // changed while scoring runs marks them changed, so the install re-scores them.
        let entries = products
            .into_iter()
            .filter(|p| self.products.is_shown(*p))
            .map(|p| {
                let inputs = ScoreInputs {
                    metrics: build.metrics.get(&p).copied().unwrap_or_default(),
                    carry: carry.get(&p).copied().unwrap_or(0.0),
                    decayed: build.decayed.get(&p).copied().unwrap_or_default(),
                };
                (self.products.ids[p as usize].clone(), inputs)
            })
            .collect();
        self.builds.insert(key, build);
        BuildStep::Score(ScoringInput {
            key,
            entries,
            policies: (self.policy, self.trending_policy),
            token,
        })
    }

    /// Installs a span scored off the lock, re-scoring what changed meanwhile. `false` when the build was
    /// dropped in between (retention, or a rebuild), so the caller starts over.
    fn install_build(&mut self, input: ScoringInput, rankings: [SortedSet; RANKERS]) -> bool {
        let key = input.key;
        if self.spans.contains_key(&key) {
            self.builds.remove(&key);
            return true;
        }
        let still_ours = self
            .builds
            .get(&key)
            .and_then(|build| build.scoring.as_ref())
            .is_some_and(|token| Arc::ptr_eq(token, &input.token));
        if !still_ours {
            return false;
        }
        let build = self.builds.remove(&key).expect("build checked");
        let mut dirty = build.changed;
        let policy_switched = build.scored_policies != Some((self.policy, self.trending_policy));
        if policy_switched {
            // Scored under a policy that has since been switched: re-score everyone.
            dirty.extend(
                build
                    .metrics
                    .keys()
                    .chain(build.decayed.keys())
                    .chain(build.carry.keys())
                    .copied(),
            );
        }
        let state = SpanState {
            day_start: build.day.map(|d| d.hours(&self.config.zone).start),
            hours: build.hours,
            metrics: build.metrics,
            carry: build.carry,
            trending_end: build.trending_end,
            applied: self.generation,
            rankings,
            dirty,
            carry_stale: build.day.is_some() && (build.carry_stale || policy_switched),
            last_used: Arc::new(AtomicU64::new(0)),
            change_log: None,
        };
        self.spans.insert(key, state);
        self.spans_by_category
            .entry(key.category)
            .or_default()
            .push(key.span);
        self.spans[&key].last_used.store(
            self.lru_clock.fetch_add(1, AtomicOrdering::Relaxed),
            AtomicOrdering::Relaxed,
        );
        self.evict_least_recently_used(key);
        true
    }

    fn page(&self, state: &SpanState, ranker: RankerName, offset: usize, limit: usize) -> TopPage {
        let ranking = &state.rankings[ranker.index()];
        let items = ranking
            .iter_from_rank(offset)
            .take(limit)
            .enumerate()
            .map(|(i, (member, key))| self.item(state, ranker, offset + i + 1, member, key))
            .collect();
        TopPage {
            policy_version: self.policy_version(ranker),
            total: ranking.len(),
            items,
            as_of_millis: self.as_of_millis,
        }
    }

    fn item(
        &self,
        state: &SpanState,
        ranker: RankerName,
        rank: usize,
        member: &[u8],
        key: f64,
    ) -> RankedItem {
        let member = std::str::from_utf8(member).expect("members are product ids");
        let idx = self.products.index[member];
        RankedItem {
            rank,
            product: self.products.ids[idx as usize].clone(),
            score: -key + 0.0,
            metrics: state.metrics.get(&idx).copied().unwrap_or_default(),
            carry: if ranker == RankerName::Popular {
                state.carry.get(&idx).copied().unwrap_or(0.0)
            } else {
                0.0
            },
        }
    }

    /// The policy version reads of `ranker` are served from.
    pub fn policy_version(&self, ranker: RankerName) -> u32 {
        match ranker {
            RankerName::Popular => self.policy.version,
            RankerName::Trending => self.trending_policy.version,
            RankerName::Units | RankerName::Revenue => 1,
        }
    }

    fn empty_page(&self, ranker: RankerName) -> TopPage {
        TopPage {
            policy_version: self.policy_version(ranker),
            total: 0,
            items: Vec::new(),
            as_of_millis: self.as_of_millis,
        }
    }

    /// A page of a ranking if it can be answered under a shared lock (span cached and clean).
    pub fn top_cached(&self, query: &RankingQuery, offset: usize, limit: usize) -> Option<TopPage> {
        let Some(key) = self.span_key(query) else {
            return Some(self.empty_page(query.ranker));
        };
        let state = self.spans.get(&key).filter(|state| state.is_clean())?;
        state.last_used.store(
            self.lru_clock.fetch_add(1, AtomicOrdering::Relaxed),
            AtomicOrdering::Relaxed,
        );
        Some(self.page(state, query.ranker, offset, limit))
    }

    /// A page of a ranking, building or flushing its span first when needed.
    pub fn top(&mut self, query: &RankingQuery, offset: usize, limit: usize) -> TopPage {
        let Some(key) = self.span_key(query) else {
            return self.empty_page(query.ranker);
        };
        self.ensure_span(key);
        self.page(&self.spans[&key], query.ranker, offset, limit)
    }

    fn rank_in(&self, state: &SpanState, ranker: RankerName, product: &ProductId) -> RankAnswer {
        let ranking = &state.rankings[ranker.index()];
        let member = product.as_str().as_bytes();
        let idx = self.products.index.get(product.as_str()).copied();
        let metrics = idx
            .and_then(|p| state.metrics.get(&p))
            .copied()
            .unwrap_or_default();
        let carry = match (ranker, idx) {
            (RankerName::Popular, Some(p)) => state.carry.get(&p).copied().unwrap_or(0.0),
            _ => 0.0,
        };
        RankAnswer {
            policy_version: self.policy_version(ranker),
            rank: ranking.zrank(member).map(|r| r + 1),
            score: ranking.zscore(member).map(|key| -key + 0.0),
            metrics,
            carry,
            total: ranking.len(),
            as_of_millis: self.as_of_millis,
        }
    }

    fn unlisted(&self, ranker: RankerName) -> RankAnswer {
        RankAnswer {
            policy_version: self.policy_version(ranker),
            rank: None,
            score: None,
            metrics: Metrics::default(),
            carry: 0.0,
            total: 0,
            as_of_millis: self.as_of_millis,
        }
    }

    /// A product's rank if it can be answered under a shared lock.
    pub fn rank_cached(&self, query: &RankingQuery, product: &ProductId) -> Option<RankAnswer> {
        let Some(key) = self.span_key(query) else {
            return Some(self.unlisted(query.ranker));
        };
        let state = self.spans.get(&key).filter(|state| state.is_clean())?;
        Some(self.rank_in(state, query.ranker, product))
    }

    /// A product's rank, building or flushing the span first when needed.
    pub fn rank(&mut self, query: &RankingQuery, product: &ProductId) -> RankAnswer {
        let Some(key) = self.span_key(query) else {
            return self.unlisted(query.ranker);
        };
        self.ensure_span(key);
        self.rank_in(&self.spans[&key], query.ranker, product)
    }

    /// The places of several products in one ranking, in the order asked, if they can be answered under
    /// a shared lock: one lock hold and one O(log n) lookup per product (`POST /v1/rankings/sort`).
    pub fn rank_many_cached(&self, query: &RankingQuery, products: &[ProductId]) -> Option<Vec<RankAnswer>> {
        let Some(key) = self.span_key(query) else {
            return Some(products.iter().map(|_| self.unlisted(query.ranker)).collect());
        };
        let state = self.spans.get(&key).filter(|state| state.is_clean())?;
        Some(
            products
                .iter()
                .map(|p| self.rank_in(state, query.ranker, p))
                .collect(),
        )
    }

    /// [`RankingEngine::rank_many_cached`], building or flushing the span first when needed.
    pub fn rank_many(&mut self, query: &RankingQuery, products: &[ProductId]) -> Vec<RankAnswer> {
        let Some(key) = self.span_key(query) else {
            return products.iter().map(|_| self.unlisted(query.ranker)).collect();
        };
        self.ensure_span(key);
        let state = &self.spans[&key];
        products
            .iter()
            .map(|p| self.rank_in(state, query.ranker, p))
            .collect()
    }

    /// The rankings a product can be listed in: `all`, then each of its categories (the union of every
    /// category seen on its events) by name, bytes ascending. Just `all` for a product never seen.
    pub fn product_categories(&self, product: &ProductId) -> Vec<CategoryOrAll> {
        let mut categories: Vec<CategoryOrAll> = self
            .products
            .index
            .get(product.as_str())
            .map(|&idx| {
                self.products.categories[idx as usize]
                    .iter()
                    .filter_map(|&c| self.categories.names[c as usize].clone())
                    .map(CategoryOrAll::Category)
                    .collect()
            })
            .unwrap_or_default();
        categories.sort_by(|a, b| a.as_str().as_bytes().cmp(b.as_str().as_bytes()));
        categories.insert(0, CategoryOrAll::All);
        categories
    }

    /// Every listed product of a ranking, in order: (product, score, metrics, carry). For verification.
    pub fn full_ranking(&mut self, query: &RankingQuery) -> Vec<RankedItem> {
        self.top(query, 0, usize::MAX).items
    }

    /// Rebuilds every cached span under `policy` without touching the served state, in short holds of the
    /// shared lock, a few spans (≤ ~5 ms of work) at a time, so a policy switch never makes reads wait for
    /// the whole build. One long shared hold
    /// would: the lock is fair to writers, so once an ingest or the refresher queues behind the build,
    /// every new reader queues behind it too (4.2 s stalls with 30 days retained). Blocking: call it off
    /// the async runtime.
    ///
    /// Batches land between steps; that is safe for the same reason it is between a one-hold build and
    /// its install: [`RankingEngine::install`] (which switches to the result atomically) rebuilds every span whose metrics moved meanwhile (and
    /// any span cached meanwhile) and rechecks every carry chain. Spans evicted meanwhile are skipped.
    pub fn rebuild_in_steps(
        engine: &parking_lot::RwLock<RankingEngine>,
        ranker: RankerName,
        policy: Policy,
    ) -> RebuiltSpans {
        Self::rebuild_in_steps_observed(engine, ranker, policy, || {})
    }

    /// [`RankingEngine::rebuild_in_steps`], calling `between_steps` with no lock held after each step:
    /// tests use it to apply batches in the middle of a rebuild.
    pub fn rebuild_in_steps_observed(
        engine: &parking_lot::RwLock<RankingEngine>,
        ranker: RankerName,
        policy: Policy,
        mut between_steps: impl FnMut(),
    ) -> RebuiltSpans {
        const STEP: std::time::Duration = std::time::Duration::from_millis(5);
        let (keys, mut policies, listing_epoch) = {
            let engine = engine.read();
            let keys: Vec<SpanKey> = engine.spans.keys().copied().collect();
            (
                keys,
                (engine.policy, engine.trending_policy),
                engine.listing_epoch,
            )
        };
        match ranker {
            RankerName::Trending => policies.1 = policy,
            RankerName::Popular | RankerName::Units | RankerName::Revenue => policies.0 = policy,
        }
        let mut carry_cache = CarryCache::new();
        let mut spans = HashMap::with_capacity(keys.len());
        let mut keys = keys.into_iter().peekable();
        while keys.peek().is_some() {
            {
                let engine = engine.read();
                let inputs = Inputs {
                    policy: &policies.0,
                    trending: &policies.1,
                    ..engine.inputs()
                };
                let started = std::time::Instant::now();
                let mut built = 0;
                for key in keys.by_ref() {
                    if let Some(served) = engine.spans.get(&key) {
                        let mut state = inputs.build_span(&mut carry_cache, key);
                        state.applied = served.applied;
                        spans.insert(key, state);
                        built += 1;
                    }
                    if built >= engine.rebuild_spans_per_step || started.elapsed() >= STEP {
                        break;
                    }
                }
            }
            between_steps();
        }
        RebuiltSpans {
            ranker,
            policies,
            spans,
            carry_cache,
            listing_epoch,
        }
    }

    /// Switches to spans built by [`RankingEngine::rebuild_in_steps`]. Spans that changed since the build
    /// started (new batches) are rebuilt here, so nothing applied in between is lost.
    ///
    /// Only the rebuilt ranker's policy changes; spans built under another policy of the other ranker
    /// (installed meanwhile) are rebuilt here too, as are spans whose E moved.
    pub fn install(&mut self, rebuilt: RebuiltSpans) {
        self.generation += 1;
        self.policy_epoch += 1;
        let built_under = rebuilt.policies;
        match rebuilt.ranker {
            RankerName::Trending => self.trending_policy = rebuilt.policies.1,
            RankerName::Popular | RankerName::Units | RankerName::Revenue => self.policy = rebuilt.policies.0,
        }
        let same_policies = built_under == (self.policy, self.trending_policy);
        // The rebuilt carry may predate batches applied during the build; recompute it lazily instead.
        drop(rebuilt.carry_cache);
        let keys: Vec<SpanKey> = self.spans.keys().copied().collect();
        // A listing flag changed during the build: any rebuilt span may rank that product wrongly.
        let mut fresh = if rebuilt.listing_epoch == self.listing_epoch {
            rebuilt.spans
        } else {
            HashMap::new()
        };
        let mut cache = CarryCache::new();
        let mut spans = HashMap::new();
        for key in keys {
            let served = &self.spans[&key];
            let state = match fresh.remove(&key) {
                Some(state)
                    if same_policies
                        && served.applied == state.applied
                        && served.trending_end == state.trending_end =>
                {
                    state
                }
                _ => {
                    let mut state = self.inputs().build_span(&mut cache, key);
                    state.applied = self.generation;
                    state
                }
            };
            spans.insert(key, state);
        }
        self.carry_cache = cache;
        self.spans = spans;
        // Carry chains depend on day totals which may have moved during the build: recheck lazily.
        for state in self.spans.values_mut() {
            state.carry_stale |= state.day_start.is_some();
        }
    }

    /// `all` and every category seen so far.
    pub fn categories(&self) -> Vec<CategoryOrAll> {
        std::iter::once(CategoryOrAll::All)
            .chain(
                self.categories
                    .names
                    .iter()
                    .flatten()
                    .map(|c| CategoryOrAll::Category(c.clone())),
            )
            .collect()
    }

    /// Takes `span`'s change log for a reader that follows the span (the Redis publication): builds or
    /// flushes the span first, so the log covers every applied batch, and starts a new log. `None` when the
    /// engine has never seen `category`.
    ///
    /// One reader per engine: a second one would take the other's changes.
    pub fn take_span_changes(
        &mut self,
        category: &CategoryOrAll,
        span: Span,
    ) -> Option<(SpanChanges, CachedSpan<'_>)> {
        let key = SpanKey {
            category: self.categories.lookup(category)?,
            span,
        };
        self.ensure_span(key);
        let state = self.spans.get_mut(&key).expect("span just ensured");
        let changes = match state.change_log.replace(Box::default()) {
            None => SpanChanges::Rebuilt,
            Some(log) => {
                let by_id = |set: &HashSet<ProductIdx>| -> Vec<ProductId> {
                    let mut products: Vec<&ProductId> =
                        set.iter().map(|p| &self.products.ids[*p as usize]).collect();
                    products.sort_unstable();
                    products.into_iter().cloned().collect()
                };
                SpanChanges::Rescored {
                    rankings: std::array::from_fn(|r| by_id(&log.rankings[r])),
                    details: by_id(&log.details),
                }
            }
        };
        Some((
            changes,
            CachedSpan {
                products: &self.products,
                state: &self.spans[&key],
            },
        ))
    }

    /// Drops every cached span (they are rebuilt on demand); used by verification to bound memory.
    pub fn evict_cached_spans(&mut self) {
        self.spans.clear();
        self.spans_by_category.clear();
        self.builds.clear();
    }

    /// Drops cached spans that lie wholly outside `readable` (spans that left retention, and spans ahead
    /// of the clock), so a span cached once is not kept for ever: reads may ask for the next period, and
    /// it is cheap to build again.
    pub fn evict_spans_outside(&mut self, readable: Range<Hour>) {
        let before = self.spans.len();
        self.spans
            .retain(|_, state| state.hours.end > readable.start && state.hours.start < readable.end);
        if self.spans.len() == before {
            return;
        }
        // Answers do not change (an evicted span is rebuilt equal), so the generation stays.
        let spans = &self.spans;
        for (category, list) in &mut self.spans_by_category {
            list.retain(|span| {
                spans.contains_key(&SpanKey {
                    category: *category,
                    span: *span,
                })
            });
        }
    }

    /// Drops metrics older than `before` and every cached span or carry that depended on them.
    pub fn evict_before(&mut self, before: Hour) {
        self.generation += 1;
        let kept = self.hours.split_off(&before);
        if std::mem::replace(&mut self.hours, kept).is_empty() {
            return;
        }
        self.earliest_day = self.hours.keys().next().map(|h| {
            PeriodKey::containing(PeriodKind::Daily, *h, &self.config.zone)
                .hours(&self.config.zone)
                .start
        });
        self.carry_cache.clear();
        for cells in &mut self.products.cells {
            *cells = cells.split_off(&before);
        }
        // A build in progress may have read rows that are gone now; its readers start over.
        self.builds.clear();
        self.spans.retain(|_, state| state.hours.start >= before);
        self.spans_by_category.clear();
        for key in self.spans.keys() {
            self.spans_by_category
                .entry(key.category)
                .or_default()
                .push(key.span);
        }
        for state in self.spans.values_mut() {
            state.carry_stale |= state.day_start.is_some();
        }
    }
}
