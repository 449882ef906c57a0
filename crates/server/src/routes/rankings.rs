//! Read API: `GET /v1/categories/{category}/top`, its change stream `GET …/top/events` (SSE) and
//! `GET /v1/products/{productId}/rank` (SPEC 1.5).
//!
//! Handlers parse every parameter into domain types first, so a bad one gets a 400 that names it, then
//! hand the parsed request to the [`RankingsReader`](crate::rankings::reader::RankingsReader), which
//! decides everything else and answers the serialized body. The query string goes through the one
//! read-parameter parser, [`rankgate_core::read::parse_read_query`], which also bounds `at` by the server
//! clock.

use axum::extract::{Path, RawQuery, State};
use axum::http::header;
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};

use rankgate_core::ids::{CategoryOrAll, ProductId};
use rankgate_core::read::{parse_read_query, ReadContext, ReadEndpoint, ReadRequest};
use rankgate_store::ranking::engine::RankingQuery;

use crate::app::AppState;
use crate::error::{ApiError, ApiResult};
use crate::rankings::reader::{RankRequest, ReadError, TopRequest};
use crate::rankings::top_streams::OpenError;

/// Parses a read's query string with the one read-parameter parser, against the server clock.
fn parse_query(state: &AppState, endpoint: ReadEndpoint, query: Option<&str>) -> ApiResult<ReadRequest> {
    let context = ReadContext {
        zone: &state.config.zone,
        now_millis: state.clock.now_millis(),
        metric_retention_millis: state.config.metric_retention_millis,
    };
    parse_read_query(endpoint, query.unwrap_or(""), &context).map_err(|e| ApiError::BadRequest(e.to_string()))
}

fn json_response(body: bytes::Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
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
    State(state): State<AppState>,
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
    State(state): State<AppState>,
    Path(product): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let product = ProductId::parse(&product).map_err(|e| ApiError::bad_field("productId", e))?;
    let parsed = parse_query(&state, ReadEndpoint::Rank, query.as_deref())?;
    let request = RankRequest {
        query: RankingQuery {
            ranker: parsed.ranker,
            category: parsed.category.unwrap_or(CategoryOrAll::All),
            span: parsed.span,
        },
        product,
    };
    Ok(json_response(state.reader.rank(&request).await?))
}
