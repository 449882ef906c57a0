//! The one owner of a ranking read (`GET …/top`, `GET …/rank`, `GET …/ranks`, `POST /v1/rankings/sort`):
//! everything between a parsed request and the bytes of its answer is decided here, once.
//!
//! ```text
//! TopRequest / RankRequest / RanksRequest / SortRequest
//!   → route: a hot span while Redis's pointer is healthy and current → Redis (at the pointer's
//!            generation); a hot span while Redis is unreachable, pointerless or lagging → engine, stale;
//!            any other span → engine, fresh
//!   → response cache (keyed by source + resolved request, valid under the stamps the answer was made at)
//!   → ServingStore read: Redis declines (not published there, past the Top-N depth K) → engine, fresh;
//!                        Redis fails → engine, stale, and Redis is marked unreachable until the next poll
//!   → typed response (camelCase, `asOf`, `stale`, `policyVersion`, `percentile`, `periodStart` /
//!     `periodEnd`) serialized once, with its entity tag ([`Served`])
//! ```
//!
//! **Versions never mix.** An answer's `total`, `asOf` and `policyVersion` all come from the store that
//! answered, as [`ServingStore`] returns them: the engine's policy for engine answers, the pointer's
//! `popular` version for Redis answers. A sort or a `ranks` answer that Redis cannot give whole (a product
//! past the depth K, a category not published) is the engine's whole, never a mix.
//!
//! **Warm reads stay on the async worker.** The engine store answers a warm, clean span inline and moves
//! anything that needs a flush or a build to the blocking pool ([`EngineRead`]).
//!
//! **What is cached.** Top pages and `ranks` answers always (serializing 20–50 items costs more than a
//! lookup). Rank answers only when they came from Redis (a round trip saved) or from the blocking pool: a
//! rank read of a warm span costs less to compute than to cache, and random-product rank reads would fill
//! the cache with entries that are seldom asked again. Sorts never (a POST; product lists vary). The entity
//! tag is made with the body and cached beside it ([`crate::http::entity_tag`]); the span's echo (`at`, the
//! bounds) is formatted once per span ([`EchoMemo`]), not per read.
//!
//! **Numbers.** `percentile` is [`rankgate_core::read::percentile`]: rank / total in percent, rounded up to
//! hundredths. `periodEnd` is the span's exclusive end.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;
use serde::Serialize;

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{format_hour_key, Hour, Span, Zone};
use rankgate_core::ranker::RankerName;
use rankgate_core::read::percentile;
use rankgate_store::clock::Clock;
use rankgate_store::ranking::engine::{RankAnswer, RankedItem, RankingQuery, TopPage};
use rankgate_store::ranking::redis_serving::{is_hot, Active, ServingError, PUBLISHED_RANKERS};
use rankgate_store::ranking::serving_store::{
    EngineRead, EngineReadError, EngineServing, ServingStore, SortedProducts,
};

use super::serving::{Serving, ServingState};
use super::RankingService;
use crate::http::entity_tag::EntityTag;
use crate::http::json_writer::JsonWriter;

/// `GET /v1/categories/{category}/top`, parsed.
#[derive(Debug, Clone)]
pub struct TopRequest {
    /// Ranker, category and span.
    pub query: RankingQuery,
    /// Items skipped.
    pub offset: usize,
    /// Items asked for.
    pub limit: usize,
}

/// `GET /v1/products/{productId}/rank`, parsed.
#[derive(Debug, Clone)]
pub struct RankRequest {
    /// Ranker, category and span.
    pub query: RankingQuery,
    /// The product asked about.
    pub product: ProductId,
}

/// `POST /v1/rankings/sort`, parsed: distinct products, at least one, at most [`MAX_SORT_PRODUCTS`].
#[derive(Debug, Clone)]
pub struct SortRequest {
    /// Ranker, category and span.
    pub query: RankingQuery,
    /// The products to order.
    pub products: Vec<ProductId>,
}

/// Most products one sort request may name (SPEC 1.5).
pub const MAX_SORT_PRODUCTS: usize = 1_000;

/// `GET /v1/products/{productId}/ranks`, parsed.
#[derive(Debug, Clone)]
pub struct RanksRequest {
    /// Which scoring policy.
    pub ranker: RankerName,
    /// Calendar period or sliding window.
    pub span: Span,
    /// The product asked about.
    pub product: ProductId,
}

impl RanksRequest {
    /// One ranking query per category.
    fn queries(&self, categories: Vec<CategoryOrAll>) -> Vec<RankingQuery> {
        categories
            .into_iter()
            .map(|category| RankingQuery {
                ranker: self.ranker,
                category,
                span: self.span,
            })
            .collect()
    }
}

/// A read's answer as HTTP serves it: the JSON body and its entity tag, made together (and cached
/// together), so the tag is computed once per body, never per request that reuses it.
#[derive(Debug, Clone)]
pub struct Served {
    /// The JSON body.
    pub body: Bytes,
    /// Its entity tag ([`EntityTag::of_body`]).
    pub etag: EntityTag,
    /// The same tag as a header value, made once: a cached answer's `ETag` header then costs a
    /// reference count per request, not an allocation.
    pub etag_header: axum::http::HeaderValue,
}

impl Served {
    fn of(body: Bytes) -> Served {
        let etag = EntityTag::of_body(&body);
        Served {
            etag_header: axum::http::HeaderValue::from_str(etag.as_str()).expect("quotes and hex digits"),
            etag,
            body,
        }
    }

    /// What it costs the response cache.
    fn weight(&self) -> usize {
        self.body.len() + std::mem::size_of::<EntityTag>()
    }
}

/// A read that could not be answered at all (Redis failing is not one: the engine answers, stale).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The engine's computation did not finish.
    #[error(transparent)]
    Engine(#[from] EngineReadError),
}

/// Whether an answer is what the configured serving store holds now, or a stand-in for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Freshness {
    /// From the store that serves this span (`stale: false`).
    Fresh,
    /// From the engine in place of a Redis that cannot answer (`stale: true`, with the engine's `asOf`).
    Stale,
}

/// Where a read is answered.
#[derive(Debug, Clone, PartialEq)]
enum Route {
    /// The in-process engine.
    Engine(Freshness),
    /// Redis, at this pointer; `stamp` changes whenever the served data may have.
    Redis { active: Active, stamp: u64 },
}

/// Why Redis did not answer a read routed to it.
#[derive(Debug)]
enum RedisDeclined {
    /// The pointer's generation does not hold this ranking (a span not yet published).
    NotServed,
    /// Top-N-only serving: the page or the product lies past the depth K.
    PastDepth,
    /// Redis could not be read.
    Failed(ServingError),
}

/// The reader. One per process, shared by every handler.
pub struct RankingsReader {
    rankings: Arc<RankingService>,
    engine: EngineServing,
    clock: Arc<dyn Clock>,
    zone: Zone,
    /// How far Redis's data may trail this instance's newest ingest before reads stop trusting it:
    /// twice the freshness bound, which a normal publication round never trails by.
    responses: ResponseCache,
    /// Formatted `at` of recently read spans and the latest formatted `asOf`: formatting them (zone
    /// arithmetic, RFC 3339) took about 7% of a warm rank read's instructions, and both change rarely.
    echoes: EchoMemo,
}

impl RankingsReader {
    /// A reader over `rankings` (its engine, its Redis serving if attached, its catalogue).
    pub fn new(rankings: Arc<RankingService>, clock: Arc<dyn Clock>, zone: Zone) -> Self {
        RankingsReader {
            engine: EngineServing::new(rankings.engine().clone()),
            rankings,
            clock,
            zone,
            responses: ResponseCache::default(),
            echoes: EchoMemo::default(),
        }
    }

    /// The JSON body of a top page.
    pub async fn top(&self, request: &TopRequest) -> Result<Bytes, ReadError> {
        Ok(self.top_served(request).await?.body)
    }

    /// A top page as HTTP serves it: the JSON body and its entity tag.
    pub async fn top_served(&self, request: &TopRequest) -> Result<Served, ReadError> {
        let freshness = match self.route(request.query.ranker, &request.query.category, &request.query.span) {
            Route::Redis { active, stamp } => match self.top_from_redis(request, &active, stamp).await {
                Ok(served) => return Ok(served),
                Err(declined) => self.freshness_after(declined),
            },
            Route::Engine(freshness) => freshness,
        };
        let key = ResponseKey::top(Source::engine(freshness), request);
        let stamps = self.engine_stamps();
        if let Some(served) = self.responses.get(&key, stamps) {
            return Ok(served);
        }
        let page = self
            .engine
            .top_page(&request.query, request.offset, request.limit)
            .await?
            .expect("the engine serves every ranking");
        let served = Served::of(self.top_body(request, page, freshness));
        self.responses.insert(key, stamps, served.clone());
        Ok(served)
    }

    /// The JSON body of a product's rank.
    pub async fn rank(&self, request: &RankRequest) -> Result<Bytes, ReadError> {
        Ok(self.rank_served(request).await?.body)
    }

    /// A product's rank as HTTP serves it: the JSON body and its entity tag.
    pub async fn rank_served(&self, request: &RankRequest) -> Result<Served, ReadError> {
        let freshness = match self.route(request.query.ranker, &request.query.category, &request.query.span) {
            Route::Redis { active, stamp } => match self.rank_from_redis(request, &active, stamp).await {
                Ok(served) => return Ok(served),
                Err(declined) => self.freshness_after(declined),
            },
            Route::Engine(freshness) => freshness,
        };
        // A warm span answers faster than the cache could: no key, no lookup, no insert.
        if let Some(answer) = self
            .engine
            .rank_with(&request.query, &request.product, EngineRead::CachedOnly)
        {
            return Ok(Served::of(self.rank_body(request, answer, freshness)));
        }
        let key = ResponseKey::rank(Source::engine(freshness), request);
        let stamps = self.engine_stamps();
        if let Some(served) = self.responses.get(&key, stamps) {
            return Ok(served);
        }
        let answer = self
            .engine
            .rank_of(&request.query, &request.product)
            .await?
            .expect("the engine serves every ranking");
        let served = Served::of(self.rank_body(request, answer, freshness));
        self.responses.insert(key, stamps, served.clone());
        Ok(served)
    }

    /// The JSON body of `POST /v1/rankings/sort`: the products in the ranking's order, unranked last in
    /// the order asked. Routed like any read; Redis answers in one script call, and when it holds only
    /// the top K and some product is not among them, the engine answers the whole request (as a rank
    /// read past K does), so one answer never mixes stores or versions. Not cached: product lists vary.
    pub async fn sort(&self, request: &SortRequest) -> Result<Bytes, ReadError> {
        let freshness = match self.route(request.query.ranker, &request.query.category, &request.query.span) {
            Route::Redis { active, .. } => match self.sort_from_redis(request, &active).await {
                Ok(sorted) => return Ok(self.sort_body(request, sorted, Freshness::Fresh)),
                Err(declined) => self.freshness_after(declined),
            },
            Route::Engine(freshness) => freshness,
        };
        let sorted = self
            .engine
            .sort_products(&request.query, &request.products)
            .await?
            .expect("the engine serves every ranking");
        Ok(self.sort_body(request, sorted, freshness))
    }

    /// `GET /v1/products/{id}/ranks` as HTTP serves it: the product's place in `all` and in each of its
    /// categories for one span, every place from one store (Redis for a hot span unless it declines any
    /// of them, then the engine for all), cached like a top page.
    pub async fn ranks_served(&self, request: &RanksRequest) -> Result<Served, ReadError> {
        let freshness = match self.route(request.ranker, &CategoryOrAll::All, &request.span) {
            Route::Redis { active, stamp } => match self.ranks_from_redis(request, &active, stamp).await {
                Ok(served) => return Ok(served),
                Err(declined) => self.freshness_after(declined),
            },
            Route::Engine(freshness) => freshness,
        };
        let key = ResponseKey::ranks(Source::engine(freshness), request);
        // Stamps before the categories: a category learnt after them is in a newer answer.
        let stamps = self.engine_stamps();
        if let Some(served) = self.responses.get(&key, stamps) {
            return Ok(served);
        }
        let categories = self.rankings.engine().read().product_categories(&request.product);
        let mut answers = Vec::with_capacity(categories.len());
        for query in request.queries(categories) {
            let answer = self
                .engine
                .rank_of(&query, &request.product)
                .await?
                .expect("the engine serves every ranking");
            answers.push((query.category, answer));
        }
        let served = Served::of(self.ranks_body(request, &answers, freshness));
        self.responses.insert(key, stamps, served.clone());
        Ok(served)
    }

    /// Where a read of `span` goes. Spans (and rankers: `trending`, see [`PUBLISHED_RANKERS`]) Redis does
    /// not hold are the engine's to answer, fresh, whatever Redis's state; hot spans go to Redis while its
    /// pointer exists, was reachable at the last poll and is not older than this instance's newest ingest
    /// by more than the lag bound (its publisher died and the lease has not moved yet, or a rebuild is
    /// under way).
    ///
    /// A hot read also tells the publisher that `category` over `span` is read (the serving module's
    /// demand), so Redis holds it from the next tick on.
    fn route(&self, ranker: RankerName, category: &CategoryOrAll, span: &Span) -> Route {
        let Some(serving) = self.rankings.serving() else {
            return Route::Engine(Freshness::Fresh);
        };
        if !PUBLISHED_RANKERS.contains(&ranker)
            || !is_hot(span, Hour::from_millis(self.clock.now_millis()), &self.zone)
        {
            return Route::Engine(Freshness::Fresh);
        }
        serving.note_read(category, span, || {
            self.rankings.engine().read().knows_category(category)
        });
        match serving.state(category, span, || self.rankings.engine().read().as_of_millis()) {
            ServingState::Current { active, stamp } => Route::Redis { active, stamp },
            ServingState::Stale(_) => Route::Engine(Freshness::Stale),
        }
    }

    /// How the engine's answer is marked after Redis declined: fresh when Redis does not hold the answer
    /// by design, stale when it failed (and then Redis is avoided until the next successful poll).
    fn freshness_after(&self, declined: RedisDeclined) -> Freshness {
        match declined {
            RedisDeclined::NotServed | RedisDeclined::PastDepth => Freshness::Fresh,
            RedisDeclined::Failed(error) => {
                if let Some(serving) = self.rankings.serving() {
                    serving.note_unreachable(&error);
                }
                Freshness::Stale
            }
        }
    }

    async fn top_from_redis(
        &self,
        request: &TopRequest,
        active: &Active,
        stamp: u64,
    ) -> Result<Served, RedisDeclined> {
        if active
            .depth
            .is_some_and(|depth| request.offset.saturating_add(request.limit) > depth)
        {
            return Err(RedisDeclined::PastDepth);
        }
        let key = ResponseKey::top(Source::Redis, request);
        let stamps = (stamp, self.rankings.catalog_generation());
        if let Some(served) = self.responses.get(&key, stamps) {
            return Ok(served);
        }
        let serving = self.serving();
        let page = serving
            .store()
            .at(active)
            .top_page(&request.query, request.offset, request.limit)
            .await
            .map_err(RedisDeclined::Failed)?
            .ok_or(RedisDeclined::NotServed)?;
        let served = Served::of(self.top_body(request, page, Freshness::Fresh));
        self.responses.insert(key, stamps, served.clone());
        Ok(served)
    }

    async fn rank_from_redis(
        &self,
        request: &RankRequest,
        active: &Active,
        stamp: u64,
    ) -> Result<Served, RedisDeclined> {
        let key = ResponseKey::rank(Source::Redis, request);
        let stamps = (stamp, self.rankings.catalog_generation());
        if let Some(served) = self.responses.get(&key, stamps) {
            return Ok(served);
        }
        let served = self.serving().store().at(active);
        let answer = served
            .rank_of(&request.query, &request.product)
            .await
            .map_err(RedisDeclined::Failed)?
            .ok_or(RedisDeclined::NotServed)?;
        // Top-N-only serving: a product Redis does not hold may rank past the depth; only the engine
        // knows. When the ranking is no longer than the depth, Redis holds all of it and "unlisted" is true.
        if answer.rank.is_none() && served.depth().is_some_and(|depth| answer.total > depth) {
            return Err(RedisDeclined::PastDepth);
        }
        let served = Served::of(self.rank_body(request, answer, Freshness::Fresh));
        self.responses.insert(key, stamps, served.clone());
        Ok(served)
    }

    async fn sort_from_redis(
        &self,
        request: &SortRequest,
        active: &Active,
    ) -> Result<SortedProducts, RedisDeclined> {
        let served = self.serving().store().at(active);
        let sorted = served
            .sort_products(&request.query, &request.products)
            .await
            .map_err(RedisDeclined::Failed)?
            .ok_or(RedisDeclined::NotServed)?;
        // Top-N-only serving: a product Redis does not hold may rank past the depth (see rank_from_redis).
        let unranked = sorted.items.iter().any(|item| item.rank.is_none());
        if unranked && served.depth().is_some_and(|depth| sorted.total > depth) {
            return Err(RedisDeclined::PastDepth);
        }
        Ok(sorted)
    }

    async fn ranks_from_redis(
        &self,
        request: &RanksRequest,
        active: &Active,
        stamp: u64,
    ) -> Result<Served, RedisDeclined> {
        let categories = self.rankings.engine().read().product_categories(&request.product);
        let queries = request.queries(categories);
        // `route` noted `all`; the product's categories are read too (also when the answer is cached).
        for query in &queries {
            self.serving().note_read(&query.category, &query.span, || true);
        }
        let key = ResponseKey::ranks(Source::Redis, request);
        let stamps = (stamp, self.rankings.catalog_generation());
        if let Some(served) = self.responses.get(&key, stamps) {
            return Ok(served);
        }
        // Each category's spans are in a span group of their own, published by whichever instance
        // holds it: every group must be current, or the engine answers the whole request.
        let mut actives = Vec::with_capacity(queries.len());
        for query in &queries {
            match self.serving().state(&query.category, &query.span, || {
                self.rankings.engine().read().as_of_millis()
            }) {
                ServingState::Current { active, .. } => actives.push(active),
                ServingState::Stale(_) => return Err(RedisDeclined::NotServed),
            }
        }
        let store = self.serving().store();
        // One script call per category (each its own hash slot on a Cluster), all sent at once.
        let replies =
            futures_util::future::join_all(queries.iter().zip(&actives).map(|(query, active)| async move {
                store.at(active).rank_of(query, &request.product).await
            }))
            .await;
        let depth = active.depth;
        let mut answers = Vec::with_capacity(queries.len());
        for (query, reply) in queries.into_iter().zip(replies) {
            let answer = reply
                .map_err(RedisDeclined::Failed)?
                .ok_or(RedisDeclined::NotServed)?;
            if answer.rank.is_none() && depth.is_some_and(|depth| answer.total > depth) {
                return Err(RedisDeclined::PastDepth);
            }
            answers.push((query.category, answer));
        }
        let body = Served::of(self.ranks_body(request, &answers, Freshness::Fresh));
        self.responses.insert(key, stamps, body.clone());
        Ok(body)
    }

    fn serving(&self) -> &Arc<Serving> {
        self.rankings.serving().expect("routed to redis serving")
    }

    /// The stamps an engine answer is valid under: (engine generation, catalogue generation), read
    /// before computing, so an answer that raced with an ingest is cached under the older stamps and
    /// never served after them.
    fn engine_stamps(&self) -> (u64, u64) {
        (
            self.rankings.engine().read().generation(),
            self.rankings.catalog_generation(),
        )
    }

    fn top_body(&self, request: &TopRequest, page: TopPage, freshness: Freshness) -> Bytes {
        let with_catalog = self.rankings.has_catalog();
        let echo = self.echoes.span(&request.query.span, &self.zone);
        let as_of = page.as_of_millis.and_then(|millis| self.echoes.as_of(millis));
        let response = TopResponse {
            as_of: as_of.as_deref(),
            at: &echo.at,
            category: request.query.category.as_str(),
            items: page
                .items
                .iter()
                .map(|item| {
                    TopItem::of(
                        item,
                        page.total,
                        with_catalog
                            .then(|| self.rankings.catalog_entry(&item.product))
                            .flatten(),
                    )
                })
                .collect(),
            limit: request.limit,
            offset: request.offset,
            period: echo.period,
            period_end: &echo.period_end,
            period_start: &echo.period_start,
            policy_version: page.policy_version,
            ranker: request.query.ranker,
            stale: freshness == Freshness::Stale,
            total: page.total,
            window: echo.window,
        };
        serialize(&response, 256 + 256 * response.items.len())
    }

    fn rank_body(&self, request: &RankRequest, answer: RankAnswer, freshness: Freshness) -> Bytes {
        let echo = self.echoes.span(&request.query.span, &self.zone);
        let as_of = answer.as_of_millis.and_then(|millis| self.echoes.as_of(millis));
        let response = RankResponse {
            as_of: as_of.as_deref(),
            at: &echo.at,
            carry: answer.carry,
            category: request.query.category.as_str(),
            metrics: MetricsBody::of(&answer.metrics),
            percentile: percentile(answer.rank, answer.total),
            period: echo.period,
            period_end: &echo.period_end,
            period_start: &echo.period_start,
            policy_version: answer.policy_version,
            product: self.rankings.catalog_entry(&request.product),
            product_id: request.product.as_str(),
            rank: answer.rank,
            ranker: request.query.ranker,
            score: answer.score,
            stale: freshness == Freshness::Stale,
            total: answer.total,
            window: echo.window,
        };
        response.to_json()
    }

    fn sort_body(&self, request: &SortRequest, sorted: SortedProducts, freshness: Freshness) -> Bytes {
        let echo = self.echoes.span(&request.query.span, &self.zone);
        let as_of = sorted.as_of_millis.and_then(|millis| self.echoes.as_of(millis));
        let response = SortResponse {
            as_of: as_of.as_deref(),
            at: &echo.at,
            category: request.query.category.as_str(),
            items: sorted
                .items
                .iter()
                .map(|item| SortItem {
                    metrics: MetricsBody::of(&item.metrics),
                    percentile: percentile(item.rank, sorted.total),
                    product_id: item.product.as_str(),
                    rank: item.rank,
                    score: item.score,
                })
                .collect(),
            period: echo.period,
            period_end: &echo.period_end,
            period_start: &echo.period_start,
            policy_version: sorted.policy_version,
            ranker: request.query.ranker,
            stale: freshness == Freshness::Stale,
            total: sorted.total,
            window: echo.window,
        };
        serialize(&response, 256 + 160 * response.items.len())
    }

    /// `answers`: one per ranking the product can be listed in, `all` first, from one store.
    fn ranks_body(
        &self,
        request: &RanksRequest,
        answers: &[(CategoryOrAll, RankAnswer)],
        freshness: Freshness,
    ) -> Bytes {
        let echo = self.echoes.span(&request.span, &self.zone);
        // Every answer came from one store; `all` (always first) speaks for its version and `asOf`.
        let head = &answers.first().expect("`all` is always asked").1;
        let as_of = head.as_of_millis.and_then(|millis| self.echoes.as_of(millis));
        let response = RanksResponse {
            as_of: as_of.as_deref(),
            at: &echo.at,
            period: echo.period,
            period_end: &echo.period_end,
            period_start: &echo.period_start,
            policy_version: head.policy_version,
            product_id: request.product.as_str(),
            ranker: request.ranker,
            ranks: answers
                .iter()
                .map(|(category, answer)| CategoryRank {
                    category: category.as_str(),
                    percentile: percentile(answer.rank, answer.total),
                    rank: answer.rank,
                    score: answer.score,
                    total: answer.total,
                })
                .collect(),
            stale: freshness == Freshness::Stale,
            window: echo.window,
        };
        serialize(&response, 256 + 96 * response.ranks.len())
    }
}

/// Serializes into a buffer of `capacity` bytes, about the body's size, so it is not regrown on the way.
fn serialize(response: &impl Serialize, capacity: usize) -> Bytes {
    let mut body = Vec::with_capacity(capacity);
    serde_json::to_writer(&mut body, response).expect("ranking responses serialize");
    Bytes::from(body)
}

// Response bodies. Fields are declared in alphabetical order: the order the `json!` bodies these replace
// had (serde_json's map is sorted), so answers stay byte for byte the same.

/// `GET …/top`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TopResponse<'a> {
    as_of: Option<&'a str>,
    at: &'a str,
    category: &'a str,
    items: Vec<TopItem<'a>>,
    limit: usize,
    offset: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    period: Option<&'static str>,
    period_end: &'a str,
    period_start: &'a str,
    policy_version: u32,
    ranker: RankerName,
    stale: bool,
    total: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<&'static str>,
}

/// One item of a top page.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TopItem<'a> {
    carry: f64,
    metrics: MetricsBody,
    percentile: Option<f64>,
    /// Catalogue data, when the product has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    product: Option<serde_json::Value>,
    product_id: &'a str,
    rank: usize,
    score: f64,
}

impl TopItem<'_> {
    fn of(item: &RankedItem, total: usize, product: Option<serde_json::Value>) -> TopItem<'_> {
        TopItem {
            carry: item.carry,
            metrics: MetricsBody::of(&item.metrics),
            percentile: percentile(Some(item.rank), total),
            product,
            product_id: item.product.as_str(),
            rank: item.rank,
            score: item.score,
        }
    }
}

/// `GET …/rank`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RankResponse<'a> {
    as_of: Option<&'a str>,
    at: &'a str,
    carry: f64,
    category: &'a str,
    metrics: MetricsBody,
    /// Share of `total` ranked at or above the product, in percent ([`percentile`]); `null` unranked.
    percentile: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    period: Option<&'static str>,
    period_end: &'a str,
    period_start: &'a str,
    policy_version: u32,
    /// Catalogue data, when the product has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    product: Option<serde_json::Value>,
    product_id: &'a str,
    /// 1-based; `null` when the product is not listed.
    rank: Option<usize>,
    ranker: RankerName,
    score: Option<f64>,
    stale: bool,
    total: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<&'static str>,
}

/// `POST /v1/rankings/sort`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SortResponse<'a> {
    as_of: Option<&'a str>,
    at: &'a str,
    category: &'a str,
    /// Ranking order; unranked products last, in the order asked.
    items: Vec<SortItem<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    period: Option<&'static str>,
    period_end: &'a str,
    period_start: &'a str,
    policy_version: u32,
    ranker: RankerName,
    stale: bool,
    total: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<&'static str>,
}

/// One product of a sort answer.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SortItem<'a> {
    metrics: MetricsBody,
    percentile: Option<f64>,
    product_id: &'a str,
    rank: Option<usize>,
    score: Option<f64>,
}

/// `GET /v1/products/{productId}/ranks`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RanksResponse<'a> {
    as_of: Option<&'a str>,
    at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    period: Option<&'static str>,
    period_end: &'a str,
    period_start: &'a str,
    policy_version: u32,
    product_id: &'a str,
    ranker: RankerName,
    /// `all` first, then each of the product's categories by name; `rank: null` where it is not listed.
    ranks: Vec<CategoryRank<'a>>,
    stale: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<&'static str>,
}

/// A product's place in one category's ranking.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CategoryRank<'a> {
    category: &'a str,
    percentile: Option<f64>,
    rank: Option<usize>,
    score: Option<f64>,
    total: usize,
}

impl RankResponse<'_> {
    /// The body, written field by field: exactly `serde_json::to_vec(self)` (a test compares them), at a
    /// fraction of the cost, since a warm rank read is otherwise mostly serialization
    /// ([`crate::http::json_writer`]). A field added to the struct goes here too, in the same place.
    fn to_json(&self) -> Bytes {
        let mut json = JsonWriter::with_capacity(384);
        json.raw("{\"asOf\":");
        json.opt_str(self.as_of);
        json.raw(",\"at\":");
        json.str(self.at);
        json.raw(",\"carry\":");
        json.f64(self.carry);
        json.raw(",\"category\":");
        json.str(self.category);
        json.raw(",\"metrics\":");
        self.metrics.write_json(&mut json);
        json.raw(",\"percentile\":");
        json.opt_f64(self.percentile);
        if let Some(period) = self.period {
            json.raw(",\"period\":");
            json.str(period);
        }
        json.raw(",\"periodEnd\":");
        json.str(self.period_end);
        json.raw(",\"periodStart\":");
        json.str(self.period_start);
        json.raw(",\"policyVersion\":");
        json.u64(u64::from(self.policy_version));
        if let Some(product) = &self.product {
            json.raw(",\"product\":");
            json.value(product);
        }
        json.raw(",\"productId\":");
        json.str(self.product_id);
        json.raw(",\"rank\":");
        json.opt_u64(self.rank.map(|rank| rank as u64));
        json.raw(",\"ranker\":");
        json.str(self.ranker.as_str());
        json.raw(",\"score\":");
        json.opt_f64(self.score);
        json.raw(",\"stale\":");
        json.bool(self.stale);
        json.raw(",\"total\":");
        json.u64(self.total as u64);
        if let Some(window) = self.window {
            json.raw(",\"window\":");
            json.str(window);
        }
        json.raw("}");
        json.into_bytes()
    }
}

/// A product's metrics over the span.
#[derive(Serialize)]
struct MetricsBody {
    likes: i64,
    sales: i64,
    units: i64,
    views: i64,
}

impl MetricsBody {
    fn of(metrics: &Metrics) -> MetricsBody {
        MetricsBody {
            likes: metrics.likes,
            sales: metrics.sales,
            units: metrics.units,
            views: metrics.views,
        }
    }

    /// `serde_json::to_vec(self)`, written by hand (see [`RankResponse::to_json`]).
    fn write_json(&self, json: &mut JsonWriter) {
        json.raw("{\"likes\":");
        json.i64(self.likes);
        json.raw(",\"sales\":");
        json.i64(self.sales);
        json.raw(",\"units\":");
        json.i64(self.units);
        json.raw(",\"views\":");
        json.i64(self.views);
        json.raw("}");
    }
}

/// `asOf`: RFC 3339 with milliseconds, UTC (`2026-07-17T13:05:02.123Z`); `None` out of range.
fn format_as_of(millis: i64) -> Option<String> {
    jiff::Timestamp::from_millisecond(millis)
        .ok()
        .map(|ts| format!("{ts:.3}"))
}

/// The span as the request named it (`period` or `window` with its value, and `at`) and its bounds.
struct SpanEcho {
    period: Option<&'static str>,
    window: Option<&'static str>,
    at: String,
    /// `periodStart`: the instant the span's first hour starts, RFC 3339 with the zone's offset then.
    period_start: String,
    /// `periodEnd`: the **exclusive** end, the instant the hour after the span starts (a daily period
    /// ends at the next local midnight, a window at the end of its `at` hour), with the offset then.
    period_end: String,
}

impl SpanEcho {
    fn of(span: &Span, zone: &Zone) -> SpanEcho {
        let hours = span.hours(zone);
        let (period, window, at) = match span {
            Span::Period(key) => (Some(key.kind().as_str()), None, key.to_string()),
            Span::Window { len, end } => (None, Some(len.as_str()), format_hour_key(*end, zone)),
        };
        SpanEcho {
            period,
            window,
            at,
            period_start: zone.format_hour_start(hours.start),
            period_end: zone.format_hour_start(hours.end),
        }
    }
}

/// Spans whose echo is remembered before the memo starts over (reads concentrate on a few spans).
const ECHO_MEMO_SPANS: usize = 4_096;

/// Remembered [`SpanEcho`]s (behind an `Arc`: a read takes one reference count, not four strings) and
/// the latest `asOf` text.
#[derive(Default)]
struct EchoMemo {
    spans: RwLock<HashMap<Span, Arc<SpanEcho>>>,
    as_of: RwLock<Option<(i64, Arc<str>)>>,
}

impl EchoMemo {
    fn span(&self, span: &Span, zone: &Zone) -> Arc<SpanEcho> {
        if let Some(echo) = self.spans.read().get(span) {
            return echo.clone();
        }
        let echo = Arc::new(SpanEcho::of(span, zone));
        let mut spans = self.spans.write();
        if spans.len() >= ECHO_MEMO_SPANS {
            spans.clear();
        }
        spans.insert(*span, echo.clone());
        echo
    }

    fn as_of(&self, millis: i64) -> Option<Arc<str>> {
        if let Some((cached, text)) = &*self.as_of.read() {
            if *cached == millis {
                return Some(text.clone());
            }
        }
        let text: Arc<str> = format_as_of(millis)?.into();
        *self.as_of.write() = Some((millis, text.clone()));
        Some(text)
    }
}

// The response cache.

/// Which store made a cached answer, and how it was marked: answers of different sources are never
/// served for one another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Engine,
    EngineStale,
    Redis,
}

impl Source {
    fn engine(freshness: Freshness) -> Source {
        match freshness {
            Freshness::Fresh => Source::Engine,
            Freshness::Stale => Source::EngineStale,
        }
    }
}

/// What was asked, fully resolved (never the raw query string: the default `at` moves with the clock).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Asked {
    Top {
        offset: usize,
        limit: usize,
    },
    Rank(ProductId),
    /// Every category of a product (the key's category is `all`).
    Ranks(ProductId),
}

/// A cached answer's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ResponseKey {
    source: Source,
    ranker: RankerName,
    category: CategoryOrAll,
    span: Span,
    asked: Asked,
}

impl ResponseKey {
    fn top(source: Source, request: &TopRequest) -> ResponseKey {
        ResponseKey {
            source,
            ranker: request.query.ranker,
            category: request.query.category.clone(),
            span: request.query.span,
            asked: Asked::Top {
                offset: request.offset,
                limit: request.limit,
            },
        }
    }

    fn rank(source: Source, request: &RankRequest) -> ResponseKey {
        ResponseKey {
            source,
            ranker: request.query.ranker,
            category: request.query.category.clone(),
            span: request.query.span,
            asked: Asked::Rank(request.product.clone()),
        }
    }

    fn ranks(source: Source, request: &RanksRequest) -> ResponseKey {
        ResponseKey {
            source,
            ranker: request.ranker,
            category: CategoryOrAll::All,
            span: request.span,
            asked: Asked::Ranks(request.product.clone()),
        }
    }

    /// Roughly what the key holds, for the cache's byte bound.
    fn weight(&self) -> usize {
        let product = match &self.asked {
            Asked::Top { .. } => 0,
            Asked::Rank(product) | Asked::Ranks(product) => product.as_str().len(),
        };
        std::mem::size_of::<ResponseKey>() + self.category.as_str().len() + product
    }
}

/// Bytes of cached responses kept per shard before that shard starts over (16 shards: 64 MiB in all).
const RESPONSE_CACHE_SHARD_BYTES: usize = 4 << 20;
/// Shards of the response cache, so concurrent misses don't all queue on one write lock.
const RESPONSE_CACHE_SHARDS: usize = 16;

/// One shard: responses by key with the stamps they were made at, and the bytes they hold.
#[derive(Default)]
struct CacheShard {
    entries: HashMap<ResponseKey, ((u64, u64), Served)>,
    bytes: usize,
}

/// Serialized answers, each valid while the stamps it was made at hold ((engine generation or Redis
/// pointer stamp, catalogue generation)), bounded by bytes so deep pages and many rank answers fit
/// without letting the cache grow without limit.
struct ResponseCache {
    shards: Vec<RwLock<CacheShard>>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for ResponseCache {
    fn default() -> Self {
        ResponseCache {
            shards: (0..RESPONSE_CACHE_SHARDS).map(|_| RwLock::default()).collect(),
            hasher: Default::default(),
        }
    }
}

impl ResponseCache {
    fn shard(&self, key: &ResponseKey) -> &RwLock<CacheShard> {
        let hash = self.hasher.hash_one(key);
        &self.shards[hash as usize % RESPONSE_CACHE_SHARDS]
    }

    /// The answer cached for `key`, if it was made at `stamps`.
    fn get(&self, key: &ResponseKey, stamps: (u64, u64)) -> Option<Served> {
        let shard = self.shard(key).read();
        let (made_at, served) = shard.entries.get(key)?;
        (*made_at == stamps).then(|| served.clone())
    }

    /// Remembers an answer made at `stamps`.
    fn insert(&self, key: ResponseKey, stamps: (u64, u64), served: Served) {
        let key_weight = key.weight();
        let mut shard = self.shard(&key).write();
        if shard.bytes + key_weight + served.weight() > RESPONSE_CACHE_SHARD_BYTES {
            shard.entries.clear();
            shard.bytes = 0;
        }
        shard.bytes += key_weight + served.weight();
        if let Some((_, old)) = shard.entries.insert(key, (stamps, served)) {
            shard.bytes -= key_weight + old.weight();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any_f64() -> impl proptest::strategy::Strategy<Value = f64> {
        use proptest::prelude::*;
        prop_oneof![
            any::<f64>(),
            Just(0.0),
            Just(-0.0),
            Just(f64::NAN),
            Just(f64::INFINITY),
            -1e6..1e6f64
        ]
    }

    proptest::proptest! {
        /// The hand-written rank body is the derived one, byte for byte, whatever the answer holds.
        #[test]
        fn rank_body_is_what_serde_json_writes(
            as_of in proptest::option::of("[0-9T:.Z-]{0,24}"),
            at in "[0-9W-]{0,10}",
            carry in any_f64(),
            category in "\\PC{1,8}|all|a\"b\\\\c|tab\there|\u{1}",
            metrics in proptest::array::uniform4(proptest::num::i64::ANY),
            percentile in proptest::option::of(any_f64()),
            period in proptest::option::of(proptest::sample::select(vec!["hourly", "daily", "weekly", "yearly"])),
            period_bounds in ("[0-9T:+-]{0,25}", "[0-9T:+-]{0,25}"),
            policy_version in proptest::num::u32::ANY,
            product in proptest::option::of("\\PC{0,12}"),
            product_id in "\\PC{1,16}|p[0-9]{1,5}",
            rank in proptest::option::of(proptest::num::usize::ANY),
            ranker in proptest::sample::select(RankerName::ALL.to_vec()),
            score in proptest::option::of(any_f64()),
            stale in proptest::bool::ANY,
            total in proptest::num::usize::ANY,
            window in proptest::option::of(proptest::sample::select(vec!["24h", "7d", "30d"])),
        ) {
            let response = RankResponse {
                as_of: as_of.as_deref(),
                at: &at,
                carry,
                category: &category,
                metrics: MetricsBody {
                    likes: metrics[0],
                    sales: metrics[1],
                    units: metrics[2],
                    views: metrics[3],
                },
                percentile,
                period,
                period_end: &period_bounds.1,
                period_start: &period_bounds.0,
                policy_version,
                product: product.map(|name| serde_json::json!({ "name": name, "price": 9.5 })),
                product_id: &product_id,
                rank,
                ranker,
                score,
                stale,
                total,
                window,
            };
            let derived = serde_json::to_vec(&response).expect("serializes");
            let written = response.to_json();
            proptest::prop_assert_eq!(String::from_utf8_lossy(&written), String::from_utf8_lossy(&derived));
        }
    }

    #[test]
    fn as_of_is_rfc3339_with_milliseconds() {
        assert_eq!(
            format_as_of(1_784_293_502_123).as_deref(),
            Some("2026-07-17T13:05:02.123Z")
        );
        let memo = EchoMemo::default();
        assert_eq!(
            memo.as_of(1_784_293_502_123).as_deref(),
            Some("2026-07-17T13:05:02.123Z")
        );
        assert_eq!(
            memo.as_of(1_784_293_502_124).as_deref(),
            Some("2026-07-17T13:05:02.124Z")
        );
    }
}
