//! Where the relay sends the outbox: a Kafka topic (idempotent producer, key = `product_id`) or
//! rankgate's `POST /v1/events` (NDJSON batches). `publish` returns only once every row of the batch
//! was acknowledged; any failure fails the whole batch, which the caller then rolls back and resends.

use std::time::Duration;

use anyhow::{bail, Context};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::outbox::ClaimedRow;

/// The most events in one `POST /v1/events` (rankgate's default `max_batch`).
pub const MAX_EVENTS_PER_POST: usize = 10_000;
/// The most payload bytes in one POST, well under rankgate's 16 MiB body limit.
const MAX_BYTES_PER_POST: usize = 8 << 20;

/// A configured destination.
pub enum Sink {
    /// Kafka.
    Kafka {
        /// Idempotent (`enable.idempotence=true`, `acks=all`), so librdkafka's own retries never
        /// duplicate a record within a session.
        producer: FutureProducer,
        /// `--topic`.
        topic: String,
    },
    /// rankgate over HTTP.
    Http {
        /// With `--timeout` as the request timeout.
        client: reqwest::Client,
        /// `{--to}/v1/events`.
        url: String,
        /// `--ingest-key`, sent as a bearer token; never printed.
        key: Option<String>,
        /// Events per POST.
        per_post: usize,
    },
}

/// What the sink said about a published batch.
#[derive(Debug, Default, Clone, Copy)]
pub struct Published {
    /// Rows acknowledged (all of the batch, or the call failed).
    pub rows: usize,
    /// Of those, events rankgate rejected as invalid (HTTP only: they are marked published anyway, as
    /// a poison row must not block the outbox; the Kafka consumer dead-letters them instead).
    pub rejected: usize,
}

/// The record key: the event's `product_id`, so a product stays in one partition. `None` for a payload
/// that is not an event; such a record still goes out, and the consumer dead-letters it.
fn product_key(payload: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct KeyOnly {
        product_id: Option<String>,
    }
    serde_json::from_slice::<KeyOnly>(payload)
        .ok()
        .and_then(|event| event.product_id)
}

/// A row worth sending: its payload was read (not over `--max-payload-bytes`) and is not empty (an
/// empty or NULL payload is no event; an NDJSON batch of only such lines would not even parse).
fn sendable(row: &ClaimedRow) -> bool {
    row.oversize.is_none() && !row.payload.iter().all(u8::is_ascii_whitespace)
}

impl Sink {
    /// A Kafka sink on `brokers` (comma-separated `HOST:PORT`).
    pub fn kafka(
        brokers: &str,
        topic: &str,
        timeout: Duration,
        batch_size: usize,
        options: &[(String, String)],
    ) -> anyhow::Result<Sink> {
        let mut config = rdkafka::ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", timeout.as_millis().to_string())
            .set(
                "queue.buffering.max.messages",
                (batch_size * 2).max(100_000).to_string(),
            )
            .set("queue.buffering.max.kbytes", "1048576");
        for (key, value) in options {
            config.set(key, value);
        }
        let producer: FutureProducer = config.create().context("--kafka: creating the producer")?;
        Ok(Sink::Kafka {
            producer,
            topic: topic.to_owned(),
        })
    }

    /// An HTTP sink posting to `{base}/v1/events`.
    pub fn http(base: &str, key: Option<String>, timeout: Duration, per_post: usize) -> anyhow::Result<Sink> {
        let parsed = reqwest::Url::parse(base).map_err(|_| anyhow::anyhow!("--to: not a URL"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            bail!("--to: must be an http:// or https:// URL of a rankgate");
        }
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .context("--to: building the HTTP client")?;
        Ok(Sink::Http {
            client,
            url: format!("{}/v1/events", base.trim_end_matches('/')),
            key,
            per_post: per_post.clamp(1, MAX_EVENTS_PER_POST),
        })
    }

    /// Sends every row and waits for every acknowledgement.
    pub async fn publish(&self, rows: &[ClaimedRow]) -> anyhow::Result<Published> {
        let unsendable = rows.iter().filter(|row| !sendable(row)).count();
        if unsendable > 0 {
            tracing::warn!(
                rows = unsendable,
                largest_bytes = rows.iter().filter_map(|row| row.oversize).max(),
                "outbox payloads over --max-payload-bytes (or empty) are not sent; marked published anyway"
            );
        }
        let mut published = self.publish_within_limit(rows).await?;
        published.rejected += unsendable;
        Ok(published)
    }

    async fn publish_within_limit(&self, rows: &[ClaimedRow]) -> anyhow::Result<Published> {
        match self {
            Sink::Kafka { producer, topic } => {
                let mut deliveries = Vec::with_capacity(rows.len());
                for row in rows.iter().filter(|row| sendable(row)) {
                    let key = product_key(&row.payload);
                    loop {
                        let mut record: FutureRecord<'_, str, [u8]> =
                            FutureRecord::to(topic).payload(&row.payload[..]);
                        if let Some(key) = key.as_deref() {
                            record = record.key(key);
                        }
                        match producer.send_result(record) {
                            Ok(delivery) => {
                                deliveries.push(delivery);
                                break;
                            }
                            // The local queue is full: let librdkafka (its own polling thread) deliver
                            // some, then enqueue again.
                            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                                tokio::time::sleep(Duration::from_millis(2)).await;
                            }
                            Err((error, _)) => return Err(error).context("--kafka: enqueueing a record"),
                        }
                    }
                }
                for delivery in deliveries {
                    match delivery.await {
                        Ok(Ok(_)) => {}
                        Ok(Err((error, _))) => {
                            return Err(error).context("--kafka: the broker did not acknowledge a record")
                        }
                        Err(_) => bail!("--kafka: the producer dropped a record before its acknowledgement"),
                    }
                }
                Ok(Published {
                    rows: rows.len(),
                    rejected: 0,
                })
            }
            Sink::Http {
                client,
                url,
                key,
                per_post,
            } => {
                let mut published = Published::default();
                let rows: Vec<&ClaimedRow> = rows.iter().filter(|row| sendable(row)).collect();
                let mut start = 0;
                while start < rows.len() {
                    let mut body = Vec::new();
                    let mut end = start;
                    while end < rows.len()
                        && end - start < *per_post
                        && (end == start || body.len() + rows[end].payload.len() < MAX_BYTES_PER_POST)
                    {
                        // NDJSON: one event per line. Valid JSON holds no raw line break outside
                        // whitespace, so turning breaks into spaces keeps a pretty-printed payload
                        // one event and cannot merge two rows.
                        body.extend(rows[end].payload.iter().map(|&b| match b {
                            b'\n' | b'\r' => b' ',
                            other => other,
                        }));
                        body.push(b'\n');
                        end += 1;
                    }
                    let mut request = client
                        .post(url)
                        .header("content-type", "application/x-ndjson")
                        .body(body);
                    if let Some(key) = key {
                        request = request.bearer_auth(key);
                    }
                    // Errors without the URL: it may carry credentials.
                    let response = request
                        .send()
                        .await
                        .map_err(reqwest::Error::without_url)
                        .context("--to: posting events")?;
                    let status = response.status();
                    if !status.is_success() {
                        // The answer is rankgate's JSON error, which holds no secret.
                        let text = response.text().await.unwrap_or_default();
                        let text: String = text.chars().take(300).collect();
                        match status.as_u16() {
                            401 | 403 => bail!("--ingest-key: rankgate answered {status}: {text}"),
                            413 => bail!("--batch-size: rankgate answered {status}: {text}"),
                            _ => bail!("--to: rankgate answered {status}: {text}"),
                        }
                    }
                    #[derive(serde::Deserialize)]
                    struct Outcome {
                        #[serde(default)]
                        rejected: Vec<serde_json::Value>,
                    }
                    let outcome: Outcome = response
                        .json()
                        .await
                        .map_err(reqwest::Error::without_url)
                        .context("--to: reading rankgate's answer")?;
                    for rejection in outcome.rejected.iter().take(3) {
                        tracing::warn!(%rejection, "rankgate rejected an outbox event; marked published anyway");
                    }
                    published.rejected += outcome.rejected.len();
                    published.rows += end - start;
                    start = end;
                }
                Ok(published)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_the_product_id_or_none() {
        assert_eq!(
            product_key(br#"{"id":"e1","type":"product_viewed","product_id":"p7","ts":1}"#).as_deref(),
            Some("p7")
        );
        assert_eq!(product_key(b"not json"), None);
        assert_eq!(product_key(br#"{"product_id":5}"#), None);
    }

    #[test]
    fn empty_and_oversize_payloads_are_not_sent() {
        let row = |payload: &[u8], oversize| ClaimedRow {
            locator: super::super::outbox::RowLocator::Ctid("(0,1)".into()),
            payload: payload.to_vec(),
            oversize,
        };
        assert!(sendable(&row(b"{}", None)));
        assert!(!sendable(&row(b"", None)));
        assert!(!sendable(&row(b" \n\t", None)));
        assert!(!sendable(&row(b"", Some(70_000))));
    }

    #[test]
    fn a_to_url_must_be_http() {
        let timeout = Duration::from_secs(1);
        assert!(Sink::http("ftp://x", None, timeout, 10).is_err());
        assert!(Sink::http("nonsense", None, timeout, 10).is_err());
        assert!(Sink::http("http://127.0.0.1:1", None, timeout, 10).is_ok());
    }
}
