//! Adaptive admission (issue 12): the admission rate follows the order service instead of a constant.
//!
//! In `adaptive` mode a queue's `admitPerSecond` is no longer the admin's number but the controller's: it
//! moves inside `[minAdmitPerSecond, maxAdmitPerSecond]` so that the upstream's p95 latency stays under
//! `targetP95Millis` and its error rate under `maxErrorRate`. The gate measures every forwarded order
//! ([`UpstreamSamples`]: a latency histogram and outcome counts), the samples of every instance are summed
//! per control interval, and once per interval one instance runs [`decide_next_rate`] on the sum and writes
//! the result as the queue's rate, which the store's atomic admission step (the global budget) then spends.
//!
//! # The controller: AIMD
//! Additive increase, multiplicative decrease, as TCP congestion control and Netflix's concurrency-limits
//! `AIMDLimit` do. Per closed interval:
//! - fewer than `min_samples` forwarded orders: **hold** (a p95 of three requests is noise);
//! - p95 latency above the target, or error rate above the threshold: **back off**,
//!   `rate ← max(min, rate × 0.7)`;
//! - otherwise: **increase**, `rate ← min(max, rate + (max − min) / 20)`, so a queue climbs from its
//!   minimum to its maximum in twenty healthy intervals, and halves in two unhealthy ones.
//!
//! Multiplicative decrease is what lets several queues (or a queue and the rest of the shop's traffic)
//! converge to a fair share of a saturated order service; the additive step keeps the probe gentle.
//!
//! # What counts as an error
//! A 5xx answer, a timeout and a transport error (refused, reset) are the upstream failing. A 4xx or 3xx
//! is the upstream answering on purpose (out of stock, a bad basket): counted, but not an error.
//!
//! # Latency histogram
//! Log-spaced buckets, four per doubling (each bucket's upper bound is 2^(i/4) ms, about 19 % apart), so
//! the p95 is reported as the upper bound of the bucket it falls in: never below the true value, at most
//! 19 % above. Histograms from several instances add bucket by bucket, which is why the p95 of the whole
//! fleet can be computed from per-instance counts (a per-instance p95 could not be averaged).

use serde::{Deserialize, Serialize};

/// Latency buckets: bucket `i` holds latencies up to 2^(i/4) ms; the last one holds everything above
/// 2^((BUCKETS − 2)/4) ms (about 4.6 minutes, longer than any gate timeout).
pub const LATENCY_BUCKETS: usize = 74;

/// Multiplicative decrease factor of one unhealthy interval.
pub const BACKOFF_FACTOR: f64 = 0.7;

/// The additive step is `(max − min) / INCREASE_STEPS`: healthy intervals from the minimum to the maximum.
pub const INCREASE_STEPS: f64 = 20.0;

/// How a queue chooses its admission rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdmissionMode {
    /// `admitPerSecond` as the admin set it (the default, and the behaviour before issue 12).
    #[default]
    Fixed,
    /// `admitPerSecond` set by the controller, inside `[minAdmitPerSecond, maxAdmitPerSecond]`.
    Adaptive,
}

impl AdmissionMode {
    /// The JSON spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionMode::Fixed => "fixed",
            AdmissionMode::Adaptive => "adaptive",
        }
    }
}

/// The adaptive-admission settings of a queue (flattened into `QueueSettings`' JSON).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AdaptiveSettings {
    /// `fixed` or `adaptive`.
    pub admission_mode: AdmissionMode,
    /// The controller never goes below this rate (members per second).
    pub min_admit_per_second: f64,
    /// The controller never goes above this rate (members per second).
    pub max_admit_per_second: f64,
    /// The upstream p95 latency to stay under, in milliseconds.
    pub target_p95_millis: u64,
    /// The upstream error rate to stay under (0.01 = 1 %).
    pub max_error_rate: f64,
}

impl Default for AdaptiveSettings {
    fn default() -> Self {
        AdaptiveSettings {
            admission_mode: AdmissionMode::Fixed,
            min_admit_per_second: 1.0,
            max_admit_per_second: 1000.0,
            target_p95_millis: 500,
            max_error_rate: 0.01,
        }
    }
}

impl AdaptiveSettings {
    /// Allowed `targetP95Millis`: a target below a millisecond cannot be measured by the histogram, and
    /// one above ten minutes is longer than any order service may take.
    pub const TARGET_P95_MILLIS: std::ops::RangeInclusive<u64> = 1..=600_000;

    /// Whether the controller owns the rate.
    #[must_use]
    pub fn is_adaptive(&self) -> bool {
        self.admission_mode == AdmissionMode::Adaptive
    }

    /// `rate` inside `[min, max]`.
    #[must_use]
    pub fn clamp_rate(&self, rate: f64) -> f64 {
        rate.clamp(self.min_admit_per_second, self.max_admit_per_second)
    }
}

/// How one forwarded order ended, as the gate saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamOutcome {
    /// A 2xx: the order committed.
    Success,
    /// A 5xx: the order service failed.
    ServerError,
    /// Any other status (3xx, 4xx): an answer on purpose, not a failure.
    OtherStatus,
    /// No answer within the gate's timeout.
    Timeout,
    /// Refused, reset or otherwise broken connection.
    TransportError,
}

/// One interval's measurements of an upstream: what the gate saw, summed over any number of instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamSamples {
    /// Latency histogram (see the module doc); `latency_buckets[i]` counts requests in bucket `i`.
    pub latency_buckets: Vec<u64>,
    /// 2xx answers.
    pub success: u64,
    /// 5xx answers.
    pub server_errors: u64,
    /// Other answers (3xx, 4xx).
    pub other_status: u64,
    /// Timeouts.
    pub timeouts: u64,
    /// Transport errors.
    pub transport_errors: u64,
}

impl Default for UpstreamSamples {
    fn default() -> Self {
        UpstreamSamples {
            latency_buckets: vec![0; LATENCY_BUCKETS],
            success: 0,
            server_errors: 0,
            other_status: 0,
            timeouts: 0,
            transport_errors: 0,
        }
    }
}

/// The histogram bucket of a latency.
#[must_use]
pub fn latency_bucket(millis: f64) -> usize {
    if millis.is_nan() || millis <= 1.0 {
        // NaN, negative and sub-millisecond latencies all land in the first bucket.
        return 0;
    }
    let index = (millis.log2() * 4.0).ceil();
    if index >= (LATENCY_BUCKETS - 1) as f64 {
        LATENCY_BUCKETS - 1
    } else {
        index as usize
    }
}

/// The upper bound of bucket `index`, in milliseconds (the last bucket reports its lower bound: it is
/// open-ended).
#[must_use]
pub fn bucket_upper_millis(index: usize) -> f64 {
    let index = index.min(LATENCY_BUCKETS - 2);
    2f64.powf(index as f64 / 4.0)
}

impl UpstreamSamples {
    /// Records one forwarded order.
    pub fn record(&mut self, outcome: UpstreamOutcome, latency_millis: f64) {
        if self.latency_buckets.len() != LATENCY_BUCKETS {
            self.latency_buckets.resize(LATENCY_BUCKETS, 0);
        }
        self.latency_buckets[latency_bucket(latency_millis)] += 1;
        let counter = match outcome {
            UpstreamOutcome::Success => &mut self.success,
            UpstreamOutcome::ServerError => &mut self.server_errors,
            UpstreamOutcome::OtherStatus => &mut self.other_status,
            UpstreamOutcome::Timeout => &mut self.timeouts,
            UpstreamOutcome::TransportError => &mut self.transport_errors,
        };
        *counter += 1;
    }

    /// Adds another instance's (or another moment's) samples.
    pub fn merge(&mut self, other: &UpstreamSamples) {
        if self.latency_buckets.len() < LATENCY_BUCKETS {
            self.latency_buckets.resize(LATENCY_BUCKETS, 0);
        }
        for (mine, theirs) in self.latency_buckets.iter_mut().zip(&other.latency_buckets) {
            *mine = mine.saturating_add(*theirs);
        }
        self.success = self.success.saturating_add(other.success);
        self.server_errors = self.server_errors.saturating_add(other.server_errors);
        self.other_status = self.other_status.saturating_add(other.other_status);
        self.timeouts = self.timeouts.saturating_add(other.timeouts);
        self.transport_errors = self.transport_errors.saturating_add(other.transport_errors);
    }

    /// Forwarded orders measured.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.success
            .saturating_add(self.server_errors)
            .saturating_add(self.other_status)
            .saturating_add(self.timeouts)
            .saturating_add(self.transport_errors)
    }

    /// Whether nothing was measured.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    /// 5xx, timeouts and transport errors.
    #[must_use]
    pub fn errors(&self) -> u64 {
        self.server_errors
            .saturating_add(self.timeouts)
            .saturating_add(self.transport_errors)
    }

    /// Errors over all measured orders; `None` when nothing was measured.
    #[must_use]
    pub fn error_rate(&self) -> Option<f64> {
        let count = self.count();
        (count > 0).then(|| self.errors() as f64 / count as f64)
    }

    /// The 95th-percentile latency (ms), as the upper bound of its bucket; `None` when nothing was measured.
    #[must_use]
    pub fn p95_millis(&self) -> Option<f64> {
        let total: u64 = self.latency_buckets.iter().sum();
        if total == 0 {
            return None;
        }
        // The smallest bucket with at least 95 % of the samples at or below it.
        let needed = (total as f64 * 0.95).ceil() as u64;
        let mut seen = 0u64;
        for (index, count) in self.latency_buckets.iter().enumerate() {
            seen += count;
            if seen >= needed {
                return Some(bucket_upper_millis(index));
            }
        }
        Some(bucket_upper_millis(LATENCY_BUCKETS - 1))
    }
}

/// What the controller did with one interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ControlDecision {
    /// Too few samples to judge: the rate stays.
    Hold,
    /// p95 latency above the target.
    BackOffLatency,
    /// Error rate above the threshold.
    BackOffErrors,
    /// Healthy: one additive step up (or already at the maximum).
    Increase,
}

/// One step of the controller: the decision and the rate that follows from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ControlStep {
    /// Why the rate moved (or did not).
    pub decision: ControlDecision,
    /// The new effective rate, inside `[min, max]`.
    pub next_rate: f64,
}

/// The AIMD step for one closed interval (see the module doc). `current_rate` outside `[min, max]` (the
/// bounds just changed) is clamped first, so the result is always inside them.
#[must_use]
pub fn decide_next_rate(
    settings: &AdaptiveSettings,
    current_rate: f64,
    samples: &UpstreamSamples,
    min_samples: u64,
) -> ControlStep {
    let current = if current_rate.is_finite() {
        settings.clamp_rate(current_rate)
    } else {
        settings.min_admit_per_second
    };
    if samples.count() < min_samples.max(1) {
        return ControlStep {
            decision: ControlDecision::Hold,
            next_rate: current,
        };
    }
    let errors_too_high = samples
        .error_rate()
        .is_some_and(|rate| rate > settings.max_error_rate);
    let latency_too_high = samples
        .p95_millis()
        .is_some_and(|p95| p95 > settings.target_p95_millis as f64);
    let (decision, next) = if errors_too_high {
        (ControlDecision::BackOffErrors, current * BACKOFF_FACTOR)
    } else if latency_too_high {
        (ControlDecision::BackOffLatency, current * BACKOFF_FACTOR)
    } else {
        let step = (settings.max_admit_per_second - settings.min_admit_per_second) / INCREASE_STEPS;
        (ControlDecision::Increase, current + step)
    };
    ControlStep {
        decision,
        next_rate: settings.clamp_rate(round_to_milli(next)),
    }
}

/// Rates are stored in milli-members per second (the budget's unit): rounding here keeps the rate the
/// controller reports equal to the one the budget spends.
fn round_to_milli(rate: f64) -> f64 {
    (rate * 1000.0).round() / 1000.0
}

/// What the admin view and `/metrics` show of the last closed interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IntervalSummary {
    /// Index of the interval (store-clock ms / interval length).
    pub interval: i64,
    /// Orders measured in it, over every instance.
    pub samples: u64,
    /// Their p95 latency (ms), `None` if none.
    pub p95_millis: Option<f64>,
    /// Their error rate, `None` if none.
    pub error_rate: Option<f64>,
    /// What the controller did (`None` for a queue in fixed mode: measured, not controlled).
    pub decision: Option<ControlDecision>,
    /// The rate after the interval.
    pub effective_admit_per_second: f64,
}

impl IntervalSummary {
    /// The summary of `samples` for `interval`.
    #[must_use]
    pub fn of(
        interval: i64,
        samples: &UpstreamSamples,
        decision: Option<ControlDecision>,
        rate: f64,
    ) -> Self {
        IntervalSummary {
            interval,
            samples: samples.count(),
            p95_millis: samples.p95_millis(),
            error_rate: samples.error_rate(),
            decision,
            effective_admit_per_second: rate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn adaptive(min: f64, max: f64) -> AdaptiveSettings {
        AdaptiveSettings {
            admission_mode: AdmissionMode::Adaptive,
            min_admit_per_second: min,
            max_admit_per_second: max,
            target_p95_millis: 200,
            max_error_rate: 0.05,
        }
    }

    fn samples(count: u64, latency: f64, server_errors: u64) -> UpstreamSamples {
        let mut samples = UpstreamSamples::default();
        for i in 0..count {
            let outcome = if i < server_errors {
                UpstreamOutcome::ServerError
            } else {
                UpstreamOutcome::Success
            };
            samples.record(outcome, latency);
        }
        samples
    }

    #[test]
    fn the_histogram_reports_a_p95_at_or_at_most_19_percent_above_the_truth() {
        for latency in [1.5, 7.0, 120.0, 480.0, 999.0, 30_000.0] {
            let p95 = samples(100, latency, 0).p95_millis().unwrap();
            assert!(
                p95 >= latency && p95 <= latency * 1.19 + 1e-9,
                "{latency} → {p95}"
            );
        }
        // 94 fast and 6 slow: the p95 is slow.
        let mut mixed = samples(94, 10.0, 0);
        mixed.merge(&samples(6, 900.0, 0));
        assert!(mixed.p95_millis().unwrap() >= 900.0);
        // 96 fast and 4 slow: the p95 is fast.
        let mut mostly_fast = samples(96, 10.0, 0);
        mostly_fast.merge(&samples(4, 900.0, 0));
        assert!(mostly_fast.p95_millis().unwrap() < 12.0);
        assert_eq!(UpstreamSamples::default().p95_millis(), None);
    }

    #[test]
    fn errors_are_5xx_timeouts_and_transport_errors_not_4xx() {
        let mut s = UpstreamSamples::default();
        s.record(UpstreamOutcome::Success, 5.0);
        s.record(UpstreamOutcome::OtherStatus, 5.0);
        s.record(UpstreamOutcome::ServerError, 5.0);
        s.record(UpstreamOutcome::Timeout, 5.0);
        s.record(UpstreamOutcome::TransportError, 5.0);
        assert_eq!(s.count(), 5);
        assert_eq!(s.errors(), 3);
        assert_eq!(s.error_rate(), Some(0.6));
    }

    #[test]
    fn backs_off_on_latency_and_on_errors_and_recovers() {
        let s = adaptive(10.0, 110.0);
        let slow = decide_next_rate(&s, 100.0, &samples(50, 800.0, 0), 10);
        assert_eq!(slow.decision, ControlDecision::BackOffLatency);
        assert_eq!(slow.next_rate, 70.0);
        let failing = decide_next_rate(&s, 100.0, &samples(50, 20.0, 10), 10);
        assert_eq!(failing.decision, ControlDecision::BackOffErrors);
        assert_eq!(failing.next_rate, 70.0);
        let healthy = decide_next_rate(&s, 70.0, &samples(50, 20.0, 1), 10);
        assert_eq!(healthy.decision, ControlDecision::Increase);
        assert_eq!(healthy.next_rate, 75.0);
        let few = decide_next_rate(&s, 70.0, &samples(9, 800.0, 9), 10);
        assert_eq!(few.decision, ControlDecision::Hold);
        assert_eq!(few.next_rate, 70.0);
    }

    #[test]
    fn from_the_minimum_it_reaches_the_maximum_in_twenty_healthy_intervals() {
        let s = adaptive(5.0, 105.0);
        let mut rate = 5.0;
        for _ in 0..20 {
            rate = decide_next_rate(&s, rate, &samples(20, 10.0, 0), 10).next_rate;
        }
        assert_eq!(rate, 105.0);
        assert_eq!(
            decide_next_rate(&s, rate, &samples(20, 10.0, 0), 10).next_rate,
            105.0
        );
    }

    proptest! {
        /// Whatever the upstream does, the rate stays within [min, max], and an unhealthy interval never
        /// raises it nor a healthy one lowers it.
        #[test]
        fn the_rate_stays_in_bounds_and_moves_the_right_way(
            min in 0.01f64..500.0, span in 0.0f64..5000.0, start in -10.0f64..10_000.0,
            intervals in proptest::collection::vec((0u64..200, 0.5f64..5000.0, 0u64..200), 1..60)
        ) {
            let s = adaptive(min, min + span);
            let mut rate = start;
            for (count, latency, errors) in intervals {
                let before = s.clamp_rate(rate);
                let step = decide_next_rate(&s, rate, &samples(count, latency, errors.min(count)), 10);
                prop_assert!(step.next_rate >= s.min_admit_per_second && step.next_rate <= s.max_admit_per_second);
                match step.decision {
                    ControlDecision::Hold => prop_assert_eq!(step.next_rate, before),
                    ControlDecision::Increase => prop_assert!(step.next_rate >= before - 0.0005),
                    ControlDecision::BackOffErrors | ControlDecision::BackOffLatency =>
                        prop_assert!(step.next_rate <= before + 0.0005),
                }
                rate = step.next_rate;
            }
        }

        /// Merging per-instance histograms gives the histogram of all the samples: the fleet's p95 is exact
        /// up to the bucket width however the samples were spread over instances.
        #[test]
        fn merged_samples_equal_samples_recorded_in_one_place(
            latencies in proptest::collection::vec((0.0f64..100_000.0, 0usize..3), 1..200)
        ) {
            let mut whole = UpstreamSamples::default();
            let mut parts = [UpstreamSamples::default(), UpstreamSamples::default(), UpstreamSamples::default()];
            for (latency, instance) in latencies {
                whole.record(UpstreamOutcome::Success, latency);
                parts[instance].record(UpstreamOutcome::Success, latency);
            }
            let mut merged = UpstreamSamples::default();
            for part in &parts { merged.merge(part); }
            prop_assert_eq!(merged, whole);
        }
    }
}
