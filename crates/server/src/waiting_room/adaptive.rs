//! Adaptive admission on the service side (issue 12): the gate's measurements → the shared observation
//! store → the controller → the queue's rate → the store's atomic admission budget.
//!
//! 1. **Measure.** The gate ([`super::gate`]) times every forwarded order and classifies its outcome
//!    (2xx, 5xx, other, timeout, transport error); [`WaitingRoom::record_upstream`] adds it to this
//!    instance's sums for the current control interval (a mutex and an array add, no IO on the order path).
//! 2. **Share.** Each control round ([`WaitingRoom::run_adaptive_control`], every quarter interval) flushes
//!    the sums of intervals that have ended into the [`UpstreamObservationStore`] (Redis: one script per
//!    queue and interval; embedded: in process), so every instance's orders count.
//! 3. **Decide, once.** Half an interval after an interval ends (the grace for other instances' flushes),
//!    instances try to close it; the store hands the fleet's sum to exactly one of them, which runs the
//!    AIMD step ([`decide_next_rate`]) on it and, in adaptive mode, writes the new rate as the queue's
//!    `admitPerSecond` through the ordinary settings update.
//! 4. **Admit.** Every instance's scheduler keeps running the same atomic, global admission step, which
//!    spends the budget at the queue's rate: the controller never admits anybody itself, so the global
//!    bound of SPEC 2.3 holds unchanged, now at the controller's rate.
//!
//! An interval with too few orders to judge (`adaptive_min_samples`) is carried into the next one, so a
//! queue at a low rate is judged over several intervals rather than held forever.
//!
//! The summary of each closed interval (samples, p95, error rate, decision, rate) is kept in the store for
//! every instance's admin view and `/metrics`.
//!
//! Interval indices come from the room's clock (`now_ms / interval`); instances whose clocks disagree by
//! less than the grace (half an interval) still add to the same interval. Tests drive rounds with a
//! manual clock.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rankgate_core::queue::adaptive::{decide_next_rate, ControlDecision, IntervalSummary};
use rankgate_core::queue::{QueueName, SettingsPatch, UpstreamOutcome, UpstreamSamples};
use rankgate_store::queue::{InMemoryUpstreamObservations, UpstreamObservationStore};

use super::service::WaitingRoom;
use super::telemetry;

/// Allowed `adaptive_interval_millis`: shorter than 100 ms gives too few orders per interval to judge; a
/// control interval above a minute reacts too late for a sale.
pub const ADAPTIVE_INTERVAL_MILLIS: std::ops::RangeInclusive<u64> = 100..=60_000;
/// Allowed `adaptive_min_samples`.
pub const ADAPTIVE_MIN_SAMPLES: std::ops::RangeInclusive<u64> = 1..=100_000;

/// Unflushed intervals kept per queue.
const MAX_PENDING_INTERVALS: usize = 8;

/// This instance's part of adaptive admission: its unflushed measurements and where they go.
pub(crate) struct AdaptiveControl {
    /// Where every instance's samples are summed (Redis when the room runs on Redis).
    store: Arc<dyn UpstreamObservationStore>,
    /// Control interval (ms).
    interval_ms: i64,
    /// Fewer samples than this in an interval: the controller holds the rate.
    min_samples: u64,
    /// queue → interval → samples not yet flushed. Bounded: only `[[gate]]` queues are measured, and a
    /// round flushes every ended interval.
    pending: Mutex<HashMap<QueueName, BTreeMap<i64, UpstreamSamples>>>,
    /// queue → the last interval this instance tried to close, so a round does not ask twice.
    last_close_attempt: Mutex<HashMap<QueueName, i64>>,
    /// The queues a gate forwards for (from the config): the ones whose intervals this instance closes.
    gated_queues: Vec<QueueName>,
}

impl AdaptiveControl {
    pub(crate) fn new(interval_ms: u64, min_samples: u64, gated_queues: Vec<QueueName>) -> Self {
        let mut gated_queues = gated_queues;
        gated_queues.sort();
        gated_queues.dedup();
        AdaptiveControl {
            store: Arc::new(InMemoryUpstreamObservations::new()),
            interval_ms: interval_ms.max(1) as i64,
            min_samples,
            pending: Mutex::new(HashMap::new()),
            last_close_attempt: Mutex::new(HashMap::new()),
            gated_queues,
        }
    }

    /// Uses `store` (shared by every instance) instead of this process's memory.
    pub(crate) fn use_store(&mut self, store: Arc<dyn UpstreamObservationStore>) {
        self.store = store;
    }

    /// How often the control round runs: four times an interval, so flushes land well inside the grace.
    pub(crate) fn round_every(&self) -> Duration {
        Duration::from_millis((self.interval_ms / 4).max(1) as u64)
    }
}

/// The outcome class of a forwarded order, from the upstream's status (or the lack of one).
pub(crate) fn outcome_of_status(status: axum::http::StatusCode) -> UpstreamOutcome {
    if status.is_success() {
        UpstreamOutcome::Success
    } else if status.is_server_error() {
        UpstreamOutcome::ServerError
    } else {
        UpstreamOutcome::OtherStatus
    }
}

impl WaitingRoom {
    /// Records one forwarded order of `queue`'s gate: how long the upstream took and how it ended.
    pub(crate) fn record_upstream(&self, queue: &QueueName, outcome: UpstreamOutcome, took: Duration) {
        let interval = self.clock.now_millis().div_euclid(self.adaptive.interval_ms);
        let mut pending = self.adaptive.pending.lock();
        let intervals = pending.entry(queue.clone()).or_default();
        intervals
            .entry(interval)
            .or_default()
            .record(outcome, took.as_secs_f64() * 1000.0);
        // Bounded even when no control round runs (a room without workers): old intervals could no
        // longer be closed in time anyway.
        while intervals.len() > MAX_PENDING_INTERVALS {
            intervals.pop_first();
        }
    }

    /// One control round on this instance: flushes the measurements of ended intervals to the shared
    /// store, then closes the last interval past its grace for every gated queue and, for the intervals
    /// this instance was handed, runs the controller. Returns what it decided (tests read it).
    pub async fn run_adaptive_control(&self) -> anyhow::Result<Vec<(QueueName, IntervalSummary)>> {
        let control = &self.adaptive;
        let now = self.clock.now_millis();
        let current = now.div_euclid(control.interval_ms);
        self.flush_upstream_samples(current).await?;

        // The last interval whose end is at least half an interval ago.
        let closable = (now - control.interval_ms / 2).div_euclid(control.interval_ms) - 1;
        let mut decided = Vec::new();
        for queue in &control.gated_queues {
            {
                let mut attempts = control.last_close_attempt.lock();
                if attempts.get(queue).is_some_and(|last| *last >= closable) {
                    continue;
                }
                attempts.insert(queue.clone(), closable);
            }
            let Some(samples) = control.store.close_interval(queue, closable).await? else {
                continue;
            };
            if let Some(summary) = self.control_one_interval(queue, closable, &samples).await? {
                decided.push((queue.clone(), summary));
            }
        }
        Ok(decided)
    }

    /// Sends every interval before `current` to the shared store.
    async fn flush_upstream_samples(&self, current: i64) -> anyhow::Result<()> {
        let ended: Vec<(QueueName, i64, UpstreamSamples)> = {
            let mut pending = self.adaptive.pending.lock();
            let mut ended = Vec::new();
            for (queue, intervals) in pending.iter_mut() {
                let still_open = intervals.split_off(&current);
                for (interval, samples) in std::mem::replace(intervals, still_open) {
                    ended.push((queue.clone(), interval, samples));
                }
            }
            pending.retain(|_, intervals| !intervals.is_empty());
            ended
        };
        for (queue, interval, samples) in ended {
            self.adaptive
                .store
                .add_samples(&queue, interval, &samples)
                .await?;
        }
        Ok(())
    }

    /// The controller's step for one closed interval: in adaptive mode the rate moves; in fixed mode the
    /// interval is only summarised (the admin view shows the upstream either way).
    async fn control_one_interval(
        &self,
        queue: &QueueName,
        interval: i64,
        samples: &UpstreamSamples,
    ) -> anyhow::Result<Option<IntervalSummary>> {
        let Some(settings) = self.queues.settings(queue).await? else {
            return Ok(None);
        };
        let summary = if settings.adaptive.is_adaptive() {
            let step = decide_next_rate(
                &settings.adaptive,
                settings.admit_per_second,
                samples,
                self.adaptive.min_samples,
            );
            if step.next_rate != settings.admit_per_second {
                let patch = SettingsPatch {
                    admit_per_second: Some(step.next_rate),
                    ..SettingsPatch::default()
                };
                if let Err(error) = self.queues.update_settings(queue, &patch).await? {
                    // The admin changed the bounds or the tick meanwhile; the next interval decides again.
                    tracing::warn!(queue = %queue, error = %error, "adaptive rate not applied");
                }
            }
            if step.decision == ControlDecision::Hold && !samples.is_empty() {
                // Too few to judge: carried into the next interval, so at a low rate the controller
                // judges over several intervals instead of holding forever.
                self.adaptive
                    .store
                    .add_samples(queue, interval + 1, samples)
                    .await?;
            }
            tracing::debug!(queue = %queue, interval, decision = ?step.decision, rate = step.next_rate,
                samples = samples.count(), "adaptive admission step");
            IntervalSummary::of(interval, samples, Some(step.decision), step.next_rate)
        } else {
            IntervalSummary::of(interval, samples, None, settings.admit_per_second)
        };
        self.adaptive.store.publish_summary(queue, &summary).await?;
        telemetry::upstream_gauges(queue, &summary);
        Ok(Some(summary))
    }

    /// The last closed interval's summary for `queue` (any instance's), for the admin view and gauges.
    pub(crate) async fn last_upstream_summary(
        &self,
        queue: &QueueName,
    ) -> anyhow::Result<Option<IntervalSummary>> {
        Ok(self.adaptive.store.last_summary(queue).await?)
    }

    /// Refreshes the upstream gauges of every gated queue from the shared summaries, so every instance's
    /// `/metrics` shows the fleet's values, not only the instance that ran the controller.
    pub(crate) async fn publish_upstream_gauges(&self) -> anyhow::Result<()> {
        for queue in &self.adaptive.gated_queues {
            if let Some(summary) = self.last_upstream_summary(queue).await? {
                telemetry::upstream_gauges(queue, &summary);
            }
        }
        Ok(())
    }
}
