//! `POST /v1/events`: formats, partial acceptance, idempotency, lateness and every status code.

use serde_json::json;

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_array_is_accepted_and_counted_once() {
    let app = spawn_app().await;
    let now = now_millis();
    let batch = json!([
        view("e1", "p1", now, &["toys"]),
        sale("e2", "p1", now, 2, 500, &["toys"])
    ]);
    let body = app.post_events_ok(&batch).await;
    assert_eq!(
        body,
        json!({ "accepted": 2, "duplicates": 0, "tooOld": 0, "rejected": [] })
    );
    let again = app.post_events_ok(&batch).await;
    assert_eq!(again["accepted"], 0);
    assert_eq!(again["duplicates"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_object_and_ndjson_are_accepted() {
    let app = spawn_app().await;
    let now = now_millis();
    let single = app.post_events_ok(&view("s1", "p1", now, &[])).await;
    assert_eq!(single["accepted"], 1);
    let ndjson = format!(
        "{}\n\n{}\nnot json\n",
        view("n1", "p2", now, &[]),
        json!({"id": "n2", "type": "product_liked", "ts": jiff::Timestamp::from_millisecond(now).unwrap().to_string(), "product_id": "p2"})
    );
    let response = app
        .client
        .post(format!("{}/v1/events", app.address))
        .header("content-type", "application/x-ndjson")
        .body(ndjson)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["accepted"], 2);
    assert_eq!(body["rejected"][0]["index"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_events_are_rejected_by_field_and_the_rest_of_the_batch_lands() {
    let app = spawn_app().await;
    let now = now_millis();
    let batch = json!([
        view("good-1", "p1", now, &["toys"]),
        { "id": "bad-qty", "type": "payment_succeeded", "ts": now, "product_id": "p1", "quantity": 0, "price": 10 },
        { "id": "bad-price", "type": "payment_succeeded", "ts": now, "product_id": "p1", "quantity": 1, "price": 1.5 },
        { "id": "bad-type", "type": "product_sniffed", "ts": now, "product_id": "p1" },
        { "id": "bad-cat", "type": "product_viewed", "ts": now, "product_id": "p1", "categories": ["all"] },
        { "id": "future", "type": "product_viewed", "ts": now + 3_600_000, "product_id": "p1" },
        { "type": "product_viewed", "ts": now, "product_id": "p1" },
        { "id": "qty-on-view", "type": "product_viewed", "ts": now, "product_id": "p1", "quantity": 1 },
        view("good-2", "p2", now, &[]),
    ]);
    let body = app.post_events_ok(&batch).await;
    assert_eq!(body["accepted"], 2);
    let rejected = body["rejected"].as_array().unwrap();
    let fields: Vec<(u64, String)> = rejected
        .iter()
        .map(|r| {
            (
                r["index"].as_u64().unwrap(),
                r["error"]
                    .as_str()
                    .unwrap()
                    .split(':')
                    .next()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        vec![
            (1, "quantity".into()),
            (2, "price".into()),
            (3, "type".into()),
            (4, "categories".into()),
            (5, "ts".into()),
            (6, "id".into()),
            (7, "quantity".into()),
        ]
    );
    assert_eq!(rejected[0]["id"], "bad-qty");
    let top = app.get_json("/v1/categories/all/top?period=daily").await;
    assert_eq!(top["total"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_codes_400_413_415() {
    let app = spawn_app_with(|config| {
        config.rankings.max_batch = 3;
        config.max_body_bytes = 64 * 1024;
    })
    .await;
    let url = format!("{}/v1/events", app.address);
    let unparseable = app
        .client
        .post(&url)
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .unwrap();
    assert_eq!(unparseable.status(), 400);
    let wrong_type = app
        .client
        .post(&url)
        .header("content-type", "text/plain")
        .body("[]")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_type.status(), 415);
    let now = now_millis();
    let four: Vec<_> = (0..4).map(|i| view(&format!("x{i}"), "p", now, &[])).collect();
    assert_eq!(app.post_events(&json!(four)).await.status(), 413);
    let huge = "x".repeat(100 * 1024);
    let too_big = app
        .client
        .post(&url)
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(too_big.status(), 413);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_older_than_max_lateness_behind_the_watermark_are_dropped_and_counted() {
    let app = spawn_app_with(|config| config.rankings.max_lateness_millis = 2 * 3_600_000).await;
    let now = now_millis();
    app.post_events_ok(&json!([view("new", "p1", now, &[])])).await;
    let body = app
        .post_events_ok(&json!([
            view("late-ok", "p1", now - 3_600_000, &[]),
            view("too-old", "p1", now - 3 * 3_600_000, &[])
        ]))
        .await;
    assert_eq!(body["accepted"], 1);
    assert_eq!(body["tooOld"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_requires_a_key_when_keys_are_configured() {
    let app = spawn_app_with(|config| with_keys(config, &["admin-key"], &["ingest-key"])).await;
    let batch = json!([view("k1", "p1", now_millis(), &[])]);
    assert_eq!(app.post_events(&batch).await.status(), 401);
    let wrong = app
        .client
        .post(format!("{}/v1/events", app.address))
        .bearer_auth("nope")
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let right = app
        .client
        .post(format!("{}/v1/events", app.address))
        .bearer_auth("ingest-key")
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), 200);
    // Reads stay public.
    assert_eq!(app.get("/v1/categories/all/top").await.status(), 200);
}

// ---- issue 9: hostile input over HTTP, and a restart after it ----

async fn post_raw(
    app: &TestApp,
    content_type: &str,
    encoding: Option<&str>,
    body: Vec<u8>,
) -> reqwest::Response {
    let mut request = app
        .client
        .post(format!("{}/v1/events", app.address))
        .header("content-type", content_type);
    if let Some(encoding) = encoding {
        request = request.header("content-encoding", encoding);
    }
    request.body(body).send().await.unwrap()
}

fn rejected_errors(body: &serde_json::Value) -> Vec<(u64, String)> {
    body["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["index"].as_u64().unwrap(),
                r["error"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_batch_rejects_each_bad_event_by_field_and_a_restart_answers_the_same() {
    let app = spawn_app().await;
    let now = now_millis();
    let good = |id: &str| view(id, "p1", now, &["toys"]).to_string();
    // One body, every kind of bad event next to good ones: ids with control characters (defect 1), a NaN
    // and an Infinity (12), a key given twice (11), seconds for milliseconds (10), a huge price (14).
    let body = format!(
        r#"[{a}, {{"id":"a\nb","type":"product_viewed","ts":{now},"product_id":"p1"}},
            {{"id":"x\n","type":"product_viewed","ts":{now},"product_id":"p1"}},
            {{"id":"nan","type":"payment_succeeded","ts":{now},"product_id":"p1","quantity":1,"price":NaN}},
            {q}, Infinity,
            {{"id":"twice","type":"product_viewed","type":"product_liked","ts":{now},"product_id":"p1"}},
            {{"id":"seconds","type":"product_viewed","ts":{seconds},"product_id":"p1"}},
            {{"id":"huge","type":"payment_succeeded","ts":{now},"product_id":"p1","quantity":1,
              "price":100000000000000000000}},
            {long}]"#,
        a = good("a"),
        q = good("quote\"d\\"),
        long = good(&"é".repeat(64)),
        seconds = now / 1000,
    );
    let response = post_raw(&app, "application/json", None, body.clone().into_bytes()).await;
    assert_eq!(response.status(), 200);
    let answer: serde_json::Value = response.json().await.unwrap();
    assert_eq!(answer["accepted"], 3, "{answer}");
    let errors = rejected_errors(&answer);
    let fields: Vec<(u64, &str)> = errors
        .iter()
        .map(|(index, error)| (*index, error.split(':').next().unwrap()))
        .collect();
    assert_eq!(
        fields,
        [
            (1, "id"),
            (2, "id"),
            (3, "price"),
            (5, "event"),
            (6, "type"),
            (7, "ts"),
            (8, "price")
        ]
    );
    assert!(errors[5].1.contains("looks like epoch seconds"), "{errors:?}");
    assert!(errors[6].1.ends_with("this one is out of range"), "{errors:?}");

    let ranking = format!("/v1/categories/toys/top?period=daily&at={}", day_key(now));
    let before = app.get_json(&ranking).await;
    assert_eq!(before["total"], 1);
    assert_eq!(before["items"][0]["metrics"]["views"], 3);

    // Restart on the same data dir: it starts, answers the same, and counts nothing twice.
    let data_dir = app.data_dir.clone();
    let _dir = app.stop().await;
    let app = spawn_app_in(data_dir, |_| {}).await;
    let after = app.get_json(&ranking).await;
    assert_eq!(after["items"], before["items"]);
    assert_eq!(after["total"], before["total"]);
    let again: serde_json::Value = post_raw(&app, "application/json", None, body.into_bytes())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (again["accepted"].as_u64(), again["duplicates"].as_u64()),
        (Some(0), Some(3)),
        "{again}"
    );
    // The old newline split made an unrelated `x` a duplicate of `"x\n"`; it is new.
    let fresh = app
        .post_events_ok(&serde_json::json!([view("x", "p1", now, &["toys"])]))
        .await;
    assert_eq!(fresh["accepted"], 1);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_body_is_accepted_other_encodings_get_415_and_a_zip_bomb_gets_413() {
    use std::io::Write;
    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }
    let app = spawn_app_with(|config| config.max_body_bytes = 1 << 20).await;
    let now = now_millis();
    let batch = serde_json::json!([view("g1", "p1", now, &[]), view("g2", "p1", now, &[])]).to_string();
    let response = post_raw(&app, "application/json", Some("gzip"), gzip(batch.as_bytes())).await;
    assert_eq!(response.status(), 200);
    let answer: serde_json::Value = response.json().await.unwrap();
    assert_eq!(answer["accepted"], 2, "{answer}");
    let ndjson = format!("{}\n{}\n", view("g3", "p1", now, &[]), view("g4", "p1", now, &[]));
    let response = post_raw(
        &app,
        "application/x-ndjson",
        Some("gzip"),
        gzip(ndjson.as_bytes()),
    )
    .await;
    assert_eq!(response.json::<serde_json::Value>().await.unwrap()["accepted"], 2);

    let response = post_raw(&app, "application/json", Some("br"), batch.clone().into_bytes()).await;
    assert_eq!(response.status(), 415);
    let error: serde_json::Value = response.json().await.unwrap();
    assert!(
        error["error"].as_str().unwrap().contains("content-encoding `br`"),
        "{error}"
    );

    let response = post_raw(&app, "application/json", Some("gzip"), batch.into_bytes()).await;
    assert_eq!(response.status(), 400, "a body that says gzip and is not");

    // 64 MiB of spaces gzip to ~64 KiB: inflating stops at the 1 MiB limit.
    let bomb = gzip(&vec![b' '; 64 << 20]);
    assert!(bomb.len() < 1 << 20);
    let response = post_raw(&app, "application/json", Some("gzip"), bomb).await;
    assert_eq!(response.status(), 413);
    let error: serde_json::Value = response.json().await.unwrap();
    assert!(
        error["error"].as_str().unwrap().contains("inflates to more than"),
        "{error}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_batch_or_an_unreadable_body_is_refused_as_a_whole() {
    let app = spawn_app_with(|config| config.rankings.max_batch = 3).await;
    let now = now_millis();
    let four: Vec<_> = (0..4).map(|i| view(&format!("o{i}"), "p1", now, &[])).collect();
    let response = app.post_events(&serde_json::Value::Array(four)).await;
    assert_eq!(response.status(), 413);
    for body in [&b""[..], b"\"events\"", b"[{\"id\":\"a\"}", b"[{]"] {
        let response = post_raw(&app, "application/json", None, body.to_vec()).await;
        assert_eq!(response.status(), 400, "{body:?}");
        let error: serde_json::Value = response.json().await.unwrap();
        assert!(error["error"].as_str().unwrap().starts_with("body: "), "{error}");
    }
    app.stop().await;
}
