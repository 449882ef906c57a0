//! `GET /readyz` (issue 30): every dependency's state, and 503 while this instance cannot take writes.
//! The states come from real outcomes (see [`crate::readiness`]): the rankings writer's commits, and the
//! probe loop here, which asks the source of truth and the queue store every
//! [`PROBE_EVERY`](crate::readiness::PROBE_EVERY) and reads serving's staleness and the Kafka consumer's
//! connection, so a quiet instance notices an outage and its end too.
//!
//! `/healthz` stays liveness only (the process answers). A load balancer routes writes on `/readyz`
//! (503: take this instance out of the write pool) and restarts on `/healthz`; a pool that only reads may
//! route on `/healthz`, since reads answer from memory whatever the source of truth does.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::AppState;
use crate::rankings::ingest::kafka::status::KafkaView;
use crate::rankings::serving::{ServingStatus, StaleReason};
use crate::readiness::{DependencyHealth, DependencyState, DependencyView, PROBE_EVERY};

/// The dependencies this module tracks itself (the source of truth's health lives with its writer, the
/// Kafka consumer's with the consumer).
#[derive(Debug)]
pub struct Dependencies {
    /// The waiting room's store: `QueueStore::ping` at every probe.
    pub queue_store: DependencyHealth,
    /// Rankings serving: the engine in process (always up) or Redis (its staleness rule).
    pub serving: DependencyHealth,
}

impl Dependencies {
    /// The dependencies of a service whose queue store is `queue_store_kind` and whose serving store is
    /// `serving_kind`.
    pub fn new(queue_store_kind: &'static str, serving_kind: &'static str) -> Dependencies {
        Dependencies {
            queue_store: DependencyHealth::new(queue_store_kind),
            serving: DependencyHealth::new(serving_kind),
        }
    }
}

/// The body of `/readyz`.
#[derive(Debug, Serialize)]
pub struct Readiness {
    /// `ready` (200: writes are taken; some dependency may still be degraded, see `dependencies`) or
    /// `unavailable` (503: the source of truth cannot take writes).
    pub status: &'static str,
    /// Why not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every dependency with its state, since when, and its last error.
    pub dependencies: DependencyViews,
    /// Redis serving, when configured (also under `dependencies.serving`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<ServingStatus>,
    /// The Kafka consumer, when configured (also under `dependencies.kafka`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka: Option<KafkaView>,
}

/// `dependencies` of `/readyz`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DependencyViews {
    /// SQLite or PostgreSQL: what ingest commits to. Down means no writes: 503.
    pub source_of_truth: DependencyView,
    /// The engine in process, or Redis: `degraded` while reads are answered stale from memory.
    pub serving: DependencyView,
    /// The waiting room's store, embedded or Redis. Down is reported, not a 503 (see the module doc of
    /// [`crate::readiness`]).
    pub queue_store: DependencyView,
    /// The Kafka consumer, with `--kafka`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka: Option<DependencyView>,
}

/// Readiness: 200 while the source of truth takes writes, 503 (with `Retry-After`) otherwise; the body
/// reports every dependency either way.
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    // Stale serving is still ready: reads answer from memory, marked `stale: true`.
    let serving = state.rankings.serving_status();
    observe_serving(&state.dependencies.serving, serving.as_ref());
    let source = &state.rankings.service.source_health;
    let source_view = source.view();
    let takes_writes = source.takes_writes();
    let body = Readiness {
        status: if takes_writes { "ready" } else { "unavailable" },
        error: (!takes_writes).then(|| {
            format!(
                "the source of truth ({}) cannot take writes: {}",
                source_view.kind,
                source_view.last_error.as_deref().unwrap_or("down")
            )
        }),
        dependencies: DependencyViews {
            source_of_truth: source_view,
            serving: state.dependencies.serving.view(),
            queue_store: state.dependencies.queue_store.view(),
            kafka: state.rankings.kafka.as_ref().map(|kafka| kafka.health.view()),
        },
        serving,
        // Ready without an assignment too: reads are served, and a group may have more members than
        // partitions. `kafka.assigned` says whether this one consumes.
        kafka: state.rankings.kafka.as_ref().map(|kafka| kafka.view()),
    };
    if takes_writes {
        (StatusCode::OK, Json(body)).into_response()
    } else {
        let retry_after = PROBE_EVERY.as_secs().max(1).to_string();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, retry_after)],
            Json(body),
        )
            .into_response()
    }
}

/// Serving's state by its staleness rule: stale is `degraded` (reads still answer, from memory).
fn observe_serving(health: &DependencyHealth, status: Option<&ServingStatus>) {
    let Some(status) = status else {
        return;
    };
    match status.stale_reason {
        None => health.set(DependencyState::Up, None),
        Some(reason) => {
            let why = match reason {
                StaleReason::NoPointer => "redis holds no published rankings (restarted empty or flushed?)",
                StaleReason::Unreachable => "redis unreachable: a read or poll failed",
                StaleReason::Lagging => "the served rankings lag this instance's newest ingest",
            };
            health.set(
                DependencyState::Degraded,
                Some(format!("reads answered stale from memory: {why}")),
            );
        }
    }
}

/// Probes every [`PROBE_EVERY`] until `shutdown`: the source of truth (on the writer thread), the queue
/// store, and serving's state.
pub fn spawn_probes(state: AppState, shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(PROBE_EVERY);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = interval.tick() => {}
            }
            let probes = async {
                tokio::join!(
                    state.rankings.service.probe_source_of_truth(),
                    probe_queue_store(&state),
                );
                observe_serving(
                    &state.dependencies.serving,
                    state.rankings.serving_status().as_ref(),
                );
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = probes => {}
            }
        }
    })
}

async fn probe_queue_store(state: &AppState) {
    let health = &state.dependencies.queue_store;
    let ping = tokio::time::timeout(crate::readiness::PROBE_TIMEOUT, state.waiting_room.queues.ping()).await;
    match ping {
        Ok(Ok(())) => health.set(DependencyState::Up, None),
        Ok(Err(error)) => health.set(
            DependencyState::Down,
            Some(scrub_redis(&state.config.redis, &error.to_string())),
        ),
        Err(_) => health.set(
            DependencyState::Down,
            Some(format!(
                "no answer within {} s",
                crate::readiness::PROBE_TIMEOUT.as_secs()
            )),
        ),
    }
}

/// `text` without the credentials of any of the Redis URLs.
fn scrub_redis(urls: &[String], text: &str) -> String {
    urls.iter().fold(text.to_string(), |text, url| {
        crate::readiness::scrub(&text, Some(url))
    })
}

/// The kinds of the two stores this module tracks, from the configured Redis URLs (several: a Cluster).
pub fn dependencies_of(redis: &[String]) -> Arc<Dependencies> {
    let redis_kind = if redis.is_empty() {
        None
    } else if redis.len() > 1 {
        Some("redis-cluster")
    } else {
        Some("redis")
    };
    Arc::new(Dependencies::new(
        redis_kind.unwrap_or("embedded"),
        redis_kind.unwrap_or("embedded"),
    ))
}
