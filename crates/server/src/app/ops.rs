//! Operations endpoints: `/healthz`, `/metrics` and `/openapi.json` (`/readyz` is [`super::readiness`], the
//! dashboard [`super::dashboard`]).

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;

use super::AppState;

/// The body of `/healthz`.
#[derive(Debug, Serialize)]
pub struct Health {
    /// Always `ok`: the process answers.
    pub status: &'static str,
}

/// Liveness: the process answers.
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Prometheus text exposition (the series are listed in `telemetry::catalogue`).
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    crate::telemetry::refresh_process_series();
    let (engine_products, as_of) = {
        let engine = state.rankings.service.engine().read();
        (engine.product_count(), engine.as_of_millis())
    };
    metrics::gauge!("rankgate_products").set(engine_products as f64);
    // Sets `rankgate_serving_stale` by the same rule reads and `/readyz` follow.
    let _ = state.rankings.serving_status();
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
