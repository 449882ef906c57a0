//! Operations endpoints: `/healthz`, `/readyz`, `/metrics` and `/openapi.json` (the dashboard is `dashboard`).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;

use super::AppState;
use crate::rankings::ingest::kafka::status::KafkaView;
use crate::rankings::serving::ServingStatus;

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

/// The body of `/readyz`.
#[derive(Debug, Serialize)]
pub struct Readiness {
    /// `ready` or `unavailable`.
    pub status: &'static str,
    /// Why not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Redis serving, when configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<ServingStatus>,
    /// The Kafka consumer, when configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka: Option<KafkaView>,
}

/// Readiness: serving state is loaded and the writer accepts work; with Redis serving, also its state.
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.rankings.barrier().await {
        Ok(()) => {
            let body = Readiness {
                status: "ready",
                error: None,
                // Stale serving is still ready: reads answer from memory, marked `stale: true`.
                serving: state.rankings.serving_status(),
                // Ready without an assignment too: reads are served, and a group may have more members
                // than partitions. `kafka.assigned` says whether this one consumes.
                kafka: state.rankings.kafka.as_ref().map(|kafka| kafka.view()),
            };
            (StatusCode::OK, Json(body))
        }
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Readiness {
                status: "unavailable",
                error: Some(error.to_string()),
                serving: None,
                kafka: None,
            }),
        ),
    }
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
