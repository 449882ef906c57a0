//! The rankings' background loops: the refresher (pending changes applied well inside the freshness
//! bound, the engine moved to the clock's hour), the follower of other instances (with a shared
//! PostgreSQL source of truth) and retention. [`super::Rankings::spawn_workers`] starts them.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use rankgate_core::period::Hour;
use rankgate_store::ranking::engine::RankingEngine;
use rankgate_store::ranking::redis_serving::is_hot;

use super::Rankings;

/// How long a hot span may go unused before a Redis-serving instance's engine drops it.
const IDLE_HOT_SPAN: Duration = Duration::from_secs(10);

/// Applies pending changes to every cached ranking well inside the freshness bound, so most reads find
/// their span clean and need only the shared lock. Also moves the engine to the clock's hour: when the
/// hour turns, the running periods' spans (whose `trending` end hour moved) are dropped and built again
/// here, in steps, so reads rarely have to wait for one.
pub(super) async fn run_refresher_until_stopped(rankings: Rankings, shutdown: CancellationToken) {
    let period = Duration::from_millis((rankings.config.freshness_millis / 4).max(10));
    let mut ticker = tokio::time::interval(period);
    // With Redis serving, hot spans nobody used for ten seconds are dropped (see below).
    let mut idle_check = tokio::time::Instant::now() + IDLE_HOT_SPAN;
    let mut idle_mark = rankings.service.engine().read().use_mark();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let engine = rankings.service.engine().clone();
        let now = Hour::from_millis(rankings.clock.now_millis());
        // Redis answers hot reads once it holds the span; a hot span this engine answered before that (or
        // that the publisher no longer follows) would be flushed here every tick for nobody.
        let evict_idle_before = match rankings.service.serving() {
            Some(_) if tokio::time::Instant::now() >= idle_check => {
                idle_check = tokio::time::Instant::now() + IDLE_HOT_SPAN;
                let mark = idle_mark;
                idle_mark = engine.read().use_mark();
                Some((mark, rankings.config.zone.clone()))
            }
            _ => None,
        };
        let _ = tokio::task::spawn_blocking(move || {
            let dropped = engine.write().advance_to_hour(now);
            for query in &dropped {
                RankingEngine::build_span_in_steps(&engine, query);
            }
            if let Some((mark, zone)) = evict_idle_before {
                let evicted = engine
                    .write()
                    .evict_spans_unused_since(mark, |span| is_hot(span, now, &zone));
                if evicted > 0 {
                    tracing::debug!(
                        evicted,
                        "hot spans unused for ten seconds dropped from the engine"
                    );
                }
            }
            engine.write().flush_all();
        })
        .await;
    }
}

/// With a shared source of truth (PostgreSQL), applies what other instances committed, well inside the
/// freshness bound, so reads from every instance agree.
pub(super) async fn run_follower_until_stopped(rankings: Rankings, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(Duration::from_millis(
        (rankings.config.freshness_millis / 4).max(10),
    ));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        match rankings.service.writer().run(|ingestor| ingestor.follow()).await {
            // Metrics and listing flags are applied by `follow`; a newer policy state wakes the policy
            // driver, and catalogue entries replace the served ones.
            Ok(Ok(followed)) => {
                rankings.service.observe_policies(&followed.policies);
                rankings.service.observe_catalog(&followed.catalog);
            }
            Ok(Err(error)) => tracing::warn!(error = %error, "following other instances failed; will retry"),
            Err(error) => tracing::warn!(error = format!("{error:#}"), "the writer has stopped"),
        }
    }
}

/// Applies retention once a minute, relative to the watermark.
pub(super) async fn run_retention_until_stopped(rankings: Rankings, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        match rankings
            .service
            .apply_retention(
                rankings.config.event_retention_millis,
                rankings.config.metric_retention_millis,
                rankings.clock.now_millis(),
            )
            .await
        {
            Ok(0) => {}
            Ok(forgotten) => tracing::info!(forgotten, "retention dropped old raw events"),
            Err(error) => tracing::warn!(error = format!("{error:#}"), "retention failed; will retry"),
        }
    }
}
