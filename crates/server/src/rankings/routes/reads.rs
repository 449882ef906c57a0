//! Read API (SPEC 1.5): `GET /v1/categories/{category}/top`, its change stream `GET …/top/events` (SSE),
//! `GET /v1/products/{productId}/rank`, `GET /v1/products/{productId}/ranks` and `POST /v1/rankings/sort`.
//!
//! Handlers parse every parameter into domain types first, so a bad one gets a 400 that names it, then
//! hand the parsed request to the [`RankingsReader`](crate::rankings::reader::RankingsReader), which
//! decides everything else and answers the serialized body. The query string goes through the one
//! read-parameter parser, [`rankgate_core::read::parse_read_query`], which also bounds `at` by the server
//! clock; the sort body's span fields go through the same span parser.
//!
//! **CDN-friendly GETs.** `top`, `rank` and `ranks` answer `Cache-Control: public, max-age=<N>`
//! (`cache_max_age_seconds`) and the `ETag` the reader made with the body; a request whose
//! `If-None-Match` matches gets `304 Not Modified` with the same two headers and no body. The sort is a
//! POST, `Cache-Control: no-store`.

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::read::{
    parse_ranker, parse_read_query, parse_span, ReadContext, ReadEndpoint, ReadRequest,
};
use rankgate_store::ranking::engine::RankingQuery;

use crate::http::direct_reply::DirectReply;
use crate::http::entity_tag::IfNoneMatch;
use crate::http::error::{ApiError, ApiResult};
use crate::rankings::reader::{
    RankRequest, RanksRequest, ReadError, Served, SortRequest, TopRequest, MAX_SORT_PRODUCTS,
};
use crate::rankings::top_streams::OpenError;
use crate::rankings::Rankings;

/// What reads are checked against: the zone, the server clock, retention.
fn read_context(state: &Rankings) -> ReadContext<'_> {
    ReadContext {
        zone: &state.config.zone,
        now_millis: state.clock.now_millis(),
        metric_retention_millis: state.config.metric_retention_millis,
    }
}

/// Parses a read's query string with the one read-parameter parser, against the server clock.
fn parse_query(state: &Rankings, endpoint: ReadEndpoint, query: Option<&str>) -> ApiResult<ReadRequest> {
    parse_read_query(endpoint, query.unwrap_or(""), &read_context(state))
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// The `Cache-Control` value of cacheable reads.
pub fn cache_control(max_age_seconds: u64) -> HeaderValue {
    HeaderValue::try_from(format!("public, max-age={max_age_seconds}")).expect("digits and ASCII")
}

/// A cacheable read's answer: 200 with the body, or 304 when the client already holds it. Both carry the
/// `ETag` and `Cache-Control` (RFC 9110 §15.4.5: a 304 sends what a 200 would have in those).
fn cacheable_response(state: &Rankings, if_none_match: &IfNoneMatch, served: Served) -> Response {
    let not_modified = if_none_match.holds(&served.etag);
    let headers = [
        (header::ETAG, served.etag_header),
        (header::CACHE_CONTROL, state.cache_control.clone()),
    ];
    if not_modified {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    (
        headers,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        served.body,
    )
        .into_response()
}

impl From<ReadError> for ApiError {
    fn from(error: ReadError) -> Self {
        ApiError::Internal(anyhow::Error::new(error))
    }
}

/// `GET /v1/categories/{category}/top`
pub async fn top(
    State(state): State<Rankings>,
    Path(category): Path<String>,
    RawQuery(query): RawQuery,
    if_none_match: IfNoneMatch,
) -> ApiResult<Response> {
    let category = CategoryOrAll::parse(&category).map_err(|e| ApiError::bad_field("category", e))?;
    let parsed = parse_query(&state, ReadEndpoint::Top, query.as_deref())?;
    let request = TopRequest {
        query: RankingQuery {
            ranker: parsed.ranker,
            category,
            span: parsed.span,
        },
        offset: parsed.offset,
        limit: parsed.limit,
    };
    Ok(cacheable_response(
        &state,
        &if_none_match,
        state.reader.top_served(&request).await?,
    ))
}

impl From<OpenError> for ApiError {
    fn from(error: OpenError) -> Self {
        match error {
            full @ OpenError::Full(_) => ApiError::TooManyRequests {
                message: full.to_string(),
                retry_after_secs: 5,
                headers: Vec::new(),
            },
            OpenError::Read(error) => error.into(),
        }
    }
}

/// `GET /v1/categories/{category}/top/events`: the top page as Server-Sent Events, sent when the stream
/// opens and whenever it changes (see [`crate::rankings::top_streams`]). Parameters as `…/top`.
pub async fn top_events(
    State(state): State<Rankings>,
    Path(category): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let category = CategoryOrAll::parse(&category).map_err(|e| ApiError::bad_field("category", e))?;
    let parsed = parse_query(&state, ReadEndpoint::Top, query.as_deref())?;
    let at_given =
        form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()).any(|(name, _)| name == "at");
    let stream = state.top_streams.open(category, &parsed, at_given).await?;
    Ok(Sse::new(stream).into_response())
}

/// `GET /v1/products/{productId}/rank`
pub async fn rank(
    State(state): State<Rankings>,
    Path(product): Path<String>,
    RawQuery(query): RawQuery,
    if_none_match: IfNoneMatch,
) -> Response {
    rank_reply(&state, &product, query.as_deref(), &if_none_match)
        .await
        .into_response()
}

/// The rank read itself, from the decoded `productId` path segment and the raw query string: the body
/// and its entity tag.
async fn rank_served(state: &Rankings, product: &str, query: Option<&str>) -> ApiResult<Served> {
    let product = ProductId::parse(product).map_err(|e| ApiError::bad_field("productId", e))?;
    let parsed = parse_query(state, ReadEndpoint::Rank, query)?;
    let request = RankRequest {
        query: RankingQuery {
            ranker: parsed.ranker,
            category: parsed.category.unwrap_or(CategoryOrAll::All),
            span: parsed.span,
        },
        product,
    };
    Ok(state.reader.rank_served(&request).await?)
}

/// `GET /v1/products/{productId}/ranks`: the product's place in `all` and in each of its categories.
pub async fn ranks(
    State(state): State<Rankings>,
    Path(product): Path<String>,
    RawQuery(query): RawQuery,
    if_none_match: IfNoneMatch,
) -> ApiResult<Response> {
    let product = ProductId::parse(&product).map_err(|e| ApiError::bad_field("productId", e))?;
    let parsed = parse_query(&state, ReadEndpoint::Ranks, query.as_deref())?;
    let request = RanksRequest {
        ranker: parsed.ranker,
        span: parsed.span,
        product,
    };
    Ok(cacheable_response(
        &state,
        &if_none_match,
        state.reader.ranks_served(&request).await?,
    ))
}

/// Largest sort body: 1,000 ids of 128 bytes, each escaped as `\uXXXX` at worst, fit with room to spare.
const MAX_SORT_BODY_BYTES: usize = 1 << 20;

/// The body of `POST /v1/rankings/sort`. Unknown fields and fields given twice are refused, naming them.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SortBody {
    ranker: Option<String>,
    category: Option<String>,
    period: Option<String>,
    window: Option<String>,
    at: Option<String>,
    product_ids: Vec<String>,
}

/// Parses a sort body into a [`SortRequest`]: every field checked, each error naming its field.
pub fn parse_sort_body(state: &Rankings, body: &[u8]) -> ApiResult<SortRequest> {
    if body.len() > MAX_SORT_BODY_BYTES {
        return Err(ApiError::PayloadTooLarge(format!(
            "body: a sort request may be at most {MAX_SORT_BODY_BYTES} bytes ({MAX_SORT_PRODUCTS} productIds)"
        )));
    }
    let body: SortBody =
        serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("body: {e}")))?;
    let ranker = parse_ranker(body.ranker.as_deref()).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let category = match body.category.as_deref() {
        None => CategoryOrAll::All,
        Some(raw) => CategoryOrAll::parse(raw).map_err(|e| ApiError::bad_field("category", e))?,
    };
    let span = parse_span(
        body.period.as_deref(),
        body.window.as_deref(),
        body.at.as_deref(),
        &read_context(state),
    )
    .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if body.product_ids.is_empty() || body.product_ids.len() > MAX_SORT_PRODUCTS {
        return Err(ApiError::bad_field(
            "productIds",
            format!(
                "give 1 to {MAX_SORT_PRODUCTS} product ids, got {}",
                body.product_ids.len()
            ),
        ));
    }
    let mut products = Vec::with_capacity(body.product_ids.len());
    let mut seen = std::collections::HashSet::with_capacity(body.product_ids.len());
    for (index, raw) in body.product_ids.iter().enumerate() {
        let product =
            ProductId::parse(raw).map_err(|e| ApiError::bad_field(&format!("productIds[{index}]"), e))?;
        if !seen.insert(raw.as_str()) {
            return Err(ApiError::bad_field(
                &format!("productIds[{index}]"),
                "given more than once; name each product once",
            ));
        }
        products.push(product);
    }
    Ok(SortRequest {
        query: RankingQuery {
            ranker,
            category,
            span,
        },
        products,
    })
}

/// `POST /v1/rankings/sort`: the products in the ranking's order, unranked ones last in the order asked.
pub async fn sort(State(state): State<Rankings>, body: axum::body::Bytes) -> ApiResult<Response> {
    let request = parse_sort_body(&state, &body)?;
    let body = state.reader.sort(&request).await?;
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response())
}

/// The rank read, answered (see [`DirectReply`]).
pub async fn rank_reply(
    state: &Rankings,
    product: &str,
    query: Option<&str>,
    if_none_match: &IfNoneMatch,
) -> DirectReply {
    match rank_served(state, product, query).await {
        // The same headers, in the same order, as `cacheable_response` gives the other reads.
        Ok(served) if if_none_match.holds(&served.etag) => DirectReply {
            status: StatusCode::NOT_MODIFIED,
            headers: vec![
                (header::ETAG, served.etag_header),
                (header::CACHE_CONTROL, state.cache_control.clone()),
            ],
            body: Bytes::new(),
        },
        Ok(served) => DirectReply {
            status: StatusCode::OK,
            headers: vec![
                (header::ETAG, served.etag_header),
                (header::CACHE_CONTROL, state.cache_control.clone()),
                (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
            ],
            body: served.body,
        },
        Err(error) => DirectReply::error(error).await,
    }
}

/// The path of a rank read the edge may answer without the router: `/v1/products/{productId}/rank` whose
/// segment holds no escape (axum would percent-decode it; those go through the router) — the product id
/// as the router's `Path` extractor would give it. `None` for every other path.
pub fn direct_rank_product(path: &str) -> Option<&str> {
    let product = path.strip_prefix("/v1/products/")?.strip_suffix("/rank")?;
    crate::http::direct_reply::plain_segment(product).then_some(product)
}
