//! `POST /v1/events`: JSON array, single object or NDJSON (SPEC 1.6).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::Json;
use serde::Serialize;

use rankgate_core::event::{raw_id, split_body, BodyFormat, Event, ParseLimits, RawItem};
use rankgate_store::ranking::ingest::EventOutcome;

use crate::app::AppState;
use crate::error::{ApiError, ApiResult};

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

/// Validates and ingests a batch; 200 means every accepted event is durable.
pub async fn post_events(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<IngestResponse>> {
    let format = body_format(&headers)?;
    let items = split_body(&body, format).map_err(|e| ApiError::BadRequest(format!("body: {e}")))?;
    if items.len() > state.config.max_batch {
        return Err(ApiError::PayloadTooLarge(format!(
            "a batch holds at most {} events, this one has {}; split it",
            state.config.max_batch,
            items.len()
        )));
    }
    let limits = ParseLimits {
        now_millis: state.clock.now_millis(),
        max_future_millis: state.config.max_future_millis,
    };
    let mut rejected = Vec::new();
    let mut valid: Vec<Event> = Vec::with_capacity(items.len());
    let mut positions = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        match item {
            RawItem::Value(value) => match Event::from_json(value, &limits) {
                Ok(event) => {
                    valid.push(event);
                    positions.push(index);
                }
                Err(error) => rejected.push(Rejection {
                    index,
                    id: raw_id(value),
                    error: error.to_string(),
                }),
            },
            RawItem::Malformed(message) => rejected.push(Rejection {
                index,
                id: None,
                error: format!("event: not valid JSON: {message}"),
            }),
        }
    }
    let mut response = IngestResponse {
        accepted: 0,
        duplicates: 0,
        too_old: 0,
        rejected: Vec::new(),
    };
    if !valid.is_empty() {
        let ids: Vec<String> = valid.iter().map(|e| e.id.as_str().to_string()).collect();
        let outcomes = state
            .rankings
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
    rejected.sort_by_key(|r| r.index);
    response.rejected = rejected;
    Ok(Json(response))
}
