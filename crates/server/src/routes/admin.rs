//! Admin API for rankers (SPEC 1.3) and rebuilds (SPEC 1.7). Behind the admin bearer keys.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use rankgate_core::policy::PolicyError;
use rankgate_core::ranker::{PopularWeights, RankerName};

use crate::app::AppState;
use crate::error::{ApiError, ApiResult};
use crate::rankings::PolicyChangeError;

fn parse_ranker(name: &str) -> ApiResult<RankerName> {
    RankerName::parse(name).map_err(|e| ApiError::NotFound(e.to_string()))
}

fn weights_json(weights: &PopularWeights) -> Value {
    json!({
        "weights": { "view": weights.view, "like": weights.like, "sales": weights.sales },
        "carryRatio": weights.carry_ratio,
        "carryTopN": weights.carry_top_n,
    })
}

fn ranker_json(state: &AppState, ranker: RankerName) -> Value {
    if ranker != RankerName::Popular {
        return json!({
            "ranker": ranker.as_str(), "activeVersion": 1, "previousVersion": null, "building": null,
            "weights": null, "formula": if ranker == RankerName::Units { "units" } else { "sales" },
        });
    }
    // The state shared by every instance (SPEC 1.3), as this instance last read or stored it.
    let popular = state.rankings.popular_state();
    let mut body = json!({
        "ranker": "popular",
        "activeVersion": popular.active.version,
        "previousVersion": popular.previous.map(|p| p.version),
        "building": popular.building.map(|p| p.version),
    });
    if let (Value::Object(body), Value::Object(weights)) = (&mut body, weights_json(&popular.active.weights))
    {
        body.extend(weights);
    }
    body
}

/// `GET /v1/admin/rankers/{name}`
pub async fn get_ranker(State(state): State<AppState>, Path(name): Path<String>) -> ApiResult<Json<Value>> {
    let ranker = parse_ranker(&name)?;
    Ok(Json(ranker_json(&state, ranker)))
}

/// The body of `PUT /v1/admin/rankers/popular`. Missing fields keep their current values.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PutRanker {
    weights: Option<WeightsBody>,
    carry_ratio: Option<f64>,
    carry_top_n: Option<u32>,
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
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let ranker = parse_ranker(&name)?;
    if ranker != RankerName::Popular {
        return Err(ApiError::bad_field(
            "ranker",
            format!("`{ranker}` has no weights; only popular can be changed"),
        ));
    }
    let body: PutRanker =
        serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(format!("body: {e}")))?;
    let current = state.rankings.popular_state().active.weights;
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
    };
    weights
        .validate()
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let version = state
        .rankings
        .change_popular_weights(weights)
        .await
        .map_err(policy_change_error)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "ranker": "popular", "policyVersion": version, "status": "building" })),
    ))
}

/// `POST /v1/admin/rankers/{name}/rollback`: back to the previous version.
pub async fn rollback_ranker(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let ranker = parse_ranker(&name)?;
    if ranker != RankerName::Popular {
        return Err(ApiError::Conflict(format!(
            "`{ranker}` has a single version; nothing to roll back to"
        )));
    }
    state
        .rankings
        .rollback_popular()
        .await
        .map_err(policy_change_error)?;
    Ok(Json(ranker_json(&state, ranker)))
}

/// A transition the version rules refuse is a 409 naming why; a failure to store it is a 500.
fn policy_change_error(error: PolicyChangeError) -> ApiError {
    match error {
        PolicyChangeError::Refused(PolicyError::NoPrevious) => {
            ApiError::Conflict("popular has no previous version to roll back to".into())
        }
        PolicyChangeError::Refused(refused) => ApiError::Conflict(format!("popular: {refused}")),
        PolicyChangeError::Failed(error) => error.into(),
    }
}

/// `POST /v1/admin/rebuild`: recompute every served ranking from the source of truth and switch.
pub async fn rebuild(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let version = state.rankings.rebuild().await?;
    Ok(Json(json!({ "status": "rebuilt", "policyVersion": version })))
}
