//! Carry: the share of day D's `popular` score its top products take into day D+1 (SPEC 1.3), and so a
//! chain that starts at the earliest day with metrics and runs day by day.
//!
//! The chain is cached per (category, day) in [`CarryCache`]; a cached day is always valid, because a
//! change removes every day it could affect rather than marking it: a change to day D (a late event, a
//! new membership, a listing flip) drops the cached days after D, and marks the cached daily spans after
//! D `carry_stale`, so their next flush takes the new carry. Cold builds walk a long chain a few days per
//! lock hold ([`Inputs::carry_for_within`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use hashbrown::HashMap;

use rankgate_core::carry::next_day_carry;
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind};

use super::interning::{CatIdx, ProductIdx, ProductTable, ALL};
use super::scoring::Inputs;
use super::span_cache::SpanKey;
use super::RankingEngine;

/// Carry per (category, day start hour). Entries are only ever valid; invalidation removes them.
pub(super) type CarryCache = HashMap<CatIdx, BTreeMap<Hour, Arc<HashMap<ProductIdx, f64>>>>;

/// Orders candidates by product id bytes inside `next_day_carry` while carrying the dense index.
#[derive(Clone)]
struct ProductKey<'a>(ProductIdx, &'a ProductTable);

impl AsRef<[u8]> for ProductKey<'_> {
    fn as_ref(&self) -> &[u8] {
        self.1.ids[self.0 as usize].as_str().as_bytes()
    }
}

impl Inputs<'_> {
    /// carry(category, day): walks back to the nearest known day, then forward, caching each day.
    pub(super) fn carry_for(
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
    pub(super) fn carry_for_within(
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
}

impl RankingEngine {
    /// A cell of `product` in `hour` changed: every carry computed from that day on may differ. A day
    /// earlier than any before moves the start of every chain, so then all carry goes.
    pub(super) fn note_day_changed(&mut self, hour: Hour, product: ProductIdx) {
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
    pub(super) fn invalidate_carry_after(&mut self, category: CatIdx, day_start: Option<Hour>) {
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
}

#[cfg(test)]
mod tests {
    use rankgate_core::ids::CategoryOrAll;
    use rankgate_core::period::{WindowLen, Zone};
    use rankgate_core::ranker::{popular_score, Policy, PopularWeights, RankerName};

    use super::super::test_support::{
        apply_events, apply_in_batches, assert_all_match_model, category, day, engine, engine_with, hour,
        in_category, model_of, product, queries_over, query, view_event, views, window, workload,
    };
    use super::*;

    fn day_key(n: i64) -> PeriodKey {
        PeriodKey::containing(PeriodKind::Daily, hour(24 * n), &Zone::utc())
    }

    fn day_start(n: i64) -> Hour {
        hour(24 * n)
    }

    /// The days of `category` whose carry is cached, by start hour.
    fn cached_days(engine: &RankingEngine, category: CatIdx) -> Vec<Hour> {
        engine
            .carry_cache
            .get(&category)
            .map(|days| days.keys().copied().collect())
            .unwrap_or_default()
    }

    fn is_carry_stale(engine: &RankingEngine, span: rankgate_core::period::Span) -> bool {
        let key = engine
            .span_key(&query(RankerName::Popular, CategoryOrAll::All, span))
            .unwrap();
        engine.spans[&key].carry_stale
    }

    #[test]
    fn a_days_carry_is_its_eves_top_scores_times_the_ratio_chained_from_the_earliest_day() {
        let weights = PopularWeights {
            carry_ratio: 0.5,
            carry_top_n: 1,
            ..PopularWeights::default()
        };
        let mut engine = engine_with(Policy { version: 1, weights }, 1_000_000);
        let (p1, p2) = (product("p1"), product("p2"));
        engine.apply(
            &[
                (hour(3), p1.clone(), views(10)),
                (hour(4), p2.clone(), views(5)),
                (hour(30), p2.clone(), views(20)),
            ],
            &[],
            None,
        );
        let popular = |n| query(RankerName::Popular, CategoryOrAll::All, day(n));

        // Day 0 is the earliest day: no carry.
        assert_eq!(engine.rank(&popular(0), &p1).carry, 0.0);
        // Day 1: only day 0's top product (p1) carries, and p1 is listed on its carry alone.
        let day0_p1 = popular_score(0.0, &views(10), &weights);
        let p1_day1 = engine.rank(&popular(1), &p1);
        assert_eq!(p1_day1.carry, 0.5 * day0_p1);
        assert_eq!(p1_day1.score, Some(0.5 * day0_p1));
        assert_eq!(engine.rank(&popular(1), &p2).carry, 0.0);
        // Day 2: day 1's top is p2 (its views beat p1's carry); day 3 carries p2's day-2 carry on.
        let day1_p2 = popular_score(0.0, &views(20), &weights);
        assert_eq!(engine.rank(&popular(2), &p2).carry, 0.5 * day1_p2);
        assert_eq!(engine.rank(&popular(2), &p1).rank, None);
        assert_eq!(engine.rank(&popular(3), &p2).carry, 0.5 * (0.5 * day1_p2));
        // Carry is `popular`'s alone, and only daily periods have it.
        assert_eq!(
            engine
                .rank(&query(RankerName::Units, CategoryOrAll::All, day(1)), &p1)
                .rank,
            None
        );
        let week = window(WindowLen::D7, 80);
        assert_eq!(
            engine
                .rank(&query(RankerName::Popular, CategoryOrAll::All, week), &p1)
                .carry,
            0.0
        );
    }

    #[test]
    fn carry_chains_day_to_day_like_the_recompute() {
        let weights = PopularWeights {
            carry_top_n: 3,
            ..PopularWeights::default()
        };
        let events = workload(11, 1_000, 5 * 24);
        let mut engine = engine_with(Policy { version: 1, weights }, 1_000_000);
        apply_in_batches(&mut engine, &events, 60);
        let queries: Vec<_> = queries_over(&[day(1), day(2), day(3), day(4)])
            .into_iter()
            .filter(|q| q.ranker == RankerName::Popular)
            .collect();
        assert!(assert_all_match_model(&mut engine, &model_of(&events, weights), &queries) > 0);
        let carried: usize = queries
            .iter()
            .map(|q| {
                engine
                    .full_ranking(q)
                    .iter()
                    .filter(|item| item.carry != 0.0)
                    .count()
            })
            .sum();
        // Three places per (category, day) for 5 categories over 4 days, nearly all taken.
        assert!(carried > 40, "{carried}");
    }

    #[test]
    fn a_late_event_drops_the_carry_of_the_days_after_it_and_only_those() {
        let events = workload(12, 800, 4 * 24);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        engine.apply(&[], &[(product("late"), category("only-late"))], None);
        for n in 0..4 {
            engine.top(&query(RankerName::Popular, CategoryOrAll::All, day(n)), 0, 1);
        }
        let c0 = engine.categories.lookup(&in_category("c0")).unwrap();
        engine.top(&query(RankerName::Popular, in_category("c0"), day(3)), 0, 1);
        assert_eq!(
            cached_days(&engine, ALL),
            [day_start(1), day_start(2), day_start(3)]
        );
        let c0_days = cached_days(&engine, c0);

        // A late event on day 1, of a product in no workload category.
        let late = view_event("late", hour(30), "late", &["only-late"]);
        apply_events(&mut engine, std::slice::from_ref(&late));

        // Day 1's carry comes from day 0 and stays; days 2 and 3 go, and their spans take new carry on
        // the next read. Categories the product is not in keep theirs.
        assert_eq!(cached_days(&engine, ALL), [day_start(1)]);
        assert_eq!(cached_days(&engine, c0), c0_days);
        assert_eq!(
            (0..4)
                .map(|n| is_carry_stale(&engine, day(n)))
                .collect::<Vec<_>>(),
            [false, false, true, true]
        );
        let mut all_events = events.clone();
        all_events.push(late);
        let queries: Vec<_> = queries_over(&[day(1), day(2), day(3)])
            .into_iter()
            .filter(|q| q.category == CategoryOrAll::All)
            .collect();
        assert!(
            assert_all_match_model(
                &mut engine,
                &model_of(&all_events, PopularWeights::default()),
                &queries
            ) > 0
        );
    }

    #[test]
    fn an_event_before_the_earliest_day_restarts_every_chain() {
        let events = workload(13, 600, 3 * 24);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        let spans = [day(0), day(1), day(2), window(WindowLen::D1, 50)];
        for span in spans {
            engine.top(&query(RankerName::Popular, CategoryOrAll::All, span), 0, 1);
        }
        assert!(!engine.carry_cache.is_empty());

        let early = view_event("early", hour(-30), "p1", &[]);
        apply_events(&mut engine, std::slice::from_ref(&early));

        assert_eq!(engine.earliest_day, Some(day_start(-2)));
        assert!(engine.carry_cache.is_empty());
        assert_eq!(
            spans.map(|span| is_carry_stale(&engine, span)),
            [true, true, true, false],
            "only daily spans have carry"
        );
        let mut all_events = events.clone();
        all_events.push(early);
        let queries: Vec<_> = queries_over(&[day(-1), day(0), day(1), day(2)])
            .into_iter()
            .filter(|q| q.ranker == RankerName::Popular)
            .collect();
        assert!(
            assert_all_match_model(
                &mut engine,
                &model_of(&all_events, PopularWeights::default()),
                &queries
            ) > 0
        );
        // The early view reaches day 0 through day -1's carry.
        let p1_day0 = engine.rank(
            &query(RankerName::Popular, CategoryOrAll::All, day(0)),
            &product("p1"),
        );
        assert_ne!(p1_day0.carry, 0.0);
    }

    #[test]
    fn a_chain_walked_within_a_budget_equals_the_chain_walked_at_once() {
        let events = workload(14, 900, 6 * 24);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        let inputs = engine.inputs();

        let mut stepwise = CarryCache::new();
        let mut calls = 0;
        let carry = loop {
            calls += 1;
            if let Some(carry) = inputs.carry_for_within(&mut stepwise, ALL, day_key(5), 2) {
                break carry;
            }
            // Oldest first: after each short call the cached days are the first ones of the chain.
            assert_eq!(
                stepwise[&ALL].keys().copied().collect::<Vec<_>>(),
                (1..=2 * calls as i64).map(day_start).collect::<Vec<_>>()
            );
        };
        assert_eq!(calls, 3, "days 1 to 5 are missing: 2 + 2 + 1");

        let mut at_once = CarryCache::new();
        let expected = inputs.carry_for(&mut at_once, ALL, day_key(5));
        assert!(!expected.is_empty());
        assert_eq!(*carry, *expected);
        assert_eq!(stepwise[&ALL], at_once[&ALL]);
    }
}
