//! Read API: `GET /v1/categories/{category}/top` and `GET /v1/products/{productId}/rank` (SPEC 1.5).
//!
//! Handlers parse every parameter into domain types first, so a bad one gets a 400 that names it, then
//! hand the parsed request to the [`RankingsReader`](crate::rankings::reader::RankingsReader), which
//! decides everything else and answers the serialized body. The query string goes through the one
//! read-parameter parser, [`rankgate_core::read::parse_read_query`], which also bounds `at` by the server
//! clock.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

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
fn json_response(body: Bytes) -> Response {
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
) -> Response {
    rank_reply(&state, &product, query.as_deref())
        .await
        .into_response()
}

/// The rank read itself, from the decoded `productId` path segment and the raw query string, as the JSON
/// body of its answer.
async fn rank_body(state: &AppState, product: &str, query: Option<&str>) -> ApiResult<Bytes> {
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
    Ok(state.reader.rank(&request).await?)
}

/// A rank read's answer: status, headers (but `content-length` and `date`, which whoever writes the
/// answer adds) and body.
///
/// Three paths answer a rank read — the route's handler above, the edge's direct path
/// ([`crate::edge::Edge`]) and the fast lane ([`crate::fast_lane`]), which skip the router's and hyper's
/// per-request work on the hottest read — and all three write exactly this, so a header added here
/// (`Cache-Control`, `ETag`, …) reaches every one of them.
pub struct RankReply {
    /// 200, or the error's status.
    pub status: StatusCode,
    /// In the order they are written.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The JSON body.
    pub body: Bytes,
}

impl IntoResponse for RankReply {
    fn into_response(self) -> Response {
        let length = HeaderValue::from(self.body.len());
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        headers.insert(header::CONTENT_LENGTH, length);
        response
    }
}

/// The rank read, answered (see [`RankReply`]).
pub async fn rank_reply(state: &AppState, product: &str, query: Option<&str>) -> RankReply {
    match rank_body(state, product, query).await {
        Ok(body) => RankReply {
            status: StatusCode::OK,
            headers: vec![(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body,
        },
        Err(error) => {
            let (parts, body) = error.into_response().into_parts();
            RankReply {
                status: parts.status,
                headers: parts
                    .headers
                    .into_iter()
                    .filter_map(|(name, value)| Some((name?, value)))
                    .collect(),
                // An error body is a short JSON object held in memory: collecting it cannot fail.
                body: axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default(),
            }
        }
    }
}

/// The path of a rank read the edge may answer without the router: `/v1/products/{productId}/rank` whose
/// segment holds no escape (axum would percent-decode it; those go through the router) — the product id
/// as the router's `Path` extractor would give it. `None` for every other path.
pub fn direct_rank_product(path: &str) -> Option<&str> {
    let product = path.strip_prefix("/v1/products/")?.strip_suffix("/rank")?;
    (!product.is_empty() && !product.contains(['/', '%'])).then_some(product)
}
