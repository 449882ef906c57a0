//! Read API: `GET /v1/categories/{category}/top` and `GET /v1/products/{productId}/rank` (SPEC 1.5).
//!
//! Handlers parse every parameter into domain types first, so a bad one gets a 400 that names it, then
//! ask the rankings service and shape the answer. The query string goes through the one read-parameter
//! parser, [`rankgate_core::read::parse_read_query`], which also bounds `at` by the server clock.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{format_hour_key, Hour, Span, Zone};
use rankgate_core::read::{parse_read_query, ReadContext, ReadEndpoint, ReadRequest};
use rankgate_store::queue::StoreError;
use rankgate_store::ranking::engine::{RankAnswer, RankingQuery, TopPage};

use crate::app::AppState;
use crate::error::{ApiError, ApiResult};
use crate::rankings::serving::{served_policy_version, Route, Serving};

/// The span a request named, with the echo fields for the response.
#[derive(Clone)]
struct ParsedSpan {
    span: Span,
    echo_name: &'static str,
    echo_value: String,
    at: String,
}

impl ParsedSpan {
    fn of(span: Span, zone: &Zone) -> ParsedSpan {
        match span {
            Span::Period(key) => ParsedSpan {
                span,
                echo_name: "period",
                echo_value: key.kind().as_str().to_string(),
                at: key.to_string(),
            },
            Span::Window { len, end } => ParsedSpan {
                span,
                echo_name: "window",
                echo_value: len.as_str().to_string(),
                at: format_hour_key(end, zone),
            },
        }
    }
}

/// Parses a read's query string with the one read-parameter parser, against the server clock.
fn parse_query(state: &AppState, endpoint: ReadEndpoint, query: Option<&str>) -> ApiResult<ReadRequest> {
    let context = ReadContext {
        zone: &state.config.zone,
        now_millis: state.clock.now_millis(),
        metric_retention_millis: state.config.metric_retention_millis,
    };
    parse_read_query(endpoint, query.unwrap_or(""), &context).map_err(|e| ApiError::BadRequest(e.to_string()))
}

fn parse_category(raw: &str, field: &str) -> ApiResult<CategoryOrAll> {
    CategoryOrAll::parse(raw).map_err(|e| ApiError::bad_field(field, e))
}

fn metrics_json(m: &Metrics) -> Value {
    json!({ "views": m.views, "likes": m.likes, "units": m.units, "sales": m.sales })
}

/// RFC 3339 with milliseconds, UTC (`2026-07-17T13:05:02.123Z`).
pub fn format_millis(millis: Option<i64>) -> Value {
    match millis.and_then(|m| jiff::Timestamp::from_millisecond(m).ok()) {
        Some(ts) => Value::String(format!("{ts:.3}")),
        None => Value::Null,
    }
}

fn json_response(body: bytes::Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn serialize(value: &Value) -> bytes::Bytes {
    bytes::Bytes::from(serde_json::to_vec(value).expect("JSON values serialize"))
}

/// How much work an engine read may do where it is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EngineRead {
    /// Only a span that is cached and clean, under the shared lock: cheap enough for an async worker.
    CachedOnly,
    /// Whatever it takes (flush a dirty span, build a cold one): only on the blocking pool.
    BuildIfNeeded,
}

/// An answer from the in-process engine, cached against the engine's generation. `stale` marks answers
/// given in place of an unreachable serving store; they are cached apart from fresh ones.
///
/// A warm, clean span is answered on the async worker (a hand-off to the blocking pool would cost more
/// than the lookup: a random-product rank read misses the response cache every time). Anything else is
/// computed on the blocking pool: the engine may have to build a cold span first, and that must not hold
/// up the async workers (nor, thanks to the step-wise build, the writer's ingest). `stamps` are read
/// before computing, so an answer that raced with an ingest is cached under the older stamps and never
/// served after them.
async fn from_engine(
    state: &AppState,
    key: &str,
    stale: bool,
    compute: impl Fn(EngineRead) -> Option<Value> + Send + 'static,
) -> ApiResult<Response> {
    let key = format!("{}{key}", if stale { 's' } else { 'e' });
    let stamps = state.rankings.generations();
    if let Some(body) = state.rankings.cached_response(&key, stamps) {
        return Ok(json_response(body));
    }
    let body = match compute(EngineRead::CachedOnly) {
        Some(value) => serialize(&value),
        None => tokio::task::spawn_blocking(move || {
            serialize(&compute(EngineRead::BuildIfNeeded).expect("a read allowed to build answers"))
        })
        .await
        .map_err(|error| anyhow::anyhow!("computing a ranking read failed: {error}"))?,
    };
    state.rankings.cache_response(key, stamps, body.clone());
    Ok(json_response(body))
}

/// Answers a read routed to Redis: from the response cache while the pointer's stamp holds, else by
/// `read`, whose answer is cached under that stamp. `Err(stale)` sends the read to the engine instead:
/// `false` when Redis does not serve it (a span not yet published, a rank past the Top-N depth), `true`
/// when Redis failed.
async fn from_redis<F, Fut>(state: &AppState, key: &str, stamp: u64, read: F) -> Result<Response, bool>
where
    F: FnOnce(Arc<Serving>) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Value>, StoreError>>,
{
    let key = format!("r{key}");
    let stamps = (stamp, state.rankings.catalog_generation());
    if let Some(body) = state.rankings.cached_response(&key, stamps) {
        return Ok(json_response(body));
    }
    let serving = state.rankings.serving().expect("routed to redis serving").clone();
    match read(serving.clone()).await {
        Ok(Some(value)) => {
            let body = serialize(&value);
            state.rankings.cache_response(key, stamps, body.clone());
            Ok(json_response(body))
        }
        Ok(None) => Err(false),
        Err(error) => {
            serving.note_unreachable(&error);
            Err(true)
        }
    }
}

/// Where a read goes: Redis for hot spans when Redis serving is configured, else the engine.
fn route(state: &AppState, span: &Span) -> Route {
    match state.rankings.serving() {
        Some(serving) => serving.route(
            span,
            Hour::from_millis(state.clock.now_millis()),
            state.rankings.engine().read().as_of_millis(),
        ),
        None => Route::Engine { stale: false },
    }
}

/// `GET /v1/categories/{category}/top`
pub async fn top(
    State(state): State<AppState>,
    Path(category): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let category = parse_category(&category, "category")?;
    let request = parse_query(&state, ReadEndpoint::Top, query.as_deref())?;
    let (ranker, limit, offset) = (request.ranker, request.limit, request.offset);
    let span = ParsedSpan::of(request.span, &state.config.zone);
    let key = format!(
        "top\u{0}{ranker}\u{0}{category}\u{0}{:?}\u{0}{offset}\u{0}{limit}",
        span.span
    );
    let query = RankingQuery {
        ranker,
        category: category.clone(),
        span: span.span,
    };
    let engine_body = {
        let (state, query, span) = (state.clone(), query.clone(), span.clone());
        move |stale: bool, read: EngineRead| {
            let page = match read {
                EngineRead::CachedOnly => state.rankings.top_if_cached(&query, offset, limit)?,
                EngineRead::BuildIfNeeded => state.rankings.top(&query, offset, limit),
            };
            Some(top_body(&state, &query, &span, (offset, limit), page, stale))
        }
    };
    let stale = match route(&state, &span.span) {
        // Top-N-only serving: a page past the depth is answered from the source of truth's engine.
        Route::Redis { active, stamp } if active.depth.is_none_or(|depth| offset + limit <= depth) => {
            let (state, query, span, category) = (&state, &query, &span, &category);
            let read = |serving: Arc<Serving>| async move {
                let served = serving
                    .store()
                    .top(active.generation, ranker, category, &span.span, offset, limit)
                    .await?;
                Ok(served.map(|served| {
                    let page = TopPage {
                        policy_version: served_policy_version(&active, ranker),
                        total: served.total,
                        items: served.items,
                        as_of_millis: active.as_of_millis,
                    };
                    top_body(state, query, span, (offset, limit), page, false)
                }))
            };
            match from_redis(state, &key, stamp, read).await {
                Ok(response) => return Ok(response),
                Err(stale) => stale,
            }
        }
        Route::Redis { .. } => false,
        Route::Engine { stale } => stale,
    };
    from_engine(&state, &key, stale, move |read| engine_body(stale, read)).await
}

fn top_body(
    state: &AppState,
    query: &RankingQuery,
    span: &ParsedSpan,
    (offset, limit): (usize, usize),
    page: TopPage,
    stale: bool,
) -> Value {
    let with_catalog = state.rankings.has_catalog();
    let items: Vec<Value> = page
        .items
        .iter()
        .map(|item| {
            let mut value = json!({
                "rank": item.rank,
                "productId": item.product.as_str(),
                "score": item.score,
                "metrics": metrics_json(&item.metrics),
                "carry": item.carry,
            });
            if with_catalog {
                if let Some(product) = state.rankings.catalog_entry(&item.product) {
                    value["product"] = product;
                }
            }
            value
        })
        .collect();
    json!({
        "ranker": query.ranker.as_str(),
        "policyVersion": page.policy_version,
        "category": query.category.as_str(),
        span.echo_name: span.echo_value,
        "at": span.at,
        "asOf": format_millis(page.as_of_millis),
        "stale": stale,
        "total": page.total,
        "items": items,
        "limit": limit,
        "offset": offset,
    })
}

/// `GET /v1/products/{productId}/rank`
pub async fn rank(
    State(state): State<AppState>,
    Path(product): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let product = ProductId::parse(&product).map_err(|e| ApiError::bad_field("productId", e))?;
    let request = parse_query(&state, ReadEndpoint::Rank, query.as_deref())?;
    let category = request.category.unwrap_or(CategoryOrAll::All);
    let ranker = request.ranker;
    let span = ParsedSpan::of(request.span, &state.config.zone);
    let key = format!(
        "rank\u{0}{ranker}\u{0}{category}\u{0}{:?}\u{0}{product}",
        span.span
    );
    let query = RankingQuery {
        ranker,
        category: category.clone(),
        span: span.span,
    };
    let engine_body = {
        let (state, query, span, product) = (state.clone(), query.clone(), span.clone(), product.clone());
        move |stale: bool, read: EngineRead| {
            let answer = match read {
                EngineRead::CachedOnly => state.rankings.rank_if_cached(&query, &product)?,
                EngineRead::BuildIfNeeded => state.rankings.rank(&query, &product),
            };
            Some(rank_body(&state, &query, &span, &product, answer, stale))
        }
    };
    let stale = match route(&state, &span.span) {
        Route::Redis { active, stamp } => {
            let (state, query, span, category, product) = (&state, &query, &span, &category, &product);
            let read = |serving: Arc<Serving>| async move {
                let served = serving
                    .store()
                    .rank(active.generation, ranker, category, &span.span, product)
                    .await?;
                // Top-N-only serving: a product past the depth is answered from the source of truth's engine.
                let served = served.filter(|s| s.rank.is_some() || active.depth.is_none_or(|d| s.total <= d));
                Ok(served.map(|served| {
                    let answer = RankAnswer {
                        policy_version: served_policy_version(&active, ranker),
                        rank: served.rank,
                        score: served.score,
                        metrics: served.metrics,
                        carry: served.carry,
                        total: served.total,
                        as_of_millis: active.as_of_millis,
                    };
                    rank_body(state, query, span, product, answer, false)
                }))
            };
            match from_redis(state, &key, stamp, read).await {
                Ok(response) => return Ok(response),
                Err(stale) => stale,
            }
        }
        Route::Engine { stale } => stale,
    };
    from_engine(&state, &key, stale, move |read| engine_body(stale, read)).await
}

fn rank_body(
    state: &AppState,
    query: &RankingQuery,
    span: &ParsedSpan,
    product: &ProductId,
    answer: RankAnswer,
    stale: bool,
) -> Value {
    let mut body = json!({
        "productId": product.as_str(),
        "category": query.category.as_str(),
        span.echo_name: span.echo_value,
        "at": span.at,
        "ranker": query.ranker.as_str(),
        "policyVersion": answer.policy_version,
        "rank": answer.rank,
        "score": answer.score,
        "total": answer.total,
        "metrics": metrics_json(&answer.metrics),
        "carry": answer.carry,
        "asOf": format_millis(answer.as_of_millis),
        "stale": stale,
    });
    if let Some(entry) = state.rankings.catalog_entry(product) {
        body["product"] = entry;
    }
    body
}
