//! `/readyz` tells the truth (issue 30): with the source of truth down (a PostgreSQL this test stops, a
//! full disk under the embedded SQLite) it answers 503 naming it, ingest answers 503, reads stay up; once
//! the source is back it is ready again and ingest works. A lost Redis (serving and queue store) is
//! reported, but the instance stays ready: its writes go to the source of truth.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::faults::OwnPostgres;
use crate::helpers::*;

/// `/readyz`'s status and body.
async fn readyz(app: &TestApp) -> (u16, Value) {
    let response = app.get("/readyz").await;
    let status = response.status().as_u16();
    (status, response.json().await.expect("readyz is JSON"))
}

/// Polls `/readyz` until it answers `status`, within `limit`; returns the body.
async fn readyz_until(app: &TestApp, status: u16, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let (now, body) = readyz(app).await;
        if now == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz did not answer {status} within {limit:?}; last: {now} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn events(from: usize, count: usize, now: i64) -> Value {
    Value::Array(
        (from..from + count)
            .map(|i| {
                view(
                    &format!("ready-{i:06}-{}", "x".repeat(40)),
                    &format!("p{}", i % 50),
                    now,
                    &["c"],
                )
            })
            .collect(),
    )
}

const READ: &str = "/v1/categories/all/top?ranker=popular&period=daily&limit=10";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_postgres_makes_the_instance_unready_for_writes_but_reads_stay_up() {
    let pg = OwnPostgres::start();
    let url = pg.url();
    let app = spawn_app_with(move |config| {
        config.rankings.database = Some(url);
    })
    .await;
    let now = now_millis();
    app.post_events_ok(&events(0, 10, now)).await;
    let (status, ready) = readyz(&app).await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["status"], "ready");
    let source = &ready["dependencies"]["sourceOfTruth"];
    assert_eq!(source["kind"], "postgres");
    assert_eq!(source["state"], "up");
    assert!(
        source["since"]
            .as_str()
            .is_some_and(|s| s.parse::<jiff::Timestamp>().is_ok()),
        "{source}"
    );
    assert_eq!(ready["dependencies"]["serving"]["kind"], "embedded");
    assert_eq!(ready["dependencies"]["queueStore"]["state"], "up");

    // No request in flight: the probe alone must notice.
    tokio::task::block_in_place(|| pg.pg_ctl("stop"));
    let down = readyz_until(&app, 503, Duration::from_secs(5)).await;
    assert_eq!(down["status"], "unavailable");
    assert!(down["error"].as_str().unwrap().contains("postgres"), "{down}");
    let source = &down["dependencies"]["sourceOfTruth"];
    assert_eq!(source["state"], "down", "{down}");
    assert!(source["lastError"].is_string(), "{down}");
    assert_ne!(source["since"], ready["dependencies"]["sourceOfTruth"]["since"]);
    let ingest = app.post_events(&events(100, 10, now)).await;
    assert_eq!(ingest.status(), 503);
    let read = app.get(READ).await;
    assert_eq!(read.status(), 200, "reads answer from memory");
    let body: Value = read.json().await.unwrap();
    assert!(!body["items"].as_array().unwrap().is_empty(), "{body}");

    tokio::task::block_in_place(|| pg.pg_ctl("start"));
    let up = readyz_until(&app, 200, Duration::from_secs(15)).await;
    assert_eq!(up["dependencies"]["sourceOfTruth"]["state"], "up");
    assert!(
        up["dependencies"]["sourceOfTruth"]["lastError"].is_string(),
        "the last error stays visible after recovery: {up}"
    );
    let accepted = app.post_events_ok(&events(200, 10, now)).await;
    assert_eq!(accepted["accepted"], 10);
}

/// A small tmpfs mounted for one test, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(megabytes: u32) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(
            status.success(),
            "mounting a tmpfs needs root (the test machine runs as root)"
        );
        SmallDisk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the filesystem with `filler` until a write fails with ENOSPC.
    fn fill(&self) -> PathBuf {
        use std::io::Write as _;
        let filler = self.path().join("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        for chunk in [1 << 20, 4096, 512] {
            let block = vec![7u8; chunk];
            while file.write_all(&block).and_then(|()| file.flush()).is_ok() {}
        }
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_makes_the_instance_unready_until_space_is_freed() {
    let disk = SmallDisk::mount(24);
    let app = spawn_app_in(disk.path().join("data"), |_| {}).await;
    let now = now_millis();
    app.post_events_ok(&events(0, 10, now)).await;
    assert_eq!(readyz(&app).await.0, 200);

    let filler = disk.fill();
    // A write finds the disk full (and, with no write at all, so would the probe's free-space check).
    let mut refused = false;
    for batch in 0..20 {
        let response = app.post_events(&events(1_000 + batch * 500, 500, now)).await;
        if response.status() == 503 {
            refused = true;
            break;
        }
    }
    assert!(refused, "ingest onto a full disk is refused");
    let down = readyz_until(&app, 503, Duration::from_secs(5)).await;
    let source = &down["dependencies"]["sourceOfTruth"];
    assert_eq!(source["kind"], "sqlite");
    assert_eq!(source["state"], "down");
    let error = source["lastError"].as_str().unwrap().to_lowercase();
    assert!(error.contains("full"), "{down}");
    assert_eq!(app.get(READ).await.status(), 200, "reads answer from memory");

    std::fs::remove_file(filler).unwrap();
    let up = readyz_until(&app, 200, Duration::from_secs(10)).await;
    assert_eq!(up["dependencies"]["sourceOfTruth"]["state"], "up");
    let accepted = app.post_events_ok(&events(50_000, 10, now)).await;
    assert_eq!(accepted["accepted"], 10);
    drop(app);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_redis_is_reported_but_the_instance_stays_ready_for_writes() {
    let mut redis = rankgate_testkit::redis_servers::RestartableRedis::start();
    let url = redis.url();
    let app = spawn_app_with(move |config| {
        config.redis = vec![url];
        config.redis_prefix = "rgtest:ready:".into();
        config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
        config.rankings.freshness_millis = 200;
    })
    .await;
    let now = now_millis();
    app.post_events_ok(&events(0, 10, now)).await;
    let ready = readyz_until(&app, 200, Duration::from_secs(5)).await;
    assert_eq!(ready["dependencies"]["serving"]["kind"], "redis");
    assert_eq!(ready["dependencies"]["queueStore"]["kind"], "redis");
    assert_eq!(ready["dependencies"]["queueStore"]["state"], "up");

    redis.down();
    // A read finds Redis gone and answers from memory, marked stale.
    let read: Value = app.get(READ).await.json().await.unwrap();
    assert_eq!(read["stale"], true, "{read}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let degraded = loop {
        let (status, body) = readyz(&app).await;
        assert_eq!(status, 200, "writes still go to the source of truth: {body}");
        if body["dependencies"]["queueStore"]["state"] == "down"
            && body["dependencies"]["serving"]["state"] == "degraded"
        {
            break body;
        }
        assert!(Instant::now() < deadline, "not reported: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(degraded["status"], "ready");
    assert_eq!(degraded["serving"]["stale"], true);
    assert!(degraded["dependencies"]["queueStore"]["lastError"].is_string());
    let accepted = app.post_events_ok(&events(100, 10, now)).await;
    assert_eq!(accepted["accepted"], 10, "ingest works without Redis");
    // The waiting room fails closed meanwhile.
    let entry = app
        .post_json("/v1/queues/ready-q/entries", &json!({ "memberId": "m1" }))
        .await;
    assert_eq!(entry.status(), 503);

    redis.up();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = readyz(&app).await;
        if body["dependencies"]["queueStore"]["state"] == "up" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the queue store did not come back: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
