//! `rankgate relay` end to end: a real outbox (PostgreSQL in a schema of its own, MariaDB in a database
//! of its own), the real relay binary as a child process, a real tansu broker or a real rankgate.
//!
//! Kafka is read back with an assign()-based consumer up to each partition's high watermark (no group
//! join, no fixed sleeps); rankgate's counts are compared with a recompute of the rows' events.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::{json, Value};

use super::broker::Broker;
use crate::app::{spawn_app, spawn_app_with};

use rankgate_testkit::mariadb::mariadb_url;
use rankgate_testkit::postgres_schemas::postgres_url;

fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    )
}

/// One outbox table of its own on PostgreSQL or MariaDB.
enum Outbox {
    Postgres {
        client: tokio_postgres::Client,
        schema: String,
    },
    MariaDb {
        conn: mysql_async::Conn,
        database: String,
    },
}

impl Outbox {
    async fn postgres() -> Outbox {
        let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
            .await
            .expect("the shared PostgreSQL");
        tokio::spawn(connection);
        let schema = unique("relay");
        client
            .batch_execute(&format!(
                "CREATE SCHEMA {schema};
                 CREATE TABLE {schema}.outbox (
                   id bigserial PRIMARY KEY,
                   created_at timestamptz NOT NULL DEFAULT now(),
                   payload jsonb NOT NULL,
                   published_at timestamptz);
                 CREATE INDEX ON {schema}.outbox (created_at, id) WHERE published_at IS NULL;"
            ))
            .await
            .unwrap();
        Outbox::Postgres { client, schema }
    }

    async fn mariadb() -> Outbox {
        let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(&mariadb_url()).unwrap())
            .await
            .expect("the shared MariaDB");
        let database = unique("relay");
        conn.query_drop(format!("CREATE DATABASE {database}; USE {database}"))
            .await
            .unwrap();
        conn.query_drop(format!(
            "CREATE TABLE {database}.outbox (
               id BIGINT AUTO_INCREMENT PRIMARY KEY,
               created_at DATETIME(6) NOT NULL DEFAULT NOW(6),
               payload JSON NOT NULL,
               published_at DATETIME(6) NULL,
               INDEX unpublished (published_at, created_at, id))"
        ))
        .await
        .unwrap();
        Outbox::MariaDb { conn, database }
    }

    fn url(&self) -> String {
        match self {
            Outbox::Postgres { .. } => postgres_url(),
            Outbox::MariaDb { database, .. } => format!("{}/{database}", mariadb_url()),
        }
    }

    fn table(&self) -> String {
        match self {
            Outbox::Postgres { schema, .. } => format!("{schema}.outbox"),
            Outbox::MariaDb { .. } => "outbox".to_owned(),
        }
    }

    /// Inserts the events as the shop would, in chunks of one transaction each.
    async fn insert(&mut self, events: &[Value]) {
        for chunk in events.chunks(1_000) {
            let payloads: Vec<String> = chunk.iter().map(Value::to_string).collect();
            match self {
                Outbox::Postgres { client, schema } => {
                    client
                        .execute(
                            &format!(
                                "INSERT INTO {schema}.outbox (payload) SELECT p::jsonb FROM unnest($1::text[]) p"
                            ),
                            &[&payloads],
                        )
                        .await
                        .unwrap();
                }
                Outbox::MariaDb { conn, .. } => {
                    let placeholders = vec!["(?)"; payloads.len()].join(",");
                    conn.exec_drop(
                        format!("INSERT INTO outbox (payload) VALUES {placeholders}"),
                        mysql_async::Params::Positional(payloads.into_iter().map(Into::into).collect()),
                    )
                    .await
                    .unwrap();
                }
            }
        }
    }

    /// Runs one statement written for both dialects (the table is `{table}`).
    async fn execute(&mut self, sql: &str) {
        match self {
            Outbox::Postgres { client, schema } => {
                client
                    .batch_execute(&sql.replace("{table}", &format!("{schema}.outbox")))
                    .await
                    .unwrap();
            }
            Outbox::MariaDb { conn, .. } => conn.query_drop(sql.replace("{table}", "outbox")).await.unwrap(),
        }
    }

    async fn count(&mut self, condition: &str) -> i64 {
        match self {
            Outbox::Postgres { client, schema } => client
                .query_one(
                    &format!("SELECT count(*) FROM {schema}.outbox WHERE {condition}"),
                    &[],
                )
                .await
                .unwrap()
                .get(0),
            Outbox::MariaDb { conn, .. } => conn
                .query_first(format!("SELECT COUNT(*) FROM outbox WHERE {condition}"))
                .await
                .unwrap()
                .unwrap(),
        }
    }

    async fn drop_all(self) {
        match self {
            Outbox::Postgres { client, schema } => {
                let _ = client
                    .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                    .await;
            }
            Outbox::MariaDb { mut conn, database } => {
                let _ = conn.query_drop(format!("DROP DATABASE {database}")).await;
            }
        }
    }
}

/// `n` events over 25 products, a fifth of them payments, stamped in the last minutes.
fn events(n: usize, id_prefix: &str) -> Vec<Value> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    (0..n)
        .map(|i| {
            let product = format!("p{}", i % 25);
            let ts = now - 120_000 + (i % 100_000) as i64;
            if i % 5 == 0 {
                json!({"id": format!("{id_prefix}{i}"), "type": "payment_succeeded", "ts": ts,
                       "product_id": product, "quantity": 1 + i % 3, "price": 100 + i % 7})
            } else {
                json!({"id": format!("{id_prefix}{i}"), "type": "product_viewed", "ts": ts,
                       "product_id": product})
            }
        })
        .collect()
}

/// The metrics per product that counting every distinct event once gives.
fn recompute(events: &[Value]) -> BTreeMap<String, Value> {
    let mut seen = BTreeSet::new();
    let mut totals: BTreeMap<String, (i64, i64, i64)> = BTreeMap::new();
    for event in events {
        if !seen.insert(event["id"].as_str().unwrap().to_owned()) {
            continue;
        }
        let entry = totals
            .entry(event["product_id"].as_str().unwrap().to_owned())
            .or_default();
        match event["type"].as_str().unwrap() {
            "product_viewed" => entry.0 += 1,
            "payment_succeeded" => {
                let quantity = event["quantity"].as_i64().unwrap();
                entry.1 += quantity;
                entry.2 += quantity * event["price"].as_i64().unwrap();
            }
            other => panic!("unexpected {other}"),
        }
    }
    totals
        .into_iter()
        .map(|(product, (views, units, sales))| {
            (
                product,
                json!({"views": views, "likes": 0, "units": units, "sales": sales}),
            )
        })
        .collect()
}

/// What a rankgate serves per product over the last 7 days.
async fn served(address: &str) -> BTreeMap<String, Value> {
    let body: Value = reqwest::get(format!("{address}/v1/categories/all/top?window=7d&limit=1000"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            let metrics = &item["metrics"];
            (
                item["productId"].as_str().unwrap().to_owned(),
                json!({"views": metrics["views"], "likes": metrics["likes"],
                       "units": metrics["units"], "sales": metrics["sales"]}),
            )
        })
        .collect()
}

/// Waits (bounded) until rankgate serves exactly `expected`; an overshoot (an event counted twice)
/// never turns into equality, since nothing is relaying any more when this is called.
async fn assert_served_equals(address: &str, expected: &BTreeMap<String, Value>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = served(address).await;
        if &now == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "rankgate serves {now:?}\nbut the rows recompute to {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `rankgate relay` for this outbox with `extra` flags, as a child process.
fn spawn_relay(outbox: &Outbox, extra: &[&str], envs: &[(&str, &str)]) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rankgate"));
    command
        .arg("relay")
        .arg("--outbox")
        .arg(outbox.url())
        .arg("--table")
        .arg(outbox.table())
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in envs {
        command.env(key, value);
    }
    command.spawn().expect("the rankgate binary runs")
}

/// Waits (bounded) for a `--drain` relay to finish and asserts it succeeded.
async fn wait_success(mut child: Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let output = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(
                status.success(),
                "relay failed: {status}\n{stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            );
            return stdout;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the relay did not finish within 180 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Key of the records `read_topic` appends to every partition itself; never returned.
const SENTINEL_KEY: &str = "relay-test-sentinel";

/// Every record on `topic`: polls until at least `at_least` records came and then a poll of a second
/// brought nothing more (so a duplicate would show). Not by high watermark: tansu 0.6 reports one below
/// the last batch's records, and a fetch may not return a partition's last batch until another one
/// follows it. So first one sentinel record is appended to each partition (and left out of the answer):
/// every record the relay wrote is then behind a later batch, where fetches see it.
fn read_topic(broker: &Broker, topic: &str, at_least: usize) -> Vec<(Option<String>, Value)> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = broker.client_config().create().unwrap();
    let partitions = producer
        .client()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap()
        .topics()[0]
        .partitions()
        .len() as i32;
    for partition in 0..partitions {
        producer
            .send(
                BaseRecord::to(topic)
                    .partition(partition)
                    .key(SENTINEL_KEY)
                    .payload("{}"),
            )
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let consumer: BaseConsumer = broker
        .client_config()
        .set("group.id", "relay-test-reader")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in metadata.topics()[0].partitions() {
        assignment
            .add_partition_offset(topic, partition.id(), Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match consumer.poll(Duration::from_millis(1_000)) {
            Some(message) => {
                let message = message.unwrap();
                let key = message.key().map(|k| String::from_utf8(k.to_vec()).unwrap());
                if key.as_deref() == Some(SENTINEL_KEY) {
                    continue;
                }
                let value: Value = serde_json::from_slice(message.payload().unwrap()).unwrap();
                records.push((key, value));
            }
            None if records.len() >= at_least => return records,
            None => {}
        }
        assert!(
            Instant::now() < deadline,
            "reading {topic} back timed out with {} of at least {at_least} records",
            records.len()
        );
    }
}

/// Each record keyed by its event's product, and the set of event ids (with how often each came).
fn ids_on_topic(records: &[(Option<String>, Value)]) -> BTreeMap<String, usize> {
    let mut ids = BTreeMap::new();
    for (key, value) in records {
        assert_eq!(key.as_deref(), value["product_id"].as_str(), "key = product_id");
        *ids.entry(value["id"].as_str().unwrap().to_owned()).or_insert(0) += 1;
    }
    ids
}

async fn relays_every_row_to_kafka_exactly_once(mut outbox: Outbox) {
    let broker = Broker::start();
    broker.create_topic("events", 3).await;
    let events = events(5_000, "k");
    outbox.insert(&events).await;
    let relay = spawn_relay(
        &outbox,
        &[
            "--kafka",
            &broker.address,
            "--topic",
            "events",
            "--batch-size",
            "700",
            "--drain",
        ],
        &[],
    );
    let stdout = wait_success(relay).await;
    assert!(stdout.contains("relayed 5000 rows"), "{stdout}");
    assert_eq!(outbox.count("published_at IS NULL").await, 0);
    let records = read_topic(&broker, "events", events.len());
    assert_eq!(records.len(), events.len(), "each row exactly once");
    let sent: BTreeMap<String, &Value> = events
        .iter()
        .map(|e| (e["id"].as_str().unwrap().to_owned(), e))
        .collect();
    for (_, value) in &records {
        assert_eq!(
            &value,
            sent.get(value["id"].as_str().unwrap()).unwrap(),
            "content as stored"
        );
    }
    assert_eq!(ids_on_topic(&records).len(), events.len());
    outbox.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_rows_reach_kafka_exactly_once() {
    relays_every_row_to_kafka_exactly_once(Outbox::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_outbox_rows_reach_kafka_exactly_once() {
    relays_every_row_to_kafka_exactly_once(Outbox::mariadb().await).await;
}

async fn relays_to_rankgate_and_counts_equal_the_recompute(mut outbox: Outbox) {
    let rankgate = spawn_app().await;
    let mut events = events(4_000, "h");
    // The shop wrote one event twice (a retried transaction): counted once, as the recompute says.
    events.push(events[7].clone());
    let expected = recompute(&events);
    // A poison row (an invalid event): rankgate rejects it, the relay marks it published anyway, so it
    // never blocks the outbox, and it changes no count.
    events.insert(
        100,
        json!({"id": "poison", "type": "product_exploded", "product_id": "p1", "ts": 1}),
    );
    // A row over --max-payload-bytes (64 KiB by default): an otherwise valid event that is not sent
    // (had it been, p2 would count one view more) but marked, so it cannot block the outbox either.
    events.insert(
        200,
        json!({"id": "huge", "type": "product_viewed", "product_id": "p2",
                              "ts": events[0]["ts"], "note": "x".repeat(70_000)}),
    );
    outbox.insert(&events).await;
    let relay = spawn_relay(
        &outbox,
        &[
            "--to",
            &rankgate.address,
            "--batch-size",
            "900",
            "--post-size",
            "400",
            "--drain",
        ],
        &[],
    );
    wait_success(relay).await;
    assert_eq!(outbox.count("published_at IS NULL").await, 0);
    assert_served_equals(&rankgate.address, &expected).await;
    outbox.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outbox_relayed_to_rankgate_counts_equal_the_recompute() {
    relays_to_rankgate_and_counts_equal_the_recompute(Outbox::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_outbox_relayed_to_rankgate_counts_equal_the_recompute() {
    relays_to_rankgate_and_counts_equal_the_recompute(Outbox::mariadb().await).await;
}

/// SIGKILLs a relay after its first batch was acknowledged and before it was marked, then runs a new
/// relay to the end: the killed batch is sent again, and rankgate counts it once.
async fn sigkill_between_publish_and_mark_loses_nothing_and_counts_nothing_twice(mut outbox: Outbox) {
    let rankgate = spawn_app().await;
    let events = events(3_000, "c");
    outbox.insert(&events).await;
    let mut relay = spawn_relay(
        &outbox,
        &["--to", &rankgate.address, "--batch-size", "500"],
        &[("RANKGATE_RELAY_TEST_PAUSE_AFTER_PUBLISH_MS", "600000")],
    );
    // The first batch is acknowledged (rankgate counts it) and the relay sleeps before marking.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counted: i64 = served(&rankgate.address)
            .await
            .values()
            .map(|m| m["views"].as_i64().unwrap() + m["units"].as_i64().unwrap())
            .sum();
        if counted > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first batch never reached rankgate"
        );
        assert!(relay.try_wait().unwrap().is_none(), "the relay exited early");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.kill().unwrap(); // SIGKILL
    relay.wait().unwrap();
    assert_eq!(
        outbox.count("published_at IS NULL").await,
        3_000,
        "nothing was marked before the kill"
    );
    wait_success(spawn_relay(
        &outbox,
        &["--to", &rankgate.address, "--batch-size", "500", "--drain"],
        &[],
    ))
    .await;
    assert_eq!(outbox.count("published_at IS NULL").await, 0, "nothing lost");
    assert_served_equals(&rankgate.address, &recompute(&events)).await;
    outbox.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relay_sigkilled_between_publish_and_mark_counts_every_row_once() {
    sigkill_between_publish_and_mark_loses_nothing_and_counts_nothing_twice(Outbox::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_relay_sigkilled_between_publish_and_mark_counts_every_row_once() {
    sigkill_between_publish_and_mark_loses_nothing_and_counts_nothing_twice(Outbox::mariadb().await).await;
}

/// The same kill towards Kafka: the killed batch is on the topic twice, every row at least once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relay_sigkilled_after_publish_resends_to_kafka_and_loses_nothing() {
    let mut outbox = Outbox::postgres().await;
    let broker = Broker::start();
    broker.create_topic("events", 2).await;
    let events = events(2_000, "ck");
    outbox.insert(&events).await;
    let flags = [
        "--kafka",
        &broker.address,
        "--topic",
        "events",
        "--batch-size",
        "300",
    ];
    let mut relay = spawn_relay(
        &outbox,
        &flags,
        &[("RANKGATE_RELAY_TEST_PAUSE_AFTER_PUBLISH_MS", "600000")],
    );
    // The first batch is on the topic, and the relay sleeps before marking it.
    assert_eq!(read_topic(&broker, "events", 300).len(), 300);
    assert!(relay.try_wait().unwrap().is_none(), "the relay exited early");
    relay.kill().unwrap();
    relay.wait().unwrap();
    assert_eq!(outbox.count("published_at IS NULL").await, 2_000);
    let mut drain = flags.to_vec();
    drain.push("--drain");
    wait_success(spawn_relay(&outbox, &drain, &[])).await;
    let ids = ids_on_topic(&read_topic(&broker, "events", events.len() + 300));
    assert_eq!(ids.len(), events.len(), "every row reached the topic");
    let twice = ids.values().filter(|&&n| n == 2).count();
    assert_eq!(twice, 300, "exactly the killed batch was sent again");
    assert!(ids.values().all(|&n| n <= 2));
    outbox.drop_all().await;
}

/// Two relays on one outbox at once, with small batches so they interleave.
async fn two_relays_at_once_share_the_outbox(mut outbox: Outbox) {
    let broker = Broker::start();
    // One topic per relay: tansu 0.6 can hand two idempotent producers clashing sequences on one
    // partition and then acknowledge a batch it drops as a "duplicate" (CI lost 42-48 records that
    // way); a Kafka broker gives every producer its own id. The union of the two topics is what a
    // shared topic would hold, and SKIP LOCKED must still hand each row to exactly one relay.
    broker.create_topic("events-a", 3).await;
    broker.create_topic("events-b", 3).await;
    let rankgate = spawn_app().await;
    let events = events(12_000, "t");
    outbox.insert(&events).await;
    // Each holds its batch's locks a little longer, so the two overlap for certain.
    let slow = &[("RANKGATE_RELAY_TEST_PAUSE_AFTER_PUBLISH_MS", "5")];
    // Both at once towards Kafka: SKIP LOCKED hands each row to one of them.
    let kafka = |topic: &'static str| {
        [
            "--kafka".to_owned(),
            broker.address.clone(),
            "--topic".to_owned(),
            topic.to_owned(),
            "--batch-size".to_owned(),
            "150".to_owned(),
            "--drain".to_owned(),
        ]
    };
    let (args_a, args_b) = (kafka("events-a"), kafka("events-b"));
    let (args_a, args_b): (Vec<&str>, Vec<&str>) = (
        args_a.iter().map(String::as_str).collect(),
        args_b.iter().map(String::as_str).collect(),
    );
    let (a, b) = (
        spawn_relay(&outbox, &args_a, slow),
        spawn_relay(&outbox, &args_b, slow),
    );
    let (out_a, out_b) = (wait_success(a).await, wait_success(b).await);
    assert_eq!(outbox.count("published_at IS NULL").await, 0);
    let relayed = |out: &str| -> usize {
        let at = out
            .find("relayed ")
            .expect("the relay says how many rows it relayed")
            + 8;
        out[at..]
            .split(' ')
            .next()
            .unwrap()
            .replace(',', "")
            .parse()
            .unwrap()
    };
    let mut records = read_topic(&broker, "events-a", relayed(&out_a));
    records.extend(read_topic(&broker, "events-b", relayed(&out_b)));
    let ids = ids_on_topic(&records);
    assert_eq!(ids.len(), events.len(), "every row published");
    assert!(ids.values().all(|&n| n == 1), "no row published twice");
    assert!(
        !out_a.contains("relayed 0 rows") && !out_b.contains("relayed 0 rows"),
        "both relays took part: {out_a} / {out_b}"
    );
    // And towards rankgate: every row's effect counted once.
    outbox.execute("UPDATE {table} SET published_at = NULL").await;
    // (each with two workers: four claim loops at once)
    let to = [
        "--to",
        &rankgate.address,
        "--batch-size",
        "150",
        "--workers",
        "2",
        "--drain",
    ];
    let (a, b) = (spawn_relay(&outbox, &to, slow), spawn_relay(&outbox, &to, slow));
    wait_success(a).await;
    wait_success(b).await;
    assert_eq!(outbox.count("published_at IS NULL").await, 0);
    assert_served_equals(&rankgate.address, &recompute(&events)).await;
    outbox.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_postgres_outbox_publish_each_row_once() {
    two_relays_at_once_share_the_outbox(Outbox::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_mariadb_outbox_publish_each_row_once() {
    two_relays_at_once_share_the_outbox(Outbox::mariadb().await).await;
}

/// `--retention 1h`: published rows older than an hour go; newer published rows and unpublished rows
/// (however old) stay, the latter get published.
async fn retention_deletes_only_old_published_rows(mut outbox: Outbox, ago: fn(&str) -> String) {
    let broker = Broker::start();
    broker.create_topic("events", 1).await;
    outbox.insert(&events(600, "r")).await;
    // 1..=300: published 2 h ago (deleted); 301..=400: published 10 min ago (kept);
    // 401..=600: unpublished, created 3 h ago (published now, kept).
    for (set, range) in [
        (format!("published_at = {}", ago("2 HOUR")), "id <= 300"),
        (
            format!("published_at = {}", ago("10 MINUTE")),
            "id > 300 AND id <= 400",
        ),
        (format!("created_at = {}", ago("3 HOUR")), "id > 400"),
    ] {
        outbox
            .execute(&format!("UPDATE {{table}} SET {set} WHERE {range}"))
            .await;
    }
    let relay = spawn_relay(
        &outbox,
        &[
            "--kafka",
            &broker.address,
            "--topic",
            "events",
            "--retention",
            "1h",
            "--retention-batch",
            "70",
            "--drain",
        ],
        &[],
    );
    wait_success(relay).await;
    assert_eq!(outbox.count("id <= 300").await, 0, "old published rows deleted");
    assert_eq!(outbox.count("id > 300").await, 300, "the others kept");
    assert_eq!(outbox.count("published_at IS NULL").await, 0);
    assert_eq!(
        read_topic(&broker, "events", 200).len(),
        200,
        "only the unpublished rows were sent"
    );
    outbox.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_on_postgres_deletes_only_published_rows_older_than_it() {
    retention_deletes_only_old_published_rows(Outbox::postgres().await, |a| {
        format!("now() - interval '{a}'")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_on_mariadb_deletes_only_published_rows_older_than_it() {
    retention_deletes_only_old_published_rows(Outbox::mariadb().await, |a| format!("NOW(6) - INTERVAL {a}"))
        .await;
}

/// Run as a service: `/metrics` shows the rows published and the backlog falling to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_relay_serves_its_progress_on_metrics() {
    let mut outbox = Outbox::postgres().await;
    let broker = Broker::start();
    broker.create_topic("events", 1).await;
    outbox.insert(&events(1_000, "m")).await;
    let mut relay = spawn_relay(
        &outbox,
        &[
            "--kafka",
            &broker.address,
            "--topic",
            "events",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    let mut stdout = std::io::BufReader::new(relay.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("relay metrics on ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
        if text.contains("rankgate_relay_rows_published_total 1000\n")
            && text.contains("rankgate_relay_backlog_rows 0\n")
        {
            assert!(
                text.contains("rankgate_relay_oldest_unpublished_seconds 0.000\n"),
                "{text}"
            );
            assert!(
                text.contains("# TYPE rankgate_relay_rows_per_second gauge"),
                "{text}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "metrics never showed the drained outbox:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    relay.kill().unwrap();
    relay.wait().unwrap();
    outbox.drop_all().await;
}

/// Hostile flags: refused before any SQL runs, naming the flag, never echoing the outbox's password.
#[test]
fn bad_flags_are_refused_naming_the_flag() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_rankgate"))
            .arg("relay")
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} was accepted");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let outbox = ["--outbox", "postgres://u:hunter2@127.0.0.1:1/db"];
    let cases: &[(&[&str], &str)] = &[
        (
            &["--id-column", "id; DROP TABLE outbox", "--to", "http://x:1"],
            "--id-column",
        ),
        (
            &["--payload-column", "pay\"load", "--to", "http://x:1"],
            "--payload-column",
        ),
        (&["--table", "a.b.c", "--to", "http://x:1"], "--table"),
        (&["--kafka", "nohost", "--topic", "t"], "--kafka"),
        (&["--kafka", "k:9092", "--topic", "bad topic"], "--topic"),
        (&["--to", "ftp://x"], "--to"),
        (&["--to", "http://x:1", "--batch-size", "0"], "--batch-size"),
        (&["--to", "http://x:1", "--batch-size", "1000000"], "--batch-size"),
        (&["--to", "http://x:1", "--retention", "7 days"], "--retention"),
        (
            &["--to", "http://x:1", "--kafka", "k:1", "--topic", "t"],
            "--kafka",
        ),
        (&["--to", "http://x:1", "--timeout", "100000"], "--timeout"),
    ];
    for (flags, named) in cases {
        let mut args = outbox.to_vec();
        args.extend_from_slice(flags);
        let stderr = run(&args);
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
        assert!(
            !stderr.contains("hunter2"),
            "{flags:?} echoed the password: {stderr}"
        );
    }
    let stderr = run(&["--outbox", "redis://u:hunter2@h/", "--to", "http://x:1"]);
    assert!(
        stderr.contains("--outbox") && !stderr.contains("hunter2"),
        "{stderr}"
    );
}

/// Unacknowledged means unmarked: with a wrong ingest key rankgate answers 401, the relay keeps the rows
/// unpublished and retries (naming the flag, never printing the key); with the right key from a file it
/// relays them all, each counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_rankgate_refused_stay_unpublished_until_it_acknowledges_them() {
    let mut outbox = Outbox::postgres().await;
    let rankgate = spawn_app_with(|config| {
        config.ingest_keys = rankgate::config::BearerKeys::from_plain(&["right-key-7Qx"]);
    })
    .await;
    let events = events(1_500, "a");
    outbox.insert(&events).await;
    let mut relay = spawn_relay(
        &outbox,
        &["--to", &rankgate.address, "--metrics-listen", "127.0.0.1:0"],
        &[("RANKGATE_RELAY_INGEST_KEY", "wrong-key-9Zy")],
    );
    let mut stdout = std::io::BufReader::new(relay.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let url = line.trim().strip_prefix("relay metrics on ").unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
        if !text.contains("rankgate_relay_batch_failures_total 0\n") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the relay never failed a batch:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.kill().unwrap();
    let output = relay.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--ingest-key"), "{stderr}");
    assert!(!stderr.contains("wrong-key-9Zy"), "the key was printed: {stderr}");
    assert_eq!(
        outbox.count("published_at IS NULL").await,
        1_500,
        "nothing marked"
    );

    let key_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key_file.path(), "right-key-7Qx\n").unwrap();
    let key_path = key_file.path().to_str().unwrap().to_owned();
    let stdout = wait_success(spawn_relay(
        &outbox,
        &[
            "--to",
            &rankgate.address,
            "--ingest-key-file",
            &key_path,
            "--drain",
        ],
        &[],
    ))
    .await;
    assert!(!stdout.contains("right-key-7Qx"));
    assert_eq!(outbox.count("published_at IS NULL").await, 0);
    assert_served_equals(&rankgate.address, &recompute(&events)).await;
    outbox.drop_all().await;
}
