//! The richer reads of SPEC 1.5 through HTTP, on the embedded engine and on PostgreSQL + Redis serving
//! (standalone and a 3-node Cluster): `percentile` and `periodStart` / `periodEnd` on `top` and `rank`,
//! `POST /v1/rankings/sort` (order, ties, unknown and past-depth products, hostile bodies),
//! `GET /v1/products/{id}/ranks`, and the CDN headers (`Cache-Control`, `ETag`, `304 Not Modified`).

use jiff::tz::TimeZone;
use jiff::Timestamp;
use serde_json::{json, Value};

use crate::helpers::*;
use crate::redis_servers::{cluster, unique_prefix, KeyCleanup, LocalRedis};

impl TestApp {
    async fn post_sort(&self, body: &Value) -> reqwest::Response {
        self.client
            .post(format!("{}/v1/rankings/sort", self.address))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    async fn post_sort_ok(&self, body: &Value) -> Value {
        let response = self.post_sort(body).await;
        let status = response.status();
        assert_eq!(
            response.headers()["cache-control"],
            "no-store",
            "a POST answer is not for caches"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 200, "sort: {body}");
        body
    }

    async fn get_with(&self, path: &str, if_none_match: Option<&str>) -> reqwest::Response {
        let mut request = self.client.get(format!("{}{}", self.address, path));
        if let Some(tag) = if_none_match {
            request = request.header("if-none-match", tag);
        }
        request.send().await.unwrap()
    }
}

fn ids(items: &Value) -> Vec<String> {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["productId"].as_str().unwrap().to_string())
        .collect()
}

fn zoned(millis: i64, zone: &str) -> jiff::Zoned {
    Timestamp::from_millisecond(millis)
        .unwrap()
        .to_zoned(TimeZone::get(zone).unwrap())
}

fn rfc3339(zoned: &jiff::Zoned) -> String {
    zoned.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_carry_percentile_and_span_bounds_with_the_zone_offset() {
    let app = spawn_app_with(|config| {
        config.rankings.zone = rankgate_core::period::Zone::parse("Asia/Tokyo").unwrap();
    })
    .await;
    let now = now_millis();
    // Four products by units in toys: p1 4, p2 3, p3 2, p4 1; p5 only viewed.
    app.post_events_ok(&json!([
        sale("s1", "p1", now, 4, 100, &["toys"]),
        sale("s2", "p2", now, 3, 100, &["toys"]),
        sale("s3", "p3", now, 2, 100, &["toys"]),
        sale("s4", "p4", now, 1, 100, &["toys"]),
        view("v5", "p5", now, &["toys"]),
    ]))
    .await;
    let local = zoned(now, "Asia/Tokyo");
    let day = local.strftime("%Y%m%d").to_string();
    let day_start = local.start_of_day().unwrap();
    let next_day = day_start.tomorrow().unwrap().start_of_day().unwrap();

    let top = app
        .get_json(&format!(
            "/v1/categories/toys/top?ranker=units&period=daily&at={day}"
        ))
        .await;
    assert_eq!(top["periodStart"], rfc3339(&day_start));
    assert!(
        top["periodStart"].as_str().unwrap().ends_with("T00:00:00+09:00"),
        "{top}"
    );
    assert_eq!(
        top["periodEnd"],
        rfc3339(&next_day),
        "the exclusive end: the next local midnight"
    );
    let percentiles: Vec<f64> = top["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["percentile"].as_f64().unwrap())
        .collect();
    assert_eq!(percentiles, [25.0, 50.0, 75.0, 100.0], "rank / total, in percent");

    let rank = app
        .get_json(&format!(
            "/v1/products/p2/rank?category=toys&ranker=units&period=daily&at={day}"
        ))
        .await;
    assert_eq!(
        (rank["rank"].as_u64(), rank["percentile"].as_f64()),
        (Some(2), Some(50.0))
    );
    assert_eq!(rank["periodStart"], top["periodStart"]);
    assert_eq!(rank["periodEnd"], top["periodEnd"]);
    let unranked = app
        .get_json(&format!(
            "/v1/products/p5/rank?category=toys&ranker=units&period=daily&at={day}"
        ))
        .await;
    assert_eq!(unranked["rank"], Value::Null);
    assert_eq!(unranked["percentile"], Value::Null, "null when unranked");

    // Popular lists p5 too (5 listed): p1 is 1 of 5 = 20%, rounded up to hundredths in general.
    let popular = app
        .get_json(&format!(
            "/v1/products/p1/rank?category=toys&period=daily&at={day}"
        ))
        .await;
    assert_eq!(popular["total"], 5);
    assert_eq!(popular["percentile"], 20.0);

    // A window ending at this local hour: it ends where the next local hour starts, 168 hours after it starts.
    let hour = local.strftime("%Y%m%d%H").to_string();
    let hour_start = local
        .with()
        .minute(0)
        .second(0)
        .subsec_nanosecond(0)
        .build()
        .unwrap();
    let window = app
        .get_json(&format!("/v1/categories/toys/top?window=7d&at={hour}"))
        .await;
    let end = &hour_start + jiff::Span::new().hours(1);
    let start = &end - jiff::Span::new().hours(168);
    assert_eq!(window["periodEnd"], rfc3339(&end));
    assert_eq!(window["periodStart"], rfc3339(&start));
    assert_eq!(window["window"], "7d");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etags_hold_without_change_answer_304_and_move_when_an_event_changes_the_span() {
    let app = spawn_app_with(|config| config.rankings.cache_max_age_seconds = 7).await;
    let now = now_millis();
    let day = day_key(now);
    app.post_events_ok(&json!([
        sale("s1", "p1", now, 2, 100, &["toys"]),
        sale("s2", "p2", now, 1, 100, &["toys"])
    ]))
    .await;
    for path in [
        format!("/v1/categories/toys/top?ranker=units&period=daily&at={day}"),
        format!("/v1/products/p2/rank?category=toys&ranker=units&period=daily&at={day}"),
        format!("/v1/products/p2/ranks?ranker=units&period=daily&at={day}"),
    ] {
        let first = app.get_with(&path, None).await;
        assert_eq!(first.status(), 200);
        assert_eq!(first.headers()["cache-control"], "public, max-age=7", "{path}");
        let etag = first.headers()["etag"].to_str().unwrap().to_string();
        assert!(
            etag.starts_with('"') && etag.ends_with('"') && etag.len() == 18,
            "strong: {etag}"
        );
        let body = first.bytes().await.unwrap();
        let again = app.get_with(&path, None).await;
        assert_eq!(
            again.headers()["etag"],
            etag.as_str(),
            "{path}: no change, same tag"
        );
        assert_eq!(again.bytes().await.unwrap(), body, "{path}: and the same body");

        for header in [
            etag.clone(),
            format!("W/{etag}"),
            "*".into(),
            format!("\"nope\", {etag}"),
        ] {
            let cached = app.get_with(&path, Some(&header)).await;
            assert_eq!(cached.status(), 304, "{path} If-None-Match: {header}");
            assert_eq!(cached.headers()["etag"], etag.as_str());
            assert_eq!(cached.headers()["cache-control"], "public, max-age=7");
            assert!(cached.bytes().await.unwrap().is_empty(), "a 304 has no body");
        }
        let other = app.get_with(&path, Some("\"0000000000000000\"")).await;
        assert_eq!(other.status(), 200, "{path}: another tag is not a match");
        let huge = format!("{}{etag}", "\"x\", ".repeat(3_000));
        let hostile = app.get_with(&path, Some(&huge)).await;
        assert_eq!(
            hostile.status(),
            200,
            "{path}: a huge If-None-Match is not scanned: answered in full"
        );
    }

    // An event in toys today changes each of those answers: a new tag, and the old one no longer matches.
    let path = format!("/v1/categories/toys/top?ranker=units&period=daily&at={day}");
    let before = app.get_with(&path, None).await.headers()["etag"]
        .to_str()
        .unwrap()
        .to_string();
    let rank_path = format!("/v1/products/p2/rank?category=toys&ranker=units&period=daily&at={day}");
    let rank_before = app.get_with(&rank_path, None).await.headers()["etag"]
        .to_str()
        .unwrap()
        .to_string();
    app.post_events_ok(&json!([sale("s3", "p2", now, 5, 100, &["toys"])]))
        .await;
    let after = app.get_with(&path, Some(&before)).await;
    assert_eq!(after.status(), 200, "the span changed: the old tag is stale");
    assert_ne!(after.headers()["etag"], before.as_str());
    let body: Value = after.json().await.unwrap();
    assert_eq!(ids(&body["items"]), ["p2", "p1"], "and the body shows the change");
    let rank_after = app.get_with(&rank_path, Some(&rank_before)).await;
    assert_eq!(rank_after.status(), 200);
    assert_ne!(rank_after.headers()["etag"], rank_before.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sort_orders_products_by_the_ranking_and_puts_unranked_ones_last_in_the_order_asked() {
    let app = spawn_app().await;
    let now = now_millis();
    let day = day_key(now);
    // units in toys: p3 5, then a tie p1 = p2 = 3 (by product id), p4 only viewed; p9 in gifts only.
    app.post_events_ok(&json!([
        sale("s1", "p2", now, 3, 100, &["toys"]),
        sale("s2", "p1", now, 3, 100, &["toys"]),
        sale("s3", "p3", now, 5, 100, &["toys"]),
        view("v4", "p4", now, &["toys"]),
        sale("s5", "p9", now, 9, 100, &["gifts"]),
    ]))
    .await;
    let sorted = app
        .post_sort_ok(&json!({
            "ranker": "units", "category": "toys", "period": "daily", "at": day,
            "productIds": ["nobody", "p2", "p4", "p9", "p1", "p3"]
        }))
        .await;
    assert_eq!(ids(&sorted["items"]), ["p3", "p1", "p2", "nobody", "p4", "p9"]);
    let items = sorted["items"].as_array().unwrap();
    assert_eq!(
        items.iter().map(|i| i["rank"].clone()).collect::<Vec<_>>(),
        [
            json!(1),
            json!(2),
            json!(3),
            Value::Null,
            Value::Null,
            Value::Null
        ]
    );
    assert_eq!(items[0]["score"], 5.0);
    assert_eq!(
        items[1]["metrics"],
        json!({ "views": 0, "likes": 0, "units": 3, "sales": 300 })
    );
    assert_eq!(
        items[0]["percentile"].as_f64(),
        Some(33.34),
        "1 of 3 = 33.33…, rounded up"
    );
    assert_eq!(items[3]["score"], Value::Null);
    assert_eq!(
        items[4]["metrics"]["views"], 1,
        "an unranked product still shows its metrics"
    );
    assert_eq!(
        (sorted["total"].as_u64(), sorted["category"].as_str()),
        (Some(3), Some("toys"))
    );
    assert_eq!(sorted["period"], "daily");
    assert_eq!(sorted["at"], day.as_str());
    assert!(sorted["periodStart"]
        .as_str()
        .unwrap()
        .ends_with("T00:00:00+00:00"));

    // The same order as the top list, on every ranker; defaults are popular, all, today.
    for ranker in ["popular", "units", "revenue"] {
        let top = app
            .get_json(&format!(
                "/v1/categories/all/top?ranker={ranker}&period=daily&at={day}"
            ))
            .await;
        let everyone = app
            .post_sort_ok(&json!({ "ranker": ranker, "productIds": ["p4", "p3", "p2", "p1", "p9"] }))
            .await;
        let ranked: Vec<String> = everyone["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|item| !item["rank"].is_null())
            .map(|item| item["productId"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ranked, ids(&top["items"]), "{ranker}: sort agrees with top");
    }
    let window = app
        .post_sort_ok(&json!({ "window": "1d", "productIds": ["p1"] }))
        .await;
    assert_eq!(window["window"], "1d");
    assert_eq!(
        window["items"][0]["rank"].as_u64(),
        Some(3),
        "popular all 1d: p9, p3, then p1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_sort_bodies_are_refused_naming_the_field() {
    let app = spawn_app().await;
    let too_many: Vec<String> = (0..1_001).map(|i| format!("p{i}")).collect();
    let long_id = "x".repeat(129);
    for (body, field) in [
        (json!({ "productIds": ["p1"], "limit": 5 }), "limit"),
        (json!({ "productIds": ["p1", "p2", "p1"] }), "productIds[2]"),
        (json!({ "productIds": ["p1", "bad\u{7}id"] }), "productIds[1]"),
        (json!({ "productIds": [long_id] }), "productIds[0]"),
        (json!({ "productIds": [""] }), "productIds[0]"),
        (json!({ "productIds": too_many }), "productIds"),
        (json!({ "productIds": [] }), "productIds"),
        (json!({}), "productIds"),
        (json!({ "productIds": "p1" }), "body"),
        (json!({ "productIds": [1, 2] }), "body"),
        (json!({ "productIds": ["p1"], "ranker": "nope" }), "ranker"),
        (json!({ "productIds": ["p1"], "category": "" }), "category"),
        (
            json!({ "productIds": ["p1"], "period": "daily", "window": "7d" }),
            "window",
        ),
        (
            json!({ "productIds": ["p1"], "period": "daily", "at": "99991231" }),
            "at",
        ),
        (json!({ "productIds": ["p1"], "period": "fortnightly" }), "period"),
        (json!({ "productIds": ["p1"], "at": 20260101 }), "body"),
        (json!([1, 2]), "body"),
    ] {
        let response = app.post_sort(&body).await;
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.unwrap();
        let message = error["error"].as_str().unwrap();
        assert!(message.contains(field), "{body}: {message} should name {field}");
    }
    for raw in [
        "{\"productIds\": [\"p1\"], \"productIds\": [\"p2\"]}".to_string(),
        "not json".to_string(),
        format!("{{\"productIds\": [{}]}}", "[".repeat(10_000)),
    ] {
        let response = app
            .client
            .post(format!("{}/v1/rankings/sort", app.address))
            .header("content-type", "application/json")
            .body(raw.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{}", &raw[..raw.len().min(60)]);
        let error: Value = response.json().await.unwrap();
        assert!(error["error"].as_str().unwrap().starts_with("body: "), "{error}");
    }
    let huge = format!("{{\"productIds\": [\"{}\"]}}", "y".repeat(1 << 20));
    let response = app
        .client
        .post(format!("{}/v1/rankings/sort", app.address))
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    let duplicate_field: Value = app
        .client
        .post(format!("{}/v1/rankings/sort", app.address))
        .body("{\"productIds\": [\"p1\"], \"ranker\": \"units\", \"ranker\": \"units\"}")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        duplicate_field["error"].as_str().unwrap().contains("ranker"),
        "{duplicate_field}"
    );
    // The server still answers after all that.
    assert_eq!(
        app.post_sort_ok(&json!({ "productIds": ["p1"] })).await["items"][0]["rank"],
        Value::Null
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_lists_all_then_each_category_of_the_product() {
    let app = spawn_app().await;
    let now = now_millis();
    let day = day_key(now);
    app.post_events_ok(&json!([
        sale("s1", "p1", now, 2, 100, &["toys", "gifts"]),
        sale("s2", "p2", now, 5, 100, &["toys"]),
        view("v3", "p1", now, &["books"]),
        sale("s4", "p3", now, 1, 100, &["gifts"]),
        view("v5", "p4", now, &["books"]),
    ]))
    .await;
    let viewed = app
        .get_json(&format!(
            "/v1/products/p4/ranks?ranker=units&period=daily&at={day}"
        ))
        .await;
    assert_eq!(
        viewed["ranks"],
        json!([
            { "category": "all", "rank": null, "score": null, "total": 3, "percentile": null },
            { "category": "books", "rank": null, "score": null, "total": 1, "percentile": null },
        ]),
        "only viewed: not listed by units anywhere, every category still answered"
    );
    let ranks = app
        .get_json(&format!(
            "/v1/products/p1/ranks?ranker=units&period=daily&at={day}"
        ))
        .await;
    assert_eq!(ranks["productId"], "p1");
    assert_eq!(ranks["ranker"], "units");
    assert_eq!(
        (ranks["period"].as_str(), ranks["at"].as_str()),
        (Some("daily"), Some(day.as_str()))
    );
    assert!(ranks["periodEnd"].as_str().unwrap().ends_with("T00:00:00+00:00"));
    let categories: Vec<&str> = ranks["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["category"].as_str().unwrap())
        .collect();
    assert_eq!(
        categories,
        ["all", "books", "gifts", "toys"],
        "all first, then by name"
    );
    for entry in ranks["ranks"].as_array().unwrap() {
        let category = entry["category"].as_str().unwrap();
        let rank = app
            .get_json(&format!(
                "/v1/products/p1/rank?category={category}&ranker=units&period=daily&at={day}"
            ))
            .await;
        for field in ["rank", "score", "total", "percentile"] {
            assert_eq!(
                entry[field], rank[field],
                "{category} {field}: ranks agrees with rank"
            );
        }
    }
    assert_eq!(
        (
            ranks["ranks"][1]["rank"].as_u64(),
            ranks["ranks"][1]["total"].as_u64()
        ),
        (Some(1), Some(1)),
        "a product's metrics count in every category it belongs to: its 2 units rank in books too"
    );
    assert_eq!(ranks["ranks"][2]["rank"], 1, "gifts: 2 units before p3's 1");
    assert_eq!(ranks["ranks"][3]["rank"], 2, "toys: after p2's 5");

    let unknown = app.get_json("/v1/products/nobody/ranks").await;
    assert_eq!(
        unknown["ranks"],
        json!([{ "category": "all", "rank": null, "score": null, "total": 4, "percentile": null }]),
        "a product never seen: just `all`, unlisted (popular lists p1 to p4)"
    );
    let bad = app.get("/v1/products/p1/ranks?window=2d").await;
    assert_eq!(bad.status(), 400);
    let error: Value = bad.json().await.unwrap();
    assert!(error["error"].as_str().unwrap().starts_with("window"), "{error}");
}

/// PostgreSQL + Redis serving on `redis` (one standalone server of our own, or the Cluster), Top-N-only
/// when `depth` is given.
async fn spawn_on_redis(schema: &str, redis: Vec<String>, prefix: &str, depth: Option<usize>) -> TestApp {
    let (schema, prefix) = (schema.to_string(), prefix.to_string());
    spawn_app_with(move |config| {
        config.rankings.database = Some(postgres_url());
        config.rankings.database_schema = schema;
        config.redis = redis;
        config.redis_prefix = prefix;
        config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
        config.rankings.freshness_millis = 200;
        config.rankings.serving_depth = depth;
    })
    .await
}

/// Calls of `command` Redis has run on `nodes` in all, scripts' calls included (`INFO commandstats`).
fn command_calls(nodes: &[String], command: &str) -> u64 {
    nodes
        .iter()
        .map(|node| {
            let mut connection = redis::Client::open(node.as_str())
                .unwrap()
                .get_connection()
                .unwrap();
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut connection)
                .unwrap();
            info.lines()
                .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |calls| calls.parse().unwrap())
        })
        .sum()
}

/// The reads of this module on PostgreSQL + Redis serving: answered by Redis (its scripts run: ZMSCORE
/// is the sort script's alone), equal to what the engine answers, with tags and 304s; in Top-N-only
/// serving a sort naming products past the depth is answered whole from the engine, correctly.
async fn reads_on_redis_serving(nodes: Vec<String>, label: &str) {
    let schema = format!("rgtest_reads_{label}_{}", std::process::id());
    let _schema = SchemaGuard::named(schema.clone());
    let prefix = unique_prefix();
    let _cleanup = KeyCleanup {
        nodes: nodes.clone(),
        prefix: prefix.clone(),
    };
    let app = spawn_on_redis(&schema, nodes.clone(), &prefix, None).await;
    let now = now_millis();
    let day = day_key(now);
    let events: Vec<Value> = (0..12)
        .map(|i| {
            let categories: &[&str] = if i % 2 == 0 { &["toys", "gifts"] } else { &["toys"] };
            // Units 1..=4 repeating: ties on every score, broken by product id.
            sale(
                &format!("s{i}"),
                &format!("p{i:02}"),
                now,
                1 + (i % 4),
                100,
                categories,
            )
        })
        .collect();
    app.post_events_ok(&Value::Array(events)).await;
    let top_path = format!("/v1/categories/toys/top?ranker=units&period=daily&at={day}&limit=50");
    let top = read_until(&app, &top_path, "redis serves today's toys", |body| {
        body["total"] == 12 && body["stale"] == false
    })
    .await;
    let order = ids(&top["items"]);
    assert_eq!(
        order[..4],
        ["p03", "p07", "p11", "p02"],
        "4 units: p03 p07 p11 by id, then 3 units"
    );
    assert!(top["items"][0]["percentile"].as_f64().unwrap() > 0.0);
    assert!(top["periodStart"].as_str().unwrap().ends_with("T00:00:00+00:00"));

    let asked: Vec<String> = ["nobody", "p05", "p00", "p11", "p03"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let zmscore_before = command_calls(&nodes, "zmscore");
    let sorted = app
        .post_sort_ok(&json!({ "ranker": "units", "category": "toys", "period": "daily", "at": day, "productIds": asked }))
        .await;
    assert!(
        command_calls(&nodes, "zmscore") > zmscore_before,
        "{label}: Redis ran the sort script"
    );
    assert_eq!(sorted["stale"], false);
    let want: Vec<String> = order
        .iter()
        .filter(|p| asked.contains(p))
        .cloned()
        .chain(["nobody".to_string()])
        .collect();
    assert_eq!(
        ids(&sorted["items"]),
        want,
        "{label}: ranking order, unknown last"
    );
    for item in sorted["items"].as_array().unwrap().iter().take(4) {
        let rank = app
            .get_json(&format!(
                "/v1/products/{}/rank?category=toys&ranker=units&period=daily&at={day}",
                item["productId"].as_str().unwrap()
            ))
            .await;
        assert_eq!(
            (item["rank"].clone(), item["score"].clone()),
            (rank["rank"].clone(), rank["score"].clone())
        );
        assert_eq!(item["metrics"], rank["metrics"]);
        assert_eq!(item["percentile"], rank["percentile"]);
    }

    let ranks = app
        .get_json(&format!(
            "/v1/products/p04/ranks?ranker=units&period=daily&at={day}"
        ))
        .await;
    assert_eq!(ranks["stale"], false);
    let categories: Vec<&str> = ranks["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["category"].as_str().unwrap())
        .collect();
    assert_eq!(categories, ["all", "gifts", "toys"]);
    assert_eq!(
        ranks["ranks"][2]["rank"].as_u64(),
        Some(order.iter().position(|p| p == "p04").unwrap() as u64 + 1)
    );
    assert_eq!(
        ranks["ranks"][1]["total"], 6,
        "{label}: the even products are in gifts"
    );

    // A second instance on the same PostgreSQL and Redis serves the same bytes, so the same tag: a CDN
    // in front of both revalidates against either (an answer's tag is its body's hash).
    let second = spawn_on_redis(&schema, nodes.clone(), &prefix, None).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let shared_tag = loop {
        let tag_of = |response: &reqwest::Response| response.headers()["etag"].to_str().unwrap().to_string();
        let (one, two) = (
            app.get_with(&top_path, None).await,
            second.get_with(&top_path, None).await,
        );
        if tag_of(&one) == tag_of(&two) {
            break tag_of(&one);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{label}: the instances never agreed on a tag"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(
        second.get_with(&top_path, Some(&shared_tag)).await.status(),
        304,
        "{label}"
    );
    assert_eq!(
        app.get_with(&top_path, Some(&shared_tag)).await.status(),
        304,
        "{label}"
    );
    let sorted_on_second = second
        .post_sort_ok(&json!({ "ranker": "units", "category": "toys", "period": "daily", "at": day, "productIds": ["nobody", "p05", "p00", "p11", "p03"] }))
        .await;
    assert_eq!(
        sorted_on_second["items"], sorted["items"],
        "{label}: both instances sort alike"
    );
    second.stop().await;

    // Tags and 304 on the Redis route; an event moves the tag once it is published.
    let rank_path = format!("/v1/products/p05/rank?category=toys&ranker=units&period=daily&at={day}");
    let first = app.get_with(&rank_path, None).await;
    let etag = first.headers()["etag"].to_str().unwrap().to_string();
    assert_eq!(
        app.get_with(&rank_path, Some(&etag)).await.status(),
        304,
        "{label}"
    );
    app.post_events_ok(&json!([sale("late", "p05", now, 10, 100, &["toys"])]))
        .await;
    read_until(&app, &rank_path, "the new sale is served", |body| {
        body["rank"] == 1
    })
    .await;
    let moved = app.get_with(&rank_path, Some(&etag)).await;
    assert_eq!(
        moved.status(),
        200,
        "{label}: the served data changed, the old tag is stale"
    );
    assert_ne!(moved.headers()["etag"], etag.as_str());
    app.stop().await;

    // Top-N-only: Redis holds the top 3; a sort naming products past them is answered, right, by the engine.
    let schema_k = format!("{schema}_k");
    let _schema_k = SchemaGuard::named(schema_k.clone());
    let prefix_k = unique_prefix();
    let _cleanup_k = KeyCleanup {
        nodes: nodes.clone(),
        prefix: prefix_k.clone(),
    };
    let app = spawn_on_redis(&schema_k, nodes.clone(), &prefix_k, Some(3)).await;
    let events: Vec<Value> = (0..8)
        .map(|i| sale(&format!("k{i}"), &format!("q{i}"), now, 1 + i, 100, &["toys"]))
        .collect();
    app.post_events_ok(&Value::Array(events)).await;
    read_until(&app, &top_path, "redis serves the top 3", |body| {
        body["total"] == 8 && body["stale"] == false
    })
    .await;
    let within = app
        .post_sort_ok(&json!({ "ranker": "units", "category": "toys", "period": "daily", "at": day, "productIds": ["q6", "q7"] }))
        .await;
    assert_eq!(ids(&within["items"]), ["q7", "q6"]);
    let past = app
        .post_sort_ok(
            &json!({ "ranker": "units", "category": "toys", "period": "daily", "at": day,
                                "productIds": ["q0", "nobody", "q7", "q2"] }),
        )
        .await;
    assert_eq!(
        ids(&past["items"]),
        ["q7", "q2", "q0", "nobody"],
        "{label}: past the depth, still ranked"
    );
    assert_eq!(
        past["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["rank"].clone())
            .collect::<Vec<_>>(),
        [json!(1), json!(6), json!(8), Value::Null]
    );
    assert_eq!(past["stale"], false);
    let ranks = app
        .get_json(&format!(
            "/v1/products/q1/ranks?ranker=units&period=daily&at={day}"
        ))
        .await;
    assert_eq!(
        ranks["ranks"][1]["rank"], 7,
        "{label}: ranks past the depth comes from the engine"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sort_ranks_and_tags_on_postgres_and_standalone_redis() {
    let redis = LocalRedis::start(1, false);
    reads_on_redis_serving(redis.urls.clone(), "standalone").await;
    redis.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sort_ranks_and_tags_on_postgres_and_a_redis_cluster() {
    reads_on_redis_serving(cluster().urls.clone(), "cluster").await;
}
