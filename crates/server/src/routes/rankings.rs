//! Read API: `GET /v1/categories/{category}/top` and `GET /v1/products/{productId}/rank` (SPEC 1.5).
//!
//! Handlers parse every parameter into domain types first, so a bad one gets a 400 that names it, then
//! ask the rankings service and shape the answer.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{format_hour_key, parse_end_hour, Hour, PeriodKey, PeriodKind, Span, WindowLen};
use rankgate_core::ranker::RankerName;
use rankgate_store::queue::StoreError;
use rankgate_store::ranking::engine::{RankAnswer, RankingQuery, TopPage};

use crate::app::AppState;
use crate::error::{ApiError, ApiResult};
use crate::rankings::serving::{served_policy_version, Route, Serving};

/// Largest `limit`.
const MAX_LIMIT: usize = 1000;
/// Largest `offset + limit`: deep pages are rare and costly; cap them.
const MAX_DEPTH: usize = 10_000;

/// The span a request named, with the echo fields for the response.
struct ParsedSpan {
    span: Span,
    echo_name: &'static str,
    echo_value: String,
    at: String,
}

fn parse_ranker(params: &HashMap<String, String>) -> ApiResult<RankerName> {
    match params.get("ranker") {
        None => Ok(RankerName::Popular),
        Some(name) => RankerName::parse(name).map_err(|e| ApiError::bad_field("ranker", e)),
    }
}

fn parse_span(params: &HashMap<String, String>, state: &AppState) -> ApiResult<ParsedSpan> {
    let zone = &state.config.zone;
    let now_hour = Hour::from_millis(state.clock.now_millis());
    match (params.get("period"), params.get("window")) {
        (Some(_), Some(_)) => Err(ApiError::bad_field(
            "window",
            "give either period or window, not both",
        )),
        (_, Some(window)) => {
            let len = WindowLen::parse(window)
                .map_err(|_| ApiError::bad_field("window", "must be one of 1h, 1d, 7d, 30d"))?;
            let end = match params.get("at") {
                Some(at) => parse_end_hour(at, zone).map_err(|e| ApiError::bad_field("at", e))?,
                None => now_hour,
            };
            Ok(ParsedSpan {
                span: Span::Window { len, end },
                echo_name: "window",
                echo_value: len.as_str().to_string(),
                at: format_hour_key(end, zone),
            })
        }
        (period, None) => {
            let kind = match period {
                Some(period) => PeriodKind::parse(period).map_err(|_| {
                    ApiError::bad_field("period", "must be one of hourly, daily, weekly, monthly")
                })?,
                None => PeriodKind::Daily,
            };
            let key = match params.get("at") {
                Some(at) => PeriodKey::parse(kind, at).map_err(|e| ApiError::bad_field("at", e))?,
                None => PeriodKey::containing(kind, now_hour, zone),
            };
            Ok(ParsedSpan {
                span: Span::Period(key),
                echo_name: "period",
                echo_value: kind.as_str().to_string(),
                at: key.to_string(),
            })
        }
    }
}

fn parse_usize(
    params: &HashMap<String, String>,
    name: &str,
    default: usize,
    range: (usize, usize),
) -> ApiResult<usize> {
    let Some(raw) = params.get(name) else {
        return Ok(default);
    };
    raw.parse::<usize>()
        .ok()
        .filter(|v| (range.0..=range.1).contains(v))
        .ok_or_else(|| {
            ApiError::bad_field(
                name,
                format!("must be an integer between {} and {}", range.0, range.1),
            )
        })
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

/// Answers from the response cache, or computes, serializes and caches the answer. `stamps` are read
/// before computing, so an answer that raced with an ingest is cached under the older stamps and never
/// served after them.
fn cached(state: &AppState, key: String, stamps: (u64, u64), compute: impl FnOnce() -> Value) -> Response {
    if let Some(body) = state.rankings.cached_response(&key, stamps) {
        return json_response(body);
    }
    let body = serialize(&compute());
    state.rankings.cache_response(key, stamps, body.clone());
    json_response(body)
}

fn serialize(value: &Value) -> bytes::Bytes {
    bytes::Bytes::from(serde_json::to_vec(value).expect("JSON values serialize"))
}

/// An answer from the in-process engine, cached against the engine's generation. `stale` marks answers
/// given in place of an unreachable serving store; they are cached apart from fresh ones.
fn from_engine(state: &AppState, key: &str, stale: bool, compute: impl FnOnce() -> Value) -> Response {
    let key = format!("{}{key}", if stale { 's' } else { 'e' });
    cached(state, key, state.rankings.generations(), compute)
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
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Response> {
    let category = parse_category(&category, "category")?;
    let ranker = parse_ranker(&params)?;
    let span = parse_span(&params, &state)?;
    let limit = parse_usize(&params, "limit", 20, (1, MAX_LIMIT))?;
    let offset = parse_usize(&params, "offset", 0, (0, MAX_DEPTH))?;
    if offset + limit > MAX_DEPTH {
        return Err(ApiError::bad_field(
            "offset",
            format!("offset + limit may not exceed {MAX_DEPTH}"),
        ));
    }
    let key = format!(
        "top\u{0}{ranker}\u{0}{category}\u{0}{:?}\u{0}{offset}\u{0}{limit}",
        span.span
    );
    let query = RankingQuery {
        ranker,
        category: category.clone(),
        span: span.span,
    };
    let engine_body = |stale: bool| {
        top_body(
            &state,
            &query,
            &span,
            (offset, limit),
            state.rankings.top(&query, offset, limit),
            stale,
        )
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
    Ok(from_engine(&state, &key, stale, || engine_body(stale)))
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
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Response> {
    let product = ProductId::parse(&product).map_err(|e| ApiError::bad_field("productId", e))?;
    let category = match params.get("category") {
        Some(raw) => parse_category(raw, "category")?,
        None => CategoryOrAll::All,
    };
    let ranker = parse_ranker(&params)?;
    let span = parse_span(&params, &state)?;
    let key = format!(
        "rank\u{0}{ranker}\u{0}{category}\u{0}{:?}\u{0}{product}",
        span.span
    );
    let query = RankingQuery {
        ranker,
        category: category.clone(),
        span: span.span,
    };
    let engine_body = |stale: bool| {
        rank_body(
            &state,
            &query,
            &span,
            &product,
            state.rankings.rank(&query, &product),
            stale,
        )
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
    Ok(from_engine(&state, &key, stale, || engine_body(stale)))
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
