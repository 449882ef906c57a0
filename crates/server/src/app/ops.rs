//! Operations endpoints: `/healthz`, `/readyz`, `/metrics`, `/openapi.json` and the live dashboard.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse};
use axum::Json;
use serde_json::json;

use super::AppState;

/// Liveness: the process answers.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: serving state is loaded and the writer accepts work; with Redis serving, also its state.
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.rankings.barrier().await {
        Ok(()) => {
            let mut body = json!({ "status": "ready" });
            // Stale serving is still ready: reads answer from memory, marked `stale: true`.
            if let Some(serving) = state.rankings.service.serving() {
                body["serving"] = serving.status();
            }
            // Ready without an assignment too: reads are served, and a group may have more members than
            // partitions. `kafka.assigned` says whether this one consumes.
            if let Some(kafka) = &state.rankings.kafka {
                body["kafka"] = kafka.to_json();
            }
            (StatusCode::OK, Json(body))
        }
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "unavailable", "error": error.to_string() })),
        ),
    }
}

/// Prometheus text exposition.
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let (engine_products, as_of) = {
        let engine = state.rankings.service.engine().read();
        (engine.product_count(), engine.as_of_millis())
    };
    metrics::gauge!("rankgate_products").set(engine_products as f64);
    if let Some(as_of) = as_of {
        // Age of the newest ingest the served rankings include: ingest is applied before it is
        // acknowledged, so this is the time since the last batch, not a processing backlog.
        let lag = (state.clock.now_millis() - as_of).max(0) as f64 / 1000.0;
        metrics::gauge!("rankgate_freshness_lag_seconds").set(lag);
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.prometheus.render(),
    )
}

/// The OpenAPI 3.1 document of the HTTP API.
pub async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("../../openapi.json"),
    )
}

/// A live dashboard: bars of the current top lists and the waiting rooms, refreshed every second.
pub async fn dashboard() -> Html<&'static str> {
    Html(include_str!("../../dashboard.html"))
}
