//! Admin endpoints (SPEC 2.1): list queues with their counts, read and change a queue's settings at
//! runtime, delete a queue, remove one member. Authentication is added by the caller of
//! [`super::admin_routes`].

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{Method, StatusCode};
use axum::routing::on;
use axum::{Json, Router};
use futures_util::StreamExt as _;
use rankgate_core::queue::{AdmissionMode, EntryChallenge, FailMode, QueueSettings, SettingsPatch};
use serde::Serialize;
use serde_json::Value;

use super::member_api::json_object;
use super::opening::{parse_beacon_body, parse_draw_page_query, DrawPage, DrawReader, OpeningView};
use super::service::WaitingRoom;
use crate::http::error::{ApiError, ApiResult};
use crate::http::route_table::{self, Endpoint};

pub(crate) const ENDPOINTS: &[Endpoint<Arc<WaitingRoom>>] = &[
    Endpoint::new(Method::GET, "/v1/admin/queues", |m| on(m, list)),
    Endpoint::new(Method::GET, "/v1/admin/queues/{queue}", |m| on(m, show)),
    Endpoint::new(Method::PUT, "/v1/admin/queues/{queue}", |m| on(m, update)),
    Endpoint::new(Method::DELETE, "/v1/admin/queues/{queue}", |m| on(m, remove)),
    Endpoint::new(Method::DELETE, "/v1/admin/queues/{queue}/members/{member}", |m| {
        on(m, remove_member)
    }),
    Endpoint::new(Method::GET, "/v1/admin/queues/{queue}/draw", |m| on(m, draw)),
    Endpoint::new(Method::PUT, "/v1/admin/queues/{queue}/draw/beacon", |m| {
        on(m, supply_beacon)
    }),
    Endpoint::new(Method::GET, "/v1/admin/queues/{queue}/report", |m| on(m, report)),
    Endpoint::new(Method::GET, "/admin/queues/{queue}/report", |m| {
        on(m, report_page)
    }),
];

pub(crate) fn routes(room: Arc<WaitingRoom>) -> Router {
    route_table::router_of(ENDPOINTS).with_state(room)
}

/// Builds a patch field by field, so a wrong type gets a 400 that names the field. Unknown fields (for
/// example the live counters of a GET echoed back) are ignored.
fn parse_patch(map: &serde_json::Map<String, Value>) -> ApiResult<SettingsPatch> {
    fn whole(field: &str, value: &Value) -> ApiResult<u64> {
        value
            .as_u64()
            .ok_or_else(|| ApiError::bad_field(field, "must be a positive whole number"))
    }
    fn number(field: &str, value: &Value) -> ApiResult<f64> {
        value
            .as_f64()
            .filter(|number| number.is_finite())
            .ok_or_else(|| ApiError::bad_field(field, "must be a positive number"))
    }
    let mut patch = SettingsPatch::default();
    for (field, value) in map {
        match field.as_str() {
            "admitPerSecond" => {
                patch.admit_per_second = Some(
                    value
                        .as_f64()
                        .ok_or_else(|| ApiError::bad_field(field, "must be a positive number"))?,
                )
            }
            "tickMillis" => patch.tick_millis = Some(whole(field, value)?),
            "tokenTtlSeconds" => patch.token_ttl_seconds = Some(whole(field, value)?),
            "claimTtlSeconds" => patch.claim_ttl_seconds = Some(whole(field, value)?),
            "abandonAfterSeconds" => patch.abandon_after_seconds = Some(whole(field, value)?),
            "maxActive" => {
                patch.max_active = Some(if value.is_null() {
                    None
                } else {
                    Some(whole(field, value)?)
                });
            }
            "paused" => {
                patch.paused = Some(
                    value
                        .as_bool()
                        .ok_or_else(|| ApiError::bad_field(field, "must be true or false"))?,
                )
            }
            "admissionMode" => {
                patch.admission_mode = Some(match value.as_str() {
                    Some("fixed") => AdmissionMode::Fixed,
                    Some("adaptive") => AdmissionMode::Adaptive,
                    _ => return Err(ApiError::bad_field(field, "must be \"fixed\" or \"adaptive\"")),
                })
            }
            "minAdmitPerSecond" => patch.min_admit_per_second = Some(number(field, value)?),
            "maxAdmitPerSecond" => patch.max_admit_per_second = Some(number(field, value)?),
            "maxErrorRate" => patch.max_error_rate = Some(number(field, value)?),
            "targetP95Millis" => patch.target_p95_millis = Some(whole(field, value)?),
            "entryChallenge" => {
                patch.entry_challenge = Some(match value.as_str() {
                    Some("none") => EntryChallenge::None,
                    Some("pow") => EntryChallenge::Pow,
                    Some("captcha") => EntryChallenge::Captcha,
                    _ => {
                        return Err(ApiError::bad_field(
                            field,
                            "must be \"none\", \"pow\" or \"captcha\"",
                        ))
                    }
                })
            }
            "powDifficulty" => {
                patch.pow_difficulty = Some(
                    value
                        .as_u64()
                        .and_then(|bits| u32::try_from(bits).ok())
                        .filter(|bits| *bits <= 32)
                        .ok_or_else(|| {
                            ApiError::bad_field(
                                field,
                                "must be a whole number of leading zero bits between 0 and 32",
                            )
                        })?,
                )
            }
            "failMode" => {
                patch.fail_mode = Some(match value.as_str() {
                    Some("closed") => FailMode::Closed,
                    Some("open") => FailMode::Open,
                    _ => return Err(ApiError::bad_field(field, "must be \"closed\" or \"open\"")),
                })
            }
            _ => {}
        }
    }
    Ok(patch)
}

/// The answer of `PUT /v1/admin/queues/{queue}`: the settings, and the opening when one is scheduled.
#[derive(Debug, Serialize)]
struct SettingsView {
    #[serde(flatten)]
    settings: QueueSettings,
    #[serde(flatten)]
    opening: Option<OpeningView>,
}

async fn update(
    State(room): State<Arc<WaitingRoom>>,
    Path(queue): Path<String>,
    body: Bytes,
) -> ApiResult<Json<SettingsView>> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let object = json_object(&body)?;
    let patch = parse_patch(&object)?;
    if patch.entry_challenge == Some(EntryChallenge::Captcha) && room.guards().captcha().is_none() {
        return Err(ApiError::bad_field(
            "entryChallenge",
            "\"captcha\" needs [waiting_room.captcha] (provider, site_key, secret) in this server's config",
        ));
    }
    // `opensAt` and `drawBeaconRound` are checked before anything changes, so a bad one leaves the
    // settings as they were.
    let opens_at = object
        .get("opensAt")
        .map(|value| room.parse_opens_at_field(value))
        .transpose()?;
    let beacon_round = object
        .get("drawBeaconRound")
        .map(WaitingRoom::parse_beacon_round_field)
        .transpose()?;
    if let Some(round) = beacon_round {
        room.check_beacon_round_applies(&queue, round, opens_at).await?;
    }
    let settings = room.update_settings(&queue, &patch).await?;
    if let Some(opens_at) = opens_at {
        room.schedule_opening(&queue, opens_at).await?;
    }
    // After the opening: a new draw starts without a round, and a cleared opening has none to set.
    if let (Some(round), false) = (beacon_round, opens_at == Some(None)) {
        room.set_beacon_round(&queue, round).await?;
    }
    Ok(Json(SettingsView {
        settings,
        opening: room.opening_view(&queue).await?,
    }))
}

/// `GET /v1/admin/queues/{queue}/draw?offset&limit`: the published draw with member ids.
async fn draw(
    State(room): State<Arc<WaitingRoom>>,
    Path(queue): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<DrawPage>> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let (offset, limit) = parse_draw_page_query(query.as_deref())?;
    Ok(Json(
        room.draw_page(&queue, offset, limit, DrawReader::Admin).await?,
    ))
}

/// The answer of `PUT /v1/admin/queues/{queue}/draw/beacon`: the queue's opening as it now stands.
#[derive(Debug, Serialize)]
struct BeaconAccepted {
    queue: String,
    #[serde(flatten)]
    opening: OpeningView,
}

/// `PUT /v1/admin/queues/{queue}/draw/beacon {"round": R, "value": "<hex>"}`: 200 with the opening when the
/// value is accepted (or was, the same, before); 400 naming `round` or `value`; 409 when no draw awaits a
/// beacon or another value was accepted.
async fn supply_beacon(
    State(room): State<Arc<WaitingRoom>>,
    Path(queue): Path<String>,
    body: Bytes,
) -> ApiResult<Json<BeaconAccepted>> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let (round, value) = parse_beacon_body(&json_object(&body)?)?;
    let opening = room.supply_beacon(&queue, round, &value).await?;
    Ok(Json(BeaconAccepted {
        queue: queue.to_string(),
        opening,
    }))
}

/// `GET /v1/admin/queues/{queue}` (SPEC 2.1): the settings, the live counts, the upstream's last
/// control interval and the opening when one is scheduled.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct QueueView {
    #[serde(flatten)]
    settings: QueueSettings,
    waiting: u64,
    ready: u64,
    claimed: u64,
    admitted_last_minute: u64,
    oldest_wait_seconds: u64,
    measured_admit_per_second: Option<f64>,
    abandoned: u64,
    /// Entries refused by reason since the queue's report began, across instances (issue 28).
    refused: super::sale_report::RefusedCounts,
    /// Changes when the store lost the queue (SPEC 2.2, "Places that survive the store").
    epoch: u64,
    /// Adaptive admission (issue 12): the rate the budget spends.
    effective_admit_per_second: f64,
    #[serde(flatten)]
    upstream: UpstreamView,
    #[serde(flatten)]
    opening: Option<OpeningView>,
}

async fn show(State(room): State<Arc<WaitingRoom>>, Path(queue): Path<String>) -> ApiResult<Json<QueueView>> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let stats = room.stats(&queue).await?;
    let upstream = room
        .last_upstream_summary(&queue)
        .await
        .map_err(ApiError::Internal)?;
    Ok(Json(QueueView {
        effective_admit_per_second: stats.settings.effective_admit_per_second(),
        waiting: stats.waiting,
        ready: stats.ready,
        claimed: stats.claimed,
        admitted_last_minute: stats.admitted_last_minute,
        oldest_wait_seconds: stats.oldest_wait_seconds,
        measured_admit_per_second: stats.measured_rate,
        abandoned: stats.abandoned,
        refused: room.refused_counts(&queue).await?,
        epoch: stats.epoch,
        upstream: UpstreamView::from(upstream.as_ref()),
        opening: room.opening_view(&queue).await?,
        settings: stats.settings,
    }))
}

/// `GET /v1/admin/queues/{queue}/report` (SPEC 2.5): the sale's report as JSON.
async fn report(
    State(room): State<Arc<WaitingRoom>>,
    Path(queue): Path<String>,
) -> ApiResult<Json<super::sale_report::SaleReport>> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    Ok(Json(room.sale_report(&queue).await?))
}

/// `GET /admin/queues/{queue}/report`: the same report drawn as charts (HTML with inline SVG, no script).
async fn report_page(
    State(room): State<Arc<WaitingRoom>>,
    Path(queue): Path<String>,
) -> ApiResult<axum::response::Response> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let report = room.sale_report(&queue).await?;
    Ok(super::report_page::response(&report))
}

/// `DELETE /v1/admin/queues/{queue}`: 204, or 404 for a queue that does not exist.
async fn remove(State(room): State<Arc<WaitingRoom>>, Path(queue): Path<String>) -> ApiResult<StatusCode> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    room.delete_queue(&queue).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/admin/queues/{queue}/members/{memberId}` (fraud, support): 204 when the member was
/// WAITING (its place is gone), READY (its token is void and its `max_active` slot freed) or remembered as
/// consumed; 404 when it is not in the queue; 409 while an order is in flight (consume or release the
/// claim first, or let it expire).
async fn remove_member(
    State(room): State<Arc<WaitingRoom>>,
    Path((queue, member)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let member = WaitingRoom::parse_member("memberId", &member)?;
    room.remove_member(&queue, &member).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The last closed control interval of the queue's upstream, in the admin view (all `null` until one
/// closes: the queue has no `[[gate]]`, or its gate forwarded nothing yet).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct UpstreamView {
    /// p95 latency (ms) of the forwarded orders, over every instance.
    upstream_p95_millis: Option<f64>,
    /// 5xx, timeouts and transport errors over forwarded orders.
    upstream_error_rate: Option<f64>,
    /// Orders forwarded in the interval.
    upstream_samples: Option<u64>,
    /// What the controller did: `hold`, `backOffLatency`, `backOffErrors`, `increase`; `null` in fixed mode.
    adaptive_decision: Option<rankgate_core::queue::adaptive::ControlDecision>,
}

impl From<Option<&rankgate_core::queue::adaptive::IntervalSummary>> for UpstreamView {
    fn from(summary: Option<&rankgate_core::queue::adaptive::IntervalSummary>) -> Self {
        UpstreamView {
            upstream_p95_millis: summary.and_then(|s| s.p95_millis),
            upstream_error_rate: summary.and_then(|s| s.error_rate),
            upstream_samples: summary.map(|s| s.samples),
            adaptive_decision: summary.and_then(|s| s.decision),
        }
    }
}

/// One queue's counts in the list (the same numbers as `GET /v1/admin/queues/{queue}`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct QueueCounts {
    waiting: u64,
    ready: u64,
    claimed: u64,
    admitted_last_minute: u64,
    oldest_wait_seconds: u64,
    abandoned: u64,
    paused: bool,
}

/// `GET /v1/admin/queues`: `queues` (names, sorted; as before) and `counts` by name.
#[derive(Debug, Serialize)]
struct QueueList {
    queues: Vec<String>,
    counts: BTreeMap<String, QueueCounts>,
}

/// Stats reads in flight while listing (at most `max_queues` queues, one read each).
const LIST_READS_IN_FLIGHT: usize = 16;

async fn list(State(room): State<Arc<WaitingRoom>>) -> ApiResult<Json<QueueList>> {
    let names = room.queue_names().await?;
    let stats: Vec<_> = futures_util::stream::iter(names)
        .map(|queue| {
            let room = Arc::clone(&room);
            async move {
                let stats = room.stats(&queue).await;
                (queue, stats)
            }
        })
        .buffered(LIST_READS_IN_FLIGHT)
        .collect()
        .await;
    let mut counts = BTreeMap::new();
    for (queue, stats) in stats {
        match stats {
            Ok(stats) => {
                counts.insert(
                    queue.to_string(),
                    QueueCounts {
                        waiting: stats.waiting,
                        ready: stats.ready,
                        claimed: stats.claimed,
                        admitted_last_minute: stats.admitted_last_minute,
                        oldest_wait_seconds: stats.oldest_wait_seconds,
                        abandoned: stats.abandoned,
                        paused: stats.settings.paused,
                    },
                );
            }
            // Deleted or forgotten between the two reads: it is not listed.
            Err(ApiError::NotFound(_)) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(Json(QueueList {
        queues: counts.keys().cloned().collect(),
        counts,
    }))
}
