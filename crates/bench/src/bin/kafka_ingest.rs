//! `kafka-ingest`: a Kafka backlog for `rankgate serve --kafka`, and the time rankgate takes to drain it.
//!
//! ```text
//! kafka-ingest produce FILE --kafka 127.0.0.1:9092 --topic events [--partitions 4] [--limit N]
//! kafka-ingest drain --url http://127.0.0.1:8080 --records N [--max-secs 900]
//! ```
//!
//! `produce` creates the topic and writes the NDJSON file's events, one per record, keyed by `product_id`
//! (the record format rankgate reads), through one idempotent producer that batches (`linger.ms` 50,
//! 1 MiB batches, lz4), and prints `records/s` once every record is acknowledged.
//!
//! `drain` polls the server's `/readyz` every 50 ms. The clock starts at the first poll that sees records
//! handled (so the group join, which tansu makes slow, is not counted) and stops at the first poll that
//! sees `records` reach `--records`; the rate is the records handled in between over that time. Each
//! record is durable in the source of truth when counted. It then waits for the lag (librdkafka's
//! statistics, once a second) to read 0 with nothing in flight, and prints one line:
//!
//! ```text
//! kafka-ingest drain: 998000 records in 9.8 s = 101836 records/s, lag 0 after 10.6 s (peak lag 1000000)
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use rankgate_bench::loopback_base_url;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

#[derive(Parser)]
#[command(
    name = "kafka-ingest",
    about = "Produce a Kafka backlog of events, or time rankgate draining it"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the topic and produce the file's events, keyed by product_id.
    Produce {
        /// NDJSON file, one event per line.
        file: PathBuf,
        /// Bootstrap broker, HOST:PORT.
        #[arg(long)]
        kafka: String,
        /// Topic to produce to.
        #[arg(long, default_value = "events")]
        topic: String,
        /// Partitions of the topic when it is created.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
        /// Produce at most this many records.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Read the topic from the beginning with a bare librdkafka consumer (no rankgate): the broker's own
    /// delivery rate, the ceiling of any consumer.
    Consume {
        /// Bootstrap broker, HOST:PORT.
        #[arg(long)]
        kafka: String,
        /// Topic to read.
        #[arg(long, default_value = "events")]
        topic: String,
        /// Records to read.
        #[arg(long)]
        records: u64,
        /// librdkafka `max.partition.fetch.bytes`.
        #[arg(long, default_value_t = 1_048_576)]
        partition_fetch_bytes: u64,
    },
    /// Wait for a rankgate consuming the topic to handle `--records` records and report the rate.
    Drain {
        /// Base URL of the rankgate server (loopback only).
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Records to wait for.
        #[arg(long)]
        records: u64,
        /// Upper bound on the wait, in seconds.
        #[arg(long, default_value_t = 900.0)]
        max_secs: f64,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Produce {
            file,
            kafka,
            topic,
            partitions,
            limit,
        } => produce(&file, &kafka, &topic, partitions, limit).await,
        Command::Consume {
            kafka,
            topic,
            records,
            partition_fetch_bytes,
        } => consume(&kafka, &topic, records, partition_fetch_bytes),
        Command::Drain {
            url,
            records,
            max_secs,
        } => drain(&url, records, max_secs).await,
    }
}

async fn produce(
    file: &PathBuf,
    kafka: &str,
    topic: &str,
    partitions: i32,
    limit: Option<usize>,
) -> anyhow::Result<()> {
    if !(1..=1_000).contains(&partitions) {
        bail!("--partitions must be 1 to 1000");
    }
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    let keys: Vec<String> = lines
        .iter()
        .map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).context("a line is not JSON")?;
            Ok(event["product_id"].as_str().unwrap_or_default().to_string())
        })
        .collect::<anyhow::Result<_>>()?;
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", kafka).create()?;
    let created = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await?;
    for result in created {
        if let Err((name, code)) = result {
            if code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                bail!("creating topic {name}: {code}");
            }
        }
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .set("enable.idempotence", "true")
        .set("linger.ms", "50")
        .set("batch.size", "1048576")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let started = Instant::now();
    for (chunk, chunk_keys) in lines.chunks(50_000).zip(keys.chunks(50_000)) {
        let sends = chunk.iter().zip(chunk_keys).map(|(line, key)| {
            producer.send(
                FutureRecord::to(topic).key(key.as_str()).payload(*line),
                Duration::from_secs(120),
            )
        });
        for delivered in futures_util::future::join_all(sends).await {
            delivered.map_err(|(error, _)| anyhow::anyhow!("producing: {error}"))?;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "kafka-ingest produce: {} records in {secs:.1} s = {:.0} records/s to {topic} ({partitions} partitions)",
        lines.len(),
        lines.len() as f64 / secs
    );
    Ok(())
}

fn consume(kafka: &str, topic: &str, records: u64, partition_fetch_bytes: u64) -> anyhow::Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .set("group.id", format!("kafka-ingest-consume-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("max.partition.fetch.bytes", partition_fetch_bytes.to_string())
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut list = rdkafka::TopicPartitionList::new();
    for partition in metadata.topics()[0].partitions() {
        list.add_partition_offset(topic, partition.id(), rdkafka::Offset::Beginning)?;
    }
    consumer.assign(&list)?;
    let mut read = 0u64;
    let mut started = None;
    let deadline = Instant::now() + Duration::from_secs(600);
    while read < records && Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            message?;
            started.get_or_insert_with(Instant::now);
            read += 1;
        }
    }
    let secs = started.map_or(0.0, |s| s.elapsed().as_secs_f64()).max(1e-3);
    println!(
        "kafka-ingest consume: {read} records in {secs:.1} s = {:.0} records/s (max.partition.fetch.bytes {partition_fetch_bytes})",
        read as f64 / secs
    );
    Ok(())
}

async fn drain(url: &str, records: u64, max_secs: f64) -> anyhow::Result<()> {
    let base = loopback_base_url(url).map_err(anyhow::Error::msg)?;
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs_f64(max_secs);
    let mut first: Option<(Instant, u64)> = None;
    let mut peak_lag = 0u64;
    let mut drained: Option<(f64, u64)> = None;
    loop {
        if Instant::now() > deadline {
            bail!("kafka-ingest drain: not drained within {max_secs} s");
        }
        let ready: serde_json::Value = match client.get(format!("{base}/readyz")).send().await {
            Ok(response) => response.json().await.unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        let kafka = &ready["kafka"];
        let handled = kafka["records"].as_u64().unwrap_or(0);
        let lag = kafka["lag"].as_u64();
        peak_lag = peak_lag.max(lag.unwrap_or(0));
        if handled > 0 && first.is_none() {
            first = Some((Instant::now(), handled));
        }
        // The rate stops at the last record handled; the lag, measured from librdkafka's statistics once
        // a second, is then awaited separately so its reporting interval does not count as consuming.
        if handled >= records && drained.is_none() {
            let (start, at_start) = first.expect("records were seen");
            drained = Some((start.elapsed().as_secs_f64().max(1e-3), handled - at_start));
        }
        if let Some((secs, counted)) = drained {
            if lag == Some(0) && kafka["inFlight"] == 0 {
                let (start, _) = first.expect("records were seen");
                println!(
                    "kafka-ingest drain: {counted} records in {secs:.1} s = {:.0} records/s, lag 0 after {:.1} s (peak lag {peak_lag})",
                    counted as f64 / secs,
                    start.elapsed().as_secs_f64()
                );
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
