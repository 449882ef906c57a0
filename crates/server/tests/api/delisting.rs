//! Delisting (`PUT /v1/products/{id}` with `"listed": false`, SPEC 1.5) and yearly periods (SPEC 1.4)
//! through the HTTP API: on the embedded engine (with a restart and `rankgate verify`), and on PostgreSQL
//! with Redis serving, standalone and a 3-node Cluster, with two instances sharing the database: a
//! delisting through one hides the product on both within the freshness bound, every ranker, category
//! and span, Top-N depth included, and a restart keeps the flag.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;
use crate::redis_servers::{cluster, standalone_url, unique_prefix, KeyCleanup};

/// `PUT /v1/products/{product}` with `body`.
async fn put_product(app: &TestApp, product: &str, body: &Value) -> reqwest::Response {
    app.client
        .put(format!("{}/v1/products/{product}", app.address))
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn put_product_ok(app: &TestApp, product: &str, body: &Value) -> Value {
    let response = put_product(app, product, body).await;
    let status = response.status();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "PUT {product} {body}: {answer}");
    answer
}

/// Sales and views of p0 … p5 (even ones in c0, odd ones in c1) in the last minutes; p0 leads every
/// ranking by far, and every product has sales.
fn workload(now: i64, from: usize) -> Value {
    Value::Array(
        (from..from + 120)
            .map(|i| {
                let product = if i % 4 == 0 { 0 } else { i % 6 };
                let category = format!("c{}", product % 2);
                // The last minutes, but never before the hour `now` is in: every span holds every event
                // whenever the test runs (at 00:00:30 a sale a minute old is yesterday's).
                let ts = (now - (i % 5) as i64 * 60_000).max(now - now.rem_euclid(3_600_000));
                if i % 5 != 0 {
                    sale(
                        &format!("e{i}"),
                        &format!("p{product}"),
                        ts,
                        1 + (i % 3) as u32,
                        100 + (i % 7) as u64 * 10,
                        &[&category],
                    )
                } else {
                    view(&format!("e{i}"), &format!("p{product}"), ts, &[&category])
                }
            })
            .collect(),
    )
}

/// The rankings a delisting must leave: every ranker, `all` and a category, periods of every kind
/// (yearly included) and a window.
fn ranking_paths(now: i64) -> Vec<String> {
    // Each period named by the key of `now`'s, so a read after the hour (or day, week…) turned still
    // asks for the span the events are in.
    let day = day_key(now);
    let year = &day[..4];
    let iso = jiff::Timestamp::from_millisecond(now)
        .unwrap()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .iso_week_date();
    let week = format!("{:04}W{:02}", iso.year(), iso.week());
    let mut paths = Vec::new();
    for ranker in ["popular", "units", "revenue"] {
        for category in ["all", "c0"] {
            for span in [
                format!("period=daily&at={day}"),
                format!("period=yearly&at={year}"),
                format!("period=monthly&at={}", &day[..6]),
                format!("period=weekly&at={week}"),
                format!("period=hourly&at={}", hour_key(now)),
                "window=7d".to_string(),
            ] {
                paths.push(format!(
                    "/v1/categories/{category}/top?ranker={ranker}&{span}&limit=50"
                ));
            }
        }
    }
    paths
}

fn product_ids(body: &Value) -> Vec<String> {
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["productId"].as_str().unwrap().to_string())
        .collect()
}

/// `before` without `product`, ranks renumbered: what a list must look like once `product` is delisted
/// (outside daily spans, where carry cannot move).
fn without(before: &Value, product: &str) -> Vec<String> {
    product_ids(before).into_iter().filter(|p| p != product).collect()
}

fn assert_hidden(body: &Value, product: &str, path: &str) {
    let ids = product_ids(body);
    assert!(
        !ids.iter().any(|p| p == product),
        "{path}: {product} still listed: {body}"
    );
    let ranks: Vec<u64> = body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ranks,
        (1..=ranks.len() as u64).collect::<Vec<_>>(),
        "{path}: ranks close up"
    );
    assert!(
        body["total"].as_u64().unwrap() as usize >= ids.len(),
        "{path}: total"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delisted_product_leaves_every_ranking_keeps_counting_and_stays_delisted_after_a_restart() {
    let app = spawn_app().await;
    let now = now_millis();
    app.post_events_ok(&workload(now, 0)).await;
    let paths = ranking_paths(now);
    let mut before = Vec::new();
    for path in &paths {
        let body = app.get_json(path).await;
        assert_eq!(body["items"][0]["productId"], "p0", "{path}: p0 leads");
        before.push(body);
    }
    // Indices into `paths`: popular first, then units; per ranker `all` then c0; yearly second.
    const UNITS_ALL_YEARLY: usize = 13;
    let yearly = &before[1];
    assert_eq!(yearly["period"], "yearly");
    assert_eq!(yearly["at"], &day_key(now)[..4]);
    assert_eq!(
        app.get_json("/v1/categories/all/top?ranker=units&period=yearly")
            .await["items"],
        before[UNITS_ALL_YEARLY]["items"],
        "the default at is the current year"
    );

    put_product_ok(
        &app,
        "p0",
        &json!({ "name": "Robot", "brand": "Acme", "price": 1999 }),
    )
    .await;
    let hidden = put_product_ok(&app, "p0", &json!({ "listed": false })).await;
    assert_eq!(
        hidden,
        json!({ "productId": "p0", "listed": false, "name": "Robot", "brand": "Acme", "price": 1999 }),
        "listed alone erases no other field"
    );
    assert_eq!(app.get_json("/v1/products/p0").await, hidden);
    for (path, before) in paths.iter().zip(&before) {
        let body = app.get_json(path).await;
        assert_hidden(&body, "p0", path);
        assert_eq!(
            body["total"].as_u64().unwrap() as usize,
            product_ids(&body).len(),
            "{path}: total"
        );
        if !path.contains("period=daily") {
            assert_eq!(product_ids(&body), without(before, "p0"), "{path}");
        }
    }
    let rank = app
        .get_json("/v1/products/p0/rank?ranker=units&period=yearly")
        .await;
    assert_eq!(rank["rank"], Value::Null);
    assert_eq!(rank["score"], Value::Null);
    let second = app
        .get_json("/v1/products/p3/rank?ranker=units&period=monthly")
        .await;
    assert_eq!(
        second["rank"].as_u64(),
        product_ids(
            &app.get_json("/v1/categories/all/top?ranker=units&period=monthly")
                .await
        )
        .iter()
        .position(|p| p == "p3")
        .map(|i| i as u64 + 1)
    );

    // Metrics keep counting while delisted, and a relisting shows them.
    let units_before = before[UNITS_ALL_YEARLY]["items"][0]["metrics"]["units"]
        .as_i64()
        .unwrap();
    app.post_events_ok(&json!([sale("late-1", "p0", now, 5, 100, &["c0"])]))
        .await;
    let relisted = put_product_ok(&app, "p0", &json!({ "listed": true, "brand": null })).await;
    assert_eq!(
        relisted,
        json!({ "productId": "p0", "listed": true, "name": "Robot", "price": 1999 })
    );
    let units = app.get_json(&paths[UNITS_ALL_YEARLY]).await;
    assert_eq!(units["items"][0]["productId"], "p0");
    assert_eq!(
        units["items"][0]["metrics"]["units"].as_i64().unwrap(),
        units_before + 5
    );
    assert_eq!(units["items"][0]["product"]["name"], "Robot");

    // Hostile values name `listed`; nothing changes.
    for bad in [
        json!({ "listed": "false" }),
        json!({ "listed": null }),
        json!({ "listed": 0 }),
    ] {
        let response = put_product(&app, "p0", &bad).await;
        assert_eq!(response.status(), 400, "{bad}");
        let body: Value = response.json().await.unwrap();
        assert!(
            body["error"].as_str().unwrap().starts_with("listed"),
            "{bad}: {body}"
        );
    }
    assert_eq!(app.get_json("/v1/products/p0").await["listed"], true);
    assert_eq!(
        app.get_json("/v1/products/never-written").await,
        json!({ "productId": "never-written", "listed": true })
    );

    // Delisted again, then restarted: the flag is durable, and `rankgate verify` agrees with what is
    // served (the recompute leaves the product out too).
    put_product_ok(&app, "p2", &json!({ "listed": false })).await;
    let served: Vec<Value> = {
        let mut served = Vec::new();
        for path in &paths {
            served.push(app.get_json(path).await);
        }
        served
    };
    let data_dir = app.data_dir.clone();
    let dir = app.stop().await;
    let data_dir_arg = data_dir.display().to_string();
    assert_verify_passes(&["--data-dir", &data_dir_arg]);
    let app = spawn_app_in(data_dir, |_| {}).await;
    for (path, served) in paths.iter().zip(&served) {
        let body = app.get_json(path).await;
        assert_hidden(&body, "p2", path);
        assert_eq!(
            body["items"], served["items"],
            "{path}: the same after the restart"
        );
    }
    assert_eq!(app.get_json("/v1/products/p2").await["listed"], false);
    app.stop().await;
    drop(dir);
}

/// An instance on the shared PostgreSQL `schema`, serving hot spans from Redis at `redis`.
async fn spawn_serving(schema: &str, redis: &[String], prefix: &str, depth: Option<usize>) -> TestApp {
    let (schema, redis, prefix) = (schema.to_string(), redis.to_vec(), prefix.to_string());
    spawn_app_with(move |config| {
        config.rankings.database = Some(postgres_url());
        config.rankings.database_schema = schema;
        config.redis = redis;
        config.redis_prefix = prefix;
        config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
        config.rankings.freshness_millis = FRESHNESS_MILLIS;
        config.rankings.serving_depth = depth;
    })
    .await
}

/// The freshness bound the PostgreSQL + Redis instances run with.
const FRESHNESS_MILLIS: u64 = 250;

async fn delisting_reaches_both_instances(redis: Vec<String>, depth: Option<usize>, label: &str) {
    let schema = format!("rgtest_delist_{label}_{}", std::process::id());
    let _schema = SchemaGuard::named(schema.clone());
    let prefix = unique_prefix();
    let _keys = KeyCleanup {
        nodes: redis.clone(),
        prefix: prefix.clone(),
    };
    let a = spawn_serving(&schema, &redis, &prefix, depth).await;
    let b = spawn_serving(&schema, &redis, &prefix, depth).await;
    let now = now_millis();
    a.post_events_ok(&workload(now, 0)).await;
    b.post_events_ok(&workload(now, 60)).await; // half the ids overlap: counted once
    let year = &day_key(now)[..4];
    // Hot spans (this year, this week, the 1d window): answered from Redis, fresh.
    let hot = [
        format!("/v1/categories/all/top?ranker=units&period=yearly&at={year}&limit=3"),
        "/v1/categories/c0/top?ranker=revenue&period=weekly&limit=3".to_string(),
        "/v1/categories/all/top?window=1d&limit=3".to_string(),
    ];
    let deep = format!("/v1/categories/all/top?ranker=units&period=yearly&at={year}&limit=20");
    let full = read_until(&a, &deep, "a holds every event", |body| body["total"] == 6).await;
    assert_eq!(full["items"][0]["productId"], "p0");
    let mut before = Vec::new();
    for path in &hot {
        let body = read_until(&b, path, "b serves the same from redis", |body| {
            body["stale"] == false && body["items"][0]["productId"] == "p0"
        })
        .await;
        before.push(body);
    }
    let totals: Vec<Value> = before.iter().map(|body| body["total"].clone()).collect();

    let delisted_at = Instant::now();
    put_product_ok(&a, "p0", &json!({ "listed": false })).await;
    let mut slowest = Duration::ZERO;
    for (path, before) in hot.iter().zip(&before) {
        for (name, app) in [("a", &a), ("b", &b)] {
            let body = read_until(app, path, "p0 hidden", |body| {
                body["stale"] == false && body["items"][0]["productId"] != "p0"
            })
            .await;
            slowest = slowest.max(delisted_at.elapsed());
            assert_hidden(&body, "p0", &format!("{name} {path}"));
            assert_eq!(
                body["total"].as_u64().unwrap() + 1,
                before["total"].as_u64().unwrap(),
                "{name} {path}: total counts only listed products"
            );
            // The top 3 closed up: what was 2nd and 3rd, then the 4th moved into a Top-N cut.
            let expected: Vec<String> = without(&full, "p0").into_iter().take(3).collect();
            if path.contains("ranker=units&period=yearly") {
                assert_eq!(product_ids(&body), expected, "{name} {path}");
            }
        }
    }
    // b's rank of p0: with a Top-N-only depth, a product outside Redis's Top N is ranked by b's own
    // engine, which learns the delisting from PostgreSQL through its follower, so within the freshness
    // bound rather than at once (CI once read it while the Redis top already hid p0).
    let rank_path = format!("/v1/products/p0/rank?ranker=units&period=yearly&at={year}");
    read_until(&b, &rank_path, "b ranks p0 no more", |body| {
        body["rank"] == Value::Null
    })
    .await;
    slowest = slowest.max(delisted_at.elapsed());
    // The freshness bound, with room for a loaded 2-core machine (the follower runs every bound/4).
    assert!(
        slowest < Duration::from_millis(20 * FRESHNESS_MILLIS),
        "the delisting took {slowest:?} to reach every read"
    );
    eprintln!(
        "{label}: delisting visible on both instances after {slowest:?} (freshness {FRESHNESS_MILLIS} ms)"
    );
    assert_eq!(b.get_json("/v1/products/p0").await["listed"], false);
    // Past the depth (engine) agrees with the top (Redis).
    let deep_b = read_until(&b, &deep, "b past the depth", |body| body["total"] == 5).await;
    assert_eq!(product_ids(&deep_b), without(&full, "p0"));

    // A restart keeps the flag; relisting through b shows p0 on a again.
    b.stop().await;
    let b = spawn_serving(&schema, &redis, &prefix, depth).await;
    let after = read_until(&b, &deep, "b restarted", |body| body["total"] == 5).await;
    assert_hidden(&after, "p0", "b restarted");
    put_product_ok(&b, "p0", &json!({ "listed": true })).await;
    for (path, total) in hot.iter().zip(&totals) {
        read_until(&a, path, "a shows p0 again", |body| {
            body["stale"] == false && body["items"][0]["productId"] == "p0" && body["total"] == *total
        })
        .await;
    }

    // `rankgate verify` checks the shared data and what a serves against the recompute. A span b
    // publishes hides p4 once b's follower learned the delisting: within the freshness bound.
    put_product_ok(&a, "p4", &json!({ "listed": false })).await;
    read_until(&a, &deep, "p4 hidden", |body| body["total"] == 5).await;
    assert_verify_passes_within(
        &[
            "--url",
            &a.address,
            "--database",
            &postgres_url(),
            "--database-schema",
            &schema,
            "--data-dir",
            &a.data_dir.display().to_string(),
        ],
        Duration::from_millis(20 * FRESHNESS_MILLIS),
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_and_standalone_redis_a_delisting_reaches_both_instances() {
    delisting_reaches_both_instances(vec![standalone_url()], None, "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_and_a_redis_cluster_top_n_only_a_delisting_reaches_both_instances() {
    delisting_reaches_both_instances(cluster().urls.clone(), Some(3), "cluster").await;
}

/// `rankgate catalog load FILE.csv` with the optional `listed` column: `false` delists, an empty cell
/// keeps the stored flag, and a row merges into the stored entry; a bad value names `listed` and loads
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_load_reads_an_optional_listed_column() {
    let app = spawn_app().await;
    let now = now_millis();
    app.post_events_ok(&workload(now, 0)).await;
    put_product_ok(&app, "p3", &json!({ "listed": false, "url": "https://shop/p3" })).await;
    let data_dir = app.data_dir.clone();
    let dir = app.stop().await;
    let csv = data_dir.join("catalog.csv");
    let load = |body: &str| {
        std::fs::write(&csv, body).unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_rankgate"))
            .args(["catalog", "load"])
            .arg(&csv)
            .arg("--data-dir")
            .arg(&data_dir)
            .output()
            .expect("the rankgate binary runs")
    };
    let refused = load("id,name,listed\np1,One,maybe\n");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("listed"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let loaded = load("id,name,listed\np0,Zero,false\np1,One,\np3,Three,\n");
    assert!(
        loaded.status.success(),
        "{}",
        String::from_utf8_lossy(&loaded.stderr)
    );

    let app = spawn_app_in(data_dir, |_| {}).await;
    assert_eq!(
        app.get_json("/v1/products/p0").await,
        json!({ "productId": "p0", "listed": false, "name": "Zero" })
    );
    assert_eq!(
        app.get_json("/v1/products/p1").await,
        json!({ "productId": "p1", "listed": true, "name": "One" })
    );
    assert_eq!(
        app.get_json("/v1/products/p3").await,
        json!({ "productId": "p3", "listed": false, "name": "Three", "url": "https://shop/p3" }),
        "an empty cell keeps the flag; the row merges"
    );
    let top = app.get_json("/v1/categories/all/top?ranker=units&limit=50").await;
    assert_hidden(&top, "p0", "all");
    assert_hidden(&top, "p3", "all");
    let p1 = top["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["productId"] == "p1")
        .expect("p1 is listed");
    assert_eq!(
        p1["product"],
        json!({ "name": "One" }),
        "listed products carry their entry"
    );
    app.stop().await;
    drop(dir);
}
