//! What the Kafka consumer shares with the rest of the service: its assignment and durable offsets
//! (read by the rebalance callbacks, which run on the consumer's poll), and what `/readyz` and `/metrics`
//! show of it.
//!
//! # Metrics
//! - `rankgate_kafka_records_total`: records handled (ingested, duplicate, too old or dead-lettered),
//!   counted once their batch is durable; `rankgate_kafka_records_per_second` is its rate over the last
//!   lag interval.
//! - `rankgate_kafka_dead_lettered_total`: records sent to the dead-letter topic.
//! - `rankgate_kafka_rebalances_total{kind="assign"|"revoke"}`.
//! - `rankgate_kafka_consumer_lag{topic,partition}`: the partition's high watermark minus the next
//!   offset this instance has made durable (or the group's committed offset before it has); 0 for a
//!   partition this instance gave up. `rankgate_kafka_instance_lag` sums the owned ones.
//! - `rankgate_kafka_assigned_partitions`, `rankgate_kafka_paused` (1 while backpressure holds the
//!   partitions), `rankgate_kafka_pauses_total`, `rankgate_kafka_in_flight_records`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

/// One partition's offsets as librdkafka last saw them (`-1`: not known).
#[derive(Debug, Clone, Copy)]
pub struct PartitionOffsets {
    /// The partition.
    pub partition: i32,
    /// The high watermark: one past the last record.
    pub high: i64,
    /// The low watermark: the oldest record kept.
    pub low: i64,
    /// The group's committed offset.
    pub committed: i64,
}

/// The consumer's state, shared by its tasks, its rebalance callbacks and the HTTP handlers.
#[derive(Debug)]
pub struct KafkaStatus {
    /// The consumed topic.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// Assigned partitions → the next offset durable in the source of truth (`None`: nothing consumed
    /// since the assignment).
    partitions: Mutex<BTreeMap<i32, Option<i64>>>,
    /// Lag per assigned partition, as last measured.
    lag: Mutex<BTreeMap<i32, i64>>,
    /// Records read and not yet durable.
    pub(crate) in_flight: AtomicUsize,
    /// Backpressure holds the partitions.
    pub(crate) paused: AtomicBool,
    /// Records handled since start (what `rankgate_kafka_records_total` counts on this consumer).
    pub(crate) records: AtomicU64,
    /// The consumer's polls as `/readyz` reports them: down while they fail (a broker outage), up again
    /// at the next record or successful poll.
    pub health: crate::readiness::DependencyHealth,
}

impl KafkaStatus {
    /// A consumer of `topic` in `group` with nothing assigned yet.
    pub fn new(topic: &str, group: &str) -> KafkaStatus {
        KafkaStatus {
            topic: topic.to_string(),
            group: group.to_string(),
            partitions: Mutex::new(BTreeMap::new()),
            lag: Mutex::new(BTreeMap::new()),
            in_flight: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            records: AtomicU64::new(0),
            health: crate::readiness::DependencyHealth::new("kafka"),
        }
    }

    /// The assigned partitions, in order.
    pub fn assigned(&self) -> Vec<i32> {
        self.partitions.lock().keys().copied().collect()
    }

    /// Partitions were assigned: they start with nothing durable (the group's committed offset holds).
    pub(crate) fn assign(&self, partitions: &[i32]) {
        let mut owned = self.partitions.lock();
        let mut lag = self.lag.lock();
        for partition in partitions {
            owned.insert(*partition, None);
            lag.remove(partition);
        }
        metrics::gauge!("rankgate_kafka_assigned_partitions").set(owned.len() as f64);
    }

    /// Partitions were revoked: returns the durable offsets to commit for them, and forgets them.
    pub(crate) fn revoke(&self, partitions: &[i32]) -> Vec<(i32, i64)> {
        let mut owned = self.partitions.lock();
        let mut lag = self.lag.lock();
        let durable = partitions
            .iter()
            .filter_map(|p| owned.remove(p).flatten().map(|offset| (*p, offset)))
            .collect();
        for partition in partitions {
            lag.remove(partition);
            metrics::gauge!("rankgate_kafka_consumer_lag", "topic" => self.topic.clone(),
                "partition" => partition.to_string())
            .set(0.0);
        }
        metrics::gauge!("rankgate_kafka_assigned_partitions").set(owned.len() as f64);
        durable
    }

    /// A batch is durable up to these next offsets: records them for the partitions still owned, and
    /// returns those (only they may be committed: a partition given up belongs to another member now).
    pub(crate) fn made_durable(&self, next_offsets: &BTreeMap<i32, i64>) -> Vec<(i32, i64)> {
        let mut owned = self.partitions.lock();
        let mut commit = Vec::with_capacity(next_offsets.len());
        for (partition, next) in next_offsets {
            if let Some(durable) = owned.get_mut(partition) {
                let next = durable.map_or(*next, |d| d.max(*next));
                *durable = Some(next);
                commit.push((*partition, next));
            }
        }
        commit
    }

    /// The durable next offset of each assigned partition (`None` before its first batch).
    pub(crate) fn durable(&self) -> Vec<(i32, Option<i64>)> {
        self.partitions.lock().iter().map(|(p, o)| (*p, *o)).collect()
    }

    /// Measures the lag of the partitions still owned from librdkafka's view of their offsets: the high
    /// watermark minus the next durable offset (before any, the group's committed offset; with no commit,
    /// the low watermark). A partition whose high watermark is not known yet is left unmeasured.
    pub(crate) fn measure_lag(&self, offsets: &[PartitionOffsets]) {
        let owned = self.partitions.lock();
        let mut lag = self.lag.lock();
        for offsets in offsets.iter().filter(|o| o.high >= 0) {
            let Some(durable) = owned.get(&offsets.partition) else {
                continue;
            };
            let committed = (offsets.committed >= 0).then_some(offsets.committed);
            let position = durable.or(committed).unwrap_or(offsets.low.max(0));
            let value = (offsets.high - position).max(0);
            lag.insert(offsets.partition, value);
            metrics::gauge!("rankgate_kafka_consumer_lag", "topic" => self.topic.clone(),
                "partition" => offsets.partition.to_string())
            .set(value as f64);
        }
        lag.retain(|p, _| owned.contains_key(p));
        metrics::gauge!("rankgate_kafka_instance_lag").set(lag.values().sum::<i64>() as f64);
    }

    /// The `kafka` object of `/readyz`.
    pub fn view(&self) -> KafkaView {
        let partitions = self.assigned();
        // `null` until every owned partition has been measured once, so a fresh assignment never reads as
        // "caught up".
        let lag = {
            let lag = self.lag.lock();
            partitions
                .iter()
                .all(|p| lag.contains_key(p))
                .then(|| lag.values().sum::<i64>())
        };
        KafkaView {
            topic: self.topic.clone(),
            group: self.group.clone(),
            assigned: !partitions.is_empty(),
            partitions,
            lag,
            paused: self.paused.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            records: self.records.load(Ordering::Relaxed),
        }
    }
}

/// The `kafka` object of `/readyz`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KafkaView {
    /// The consumed topic.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// Whether this instance owns any partition (a group may have more members than partitions).
    pub assigned: bool,
    /// The owned partitions.
    pub partitions: Vec<i32>,
    /// Records behind the high watermark over the owned partitions; `null` until each was measured once.
    pub lag: Option<i64>,
    /// Whether the owned partitions are paused for backpressure.
    pub paused: bool,
    /// Records read but not yet durable.
    pub in_flight: usize,
    /// Records taken since start.
    pub records: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_owned_partitions_are_committed_and_revoke_returns_what_is_durable() {
        let status = KafkaStatus::new("events", "g");
        status.assign(&[0, 1]);
        let commit = status.made_durable(&BTreeMap::from([(0, 10), (2, 5)]));
        assert_eq!(commit, [(0, 10)], "partition 2 is not ours");
        // Durable offsets never go back, even if batches were to complete out of order.
        assert_eq!(status.made_durable(&BTreeMap::from([(0, 7)])), [(0, 10)]);
        assert_eq!(
            status.revoke(&[0, 1]),
            [(0, 10)],
            "partition 1 has nothing durable"
        );
        assert!(status.assigned().is_empty());
        assert!(!status.view().assigned);
        assert!(status.made_durable(&BTreeMap::from([(0, 20)])).is_empty());
    }

    #[test]
    fn lag_counts_from_the_durable_offset_then_the_committed_one_then_the_oldest_record() {
        let status = KafkaStatus::new("events", "g");
        status.assign(&[0, 1, 2]);
        assert_eq!(status.view().lag, None, "not measured yet");
        status.made_durable(&BTreeMap::from([(0, 90)]));
        let offsets = |partition, high, low, committed| PartitionOffsets {
            partition,
            high,
            low,
            committed,
        };
        status.measure_lag(&[
            offsets(0, 100, 0, 50),
            offsets(1, 100, 0, 70),
            offsets(2, 100, 40, -1),
            offsets(3, 100, 0, 0),
        ]);
        assert_eq!(status.view().lag, Some(10 + 30 + 60), "partition 3 is not ours");
        status.measure_lag(&[offsets(0, -1, -1, -1)]);
        assert_eq!(
            status.view().lag,
            Some(100),
            "an unknown watermark keeps the last measurement"
        );
    }
}
