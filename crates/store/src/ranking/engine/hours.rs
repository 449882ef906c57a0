//! The hourly table, the engine's copy of the source of truth, and the writes that change it:
//! [`RankingEngine::apply`] (each committed micro-batch), [`RankingEngine::apply_absolute`] (another
//! instance's rows from the change feed), [`RankingEngine::set_listed`] (catalogue listing flags) and
//! [`RankingEngine::evict_before`] (retention).
//!
//! This is the ingest hot path. A delta goes to its hour, to the product's cells by hour, and to the
//! metric totals of every cached span of its categories that contains the hour, marking the product
//! dirty there; nothing is re-scored here (the flush does, once per product however many deltas came).
//! Spans being built in steps get the delta too when they already read its hour, so a cold build counts
//! each change exactly once.

use std::ops::Range;

use hashbrown::HashMap;

use rankgate_core::ids::{Category, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{Hour, PeriodKey, PeriodKind, Span};

use super::interning::{CatIdx, ProductIdx, ALL};
use super::span_cache::SpanKey;
use super::RankingEngine;

/// Adds `delta` into `into`, saturating instead of wrapping.
pub(super) fn add_metrics(into: &mut Metrics, delta: &Metrics) {
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
pub(super) fn add_metrics_keeping_nonzero(
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

impl RankingEngine {
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
