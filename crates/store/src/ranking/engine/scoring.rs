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
