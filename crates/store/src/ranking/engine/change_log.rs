//! Change logs: what the engine re-scored in a span since a reader last looked, so the Redis
//! publication ([`publication`](crate::ranking::publication)) writes only what moved.
//!
//! A log exists only for spans a reader follows: [`RankingEngine::take_span_changes`] starts one, and
//! from then on each flush notes, per ranker, the products whose key moved (or that were listed or
//! unlisted), and the products whose metrics or carry moved (`Inputs::rescore_dirty` calls
//! [`ChangeLog::note_details`] and [`ChangeLog::note_key_moved`]). A span built anew has no log, and the
//! next take says [`SpanChanges::Rebuilt`]: the reader must take it whole.

use hashbrown::HashSet;

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::Span;
use rankgate_core::ranker::RankerName;

use super::interning::{ProductIdx, ProductTable};
use super::span_cache::{SpanKey, SpanState};
use super::{RankingEngine, RANKERS};

/// A span's change log, kept apart per ranker: a view moves a product's `popular` key but not its `units`
/// or `revenue` one, and a reader (the Redis publication) writes only what moved. Sets, so a product
/// touched by a thousand events is logged once.
#[derive(Debug, Clone, Default)]
pub(super) struct ChangeLog {
    /// Products whose key (or listing) changed, per ranker.
    rankings: [HashSet<ProductIdx>; RANKERS],
    /// Products whose metrics or carry changed.
    details: HashSet<ProductIdx>,
}

impl ChangeLog {
    /// Notes products a flush re-scores: their metrics or carry may have moved, whatever their keys did.
    #[inline]
    pub(super) fn note_details(&mut self, products: impl IntoIterator<Item = ProductIdx>) {
        self.details.extend(products);
    }

    /// Notes that `product`'s key under `ranker` moved, or that it was listed or unlisted there.
    #[inline]
    pub(super) fn note_key_moved(&mut self, ranker: RankerName, product: ProductIdx) {
        self.rankings[ranker.index()].insert(product);
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

    /// `product`'s ascending key ([`ascending_key`](rankgate_core::ranker::ascending_key)) under `ranker`,
    /// `None` when it is not listed.
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

impl RankingEngine {
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
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use parking_lot::RwLock;
    use rankgate_core::period::{PeriodKind, WindowLen};
    use rankgate_core::ranker::{Policy, PopularWeights};

    use super::super::test_support::{
        apply_events, apply_in_batches, day, engine, hour, in_category, product, query, views, window,
        workload,
    };
    use super::*;

    /// Per ranker, every product's key bits in the span (`None` when unlisted).
    type Keys = Vec<BTreeMap<ProductId, Option<u64>>>;

    fn keys_of(span: &CachedSpan<'_>, products: &[ProductId]) -> Keys {
        RankerName::ALL
            .iter()
            .map(|ranker| {
                products
                    .iter()
                    .map(|p| (p.clone(), span.key(*ranker, p).map(f64::to_bits)))
                    .collect()
            })
            .collect()
    }

    fn every_product(engine: &RankingEngine) -> Vec<ProductId> {
        engine.products.ids.clone()
    }

    fn followed_spans() -> Vec<(CategoryOrAll, Span)> {
        vec![
            (CategoryOrAll::All, day(1)),
            (CategoryOrAll::All, day(2)),
            (in_category("c1"), day(2)),
            (CategoryOrAll::All, window(WindowLen::D7, 71)),
            (in_category("c2"), window(WindowLen::D1, 60)),
        ]
    }

    #[test]
    fn a_span_built_anew_has_no_log_and_says_so() {
        let events = workload(71, 400, 72);
        let engine = RwLock::new(engine());
        apply_in_batches(&mut engine.write(), &events, 100);
        let (category, span) = (CategoryOrAll::All, day(1));
        let take = || engine.write().take_span_changes(&category, span).unwrap().0;

        assert_eq!(take(), SpanChanges::Rebuilt, "first read");
        let unchanged = take();
        assert!(matches!(unchanged, SpanChanges::Rescored { .. }) && unchanged.is_empty());
        assert!(!SpanChanges::Rebuilt.is_empty());

        engine.write().evict_cached_spans();
        assert_eq!(take(), SpanChanges::Rebuilt, "built again after eviction");
        assert!(take().is_empty());

        let new_policy = Policy {
            version: 2,
            weights: PopularWeights {
                view: 1.0,
                ..PopularWeights::default()
            },
        };
        let rebuilt = RankingEngine::rebuild_in_steps(&engine, RankerName::Popular, new_policy);
        engine.write().install(rebuilt);
        assert_eq!(take(), SpanChanges::Rebuilt, "a policy switch rebuilds the span");

        engine.write().advance_to_hour(hour(30));
        assert_eq!(take(), SpanChanges::Rebuilt, "trending's end hour moved");
        assert!(engine
            .write()
            .take_span_changes(&in_category("never-seen"), span)
            .is_none());
    }

    #[test]
    fn the_log_lists_exactly_the_products_whose_key_moved_per_ranker() {
        let events = workload(72, 1_200, 72);
        let (before, after) = events.split_at(700);
        let mut engine = engine();
        apply_in_batches(&mut engine, before, 100);
        let spans = followed_spans();
        for (category, span) in &spans {
            assert_eq!(
                engine.take_span_changes(category, *span).unwrap().0,
                SpanChanges::Rebuilt
            );
        }
        let products = every_product(&engine);
        let mut keys: Vec<Keys> = spans
            .iter()
            .map(|(c, s)| keys_of(&engine.take_span_changes(c, *s).unwrap().1, &products))
            .collect();

        let mut moved_anywhere = 0;
        for round in after.chunks(100) {
            // Two batches per round, no flush between them: the take flushes once.
            let (first, second) = round.split_at(round.len() / 2);
            apply_events(&mut engine, first);
            apply_events(&mut engine, second);
            let touched: BTreeSet<&ProductId> = round.iter().map(|e| &e.product).collect();
            for ((category, span), keys) in spans.iter().zip(&mut keys) {
                let (changes, cached) = engine.take_span_changes(category, *span).unwrap();
                let now = keys_of(&cached, &products);
                let SpanChanges::Rescored { rankings, details } = changes else {
                    panic!("{category} {span:?} was followed, not rebuilt");
                };
                for (r, ranker) in RankerName::ALL.iter().enumerate() {
                    let moved: Vec<ProductId> = products
                        .iter()
                        .filter(|p| keys[r][*p] != now[r][*p])
                        .cloned()
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    assert_eq!(rankings[r], moved, "{ranker} {category} {span:?}");
                    assert!(
                        moved.iter().all(|p| details.contains(p)),
                        "what moved was re-scored"
                    );
                    moved_anywhere += moved.len();
                }
                // Re-scored are products of this round, and, in a daily span, products whose carry moved.
                let daily = matches!(span, Span::Period(p) if p.kind() == PeriodKind::Daily);
                assert!(
                    details.iter().all(|p| daily || touched.contains(p)),
                    "{details:?}"
                );
                assert!(
                    details.windows(2).all(|w| w[0] < w[1]),
                    "in product id order, once each"
                );
                *keys = now;
            }
        }
        assert!(moved_anywhere > 100, "{moved_anywhere}");
    }

    #[test]
    fn a_product_rescored_to_the_same_key_is_in_the_details_only_and_logs_gather_across_flushes() {
        let mut engine = engine();
        let (p1, p2) = (product("p1"), product("p2"));
        let likes = |n| Metrics {
            likes: n,
            ..Metrics::default()
        };
        engine.apply(
            &[(hour(1), p1.clone(), views(4)), (hour(1), p2.clone(), views(2))],
            &[],
            None,
        );
        let (category, span) = (CategoryOrAll::All, window(WindowLen::D1, 10));
        engine.take_span_changes(&category, span);

        engine.apply(&[(hour(2), p1.clone(), likes(1))], &[], None);
        engine.flush_all();
        engine.apply(&[(hour(2), p1.clone(), likes(-1))], &[], None);
        engine.flush_all();
        engine.apply(&[(hour(3), p2.clone(), views(1))], &[], None);
        let SpanChanges::Rescored { rankings, details } =
            engine.take_span_changes(&category, span).unwrap().0
        else {
            panic!("the span was followed");
        };
        assert_eq!(details, [p1.clone(), p2.clone()]);
        // p1 moved and came back across two flushes: logged when it moved. p2 moved under the rankers
        // that weigh views; it has no units or revenue.
        assert_eq!(rankings[RankerName::Popular.index()], [p1.clone(), p2.clone()]);
        assert_eq!(rankings[RankerName::Units.index()], Vec::<ProductId>::new());
        assert_eq!(rankings[RankerName::Revenue.index()], Vec::<ProductId>::new());

        // Within one flush, there and back is no move at all.
        engine.apply(&[(hour(2), p1.clone(), likes(1))], &[], None);
        engine.apply(&[(hour(2), p1.clone(), likes(-1))], &[], None);
        let SpanChanges::Rescored { rankings, details } =
            engine.take_span_changes(&category, span).unwrap().0
        else {
            panic!("the span was followed");
        };
        assert_eq!(details, [p1]);
        assert!(rankings.iter().all(Vec::is_empty), "{rankings:?}");
    }

    #[test]
    fn the_cached_span_handed_out_reads_like_the_engine() {
        let events = workload(73, 600, 48);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        let (category, span) = (CategoryOrAll::All, day(1));
        let pages: Vec<_> = RankerName::ALL
            .iter()
            .map(|r| engine.full_ranking(&query(*r, category.clone(), span)))
            .collect();
        let popular = &pages[RankerName::Popular.index()];
        let (_, cached) = engine.take_span_changes(&category, span).unwrap();
        for (ranker, page) in RankerName::ALL.iter().zip(&pages) {
            assert_eq!(cached.total(*ranker), page.len());
            let ranked: Vec<(&ProductId, u64)> =
                cached.ranked(*ranker).map(|(p, k)| (p, k.to_bits())).collect();
            let expected: Vec<(&ProductId, u64)> = page
                .iter()
                .map(|i| {
                    (
                        &i.product,
                        rankgate_core::ranker::ascending_key(i.score).to_bits(),
                    )
                })
                .collect();
            assert_eq!(ranked, expected, "{ranker}");
        }
        for item in popular {
            assert_eq!(cached.detail(&item.product), Some((item.metrics, item.carry)));
        }
        assert_eq!(cached.detail(&product("never-seen")), None);
        assert!(!popular.is_empty());
    }
}
