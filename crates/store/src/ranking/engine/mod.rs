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
//! Sorted sets hold the negated score ([`ascending_key`](rankgate_core::ranker::ascending_key)) so the
//! engine's Redis order (score, then member bytes) is exactly the ranking order (score descending,
//! product id ascending).
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
//! also kept by product ([`ProductTable::cells`]), and re-scoring a product computes its decayed metrics from
//! all its hours in the span, in ascending order, never by adding a delta: the result is bit-identical to the
//! batch recompute however events arrived. E of a running period is the engine's current hour, so when the
//! hour turns ([`RankingEngine::advance_to_hour`]) every running period's cached span is dropped and built
//! again, in steps ([`RankingEngine::build_span_in_steps`]), as on a first read. Windows end at a fixed hour
//! and past periods at their last one, so they never move. Until the engine is told the hour, every period
//! counts as over (E = its last hour), so no hour is ever weighed as in the future of E by more than the
//! clock says.
//!
//! # Change logs
//! The engine does not know about Redis. A span that a reader follows ([`RankingEngine::take_span_changes`],
//! called by [`publication`](super::publication)) keeps a change log: while flushing, the engine notes per
//! ranker the products whose key moved, and the products whose metrics or carry moved. A span built anew
//! starts without a log, which tells the reader it must take the span whole.
//!
//! # Layout
//! One file per job; every part is an `impl RankingEngine` block (and the types it owns, public ones
//! re-exported here), so the engine stays one struct with one lock and no indirection between the parts:
//! - `mod.rs`: [`RankingEngine`], [`EngineConfig`] and what readers ask and get ([`RankingQuery`],
//!   [`TopPage`], [`RankAnswer`], [`RankedItem`]).
//! - `interning`: products and categories as dense indexes, with each product's categories, cells and
//!   listing flag.
//! - `hours`: the hourly table (the engine's copy of the source of truth), [`RankingEngine::apply`],
//!   [`RankingEngine::apply_absolute`], listing flags ([`RankingEngine::set_listed`]) and retention.
//! - `scoring`: the read-only inputs of a score, a span built in one hold, and the re-score of dirty
//!   products at flush.
//! - `carry`: the carry chain, day to day, and which cached days a change invalidates.
//! - `span_cache`: which spans are cached, flushing them, what they cost and which go first (LRU), and
//!   dropping the ones whose `trending` end hour moved.
//! - `cold_build`: [`RankingEngine::build_span_in_steps`], a cold span built in short lock holds (and
//!   [`BuildPhase`], what its observer is told).
//! - `reads`: pages, ranks and `rank_many` (`POST /v1/rankings/sort`), cached or not, and the category
//!   lists.
//! - `policy`: policies, and a policy switch as [`RankingEngine::rebuild_in_steps`] ([`RebuiltSpans`])
//!   then [`RankingEngine::install`].
//! - `change_log`: what a flush notes per followed span, and [`RankingEngine::take_span_changes`], which
//!   hands it out as [`SpanChanges`] with a [`CachedSpan`].
//!
//! Each part has its own unit tests; `test_support` (tests only) holds what they share: one deterministic
//! workload fed to both the engine and the batch recompute ([`recompute`](super::recompute)), which most
//! of them compare against.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

// foldhash (hashbrown's default), not SipHash: the hot maps are keyed by interned indexes and by
// hours, and SipHash was ~1,900 instructions per ingested event in callgrind profiles of ingest.
use hashbrown::HashMap;

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, Span, Zone};
use rankgate_core::ranker::{Policy, RankerName};

mod carry;
mod change_log;
mod cold_build;
mod hours;
mod interning;
mod policy;
mod reads;
mod scoring;
mod span_cache;
#[cfg(test)]
mod test_support;

pub use change_log::{CachedSpan, SpanChanges};
pub use cold_build::BuildPhase;
pub use policy::RebuiltSpans;
pub use span_cache::{CARRY_DAY_OVERHEAD_MEMBERS, SPAN_OVERHEAD_MEMBERS};

use carry::CarryCache;
use cold_build::{SpanBuild, BUILD_CELLS_PER_STEP};
use interning::{CatIdx, CategoryTable, ProductIdx, ProductTable};
use span_cache::{SpanKey, SpanState};

/// One entry per ranker, in [`RankerName::ALL`] order.
const RANKERS: usize = RankerName::ALL.len();

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
    /// Every product ever seen, by dense index (`interning`): the other maps key on the index.
    products: ProductTable,
    /// Every category ever seen, by dense index; index 0 is `all`.
    categories: CategoryTable,
    /// Every retained hourly metric row: the engine's copy of the source of truth.
    hours: BTreeMap<Hour, HashMap<ProductIdx, Metrics>>,
    /// The `popular` policy.
    policy: Policy,
    /// The `trending` policy.
    trending_policy: Policy,
    /// The hour `trending` treats as current: E of running periods ([`RankingEngine::advance_to_hour`]).
    current_hour: Hour,
    /// The servable spans (`span_cache`), each shared by the four rankers.
    spans: HashMap<SpanKey, SpanState>,
    /// The keys of `spans` per category: `apply` finds the spans a delta touches without scanning all.
    spans_by_category: HashMap<CatIdx, Vec<Span>>,
    /// Carry days computed so far (`carry`), shared by every daily span of a category.
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
    /// Time of the latest ingest applied, echoed in every answer.
    as_of_millis: Option<i64>,
    /// Ticks once per read: each span keeps the tick of its last read, and the oldest go first. Atomic so
    /// cached reads can tick it under the shared lock.
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

    /// A counter that changes whenever any answer could change (ingest, policy switch, eviction). Equal
    /// generations mean equal answers, so responses can be cached against it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Time of the latest ingest applied.
    pub fn as_of_millis(&self) -> Option<i64> {
        self.as_of_millis
    }
}
