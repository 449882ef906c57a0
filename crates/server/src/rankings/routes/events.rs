//! `POST /v1/events`: JSON array, single object or NDJSON (SPEC 1.6), plain or gzip-compressed.
//!
//! The handler only decodes the HTTP layer (content type, content coding) and counts outcomes; how a
//! body becomes events is `rankgate_core::event` ([`parse_body_at_most`]: the same rules as
//! `split_body_at_most` + `RawItem::to_event`, which `rankgate ingest FILE` and the stream consumer use,
//! without a `serde_json::Value` per plainly written event). Decoding and parsing are pure CPU work
//! on up to `max_body_bytes`, so they run on the blocking pool, not on an async worker.

use std::io::Read;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::Json;
use serde::Serialize;

use rankgate_core::event::{parse_body_at_most, BodyError, BodyFormat, Event, ParseLimits};
use rankgate_store::ranking::ingest::EventOutcome;

use crate::http::error::{ApiError, ApiResult};
use crate::rankings::service::count_events_rejected_before_ingest;
use crate::rankings::Rankings;

/// One refused event, by its position in the batch.
#[derive(Debug, Serialize)]
pub struct Rejection {
    index: usize,
    id: Option<String>,
    error: String,
}

/// The answer to an ingest.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IngestResponse {
    accepted: usize,
    duplicates: usize,
    too_old: usize,
    rejected: Vec<Rejection>,
}

fn body_format(headers: &HeaderMap) -> ApiResult<BodyFormat> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "application/json" => Ok(BodyFormat::Json),
        "application/x-ndjson" | "application/ndjson" | "application/jsonl" => Ok(BodyFormat::Ndjson),
        _ => Err(ApiError::UnsupportedMediaType(format!(
            "content-type `{content_type}` is not supported; send application/json (an array or one object) or application/x-ndjson"
        ))),
    }
}

/// How the body was compressed (`Content-Encoding`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum ContentCoding {
    Identity,
    Gzip,
}

fn content_coding(headers: &HeaderMap) -> ApiResult<ContentCoding> {
    let Some(value) = headers.get(header::CONTENT_ENCODING) else {
        return Ok(ContentCoding::Identity);
    };
    let unsupported = |shown: &str| {
        ApiError::UnsupportedMediaType(format!(
            "content-encoding `{shown}` is not supported; send the body uncompressed or with content-encoding gzip"
        ))
    };
    let text = value.to_str().map_err(|_| unsupported("(not ASCII)"))?;
    // A list names the codings in the order they were applied; identity steps change nothing.
    let codings: Vec<String> = text
        .split(',')
        .map(|coding| coding.trim().to_ascii_lowercase())
        .filter(|coding| !coding.is_empty() && coding != "identity")
        .collect();
    match codings.as_slice() {
        [] => Ok(ContentCoding::Identity),
        [coding] if coding == "gzip" || coding == "x-gzip" => Ok(ContentCoding::Gzip),
        _ => Err(unsupported(text.trim())),
    }
}

/// The body as its sender wrote it. A gzip body is inflated to at most `max_bytes` (the limit a plain
/// body has), so a small body that inflates to gigabytes costs `max_bytes` of memory and the time to
/// inflate that much, then gets 413.
fn decode_body(body: Bytes, coding: ContentCoding, max_bytes: usize) -> ApiResult<Bytes> {
    match coding {
        ContentCoding::Identity => Ok(body),
        ContentCoding::Gzip => {
            let limit = u64::try_from(max_bytes).unwrap_or(u64::MAX).saturating_add(1);
            let mut inflated = Vec::with_capacity(body.len().saturating_mul(4).min(max_bytes));
            flate2::read::MultiGzDecoder::new(&body[..])
                .take(limit)
                .read_to_end(&mut inflated)
                .map_err(|error| {
                    ApiError::BadRequest(format!(
                        "body: is not valid gzip ({error}); send it uncompressed or gzip it whole"
                    ))
                })?;
            if inflated.len() > max_bytes {
                return Err(ApiError::PayloadTooLarge(format!(
                    "body: inflates to more than {max_bytes} bytes (the body limit); split the batch"
                )));
            }
            Ok(Bytes::from(inflated))
        }
    }
}

/// The valid events of a body, each with its index in the batch, and the rejections.
struct ParsedBatch {
    valid: Vec<Event>,
    positions: Vec<usize>,
    rejected: Vec<Rejection>,
}

fn parse_batch(
    body: &[u8],
    format: BodyFormat,
    max_batch: usize,
    limits: &ParseLimits,
) -> ApiResult<ParsedBatch> {
    let items = parse_body_at_most(body, format, max_batch, limits).map_err(|error| match error {
        BodyError::TooManyItems { max } => ApiError::PayloadTooLarge(format!(
            "a batch holds at most {max} events, this one has more; split it"
        )),
        BodyError::NotParseable(message) => ApiError::BadRequest(format!("body: {message}")),
    })?;
    let mut batch = ParsedBatch {
        valid: Vec::with_capacity(items.len()),
        positions: Vec::with_capacity(items.len()),
        rejected: Vec::new(),
    };
    for (index, item) in items.into_iter().enumerate() {
        match item {
            Ok(event) => {
                batch.valid.push(event);
                batch.positions.push(index);
            }
            Err((id, error)) => batch.rejected.push(Rejection {
                index,
                id,
                error: error.to_string(),
            }),
        }
    }
    Ok(batch)
}

/// Validates and ingests a batch; 200 means every accepted event is durable.
pub async fn post_events(
    State(state): State<Rankings>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<IngestResponse>> {
    let format = body_format(&headers)?;
    let coding = content_coding(&headers)?;
    let limits = ParseLimits {
        max_future_millis: state.config.max_future_millis,
        ..ParseLimits::at(state.clock.now_millis())
    };
    let (max_body_bytes, max_batch) = (state.max_body_bytes, state.config.max_batch);
    let ParsedBatch {
        valid,
        positions,
        mut rejected,
    } = tokio::task::spawn_blocking(move || {
        let body = decode_body(body, coding, max_body_bytes)?;
        parse_batch(&body, format, max_batch, &limits)
    })
    .await
    .map_err(|error| ApiError::Internal(anyhow::anyhow!("parsing an ingest body: {error}")))??;
    let rejected_by_parsing = rejected.len();
    let mut response = IngestResponse {
        accepted: 0,
        duplicates: 0,
        too_old: 0,
        rejected: Vec::new(),
    };
    if !valid.is_empty() {
        let ids: Vec<String> = valid.iter().map(|e| e.id.as_str().to_string()).collect();
        let outcomes = state
            .service
            .ingest(valid, limits.now_millis)
            .await
            .map_err(|error| {
                ApiError::Unavailable(format!("{error:#}; nothing in this batch was stored, retry it"))
            })?;
        for ((outcome, index), id) in outcomes.into_iter().zip(positions).zip(ids) {
            match outcome {
                EventOutcome::Accepted => response.accepted += 1,
                EventOutcome::Duplicate => response.duplicates += 1,
                EventOutcome::TooOld => response.too_old += 1,
                EventOutcome::Rejected(error) => rejected.push(Rejection {
                    index,
                    id: Some(id),
                    error: error.to_string(),
                }),
            }
        }
    }
    // Counted once the answer is certain (a 503 above stored nothing and lists nothing); the writer's
    // rejections were counted by the service.
    count_events_rejected_before_ingest(rejected_by_parsing);
    rejected.sort_by_key(|r| r.index);
    response.rejected = rejected;
    Ok(Json(response))
}
