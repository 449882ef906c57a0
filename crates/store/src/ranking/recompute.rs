//! The plain batch recompute: any ranking, computed from events alone with no incremental state.
//!
//! This is the reference the incremental engine is checked against (`rankgate verify` and the
//! "incremental equals recompute" tests). It is deliberately simple: hash maps, full scans, one sort,
//! and a carry chain walked day by day from the earliest day. It shares only the spec's formulas
//! (`popular_score`, `Decayed`, `is_listed`, `ranking_order`) with the engine, never its data structures.
//! `trending` is summed product by product over the span's hours in ascending order, for the end hour E
//! of the model's current hour ([`BatchModel::at_hour`]; like the engine, "every period is over" until
//! one is given).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::rc::Rc;

use rankgate_core::event::Event;
use rankgate_core::ids::{Category, CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span, Zone};
use rankgate_core::ranker::{
    is_listed, popular_score, ranking_order, score, Decayed, PopularWeights, RankerName, ScoreInputs,
};

use super::engine::RankedItem;

/// Counts from replaying an input stream with the service's acceptance rules.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreamCounts {
    /// Events counted.
    pub accepted: usize,
    /// Repeated ids.
    pub duplicates: usize,
    /// Older than `max_lateness` behind the watermark.
    pub too_old: usize,
}

/// Hourly metrics and memberships rebuilt from events.
#[derive(Debug, Clone)]
pub struct BatchModel {
    zone: Zone,
    weights: PopularWeights,
    /// `trending`'s weights and half-life.
    trending: PopularWeights,
    /// The current hour: `trending`'s E of running periods.
    now: Hour,
    hourly: BTreeMap<Hour, HashMap<ProductId, Metrics>>,
    memberships: HashMap<ProductId, BTreeSet<Category>>,
    /// carry(category, day start) memo: the chain is walked once per category, not once per read.
    carry_memo: RefCell<HashMap<(String, Hour), HashMap<ProductId, f64>>>,
    /// Totals of every category of recently asked spans, computed in one pass over the span's cells.
    totals_memo: RefCell<HashMap<Span, Rc<TotalsByCategory>>>,
}

/// Per category name (`ALL_KEY` for `all`): product totals over one span.
type TotalsByCategory = HashMap<String, HashMap<ProductId, Metrics>>;

/// Key of `all` in the per-category totals (no category can be empty).
const ALL_KEY: &str = "";
/// Spans whose totals are remembered before the memo is emptied.
const TOTALS_MEMO_SPANS: usize = 64;

impl BatchModel {
    /// A model of events that were all accepted (e.g. the raw event log): no dedupe, no lateness.
    pub fn from_accepted(
        events: impl IntoIterator<Item = Event>,
        zone: Zone,
        weights: PopularWeights,
    ) -> Self {
        let mut model = BatchModel {
            zone,
            weights,
            trending: PopularWeights::trending_default(),
            now: Hour(i64::MAX),
            hourly: BTreeMap::new(),
            memberships: HashMap::new(),
            carry_memo: RefCell::default(),
            totals_memo: RefCell::default(),
        };
        for event in events {
            model.add(&event);
        }
        model
    }

    /// A model of a raw input stream, applying the spec's rules in arrival order: an id counts once,
    /// and an event older than `max_lateness_millis` behind the newest accepted event time is dropped.
    pub fn from_stream(
        events: impl IntoIterator<Item = Event>,
        max_lateness_millis: i64,
        zone: Zone,
        weights: PopularWeights,
    ) -> (Self, StreamCounts) {
        let mut accepted = Vec::new();
        let mut seen = HashSet::new();
        let mut watermark: Option<i64> = None;
        let mut counts = StreamCounts::default();
        for event in events {
            if !seen.insert(event.id.as_str().to_string()) {
                counts.duplicates += 1;
                continue;
            }
            if watermark.is_some_and(|mark| event.ts_millis < mark - max_lateness_millis) {
                // Dropped events are not processed, so their id may still count later.
                seen.remove(event.id.as_str());
                counts.too_old += 1;
                continue;
            }
            watermark = Some(watermark.map_or(event.ts_millis, |mark| mark.max(event.ts_millis)));
            counts.accepted += 1;
            accepted.push(event);
        }
        (BatchModel::from_accepted(accepted, zone, weights), counts)
    }

    /// The same model scoring `trending` with `weights` (its half-life included).
    #[must_use]
    pub fn with_trending(mut self, weights: PopularWeights) -> Self {
        self.trending = weights;
        self
    }

    /// The same model with `now` as the current hour: `trending`'s E of a running period.
    #[must_use]
    pub fn at_hour(mut self, now: Hour) -> Self {
        self.now = now;
        self
    }

    /// `trending`'s inputs over `span` for every product of `category` with a cell in it: each
    /// product's cells summed in ascending hour order.
    fn decayed(&self, category: &CategoryOrAll, span: &Span) -> HashMap<ProductId, Decayed> {
        let end = span.trending_end(&self.zone, self.now);
        let mut decayed: HashMap<ProductId, Decayed> = HashMap::new();
        for (hour, cells) in self.hourly.range(span.hours(&self.zone)) {
            for (product, metrics) in cells {
                let member = match category {
                    CategoryOrAll::All => true,
                    CategoryOrAll::Category(c) => {
                        self.memberships.get(product).is_some_and(|cs| cs.contains(c))
                    }
                };
                if member {
                    decayed.entry(product.clone()).or_default().add_hour(
                        end,
                        *hour,
                        metrics,
                        self.trending.half_life_hours,
                    );
                }
            }
        }
        decayed
    }

    fn add(&mut self, event: &Event) {
        let delta = event.metrics_delta();
        let cell = self
            .hourly
            .entry(event.hour())
            .or_default()
            .entry(event.product.clone())
            .or_default();
        *cell = cell
            .checked_add(&delta)
            .expect("test workloads stay far from overflow");
        let categories = self.memberships.entry(event.product.clone()).or_default();
        categories.extend(event.categories.iter().cloned());
    }

    fn totals(&self, category: &CategoryOrAll, span: &Span) -> HashMap<ProductId, Metrics> {
        let key = match category {
            CategoryOrAll::All => ALL_KEY,
            CategoryOrAll::Category(c) => c.as_str(),
        };
        self.totals_by_category(span)
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    /// Sums the span's cells once, into `all` and every category of each product.
    fn totals_by_category(&self, span: &Span) -> Rc<TotalsByCategory> {
        if let Some(totals) = self.totals_memo.borrow().get(span) {
            return totals.clone();
        }
        let mut totals: HashMap<String, HashMap<ProductId, Metrics>> = HashMap::new();
        let no_categories = BTreeSet::new();
        for cells in self.hourly.range(span.hours(&self.zone)).map(|(_, cells)| cells) {
            for (product, metrics) in cells {
                let categories = self.memberships.get(product).unwrap_or(&no_categories);
                for key in std::iter::once(ALL_KEY).chain(categories.iter().map(Category::as_str)) {
                    let total = totals
                        .entry(key.to_string())
                        .or_default()
                        .entry(product.clone())
                        .or_default();
                    *total = total.checked_add(metrics).expect("no overflow");
                }
            }
        }
        for per_category in totals.values_mut() {
            per_category.retain(|_, m| !m.is_zero());
        }
        let totals = Rc::new(totals);
        let mut memo = self.totals_memo.borrow_mut();
        if memo.len() >= TOTALS_MEMO_SPANS {
            memo.clear();
        }
        memo.insert(*span, totals.clone());
        totals
    }

    fn earliest_day(&self) -> Option<PeriodKey> {
        let first = self.hourly.keys().next()?;
        Some(PeriodKey::containing(PeriodKind::Daily, *first, &self.zone))
    }

    /// carry(category, day), walking the chain forward from the earliest day, which has no carry.
    fn carry(&self, category: &CategoryOrAll, day: PeriodKey) -> HashMap<ProductId, f64> {
        let Some(earliest) = self.earliest_day() else {
            return HashMap::new();
        };
        let day_start = day.hours(&self.zone).start;
        if day_start <= earliest.hours(&self.zone).start {
            return HashMap::new();
        }
        let memo_key = (category.as_str().to_string(), day_start);
        if let Some(carry) = self.carry_memo.borrow().get(&memo_key) {
            return carry.clone();
        }
        let previous_day = day.prev(&self.zone);
        let previous_carry = self.carry(category, previous_day);
        let scored = self.scored_popular_day(category, previous_day, &previous_carry);
        let carry: HashMap<ProductId, f64> = scored
            .into_iter()
            .take(self.weights.carry_top_n as usize)
            .map(|(product, score)| (product, self.weights.carry_ratio * score))
            .filter(|(_, c)| *c != 0.0)
            .collect();
        self.carry_memo.borrow_mut().insert(memo_key, carry.clone());
        carry
    }

    fn scored_popular_day(
        &self,
        category: &CategoryOrAll,
        day: PeriodKey,
        carry: &HashMap<ProductId, f64>,
    ) -> Vec<(ProductId, f64)> {
        let totals = self.totals(category, &Span::Period(day));
        let products: BTreeSet<&ProductId> = totals.keys().chain(carry.keys()).collect();
        let mut scored: Vec<(ProductId, f64)> = products
            .into_iter()
            .filter_map(|p| {
                let m = totals.get(p).copied().unwrap_or_default();
                let c = carry.get(p).copied().unwrap_or(0.0);
                let inputs = ScoreInputs {
                    metrics: m,
                    carry: c,
                    ..ScoreInputs::default()
                };
                is_listed(RankerName::Popular, &inputs)
                    .then(|| (p.clone(), popular_score(c, &m, &self.weights)))
            })
            .collect();
        scored.sort_by(|a, b| ranking_order(a.1, a.0.as_str().as_bytes(), b.1, b.0.as_str().as_bytes()));
        scored
    }

    /// The full ranking, in order, with ranks from 1.
    pub fn ranking(&self, ranker: RankerName, category: &CategoryOrAll, span: &Span) -> Vec<RankedItem> {
        let totals = self.totals(category, span);
        let carry = match (ranker, span) {
            (RankerName::Popular, Span::Period(day)) if day.kind() == PeriodKind::Daily => {
                self.carry(category, *day)
            }
            _ => HashMap::new(),
        };
        let decayed = match ranker {
            RankerName::Trending => self.decayed(category, span),
            _ => HashMap::new(),
        };
        let weights = match ranker {
            RankerName::Trending => &self.trending,
            _ => &self.weights,
        };
        let products: BTreeSet<&ProductId> =
            totals.keys().chain(carry.keys()).chain(decayed.keys()).collect();
        let mut items: Vec<RankedItem> = products
            .into_iter()
            .filter_map(|product| {
                let inputs = ScoreInputs {
                    metrics: totals.get(product).copied().unwrap_or_default(),
                    carry: carry.get(product).copied().unwrap_or(0.0),
                    decayed: decayed.get(product).copied().unwrap_or_default(),
                };
                is_listed(ranker, &inputs).then(|| RankedItem {
                    rank: 0,
                    product: product.clone(),
                    score: score(ranker, &inputs, weights),
                    metrics: inputs.metrics,
                    carry: inputs.carry,
                })
            })
            .collect();
        items.sort_by(|a, b| {
            ranking_order(
                a.score,
                a.product.as_str().as_bytes(),
                b.score,
                b.product.as_str().as_bytes(),
            )
        });
        for (i, item) in items.iter_mut().enumerate() {
            item.rank = i + 1;
        }
        items
    }

    /// Every category seen.
    pub fn categories(&self) -> BTreeSet<Category> {
        self.memberships.values().flatten().cloned().collect()
    }

    /// The hours that hold metrics.
    pub fn hour_range(&self) -> Option<std::ops::Range<Hour>> {
        let first = self.hourly.keys().next()?;
        let last = self.hourly.keys().next_back()?;
        Some(*first..Hour(last.0 + 1))
    }

    /// Every non-zero hourly cell, for comparing with the stored metric rows.
    pub fn hourly_rows(&self) -> Vec<(Hour, ProductId, Metrics)> {
        let mut rows: Vec<(Hour, ProductId, Metrics)> = self
            .hourly
            .iter()
            .flat_map(|(hour, cells)| cells.iter().map(move |(p, m)| (*hour, p.clone(), *m)))
            .filter(|(_, _, m)| !m.is_zero())
            .collect();
        rows.sort_by(|a, b| (a.0, a.1.as_str()).cmp(&(b.0, b.1.as_str())));
        rows
    }
}
