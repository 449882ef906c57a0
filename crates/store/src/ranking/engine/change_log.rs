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
