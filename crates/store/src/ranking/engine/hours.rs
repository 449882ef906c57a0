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

#[cfg(test)]
mod tests {
    use rankgate_core::ids::CategoryOrAll;
    use rankgate_core::period::WindowLen;
    use rankgate_core::ranker::{PopularWeights, RankerName};

    use super::super::test_support::{
        apply_events, apply_in_batches, assert_all_match_model, by_ids, cached_by_ids, category, day, engine,
        hour, hourly, in_category, model_of, product, queries_over, query, views, window, workload,
        workload_spans,
    };
    use super::*;

    #[test]
    fn apply_adds_to_the_hour_and_only_to_the_cached_spans_that_contain_it() {
        let mut engine = engine();
        let (p1, p2) = (product("p1"), product("p2"));
        engine.apply(
            &[(hour(2), p1.clone(), views(1)), (hour(26), p2.clone(), views(1))],
            &[(p1.clone(), category("c1")), (p2.clone(), category("c2"))],
            Some(1),
        );
        // (span, whether a delta of p1 at hour 5 belongs in it)
        let spans = [
            (CategoryOrAll::All, day(0), true),
            (CategoryOrAll::All, hourly(5), true),
            (CategoryOrAll::All, window(WindowLen::D7, 47), true),
            (in_category("c1"), day(0), true),
            (CategoryOrAll::All, day(1), false),
            (CategoryOrAll::All, hourly(6), false),
            (in_category("c2"), day(0), false),
        ];
        for (category, span, _) in &spans {
            engine.top(&query(RankerName::Popular, category.clone(), *span), 0, 10);
        }
        let before: Vec<_> = spans
            .iter()
            .map(|(c, s, _)| cached_by_ids(&engine, c, *s))
            .collect();

        engine.apply(&[(hour(5), p1.clone(), views(3))], &[], Some(2));

        assert_eq!(engine.hourly_metrics(hour(5), &p1), views(3));
        assert_eq!(engine.hourly_metrics(hour(2), &p1), views(1));
        let p1_idx = engine.products.index["p1"];
        assert_eq!(engine.products.cells[p1_idx as usize][&hour(5)], views(3));
        for ((category, span, contains), before) in spans.iter().zip(before) {
            let key = engine
                .span_key(&query(RankerName::Popular, category.clone(), *span))
                .unwrap();
            let state = &engine.spans[&key];
            let label = format!("{category} {span:?}");
            if *contains {
                let old = before.metrics.get("p1").copied().unwrap_or_default();
                assert_eq!(state.metrics[&p1_idx].views, old.views + 3, "{label}");
                assert!(state.dirty.contains(&p1_idx), "{label}");
                assert_eq!(state.applied, engine.generation(), "{label}");
            } else {
                assert_eq!(by_ids(&engine, state).metrics, before.metrics, "{label}");
                assert!(state.dirty.is_empty(), "{label}");
            }
        }
        // Day 1's carry comes from day 0, which moved; no later day exists.
        let day1 = engine
            .span_key(&query(RankerName::Popular, CategoryOrAll::All, day(1)))
            .unwrap();
        assert!(engine.spans[&day1].carry_stale);
        assert_eq!(engine.as_of_millis(), Some(2));
    }

    #[test]
    fn cached_spans_kept_current_by_apply_equal_the_recompute() {
        let events = workload(1, 900, 72);
        let queries = queries_over(&workload_spans());
        let mut engine = engine();
        apply_events(&mut engine, &events[..100]);
        // Every span cached early, so the rest arrives through `apply` into cached spans, with reads (and
        // so flushes) of some of them between batches.
        for query in &queries {
            engine.top(query, 0, 5);
        }
        for (i, batch) in events[100..].chunks(40).enumerate() {
            apply_events(&mut engine, batch);
            engine.top(&queries[i * 7 % queries.len()], 0, 5);
        }
        let cached = engine.cached_span_count();
        let listed = assert_all_match_model(
            &mut engine,
            &model_of(&events, PopularWeights::default()),
            &queries,
        );
        assert!(listed > 1_000, "{listed}");
        assert_eq!(
            engine.cached_span_count(),
            cached,
            "reads were answered from the spans kept by apply"
        );
    }

    #[test]
    fn a_product_whose_total_comes_back_to_zero_leaves_the_span() {
        let mut engine = engine();
        let p1 = product("p1");
        let like = Metrics {
            likes: 1,
            ..Metrics::default()
        };
        let unlike = Metrics {
            likes: -1,
            ..Metrics::default()
        };
        engine.apply(&[(hour(1), p1.clone(), like)], &[], None);
        let popular = query(RankerName::Popular, CategoryOrAll::All, day(0));
        assert_eq!(engine.top(&popular, 0, 10).total, 1);
        engine.apply(&[(hour(1), p1.clone(), unlike)], &[], None);
        let key = engine.span_key(&popular).unwrap();
        assert!(engine.spans[&key].metrics.is_empty());
        for ranker in RankerName::ALL {
            let answer = engine.rank(&query(ranker, CategoryOrAll::All, day(0)), &p1);
            assert_eq!((answer.rank, answer.total), (None, 0), "{ranker}");
        }
        assert_eq!(engine.hourly_metrics(hour(1), &p1), Metrics::default());
    }

    #[test]
    fn apply_absolute_applies_only_the_difference_from_what_the_engine_holds() {
        let events = workload(2, 400, 48);
        let memberships: Vec<(ProductId, Category)> = events
            .iter()
            .flat_map(|e| e.categories.iter().map(|c| (e.product.clone(), c.clone())))
            .collect();
        let rows = |engine: &RankingEngine| -> Vec<(Hour, ProductId, Metrics)> {
            let mut rows: Vec<_> = engine.hourly_rows().map(|(h, p, m)| (h, p.clone(), *m)).collect();
            rows.sort_by(|a, b| (a.0, a.1.as_str()).cmp(&(b.0, b.1.as_str())));
            rows
        };
        let (mut writer, mut follower) = (engine(), engine());
        apply_events(&mut writer, &events[..200]);
        follower.apply_absolute(&rows(&writer), &memberships, writer.as_of_millis());
        assert_eq!(rows(&follower), rows(&writer));

        // The same rows again change nothing, not even the generation response caches key on.
        let generation = follower.generation();
        follower.apply_absolute(&rows(&writer), &memberships, writer.as_of_millis());
        assert_eq!(follower.generation(), generation);

        let spans = workload_spans();
        for query in queries_over(&spans) {
            writer.top(&query, 0, 1);
            follower.top(&query, 0, 1);
        }
        apply_events(&mut writer, &events[200..]);
        follower.apply_absolute(&rows(&writer), &memberships, writer.as_of_millis());
        assert_eq!(rows(&follower), rows(&writer));
        for query in queries_over(&spans) {
            assert_eq!(
                writer.full_ranking(&query),
                follower.full_ranking(&query),
                "{query:?}"
            );
        }
    }

    #[test]
    fn a_new_membership_brings_the_products_past_into_the_category() {
        let (p1, p2) = (product("p1"), product("p2"));
        let deltas = [
            (hour(1), p1.clone(), views(2)),
            (hour(2), p1.clone(), views(5)),
            (hour(1), p2.clone(), views(1)),
        ];
        let mut engine = engine();
        engine.apply(&deltas, &[(p2.clone(), category("c1"))], None);
        let c1_day = query(RankerName::Popular, in_category("c1"), day(0));
        assert_eq!(engine.top(&c1_day, 0, 10).total, 1);

        engine.apply(&[], &[(p1.clone(), category("c1"))], None);
        let page = engine.top(&c1_day, 0, 10);
        assert_eq!(page.items[0].product, p1);
        assert_eq!(page.items[0].metrics, views(7));

        let mut told_first = super::super::test_support::engine();
        told_first.apply(&deltas, &[(p1, category("c1")), (p2, category("c1"))], None);
        told_first.top(&c1_day, 0, 10);
        assert_eq!(
            cached_by_ids(&engine, &in_category("c1"), day(0)),
            cached_by_ids(&told_first, &in_category("c1"), day(0))
        );
    }

    #[test]
    fn a_delisted_product_leaves_every_ranking_and_comes_back_when_listed() {
        let events = workload(3, 700, 72);
        let queries = queries_over(&workload_spans());
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 50);
        for query in &queries {
            engine.top(query, 0, 1);
        }
        let delisted = product("p3");
        engine.set_listed(&[(delisted.clone(), false)]);
        assert!(engine.is_delisted(&delisted));
        let model = model_of(&events, PopularWeights::default());
        let listed = assert_all_match_model(
            &mut engine,
            &model.clone().with_delisted([delisted.clone()]),
            &queries,
        );
        assert!(listed > 1_000, "{listed}");
        let anywhere = query(RankerName::Units, CategoryOrAll::All, window(WindowLen::D7, 71));
        let answer = engine.rank(&anywhere, &delisted);
        assert_eq!(answer.rank, None);
        assert_ne!(answer.metrics, Metrics::default(), "its metrics still count");

        // The same flag again is no change.
        let generation = engine.generation();
        engine.set_listed(&[(delisted.clone(), false)]);
        assert_eq!(engine.generation(), generation);

        engine.set_listed(&[(delisted.clone(), true)]);
        assert!(!engine.is_delisted(&delisted));
        assert_all_match_model(&mut engine, &model, &queries);
    }

    #[test]
    fn evict_before_drops_older_hours_and_the_spans_and_carry_built_on_them() {
        let events = workload(4, 700, 72);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        for span in [day(0), day(1), day(2)] {
            engine.top(&query(RankerName::Popular, CategoryOrAll::All, span), 0, 1);
        }
        assert!(!engine.carry_cache.is_empty());

        engine.evict_before(hour(24));

        assert_eq!(engine.hour_range().map(|r| r.start), Some(hour(24)));
        assert!(engine.hourly_rows().all(|(h, _, _)| h >= hour(24)));
        assert!(engine
            .products
            .cells
            .iter()
            .all(|cells| cells.keys().all(|h| *h >= hour(24))));
        assert!(!engine.is_span_cached(&CategoryOrAll::All, day(0)));
        assert!(engine.is_span_cached(&CategoryOrAll::All, day(1)));
        assert!(engine.carry_cache.is_empty());
        // What is left ranks as if the older events had never been: day 1 now starts the carry chain.
        // (`all` only: memberships outlive retention, the recompute of the kept events alone would not
        // know them.)
        let kept: Vec<_> = events.iter().filter(|e| e.hour() >= hour(24)).cloned().collect();
        let model = model_of(&kept, PopularWeights::default());
        let all_only: Vec<_> = queries_over(&[day(1), day(2), window(WindowLen::D1, 60)])
            .into_iter()
            .filter(|q| q.category == CategoryOrAll::All)
            .collect();
        assert!(assert_all_match_model(&mut engine, &model, &all_only) > 0);
    }
}
