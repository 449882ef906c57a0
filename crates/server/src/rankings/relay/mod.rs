//! `rankgate relay`: moves a shop's transactional outbox table (PostgreSQL or MySQL/MariaDB) to Kafka
//! or to rankgate's `POST /v1/events`, marking rows published only after they were acknowledged.
//!
//! The loop: claim the oldest unpublished rows (`FOR UPDATE SKIP LOCKED`, so several relays share one
//! outbox), publish them, mark them published, commit. A crash between publish and commit resends the
//! batch; rankgate's event-id idempotency (and the Kafka consumer on top of it) absorbs the resend.
//! Between batches it deletes published rows past `--retention` in bounded batches and refreshes the
//! backlog figures that `/metrics` (`--metrics-listen`) and the terminal progress line show.

pub mod outbox;
pub mod sink;
mod telemetry;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

use outbox::{Outbox, OutboxTable};
use sink::Sink;
use telemetry::Telemetry;

/// Test-only: milliseconds to sleep after a batch was acknowledged and before it is marked published,
/// so a test can SIGKILL the relay in exactly that window.
const PAUSE_AFTER_PUBLISH_ENV: &str = "RANKGATE_RELAY_TEST_PAUSE_AFTER_PUBLISH_MS";
/// How often the backlog is measured (a `count(*)` over the unpublished rows) and retention runs.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(2);
/// At most this many retention batches per housekeeping round, so deleting never starves publishing.
const RETENTION_BATCHES_PER_ROUND: usize = 20;

/// Flags of `rankgate relay`. `Debug` is written by hand: the outbox URL and the ingest key are secrets.
#[derive(Args)]
#[command(group = clap::ArgGroup::new("sink").required(true).args(["kafka", "to"]))]
pub struct RelayArgs {
    /// The outbox database: postgres://… or mysql://… (mariadb://… too); may hold a password, never
    /// printed
    #[arg(long, env = "RANKGATE_RELAY_OUTBOX", hide_env_values = true)]
    outbox: String,
    /// The outbox table, `name` or `schema.name`
    #[arg(long, default_value = "outbox")]
    table: String,
    /// Column: the row's unique id (tie-break of the oldest-first order)
    #[arg(long, default_value = "id")]
    id_column: String,
    /// Column: the row's creation time (a timestamp)
    #[arg(long, default_value = "created_at")]
    created_column: String,
    /// Column: one event's JSON, exactly what POST /v1/events takes for one event
    #[arg(long, default_value = "payload")]
    payload_column: String,
    /// Column: NULL until published, then the time it was
    #[arg(long, default_value = "published_at")]
    published_column: String,
    /// Kafka brokers, HOST:PORT[,HOST:PORT…]
    #[arg(long, requires = "topic")]
    kafka: Option<String>,
    /// Kafka topic (with --kafka)
    #[arg(long)]
    topic: Option<String>,
    /// Extra librdkafka producer setting KEY=VALUE (repeatable), e.g. compression.type=lz4
    #[arg(long = "kafka-option", value_name = "KEY=VALUE")]
    kafka_options: Vec<String>,
    /// rankgate to POST /v1/events to, e.g. http://rankgate:8080 (instead of --kafka)
    #[arg(long)]
    to: Option<String>,
    /// Bearer key for --to's ingest (never printed)
    #[arg(long, env = "RANKGATE_RELAY_INGEST_KEY", hide_env_values = true)]
    ingest_key: Option<String>,
    /// File holding the bearer key for --to (first line)
    #[arg(long, conflicts_with = "ingest_key")]
    ingest_key_file: Option<PathBuf>,
    /// Rows per batch (one transaction)
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u32).range(1..=20_000))]
    batch_size: u32,
    /// Larger payloads are not sent (no event is near it) but marked published, so they cannot block
    /// the outbox; memory per batch stays under --batch-size × this
    #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(1_024..=1_048_576))]
    max_payload_bytes: u32,
    /// Events per POST with --to (rankgate's max_batch is 10,000 by default)
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    post_size: u32,
    /// Seconds to wait for a connection, an acknowledgement or a POST
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=600))]
    timeout: u32,
    /// Milliseconds to wait before looking again when the outbox is empty
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(10..=60_000))]
    poll_interval_ms: u32,
    /// Delete published rows older than this (e.g. 7d, 12h, 30m, 90s); without it nothing is deleted
    #[arg(long, value_parser = parse_retention)]
    retention: Option<Duration>,
    /// Rows per retention DELETE
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    retention_batch: u32,
    /// Serve Prometheus /metrics on this address (e.g. 0.0.0.0:9102)
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Concurrent claim/publish/mark loops in this process, each on a connection of its own (like
    /// that many relays; order across batches is then not kept, which counting does not need)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    workers: u32,
    /// Exit once no unpublished row is left (a one-off drain; otherwise the relay runs until stopped)
    #[arg(long)]
    drain: bool,
}

impl std::fmt::Debug for RelayArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayArgs")
            .field("table", &self.table)
            .field("kafka", &self.kafka)
            .field("topic", &self.topic)
            .field("to", &self.to)
            .field("batch_size", &self.batch_size)
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

/// Parses `--retention`: a positive whole number and a unit, `s`, `m`, `h` or `d`, at most 3650 days.
pub fn parse_retention(value: &str) -> Result<Duration, String> {
    let error =
        || format!("must be a number and a unit s, m, h or d (e.g. 7d), at most 3650d; got {value:?}");
    let unit_at = value.len().checked_sub(1).ok_or_else(error)?;
    let (number, unit) = value.split_at(unit_at);
    let number: u64 = number.parse().map_err(|_| error())?;
    let seconds = match unit {
        "s" => Some(number),
        "m" => number.checked_mul(60),
        "h" => number.checked_mul(3_600),
        "d" => number.checked_mul(86_400),
        _ => None,
    }
    .ok_or_else(error)?;
    if seconds == 0 || seconds > 3_650 * 86_400 {
        return Err(error());
    }
    Ok(Duration::from_secs(seconds))
}

/// Checks `--topic` as Kafka does: 1–249 of `[A-Za-z0-9._-]`, not `.` or `..`.
fn kafka_topic(value: &str) -> anyhow::Result<String> {
    if value.is_empty()
        || value.len() > 249
        || value == "."
        || value == ".."
        || !value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        bail!("--topic: must be 1-249 characters of letters, digits, '.', '_' or '-', got {value:?}");
    }
    Ok(value.to_owned())
}

/// Checks `--kafka`: a comma-separated list of `HOST:PORT`.
fn kafka_brokers(value: &str) -> anyhow::Result<String> {
    let ok = !value.is_empty()
        && value.len() <= 4096
        && value.split(',').all(|broker| {
            broker
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
        });
    if !ok {
        bail!("--kafka: must be HOST:PORT[,HOST:PORT…], got {value:?}");
    }
    Ok(value.to_owned())
}

/// Reads the ingest key from `--ingest-key` / its variable or `--ingest-key-file`.
fn ingest_key(args: &RelayArgs) -> anyhow::Result<Option<String>> {
    if let Some(path) = &args.ingest_key_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--ingest-key-file: reading {}", path.display()))?;
        let key = text.lines().next().unwrap_or("").trim().to_owned();
        if key.is_empty() {
            bail!("--ingest-key-file: {} holds no key", path.display());
        }
        return Ok(Some(key));
    }
    Ok(args.ingest_key.clone().filter(|key| !key.is_empty()))
}

/// What a relay run did (`--drain` prints it).
#[derive(Debug, Clone, Copy)]
pub struct RelaySummary {
    /// Rows published and marked.
    pub rows: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// Validates the flags, connects, and relays until stopped (or, with `--drain`, until the outbox has
/// no unpublished row).
pub async fn run(args: RelayArgs) -> anyhow::Result<RelaySummary> {
    let table = OutboxTable {
        table: outbox::table_name(&args.table)?,
        id: outbox::sql_identifier("--id-column", &args.id_column)?,
        created: outbox::sql_identifier("--created-column", &args.created_column)?,
        payload: outbox::sql_identifier("--payload-column", &args.payload_column)?,
        published: outbox::sql_identifier("--published-column", &args.published_column)?,
    };
    outbox::is_postgres_url(&args.outbox)?;
    let timeout = Duration::from_secs(args.timeout.into());
    let batch_size = args.batch_size as usize;
    let sink = match (&args.kafka, &args.to) {
        (Some(brokers), None) => {
            let brokers = kafka_brokers(brokers)?;
            let topic = kafka_topic(args.topic.as_deref().unwrap_or(""))?;
            let mut options = Vec::new();
            for option in &args.kafka_options {
                let (key, value) = option
                    .split_once('=')
                    .filter(|(key, _)| !key.is_empty())
                    .with_context(|| format!("--kafka-option: must be KEY=VALUE, got {option:?}"))?;
                options.push((key.to_owned(), value.to_owned()));
            }
            Sink::kafka(&brokers, &topic, timeout, batch_size, &options)?
        }
        (None, Some(to)) => Sink::http(to, ingest_key(&args)?, timeout, args.post_size as usize)?,
        _ => bail!("give exactly one of --kafka (with --topic) or --to"),
    };
    let pause_after_publish = std::env::var(PAUSE_AFTER_PUBLISH_ENV)
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(Duration::from_millis);

    let telemetry = Arc::new(Telemetry::default());
    if let Some(address) = args.metrics_listen {
        telemetry::serve(address, telemetry.clone()).await?;
    }
    let progress = telemetry::progress(std::io::stderr().is_terminal());

    let shared = Arc::new(Shared {
        url: args.outbox.clone(),
        table,
        sink,
        telemetry: telemetry.clone(),
        progress: progress.clone(),
        started: Instant::now(),
        timeout,
        batch_size,
        max_payload: args.max_payload_bytes as usize,
        poll_interval: Duration::from_millis(args.poll_interval_ms.into()),
        drain: args.drain,
        retention: args.retention,
        retention_batch: args.retention_batch as usize,
        pause_after_publish,
    });
    // Each worker is a relay of its own (its own connection, its own claims); connect them all first,
    // so a bad --outbox fails the command at once instead of being retried.
    let mut outboxes = Vec::new();
    for _ in 0..args.workers {
        outboxes.push(Outbox::connect(&shared.url, &shared.table, timeout).await?);
    }
    let workers: Vec<_> = outboxes
        .into_iter()
        .enumerate()
        .map(|(index, outbox)| tokio::spawn(worker(shared.clone(), index, outbox)))
        .collect();
    for worker in workers {
        worker.await.context("a relay worker panicked")?;
    }
    progress.finish_and_clear();
    Ok(RelaySummary {
        rows: telemetry.published.load(Ordering::Relaxed),
        seconds: shared.started.elapsed().as_secs_f64(),
    })
}

/// What every worker of one relay process shares.
struct Shared {
    url: String,
    table: OutboxTable,
    sink: Sink,
    telemetry: Arc<Telemetry>,
    progress: indicatif::ProgressBar,
    started: Instant,
    timeout: Duration,
    batch_size: usize,
    max_payload: usize,
    poll_interval: Duration,
    drain: bool,
    retention: Option<Duration>,
    retention_batch: usize,
    pause_after_publish: Option<Duration>,
}

/// One claim → publish → mark → commit loop; worker 0 also does the housekeeping. Returns when
/// draining and the outbox has no unclaimed unpublished row; otherwise runs until the process stops.
async fn worker(shared: Arc<Shared>, index: usize, mut outbox: Outbox) {
    let telemetry = &*shared.telemetry;
    let mut last_housekeeping: Option<Instant> = None;
    let mut failures: u32 = 0;
    loop {
        if index == 0 && last_housekeeping.is_none_or(|at| at.elapsed() >= HOUSEKEEPING_EVERY) {
            last_housekeeping = Some(Instant::now());
            if let Err(error) = housekeeping(&mut outbox, &shared).await {
                tracing::warn!(error = format!("{error:#}"), "outbox housekeeping failed");
            }
            telemetry.show(&shared.progress, shared.started);
        }
        let (sink, pause) = (&shared.sink, shared.pause_after_publish);
        let attempt = outbox.relay_batch(shared.batch_size, shared.max_payload, |rows| async move {
            let published = sink.publish(&rows).await?;
            telemetry
                .rejected
                .fetch_add(published.rejected as u64, Ordering::Relaxed);
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
            Ok::<_, anyhow::Error>(rows)
        });
        match attempt.await {
            Ok(relayed) => {
                failures = 0;
                if relayed > 0 {
                    telemetry.published.fetch_add(relayed as u64, Ordering::Relaxed);
                    telemetry.batches.fetch_add(1, Ordering::Relaxed);
                    telemetry.show(&shared.progress, shared.started);
                }
                if relayed < shared.batch_size {
                    if shared.drain && relayed == 0 {
                        if index == 0 {
                            // Retention once more, so a drain leaves the outbox as a running relay would.
                            if let Err(error) = housekeeping(&mut outbox, &shared).await {
                                tracing::warn!(error = format!("{error:#}"), "outbox housekeeping failed");
                            }
                        }
                        return;
                    }
                    tokio::time::sleep(shared.poll_interval).await;
                }
            }
            Err(error) => {
                // The batch was rolled back: its rows are claimed again. Back off (bounded), reconnect.
                failures = failures.saturating_add(1);
                telemetry.errors.fetch_add(1, Ordering::Relaxed);
                let backoff = Duration::from_millis(200u64 << failures.min(6)).min(Duration::from_secs(10));
                tracing::warn!(
                    error = format!("{error:#}"),
                    ?backoff,
                    "relaying a batch failed; it will be sent again"
                );
                shared
                    .progress
                    .println(format!("relay: {error:#} (retrying in {backoff:?})"));
                tokio::time::sleep(backoff).await;
                match Outbox::connect(&shared.url, &shared.table, shared.timeout).await {
                    Ok(fresh) => outbox = fresh,
                    Err(error) => {
                        tracing::warn!(error = format!("{error:#}"), "reconnecting to the outbox failed")
                    }
                }
            }
        }
    }
}

/// Retention (bounded) and the backlog figures.
async fn housekeeping(outbox: &mut Outbox, shared: &Shared) -> anyhow::Result<()> {
    if let Some(retention) = shared.retention {
        let limit = shared.retention_batch;
        for _ in 0..RETENTION_BATCHES_PER_ROUND {
            let deleted = outbox.delete_published(retention, limit).await?;
            shared.telemetry.deleted.fetch_add(deleted, Ordering::Relaxed);
            if (deleted as usize) < limit {
                break;
            }
        }
    }
    let backlog = outbox.backlog().await?;
    shared.telemetry.set_backlog(backlog);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_takes_a_number_and_a_unit_and_is_bounded() {
        assert_eq!(parse_retention("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_retention("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_retention("12h"), Ok(Duration::from_secs(12 * 3_600)));
        for bad in [
            "",
            "d",
            "0d",
            "7",
            "7w",
            "-1d",
            "3651d",
            "99999999999999999999d",
            "1.5h",
        ] {
            assert!(parse_retention(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn topics_and_brokers_are_checked() {
        assert!(kafka_topic("events.v1_x-y").is_ok());
        assert!(kafka_topic("..").is_err());
        assert!(kafka_topic("a b").is_err());
        assert!(kafka_brokers("127.0.0.1:9092,k2:9093").is_ok());
        assert!(kafka_brokers("k1").is_err());
        assert!(kafka_brokers("k1:0").is_err());
        assert!(kafka_brokers("").is_err());
    }
}
