//! Faults of the production backends, on a PostgreSQL server this test starts, restarts and stops itself
//! (its own data directory and port, so the shared server at :5432 is never disturbed):
//! - PostgreSQL restarted mid-ingest: every batch the client saw fail is re-sent until acknowledged,
//!   and each event is counted exactly once;
//! - a `rankgate serve` process SIGKILLed while it holds unacknowledged stream entries: another instance
//!   reclaims them (XAUTOCLAIM) and the counts are exact.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::*;

/// A PostgreSQL cluster owned by one test: `initdb` into a temp dir, `pg_ctl` to start, stop, restart.
pub(crate) struct OwnPostgres {
    dir: tempfile::TempDir,
    port: u16,
    bin: PathBuf,
}

fn postgres_bin() -> PathBuf {
    let versions =
        std::fs::read_dir("/usr/lib/postgresql").expect("PostgreSQL is installed (CI installs it)");
    let mut bins: Vec<PathBuf> = versions
        .flatten()
        .map(|v| v.path().join("bin"))
        .filter(|b| b.join("initdb").exists())
        .collect();
    bins.sort();
    bins.pop().expect("an initdb under /usr/lib/postgresql/*/bin")
}

impl OwnPostgres {
    pub(crate) fn start() -> OwnPostgres {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let pg = OwnPostgres {
            dir,
            port,
            bin: postgres_bin(),
        };
        // initdb refuses to run as root: run the server as the `postgres` user then.
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(pg.dir.path())
                .status()
                .unwrap();
            assert!(status.success());
        }
        let data = pg.data_dir();
        pg.run(
            "initdb",
            &[
                "-D",
                &data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        pg.pg_ctl("start");
        pg
    }

    fn data_dir(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let program = self.bin.join(tool);
        let mut command = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let output = command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {tool}: {e}"));
        assert!(
            output.status.success(),
            "{tool} {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// `start`, `stop` (immediate: like a crash) or `restart`.
    pub(crate) fn pg_ctl(&self, action: &str) {
        let data = self.data_dir();
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("log").display().to_string();
        match action {
            "stop" => self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]),
            _ => self.run(
                "pg_ctl",
                &[
                    "-D", &data, "-o", &options, "-l", &log, "-m", "fast", "-w", action,
                ],
            ),
        }
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let data = self.data_dir();
        let program = self.bin.join("pg_ctl");
        let mut command = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let _ = command
            .args(["-D", &data, "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn views(from: usize, count: usize, now: i64) -> Value {
    Value::Array(
        (from..from + count)
            .map(|i| {
                view(
                    &format!("e{i}"),
                    &format!("p{}", i % 13),
                    now - (i % 60) as i64 * 1000,
                    &["c1"],
                )
            })
            .collect(),
    )
}

fn total_views(body: &Value) -> i64 {
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["metrics"]["views"].as_i64().unwrap())
        .sum()
}

async fn wait_for_views(app: &TestApp, expected: i64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let body = app.get_json("/v1/categories/all/top?window=1d&limit=100").await;
        if total_views(&body) == expected {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "expected {expected} views, the server shows {}",
            total_views(&body)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_ingest_loses_nothing_and_counts_nothing_twice() {
    let pg = OwnPostgres::start();
    let url = pg.url();
    let app = spawn_app_with(move |config| {
        config.rankings.database = Some(url);
        config.rankings.freshness_millis = 200;
    })
    .await;
    let now = now_millis();
    const BATCHES: usize = 200;
    const SIZE: usize = 50;
    let address = app.address.clone();
    // A well-behaved client: each batch is re-sent until it is acknowledged.
    let client = tokio::spawn(async move {
        let http = reqwest::Client::new();
        let mut failures = 0;
        let (mut accepted, mut duplicates) = (0, 0);
        for batch in 0..BATCHES {
            let body = views(batch * SIZE, SIZE, now);
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let answer = http.post(format!("{address}/v1/events")).json(&body).send().await;
                match answer {
                    Ok(response) if response.status() == 200 => {
                        let counts: Value = response.json().await.unwrap();
                        accepted += counts["accepted"].as_u64().unwrap();
                        duplicates += counts["duplicates"].as_u64().unwrap();
                        break;
                    }
                    _ => failures += 1,
                }
                assert!(Instant::now() < deadline, "batch {batch} never acknowledged");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (accepted, duplicates, failures)
    });
    // Mid-ingest: once some batches are in, restart the database (fast shutdown cuts connections).
    wait_for_views_at_least(&app, (10 * SIZE) as i64).await;
    let restart = tokio::task::spawn_blocking(move || {
        pg.pg_ctl("restart");
        pg
    });
    let pg = restart.await.unwrap();
    assert!(!client.is_finished(), "the restart happened mid-ingest");
    let (accepted, duplicates, failures) = client.await.unwrap();
    let total = (BATCHES * SIZE) as u64;
    // Each batch got exactly one 200; a batch whose commit landed but whose answer was lost was re-sent
    // and reported as duplicates, so the client's counts cover every event once...
    eprintln!("postgres restart: {failures} failed sends, {duplicates} duplicates reported on re-send");
    assert_eq!(accepted + duplicates, total, "{failures} failed sends");
    // ...and the server counts every event exactly once: not lost, not doubled by the re-sends.
    wait_for_views(&app, total as i64).await;

    let data_dir = app.data_dir.display().to_string();
    assert_verify_passes(&["--database", &pg.url(), "--data-dir", &data_dir]);
    app.stop().await;
}

async fn wait_for_views_at_least(app: &TestApp, at_least: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while total_views(&app.get_json("/v1/categories/all/top?window=1d&limit=100").await) < at_least {
        assert!(Instant::now() < deadline, "ingest never reached {at_least} views");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Deletes the test's stream keys when it ends, passed or failed.
struct StreamGuard(String);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if let Ok(mut connection) = redis::Client::open(rankgate_testkit::redis_servers::standalone_url())
            .and_then(|c| c.get_connection())
        {
            let _: redis::RedisResult<i64> = redis::cmd("DEL")
                .arg(&self.0)
                .arg(format!("{}:dead", self.0))
                .query(&mut connection);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_held_by_a_killed_instance_are_reclaimed_by_another_and_counted_once() {
    use redis::AsyncCommands;
    let pg = OwnPostgres::start();
    let key = format!("rgtest:{}:faultstream", std::process::id());
    let _guard = StreamGuard(key.clone());
    let stream_url = format!("{}/{key}", rankgate_testkit::redis_servers::standalone_url());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rankgate.toml");
    std::fs::write(&config, "stream_claim_idle_millis = 300\n").unwrap();

    // Instance A: a real process, so it can be SIGKILLed.
    let mut a = Command::new(env!("CARGO_BIN_EXE_rankgate"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database",
            &pg.url(),
            "--stream",
            &stream_url,
        ])
        .arg("--data-dir")
        .arg(dir.path().join("a"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let redis = redis::Client::open(rankgate_testkit::redis_servers::standalone_url()).unwrap();
    let mut connection = redis.get_multiplexed_async_connection().await.unwrap();
    // A is up once its consumer group exists.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let groups: redis::RedisResult<redis::streams::StreamInfoGroupsReply> =
            connection.xinfo_groups(&key).await;
        if groups.is_ok_and(|g| !g.groups.is_empty()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "instance A never created its consumer group"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The database goes away, so A reads entries it cannot commit, and must not ack.
    let pg = tokio::task::spawn_blocking(move || {
        pg.pg_ctl("stop");
        pg
    })
    .await
    .unwrap();
    let now = now_millis();
    for i in 0..300 {
        let event = view(
            &format!("s{i}"),
            &format!("p{}", i % 7),
            now - i as i64 * 100,
            &["c1"],
        );
        let _: String = connection
            .xadd(&key, "*", &[("event", event.to_string())])
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pending: redis::streams::StreamPendingReply =
            connection.xpending(&key, "rankgate").await.unwrap();
        // A has read entries it cannot commit (how many depends on when its read ran; the rest were
        // never delivered): those are held, unacked, by a consumer about to die.
        if pending.count() > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "A never read the entries");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.kill().unwrap(); // SIGKILL
    a.wait().unwrap();
    let pg = tokio::task::spawn_blocking(move || {
        pg.pg_ctl("start");
        pg
    })
    .await
    .unwrap();

    // Instance B reclaims A's entries once they have been idle for the configured time.
    let (database, stream) = (pg.url(), stream_url.clone());
    let b = spawn_app_with(move |config| {
        config.rankings.database = Some(database);
        config.rankings.stream = Some(stream);
        config.rankings.stream_claim_idle_millis = 300;
        config.rankings.freshness_millis = 200;
    })
    .await;
    let body = wait_for_views(&b, 300).await;
    assert_eq!(body["total"], 7);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pending: redis::streams::StreamPendingReply =
            connection.xpending(&key, "rankgate").await.unwrap();
        if pending.count() == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} entries still pending",
            pending.count()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nothing more arrives later: still exactly 300.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        total_views(&b.get_json("/v1/categories/all/top?window=1d&limit=100").await),
        300
    );
    b.stop().await;
    drop(pg);
}
