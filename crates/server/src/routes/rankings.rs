//! Read API: `GET /v1/categories/{category}/top` and `GET /v1/products/{productId}/rank` (SPEC 1.5).
//!
//! Handlers parse every parameter into domain types first, so a bad one gets a 400 that names it, then
//! ask the rankings service and shape the answer.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::metrics::Metrics;
use rankgate_core::period::{format_hour_key, parse_end_hour, Hour, PeriodKey, PeriodKind, Span, WindowLen};
use rankgate_core::ranker::RankerName;
use rankgate_store::ranking::engine::RankingQuery;

use crate::app::AppState;
use crate::error::{ApiError, ApiResult};

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

/// Answers from the response cache, or computes, serializes and caches the answer. The generations are
/// read before computing, so an answer that raced with an ingest is cached under the older generation and
/// never served after it.
fn cached(state: &AppState, key: String, compute: impl FnOnce() -> Value) -> Response {
    let generations = state.rankings.generations();
    if let Some(body) = state.rankings.cached_response(&key, generations) {
        return json_response(body);
    }
    let body = bytes::Bytes::from(serde_json::to_vec(&compute()).expect("JSON values serialize"));
    state.rankings.cache_response(key, generations, body.clone());
    json_response(body)
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
    Ok(cached(&state, key, || {
        top_body(&state, ranker, category, span, offset, limit)
    }))
}

fn top_body(
    state: &AppState,
    ranker: RankerName,
    category: CategoryOrAll,
    span: ParsedSpan,
    offset: usize,
    limit: usize,
) -> Value {
    let query = RankingQuery {
        ranker,
        category: category.clone(),
        span: span.span,
    };
    let page = state.rankings.top(&query, offset, limit);
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
    let mut body = json!({
        "ranker": ranker.as_str(),
        "policyVersion": page.policy_version,
        "category": category.as_str(),
        span.echo_name: span.echo_value,
        "at": span.at,
        "asOf": format_millis(page.as_of_millis),
        "stale": false,
        "total": page.total,
        "items": items,
    });
    body["limit"] = json!(limit);
    body["offset"] = json!(offset);
    body
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
    Ok(cached(&state, key, || {
        rank_body(&state, ranker, category, span, product)
    }))
}

fn rank_body(
    state: &AppState,
    ranker: RankerName,
    category: CategoryOrAll,
    span: ParsedSpan,
    product: ProductId,
) -> Value {
    let query = RankingQuery {
        ranker,
        category: category.clone(),
        span: span.span,
    };
    let answer = state.rankings.rank(&query, &product);
    let mut body = json!({
        "productId": product.as_str(),
        "category": category.as_str(),
        span.echo_name: span.echo_value,
        "at": span.at,
        "ranker": ranker.as_str(),
        "policyVersion": answer.policy_version,
        "rank": answer.rank,
        "score": answer.score,
        "total": answer.total,
        "metrics": metrics_json(&answer.metrics),
        "carry": answer.carry,
        "asOf": format_millis(answer.as_of_millis),
        "stale": false,
    });
    if let Some(entry) = state.rankings.catalog_entry(&product) {
        body["product"] = entry;
    }
    body
}
