//! Read API: `GET /v1/categories/{category}/top` and `GET /v1/products/{productId}/rank` (SPEC 1.5).
//!
//! Handlers parse every parameter into domain types first, so a bad one gets a 400 that names it, then
//! hand the parsed request to the [`RankingsReader`](crate::rankings::reader::RankingsReader), which
//! decides everything else and answers the serialized body. The query string goes through the one
//! read-parameter parser, [`rankgate_core::read::parse_read_query`], which also bounds `at` by the server
//! clock.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::read::{parse_read_query, ReadContext, ReadEndpoint, ReadRequest};
use rankgate_store::ranking::engine::RankingQuery;

use crate::app::AppState;
use crate::error::{ApiError, ApiResult};
use crate::rankings::reader::{RankRequest, ReadError, TopRequest};

/// Parses a read's query string with the one read-parameter parser, against the server clock.
fn parse_query(state: &AppState, endpoint: ReadEndpoint, query: Option<&str>) -> ApiResult<ReadRequest> {
    let context = ReadContext {
        zone: &state.config.zone,
        now_millis: state.clock.now_millis(),
        metric_retention_millis: state.config.metric_retention_millis,
    };
    parse_read_query(endpoint, query.unwrap_or(""), &context).map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// A JSON answer with the headers the router's answers carry (`content-type`, then `content-length`,
/// which axum adds for a body of known size), built directly so the edge's direct path answers the same.
pub fn json_response(body: bytes::Bytes) -> Response {
    let length = HeaderValue::from(body.len());
    let mut response = Response::new(Body::from(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::CONTENT_LENGTH, length);
    response
}

impl From<ReadError> for ApiError {
    fn from(error: ReadError) -> Self {
        ApiError::Internal(anyhow::Error::new(error))
    }
}

/// `GET /v1/categories/{category}/top`
pub async fn top(
    State(state): State<AppState>,
    Path(category): Path<String>,
    RawQuery(query): RawQuery,
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
    Ok(json_response(state.reader.top(&request).await?))
}

/// `GET /v1/products/{productId}/rank`
pub async fn rank(
    State(state): State<AppState>,
    Path(product): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    Ok(json_response(
        rank_body(&state, &product, query.as_deref()).await?,
    ))
}

/// The rank read itself, from the decoded `productId` path segment and the raw query string, as the JSON
/// body of its answer: the route's handler above, and the edge's direct paths for the same route
/// ([`crate::edge::Edge`], [`crate::fast_lane`]), which skip the router's per-request work on the
/// hottest read.
pub async fn rank_body(state: &AppState, product: &str, query: Option<&str>) -> ApiResult<bytes::Bytes> {
    let product = ProductId::parse(product).map_err(|e| ApiError::bad_field("productId", e))?;
    let parsed = parse_query(&state, ReadEndpoint::Rank, query.as_deref())?;
    let request = RankRequest {
        query: RankingQuery {
            ranker: parsed.ranker,
            category: parsed.category.unwrap_or(CategoryOrAll::All),
            span: parsed.span,
        },
        product,
    };
    Ok(state.reader.rank(&request).await?)
}

/// The rank read answered as the route answers it.
pub async fn rank_answer(state: &AppState, product: &str, query: Option<&str>) -> Response {
    match rank_body(state, product, query).await {
        Ok(body) => json_response(body),
        Err(error) => error.into_response(),
    }
}

/// The path of a rank read the edge may answer without the router: `/v1/products/{productId}/rank` whose
/// segment holds no escape (axum would percent-decode it; those go through the router) — the product id
/// as the router's `Path` extractor would give it. `None` for every other path.
pub fn direct_rank_product(path: &str) -> Option<&str> {
    let product = path.strip_prefix("/v1/products/")?.strip_suffix("/rank")?;
    (!product.is_empty() && !product.contains(['/', '%'])).then_some(product)
}
