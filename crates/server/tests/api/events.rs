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
        config.max_batch = 3;
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
    let app = spawn_app_with(|config| config.max_lateness_millis = 2 * 3_600_000).await;
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
