//! Rankings served from Redis (`--redis`) with PostgreSQL as the source of truth, through the whole HTTP
//! stack, on a Redis server this test starts and kills itself:
//! - reads of the hot spans come from Redis (its keys exist, `stale: false`) and equal the engine's;
//! - Redis killed mid-ingest: ingest keeps being acknowledged, reads keep answering, marked stale, and
//!   include what was ingested meanwhile;
//! - Redis restarted empty: rankgate notices, rebuilds it from PostgreSQL on its own, reads are fresh
//!   again, and `rankgate verify --url` passes;
//! - two instances share the Redis: each publishes a share of the span groups, both answer
//!   identically; Top-N-only mode answers past the depth from the source of truth;
//! - publication by demand: a hot span nobody reads is not in Redis, one read puts it there, and
//!   idleness takes it out again, answers equal to the engine's throughout;
//! - an instance that stops hands its span groups over: the other publishes every group, fresh.

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
    spawn_serving_idle(schema, redis_url, depth, 600_000).await
}

/// [`spawn_serving`] with `serving_idle_seconds` in milliseconds.
async fn spawn_serving_idle(
    schema: &str,
    redis_url: &str,
    depth: Option<usize>,
    idle_millis: i64,
) -> TestApp {
    let (schema, redis_url) = (schema.to_string(), redis_url.to_string());
    spawn_app_with(move |config| {
        config.rankings.serving_idle_millis = idle_millis;
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
    // Read once, the span is in demand: Redis holds it from the publisher's next tick on.
    wait_for(Duration::from_secs(10), "the daily ranking held in redis", || {
        (!redis.keys("rgtest:serving:{rk:all}:units:daily:*").is_empty()).then_some(())
    });
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
    wait_for(
        Duration::from_secs(10),
        "redis rebuilt without an operator",
        || (!redis.keys("rgtest:serving:{rk:all}:units:daily:*").is_empty()).then_some(()),
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
    // The publication is spread: every span group leased once, the two instances sharing them.
    let owners: std::collections::HashSet<String> = {
        let mut connection = redis::Client::open(redis.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let leases = redis.keys("rgtest:serving:{rk}:lease:*");
        assert_eq!(
            leases.len(),
            rankgate_store::ranking::redis_serving::SPAN_GROUPS,
            "{leases:?}"
        );
        leases
            .iter()
            .map(|lease| {
                redis::cmd("GET")
                    .arg(lease)
                    .query::<String>(&mut connection)
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(owners.len(), 2, "both instances publish a share");

    // `rankgate rebuild --redis`: the publishing instance rebuilds into a fresh generation, checks it and
    // switches; both instances go on answering the same.
    // The newest generation any span group points at (entries are "generation asOf popular rebuilt").
    let generation = |redis: &OwnRedis| -> u64 {
        let mut connection = redis::Client::open(redis.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let pointer: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg("rgtest:serving:{rk}:active")
            .query(&mut connection)
            .unwrap();
        pointer
            .iter()
            .filter(|(field, _)| field.starts_with('g'))
            .filter_map(|(_, entry)| entry.split(' ').next()?.parse().ok())
            .max()
            .expect("a published group")
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

/// The keys of `category`'s daily rankings in Redis (any generation, any ranker, and the detail).
fn daily_keys(redis: &OwnRedis, category: &str) -> Vec<String> {
    redis.keys(&format!("rgtest:serving:{{rk:{category}}}:*:daily:*"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_hot_spans_somebody_reads_are_published() {
    let schema = format!("rgtest_serving_demand_{}", std::process::id());
    let _schema = SchemaGuard::named(schema.clone());
    let redis = OwnRedis::start();
    let app = spawn_serving_idle(&schema, &redis.url(), None, 1_500).await;
    let now = now_millis();
    app.post_events_ok(&sales(0, 300, now)).await;
    // Published rounds happen every tick; nobody read anything, so nothing of c1 is held.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(
        daily_keys(&redis, "c1").is_empty(),
        "an unread span is not published"
    );

    let top = "/v1/categories/c1/top?ranker=units&period=daily&limit=100";
    let expected = |app: &TestApp| {
        app.rankings().top(
            &rankgate_store::ranking::engine::RankingQuery {
                ranker: rankgate_core::ranker::RankerName::Units,
                category: rankgate_core::ids::CategoryOrAll::Category(
                    rankgate_core::ids::Category::parse("c1").unwrap(),
                ),
                span: rankgate_core::period::Span::Period(rankgate_core::period::PeriodKey::containing(
                    rankgate_core::period::PeriodKind::Daily,
                    rankgate_core::period::Hour::from_millis(now),
                    &rankgate_core::period::Zone::utc(),
                )),
            },
            0,
            100,
        )
    };
    let products = |body: &Value| -> Vec<String> {
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["productId"].as_str().unwrap().to_string())
            .collect()
    };
    let engine: Vec<String> = expected(&app)
        .items
        .iter()
        .map(|i| i.product.to_string())
        .collect();
    // The first read is the engine's (fresh), and puts the span in demand.
    let first = app.get_json(top).await;
    assert_eq!(first["stale"], false);
    assert_eq!(products(&first), engine);
    wait_for(
        Duration::from_secs(10),
        "c1's daily span published after one read",
        || (!daily_keys(&redis, "c1").is_empty()).then_some(()),
    );
    assert!(daily_keys(&redis, "c2").is_empty(), "c2 was never read");
    // New events reach the published span, and reads (now from Redis) equal the engine.
    app.post_events_ok(&sales(300, 150, now)).await;
    let served = read_until(&app, top, "redis follows the new events", |body| {
        // Every product of these sales is in c1 (a product's categories are all it was sold under), and
        // a category's ranking shows the product's own metrics: all 450 events.
        body["stale"] == false && units_sum(body) == expected_units(450)
    })
    .await;
    let engine: Vec<String> = expected(&app)
        .items
        .iter()
        .map(|i| i.product.to_string())
        .collect();
    assert_eq!(products(&served), engine);

    // Unread for longer than the idle time: taken out of Redis; the next read still answers the same.
    wait_for(
        Duration::from_secs(15),
        "c1's daily span taken out once idle",
        || daily_keys(&redis, "c1").is_empty().then_some(()),
    );
    let again = app.get_json(top).await;
    assert_eq!(again["stale"], false);
    assert_eq!(products(&again), engine);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_instance_hands_its_span_groups_over() {
    let schema = format!("rgtest_serving_handover_{}", std::process::id());
    let _schema = SchemaGuard::named(schema.clone());
    let redis = OwnRedis::start();
    // Every hot span published (idle 0), so every group has spans to hand over.
    let a = spawn_serving_idle(&schema, &redis.url(), None, 0).await;
    let b = spawn_serving_idle(&schema, &redis.url(), None, 0).await;
    let now = now_millis();
    a.post_events_ok(&sales(0, 200, now)).await;
    let lease_owners = || -> std::collections::HashSet<String> {
        let mut connection = redis::Client::open(redis.url())
            .unwrap()
            .get_connection()
            .unwrap();
        redis
            .keys("rgtest:serving:{rk}:lease:*")
            .iter()
            .filter_map(|lease| {
                redis::cmd("GET")
                    .arg(lease)
                    .query::<Option<String>>(&mut connection)
                    .unwrap()
            })
            .collect()
    };
    wait_for(Duration::from_secs(20), "both instances holding groups", || {
        (lease_owners().len() == 2).then_some(())
    });
    let top = "/v1/categories/all/top?ranker=units&window=1d&limit=20";
    let before = read_until(&b, top, "b serves all 200 events", |body| {
        body["stale"] == false && units_sum(body) == expected_units(200) && body["total"] == 17
    })
    .await;
    let rebuilds_before = serving_rebuilds(&b).await;
    a.stop().await;
    // a gave its groups up on the way out: b holds every one within the lease time (3 s) and publishes
    // what is ingested through it.
    let started = std::time::Instant::now();
    wait_for(Duration::from_secs(10), "b holding every group", || {
        let owners = lease_owners();
        (owners.len() == 1
            && redis.keys("rgtest:serving:{rk}:lease:*").len()
                == rankgate_store::ranking::redis_serving::SPAN_GROUPS)
            .then_some(())
    });
    // Within the lease time (3 s) and a few ticks, even had the stop not given the groups up.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "taken over within the lease time"
    );
    b.post_events_ok(&sales(200, 100, now)).await;
    let after = read_until(&b, top, "b publishes every group after a left", |body| {
        body["stale"] == false && units_sum(body) == expected_units(300)
    })
    .await;
    let ready = b.get_json("/readyz").await;
    assert_eq!(ready["serving"]["stale"], false, "{ready}");
    assert_eq!(after["total"], 17);
    assert_ne!(after["items"], before["items"]);
    // Every one of `all`'s hot spans (one group each, some a's, some b's own) is served from Redis with
    // all 300 events: the groups taken over were written whole into b's generation and switched
    // there, and b's own kept publishing changes, without a rebuild of everything b holds.
    for span in [
        "period=hourly",
        "period=daily",
        "period=weekly",
        "period=monthly",
        "period=yearly",
        "window=1h",
        "window=1d",
        "window=7d",
        "window=30d",
    ] {
        let path = format!("/v1/categories/all/top?ranker=units&{span}&limit=20");
        read_until(&b, &path, &format!("b serves {span} from redis"), |body| {
            body["stale"] == false && units_sum(body) == expected_units(300) && body["total"] == 17
        })
        .await;
    }
    assert_eq!(
        serving_rebuilds(&b).await,
        rebuilds_before,
        "taking groups over rebuilds nothing"
    );
    b.stop().await;
}

/// `rankgate_serving_rebuilds_total` of `app` (0 before its first rebuild).
async fn serving_rebuilds(app: &TestApp) -> u64 {
    let metrics = app.get("/metrics").await.text().await.unwrap();
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("rankgate_serving_rebuilds_total "))
        .map_or(0, |value| value.trim().parse::<f64>().unwrap() as u64)
}
