//! The cached spans: one [`SpanState`] per served (category, span), shared by the four rankers, kept
//! current by `apply` and brought up to date by a flush before it is read.
//!
//! What the cache holds is bounded by `max_cached_members`: a span costs its products plus
//! [`SPAN_OVERHEAD_MEMBERS`], a cached carry day its products plus [`CARRY_DAY_OVERHEAD_MEMBERS`], and
//! once over the bound the least recently used spans go ([`RankingEngine::evict_least_recently_used`]).
//! Spans also go when `trending`'s end hour of a running period moves
//! ([`RankingEngine::advance_to_hour`]), when they leave the readable range, and on request. Any span
//! dropped is built again equal on its next read, so dropping one changes no answer.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

use hashbrown::{HashMap, HashSet};

use rankgate_core::ids::CategoryOrAll;
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span};
use rankgate_core::ranker::RankerName;
use rankgate_zset::SortedSet;

use super::change_log::ChangeLog;
use super::interning::{CatIdx, ProductIdx};
use super::{RankingEngine, RankingQuery, RANKERS};

/// What identifies a cached span: one (category, span), whichever ranker reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct SpanKey {
    pub(super) category: CatIdx,
    pub(super) span: Span,
}

/// A cached ranking span: metric totals per product and one sorted set per ranker.
#[derive(Debug, Clone)]
pub(super) struct SpanState {
    /// The span's hours, resolved once: `apply` tests every delta's hour against it.
    pub(super) hours: Range<Hour>,
    /// Start hour of the day for daily periods: only these get carry.
    pub(super) day_start: Option<Hour>,
    /// Metric totals over the span of every product with non-zero ones: what a re-score starts from.
    pub(super) metrics: HashMap<ProductIdx, Metrics>,
    /// The day's carry (empty outside daily periods), shared with the carry cache until it moves.
    pub(super) carry: Arc<HashMap<ProductIdx, f64>>,
    /// `trending`'s end hour E the span is scored for ([`Span::trending_end`]).
    pub(super) trending_end: Hour,
    /// The engine [`generation`](RankingEngine::generation) of the last change applied to the span (or
    /// of its build): a rebuild of it under a new policy is installed only if none came in between
    /// (equal totals are not enough: `trending` depends on which hour moved).
    pub(super) applied: u64,
    /// One sorted set per ranker, in [`RankerName::ALL`] order, keyed by
    /// [`ascending_key`](rankgate_core::ranker::ascending_key).
    pub(super) rankings: [SortedSet; RANKERS],
    /// Products whose inputs changed since the last flush: re-scored once each, however many deltas came.
    pub(super) dirty: HashSet<ProductIdx>,
    /// The carry for this day must be recomputed before the next read.
    pub(super) carry_stale: bool,
    /// LRU clock value of the last read; atomic so cached reads can bump it under a shared lock.
    pub(super) last_used: Arc<AtomicU64>,
    /// What the engine re-scored since a reader last took this span's changes
    /// ([`RankingEngine::take_span_changes`]); `None` until a reader first takes them, so spans nobody
    /// follows (cold reads) keep no log.
    pub(super) change_log: Option<Box<ChangeLog>>,
}

impl SpanState {
    /// Nothing to re-score: the span can be read as it is, under a shared lock.
    pub(super) fn is_clean(&self) -> bool {
        self.dirty.is_empty() && !self.carry_stale
    }

    /// What this span counts against `max_cached_members`: its products plus a fixed overhead, so a flood
    /// of distinct empty spans is bounded by the cap like any other.
    pub(super) fn cost(&self) -> usize {
        SPAN_OVERHEAD_MEMBERS + self.metrics.len()
    }
}

/// What an empty cached span costs against `max_cached_members`, in member-equivalents: even with no
/// product its maps, four sorted sets and index entries take about as much memory as a few members.
pub const SPAN_OVERHEAD_MEMBERS: usize = 4;
/// What one cached carry day costs against `max_cached_members`, besides one per carried product.
pub const CARRY_DAY_OVERHEAD_MEMBERS: usize = 1;

impl RankingEngine {
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

    /// Brings a cached span up to date for a read: takes the new carry if its day's went stale (marking
    /// each product whose carry moved dirty), then re-scores the dirty products.
    pub(super) fn flush(&mut self, key: SpanKey) {
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

    /// The key of `query`'s span; `None` when its category was never seen (nothing to cache).
    pub(super) fn span_key(&self, query: &RankingQuery) -> Option<SpanKey> {
        Some(SpanKey {
            category: self.categories.lookup(&query.category)?,
            span: query.span,
        })
    }

    /// The span ready to read: built in one hold if it is not cached (evicting others to make room),
    /// flushed if it is. Either way it counts as just used.
    pub(super) fn ensure_span(&mut self, key: SpanKey) -> &SpanState {
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

    /// What the cached carry days count against `max_cached_members`.
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
    pub(super) fn evict_least_recently_used(&mut self, keep: SpanKey) {
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

    /// A mark of the least-recently-used clock: a span not used after it has not been read, built or
    /// published since (see [`RankingEngine::evict_spans_unused_since`]).
    #[must_use]
    pub fn use_mark(&self) -> u64 {
        self.lru_clock.load(AtomicOrdering::Relaxed)
    }

    /// Drops the cached spans for which `evictable` holds that nobody used since `mark` (a
    /// [`RankingEngine::use_mark`] taken earlier). With Redis serving, a hot span the engine answered only
    /// until Redis held it would otherwise be kept current on every event for nobody.
    pub fn evict_spans_unused_since(&mut self, mark: u64, evictable: impl Fn(&Span) -> bool) -> usize {
        let before = self.spans.len();
        self.spans.retain(|key, state| {
            state.last_used.load(AtomicOrdering::Relaxed) >= mark || !evictable(&key.span)
        });
        let evicted = before - self.spans.len();
        if evicted > 0 {
            self.drop_evicted_from_index();
        }
        evicted
    }

    /// Keeps `spans_by_category` to the spans still cached, after some were dropped from `spans`.
    fn drop_evicted_from_index(&mut self) {
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

    /// Drops one cached span and its change log, if cached: a span the Redis publication no longer
    /// follows costs nothing per event from then on, and if it is read or published again it is built
    /// anew (so its next [`RankingEngine::take_span_changes`] says `Rebuilt`).
    pub fn forget_span(&mut self, category: &CategoryOrAll, span: Span) {
        let Some(category) = self.categories.lookup(category) else {
            return;
        };
        let key = SpanKey { category, span };
        if self.spans.remove(&key).is_none() {
            return;
        }
        // Answers do not change (a forgotten span is rebuilt equal), so the generation stays.
        if let Some(list) = self.spans_by_category.get_mut(&category) {
            list.retain(|cached| *cached != span);
        }
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
        self.drop_evicted_from_index();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rankgate_core::ids::ProductId;
    use rankgate_core::period::WindowLen;

    use super::super::test_support::{
        apply_in_batches, day, engine, engine_with, hour, hourly, in_category, product, query, views, window,
        workload, workload_categories,
    };
    use super::*;
    use rankgate_core::ranker::Policy;

    fn popular(category: CategoryOrAll, span: Span) -> RankingQuery {
        query(RankerName::Popular, category, span)
    }

    /// The index `apply` walks holds exactly the cached spans.
    fn assert_index_matches_spans(engine: &RankingEngine) {
        let indexed: BTreeSet<String> = engine
            .spans_by_category
            .iter()
            .flat_map(|(category, spans)| spans.iter().map(move |span| format!("{category} {span:?}")))
            .collect();
        let cached: BTreeSet<String> = engine
            .spans
            .keys()
            .map(|key| format!("{} {:?}", key.category, key.span))
            .collect();
        assert_eq!(indexed, cached);
        let entries: usize = engine.spans_by_category.values().map(Vec::len).sum();
        assert_eq!(entries, engine.spans.len(), "no span is indexed twice");
    }

    /// One product per hour, `p<h>` at hour `h`: every hourly span costs the overhead plus one.
    fn engine_with_one_product_per_hour(cap: usize, hours: i64) -> RankingEngine {
        let mut engine = engine_with(Policy::default(), cap);
        let deltas: Vec<(Hour, ProductId, Metrics)> = (0..hours)
            .map(|h| (hour(h), product(&format!("p{h}")), views(1 + h)))
            .collect();
        engine.apply(&deltas, &[], None);
        engine
    }

    fn cached_hours(engine: &RankingEngine, hours: std::ops::Range<i64>) -> Vec<i64> {
        hours
            .filter(|h| engine.is_span_cached(&CategoryOrAll::All, hourly(*h)))
            .collect()
    }

    #[test]
    fn eviction_drops_the_least_recently_used_spans_first_down_to_seven_eighths_of_the_bound() {
        let cost = SPAN_OVERHEAD_MEMBERS + 1;
        let cap = 6 * cost;
        let mut engine = engine_with_one_product_per_hour(cap, 7);
        for h in 0..6 {
            engine.top(&popular(CategoryOrAll::All, hourly(h)), 0, 1);
        }
        assert_eq!(engine.cached_cost(), cap);
        // Reads make a span recent again, those under the shared lock too.
        engine.top(&popular(CategoryOrAll::All, hourly(0)), 0, 1);
        assert!(engine
            .top_cached(&popular(CategoryOrAll::All, hourly(1)), 0, 1)
            .is_some());

        engine.top(&popular(CategoryOrAll::All, hourly(6)), 0, 1);

        // Over the bound by one span: the least recently used go until at most 7/8 of it is left.
        assert_eq!(cached_hours(&engine, 0..7), [0, 1, 4, 5, 6]);
        assert!(engine.cached_cost() <= cap - cap / 8);
        assert_index_matches_spans(&engine);
    }

    #[test]
    fn what_is_cached_stays_within_the_bound_carry_days_included() {
        let cap = 150;
        let events = workload(31, 600, 10 * 24);
        let mut engine = engine_with(Policy::default(), cap);
        apply_in_batches(&mut engine, &events, 100);
        let (mut reads, mut most_carry_days) = (0, 0);
        for n in 0..10 {
            for category in workload_categories() {
                for span in [day(n), hourly(24 * n + 5), window(WindowLen::D1, 24 * n + 12)] {
                    engine.top(&popular(category.clone(), span), 0, 1);
                    reads += 1;
                    assert!(engine.cached_cost() <= cap, "{} > {cap}", engine.cached_cost());
                    assert!(engine.is_span_cached(&category, span), "the span just read stays");
                    // The cost counts every span and every cached carry day, each with its overhead.
                    let spans: usize = engine.spans.values().map(SpanState::cost).sum();
                    let carry_days: Vec<usize> = engine
                        .carry_cache
                        .values()
                        .flat_map(BTreeMap::values)
                        .map(|c| c.len())
                        .collect();
                    let carry: usize = carry_days
                        .iter()
                        .map(|len| CARRY_DAY_OVERHEAD_MEMBERS + len)
                        .sum();
                    assert_eq!(engine.cached_cost(), spans + carry);
                    most_carry_days = most_carry_days.max(carry_days.len());
                }
            }
        }
        assert!(most_carry_days > 0);
        assert!(
            engine.cached_span_count() < reads / 4,
            "{} cached",
            engine.cached_span_count()
        );
        assert_index_matches_spans(&engine);
    }

    #[test]
    fn the_span_being_read_is_cached_even_when_it_alone_is_over_the_bound() {
        let mut engine = engine_with_one_product_per_hour(SPAN_OVERHEAD_MEMBERS - 1, 2);
        let page = engine.top(&popular(CategoryOrAll::All, hourly(0)), 0, 10);
        assert_eq!(page.items[0].product, product("p0"));
        assert_eq!(cached_hours(&engine, 0..2), [0]);
        engine.top(&popular(CategoryOrAll::All, hourly(1)), 0, 10);
        assert_eq!(cached_hours(&engine, 0..2), [1]);
        assert_index_matches_spans(&engine);
    }

    #[test]
    fn a_dirty_span_is_answered_under_the_shared_lock_only_after_a_flush() {
        let events = workload(32, 300, 24);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        let q = popular(CategoryOrAll::All, day(0));
        assert!(engine.top_cached(&q, 0, 5).is_none(), "not cached yet");
        let built = engine.top(&q, 0, 5);
        assert_eq!(engine.top_cached(&q, 0, 5), Some(built));

        engine.apply(&[(hour(3), product("p1"), views(1_000))], &[], None);
        assert!(engine.top_cached(&q, 0, 5).is_none(), "dirty");
        assert!(engine.rank_cached(&q, &product("p1")).is_none(), "dirty");
        engine.flush_all();
        let flushed = engine.top_cached(&q, 0, 5).expect("clean after the flush");
        assert_eq!(flushed.items[0].product, product("p1"));
        assert_eq!(engine.top(&q, 0, 5), flushed);
    }

    #[test]
    fn advancing_the_hour_drops_only_the_spans_whose_trending_end_moved() {
        let events = workload(33, 400, 72);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        assert!(engine.advance_to_hour(hour(30)).is_empty(), "nothing cached yet");
        let running = [(CategoryOrAll::All, day(1)), (in_category("c0"), day(1))];
        let still = [
            (CategoryOrAll::All, day(0)),
            (CategoryOrAll::All, day(2)),
            (CategoryOrAll::All, window(WindowLen::D1, 30)),
        ];
        for (category, span) in running.iter().chain(&still) {
            engine.top(&popular(category.clone(), *span), 0, 1);
        }
        let generation = engine.generation();

        let mut dropped = engine.advance_to_hour(hour(31));

        dropped.sort_by_key(|q| q.category.as_str().to_string());
        let expected: Vec<RankingQuery> = running
            .iter()
            .map(|(category, span)| query(RankerName::Trending, category.clone(), *span))
            .collect();
        assert_eq!(dropped, expected);
        for (category, span) in &running {
            assert!(!engine.is_span_cached(category, *span));
        }
        for (category, span) in &still {
            assert!(engine.is_span_cached(category, *span), "{span:?}");
        }
        assert!(engine.generation() > generation);
        assert_index_matches_spans(&engine);

        let generation = engine.generation();
        assert!(engine.advance_to_hour(hour(31)).is_empty());
        assert_eq!(engine.generation(), generation, "the same hour changes nothing");
    }

    #[test]
    fn spans_outside_the_readable_range_go_and_come_back_equal() {
        let events = workload(34, 500, 72);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        let spans = [day(0), day(1), day(2), window(WindowLen::D1, 30)];
        let before: Vec<_> = spans
            .iter()
            .map(|span| engine.full_ranking(&popular(CategoryOrAll::All, *span)))
            .collect();
        let generation = engine.generation();

        engine.evict_spans_outside(hour(30)..hour(50));
        let cached =
            |engine: &RankingEngine| spans.map(|span| engine.is_span_cached(&CategoryOrAll::All, span));
        assert_eq!(cached(&engine), [false, true, true, true]);
        engine.evict_spans_outside(hour(49)..hour(60));
        assert_eq!(cached(&engine), [false, false, true, false]);
        assert_eq!(engine.generation(), generation, "answers do not change");
        assert_index_matches_spans(&engine);

        for (span, before) in spans.iter().zip(&before) {
            assert_eq!(&engine.full_ranking(&popular(CategoryOrAll::All, *span)), before);
        }
        engine.evict_cached_spans();
        assert_eq!(engine.cached_span_count(), 0);
        assert_index_matches_spans(&engine);
    }
}
