//! Kafka ingest (`--kafka HOST:PORT[,…] --kafka-topic events --kafka-group rankgate`, issue 11): rankgate
//! as a member of a Kafka consumer group, feeding the same validation, idempotency and writer as
//! `POST /v1/events`.
//!
//! # Record format
//! The value of a record is one event's JSON, exactly the object `POST /v1/events` takes for one event.
//! The key is expected to be the `product_id` (so a product's events stay in one partition); rankgate does
//! not read it, nor any header.
//!
//! # Delivery: at least once, exactly-once in effect
//! - Offsets are committed by hand, and only after the batch they cover is durable in the source of truth
//!   (SQLite, or PostgreSQL with `--database`). What is redelivered after a crash or a rebalance is
//!   absorbed by event-id idempotency, like a retried HTTP batch.
//! - On a rebalance a revoked partition commits what is durable, and nothing else.
//! - Poison records (no value, not JSON, an invalid event, or one the writer refuses) go to the dead-letter
//!   topic (`<topic>.dead` by default) with the error in the header `rankgate-error`, and are then
//!   committed past like any other: they never block a partition.
//! - Backpressure: records read but not yet durable are bounded by `kafka_max_in_flight`. At the bound
//!   the reader stops taking records for up to a second (librdkafka's bounded prefetch queue stops
//!   fetching meanwhile); if the writer has not brought the number down to half by then, every assigned
//!   partition is paused (the group membership is kept alive meanwhile) and resumed once it has.
//!
//! [`consumer`] is the consumer itself; [`status`] is what `/readyz` and `/metrics` show of it.

pub mod consumer;
pub mod status;

use serde::Deserialize;

use crate::config::bounded;

/// Config-file keys this module reads (the top-level `kafka*` keys).
pub const FILE_KEYS: [&str; 8] = [
    "kafka",
    "kafka_topic",
    "kafka_group",
    "kafka_dead_letter_topic",
    "kafka_batch",
    "kafka_max_in_flight",
    "kafka_linger_millis",
    "kafka_session_timeout_millis",
];

/// Flags (and their `RANKGATE_KAFKA*` variables) of `rankgate serve`.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct KafkaOverrides {
    /// Also ingest from Kafka: comma-separated bootstrap brokers HOST:PORT[,HOST:PORT…]
    #[arg(long = "kafka", hide_env_values = true, env = "RANKGATE_KAFKA")]
    pub brokers: Option<String>,
    /// Kafka topic to consume (one event's JSON per record) [default: events]
    #[arg(long = "kafka-topic", hide_env_values = true, env = "RANKGATE_KAFKA_TOPIC")]
    pub topic: Option<String>,
    /// Kafka consumer group, shared by every rankgate instance of one source of truth [default: rankgate]
    #[arg(long = "kafka-group", hide_env_values = true, env = "RANKGATE_KAFKA_GROUP")]
    pub group: Option<String>,
}

/// The `kafka*` keys of the config file.
#[derive(Debug, Default, Deserialize)]
pub struct KafkaFile {
    kafka: Option<String>,
    kafka_topic: Option<String>,
    kafka_group: Option<String>,
    kafka_dead_letter_topic: Option<String>,
    kafka_batch: Option<usize>,
    kafka_max_in_flight: Option<usize>,
    kafka_linger_millis: Option<u64>,
    kafka_session_timeout_millis: Option<u64>,
}

/// Where and how to consume, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `HOST:PORT` each.
    pub brokers: Vec<String>,
    /// The topic consumed.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// Where poison records go.
    pub dead_letter_topic: String,
    /// Most records ingested as one batch (one writer transaction).
    pub batch: usize,
    /// Most records read but not yet durable; past it the partitions are paused.
    pub max_in_flight: usize,
    /// How long a batch waits to fill after its first record before it is written anyway.
    pub linger_millis: u64,
    /// The group session timeout: how long a crashed instance keeps its partitions.
    pub session_timeout_millis: u64,
}

/// Largest record value read as an event; a larger one is poison (an event is a few hundred bytes).
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

impl KafkaConfig {
    /// The consumer settings from the flags and the file, or `None` when no brokers are given.
    pub fn merge(overrides: &KafkaOverrides, file: KafkaFile) -> anyhow::Result<Option<KafkaConfig>> {
        let Some(brokers) = overrides.brokers.clone().or(file.kafka) else {
            return Ok(None);
        };
        let brokers = parse_brokers(&brokers)?;
        let topic = overrides
            .topic
            .clone()
            .or(file.kafka_topic)
            .unwrap_or_else(|| "events".into());
        check_topic("kafka_topic (--kafka-topic / RANKGATE_KAFKA_TOPIC)", &topic)?;
        let group = overrides
            .group
            .clone()
            .or(file.kafka_group)
            .unwrap_or_else(|| "rankgate".into());
        anyhow::ensure!(
            !group.is_empty() && group.len() <= 255 && group.chars().all(|c| c.is_ascii_graphic()),
            "kafka_group (--kafka-group / RANKGATE_KAFKA_GROUP) must be 1 to 255 printable ASCII characters \
             without spaces"
        );
        let dead_letter_topic = file
            .kafka_dead_letter_topic
            .unwrap_or_else(|| format!("{topic}.dead"));
        check_topic("kafka_dead_letter_topic", &dead_letter_topic)?;
        anyhow::ensure!(
            dead_letter_topic != topic,
            "kafka_dead_letter_topic must differ from kafka_topic, or poison records would come back forever"
        );
        let batch = bounded("kafka_batch", file.kafka_batch.unwrap_or(5_000), 1..=100_000)?;
        let max_in_flight = bounded(
            "kafka_max_in_flight",
            file.kafka_max_in_flight.unwrap_or(50_000),
            batch..=1_000_000,
        )?;
        let linger_millis = bounded(
            "kafka_linger_millis",
            file.kafka_linger_millis.unwrap_or(20),
            0..=10_000,
        )?;
        let session_timeout_millis = bounded(
            "kafka_session_timeout_millis",
            file.kafka_session_timeout_millis.unwrap_or(45_000),
            1_000..=300_000,
        )?;
        Ok(Some(KafkaConfig {
            brokers,
            topic,
            group,
            dead_letter_topic,
            batch,
            max_in_flight,
            linger_millis,
            session_timeout_millis,
        }))
    }
}

/// `HOST:PORT[,HOST:PORT…]`; whitespace around each entry is ignored.
fn parse_brokers(raw: &str) -> anyhow::Result<Vec<String>> {
    let what = "kafka (--kafka / RANKGATE_KAFKA)";
    let brokers: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|b| !b.is_empty())
        .map(str::to_string)
        .collect();
    anyhow::ensure!(
        !brokers.is_empty(),
        "{what}: give at least one broker as HOST:PORT"
    );
    anyhow::ensure!(brokers.len() <= 100, "{what}: at most 100 brokers");
    for broker in &brokers {
        let valid = broker.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty()
                && host.len() <= 253
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._[]:".contains(c))
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        // The entry itself is not echoed: a mistyped URL may carry credentials.
        anyhow::ensure!(
            valid,
            "{what}: every broker must be HOST:PORT (e.g. 127.0.0.1:9092), without a scheme or credentials"
        );
    }
    Ok(brokers)
}

/// Kafka's own rule for topic names: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
fn check_topic(what: &str, topic: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=249).contains(&topic.len())
            && topic != "."
            && topic != ".."
            && topic
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)),
        "{what} must be 1 to 249 characters of a-z, A-Z, 0-9, '.', '_' and '-' (Kafka's topic names), got {topic:?}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> KafkaFile {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn no_brokers_means_no_consumer_and_defaults_follow_the_topic() {
        assert_eq!(
            KafkaConfig::merge(&KafkaOverrides::default(), file("")).unwrap(),
            None
        );
        let config = KafkaConfig::merge(&KafkaOverrides::default(), file("kafka = \"a:9092, b:9093\""))
            .unwrap()
            .unwrap();
        assert_eq!(config.brokers, ["a:9092", "b:9093"]);
        assert_eq!(
            (config.topic.as_str(), config.group.as_str()),
            ("events", "rankgate")
        );
        assert_eq!(config.dead_letter_topic, "events.dead");
        let overrides = KafkaOverrides {
            brokers: Some("127.0.0.1:1".into()),
            topic: Some("orders".into()),
            group: Some("g".into()),
        };
        let config = KafkaConfig::merge(&overrides, file("kafka = \"x:1\"\nkafka_topic = \"t\""))
            .unwrap()
            .unwrap();
        assert_eq!(config.brokers, ["127.0.0.1:1"]);
        assert_eq!((config.topic.as_str(), config.group.as_str()), ("orders", "g"));
        assert_eq!(config.dead_letter_topic, "orders.dead");
    }

    #[test]
    fn bad_settings_are_refused_naming_their_key_without_echoing_brokers() {
        for (text, key) in [
            ("kafka = \"\"", "kafka"),
            ("kafka = \"user:secret@host:9092\"", "kafka"),
            ("kafka = \"host\"", "kafka"),
            ("kafka = \"host:0\"", "kafka"),
            ("kafka = \"h:1\"\nkafka_topic = \"a b\"", "kafka_topic"),
            ("kafka = \"h:1\"\nkafka_topic = \"..\"", "kafka_topic"),
            ("kafka = \"h:1\"\nkafka_group = \"\"", "kafka_group"),
            (
                "kafka = \"h:1\"\nkafka_dead_letter_topic = \"events\"",
                "kafka_dead_letter_topic",
            ),
            ("kafka = \"h:1\"\nkafka_batch = 0", "kafka_batch"),
            (
                "kafka = \"h:1\"\nkafka_batch = 100\nkafka_max_in_flight = 99",
                "kafka_max_in_flight",
            ),
            (
                "kafka = \"h:1\"\nkafka_max_in_flight = 2000000",
                "kafka_max_in_flight",
            ),
            (
                "kafka = \"h:1\"\nkafka_linger_millis = 60000",
                "kafka_linger_millis",
            ),
            (
                "kafka = \"h:1\"\nkafka_session_timeout_millis = 10",
                "kafka_session_timeout_millis",
            ),
        ] {
            let error = KafkaConfig::merge(&KafkaOverrides::default(), file(text))
                .unwrap_err()
                .to_string();
            assert!(error.starts_with(key), "{text}: {error}");
            assert!(!error.contains("secret"), "{error}");
        }
    }
}
