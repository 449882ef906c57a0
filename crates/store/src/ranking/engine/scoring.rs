//! Scores: the read-only [`Inputs`] every computation borrows from the engine, summing a span from the
//! hourly table, building a whole span in one hold ([`Inputs::build_span`]) and re-scoring the dirty
//! products of a cached span at flush ([`Inputs::rescore_dirty`]).
//!
//! A product is always scored from its span metrics, carry and decayed metrics as they are, never by
//! adding a delta to its old score: `trending`'s decayed sum is recomputed from the product's cells in
//! ascending hour order ([`Inputs::decayed_of`]), so every path gets the batch recompute's bits.
//! [`Inputs`] borrows the engine's tables apart from its mutable caches, which is what lets a policy
//! rebuild score under other policies with the same code ([`RankingEngine::rebuild_in_steps`]).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use hashbrown::{HashMap, HashSet};

use rankgate_core::ids::ProductId;
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKind, Span, Zone};
use rankgate_core::ranker::{
    ascending_key, is_listed, score, trending_decay, Decayed, Policy, PopularWeights, RankerName, ScoreInputs,
};
use rankgate_zset::SortedSet;

use super::carry::CarryCache;
use super::hours::{add_metrics, add_metrics_keeping_nonzero};
use super::interning::{CatIdx, ProductIdx, ProductTable, ALL};
use super::span_cache::{SpanKey, SpanState};
use super::{RankingEngine, RANKERS};

/// Read-only inputs every span and carry computation needs; borrowed apart from the mutable caches.
pub(super) struct Inputs<'a> {
    pub(super) zone: &'a Zone,
    pub(super) products: &'a ProductTable,
    pub(super) hours: &'a BTreeMap<Hour, HashMap<ProductIdx, Metrics>>,
    pub(super) earliest_day: Option<Hour>,
    /// The `popular` policy.
    pub(super) policy: &'a Policy,
    /// The `trending` policy.
    pub(super) trending: &'a Policy,
    /// The current hour: E of running periods.
    pub(super) now: Hour,
}

impl RankingEngine {
    /// The engine's own inputs: its tables, policies and clock, borrowed.
    pub(super) fn inputs(&self) -> Inputs<'_> {
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
}

impl Inputs<'_> {
    /// `product`'s decayed metrics over `hours` for a span ending at `end`: every hour it has a cell in,
    /// ascending, from the hourly table (never a running sum patched with deltas).
    pub(super) fn decayed_of(&self, product: ProductIdx, hours: Range<Hour>, end: Hour) -> Decayed {
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

    /// Every product's metric totals over `hours` in `category`, for a carry day. Decayed metrics are not
    /// needed there (carry comes from `popular`), so this skips [`Inputs::aggregate_into`]'s work.
    pub(super) fn aggregate(&self, category: CatIdx, hours: Range<Hour>) -> HashMap<ProductIdx, Metrics> {
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
    pub(super) fn aggregate_into(
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

    /// A whole span in one hold: its totals, decayed metrics and carry, and the four sorted sets.
    pub(super) fn build_span(&self, cache: &mut CarryCache, key: SpanKey) -> SpanState {
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

    /// Re-scores each dirty product from the span's inputs and moves it in (or out of) every sorted set,
    /// noting in the change log, if the span has one, what moved.
    pub(super) fn rescore_dirty(&self, state: &mut SpanState) {
        if let Some(log) = &mut state.change_log {
            log.note_details(state.dirty.iter().copied());
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
                        log.note_key_moved(ranker, product);
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

/// Inserts `product` into every ranking that lists it, scored from `inputs` under the `popular` and
/// `trending` policies.
pub(super) fn insert_scores(
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

#[cfg(test)]
mod tests {
    use rankgate_core::ids::CategoryOrAll;
    use rankgate_core::ranker::PopularWeights;

    use super::super::test_support::{
        apply_events, apply_in_batches, by_ids, engine, hour, in_category, model_of, queries_over,
        view_event, workload, workload_categories, workload_spans,
    };
    use super::*;
    use crate::ranking::recompute::BatchModel;

    /// Asserts every ranker's sorted set of `state` holds the recompute's ranking: same products in the
    /// same order, keys equal to the bit to the recompute's scores negated, and the span's metric totals
    /// of each. Returns the members compared.
    fn assert_state_ranks_like(
        engine: &RankingEngine,
        state: &SpanState,
        model: &BatchModel,
        category: &CategoryOrAll,
        span: &Span,
    ) -> usize {
        let mut compared = 0;
        for ranker in RankerName::ALL {
            let expected = model.ranking(ranker, category, span);
            let served: Vec<(&str, u64, Metrics)> = state.rankings[ranker.index()]
                .iter_from_rank(0)
                .map(|(member, key)| {
                    let member = std::str::from_utf8(member).unwrap();
                    let idx = engine.products.index[member];
                    (
                        member,
                        key.to_bits(),
                        state.metrics.get(&idx).copied().unwrap_or_default(),
                    )
                })
                .collect();
            let expected: Vec<(&str, u64, Metrics)> = expected
                .iter()
                .map(|item| {
                    (
                        item.product.as_str(),
                        ascending_key(item.score).to_bits(),
                        item.metrics,
                    )
                })
                .collect();
            assert_eq!(served, expected, "{ranker} {category} {span:?}");
            compared += served.len();
        }
        compared
    }

    #[test]
    fn a_span_built_in_one_hold_ranks_like_the_recompute() {
        let events = workload(21, 900, 72);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 75);
        // A clock inside day 2, so running periods decay `trending` from the current hour.
        engine.advance_to_hour(hour(50));
        let model = model_of(&events, PopularWeights::default()).at_hour(hour(50));
        let mut cache = CarryCache::new();
        let mut compared = 0;
        for span in workload_spans() {
            for category in workload_categories() {
                let key = SpanKey {
                    category: engine.categories.lookup(&category).unwrap(),
                    span,
                };
                let state = engine.inputs().build_span(&mut cache, key);
                assert_eq!(state.trending_end, span.trending_end(&Zone::utc(), hour(50)));
                compared += assert_state_ranks_like(&engine, &state, &model, &category, &span);
            }
        }
        assert!(compared > 1_000, "{compared}");
    }

    #[test]
    fn rescoring_dirty_products_equals_building_the_span_again() {
        let events = workload(22, 1_000, 72);
        let queries = queries_over(&workload_spans());
        let mut engine = engine();
        apply_events(&mut engine, &events[..200]);
        for query in &queries {
            engine.top(query, 0, 1);
        }
        for (i, batch) in events[200..].chunks(50).enumerate() {
            apply_events(&mut engine, batch);
            if i % 3 == 0 {
                engine.flush_all();
            }
        }
        engine.flush_all();
        let mut compared = 0;
        let keys: Vec<SpanKey> = engine.spans.keys().copied().collect();
        for key in keys {
            let kept = &engine.spans[&key];
            assert!(kept.is_clean());
            let built = engine.inputs().build_span(&mut CarryCache::new(), key);
            let kept = by_ids(&engine, kept);
            compared += kept.rankings.iter().map(Vec::len).sum::<usize>();
            assert_eq!(kept, by_ids(&engine, &built), "{key:?}");
        }
        assert!(compared > 1_000, "{compared}");
    }

    #[test]
    fn trending_sums_a_products_hours_in_ascending_order_however_they_arrived() {
        // Many hours of one product, with counts whose decayed sum depends on the order of addition.
        let events: Vec<_> = (0..160)
            .map(|i| view_event(&format!("e{i}"), hour(i % 47), &format!("p{}", i % 3), &["c1"]))
            .collect();
        let span = Span::Window {
            len: rankgate_core::period::WindowLen::D7,
            end: hour(47),
        };
        let trending = |category| super::super::test_support::query(RankerName::Trending, category, span);
        let mut ascending = engine();
        let mut descending = engine();
        let mut sorted = events.clone();
        sorted.sort_by_key(|e| e.ts_millis);
        // Cache the span first, so every later event goes through `apply` and a flush's re-score.
        apply_events(&mut ascending, &sorted[..1]);
        apply_events(&mut descending, &sorted[sorted.len() - 1..]);
        ascending.top(&trending(CategoryOrAll::All), 0, 1);
        descending.top(&trending(CategoryOrAll::All), 0, 1);
        for (i, event) in sorted[1..].iter().enumerate() {
            apply_events(&mut ascending, std::slice::from_ref(event));
            if i % 10 == 0 {
                ascending.flush_all();
            }
        }
        for (i, event) in sorted[..sorted.len() - 1].iter().rev().enumerate() {
            apply_events(&mut descending, std::slice::from_ref(event));
            if i % 10 == 0 {
                descending.flush_all();
            }
        }
        let model = model_of(&events, PopularWeights::default());
        for category in [CategoryOrAll::All, in_category("c1")] {
            let (a, d) = (
                ascending.full_ranking(&trending(category.clone())),
                descending.full_ranking(&trending(category.clone())),
            );
            assert_eq!(a.len(), 3);
            assert_eq!(a, d, "{category}");
            let expected = model.ranking(RankerName::Trending, &category, &span);
            let bits = |items: &[crate::ranking::engine::RankedItem]| -> Vec<(String, u64)> {
                items
                    .iter()
                    .map(|i| (i.product.as_str().to_string(), i.score.to_bits()))
                    .collect()
            };
            assert_eq!(bits(&a), bits(&expected), "{category}");
        }
    }

    #[test]
    fn reading_a_span_in_slices_of_cells_equals_reading_it_at_once() {
        let events = workload(23, 900, 72);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        let inputs = engine.inputs();
        let (hours, end) = (hour(0)..hour(72), hour(60));
        for category in workload_categories() {
            let category = engine.categories.lookup(&category).unwrap();
            let (mut whole, mut whole_decayed) = (HashMap::new(), HashMap::new());
            let done = inputs.aggregate_into(
                &mut whole,
                &mut whole_decayed,
                end,
                category,
                hours.clone(),
                usize::MAX,
            );
            assert_eq!(done, hours.end);

            let (mut sliced, mut sliced_decayed) = (HashMap::new(), HashMap::new());
            let (mut from, mut slices) = (hours.start, 0);
            while from < hours.end {
                let next = inputs.aggregate_into(
                    &mut sliced,
                    &mut sliced_decayed,
                    end,
                    category,
                    from..hours.end,
                    5,
                );
                assert!(next > from, "every slice reads at least one hour");
                from = next;
                slices += 1;
            }
            assert!(slices > 10, "{slices}");
            assert_eq!(sliced, whole);
            assert_eq!(
                sliced_decayed, whole_decayed,
                "same hours in the same order give the same bits"
            );
            assert_eq!(inputs.aggregate(category, hours.clone()), whole);
            assert!(!whole.is_empty());
            for (product, decayed) in &whole_decayed {
                assert_eq!(*decayed, inputs.decayed_of(*product, hours.clone(), end));
            }
        }
    }

    #[test]
    fn a_delisted_product_keeps_its_metrics_in_the_span_but_is_scored_into_no_ranking() {
        let events = workload(24, 300, 24);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        engine.set_listed(&[(ProductId::parse("p5").unwrap(), false)]);
        let p5 = engine.products.index["p5"];
        let key = SpanKey {
            category: ALL,
            span: super::super::test_support::day(0),
        };
        let state = engine.inputs().build_span(&mut CarryCache::new(), key);
        assert!(state.metrics.contains_key(&p5));
        for ranking in &state.rankings {
            assert_eq!(ranking.zscore(b"p5"), None);
            assert!(!ranking.is_empty());
        }
    }
}
