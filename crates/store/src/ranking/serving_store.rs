//! The read every serving store answers: a page of a ranking and the rank of one product.
//!
//! Two stores answer ranking reads: the in-process [`RankingEngine`] (every span, computed on first read,
//! cached after) and Redis ([`RedisServing`], the hot spans one publisher wrote, read at the generation the
//! active pointer names). [`ServingStore`] is what both give, in one shape — [`TopPage`] and [`RankAnswer`],
//! each carrying the total, `asOf` and policy version *of the data it was read from* — so the server's
//! reader decides routing, fallback, staleness and caching once, whichever store answered. One
//! conformance suite (`crates/store/tests/serving_store.rs`) holds both to the same answers.
//!
//! What a store may decline: `Ok(None)` means "this store does not serve that ranking" (Redis: the span is
//! not published in that generation). A Top-N-only store ([`ServingStore::depth`] is `Some(K)`) answers
//! pages truncated at rank K with the full `total`, and the rank of a product past K as unlisted
//! (`rank: None`) with the full `total`; deciding to ask the engine instead is the caller's business.

use std::future::Future;
use std::sync::Arc;

use parking_lot::RwLock;

use rankgate_core::ids::ProductId;
use rankgate_core::metrics::Metrics;

use super::engine::{RankAnswer, RankingEngine, RankingQuery, TopPage};
use super::redis_serving::{Active, RedisServing, ServingError};

/// A store that answers ranking reads. See the module docs for what `None` and the depth mean.
pub trait ServingStore: Send + Sync {
    /// Why a read could not be answered.
    type Error: std::error::Error + Send + Sync + 'static;

    /// How deep this store holds each ranking: `None` when it holds every listed product, `Some(K)` in
    /// Top-N-only serving.
    fn depth(&self) -> Option<usize>;

    /// Items `offset + 1 ..= offset + limit` of a ranking (fewer past the end or past [`Self::depth`]),
    /// with the ranking's full total; `None` when this store does not serve the ranking.
    fn top_page(
        &self,
        query: &RankingQuery,
        offset: usize,
        limit: usize,
    ) -> impl Future<Output = Result<Option<TopPage>, Self::Error>> + Send;

    /// `product`'s place in a ranking (`rank: None` when unlisted, or past [`Self::depth`]); `None` when
    /// this store does not serve the ranking.
    fn rank_of(
        &self,
        query: &RankingQuery,
        product: &ProductId,
    ) -> impl Future<Output = Result<Option<RankAnswer>, Self::Error>> + Send;

    /// `products` (distinct, at least one) in the ranking's order, read at once (one engine lock hold, one Redis round
    /// trip), as [`SortedProducts`] orders them; a product past [`Self::depth`] is unranked like an
    /// unlisted one. `None` when this store does not serve the ranking.
    fn sort_products(
        &self,
        query: &RankingQuery,
        products: &[ProductId],
    ) -> impl Future<Output = Result<Option<SortedProducts>, Self::Error>> + Send;
}

/// Products of one ranking in its order (`POST /v1/rankings/sort`): ranked ones by rank, then the
/// unranked ones in the order they were asked for. Ranks are distinct (ties are broken by product id),
/// so the order is total and the same whichever store answered.
#[derive(Debug, Clone, PartialEq)]
pub struct SortedProducts {
    /// Policy version the scores come from.
    pub policy_version: u32,
    /// Number of listed products in the whole ranking.
    pub total: usize,
    /// Time of the latest ingest the data includes.
    pub as_of_millis: Option<i64>,
    /// The products, in ranking order, unranked last.
    pub items: Vec<SortedItem>,
}

/// One product of a [`SortedProducts`].
#[derive(Debug, Clone, PartialEq)]
pub struct SortedItem {
    /// The product.
    pub product: ProductId,
    /// 1-based rank; `None` when unlisted (or past a Top-N depth).
    pub rank: Option<usize>,
    /// Score when ranked.
    pub score: Option<f64>,
    /// Metrics over the span (zero when unknown).
    pub metrics: Metrics,
}

impl SortedProducts {
    /// Orders `places`, one per product of `products` in the same order, into ranking order; the
    /// version, total and `asOf` are the ones the store read with them.
    pub fn in_ranking_order(
        products: &[ProductId],
        places: impl IntoIterator<Item = (Option<usize>, Option<f64>, Metrics)>,
        policy_version: u32,
        total: usize,
        as_of_millis: Option<i64>,
    ) -> SortedProducts {
        let mut items: Vec<SortedItem> = products
            .iter()
            .zip(places)
            .map(|(product, (rank, score, metrics))| SortedItem {
                product: product.clone(),
                rank,
                score,
                metrics,
            })
            .collect();
        // Stable: unranked items keep the order they were asked in.
        items.sort_by_key(|item| item.rank.unwrap_or(usize::MAX));
        SortedProducts {
            policy_version,
            total,
            as_of_millis,
            items,
        }
    }

    /// From the engine's answers, one per product of `products` (at least one: the version, total and
    /// `asOf` are the same in each).
    fn of_engine_answers(products: &[ProductId], answers: Vec<RankAnswer>) -> SortedProducts {
        let head = answers.first().expect("sort asks for at least one product");
        let (policy_version, total, as_of_millis) = (head.policy_version, head.total, head.as_of_millis);
        SortedProducts::in_ranking_order(
            products,
            answers.into_iter().map(|a| (a.rank, a.score, a.metrics)),
            policy_version,
            total,
            as_of_millis,
        )
    }
}

/// How much work an engine read may do where it is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineRead {
    /// Only a span that is cached and clean, under the shared lock: cheap enough for an async worker.
    CachedOnly,
    /// Whatever it takes (flush a dirty span, build a cold one in short lock holds): blocking.
    BuildIfNeeded,
}

/// The in-process engine as a [`ServingStore`]: every ranking, always served.
#[derive(Clone)]
pub struct EngineServing {
    engine: Arc<RwLock<RankingEngine>>,
}

/// An engine read did not finish (its blocking task panicked or the runtime is shutting down).
#[derive(Debug, thiserror::Error)]
#[error(
    "computing a ranking in the engine did not finish ({0}); the server log has the cause, retry the read"
)]
pub struct EngineReadError(String);

impl EngineServing {
    /// Reads through `engine`.
    pub fn new(engine: Arc<RwLock<RankingEngine>>) -> EngineServing {
        EngineServing { engine }
    }

    /// The engine behind this store.
    pub fn engine(&self) -> &Arc<RwLock<RankingEngine>> {
        &self.engine
    }

    /// A page as `read` allows: `None` only for [`EngineRead::CachedOnly`] when the span needs a flush or a
    /// build. A cold span is built in short lock holds ([`RankingEngine::build_span_in_steps`]) so ingest
    /// goes on meanwhile.
    pub fn top_with(
        &self,
        query: &RankingQuery,
        offset: usize,
        limit: usize,
        read: EngineRead,
    ) -> Option<TopPage> {
        if let Some(page) = self.engine.read().top_cached(query, offset, limit) {
            return Some(page);
        }
        match read {
            EngineRead::CachedOnly => None,
            EngineRead::BuildIfNeeded => {
                RankingEngine::build_span_in_steps(&self.engine, query);
                Some(self.engine.write().top(query, offset, limit))
            }
        }
    }

    /// A product's rank as `read` allows; see [`EngineServing::top_with`].
    pub fn rank_with(
        &self,
        query: &RankingQuery,
        product: &ProductId,
        read: EngineRead,
    ) -> Option<RankAnswer> {
        if let Some(answer) = self.engine.read().rank_cached(query, product) {
            return Some(answer);
        }
        match read {
            EngineRead::CachedOnly => None,
            EngineRead::BuildIfNeeded => {
                RankingEngine::build_span_in_steps(&self.engine, query);
                Some(self.engine.write().rank(query, product))
            }
        }
    }

    /// `products` in the ranking's order as `read` allows; see [`EngineServing::top_with`]. One lock hold
    /// answers all of them.
    pub fn sort_with(
        &self,
        query: &RankingQuery,
        products: &[ProductId],
        read: EngineRead,
    ) -> Option<SortedProducts> {
        // Bound first: a guard in the match scrutinee would live through the arms, and the build below
        // takes the write lock.
        let cached = self.engine.read().rank_many_cached(query, products);
        let answers = match cached {
            Some(answers) => answers,
            None => match read {
                EngineRead::CachedOnly => return None,
                EngineRead::BuildIfNeeded => {
                    RankingEngine::build_span_in_steps(&self.engine, query);
                    self.engine.write().rank_many(query, products)
                }
            },
        };
        Some(SortedProducts::of_engine_answers(products, answers))
    }

    /// Runs `compute` inline when the span is warm (a hand-off to the blocking pool would cost more than
    /// the lookup), else on the blocking pool, so a cold build never holds up an async worker.
    async fn answer<T: Send + 'static>(
        &self,
        compute: impl Fn(&EngineServing, EngineRead) -> Option<T> + Send + 'static,
    ) -> Result<T, EngineReadError> {
        if let Some(answer) = compute(self, EngineRead::CachedOnly) {
            return Ok(answer);
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            compute(&this, EngineRead::BuildIfNeeded).expect("a read allowed to build answers")
        })
        .await
        .map_err(|error| EngineReadError(error.to_string()))
    }
}

impl ServingStore for EngineServing {
    type Error = EngineReadError;

    fn depth(&self) -> Option<usize> {
        None
    }

    async fn top_page(
        &self,
        query: &RankingQuery,
        offset: usize,
        limit: usize,
    ) -> Result<Option<TopPage>, EngineReadError> {
        let query = query.clone();
        self.answer(move |engine, read| engine.top_with(&query, offset, limit, read))
            .await
            .map(Some)
    }

    async fn rank_of(
        &self,
        query: &RankingQuery,
        product: &ProductId,
    ) -> Result<Option<RankAnswer>, EngineReadError> {
        // The warm path without the clones the blocking hand-off needs: this is the hot rank lookup.
        if let Some(answer) = self.rank_with(query, product, EngineRead::CachedOnly) {
            return Ok(Some(answer));
        }
        let (query, product) = (query.clone(), product.clone());
        self.answer(move |engine, read| engine.rank_with(&query, &product, read))
            .await
            .map(Some)
    }

    async fn sort_products(
        &self,
        query: &RankingQuery,
        products: &[ProductId],
    ) -> Result<Option<SortedProducts>, EngineReadError> {
        if let Some(sorted) = self.sort_with(query, products, EngineRead::CachedOnly) {
            return Ok(Some(sorted));
        }
        let (query, products) = (query.clone(), products.to_vec());
        self.answer(move |engine, read| engine.sort_with(&query, &products, read))
            .await
            .map(Some)
    }
}

/// Redis serving read at one generation (the one `active` names), as a [`ServingStore`]: answers carry the
/// pointer's `asOf`, its policy version and its depth, so nothing in them comes from another version.
pub struct ServedGeneration<'a> {
    store: &'a RedisServing,
    active: &'a Active,
}

impl RedisServing {
    /// This store read at the generation `active` names.
    pub fn at<'a>(&'a self, active: &'a Active) -> ServedGeneration<'a> {
        ServedGeneration { store: self, active }
    }
}

impl ServingStore for ServedGeneration<'_> {
    type Error = ServingError;

    fn depth(&self) -> Option<usize> {
        self.active.depth
    }

    async fn top_page(
        &self,
        query: &RankingQuery,
        offset: usize,
        limit: usize,
    ) -> Result<Option<TopPage>, ServingError> {
        let Some(policy_version) = self.active.policy_version(query.ranker) else {
            return Ok(None);
        };
        let served = self
            .store
            .top(
                self.active.generation,
                query.ranker,
                &query.category,
                &query.span,
                offset,
                limit,
            )
            .await?;
        Ok(served.map(|served| TopPage {
            policy_version,
            total: served.total,
            items: served.items,
            as_of_millis: self.active.as_of_millis,
        }))
    }

    async fn rank_of(
        &self,
        query: &RankingQuery,
        product: &ProductId,
    ) -> Result<Option<RankAnswer>, ServingError> {
        let Some(policy_version) = self.active.policy_version(query.ranker) else {
            return Ok(None);
        };
        let served = self
            .store
            .rank(
                self.active.generation,
                query.ranker,
                &query.category,
                &query.span,
                product,
            )
            .await?;
        Ok(served.map(|served| RankAnswer {
            policy_version,
            rank: served.rank,
            score: served.score,
            metrics: served.metrics,
            carry: served.carry,
            total: served.total,
            as_of_millis: self.active.as_of_millis,
        }))
    }

    async fn sort_products(
        &self,
        query: &RankingQuery,
        products: &[ProductId],
    ) -> Result<Option<SortedProducts>, ServingError> {
        let Some(policy_version) = self.active.policy_version(query.ranker) else {
            return Ok(None);
        };
        let served = self
            .store
            .sort(
                self.active.generation,
                query.ranker,
                &query.category,
                &query.span,
                products,
            )
            .await?;
        Ok(served.map(|served| {
            SortedProducts::in_ranking_order(
                products,
                served.places,
                policy_version,
                served.total,
                self.active.as_of_millis,
            )
        }))
    }
}
