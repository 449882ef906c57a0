//! The Kafka consumer: a reader that polls the group and cuts records into batches, a writer that makes
//! each batch durable and only then commits its offsets, and the lag from librdkafka's statistics.
//!
//! Backpressure has two levels. Records handed to the writer and not yet durable are bounded by
//! `kafka_max_in_flight`. At that bound the reader first *holds*: it stops taking records for up to
//! [`HOLD_BEFORE_PAUSE`], and librdkafka's own prefetch queue (bounded by `queued.max.messages.kbytes`)
//! stops fetching by itself when full. A writer that is merely a batch behind, the steady state of a
//! backlog drain, catches up within the hold, and nothing is thrown away. Only a writer that stays behind
//! (the source of truth is slow or down) gets the partitions *paused*, after which the reader polls
//! again: librdkafka serves the group's rebalances on that poll, so a stalled source of truth never costs
//! the instance its membership. Pausing is not the first resort because librdkafka purges a paused
//! partition's prefetched records, and fetching them again after every resume cost a backlog drain a
//! pause every 50,000 records. Batches reach the writer in order over a channel whose size the two
//! levels bound; the reader never blocks on it.
//!
//! The writer handles one batch at a time, so the durable offsets of a partition only ever grow. A batch
//! whose ingest fails (the source of truth is down) is retried, re-parsed from its raw values, until it
//! succeeds or the service stops; its offsets stay uncommitted meanwhile, and the records come back to
//! whoever owns the partition next.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::stream::{FuturesOrdered, StreamExt};
use futures_util::FutureExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientConfig, ClientContext, Message, Offset, TopicPartitionList};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use rankgate_core::event::{parse_event, Event, ParseLimits};
use rankgate_store::clock::Clock;
use rankgate_store::ranking::ingest::EventOutcome;

use super::status::{KafkaStatus, PartitionOffsets};
use super::{KafkaConfig, MAX_RECORD_BYTES};
use crate::rankings::RankingService;

/// The header of a dead letter that says why the record was refused.
pub const ERROR_HEADER: &str = "rankgate-error";
/// Headers of a dead letter naming where the record came from.
pub const SOURCE_TOPIC_HEADER: &str = "rankgate-source-topic";
/// See [`SOURCE_TOPIC_HEADER`].
pub const SOURCE_PARTITION_HEADER: &str = "rankgate-source-partition";
/// See [`SOURCE_TOPIC_HEADER`].
pub const SOURCE_OFFSET_HEADER: &str = "rankgate-source-offset";

/// How often the lag is measured (librdkafka's `statistics.interval.ms`) and the record rate computed.
const LAG_INTERVAL: Duration = Duration::from_secs(1);
/// Batches parsed and in the writer at once (see `write_until_done`).
const MAX_BATCHES_WRITING: usize = 3;
/// How long the reader holds at `kafka_max_in_flight` before it pauses the partitions (see the module
/// doc). Short beside `max.poll.interval.ms` and the session, so a rebalance waits on us at most this.
const HOLD_BEFORE_PAUSE: Duration = Duration::from_secs(1);
/// Creating the dead-letter topic gives up after this.
const BROKER_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The rebalance callbacks: commit what is durable for revoked partitions, track the assignment.
pub struct RebalanceContext {
    status: Arc<KafkaStatus>,
}

impl ClientContext for RebalanceContext {
    /// librdkafka's statistics (every [`LAG_INTERVAL`]) carry each partition's high watermark as the
    /// fetches saw it. A ListOffsets query is not used: tansu 0.6 answers it wrongly.
    fn stats(&self, statistics: Statistics) {
        // Readiness: a quiet consumer is up while librdkafka holds a connection to some broker, and down
        // when it holds none (the consume loop records the errors themselves).
        if statistics.brokers.values().any(|broker| broker.state == "UP") {
            self.status
                .health
                .set(crate::readiness::DependencyState::Up, None);
        } else {
            self.status.health.set(
                crate::readiness::DependencyState::Down,
                Some("no connection to any broker".into()),
            );
        }
        let Some(topic) = statistics.topics.get(&self.status.topic) else {
            return;
        };
        let offsets: Vec<PartitionOffsets> = topic
            .partitions
            .values()
            .filter(|p| p.partition >= 0)
            .map(|p| PartitionOffsets {
                partition: p.partition,
                high: p.hi_offset,
                low: p.lo_offset,
                committed: p.committed_offset,
            })
            .collect();
        self.status.measure_lag(&offsets);
    }
}

impl ConsumerContext for RebalanceContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        let partitions = partitions_of(revoked, &self.status.topic);
        metrics::counter!("rankgate_kafka_rebalances_total", "kind" => "revoke").increment(1);
        let durable = self.status.revoke(&partitions);
        tracing::info!(?partitions, "kafka: partitions revoked");
        // A lost assignment (the session expired) belongs to another member already: its commits would fail.
        if durable.is_empty() || consumer.assignment_lost() {
            return;
        }
        if let Err(error) = consumer.commit(&offsets_list(&self.status.topic, &durable), CommitMode::Sync) {
            // Not fatal: the new owner starts from the last commit and event-id dedupe absorbs the rest.
            tracing::warn!(%error, "kafka: committing revoked partitions' durable offsets failed");
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(assigned) => {
                let partitions = partitions_of(assigned, &self.status.topic);
                metrics::counter!("rankgate_kafka_rebalances_total", "kind" => "assign").increment(1);
                self.status.assign(&partitions);
                tracing::info!(?partitions, "kafka: partitions assigned");
                // New partitions join the backpressure already in force.
                if self.status.paused.load(Ordering::Acquire) {
                    if let Err(error) = consumer.pause(assigned) {
                        tracing::warn!(%error, "kafka: pausing newly assigned partitions failed");
                    }
                }
            }
            Rebalance::Error(error) => tracing::warn!(%error, "kafka: rebalance failed"),
            Rebalance::Revoke(_) => {}
        }
    }
}

fn partitions_of(list: &TopicPartitionList, topic: &str) -> Vec<i32> {
    list.elements_for_topic(topic)
        .iter()
        .map(|element| element.partition())
        .collect()
}

fn offsets_list(topic: &str, offsets: &[(i32, i64)]) -> TopicPartitionList {
    let mut list = TopicPartitionList::with_capacity(offsets.len());
    for (partition, next) in offsets {
        // Only fails for a sentinel offset, which a next offset never is.
        let _ = list.add_partition_offset(topic, *partition, Offset::Offset(*next));
    }
    list
}

/// A record refused as an event, on its way to the dead-letter topic.
struct DeadLetter {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    error: String,
}

/// Where one record's bytes are in its batch's arenas.
struct RecordRef {
    partition: i32,
    offset: i64,
    /// Range in `values`, and the value's full length (only the first [`MAX_RECORD_BYTES`] + 1 are kept);
    /// `None`: the record has no value.
    value: Option<(usize, usize, usize)>,
    /// Range in `keys`.
    key: Option<(usize, usize)>,
}

/// Records read together, ingested as one writer call. The reader only copies bytes; parsing happens
/// off the reader ([`Batch::parse`], on the blocking pool), so polling never waits on JSON.
struct Batch {
    limits: ParseLimits,
    /// The records' values and keys back to back, kept to re-parse the batch for a retry and to
    /// dead-letter what is refused.
    values: Vec<u8>,
    keys: Vec<u8>,
    refs: Vec<RecordRef>,
    /// After [`Batch::parse`]: the valid events, and for each the index of its record in `refs`.
    events: Vec<Event>,
    origins: Vec<usize>,
    poison: Vec<DeadLetter>,
    /// Per partition, one past the highest offset read.
    next_offsets: BTreeMap<i32, i64>,
    records: usize,
}

impl Batch {
    fn new(limits: ParseLimits, capacity: usize) -> Batch {
        Batch {
            limits,
            values: Vec::with_capacity(capacity * 256),
            keys: Vec::with_capacity(capacity * 8),
            refs: Vec::with_capacity(capacity),
            events: Vec::new(),
            origins: Vec::new(),
            poison: Vec::new(),
            next_offsets: BTreeMap::new(),
            records: 0,
        }
    }

    fn take(&mut self, message: &BorrowedMessage<'_>) {
        let (partition, offset) = (message.partition(), message.offset());
        self.records += 1;
        let next = self.next_offsets.entry(partition).or_insert(offset + 1);
        *next = (*next).max(offset + 1);
        let value = message.payload().map(|value| {
            let start = self.values.len();
            self.values
                .extend_from_slice(&value[..value.len().min(MAX_RECORD_BYTES + 1)]);
            (start, self.values.len(), value.len())
        });
        let key = message.key().map(|key| {
            let start = self.keys.len();
            self.keys
                .extend_from_slice(&key[..key.len().min(MAX_RECORD_BYTES)]);
            (start, self.keys.len())
        });
        self.refs.push(RecordRef {
            partition,
            offset,
            value,
            key,
        });
    }

    fn event_of(&self, record: &RecordRef) -> Result<Event, String> {
        match record.value {
            None => Err("value: the record has no value; send one event's JSON object".to_string()),
            Some((_, _, len)) if len > MAX_RECORD_BYTES => Err(format!(
                "value: is {len} bytes, more than {MAX_RECORD_BYTES}; one record holds one event"
            )),
            Some((start, end, _)) => {
                parse_event(&self.values[start..end], &self.limits).map_err(|error| error.to_string())
            }
        }
    }

    fn dead_letter_of(&self, record: &RecordRef, error: String) -> DeadLetter {
        DeadLetter {
            partition: record.partition,
            offset: record.offset,
            key: record.key.map(|(start, end)| self.keys[start..end].to_vec()),
            // A record without a value stays one in the dead-letter topic.
            value: record
                .value
                .map(|(start, end, _)| self.values[start..end.min(start + MAX_RECORD_BYTES)].to_vec()),
            error,
        }
    }

    /// Validates every record: events for the writer, poison for the dead-letter topic.
    fn parse(&mut self) {
        let mut events = Vec::with_capacity(self.refs.len());
        let mut origins = Vec::with_capacity(self.refs.len());
        let mut poison = Vec::new();
        for (index, record) in self.refs.iter().enumerate() {
            match self.event_of(record) {
                Ok(event) => {
                    events.push(event);
                    origins.push(index);
                }
                Err(error) => poison.push(self.dead_letter_of(record, error)),
            }
        }
        (self.events, self.origins, self.poison) = (events, origins, poison);
    }

    /// The events again, for a retry (the writer consumed the first copy). Parsing is a pure function of
    /// the bytes and the batch's limits, so every value parses to the event it did the first time.
    fn reparse(&self) -> Vec<Event> {
        self.origins
            .iter()
            .filter_map(|index| self.event_of(&self.refs[*index]).ok())
            .collect()
    }
}

/// A connected consumer, subscribed, not yet polling.
pub struct KafkaConsumer {
    config: KafkaConfig,
    consumer: Arc<StreamConsumer<RebalanceContext>>,
    producer: FutureProducer,
    status: Arc<KafkaStatus>,
    rankings: Arc<RankingService>,
    clock: Arc<dyn Clock>,
    max_future_millis: i64,
}

impl KafkaConsumer {
    /// Creates the consumer and the dead-letter producer, makes sure the dead-letter topic exists, and
    /// subscribes. The group is joined on the first poll, in [`KafkaConsumer::run_until_stopped`].
    pub async fn connect(
        config: KafkaConfig,
        rankings: Arc<RankingService>,
        clock: Arc<dyn Clock>,
        max_future_millis: i64,
    ) -> anyhow::Result<KafkaConsumer> {
        let brokers = config.brokers.join(",");
        let status = Arc::new(KafkaStatus::new(&config.topic, &config.group));
        let session = config.session_timeout_millis;
        let consumer: StreamConsumer<RebalanceContext> = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", &config.group)
            .set("client.id", "rankgate")
            // Offsets move only when a batch is durable: see the module doc.
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            // A new group starts from the oldest record kept: the backlog is counted, not skipped.
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", session.to_string())
            .set("heartbeat.interval.ms", (session / 3).max(100).to_string())
            // librdkafka's own prefetch, per instance; bounded beside `kafka_max_in_flight`.
            .set("queued.max.messages.kbytes", "16384")
            .set("statistics.interval.ms", LAG_INTERVAL.as_millis().to_string())
            .create_with_context(RebalanceContext {
                status: status.clone(),
            })
            .context("kafka: creating the consumer")?;
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("client.id", "rankgate-dead-letters")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "30000")
            .set("linger.ms", "5")
            .create()
            .context("kafka: creating the dead-letter producer")?;
        ensure_topic(&brokers, &config.dead_letter_topic).await;
        consumer
            .subscribe(&[config.topic.as_str()])
            .context("kafka: subscribing")?;
        Ok(KafkaConsumer {
            config,
            consumer: Arc::new(consumer),
            producer,
            status,
            rankings,
            clock,
            max_future_millis,
        })
    }

    /// What `/readyz` and the rebalance callbacks share.
    pub fn status(&self) -> Arc<KafkaStatus> {
        self.status.clone()
    }

    /// Consumes until `shutdown`; then writes what was read (while the source of truth answers), commits,
    /// and leaves the group.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) {
        let (batches, queued) = mpsc::unbounded_channel();
        let progress = Arc::new(Notify::new());
        tokio::join!(
            self.read_until_stopped(batches, progress.clone(), shutdown.clone()),
            self.write_until_done(queued, progress, shutdown.clone()),
            self.measure_rate_until_stopped(shutdown),
        );
        let (consumer, status) = (self.consumer, self.status);
        let _ = tokio::task::spawn_blocking(move || {
            let durable: Vec<(i32, i64)> = status
                .durable()
                .into_iter()
                .filter_map(|(p, o)| o.map(|o| (p, o)))
                .collect();
            if !durable.is_empty() {
                if let Err(error) = consumer.commit(&offsets_list(&status.topic, &durable), CommitMode::Sync)
                {
                    tracing::warn!(%error, "kafka: the final commit failed; the records will be read again");
                }
            }
            // Dropping the last handle closes the consumer: it leaves the group, so the partitions move now
            // rather than after the session timeout.
            drop(consumer);
        })
        .await;
    }

    async fn read_until_stopped(
        &self,
        batches: mpsc::UnboundedSender<Batch>,
        progress: Arc<Notify>,
        shutdown: CancellationToken,
    ) {
        let linger = Duration::from_millis(self.config.linger_millis);
        let mut pending: Option<Batch> = None;
        let mut deadline = tokio::time::Instant::now();
        let mut last_warning: Option<Instant> = None;
        // While holding (see the module doc): when the hold turns into a pause.
        let mut holding_until: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = progress.notified() => {
                    if self.caught_up() {
                        holding_until = None;
                        self.resume();
                    }
                }
                _ = tokio::time::sleep_until(holding_until.unwrap_or(deadline)), if holding_until.is_some() => {
                    holding_until = None;
                    if !self.caught_up() {
                        self.pause();
                    }
                }
                _ = tokio::time::sleep_until(deadline), if pending.is_some() => {
                    let _ = batches.send(pending.take().expect("pending"));
                }
                message = self.consumer.recv(), if holding_until.is_none() => match message {
                    Ok(message) => {
                        self.status.health.set(crate::readiness::DependencyState::Up, None);
                        let mut message = Some(message);
                        let mut taken = 0;
                        // Take what librdkafka already holds without going round the select (and its timer)
                        // once per record; a batch's worth at most, so the other branches are not starved.
                        while let Some(record) = message.take() {
                            let batch = pending.get_or_insert_with(|| {
                                deadline = tokio::time::Instant::now() + linger;
                                Batch::new(self.limits(), self.config.batch)
                            });
                            batch.take(&record);
                            taken += 1;
                            if batch.records >= self.config.batch {
                                let _ = batches.send(pending.take().expect("pending"));
                            }
                            let in_flight = self.status.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
                            if in_flight >= self.config.max_in_flight {
                                if !self.status.paused.load(Ordering::Acquire) {
                                    holding_until = Some(tokio::time::Instant::now() + HOLD_BEFORE_PAUSE);
                                }
                                break;
                            }
                            if taken < self.config.batch {
                                message = self.consumer.recv().now_or_never().and_then(Result::ok);
                            }
                        }
                        metrics::gauge!("rankgate_kafka_in_flight_records")
                            .set(self.status.in_flight.load(Ordering::Relaxed) as f64);
                    }
                    Err(error) => {
                        self.status.health.set(
                            crate::readiness::DependencyState::Down,
                            Some(format!("consuming failed: {error}")),
                        );
                        // Broker outages surface here, again and again: say so every 10 s, not per poll.
                        if last_warning.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                            tracing::warn!(%error, "kafka: consuming failed; retrying");
                            last_warning = Some(Instant::now());
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        if let Some(batch) = pending {
            let _ = batches.send(batch);
        }
    }

    fn limits(&self) -> ParseLimits {
        ParseLimits {
            max_future_millis: self.max_future_millis,
            ..ParseLimits::at(self.clock.now_millis())
        }
    }

    fn pause(&self) {
        let paused = self
            .consumer
            .assignment()
            .and_then(|assigned| self.consumer.pause(&assigned));
        match paused {
            Ok(()) => {
                self.status.paused.store(true, Ordering::Release);
                metrics::gauge!("rankgate_kafka_paused").set(1.0);
                metrics::counter!("rankgate_kafka_pauses_total").increment(1);
                tracing::debug!("kafka: writer behind; partitions paused");
            }
            Err(error) => tracing::warn!(%error, "kafka: pausing partitions failed"),
        }
    }

    /// Whether the writer has brought the records in flight down to half the bound, the point where
    /// a hold ends and paused partitions resume.
    fn caught_up(&self) -> bool {
        self.status.in_flight.load(Ordering::Acquire) <= self.config.max_in_flight / 2
    }

    fn resume(&self) {
        if !self.status.paused.load(Ordering::Acquire) {
            return;
        }
        let resumed = self
            .consumer
            .assignment()
            .and_then(|assigned| self.consumer.resume(&assigned));
        match resumed {
            Ok(()) => {
                self.status.paused.store(false, Ordering::Release);
                metrics::gauge!("rankgate_kafka_paused").set(0.0);
                tracing::debug!("kafka: writer caught up; partitions resumed");
            }
            Err(error) => tracing::warn!(%error, "kafka: resuming partitions failed"),
        }
    }

    async fn write_until_done(
        &self,
        mut queued: mpsc::UnboundedReceiver<Batch>,
        progress: Arc<Notify>,
        shutdown: CancellationToken,
    ) {
        // Up to MAX_BATCHES_WRITING batches are parsed and handed to the writer at once, so the writer's
        // group commit can merge them as it merges concurrent HTTP requests; they are settled (dead
        // letters, durable offsets, commit) strictly in the order they were read.
        let mut writing = FuturesOrdered::new();
        let mut open = true;
        loop {
            tokio::select! {
                batch = queued.recv(), if open && writing.len() < MAX_BATCHES_WRITING => match batch {
                    Some(batch) => writing.push_back(self.write(batch, &shutdown)),
                    None => open = false,
                },
                Some(written) = writing.next(), if !writing.is_empty() => {
                    let settled = match written {
                        Ok((batch, outcomes)) => {
                            let records = batch.records;
                            let settled = self.settle(batch, outcomes, &shutdown).await;
                            let in_flight = self.status.in_flight.fetch_sub(records, Ordering::AcqRel) - records;
                            metrics::gauge!("rankgate_kafka_in_flight_records").set(in_flight as f64);
                            progress.notify_one();
                            settled
                        }
                        Err(stopped) => Err(stopped),
                    };
                    if settled.is_err() {
                        // Stopping with the source of truth or the broker down: what is left stays
                        // uncommitted, for a redelivery.
                        return;
                    }
                }
                else => return,
            }
        }
    }

    /// Parses a batch (off the runtime) and ingests its events, retrying until they are durable.
    /// `Err` only when stopped first.
    async fn write(
        &self,
        mut batch: Batch,
        shutdown: &CancellationToken,
    ) -> Result<(Batch, Vec<EventOutcome>), Stopped> {
        let mut batch = tokio::task::spawn_blocking(move || {
            batch.parse();
            batch
        })
        .await
        .map_err(|_| Stopped)?;
        let mut backoff = Backoff::new();
        let mut events = std::mem::take(&mut batch.events);
        let outcomes = loop {
            if events.is_empty() {
                break Vec::new();
            }
            match self.rankings.ingest(events, batch.limits.now_millis).await {
                Ok(outcomes) => break outcomes,
                Err(error) => {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "kafka: ingesting a batch failed; retrying"
                    );
                    backoff.wait(shutdown).await?;
                    events = batch.reparse();
                }
            }
        };
        Ok((batch, outcomes))
    }

    /// Dead-letters a durable batch's poison, then commits its offsets. `Err` only when stopped first.
    async fn settle(
        &self,
        mut batch: Batch,
        outcomes: Vec<EventOutcome>,
        shutdown: &CancellationToken,
    ) -> Result<(), Stopped> {
        let mut backoff = Backoff::new();
        // The poison so far failed parsing; the writer's rejections, added below, it counted itself.
        let rejected_by_parsing = batch.poison.len();
        for (outcome, index) in outcomes.iter().zip(&batch.origins) {
            if let EventOutcome::Rejected(error) = outcome {
                let letter = batch.dead_letter_of(&batch.refs[*index], error.to_string());
                batch.poison.push(letter);
            }
        }
        while let Err(error) = self.dead_letter(&batch.poison).await {
            // Committing past a poison record before it is in the dead-letter topic would lose it.
            tracing::warn!(%error, "kafka: writing dead letters failed; retrying");
            backoff.wait(shutdown).await?;
        }
        let commit = self.status.made_durable(&batch.next_offsets);
        if !commit.is_empty() {
            // Async: a lost commit only means a redelivery, which dedupe absorbs; the revoke and the final
            // commit are synchronous.
            if let Err(error) = self
                .consumer
                .commit(&offsets_list(&self.config.topic, &commit), CommitMode::Async)
            {
                tracing::warn!(%error, "kafka: committing offsets failed; the next commit covers them");
            }
        }
        self.status
            .records
            .fetch_add(batch.records as u64, Ordering::Relaxed);
        metrics::counter!("rankgate_kafka_records_total").increment(batch.records as u64);
        metrics::counter!("rankgate_kafka_dead_lettered_total").increment(batch.poison.len() as u64);
        crate::rankings::service::count_events_rejected_before_ingest(rejected_by_parsing);
        Ok(())
    }

    async fn dead_letter(&self, letters: &[DeadLetter]) -> anyhow::Result<()> {
        if letters.is_empty() {
            return Ok(());
        }
        let sends = letters.iter().map(|letter| {
            let (partition, offset) = (letter.partition.to_string(), letter.offset.to_string());
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: ERROR_HEADER,
                    value: Some(letter.error.as_bytes()),
                })
                .insert(Header {
                    key: SOURCE_TOPIC_HEADER,
                    value: Some(self.config.topic.as_bytes()),
                })
                .insert(Header {
                    key: SOURCE_PARTITION_HEADER,
                    value: Some(partition.as_bytes()),
                })
                .insert(Header {
                    key: SOURCE_OFFSET_HEADER,
                    value: Some(offset.as_bytes()),
                });
            let mut record = FutureRecord::<[u8], [u8]>::to(&self.config.dead_letter_topic).headers(headers);
            if let Some(value) = &letter.value {
                record = record.payload(value.as_slice());
            }
            if let Some(key) = &letter.key {
                record = record.key(key.as_slice());
            }
            self.producer.send(record, Duration::from_secs(30))
        });
        for delivered in futures_util::future::join_all(sends).await {
            delivered.map_err(|(error, _)| anyhow::anyhow!("{error}"))?;
        }
        Ok(())
    }

    /// The records-per-second gauge (the lag comes with librdkafka's statistics, see [`RebalanceContext`]).
    async fn measure_rate_until_stopped(&self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(LAG_INTERVAL);
        let mut last = (Instant::now(), 0u64);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let records = self.status.records.load(Ordering::Relaxed);
            let elapsed = last.0.elapsed().as_secs_f64();
            if elapsed > 0.0 {
                metrics::gauge!("rankgate_kafka_records_per_second").set((records - last.1) as f64 / elapsed);
            }
            last = (Instant::now(), records);
        }
    }
}

/// Makes sure the dead-letter topic exists (one partition), so the first poison record does not wait
/// on a broker that does not create topics on demand. Best effort: a failure is only logged, and the
/// dead-letter writes retry until the topic is there.
async fn ensure_topic(brokers: &str, topic: &str) {
    let admin: Result<AdminClient<DefaultClientContext>, _> =
        ClientConfig::new().set("bootstrap.servers", brokers).create();
    let admin = match admin {
        Ok(admin) => admin,
        Err(error) => {
            tracing::warn!(%error, "kafka: creating an admin client failed");
            return;
        }
    };
    let options = AdminOptions::new().request_timeout(Some(BROKER_CALL_TIMEOUT));
    let created = tokio::time::timeout(
        BROKER_CALL_TIMEOUT * 2,
        admin.create_topics(&[NewTopic::new(topic, 1, TopicReplication::Fixed(1))], &options),
    )
    .await;
    match created {
        Ok(Ok(results)) => {
            for result in results {
                if let Err((_, code)) = result {
                    if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                        tracing::warn!(%code, topic, "kafka: creating the dead-letter topic failed");
                    }
                }
            }
        }
        Ok(Err(error)) => tracing::warn!(%error, topic, "kafka: creating the dead-letter topic failed"),
        Err(_) => tracing::warn!(topic, "kafka: creating the dead-letter topic timed out"),
    }
}

/// The service is stopping; the work in hand is left for a redelivery.
struct Stopped;

/// Waits between retries: 100 ms doubling to 5 s.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Backoff {
        Backoff(Duration::from_millis(100))
    }

    async fn wait(&mut self, shutdown: &CancellationToken) -> Result<(), Stopped> {
        tokio::select! {
            _ = shutdown.cancelled() => return Err(Stopped),
            _ = tokio::time::sleep(self.0) => {}
        }
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
        Ok(())
    }
}
