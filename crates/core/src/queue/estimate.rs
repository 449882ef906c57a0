//! Wait estimates from measured throughput (SPEC 2.2, limitation 5).
//!
//! The seed estimated `rank / 50`, which stays the same whether the order service is fast, slow or down.
//! Here every admission step feeds what actually happened into exponentially weighted moving averages: the
//! admission rate (members popped per second, sampled only while people were waiting, so an idle queue
//! does not look slow) and the consumption rate (orders committed per second). Consumption matters when
//! `max_active` is set: then slots free up only as orders finish, so the slower of the two is the real
//! throughput. Until anything is measured, the configured rate is the prior.
//!
//! The state is stored with the queue and updated in the store's atomic admission step, so every instance
//! sees the same, global measurements.

use serde::{Deserialize, Serialize};

use super::settings::QueueSettings;

/// Time constant of the moving averages: after this long at a new rate the estimate has moved ~63% of the
/// way, after three times this ~95%.
pub const SMOOTHING_MILLIS: f64 = 10_000.0;

/// Measured throughput of one queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThroughputEstimator {
    /// Moving average of admissions per second, while members were waiting.
    pub admit_rate: Option<f64>,
    /// Moving average of consumed orders per second.
    pub consume_rate: Option<f64>,
    /// Store time of the last admission step (ms).
    pub last_step_ms: Option<i64>,
    /// Orders consumed since the last admission step.
    pub consumed_since_step: u64,
    /// Members admitted by steps in the same millisecond as the last one (a tick admitted in several
    /// bounded chunks): they count toward the next step's sample instead of being lost.
    #[serde(default)]
    pub admitted_since_step: u64,
    /// Admissions per second over the last minute: `(unix second, count)`, at most 60 entries.
    pub per_second: Vec<(i64, u64)>,
}

fn fold(average: Option<f64>, sample: f64, elapsed_ms: f64) -> f64 {
    match average {
        None => sample,
        Some(previous) => {
            let alpha = 1.0 - (-elapsed_ms / SMOOTHING_MILLIS).exp();
            previous + alpha * (sample - previous)
        }
    }
}

impl ThroughputEstimator {
    /// Records one admission step: `admitted` members popped at `now_ms`; `backlog` says whether members
    /// were still waiting before the step (only then is the admission rate a measurement of capacity).
    pub fn record_admission_step(&mut self, now_ms: i64, admitted: u64, backlog: bool) {
        if admitted > 0 {
            let second = now_ms.div_euclid(1000);
            match self.per_second.iter_mut().find(|(s, _)| *s == second) {
                Some(bucket) => bucket.1 += admitted,
                None => self.per_second.push((second, admitted)),
            }
            self.per_second.retain(|(s, _)| *s > second - 60);
        }
        if let Some(last) = self.last_step_ms {
            let admitted = self.admitted_since_step + admitted;
            if now_ms > last {
                let elapsed = (now_ms - last) as f64;
                if backlog {
                    self.admit_rate =
                        Some(fold(self.admit_rate, admitted as f64 * 1000.0 / elapsed, elapsed));
                }
                self.admitted_since_step = 0;
                let consumed = self.consumed_since_step as f64 * 1000.0 / elapsed;
                self.consume_rate = Some(fold(self.consume_rate, consumed, elapsed));
                self.consumed_since_step = 0;
                self.last_step_ms = Some(now_ms);
            } else {
                self.admitted_since_step = admitted;
            }
        } else {
            self.last_step_ms = Some(now_ms);
        }
    }

    /// Records committed orders.
    pub fn record_consumed(&mut self, count: u64) {
        self.consumed_since_step += count;
    }

    /// Members admitted in the 60 seconds up to `now_ms`.
    #[must_use]
    pub fn admitted_last_minute(&self, now_ms: i64) -> u64 {
        let second = now_ms.div_euclid(1000);
        self.per_second
            .iter()
            .filter(|(s, _)| *s > second - 60 && *s <= second)
            .map(|(_, n)| n)
            .sum()
    }

    /// The throughput the estimate uses, in members per second; `None` while paused.
    #[must_use]
    pub fn effective_rate(&self, settings: &QueueSettings) -> Option<f64> {
        if settings.paused {
            return None;
        }
        let mut rate = self.admit_rate.unwrap_or(settings.admit_per_second);
        if settings.max_active.is_some() {
            if let Some(consumed) = self.consume_rate.filter(|r| *r > 0.0) {
                rate = rate.min(consumed);
            }
        }
        (rate > 1e-9).then_some(rate)
    }

    /// Seconds until the member at 0-based `rank` is admitted: the members ahead plus itself, at the
    /// measured rate. `None` when nothing is being admitted (paused or measured zero).
    #[must_use]
    pub fn estimate_wait_seconds(&self, rank: u64, settings: &QueueSettings) -> Option<u64> {
        let rate = self.effective_rate(settings)?;
        Some(((rank + 1) as f64 / rate).ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_follows_a_change_of_rate() {
        let settings = QueueSettings::default();
        let mut estimator = ThroughputEstimator::default();
        assert_eq!(
            estimator.estimate_wait_seconds(999, &settings),
            Some(20),
            "the setting is the prior"
        );
        let mut now = 0;
        for _ in 0..60 {
            estimator.record_admission_step(now, 10, true);
            now += 1000;
        }
        let estimate = estimator.estimate_wait_seconds(999, &settings).unwrap();
        assert!((98..=103).contains(&estimate), "{estimate}");
        for _ in 0..60 {
            estimator.record_admission_step(now, 100, true);
            now += 1000;
        }
        let estimate = estimator.estimate_wait_seconds(999, &settings).unwrap();
        assert!((10..=11).contains(&estimate), "{estimate}");
        assert_eq!(estimator.admitted_last_minute(now - 1000), 6000);
    }

    /// A tick admitted in bounded chunks (several steps in one millisecond) measures the same rate as one
    /// step that admitted the whole tick.
    #[test]
    fn a_tick_admitted_in_chunks_measures_the_whole_tick() {
        let mut whole = ThroughputEstimator::default();
        let mut chunked = ThroughputEstimator::default();
        for second in 0..30 {
            let now = second * 1000;
            whole.record_admission_step(now, 3000, true);
            for _ in 0..3 {
                chunked.record_admission_step(now, 1000, true);
            }
        }
        let (whole, chunked) = (whole.admit_rate.unwrap(), chunked.admit_rate.unwrap());
        assert!((whole - 3000.0).abs() < 1.0, "{whole}");
        assert!((chunked - whole).abs() < 1.0, "{chunked} vs {whole}");
    }

    #[test]
    fn idle_ticks_do_not_look_slow_and_paused_has_no_estimate() {
        let mut settings = QueueSettings::default();
        let mut estimator = ThroughputEstimator::default();
        estimator.record_admission_step(0, 50, true);
        estimator.record_admission_step(1000, 50, true);
        estimator.record_admission_step(2000, 0, false);
        assert_eq!(estimator.estimate_wait_seconds(49, &settings), Some(1));
        settings.paused = true;
        assert_eq!(estimator.estimate_wait_seconds(49, &settings), None);
    }

    #[test]
    fn with_max_active_consumption_bounds_the_rate() {
        let settings = QueueSettings {
            max_active: Some(10),
            ..QueueSettings::default()
        };
        let mut estimator = ThroughputEstimator::default();
        for step in 0..40 {
            estimator.record_consumed(2);
            estimator.record_admission_step(step * 1000, 10, true);
        }
        let rate = estimator.effective_rate(&settings).unwrap();
        assert!((1.9..=2.1).contains(&rate), "{rate}");
    }
}
