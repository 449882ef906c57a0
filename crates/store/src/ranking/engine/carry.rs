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
