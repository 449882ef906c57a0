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

    /// Whether `category` is `all` or a category seen so far.
    #[must_use]
    pub fn knows_category(&self, category: &CategoryOrAll) -> bool {
        self.categories.lookup(category).is_some()
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

#[cfg(test)]
mod tests {
    use rankgate_core::ranker::{popular_score, ranking_order, Policy, PopularWeights};

    use super::super::test_support::{
        apply_in_batches, category, day, engine, engine_with, hour, in_category, product, queries_over,
        query, views, workload, workload_spans,
    };
    use super::*;

    fn popular_day0() -> RankingQuery {
        query(RankerName::Popular, CategoryOrAll::All, day(0))
    }

    #[test]
    fn a_page_follows_score_descending_then_product_id_bytes_ascending_with_offset_and_limit() {
        let weights = PopularWeights::default();
        let mut engine = engine_with(Policy { version: 7, weights }, 1_000_000);
        // Four products tie; their order is by id bytes ("B" < "a" < "ab" < "b"), not by anything else.
        let viewed = [("b", 5), ("z", 9), ("a", 5), ("Z9", 1), ("ab", 5), ("B", 5)];
        let deltas: Vec<_> = viewed
            .iter()
            .map(|(p, n)| (hour(2), product(p), views(*n)))
            .collect();
        engine.apply(&deltas, &[], Some(42));

        let full = engine.top(&popular_day0(), 0, usize::MAX);
        let order: Vec<&str> = full.items.iter().map(|i| i.product.as_str()).collect();
        assert_eq!(order, ["z", "B", "a", "ab", "b", "Z9"]);
        assert_eq!(
            full.items.iter().map(|i| i.rank).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6]
        );
        for item in &full.items {
            let n = viewed
                .iter()
                .find(|(p, _)| *p == item.product.as_str())
                .unwrap()
                .1;
            assert_eq!(item.score, popular_score(0.0, &views(n), &weights));
            assert_eq!(item.metrics, views(n));
        }
        assert_eq!(
            (full.total, full.policy_version, full.as_of_millis),
            (6, 7, Some(42))
        );

        for offset in 0..8 {
            for limit in 0..8 {
                let page = engine.top(&popular_day0(), offset, limit);
                let expected: Vec<RankedItem> = full.items.iter().skip(offset).take(limit).cloned().collect();
                assert_eq!(page.items, expected, "offset {offset} limit {limit}");
                assert_eq!(page.total, 6);
                assert_eq!(engine.top_cached(&popular_day0(), offset, limit), Some(page));
            }
        }
        let units = engine.top(&query(RankerName::Units, CategoryOrAll::All, day(0)), 0, 10);
        assert_eq!((units.total, units.policy_version), (0, 1), "views are no units");
    }

    #[test]
    fn every_ranking_is_in_ranking_order_and_its_pages_tile_it() {
        let events = workload(51, 900, 72);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        let mut listed = 0;
        for q in queries_over(&workload_spans()) {
            let full = engine.full_ranking(&q);
            for pair in full.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                assert_eq!(
                    ranking_order(
                        a.score,
                        a.product.as_str().as_bytes(),
                        b.score,
                        b.product.as_str().as_bytes()
                    ),
                    std::cmp::Ordering::Less,
                    "{q:?}"
                );
                assert_eq!(b.rank, a.rank + 1);
            }
            let tiled: Vec<RankedItem> = (0..full.len().div_ceil(7))
                .flat_map(|page| engine.top(&q, page * 7, 7).items)
                .collect();
            assert_eq!(tiled, full, "{q:?}");
            listed += full.len();
        }
        assert!(listed > 1_000, "{listed}");
    }

    #[test]
    fn a_rank_answer_agrees_with_the_page() {
        let events = workload(52, 900, 72);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        for q in queries_over(&workload_spans()) {
            let full = engine.full_ranking(&q);
            for item in &full {
                let answer = engine.rank(&q, &item.product);
                assert_eq!(answer.rank, Some(item.rank), "{q:?}");
                assert_eq!(answer.score.map(f64::to_bits), Some(item.score.to_bits()));
                assert_eq!(
                    (answer.metrics, answer.carry.to_bits()),
                    (item.metrics, item.carry.to_bits())
                );
                assert_eq!(answer.total, full.len());
                assert_eq!(engine.rank_cached(&q, &item.product), Some(answer));
            }
            let unknown = engine.rank(&q, &product("never-seen"));
            assert_eq!(
                (unknown.rank, unknown.score, unknown.metrics),
                (None, None, Metrics::default())
            );
            assert_eq!(unknown.total, full.len());
        }
        // Metrics are answered for a product its ranker does not list: views but no units.
        let mut engine = super::super::test_support::engine();
        engine.apply(&[(hour(1), product("p"), views(3))], &[], None);
        let answer = engine.rank(
            &query(RankerName::Units, CategoryOrAll::All, day(0)),
            &product("p"),
        );
        assert_eq!(
            (answer.rank, answer.score, answer.metrics, answer.total),
            (None, None, views(3), 0)
        );
    }

    #[test]
    fn rank_many_answers_each_product_in_the_order_asked() {
        let events = workload(53, 600, 48);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        let asked = ["p3", "never-seen", "p1", "p3", "p11"].map(product);
        for q in queries_over(&[day(0), day(1)]) {
            let one_by_one: Vec<RankAnswer> = asked.iter().map(|p| engine.rank(&q, p)).collect();
            assert!(one_by_one.iter().any(|a| a.rank.is_some()), "{q:?}");
            assert_eq!(engine.rank_many(&q, &asked), one_by_one);
            assert_eq!(engine.rank_many_cached(&q, &asked), Some(one_by_one));
        }
        engine.apply(&[(hour(1), product("p1"), views(1))], &[], None);
        assert_eq!(
            engine.rank_many_cached(&popular_day0(), &asked),
            None,
            "the span is dirty"
        );
    }

    #[test]
    fn a_category_never_seen_reads_as_empty_and_caches_nothing() {
        let events = workload(54, 200, 24);
        let mut engine = engine();
        apply_in_batches(&mut engine, &events, 100);
        let q = query(RankerName::Popular, in_category("never-seen"), day(0));
        let empty = TopPage {
            policy_version: 1,
            total: 0,
            items: Vec::new(),
            as_of_millis: engine.as_of_millis(),
        };
        assert_eq!(engine.top_cached(&q, 0, 10), Some(empty.clone()));
        assert_eq!(engine.top(&q, 0, 10), empty);
        let unlisted = engine.rank(&q, &product("p1"));
        assert_eq!(
            (unlisted.rank, unlisted.total, unlisted.metrics),
            (None, 0, Metrics::default())
        );
        assert_eq!(engine.rank_cached(&q, &product("p1")), Some(unlisted.clone()));
        assert_eq!(
            engine.rank_many(&q, &[product("p1"), product("p2")]),
            [unlisted.clone(), unlisted]
        );
        assert_eq!(engine.cached_span_count(), 0);
        assert!(engine.is_span_cached(&q.category, q.span), "nothing to build");
    }

    #[test]
    fn a_zero_score_reads_as_positive_zero() {
        let weights = PopularWeights {
            view: 0.0,
            like: 0.0,
            sales: 0.0,
            ..PopularWeights::default()
        };
        let mut engine = engine_with(Policy { version: 2, weights }, 1_000_000);
        engine.apply(&[(hour(1), product("p"), views(3))], &[], None);
        let page = engine.top(&popular_day0(), 0, 1);
        assert_eq!(page.items[0].score.to_bits(), 0.0_f64.to_bits());
        let answer = engine.rank(&popular_day0(), &product("p"));
        assert_eq!(answer.score.map(f64::to_bits), Some(0.0_f64.to_bits()));
    }

    #[test]
    fn carry_is_shown_under_popular_only() {
        let mut engine = engine();
        let p = product("p");
        let sale = Metrics {
            units: 1,
            sales: 500,
            ..Metrics::default()
        };
        engine.apply(
            &[(hour(2), p.clone(), sale), (hour(26), p.clone(), sale)],
            &[],
            None,
        );
        let popular = engine.top(&query(RankerName::Popular, CategoryOrAll::All, day(1)), 0, 1);
        assert!(popular.items[0].carry > 0.0);
        for ranker in [RankerName::Units, RankerName::Revenue, RankerName::Trending] {
            let q = query(ranker, CategoryOrAll::All, day(1));
            assert_eq!(engine.top(&q, 0, 1).items[0].carry, 0.0, "{ranker}");
            assert_eq!(engine.rank(&q, &p).carry, 0.0, "{ranker}");
        }
    }

    #[test]
    fn categories_are_listed_all_first_then_by_name_for_a_product_and_by_first_sight_overall() {
        let mut engine = engine();
        let p = product("p");
        engine.apply(
            &[(hour(1), p.clone(), views(1))],
            &[
                (p.clone(), category("b")),
                (p.clone(), category("a")),
                (p.clone(), category("B")),
            ],
            None,
        );
        engine.apply(&[], &[(product("q"), category("c"))], None);
        assert_eq!(
            engine.product_categories(&p),
            [
                CategoryOrAll::All,
                in_category("B"),
                in_category("a"),
                in_category("b")
            ]
        );
        assert_eq!(
            engine.product_categories(&product("never-seen")),
            [CategoryOrAll::All]
        );
        assert_eq!(
            engine.categories(),
            [
                CategoryOrAll::All,
                in_category("b"),
                in_category("a"),
                in_category("B"),
                in_category("c")
            ]
        );
    }
}
