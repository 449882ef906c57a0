//! `relay-bench`: rows/s of `rankgate relay` draining an outbox of `--rows` rows into Kafka, from
//! PostgreSQL and from MariaDB, in one run (issue 11's target: ≥ 50,000 rows/s PostgreSQL → Kafka).
//!
//! It starts tansu (in-memory storage) on a spare port, creates a topic of `--partitions` partitions,
//! fills an outbox table of its own in each database (PostgreSQL: a fresh schema; MariaDB: a fresh
//! database; both dropped at the end) with `product_viewed` events, then times
//! `rankgate relay --drain --kafka …` and checks that every row was marked published.
//!
//! ```text
//! relay-bench [--rankgate target/release/rankgate] [--rows 500000] [--batch-size 5000] [--partitions 6]
//!             [--postgres postgres://postgres@127.0.0.1:5432/test] [--mariadb mysql://root@127.0.0.1:3306]
//!             [--skip-mariadb]
//! ```

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "relay-bench",
    about = "Outbox relay throughput, PostgreSQL and MariaDB → Kafka (tansu)"
)]
struct Cli {
    /// The rankgate binary to run.
    #[arg(long, default_value = "target/release/rankgate")]
    rankgate: PathBuf,
    /// Outbox rows per database.
    #[arg(long, default_value_t = 500_000)]
    rows: u64,
    /// The relay's --batch-size.
    #[arg(long, default_value_t = 5_000)]
    batch_size: u32,
    /// The relay's --workers (claim loops on connections of their own).
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// PostgreSQL (a schema of its own is created in it).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    postgres: String,
    /// MariaDB server, without a database (one of its own is created).
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306")]
    mariadb: String,
    /// Measure PostgreSQL only.
    #[arg(long)]
    skip_mariadb: bool,
    /// The tansu binary.
    #[arg(long, env = "TANSU", default_value = "tansu")]
    tansu: String,
}

fn spare_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a spare port")
}

/// Time `rankgate relay --drain` on one outbox; returns rows/s.
fn time_relay(cli: &Cli, outbox: &str, table: &str, broker: &str) -> anyhow::Result<f64> {
    let started = Instant::now();
    let output = Command::new(&cli.rankgate)
        .args(["relay", "--outbox", outbox, "--table", table, "--kafka", broker])
        .args([
            "--topic",
            "events",
            "--drain",
            "--batch-size",
            &cli.batch_size.to_string(),
        ])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", cli.rankgate.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    if !output.status.success() {
        bail!(
            "relay failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    println!("  {}", String::from_utf8_lossy(&output.stdout).trim());
    Ok(cli.rows as f64 / seconds)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let port = spare_port();
    let broker = format!("127.0.0.1:{port}");
    let mut tansu = Command::new(&cli.tansu)
        .args(["broker", "--listener-url", &format!("tcp://{broker}")])
        .args(["--advertised-listener-url", &format!("tcp://{broker}")])
        .args(["--storage-engine", "memory://tansu/"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting tansu (scripts/install-tansu.sh)")?;
    let result = run(&cli, &broker);
    let _ = tansu.kill();
    let _ = tansu.wait();
    result
}

fn run(cli: &Cli, broker: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(broker).is_err() {
        if Instant::now() > deadline {
            bail!("tansu did not listen on {broker}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    tokio::runtime::Runtime::new()?.block_on(create_topic(broker, cli.partitions))?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let rows = cli.rows;
    println!(
        "relay-bench: {rows} rows per database, --batch-size {} --workers {}, topic of {} partitions on tansu {broker}",
        cli.batch_size, cli.workers, cli.partitions
    );

    // PostgreSQL.
    let schema = format!("relay_bench_{}", std::process::id());
    let mut pg = postgres::Client::connect(&cli.postgres, postgres::NoTls).context("--postgres")?;
    let fill = Instant::now();
    pg.batch_execute(&format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.outbox (id bigserial PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now(),
                                       payload jsonb NOT NULL, published_at timestamptz);
         INSERT INTO {schema}.outbox (created_at, payload)
           SELECT now() - make_interval(secs => ({rows} - g) / 1000.0),
                  jsonb_build_object('id', 'e' || g, 'type', 'product_viewed', 'ts', {now_ms} - 60000 + g % 60000,
                                     'product_id', 'p' || (g % 10000))
           FROM generate_series(1, {rows}) g;
         CREATE INDEX ON {schema}.outbox (created_at, id) WHERE published_at IS NULL;
         ANALYZE {schema}.outbox;"
    ))?;
    println!("postgres: filled in {:.1}s", fill.elapsed().as_secs_f64());
    let pg_rate = time_relay(cli, &cli.postgres, &format!("{schema}.outbox"), broker);
    let left: i64 = pg
        .query_one(
            &format!("SELECT count(*) FROM {schema}.outbox WHERE published_at IS NULL"),
            &[],
        )?
        .get(0);
    pg.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))?;
    let pg_rate = pg_rate?;
    if left != 0 {
        bail!("postgres: {left} rows left unpublished");
    }
    println!("postgres → kafka: {pg_rate:.0} rows/s");

    if cli.skip_mariadb {
        return Ok(());
    }
    let database = format!("relay_bench_{}", std::process::id());
    let mariadb = |sql: &str| -> anyhow::Result<String> {
        let output = Command::new("mariadb")
            .args(["-h", "127.0.0.1", "-u", "root", "-N", "-e", sql])
            .output()
            .context("running the mariadb client")?;
        if !output.status.success() {
            bail!("mariadb: {}", String::from_utf8_lossy(&output.stderr));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let fill = Instant::now();
    mariadb(&format!(
        "CREATE DATABASE {database};
         USE {database};
         CREATE TABLE {database}.outbox (id BIGINT AUTO_INCREMENT PRIMARY KEY,
             created_at DATETIME(6) NOT NULL DEFAULT NOW(6), payload JSON NOT NULL, published_at DATETIME(6) NULL,
             INDEX unpublished (published_at, created_at, id));
         INSERT INTO {database}.outbox (created_at, payload)
           SELECT NOW(6) - INTERVAL (({rows} - seq) * 1000) MICROSECOND,
                  JSON_OBJECT('id', CONCAT('e', seq), 'type', 'product_viewed', 'ts', {now_ms} - 60000 + seq % 60000,
                              'product_id', CONCAT('p', seq % 10000))
           FROM seq_1_to_{rows};
         ANALYZE TABLE {database}.outbox;"
    ))?;
    println!("mariadb: filled in {:.1}s", fill.elapsed().as_secs_f64());
    let my_rate = time_relay(cli, &format!("{}/{database}", cli.mariadb), "outbox", broker);
    let left = mariadb(&format!(
        "SELECT COUNT(*) FROM {database}.outbox WHERE published_at IS NULL"
    ));
    mariadb(&format!("DROP DATABASE {database}"))?;
    let my_rate = my_rate?;
    if left? != "0" {
        bail!("mariadb: rows left unpublished");
    }
    println!("mariadb → kafka: {my_rate:.0} rows/s");
    println!("ratio mariadb/postgres: {:.2}", my_rate / pg_rate);
    Ok(())
}

async fn create_topic(broker: &str, partitions: i32) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker)
        .create()?;
    let results = admin
        .create_topics(
            &[NewTopic::new("events", partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await?;
    for result in results {
        if let Err((name, code)) = result {
            bail!("creating topic {name}: {code}");
        }
    }
    Ok(())
}
