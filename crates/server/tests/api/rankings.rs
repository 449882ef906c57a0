//! Read API: top lists and ranks, every parameter, 400s that name the parameter, carry, catalogue and
//! restart.

use serde_json::json;

use crate::helpers::*;

const HOUR: i64 = 3_600_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_lists_are_ordered_by_score_then_product_id_with_1_based_ranks() {
    let app = spawn_app().await;
    let now = now_millis();
    app.post_events_ok(&json!([
        sale("s1", "p2", now, 3, 100, &["toys"]),
        sale("s2", "p1", now, 3, 100, &["toys", "gifts"]),
        sale("s3", "p3", now, 5, 100, &["gifts"]),
        view("v1", "p4", now, &["toys"]),
    ]))
    .await;
    let day = day_key(now);
    let top = app
        .get_json(&format!(
            "/v1/categories/toys/top?ranker=units&period=daily&at={day}"
        ))
        .await;
    assert_eq!(top["ranker"], "units");
    assert_eq!(top["category"], "toys");
    assert_eq!(top["period"], "daily");
    assert_eq!(top["at"], day);
    assert_eq!(top["stale"], false);
    assert_eq!(top["total"], 2, "p4 has no units, so it is not listed by `units`");
    assert!(top["asOf"].as_str().unwrap().ends_with('Z'));
    let ids: Vec<&str> = top["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["productId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["p1", "p2"], "equal scores tie by product id ascending");
    assert_eq!(top["items"][0]["rank"], 1);
    assert_eq!(top["items"][0]["score"], 3.0);
    assert_eq!(
        top["items"][0]["metrics"],
        json!({ "views": 0, "likes": 0, "units": 3, "sales": 300 })
    );

    let all = app
        .get_json("/v1/categories/all/top?ranker=revenue&window=1d")
        .await;
    assert_eq!(all["window"], "1d");
    assert_eq!(all["total"], 3);
    assert_eq!(all["items"][0]["productId"], "p3");

    let popular = app.get_json("/v1/categories/toys/top").await;
    assert_eq!(popular["ranker"], "popular");
    assert_eq!(popular["total"], 3);

    let rank = app
        .get_json("/v1/products/p2/rank?category=toys&window=7d&ranker=units")
        .await;
    assert_eq!(rank["rank"], 2);
    assert_eq!(rank["total"], 2);
    assert_eq!(rank["window"], "7d");
    assert_eq!(rank["score"], 3.0);
    let unlisted = app
        .get_json("/v1/products/p3/rank?category=toys&window=7d&ranker=units")
        .await;
    assert_eq!(
        unlisted["rank"],
        serde_json::Value::Null,
        "not in toys: 200 with rank null"
    );
    let unknown = app.get_json("/v1/products/nobody/rank").await;
    assert_eq!(unknown["rank"], serde_json::Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parameters_get_400_naming_the_parameter() {
    let app = spawn_app().await;
    for (query, parameter) in [
        ("/v1/categories/all/top?limit=0", "limit"),
        ("/v1/categories/all/top?limit=1001", "limit"),
        ("/v1/categories/all/top?limit=abc", "limit"),
        ("/v1/categories/all/top?offset=-1", "offset"),
        ("/v1/categories/all/top?offset=9990&limit=20", "offset"),
        ("/v1/categories/all/top?ranker=best", "ranker"),
        ("/v1/categories/all/top?period=annual", "period"),
        ("/v1/categories/all/top?period=yearly&at=202607", "at"),
        ("/v1/categories/all/top?window=2d", "window"),
        ("/v1/categories/all/top?period=daily&at=2026W29", "at"),
        ("/v1/categories/all/top?period=weekly&at=2021W53", "at"),
        ("/v1/categories/all/top?window=7d&at=20260717", "at"),
        ("/v1/categories/all/top?period=daily&window=7d", "window"),
        ("/v1/products/p1/rank?ranker=nope", "ranker"),
    ] {
        let response = app.get(query).await;
        assert_eq!(response.status(), 400, "{query}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert!(
            body["error"].as_str().unwrap().starts_with(parameter),
            "{query}: {body}"
        );
    }
    let control = app.get("/v1/categories/a%01b/top").await;
    assert_eq!(control.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_out_of_bounds_gets_400_naming_at_and_builds_nothing() {
    let app = spawn_app().await;
    let now = now_millis();
    let far_hour = hour_key(now + 48 * 3_600_000);
    for query in [
        "/v1/categories/all/top?period=daily&at=99981231".to_string(),
        "/v1/categories/all/top?period=daily&at=00010101".to_string(),
        "/v1/categories/all/top?period=hourly&at=9998123123".to_string(),
        format!("/v1/categories/all/top?period=hourly&at={far_hour}"),
        "/v1/categories/all/top?window=7d&at=9998123123".to_string(),
        format!("/v1/categories/all/top?window=1h&at={far_hour}"),
        "/v1/products/p1/rank?period=monthly&at=999812".to_string(),
        "/v1/products/p1/rank?period=weekly&at=0001W01".to_string(),
        "/v1/products/p1/rank?period=yearly&at=0001".to_string(),
        "/v1/categories/all/top?period=yearly&at=9998".to_string(),
    ] {
        let response = app.get(&query).await;
        assert_eq!(response.status(), 400, "{query}");
        let body: serde_json::Value = response.json().await.unwrap();
        let error = body["error"].as_str().unwrap();
        assert!(
            error.starts_with("at: ") && !error.starts_with("at: at"),
            "{query}: {body}"
        );
    }
    assert_eq!(app.rankings().engine().read().cached_cost(), 0);
    let next_hour = hour_key(now + 3_600_000);
    for query in [
        format!(
            "/v1/categories/all/top?period=daily&at={}",
            day_key(now + 86_400_000)
        ),
        format!("/v1/categories/all/top?window=1h&at={next_hour}"),
    ] {
        assert_eq!(app.get(&query).await.status(), 200, "{query}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_with_a_plus_sign_or_a_repeated_parameter_gets_400_naming_it() {
    let app = spawn_app().await;
    for (query, parameter) in [
        ("/v1/categories/all/top?limit=%2B5", "limit"),
        ("/v1/categories/all/top?limit=+5", "limit"),
        ("/v1/categories/all/top?offset=%205", "offset"),
        ("/v1/categories/all/top?limit=5&limit=6", "limit"),
        ("/v1/products/p1/rank?category=a&category=b", "category"),
    ] {
        let response = app.get(query).await;
        assert_eq!(response.status(), 400, "{query}");
        let body: serde_json::Value = response.json().await.unwrap();
        let error = body["error"].as_str().unwrap();
        assert!(error.starts_with(&format!("{parameter}: ")), "{query}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_and_periods_follow_event_time_and_late_events_land_in_their_bucket() {
    let app = spawn_app().await;
    let now = now_millis();
    app.post_events_ok(&json!([
        view("a", "p1", now, &[]),
        view("b", "p1", now - 30 * HOUR, &[])
    ]))
    .await;
    let one_day = app.get_json("/v1/categories/all/top?window=1d").await;
    assert_eq!(one_day["items"][0]["metrics"]["views"], 1);
    let week = app.get_json("/v1/categories/all/top?window=7d").await;
    assert_eq!(week["items"][0]["metrics"]["views"], 2);
    // A late event 10 hours back is counted in its own hour, and the cached 7d window updates in place.
    app.post_events_ok(&json!([view("c", "p1", now - 10 * HOUR, &[])]))
        .await;
    let week = app.get_json("/v1/categories/all/top?window=7d").await;
    assert_eq!(week["items"][0]["metrics"]["views"], 3);
    let hour = app
        .get_json(&format!(
            "/v1/categories/all/top?period=hourly&at={}",
            hour_key(now - 10 * HOUR)
        ))
        .await;
    assert_eq!(hour["items"][0]["metrics"]["views"], 1);
    // The window ending 20 hours ago holds only the 30-hours-old view... and the 10-hours-old one is after it.
    let earlier = app
        .get_json(&format!(
            "/v1/categories/all/top?window=1d&at={}",
            hour_key(now - 20 * HOUR)
        ))
        .await;
    assert_eq!(earlier["items"][0]["metrics"]["views"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yesterdays_top_products_carry_into_today_and_late_events_move_the_carry() {
    let app = spawn_app().await;
    let now = now_millis();
    let yesterday = now - 24 * HOUR;
    app.post_events_ok(&json!([
        view("y1", "p1", yesterday, &[]),
        view("y2", "p1", yesterday, &[]),
        view("t1", "p2", now, &[])
    ]))
    .await;
    let today = app
        .get_json(&format!(
            "/v1/categories/all/top?period=daily&at={}",
            day_key(now)
        ))
        .await;
    let p1 = today["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["productId"] == "p1")
        .unwrap()
        .clone();
    let expected_carry = 0.1 * (0.0 + 2.0 * 0.1);
    assert_eq!(p1["carry"].as_f64().unwrap(), expected_carry);
    assert_eq!(
        p1["score"].as_f64().unwrap(),
        expected_carry,
        "carry alone lists p1 today"
    );
    // A late view for yesterday changes today's carry.
    app.post_events_ok(&json!([view("y3", "p1", yesterday, &[])]))
        .await;
    let today = app
        .get_json(&format!("/v1/products/p1/rank?period=daily&at={}", day_key(now)))
        .await;
    assert_eq!(today["carry"].as_f64().unwrap(), 0.1 * (0.0 + 3.0 * 0.1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalogue_entries_decorate_items_and_unknown_products_still_rank() {
    let app = spawn_app().await;
    let now = now_millis();
    app.post_events_ok(&json!([
        sale("s1", "p1", now, 1, 10, &[]),
        sale("s2", "p2", now, 2, 10, &[])
    ]))
    .await;
    let put = app
        .client
        .put(format!("{}/v1/products/p1", app.address))
        .json(&json!({ "name": "Robot", "brand": "Acme", "price": 1999, "image": "https://img/1.png" }))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let bad = app
        .client
        .put(format!("{}/v1/products/p1", app.address))
        .json(&json!({ "price": -1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let top = app
        .get_json("/v1/categories/all/top?ranker=units&period=daily")
        .await;
    assert_eq!(top["items"][0]["productId"], "p2");
    assert!(top["items"][0].get("product").is_none());
    assert_eq!(top["items"][1]["product"]["name"], "Robot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_rebuilds_serving_state_and_answers_exactly_as_before() {
    let app = spawn_app().await;
    let now = now_millis();
    let events: Vec<_> = (0..300)
        .map(|i| {
            let product = format!("p{}", i % 17);
            let category = format!("c{}", i % 3);
            if i % 4 == 0 {
                sale(
                    &format!("e{i}"),
                    &product,
                    now - (i % 50) * HOUR,
                    1 + (i % 3) as u32,
                    100 + i as u64,
                    &[&category],
                )
            } else {
                view(&format!("e{i}"), &product, now - (i % 50) * HOUR, &[&category])
            }
        })
        .collect();
    app.post_events_ok(&json!(events)).await;
    let queries = [
        "/v1/categories/all/top?limit=50".to_string(),
        "/v1/categories/c1/top?window=7d&ranker=units".to_string(),
        format!(
            "/v1/categories/c2/top?period=daily&at={}",
            day_key(now - 24 * HOUR)
        ),
        "/v1/categories/all/top?period=monthly&ranker=revenue".to_string(),
        "/v1/products/p3/rank?category=c0&window=30d".to_string(),
    ];
    let mut before = Vec::new();
    for query in &queries {
        before.push(app.get_json(query).await);
    }
    let data_dir = app.data_dir.clone();
    let dir = app.stop().await;
    let restarted = spawn_app_in(data_dir, |_| {}).await;
    for (query, expected) in queries.iter().zip(before) {
        let answer = restarted.get_json(query).await;
        assert_eq!(answer, expected, "{query}");
    }
    // And what the live server serves equals the batch recompute of the raw log.
    let config = rankgate::config::Config::for_data_dir(&restarted.data_dir);
    let report = rankgate::rankings::verify::verify_server(
        &config.rankings,
        &config.rankings_storage(),
        &restarted.address,
        &indicatif::ProgressBar::hidden(),
    )
    .await
    .unwrap();
    assert!(report.rankings > 100 && report.items > 0, "{report:?}");
    assert!(report.ok(), "{:?}", report.mismatches);
    restarted.stop().await;
    drop(dir);
}

/// The edge answers a plain `GET …/rank` without the router (issue 10); the router still serves every
/// other form of the request. Both must give the same answer: same status, headers and bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rank_reads_answer_the_same_through_the_edge_and_through_the_router() {
    let app = spawn_app().await;
    let now = now_millis();
    app.post_events_ok(&json!([
        sale("s1", "p2", now, 3, 100, &["toys"]),
        sale("s2", "p1", now, 5, 100, &["toys"]),
    ]))
    .await;
    async fn answer(app: &TestApp, path: &str) -> (u16, Vec<(String, String)>, String) {
        let response = app.get(path).await;
        let status = response.status().as_u16();
        let mut headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter(|(name, _)| *name != "date")
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_string()))
            .collect();
        headers.sort();
        (status, headers, response.text().await.unwrap())
    }
    // `%70%32` is `p2` percent-encoded: the router decodes it; the edge leaves escapes to the router.
    for (query, status) in [
        ("?category=toys&window=7d&ranker=units", 200),
        ("", 200),
        ("?window=8d", 400),
        ("?category=toys&category=toys", 400),
    ] {
        let direct = answer(&app, &format!("/v1/products/p2/rank{query}")).await;
        let routed = answer(&app, &format!("/v1/products/%70%32/rank{query}")).await;
        assert_eq!(direct.0, status, "{query}: {}", direct.2);
        assert_eq!(direct, routed, "{query}");
        assert!(
            direct
                .1
                .contains(&("content-type".into(), "application/json".into())),
            "{query}: {:?}",
            direct.1
        );
    }
    let rank: serde_json::Value = serde_json::from_str(
        &answer(&app, "/v1/products/p2/rank?category=toys&window=7d&ranker=units")
            .await
            .2,
    )
    .unwrap();
    assert_eq!(
        (rank["productId"].as_str(), rank["rank"].as_u64()),
        (Some("p2"), Some(2))
    );
    assert_eq!(
        rank["metrics"],
        json!({ "likes": 0, "sales": 300, "units": 3, "views": 0 })
    );

    // Everything else on that path is the router's, answered as before.
    let client = reqwest::Client::new();
    let head = client
        .head(format!("{}/v1/products/p2/rank", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 200, "HEAD is answered by the GET route");
    let post = client
        .post(format!("{}/v1/products/p2/rank", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 405);
    let body: serde_json::Value = post.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().starts_with("method: POST"),
        "{body}"
    );
    let empty = answer(&app, "/v1/products//rank").await;
    assert_eq!(empty.0, 400, "an empty segment: the router's path");
    assert!(empty.2.contains("productId"), "{}", empty.2);
    for path in ["/v1/products/p2/rank/", "/v1/products/p2/x/rank"] {
        let (status, _, body) = answer(&app, path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body.contains("no route for GET"), "{path}: {body}");
    }
    let bad = answer(&app, "/v1/products/p%0A2/rank").await;
    assert_eq!(bad.0, 400, "a control character, escaped: the router's path");
    assert!(bad.2.contains("productId"), "{}", bad.2);
}
