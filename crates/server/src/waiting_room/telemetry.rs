//! Waiting-room metrics, through the `metrics` facade (exported by the Prometheus recorder at `/metrics`).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `rankgate_queue_waiting` | gauge | queue |
//! | `rankgate_queue_oldest_wait_seconds` | gauge | queue |
//! | `rankgate_queue_ready`, `rankgate_queue_claimed` | gauge | queue |
//! | `rankgate_queue_admitted_per_second` | gauge (measured moving average) | queue |
//! | `rankgate_queue_entered_total` | counter | queue |
//! | `rankgate_queue_admitted_total` | counter | queue |
//! | `rankgate_queue_tokens_total` | counter | queue, outcome = issued, expired, claimed, consumed, released, claim_expired |
//! | `rankgate_gate_requests_total` | counter | queue, outcome |
//! | `rankgate_queue_effective_admit_per_second` | gauge (the rate the budget spends; the controller's in adaptive mode) | queue |
//! | `rankgate_gate_upstream_p95_seconds`, `rankgate_gate_upstream_error_rate`, `rankgate_gate_upstream_samples` | gauge (last closed control interval, all instances) | queue |
//! | `rankgate_queue_poll_limited_total` | counter (429s) | queue |
//! | `rankgate_queue_entries_refused_total` | counter (entries refused before they made a member) | queue, reason = challenge, address, captcha |
//! | `rankgate_queue_admission_step_seconds` | histogram | queue |
//! | `rankgate_queue_redis_script_calls_total`, `rankgate_queue_redis_requests_total` | counter (Redis backend: entries and polls coalesced into script calls) | lane = enter, poll |
//!
//! # Bounded series (defect 4)
//! Series carry the queue's name, and anyone can name a queue, so the number of series is bounded three
//! ways: at most `max_queues` queues exist at once; gauges are refreshed only for active queues (and
//! zeroed when a queue goes idle, is deleted or forgotten); and the exporter drops every series not
//! updated for [`SERIES_IDLE_TIMEOUT`], so the series of a queue that is gone disappear from `/metrics`
//! (a rarely moving counter then restarts from 0 when it next moves, which Prometheus reads as a reset).

use rankgate_core::queue::{QueueName, RefusalReason};
use rankgate_store::queue::Coalescing;
use rankgate_store::queue::{AdmitOutcome, QueueStats};

/// Series not updated for this long are dropped by the exporter (wired in `telemetry::prometheus_handle`).
pub const SERIES_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15 * 60);

pub(crate) fn entered(queue: &QueueName) {
    metrics::counter!("rankgate_queue_entered_total", "queue" => queue.to_string()).increment(1);
}

pub(crate) fn token_event(queue: &QueueName, outcome: &'static str, count: u64) {
    if count > 0 {
        metrics::counter!("rankgate_queue_tokens_total", "queue" => queue.to_string(), "outcome" => outcome)
            .increment(count);
    }
}

/// An admin removed a member (`DELETE /v1/admin/queues/{queue}/members/{memberId}`).
pub(crate) fn member_removed(queue: &QueueName) {
    metrics::counter!("rankgate_queue_members_removed_total", "queue" => queue.to_string()).increment(1);
}

/// An entry refused before it made a member (SPEC 2.2, "Per-address budgets").
pub(crate) fn entry_refused(queue: &QueueName, reason: RefusalReason) {
    metrics::counter!("rankgate_queue_entries_refused_total", "queue" => queue.to_string(), "reason" => reason.as_str())
        .increment(1);
}

pub(crate) fn poll_limited(queue: &QueueName) {
    metrics::counter!("rankgate_queue_poll_limited_total", "queue" => queue.to_string()).increment(1);
}

pub(crate) fn gate_outcome(queue: &QueueName, outcome: &'static str) {
    metrics::counter!("rankgate_gate_requests_total", "queue" => queue.to_string(), "outcome" => outcome)
        .increment(1);
}

pub(crate) fn admission_step(queue: &QueueName, outcome: &AdmitOutcome, took: std::time::Duration) {
    let admitted = outcome.admitted.len() as u64;
    metrics::counter!("rankgate_queue_admitted_total", "queue" => queue.to_string()).increment(admitted);
    token_event(queue, "issued", admitted);
    token_event(queue, "expired", outcome.tokens_expired);
    token_event(queue, "claim_expired", outcome.claims_expired);
    metrics::gauge!("rankgate_queue_waiting", "queue" => queue.to_string()).set(outcome.waiting as f64);
    metrics::histogram!("rankgate_queue_admission_step_seconds", "queue" => queue.to_string())
        .record(took.as_secs_f64());
}

pub(crate) fn queue_gauges(queue: &QueueName, stats: &QueueStats) {
    let name = queue.to_string();
    metrics::gauge!("rankgate_queue_waiting", "queue" => name.clone()).set(stats.waiting as f64);
    metrics::gauge!("rankgate_queue_oldest_wait_seconds", "queue" => name.clone())
        .set(stats.oldest_wait_seconds as f64);
    metrics::gauge!("rankgate_queue_ready", "queue" => name.clone()).set(stats.ready as f64);
    metrics::gauge!("rankgate_queue_claimed", "queue" => name.clone()).set(stats.claimed as f64);
    metrics::gauge!("rankgate_queue_admitted_per_second", "queue" => name.clone())
        .set(stats.measured_rate.unwrap_or(0.0));
    // The store's own total (shared by every instance), so `absolute`, not an increment per instance.
    metrics::counter!("rankgate_queue_abandoned_total", "queue" => name).absolute(stats.abandoned);
}

/// The last closed control interval of a gated queue (adaptive admission, issue 12).
pub(crate) fn upstream_gauges(queue: &QueueName, summary: &rankgate_core::queue::adaptive::IntervalSummary) {
    let name = queue.to_string();
    metrics::gauge!("rankgate_queue_effective_admit_per_second", "queue" => name.clone())
        .set(summary.effective_admit_per_second);
    metrics::gauge!("rankgate_gate_upstream_p95_seconds", "queue" => name.clone())
        .set(summary.p95_millis.unwrap_or(0.0) / 1000.0);
    metrics::gauge!("rankgate_gate_upstream_error_rate", "queue" => name.clone())
        .set(summary.error_rate.unwrap_or(0.0));
    metrics::gauge!("rankgate_gate_upstream_samples", "queue" => name).set(summary.samples as f64);
}

/// A queue that went idle, or is gone: its gauges read 0 (and, left alone, age out of the exporter).
pub(crate) fn queue_gone(queue: &QueueName) {
    let name = queue.to_string();
    for gauge in [
        "rankgate_queue_waiting",
        "rankgate_queue_oldest_wait_seconds",
        "rankgate_queue_ready",
        "rankgate_queue_claimed",
        "rankgate_queue_admitted_per_second",
    ] {
        metrics::gauge!(gauge, "queue" => name.clone()).set(0.0);
    }
}

/// The Redis hot path's coalescing so far: requests per script call is the average batch.
pub(crate) fn hot_path_coalescing(c: Coalescing) {
    for (lane, calls, requests) in [
        ("enter", c.entry_calls, c.entries),
        ("poll", c.poll_calls, c.polls),
    ] {
        metrics::counter!("rankgate_queue_redis_script_calls_total", "lane" => lane).absolute(calls);
        metrics::counter!("rankgate_queue_redis_requests_total", "lane" => lane).absolute(requests);
    }
}
