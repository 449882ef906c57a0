//! Reads: a page of a ranking, one product's rank, the ranks of several products, and the category
//! lists. Each comes in two forms: `*_cached` answers under a shared lock from a cached, clean span (the
//! common case, so reads run in parallel), and the plain form takes the write lock's `&mut self` to build
//! or flush the span first.
//!
//! The sorted sets hold [`ascending_key`](rankgate_core::ranker::ascending_key)s, the negated scores, so
//! walking a set in its own order (key, then member bytes) is the ranking order (score descending, then
//! product id ascending), and a rank is a sorted-set rank plus one.

use std::sync::atomic::Ordering as AtomicOrdering;

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::ranker::RankerName;

use super::span_cache::SpanState;
use super::{RankAnswer, RankedItem, RankingEngine, RankingQuery, TopPage};

impl RankingEngine {
    /// The page at `offset` of `state`'s ranking under `ranker`: walks the sorted set from that rank.
    fn page(&self, state: &SpanState, ranker: RankerName, offset: usize, limit: usize) -> TopPage {
        let ranking = &state.rankings[ranker.index()];
        let items = ranking
            .iter_from_rank(offset)
            .take(limit)
            .enumerate()
            .map(|(i, (member, key))| self.item(state, ranker, offset + i + 1, member, key))
            .collect();
        TopPage {
            policy_version: self.policy_version(ranker),
            total: ranking.len(),
            items,
            as_of_millis: self.as_of_millis,
        }
    }

    /// One listed product as an answer: the score is the negated key (`+ 0.0` turns a `-0.0` back into
    /// `0.0`), and carry is shown for `popular` only, the one ranker it counts in.
    fn item(
        &self,
        state: &SpanState,
        ranker: RankerName,
        rank: usize,
        member: &[u8],
        key: f64,
    ) -> RankedItem {
        let member = std::str::from_utf8(member).expect("members are product ids");
        let idx = self.products.index[member];
        RankedItem {
            rank,
            product: self.products.ids[idx as usize].clone(),
            score: -key + 0.0,
            metrics: state.metrics.get(&idx).copied().unwrap_or_default(),
            carry: if ranker == RankerName::Popular {
                state.carry.get(&idx).copied().unwrap_or(0.0)
            } else {
                0.0
            },
        }
    }

    /// The policy version reads of `ranker` are served from.
    pub fn policy_version(&self, ranker: RankerName) -> u32 {
        match ranker {
            RankerName::Popular => self.policy.version,
            RankerName::Trending => self.trending_policy.version,
            RankerName::Units | RankerName::Revenue => 1,
        }
    }

    /// The page of a category the engine has never seen: nothing is listed there.
    fn empty_page(&self, ranker: RankerName) -> TopPage {
        TopPage {
            policy_version: self.policy_version(ranker),
            total: 0,
            items: Vec::new(),
            as_of_millis: self.as_of_millis,
        }
    }

    /// A page of a ranking if it can be answered under a shared lock (span cached and clean).
    pub fn top_cached(&self, query: &RankingQuery, offset: usize, limit: usize) -> Option<TopPage> {
        let Some(key) = self.span_key(query) else {
            return Some(self.empty_page(query.ranker));
        };
        let state = self.spans.get(&key).filter(|state| state.is_clean())?;
        state.last_used.store(
            self.lru_clock.fetch_add(1, AtomicOrdering::Relaxed),
            AtomicOrdering::Relaxed,
        );
        Some(self.page(state, query.ranker, offset, limit))
    }

    /// A page of a ranking, building or flushing its span first when needed.
    pub fn top(&mut self, query: &RankingQuery, offset: usize, limit: usize) -> TopPage {
        let Some(key) = self.span_key(query) else {
            return self.empty_page(query.ranker);
        };
        self.ensure_span(key);
        self.page(&self.spans[&key], query.ranker, offset, limit)
    }

    /// `product`'s place in `state`'s ranking under `ranker`; metrics are given even when it is unlisted.
    fn rank_in(&self, state: &SpanState, ranker: RankerName, product: &ProductId) -> RankAnswer {
        let ranking = &state.rankings[ranker.index()];
        let member = product.as_str().as_bytes();
        let idx = self.products.index.get(product.as_str()).copied();
        let metrics = idx
            .and_then(|p| state.metrics.get(&p))
            .copied()
            .unwrap_or_default();
        let carry = match (ranker, idx) {
            (RankerName::Popular, Some(p)) => state.carry.get(&p).copied().unwrap_or(0.0),
            _ => 0.0,
        };
        RankAnswer {
            policy_version: self.policy_version(ranker),
            rank: ranking.zrank(member).map(|r| r + 1),
            score: ranking.zscore(member).map(|key| -key + 0.0),
            metrics,
            carry,
            total: ranking.len(),
            as_of_millis: self.as_of_millis,
        }
    }

    /// The answer for a product in a category the engine has never seen.
    fn unlisted(&self, ranker: RankerName) -> RankAnswer {
        RankAnswer {
            policy_version: self.policy_version(ranker),
            rank: None,
            score: None,
            metrics: Metrics::default(),
            carry: 0.0,
            total: 0,
            as_of_millis: self.as_of_millis,
        }
    }

    /// A product's rank if it can be answered under a shared lock.
    pub fn rank_cached(&self, query: &RankingQuery, product: &ProductId) -> Option<RankAnswer> {
        let Some(key) = self.span_key(query) else {
            return Some(self.unlisted(query.ranker));
        };
        let state = self.spans.get(&key).filter(|state| state.is_clean())?;
        Some(self.rank_in(state, query.ranker, product))
    }

    /// A product's rank, building or flushing the span first when needed.
    pub fn rank(&mut self, query: &RankingQuery, product: &ProductId) -> RankAnswer {
        let Some(key) = self.span_key(query) else {
            return self.unlisted(query.ranker);
        };
        self.ensure_span(key);
        self.rank_in(&self.spans[&key], query.ranker, product)
    }

    /// The places of several products in one ranking, in the order asked, if they can be answered under
    /// a shared lock: one lock hold and one O(log n) lookup per product (`POST /v1/rankings/sort`).
    pub fn rank_many_cached(&self, query: &RankingQuery, products: &[ProductId]) -> Option<Vec<RankAnswer>> {
        let Some(key) = self.span_key(query) else {
            return Some(products.iter().map(|_| self.unlisted(query.ranker)).collect());
        };
        let state = self.spans.get(&key).filter(|state| state.is_clean())?;
        Some(
            products
                .iter()
                .map(|p| self.rank_in(state, query.ranker, p))
                .collect(),
        )
    }

    /// [`RankingEngine::rank_many_cached`], building or flushing the span first when needed.
    pub fn rank_many(&mut self, query: &RankingQuery, products: &[ProductId]) -> Vec<RankAnswer> {
        let Some(key) = self.span_key(query) else {
            return products.iter().map(|_| self.unlisted(query.ranker)).collect();
        };
        self.ensure_span(key);
        let state = &self.spans[&key];
        products
            .iter()
            .map(|p| self.rank_in(state, query.ranker, p))
            .collect()
    }

    /// The rankings a product can be listed in: `all`, then each of its categories (the union of every
    /// category seen on its events) by name, bytes ascending. Just `all` for a product never seen.
    pub fn product_categories(&self, product: &ProductId) -> Vec<CategoryOrAll> {
        let mut categories: Vec<CategoryOrAll> = self
            .products
            .index
            .get(product.as_str())
            .map(|&idx| {
                self.products.categories[idx as usize]
                    .iter()
                    .filter_map(|&c| self.categories.names[c as usize].clone())
                    .map(CategoryOrAll::Category)
                    .collect()
            })
            .unwrap_or_default();
        categories.sort_by(|a, b| a.as_str().as_bytes().cmp(b.as_str().as_bytes()));
        categories.insert(0, CategoryOrAll::All);
        categories
    }

    /// Every listed product of a ranking, in order: (product, score, metrics, carry). For verification.
    pub fn full_ranking(&mut self, query: &RankingQuery) -> Vec<RankedItem> {
        self.top(query, 0, usize::MAX).items
    }

    /// `all` and every category seen so far.
    pub fn categories(&self) -> Vec<CategoryOrAll> {
        std::iter::once(CategoryOrAll::All)
            .chain(
                self.categories
                    .names
                    .iter()
                    .flatten()
                    .map(|c| CategoryOrAll::Category(c.clone())),
            )
            .collect()
    }
}
