//! [`UpstreamObservationStore`]: where every instance's gate measurements of an order service meet, so
//! adaptive admission (issue 12) controls on what the whole fleet saw, not on one instance's share.
//!
//! Time is cut into control intervals (index = store-clock ms / interval length). Each instance adds its
//! [`UpstreamSamples`] of an interval with [`add_samples`](UpstreamObservationStore::add_samples) (a sum:
//! histograms add bucket by bucket), and once the interval is over, plus a grace for late flushes,
//! [`close_interval`](UpstreamObservationStore::close_interval) hands the sum to **exactly one** caller
//! across all instances. That caller runs the controller and writes the rate into the queue's settings,
//! where the store's atomic admission step spends it as the global budget. Samples added after the close
//! are dropped (they are at most a grace period late, and the next interval measures the same upstream).
//!
//! Backends: [`InMemoryUpstreamObservations`] for the embedded store (one process), and
//! [`RedisStore`](crate::queue::redis::RedisStore) for instances sharing Redis (`redis/upstream.rs`).

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use parking_lot::Mutex;
use rankgate_core::queue::adaptive::IntervalSummary;
use rankgate_core::queue::{QueueName, UpstreamSamples};

use super::StoreError;

/// Intervals the in-memory store keeps per queue: a queue's open intervals are the current one and the
/// one in its grace period, so anything older was never closed (nobody ran the controller) and is noise.
const KEPT_INTERVALS: usize = 8;

/// Where gate observations are summed across instances, and the last interval's summary is kept.
#[async_trait]
pub trait UpstreamObservationStore: Send + Sync {
    /// Adds one instance's samples of `interval` to the interval's sum.
    async fn add_samples(
        &self,
        queue: &QueueName,
        interval: i64,
        samples: &UpstreamSamples,
    ) -> Result<(), StoreError>;

    /// Closes `interval`: the first caller gets the sum of every instance's samples (possibly empty), every
    /// later caller `None`. Atomic across instances.
    async fn close_interval(
        &self,
        queue: &QueueName,
        interval: i64,
    ) -> Result<Option<UpstreamSamples>, StoreError>;

    /// Keeps what the controller made of the last closed interval, for every instance's admin view.
    async fn publish_summary(&self, queue: &QueueName, summary: &IntervalSummary) -> Result<(), StoreError>;

    /// The last published summary, if any.
    async fn last_summary(&self, queue: &QueueName) -> Result<Option<IntervalSummary>, StoreError>;
}

/// One queue's open intervals and last summary.
#[derive(Debug, Default)]
struct QueueObservations {
    /// interval → (sum so far, closed).
    intervals: BTreeMap<i64, (UpstreamSamples, bool)>,
    last: Option<IntervalSummary>,
}

/// The embedded backend's observations: one process, so a mutex is the whole story. Bounded: at most
/// [`KEPT_INTERVALS`] intervals per queue, and only queues a `[[gate]]` forwards for get samples.
#[derive(Debug, Default)]
pub struct InMemoryUpstreamObservations {
    queues: Mutex<HashMap<QueueName, QueueObservations>>,
}

impl InMemoryUpstreamObservations {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl UpstreamObservationStore for InMemoryUpstreamObservations {
    async fn add_samples(
        &self,
        queue: &QueueName,
        interval: i64,
        samples: &UpstreamSamples,
    ) -> Result<(), StoreError> {
        let mut queues = self.queues.lock();
        let observations = queues.entry(queue.clone()).or_default();
        let entry = observations.intervals.entry(interval).or_default();
        if !entry.1 {
            entry.0.merge(samples);
        }
        while observations.intervals.len() > KEPT_INTERVALS {
            observations.intervals.pop_first();
        }
        Ok(())
    }

    async fn close_interval(
        &self,
        queue: &QueueName,
        interval: i64,
    ) -> Result<Option<UpstreamSamples>, StoreError> {
        let mut queues = self.queues.lock();
        let observations = queues.entry(queue.clone()).or_default();
        let entry = observations.intervals.entry(interval).or_default();
        if entry.1 {
            return Ok(None);
        }
        entry.1 = true;
        let samples = std::mem::take(&mut entry.0);
        while observations.intervals.len() > KEPT_INTERVALS {
            observations.intervals.pop_first();
        }
        Ok(Some(samples))
    }

    async fn publish_summary(&self, queue: &QueueName, summary: &IntervalSummary) -> Result<(), StoreError> {
        self.queues.lock().entry(queue.clone()).or_default().last = Some(summary.clone());
        Ok(())
    }

    async fn last_summary(&self, queue: &QueueName) -> Result<Option<IntervalSummary>, StoreError> {
        Ok(self
            .queues
            .lock()
            .get(queue)
            .and_then(|observations| observations.last.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rankgate_core::queue::UpstreamOutcome;

    fn samples(n: u64) -> UpstreamSamples {
        let mut s = UpstreamSamples::default();
        for _ in 0..n {
            s.record(UpstreamOutcome::Success, 10.0);
        }
        s
    }

    #[tokio::test]
    async fn an_interval_is_handed_out_once_with_every_instances_samples() {
        let store = InMemoryUpstreamObservations::new();
        let queue = QueueName::parse("sale").unwrap();
        store.add_samples(&queue, 7, &samples(3)).await.unwrap();
        store.add_samples(&queue, 7, &samples(4)).await.unwrap();
        store.add_samples(&queue, 8, &samples(1)).await.unwrap();
        assert_eq!(store.close_interval(&queue, 7).await.unwrap().unwrap().count(), 7);
        assert_eq!(store.close_interval(&queue, 7).await.unwrap(), None);
        // Late samples of a closed interval are dropped, the next interval is untouched.
        store.add_samples(&queue, 7, &samples(5)).await.unwrap();
        assert_eq!(store.close_interval(&queue, 8).await.unwrap().unwrap().count(), 1);
        for interval in 100..200 {
            store.add_samples(&queue, interval, &samples(1)).await.unwrap();
        }
        assert!(store.queues.lock()[&queue].intervals.len() <= KEPT_INTERVALS);
    }
}
