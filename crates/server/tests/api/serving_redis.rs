//! Rankings served from Redis (`--redis`) with PostgreSQL as the source of truth, through the whole HTTP
//! stack, on a Redis server this test starts and kills itself:
//! - reads of the hot spans come from Redis (its keys exist, `stale: false`) and equal the engine's;
//! - Redis killed mid-ingest: ingest keeps being acknowledged, reads keep answering, marked stale, and
//!   include what was ingested meanwhile;
//! - Redis restarted empty: rankgate notices, rebuilds it from PostgreSQL on its own, reads are fresh
//!   again, and `rankgate verify --url` passes;
//! - two instances share the Redis: one publishes, both answer identically; Top-N-only mode answers
//!   past the depth from the source of truth.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;

/// A `redis-server` owned by the test, killed when dropped.
struct OwnRedis {
    port: u16,
    child: Option<Child>,
}

impl OwnRedis {
    fn start_on(port: u16) -> OwnRedis {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (CI installs it)");
        let redis = OwnRedis {
            port,
            child: Some(child),
        };
        wait_for(Duration::from_secs(20), "own redis answers PING", || {
            let mut connection = redis::Client::open(redis.url()).ok()?.get_connection().ok()?;
            redis::cmd("PING").query::<String>(&mut connection).ok()
        });
        redis
    }

    fn start() -> OwnRedis {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        OwnRedis::start_on(port)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn keys(&self, pattern: &str) -> Vec<String> {
        let mut connection = redis::Client::open(self.url()).unwrap().get_connection().unwrap();
        redis::cmd("KEYS").arg(pattern).query(&mut connection).unwrap()
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_for<T>(limit: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn spawn_serving(schema: &str, redis_url: &str, depth: Option<usize>) -> TestApp {
    let (schema, redis_url) = (schema.to_string(), redis_url.to_string());
    spawn_app_with(move |config| {
        config.rankings.database = Some(postgres_url());
        config.rankings.database_schema = schema;
        config.redis = vec![redis_url];
        config.redis_prefix = "rgtest:serving:".into();
        // Required with Redis (defect 7): the secret never lives in Redis.
        config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
        config.rankings.freshness_millis = 200;
        config.rankings.serving_depth = depth;
    })
    .await
}

fn sales(from: usize, count: usize, now: i64) -> Value {
    Value::Array(
        (from..from + count)
            .map(|i| {
                sale(
                    &format!("e{i}"),
                    &format!("p{}", i % 17),
                    now - (i % 50) as i64 * 1000,
                    1 + (i % 3) as u32,
                    100 + (i % 7) as u64 * 10,
                    &[&format!("c{}", i % 3)],
                )
            })
            .collect(),
    )
}

fn units_sum(body: &Value) -> i64 {
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["metrics"]["units"].as_i64().unwrap())
        .sum()
}

fn expected_units(count: usize) -> i64 {
    (0..count).map(|i| 1 + (i % 3) as i64).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_serves_rankings_and_its_loss_is_survived_and_repaired() {
    let schema = format!("rgtest_serving_{}", std::process::id());
    let _schema = SchemaGuard::named(schema.clone());
    let mut redis = OwnRedis::start();
    let app = spawn_serving(&schema, &redis.url(), None).await;
    let now = now_millis();
    let top = "/v1/categories/all/top?ranker=units&period=daily&limit=100";

    let accepted = app.post_events_ok(&sales(0, 300, now)).await;
    assert_eq!(accepted["accepted"], 300);
    let served = read_until(&app, top, "fresh reads from redis", |body| {
        body["stale"] == false && units_sum(body) == expected_units(300)
    })
    .await;
    assert_eq!(served["total"], 17);
    assert!(
        !redis.keys("rgtest:serving:{rk:all}:units:daily:*").is_empty(),
        "the daily ranking is held in redis"
    );
    let engine = app.rankings().top(
        &rankgate_store::ranking::engine::RankingQuery {
            ranker: rankgate_core::ranker::RankerName::Units,
            category: rankgate_core::ids::CategoryOrAll::All,
            span: rankgate_core::period::Span::Period(rankgate_core::period::PeriodKey::containing(
                rankgate_core::period::PeriodKind::Daily,
                rankgate_core::period::Hour::from_millis(now),
                &rankgate_core::period::Zone::utc(),
            )),
        },
        0,
        100,
    );
    let engine_products: Vec<String> = engine.items.iter().map(|i| i.product.to_string()).collect();
    let served_products: Vec<String> = served["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["productId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        served_products, engine_products,
        "redis serves the engine's order"
    );

    // Redis dies mid-ingest: ingest is still acknowledged (PostgreSQL is the source of truth), reads
    // keep answering from memory, marked stale, and include what was ingested meanwhile.
    redis.kill();
    let accepted = app.post_events_ok(&sales(300, 200, now)).await;
    assert_eq!(accepted["accepted"], 200);
    let stale = read_until(&app, top, "stale reads while redis is down", |body| {
        body["stale"] == true && units_sum(body) == expected_units(500)
    })
    .await;
    assert_eq!(stale["total"], 17);
    let rank = app
        .get_json("/v1/products/p3/rank?ranker=units&period=daily")
        .await;
    assert_eq!(rank["stale"], true);
    assert!(rank["rank"].is_number());
    let ready = app.get_json("/readyz").await;
    assert_eq!(ready["status"], "ready", "stale serving is still ready");
    assert_eq!(ready["serving"]["stale"], true);

    // Redis comes back EMPTY on the same port: rankgate notices and rebuilds it from PostgreSQL.
    let redis = OwnRedis::start_on(redis.port);
    let accepted = app.post_events_ok(&sales(500, 100, now)).await;
    assert_eq!(accepted["accepted"], 100);
    read_until(&app, top, "redis rebuilt and serving fresh data", |body| {
        body["stale"] == false && units_sum(body) == expected_units(600)
    })
    .await;
    assert!(
        !redis.keys("rgtest:serving:{rk:all}:units:daily:*").is_empty(),
        "rebuilt without an operator"
    );

    let data_dir = app.data_dir.display().to_string();
    assert_verify_passes(&[
        "--url",
        &app.address,
        "--database",
        &postgres_url(),
        "--database-schema",
        &schema,
        "--data-dir",
        &data_dir,
    ]);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_redis_and_top_n_only_answers_past_the_depth() {
    let schema = format!("rgtest_serving_two_{}", std::process::id());
    let _schema = SchemaGuard::named(schema.clone());
    let redis = OwnRedis::start();
    let a = spawn_serving(&schema, &redis.url(), Some(3)).await;
    let b = spawn_serving(&schema, &redis.url(), Some(3)).await;
    let now = now_millis();
    a.post_events_ok(&sales(0, 150, now)).await;
    b.post_events_ok(&sales(100, 150, now)).await; // 50 overlapping ids: counted once
                                                   // Past the depth (limit 17 > 3): each instance's engine, built from the shared source of truth.
    let deep = "/v1/categories/all/top?ranker=units&window=1d&limit=17";
    let full_a = read_until(&a, deep, "instance a holds all 250 events", |body| {
        units_sum(body) == expected_units(250)
    })
    .await;
    let full_b = read_until(&b, deep, "instance b holds the same", |body| {
        body["items"] == full_a["items"]
    })
    .await;
    // Within the depth: Redis, published by whichever instance holds the lease, the same for both.
    let top3 = "/v1/categories/all/top?ranker=units&window=1d&limit=3";
    let expected_top3 = Value::Array(full_a["items"].as_array().unwrap()[..3].to_vec());
    for (name, app) in [("a", &a), ("b", &b)] {
        let served = read_until(
            app,
            top3,
            &format!("instance {name} serves the top 3 from redis"),
            |body| body["stale"] == false && body["items"] == expected_top3,
        )
        .await;
        assert_eq!(served["total"], 17);
    }
    assert_eq!(
        full_b["items"].as_array().unwrap().len(),
        17,
        "past the depth comes from the source of truth"
    );
    let tenth = full_a["items"][9]["productId"].as_str().unwrap().to_string();
    let rank = b
        .get_json(&format!("/v1/products/{tenth}/rank?ranker=units&window=1d"))
        .await;
    assert_eq!(rank["rank"], json!(10), "a rank past the depth is still answered");
    assert_eq!(
        redis.keys("rgtest:serving:{rk}:lease").len(),
        1,
        "one publisher lease for both instances"
    );

    // `rankgate rebuild --redis`: the publishing instance rebuilds into a fresh generation, checks it and
    // switches; both instances go on answering the same.
    let generation = |redis: &OwnRedis| -> String {
        let mut connection = redis::Client::open(redis.url())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("HGET")
            .arg("rgtest:serving:{rk}:active")
            .arg("generation")
            .query(&mut connection)
            .unwrap()
    };
    let before = generation(&redis);
    let cli = tempfile::tempdir().unwrap();
    std::fs::write(
        cli.path().join("rankgate.toml"),
        "redis_prefix = \"rgtest:serving:\"\n",
    )
    .unwrap();
    let rebuild = Command::new(env!("CARGO_BIN_EXE_rankgate"))
        .args([
            "rebuild",
            "--database",
            &postgres_url(),
            "--database-schema",
            &schema,
            "--redis",
            &redis.url(),
        ])
        .arg("--data-dir")
        .arg(cli.path().join("data"))
        .arg("--config")
        .arg(cli.path().join("rankgate.toml"))
        .output()
        .unwrap();
    assert!(
        rebuild.status.success(),
        "{}",
        String::from_utf8_lossy(&rebuild.stderr)
    );
    assert_ne!(generation(&redis), before, "a fresh generation is served");
    let after = read_until(&b, deep, "b after the rebuild", |body| body["stale"] == false).await;
    assert_eq!(after["items"], full_a["items"]);
    a.stop().await;
    b.stop().await;
}
