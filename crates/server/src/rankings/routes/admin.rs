//! Admin API for rankers (SPEC 1.3) and rebuilds (SPEC 1.7). Behind the admin bearer keys.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use rankgate_core::policy::PolicyError;
use rankgate_core::ranker::{PopularWeights, RankerName};

use crate::http::error::{ApiError, ApiResult};
use crate::rankings::PolicyChangeError;
use crate::rankings::Rankings;

fn parse_ranker(name: &str) -> ApiResult<RankerName> {
    RankerName::parse(name).map_err(|e| ApiError::NotFound(e.to_string()))
}

/// `GET /v1/admin/rankers/{name}` and the rollback's answer (SPEC 1.3).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RankerView {
    ranker: &'static str,
    active_version: u32,
    previous_version: Option<u32>,
    building: Option<u32>,
    /// `null` for the rankers with a fixed formula.
    weights: Option<WeightsView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    carry_ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    carry_top_n: Option<u32>,
    /// `trending` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    half_life_hours: Option<f64>,
    /// What a fixed-formula ranker scores by; absent for `popular` and `trending`.
    #[serde(skip_serializing_if = "Option::is_none")]
    formula: Option<&'static str>,
}

/// The weights of a configurable ranker's active version.
#[derive(Debug, Serialize)]
pub struct WeightsView {
    view: f64,
    like: f64,
    sales: f64,
}

/// The 202 of `PUT /v1/admin/rankers/{popular,trending}`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAccepted {
    ranker: &'static str,
    policy_version: u32,
    status: &'static str,
}

/// The answer of `POST /v1/admin/rebuild`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rebuilt {
    status: &'static str,
    policy_version: u32,
}

fn ranker_view(state: &Rankings, ranker: RankerName) -> RankerView {
    if !ranker.is_configurable() {
        return RankerView {
            ranker: ranker.as_str(),
            active_version: 1,
            previous_version: None,
            building: None,
            weights: None,
            carry_ratio: None,
            carry_top_n: None,
            half_life_hours: None,
            formula: Some(if ranker == RankerName::Units {
                "units"
            } else {
                "sales"
            }),
        };
    }
    // The state shared by every instance (SPEC 1.3), as this instance last read or stored it.
    let shared = state.service.policy_state(ranker);
    let weights: PopularWeights = shared.active.weights;
    let popular = ranker == RankerName::Popular;
    RankerView {
        ranker: ranker.as_str(),
        active_version: shared.active.version,
        previous_version: shared.previous.map(|p| p.version),
        building: shared.building.map(|p| p.version),
        weights: Some(WeightsView {
            view: weights.view,
            like: weights.like,
            sales: weights.sales,
        }),
        carry_ratio: popular.then_some(weights.carry_ratio),
        carry_top_n: popular.then_some(weights.carry_top_n),
        half_life_hours: (!popular).then_some(weights.half_life_hours),
        formula: None,
    }
}

/// `GET /v1/admin/rankers/{name}`
pub async fn get_ranker(
    State(state): State<Rankings>,
    Path(name): Path<String>,
) -> ApiResult<Json<RankerView>> {
    let ranker = parse_ranker(&name)?;
    Ok(Json(ranker_view(&state, ranker)))
}

/// The body of `PUT /v1/admin/rankers/{popular,trending}`. Missing fields keep their current values.
/// The carry fields belong to `popular`, the half-life to `trending`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PutRanker {
    weights: Option<WeightsBody>,
    carry_ratio: Option<f64>,
    carry_top_n: Option<u32>,
    half_life_hours: Option<f64>,
}

/// The `weights` object.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsBody {
    view: Option<f64>,
    like: Option<f64>,
    sales: Option<f64>,
}

/// `PUT /v1/admin/rankers/{name}`: a new policy version, built off to the side, switched atomically.
pub async fn put_ranker(
    State(state): State<Rankings>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<PolicyAccepted>)> {
    let ranker = parse_ranker(&name)?;
    if !ranker.is_configurable() {
        return Err(ApiError::bad_field(
            "ranker",
            format!("`{ranker}` has no weights; only popular and trending can be changed"),
        ));
    }
    let body: PutRanker =
        serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(format!("body: {e}")))?;
    match ranker {
        RankerName::Trending if body.carry_ratio.is_some() => {
            return Err(ApiError::bad_field("carryRatio", "trending has no carry"));
        }
        RankerName::Trending if body.carry_top_n.is_some() => {
            return Err(ApiError::bad_field("carryTopN", "trending has no carry"));
        }
        RankerName::Popular if body.half_life_hours.is_some() => {
            return Err(ApiError::bad_field(
                "halfLifeHours",
                "only trending has a half-life",
            ));
        }
        _ => {}
    }
    let current = state.service.policy_state(ranker).active.weights;
    let weights_body = body.weights.unwrap_or(WeightsBody {
        view: None,
        like: None,
        sales: None,
    });
    let weights = PopularWeights {
        view: weights_body.view.unwrap_or(current.view),
        like: weights_body.like.unwrap_or(current.like),
        sales: weights_body.sales.unwrap_or(current.sales),
        carry_ratio: body.carry_ratio.unwrap_or(current.carry_ratio),
        carry_top_n: body.carry_top_n.unwrap_or(current.carry_top_n),
        half_life_hours: body.half_life_hours.unwrap_or(current.half_life_hours),
    };
    weights
        .validate_for(ranker)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let version = state
        .service
        .change_weights(ranker, weights)
        .await
        .map_err(|error| policy_change_error(ranker, error))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(PolicyAccepted {
            ranker: ranker.as_str(),
            policy_version: version,
            status: "building",
        }),
    ))
}

/// `POST /v1/admin/rankers/{name}/rollback`: back to the previous version.
pub async fn rollback_ranker(
    State(state): State<Rankings>,
    Path(name): Path<String>,
) -> ApiResult<Json<RankerView>> {
    let ranker = parse_ranker(&name)?;
    if !ranker.is_configurable() {
        return Err(ApiError::Conflict(format!(
            "`{ranker}` has a single version; nothing to roll back to"
        )));
    }
    state
        .service
        .rollback(ranker)
        .await
        .map_err(|error| policy_change_error(ranker, error))?;
    Ok(Json(ranker_view(&state, ranker)))
}

/// A transition the version rules refuse is a 409 naming why; a failure to store it is a 500.
fn policy_change_error(ranker: RankerName, error: PolicyChangeError) -> ApiError {
    match error {
        PolicyChangeError::Refused(PolicyError::NoPrevious) => {
            ApiError::Conflict(format!("{ranker} has no previous version to roll back to"))
        }
        PolicyChangeError::Refused(refused) => ApiError::Conflict(format!("{ranker}: {refused}")),
        PolicyChangeError::Failed(error) => error.into(),
    }
}

/// `POST /v1/admin/rebuild`: recompute every served ranking from the source of truth and switch.
pub async fn rebuild(State(state): State<Rankings>) -> ApiResult<Json<Rebuilt>> {
    let version = state.service.rebuild().await?;
    Ok(Json(Rebuilt {
        status: "rebuilt",
        policy_version: version,
    }))
}

/// `GET /v1/admin/webhooks`: every `[[webhook]]` (never its secret), the delivery queue's counts and
/// the oldest dead-lettered deliveries.
pub async fn get_webhooks(
    State(state): State<Rankings>,
) -> ApiResult<Json<crate::rankings::webhooks::WebhooksView>> {
    let view = state
        .webhooks
        .view()
        .await
        .map_err(|e| ApiError::Unavailable(format!("the job store cannot be read now: {e}")))?;
    Ok(Json(view))
}

/// `PUT /v1/admin/webhooks/{name}` with `{"enabled": true}`: a webhook disabled (by its receiver's 410,
/// or by an admin's `{"enabled": false}`) delivers again, its parked deliveries first. Answers the
/// webhook as `GET /v1/admin/webhooks` lists it; 404 for a name not configured.
pub async fn put_webhook(
    State(state): State<Rankings>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Json<crate::rankings::webhooks::WebhookView>> {
    let enabled = parse_enabled_body(&body)?;
    let view = state
        .webhooks
        .set_enabled(&name, enabled)
        .await
        .map_err(|e| ApiError::Unavailable(format!("the job store cannot be written now: {e}")))?;
    view.map(Json).ok_or_else(|| {
        let shown: String = name.chars().take(64).collect();
        ApiError::NotFound(format!("name: no [[webhook]] named {shown:?}"))
    })
}

/// The body of `PUT /v1/admin/webhooks/{name}`: `{"enabled": true|false}` and nothing else; errors name
/// the field.
fn parse_enabled_body(body: &[u8]) -> ApiResult<bool> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("body: not JSON ({e})")))?;
    let serde_json::Value::Object(fields) = value else {
        return Err(ApiError::bad_field(
            "body",
            "must be a JSON object, e.g. {\"enabled\": true}",
        ));
    };
    if let Some(unknown) = fields.keys().find(|key| key.as_str() != "enabled") {
        let shown: String = unknown.chars().take(64).collect();
        return Err(ApiError::BadRequest(format!(
            "{shown}: unknown field; only enabled can be set"
        )));
    }
    match fields.get("enabled") {
        Some(serde_json::Value::Bool(enabled)) => Ok(*enabled),
        Some(_) => Err(ApiError::bad_field("enabled", "must be true or false")),
        None => Err(ApiError::bad_field("enabled", "is required (true or false)")),
    }
}

/// `POST /v1/admin/webhooks/dead/{id}/replay`: a dead-lettered delivery back in the queue, due now,
/// with fresh attempts. 404 when no dead delivery has that id.
pub async fn replay_webhook_delivery(
    State(state): State<Rankings>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    if id.is_empty() || id.len() > 128 {
        return Err(ApiError::bad_field("id", "must be 1 to 128 bytes"));
    }
    let replayed = state
        .webhooks
        .replay_dead(&id)
        .await
        .map_err(|e| ApiError::Unavailable(format!("the job store cannot be written now: {e}")))?;
    if replayed {
        Ok(StatusCode::ACCEPTED)
    } else {
        Err(ApiError::NotFound(format!("id: no dead webhook delivery {id:?}")))
    }
}
