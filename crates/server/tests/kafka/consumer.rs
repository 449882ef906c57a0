//! `rankgate serve --kafka`: the built binary consuming a real broker (tansu). Each test waits on the
//! consumer's assignment and lag as `/readyz` reports them (tansu's first group join can take tens of
//! seconds), never on a fixed sleep, and ends with `rankgate verify` on the source of truth.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::{json, Value};

use rankgate_testkit::postgres_schemas::{postgres_url, SchemaGuard};
use rankgate_workload::{seed_lesson, SeedLessonConfig};

use crate::broker::Broker;

/// A record to produce: its key, and its value (`None`: a record without one).
type Record = (String, Option<Vec<u8>>);
/// A record read back: its value and its headers as text.
type ReadRecord = (Option<Vec<u8>>, Vec<(String, String)>);

/// How long a test waits for the group to form or the lag to drain: generous, for a shared machine and
/// tansu's slow first join.
const DEADLINE: Duration = Duration::from_secs(240);

/// A running `rankgate serve`, killed (SIGKILL) when dropped.
pub struct Server {
    child: Child,
    pub address: String,
}

impl Server {
    /// Starts the binary with `args` after `serve --listen 127.0.0.1:0`, and waits for its listening line.
    pub fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rankgate"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("RANKGATE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the rankgate binary starts");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let address = line
            .trim()
            .strip_prefix("rankgate listening on ")
            .unwrap_or_else(|| panic!("the listening line, got {line:?}"))
            .to_string();
        Server { child, address }
    }

    /// SIGKILL: no chance to flush or commit anything.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The `kafka` object of `/readyz`.
    pub async fn kafka(&self) -> Value {
        let body: Value = reqwest::get(format!("{}/readyz", self.address))
            .await
            .expect("readyz answers")
            .json()
            .await
            .expect("readyz is JSON");
        body["kafka"].clone()
    }

    /// Waits until `accept` holds for the `kafka` object of `/readyz`, and returns it.
    pub async fn wait_for(&self, what: &str, accept: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let kafka = self.kafka().await;
            if accept(&kafka) {
                return kafka;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; last /readyz kafka: {kafka}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until this instance owns partitions and has consumed every record produced so far.
    pub async fn wait_drained(&self) -> Value {
        self.wait_for("the lag to reach 0", |k| {
            k["assigned"] == true && k["lag"] == 0 && k["inFlight"] == 0
        })
        .await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A config file with the given `kafka*` settings (and anything else), in `dir`.
pub fn config_file(dir: &Path, text: &str) -> String {
    let path = dir.join("rankgate.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// A producer that batches, for quick backlogs.
pub fn producer(broker: &Broker) -> FutureProducer {
    broker
        .client_config()
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .create()
        .expect("producer")
}

/// Produces `(key, value)` records (a `None` value is a record without one) and waits for every ack.
pub async fn produce(producer: &FutureProducer, topic: &str, records: &[Record]) {
    for chunk in records.chunks(5_000) {
        let sends = chunk.iter().map(|(key, value)| {
            let mut record = FutureRecord::<str, [u8]>::to(topic).key(key.as_str());
            if let Some(value) = value {
                record = record.payload(value.as_slice());
            }
            producer.send(record, Duration::from_secs(60))
        });
        for delivered in futures_util::future::join_all(sends).await {
            delivered.expect("the broker acknowledges the record");
        }
    }
}

/// Workload events as records keyed by product, in a shuffled order (so event times arrive out of order),
/// with every tenth event sent a second time further on.
fn workload_records(seed: u64, scale: f64) -> (Vec<Record>, BTreeSet<String>) {
    let now = jiff::Timestamp::now().as_millisecond();
    let events = seed_lesson(&SeedLessonConfig::new(seed, now - 60_000).with_scale(scale));
    let mut records: Vec<Record> = events
        .iter()
        .map(|e| (e.product_id(), Some(e.to_json().to_string().into_bytes())))
        .collect();
    let ids: BTreeSet<String> = events
        .iter()
        .map(|e| e.to_json()["id"].as_str().unwrap().to_string())
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    records.shuffle(&mut rng);
    let duplicates: Vec<_> = records.iter().step_by(10).cloned().collect();
    records.extend(duplicates);
    records.shuffle(&mut rng);
    (records, ids)
}

/// Runs `rankgate verify <args>`, asserts it passes, and returns how many raw events it read.
fn verify(args: &[&str]) -> usize {
    let output = Command::new(env!("CARGO_BIN_EXE_rankgate"))
        .arg("verify")
        .args(args)
        .output()
        .expect("the rankgate binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success() && stdout.contains("OK"),
        "rankgate verify {args:?} failed:\n{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let count = stdout
        .split("verify: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a raw event count in {stdout}"));
    count
}

/// Reads `count` records of partition 0 of `topic` from the beginning.
fn read_topic(broker: &Broker, topic: &str, count: usize) -> Vec<ReadRecord> {
    let consumer: BaseConsumer = broker
        .client_config()
        .set("group.id", "rankgate-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Beginning).unwrap();
    consumer.assign(&list).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut records = Vec::new();
    while records.len() < count {
        assert!(
            Instant::now() < deadline,
            "{topic} holds {} records, {count} expected",
            records.len()
        );
        if let Some(message) = consumer.poll(Duration::from_millis(500)) {
            let message = message.expect("reading the dead-letter topic");
            let headers = message
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| {
                            (
                                h.key.to_string(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            records.push((message.payload().map(<[u8]>::to_vec), headers));
        }
    }
    records
}

fn header<'a>(headers: &'a [(String, String)], key: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_equals_recompute_on_a_workload_consumed_from_kafka_with_poison_in_the_middle() {
    let broker = Broker::start();
    broker.create_topic("events", 3).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), "kafka_batch = 700\nkafka_linger_millis = 10\n");
    let (mut records, ids) = workload_records(11, 0.004);
    let now = jiff::Timestamp::now().as_millisecond();
    // Late beyond `max_lateness` (35 days): handled (`tooOld`), not counted, not dead letters.
    let too_old = json!({"id": "late-1", "type": "product_viewed", "ts": now - 40 * 86_400_000i64,
        "product_id": "p1", "categories": ["cat1"]});
    let poison: Vec<Record> = [
        Some(b"not json at all".to_vec()),
        Some(br#"{"id":"no-type","ts":1767225600000,"product_id":"p2"}"#.to_vec()),
        None,
        Some(br#"[{"id":"an-array"}]"#.to_vec()),
        Some(br#"{"id":"x","type":"product_viewed","ts":"soon","product_id":"p5","categories":[]}"#.to_vec()),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, value)| (format!("p{i}"), value))
    .collect();
    let middle = records.len() / 2;
    records.splice(middle..middle, poison.iter().cloned());
    records.insert(middle / 2, ("p1".into(), Some(too_old.to_string().into_bytes())));
    let producer = producer(&broker);
    produce(&producer, "events", &records).await;

    let server = Server::start(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--config",
        &config,
        "--kafka",
        &broker.address,
        "--kafka-topic",
        "events",
        "--kafka-group",
        "rankgate-recompute",
    ]);
    let kafka = server.wait_drained().await;
    assert_eq!(
        kafka["records"],
        records.len(),
        "every record handled once: {kafka}"
    );
    assert_eq!(kafka["group"], "rankgate-recompute");
    assert_eq!(kafka["partitions"], json!([0, 1, 2]));
    let dead = read_topic(&broker, "events.dead", poison.len());
    let error_of = |value: &Option<Vec<u8>>| {
        let (_, headers) = dead
            .iter()
            .find(|(dead_value, _)| dead_value == value)
            .unwrap_or_else(|| panic!("{value:?} is dead-lettered with its value: {dead:?}"));
        assert_eq!(header(headers, "rankgate-source-topic"), Some("events"));
        header(headers, "rankgate-error")
            .expect("the error header")
            .to_string()
    };
    let errors: Vec<String> = poison.iter().map(|(_, value)| error_of(value)).collect();
    for (error, field) in errors.iter().zip(["event:", "type:", "value:", "event:", "ts:"]) {
        assert!(error.starts_with(field), "{error} should name {field}");
    }
    let metrics = reqwest::get(format!("{}/metrics", server.address))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for expected in [
        "rankgate_kafka_dead_lettered_total 5",
        "rankgate_kafka_consumer_lag{topic=\"events\",partition=\"0\"} 0",
        "rankgate_kafka_rebalances_total{kind=\"assign\"}",
        "rankgate_kafka_records_per_second",
    ] {
        assert!(
            metrics.contains(expected),
            "/metrics lacks {expected}:\n{metrics}"
        );
    }

    drop(server);
    let counted = verify(&["--data-dir", dir.path().to_str().unwrap()]);
    assert_eq!(
        counted,
        ids.len(),
        "every distinct valid event is in the log once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_batch_then_restart_counts_every_event_exactly_once() {
    let broker = Broker::start();
    broker.create_topic("orders", 2).await;
    let dir = tempfile::tempdir().unwrap();
    // A short session, so the restarted instance need not wait long for the killed member to time out.
    let config = config_file(
        dir.path(),
        "kafka_batch = 300\nkafka_linger_millis = 5\nkafka_session_timeout_millis = 6000\n",
    );
    let (records, ids) = workload_records(12, 0.006);
    let producer = producer(&broker);
    // Two thirds before the first instance starts, the rest only after it is killed: however fast it
    // consumes, the kill lands before the end of the stream.
    let (early, late) = records.split_at(records.len() * 2 / 3);
    produce(&producer, "orders", early).await;
    let args = [
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--config",
        &config,
        "--kafka",
        &broker.address,
        "--kafka-topic",
        "orders",
    ];
    let mut first = Server::start(&args);
    let third = records.len() / 3;
    let seen = first
        .wait_for("a third of the records", |k| {
            k["records"].as_u64().unwrap_or(0) as usize >= third
        })
        .await;
    first.kill();
    let consumed_before = seen["records"].as_u64().unwrap() as usize;
    assert!(
        consumed_before < records.len(),
        "the kill landed mid-stream: {seen}"
    );
    produce(&producer, "orders", late).await;

    let second = Server::start(&args);
    let kafka = second.wait_drained().await;
    // Whatever the first instance made durable but had not committed comes back, and is absorbed.
    assert!(
        kafka["records"].as_u64().unwrap() as usize <= records.len(),
        "the restart resumed from the committed offsets: {kafka}"
    );
    drop(second);
    let counted = verify(&["--data-dir", dir.path().to_str().unwrap()]);
    assert_eq!(counted, ids.len(), "every event counted exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_postgres_share_the_partitions_and_one_dies_mid_stream() {
    let schema = format!("rgtest_kafka_{}", std::process::id());
    let _cleanup = SchemaGuard::named(schema.clone());

    let broker = Broker::start();
    broker.create_topic("shared", 4).await;
    let (records, ids) = workload_records(13, 0.006);
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let settings = "kafka_batch = 300\nkafka_linger_millis = 5\nkafka_session_timeout_millis = 6000\nfreshness_millis = 200\n";
    let instance = |dir: &Path| {
        let config = config_file(dir, settings);
        Server::start(&[
            "--data-dir",
            dir.to_str().unwrap(),
            "--config",
            &config,
            "--database",
            &postgres_url(),
            "--database-schema",
            &schema,
            "--kafka",
            &broker.address,
            "--kafka-topic",
            "shared",
            "--kafka-group",
            "rankgate-shared",
        ])
    };
    let mut a = instance(dir_a.path());
    let b = instance(dir_b.path());
    // Both members hold partitions before anything is produced, so the kill below takes some from one.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (ka, kb) = (a.kafka().await, b.kafka().await);
        let (pa, pb) = (
            ka["partitions"].as_array().unwrap().len(),
            kb["partitions"].as_array().unwrap().len(),
        );
        if pa > 0 && pb > 0 && pa + pb == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "the group never split: a {ka}, b {kb}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let producer = producer(&broker);
    let (early, late) = records.split_at(records.len() / 2);
    produce(&producer, "shared", early).await;
    let quarter = records.len() / 8;
    a.wait_for("instance a to consume some records", |k| {
        k["records"].as_u64().unwrap_or(0) as usize >= quarter
    })
    .await;
    a.kill();
    produce(&producer, "shared", late).await;
    let kafka = b
        .wait_for("instance b to own every partition and drain them", |k| {
            k["partitions"] == json!([0, 1, 2, 3]) && k["lag"] == 0 && k["inFlight"] == 0
        })
        .await;
    assert!(kafka["records"].as_u64().unwrap() > 0);
    drop(b);
    let counted = verify(&["--database", &postgres_url(), "--database-schema", &schema]);
    assert_eq!(
        counted,
        ids.len(),
        "every event counted exactly once across both instances"
    );
}

/// The value of the unlabelled series `name` in `/metrics` (`/readyz` waits on the writer, which the
/// test below holds up on purpose).
async fn metric(server: &Server, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", server.address))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_source_of_truth_pauses_the_partitions_instead_of_buffering_and_resumes_after() {
    let schema = format!("rgtest_kafka_pause_{}", std::process::id());
    let _cleanup = SchemaGuard::named(schema.clone());

    let broker = Broker::start();
    broker.create_topic("slow", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "kafka_batch = 100\nkafka_max_in_flight = 200\nkafka_linger_millis = 5\n",
    );
    let server = Server::start(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--config",
        &config,
        "--database",
        &postgres_url(),
        "--database-schema",
        &schema,
        "--kafka",
        &broker.address,
        "--kafka-topic",
        "slow",
    ]);
    server.wait_for("an assignment", |k| k["assigned"] == true).await;

    // Another session holds the tables ingest writes: every commit of the writer waits on it.
    let mut lock = Command::new("psql")
        .args([postgres_url().as_str(), "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("psql runs");
    {
        use std::io::Write;
        let stdin = lock.stdin.as_mut().unwrap();
        writeln!(
            stdin,
            "BEGIN; LOCK TABLE {schema}.event_log, {schema}.processed, {schema}.metrics_hourly IN ACCESS EXCLUSIVE MODE;"
        )
        .unwrap();
        stdin.flush().unwrap();
    }
    let (records, ids) = workload_records(14, 0.004);
    assert!(records.len() > 2_000, "{} records", records.len());
    produce(&producer(&broker), "slow", &records).await;

    let deadline = Instant::now() + DEADLINE;
    while metric(&server, "rankgate_kafka_paused").await != Some(1.0) {
        assert!(Instant::now() < deadline, "the consumer never paused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Paused, it stops reading: what it holds stays near the bound while the rest waits in the broker.
    for _ in 0..10 {
        let in_flight = metric(&server, "rankgate_kafka_in_flight_records").await.unwrap();
        assert!(
            in_flight <= 1_000.0,
            "{in_flight} records buffered with kafka_max_in_flight = 200"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(metric(&server, "rankgate_kafka_paused").await, Some(1.0));

    {
        use std::io::Write;
        let stdin = lock.stdin.as_mut().unwrap();
        writeln!(stdin, "COMMIT;").unwrap();
    }
    drop(lock.stdin.take());
    let _ = lock.wait();
    let kafka = server.wait_drained().await;
    assert_eq!(kafka["paused"], false, "resumed: {kafka}");
    assert_eq!(kafka["records"], records.len(), "{kafka}");
    assert!(metric(&server, "rankgate_kafka_pauses_total").await.unwrap() >= 1.0);
    drop(server);
    let counted = verify(&["--database", &postgres_url(), "--database-schema", &schema]);
    assert_eq!(counted, ids.len());
}
