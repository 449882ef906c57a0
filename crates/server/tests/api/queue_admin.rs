//! Queue operations for admins (issue 12): list queues with their counts, remove one member, on the
//! embedded store and on Redis (standalone and Cluster). Deleting a queue is covered with the rest of
//! SPEC 2.1 (tests/waiting_room.rs, waiting_room_redis.rs).

use serde_json::{json, Value};

use crate::helpers::*;
use crate::redis_servers;

async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// `queue` differs per test: the metrics recorder is one per test process.
async fn admins_list_counts_and_remove_members(app: &TestApp, queue: &str) {
    let base = &app.address;
    let client = &app.client;
    let (status, _) = send(
        client
            .put(format!("{base}/v1/admin/queues/{queue}"))
            .json(&json!({ "paused": true })),
    )
    .await;
    assert_eq!(status, 200);
    for member in ["m-1", "m-2", "m-3"] {
        let (status, _) = send(
            client
                .post(format!("{base}/v1/queues/{queue}/entries"))
                .json(&json!({ "memberId": member })),
        )
        .await;
        assert_eq!(status, 200);
    }
    let listed = app.get_json("/v1/admin/queues").await;
    assert_eq!(listed["queues"], json!([queue]));
    assert_eq!(
        listed["counts"][queue],
        json!({ "waiting": 3, "ready": 0, "claimed": 0, "admittedLastMinute": 0, "abandoned": 0,
                "oldestWaitSeconds": listed["counts"][queue]["oldestWaitSeconds"], "paused": true })
    );

    // A waiting member is removed: the one behind moves up; a second removal is a 404.
    let remove = |member: &str| client.delete(format!("{base}/v1/admin/queues/{queue}/members/{member}"));
    assert_eq!(send(remove("m-2")).await.0, 204);
    assert_eq!(
        app.get_json(&format!("/v1/queues/{queue}/entries/m-2")).await["status"],
        "NOT_ENTERED"
    );
    assert_eq!(
        app.get_json(&format!("/v1/queues/{queue}/entries/m-3")).await["rank"],
        1
    );
    let (status, body) = send(remove("m-2")).await;
    assert_eq!(status, 404);
    assert!(body["error"].as_str().unwrap().starts_with("memberId"), "{body}");
    assert_eq!(
        app.get_json("/v1/admin/queues").await["counts"][queue]["waiting"],
        2
    );

    // A READY member is removed (its token void, its slot freed); one with an order in flight is not.
    let (status, _) = send(
        client
            .put(format!("{base}/v1/admin/queues/{queue}"))
            .json(&json!({ "paused": false })),
    )
    .await;
    assert_eq!(status, 200);
    let first = app.position_when_ready(queue, "m-1").await;
    let third = app.position_when_ready(queue, "m-3").await;
    assert_eq!(
        app.get_json("/v1/admin/queues").await["counts"][queue]["ready"],
        2
    );
    assert_eq!(send(remove("m-1")).await.0, 204);
    let (status, _) = send(
        client
            .post(format!("{base}/v1/queues/{queue}/tokens/claim"))
            .header("x-queue-ticket", app.ticket(queue, "m-1"))
            .json(&json!({ "memberId": "m-1", "token": first["entryToken"] })),
    )
    .await;
    assert_eq!(status, 401, "a removed member's token is void");
    let (status, _) = send(
        client
            .post(format!("{base}/v1/queues/{queue}/tokens/claim"))
            .header("x-queue-ticket", app.ticket(queue, "m-3"))
            .json(&json!({ "memberId": "m-3", "token": third["entryToken"] })),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = send(remove("m-3")).await;
    assert_eq!(status, 409, "an order in flight: {body}");
    let counts = &app.get_json("/v1/admin/queues").await["counts"][queue];
    assert_eq!(
        (counts["ready"].as_u64(), counts["claimed"].as_u64()),
        (Some(0), Some(1))
    );

    // Hostile input names the field.
    let long = "x".repeat(129);
    let (status, body) = send(remove(&long)).await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().starts_with("memberId"), "{body}");
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with(&format!(
            "rankgate_queue_members_removed_total{{queue=\"{queue}\"}} 2"
        ))),
        "removals are counted in /metrics"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_list_queues_with_counts_and_remove_members_on_embedded() {
    let app = spawn_app().await;
    admins_list_counts_and_remove_members(&app, "ops-embedded").await;
    app.stop().await;
}

async fn on_redis(redis: Vec<String>, queue: &str) {
    let prefix = redis_servers::unique_prefix();
    let _keys = redis_servers::KeyCleanup {
        nodes: redis.clone(),
        prefix: prefix.clone(),
    };
    let app = spawn_app_with(move |config| {
        config.redis = redis;
        config.redis_prefix = prefix;
        config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
    })
    .await;
    admins_list_counts_and_remove_members(&app, queue).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_list_queues_with_counts_and_remove_members_on_redis_standalone() {
    on_redis(vec![redis_servers::standalone_url()], "ops-standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_list_queues_with_counts_and_remove_members_on_redis_cluster() {
    on_redis(redis_servers::cluster().urls.clone(), "ops-cluster").await;
}
