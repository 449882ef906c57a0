//! The `trending` ranker over HTTP (SPEC 1.3): scores of decayed hourly metrics, hand-computed here
//! from the formula, on the embedded engine and on PostgreSQL + Redis serving with two instances (a
//! re-weight and a new half-life through one instance reach the other; a rollback through the other
//! returns both; Redis serves the other rankers meanwhile and `rankgate verify` passes). Also a running
//! period whose end hour E follows the server clock across an hour's turn, and hostile admin bodies.

use std::sync::Arc;

use serde_json::{json, Value};

use rankgate_store::clock::ManualClock;

use crate::helpers::*;
use crate::redis_servers::{cluster, standalone_url, KeyCleanup};

const HOUR: i64 = 3_600_000;

/// `d(h) = 2^(−(E − h) / half_life)` for an hour `age` hours before E.
fn decay(age: i64, half_life: f64) -> f64 {
    f64::exp2(-(age as f64) / half_life)
}

/// The workload, relative to `now` (its hour is E of the window read): per product, its events as
/// (hours before now, kind). Every product is in `toys`.
fn workload(now: i64) -> Value {
    let mut events = Vec::new();
    for n in 0..16 {
        events.push(view(&format!("old-{n}"), "p-old", now - 72 * HOUR, &["toys"]));
    }
    for n in 0..3 {
        events.push(view(&format!("new-{n}"), "p-new", now, &["toys"]));
    }
    events.push(
        json!({ "id": "flip-like", "type": "product_liked", "ts": now - 24 * HOUR,
                        "product_id": "p-flip", "categories": ["toys"] }),
    );
    events.push(json!({ "id": "flip-unlike", "type": "product_unliked", "ts": now,
                        "product_id": "p-flip", "categories": ["toys"] }));
    events.push(sale("sale-1", "p-sale", now - 24 * HOUR, 1, 1000, &["toys"]));
    Value::Array(events)
}

/// The trending ranking of [`workload`] over a window ending at now's hour, computed by hand from the
/// formula: (product, score), best first.
fn expected(half_life: f64, view_weight: f64) -> Vec<(&'static str, f64)> {
    let (like_weight, sales_weight) = (0.2, 0.7);
    let score =
        |v: f64, l: f64, s: f64| v * view_weight + l * like_weight + f64::ln_1p(s.max(0.0)) * sales_weight;
    // Each sum in ascending hour order, starting from 0.
    let old = score(0.0 + 16.0 * decay(72, half_life), 0.0, 0.0);
    let new = score(0.0 + 3.0 * decay(0, half_life), 0.0, 0.0);
    let flip = score(0.0, 0.0 + decay(24, half_life) + -decay(0, half_life), 0.0);
    let sale = score(0.0, 0.0, 0.0 + 1000.0 * decay(24, half_life));
    let mut ranking = vec![("p-old", old), ("p-new", new), ("p-flip", flip), ("p-sale", sale)];
    ranking.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    ranking
}

fn window_path(now: i64, ranker: &str) -> String {
    format!(
        "/v1/categories/toys/top?ranker={ranker}&window=7d&at={}&limit=50",
        hour_key(now)
    )
}

/// Whether a top answer is `version` with exactly `ranking` (scores bit for bit).
fn serves(body: &Value, version: u64, ranking: &[(&str, f64)]) -> bool {
    let items = body["items"].as_array().cloned().unwrap_or_default();
    body["ranker"] == "trending"
        && body["policyVersion"] == version
        && body["total"] == ranking.len()
        && items.len() == ranking.len()
        && items
            .iter()
            .zip(ranking)
            .enumerate()
            .all(|(i, (item, (product, score)))| {
                item["rank"] == i + 1
                    && item["productId"] == *product
                    && item["score"].as_f64().map(f64::to_bits) == Some(score.to_bits())
            })
}

async fn put_trending(app: &TestApp, body: Value) -> reqwest::Response {
    app.client
        .put(format!("{}/v1/admin/rankers/trending", app.address))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// Ingests through `writer`, then on every reader: trending v1 as computed by hand (a product whose like
/// and unlike fall in different hours is listed by trending only), a PUT of new weights and half-life
/// through `writer` reaching every reader, and a rollback through the last reader reaching every one.
async fn put_and_rollback_trending(writer: &TestApp, readers: &[&TestApp]) {
    let now = now_millis();
    writer.post_events_ok(&workload(now)).await;
    let v1 = expected(24.0, 0.1);
    assert_eq!(v1[0].0, "p-sale");
    assert!(v1.iter().position(|p| p.0 == "p-new") < v1.iter().position(|p| p.0 == "p-old"));
    for reader in readers {
        read_until(reader, &window_path(now, "trending"), "trending v1", |body| {
            serves(body, 1, &v1)
        })
        .await;
        // `popular` ranks by the undecayed totals: the old product first, the flip not at all.
        let popular = read_until(reader, &window_path(now, "popular"), "popular", |body| {
            body["total"] == 3
        })
        .await;
        assert_eq!(popular["items"][1]["productId"], "p-old", "{popular}");
        let rank = reader
            .get_json(&format!(
                "/v1/products/p-new/rank?category=toys&window=7d&at={}&ranker=trending",
                hour_key(now)
            ))
            .await;
        let position = v1.iter().position(|p| p.0 == "p-new").unwrap();
        assert_eq!(
            (rank["rank"].clone(), rank["total"].clone()),
            (json!(position + 1), json!(4))
        );
        assert_eq!(
            rank["score"].as_f64().map(f64::to_bits),
            Some(v1[position].1.to_bits())
        );
        assert_eq!(rank["ranker"], "trending");
    }

    let accepted = put_trending(writer, json!({ "weights": { "view": 1.0 }, "halfLifeHours": 72 })).await;
    assert_eq!(accepted.status(), 202);
    let accepted: Value = accepted.json().await.unwrap();
    assert_eq!(
        (
            accepted["ranker"].clone(),
            accepted["policyVersion"].clone(),
            accepted["status"].clone()
        ),
        (json!("trending"), json!(2), json!("building"))
    );
    let v2 = expected(72.0, 1.0);
    assert_ne!(v1, v2);
    for reader in readers {
        read_until(reader, &window_path(now, "trending"), "trending v2", |body| {
            serves(body, 2, &v2)
        })
        .await;
        let admin = read_until(reader, "/v1/admin/rankers/trending", "admin view v2", |body| {
            body["activeVersion"] == 2 && body["building"].is_null()
        })
        .await;
        assert_eq!(admin["halfLifeHours"], 72.0, "{admin}");
        assert_eq!(
            admin["weights"],
            json!({ "view": 1.0, "like": 0.2, "sales": 0.7 })
        );
        assert_eq!(admin["previousVersion"], 1);
        assert!(
            admin.get("carryRatio").is_none() && admin.get("carryTopN").is_none(),
            "{admin}"
        );
        // `popular` has versions of its own, untouched.
        let popular = reader.get_json("/v1/admin/rankers/popular").await;
        assert_eq!(popular["activeVersion"], 1);
        assert!(popular.get("halfLifeHours").is_none(), "{popular}");
    }

    let last = readers[readers.len() - 1];
    let rollback = last
        .client
        .post(format!("{}/v1/admin/rankers/trending/rollback", last.address))
        .send()
        .await
        .unwrap();
    assert_eq!(rollback.status(), 200);
    let rolled: Value = rollback.json().await.unwrap();
    assert_eq!(
        (rolled["activeVersion"].clone(), rolled["previousVersion"].clone()),
        (json!(1), json!(2))
    );
    for reader in std::iter::once(&writer).chain(readers) {
        read_until(
            reader,
            &window_path(now, "trending"),
            "trending rolled back",
            |body| serves(body, 1, &v1),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trending_on_the_embedded_engine_is_the_formula_and_can_be_reweighted_and_rolled_back() {
    let app = spawn_app_with(|config| config.rankings.freshness_millis = 200).await;
    put_and_rollback_trending(&app, &[&app]).await;
    let data_dir = app.data_dir.display().to_string();
    let dir = app.stop().await;
    assert_verify_passes(&["--data-dir", &data_dir]);
    drop(dir);
}

/// Two instances on one PostgreSQL schema and one Redis (`redis_urls`: standalone, or the nodes of a
/// Cluster): Redis serves the hot spans of the other rankers, the engines answer `trending`.
async fn two_instances_on_postgres_and_redis(name: &str, redis_urls: Vec<String>) {
    let schema = format!("rgtest_trending_{name}_{}", std::process::id());
    let _guard = SchemaGuard::named(schema.clone());
    let prefix = format!("rgtest:trending:{name}:{}:", std::process::id());
    let _cleanup = KeyCleanup {
        nodes: redis_urls.clone(),
        prefix: prefix.clone(),
    };
    let spawn = || {
        let (schema, prefix, urls) = (schema.clone(), prefix.clone(), redis_urls.clone());
        spawn_app_with(move |config| {
            config.rankings.database = Some(postgres_url());
            config.rankings.database_schema = schema;
            config.rankings.freshness_millis = 200;
            config.redis = urls;
            config.redis_prefix = prefix;
            config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
        })
    };
    let a = spawn().await;
    let b = spawn().await;
    put_and_rollback_trending(&a, &[&b]).await;
    // Redis holds the other rankers' hot spans and no trending key.
    let (mut popular, mut trending) = (Vec::new(), Vec::new());
    for url in &redis_urls {
        let mut connection = redis::Client::open(url.as_str())
            .and_then(|client| client.get_connection())
            .unwrap();
        for (pattern, found) in [("*:popular:7d:*", &mut popular), ("*trending*", &mut trending)] {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{prefix}{pattern}"))
                .query(&mut connection)
                .unwrap();
            found.extend(keys);
        }
    }
    assert!(
        !popular.is_empty() && trending.is_empty(),
        "{popular:?} {trending:?}"
    );
    let data_dir = a.data_dir.display().to_string();
    assert_verify_passes(&[
        "--database",
        &postgres_url(),
        "--database-schema",
        &schema,
        "--data-dir",
        &data_dir,
    ]);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trending_reweighted_through_one_instance_reaches_the_other_on_postgres_and_redis() {
    two_instances_on_postgres_and_redis("standalone", vec![standalone_url()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trending_reweighted_through_one_instance_reaches_the_other_on_postgres_and_a_redis_cluster() {
    let urls = tokio::task::spawn_blocking(|| cluster().urls.clone())
        .await
        .unwrap();
    two_instances_on_postgres_and_redis("cluster", urls).await;
}

/// A running period's E is the server clock's hour: when the hour turns, today's trending scores decay
/// by one more hour, while a window (E = its `at`) and a finished hour keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_period_decays_when_the_server_clock_turns_the_hour() {
    let today = now_millis().div_euclid(24 * HOUR) * 24 * HOUR;
    let start = today + 10 * HOUR + 30 * 60_000;
    let clock = Arc::new(ManualClock::new(start));
    let app = spawn_app_with_clock(clock.clone(), |config| config.rankings.freshness_millis = 200).await;
    let mut events = Vec::new();
    for n in 0..4 {
        events.push(view(&format!("a-{n}"), "p-a", start, &[]));
    }
    for n in 0..2 {
        events.push(view(&format!("b-{n}"), "p-b", start - HOUR, &[]));
    }
    app.post_events_ok(&Value::Array(events)).await;
    let today_path = format!(
        "/v1/categories/all/top?ranker=trending&period=daily&at={}",
        day_key(start)
    );
    let window_path = format!(
        "/v1/categories/all/top?ranker=trending&window=1d&at={}",
        hour_key(start)
    );
    let score_at = |end_age_a: i64| {
        [
            ("p-a", 4.0 * decay(end_age_a, 24.0) * 0.1),
            ("p-b", 2.0 * decay(end_age_a + 1, 24.0) * 0.1),
        ]
    };
    let scores = |body: &Value| -> Vec<(String, u64)> {
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| {
                (
                    item["productId"].as_str().unwrap().to_string(),
                    item["score"].as_f64().unwrap().to_bits(),
                )
            })
            .collect()
    };
    let want = |ranking: [(&str, f64); 2]| -> Vec<(String, u64)> {
        ranking
            .iter()
            .map(|(p, s)| (p.to_string(), s.to_bits()))
            .collect()
    };
    read_until(&app, &today_path, "today at E = 10:00", |body| {
        scores(body) == want(score_at(0))
    })
    .await;
    let window = app.get_json(&window_path).await;
    assert_eq!(scores(&window), want(score_at(0)));

    clock.advance(HOUR);
    read_until(&app, &today_path, "today at E = 11:00", |body| {
        scores(body) == want(score_at(1))
    })
    .await;
    assert_eq!(
        scores(&app.get_json(&window_path).await),
        want(score_at(0)),
        "a window keeps its E"
    );
    let finished = app
        .get_json(&format!(
            "/v1/categories/all/top?ranker=trending&period=hourly&at={}",
            hour_key(start)
        ))
        .await;
    assert_eq!(
        scores(&finished),
        vec![("p-a".to_string(), (4.0f64 * 0.1).to_bits())],
        "a finished hour ends at its own last hour"
    );
    app.stop().await;
}

#[tokio::test]
async fn hostile_trending_puts_are_refused_naming_the_field_and_create_no_version() {
    let app = spawn_app().await;
    for (body, field) in [
        (json!({ "halfLifeHours": 0 }), "halfLifeHours"),
        (json!({ "halfLifeHours": -24 }), "halfLifeHours"),
        (json!({ "halfLifeHours": 0.5 }), "halfLifeHours"),
        (json!({ "halfLifeHours": 1e9 }), "halfLifeHours"),
        (json!({ "halfLifeHours": "24" }), "body"),
        (json!({ "carryRatio": 0.1 }), "carryRatio"),
        (json!({ "carryTopN": 5 }), "carryTopN"),
        (json!({ "weights": { "view": -1 } }), "weights.view"),
        (json!({ "weights": { "like": 2e6 } }), "weights.like"),
        (json!({ "halfLife": 24 }), "halfLife"),
    ] {
        let response = put_trending(&app, body.clone()).await;
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.unwrap();
        let message = error["error"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{body}: {message}");
    }
    let popular = app
        .client
        .put(format!("{}/v1/admin/rankers/popular", app.address))
        .json(&json!({ "halfLifeHours": 12 }))
        .send()
        .await
        .unwrap();
    assert_eq!(popular.status(), 400);
    let error: Value = popular.json().await.unwrap();
    assert!(
        error["error"].as_str().unwrap().starts_with("halfLifeHours"),
        "{error}"
    );
    let admin = app.get_json("/v1/admin/rankers/trending").await;
    assert_eq!(
        (
            admin["activeVersion"].clone(),
            admin["building"].clone(),
            admin["halfLifeHours"].clone()
        ),
        (json!(1), Value::Null, json!(24.0))
    );
    let bad_read = app.get("/v1/categories/all/top?ranker=trendy").await;
    assert_eq!(bad_read.status(), 400);
    let error: Value = bad_read.json().await.unwrap();
    assert!(error["error"].as_str().unwrap().contains("trending"), "{error}");
    // Restarted on the same data, the refused PUTs left nothing behind.
    let data_dir = app.stop().await.expect("the app owns its data dir");
    let restarted = spawn_app_in(data_dir.path().to_path_buf(), |_| {}).await;
    assert_eq!(restarted.get_json("/v1/admin/rankers/trending").await, admin);
    restarted.stop().await;
}
