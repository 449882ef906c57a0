//! Ranker policy versions: change, atomic switch, rollback, and admin auth.

use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;

async fn wait_for_version(app: &TestApp, version: u64) -> Value {
    // Bounded generously: a busy CI machine may take seconds to schedule the background build.
    for _ in 0..1000 {
        let state = app.get_json("/v1/admin/rankers/popular").await;
        if state["activeVersion"] == version && state["building"].is_null() {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("version {version} never became active");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_change_builds_a_new_version_switches_and_rolls_back() {
    let app = spawn_app().await;
    let now = now_millis();
    app.post_events_ok(&json!([
        view("v1", "viewed", now, &[]),
        view("v2", "viewed", now, &[]),
        sale("s1", "sold", now, 1, 100, &[]),
    ]))
    .await;
    let initial = app.get_json("/v1/admin/rankers/popular").await;
    assert_eq!(initial["activeVersion"], 1);
    assert_eq!(
        initial["weights"],
        json!({ "view": 0.1, "like": 0.2, "sales": 0.7 })
    );
    assert_eq!(initial["carryTopN"], 100);
    let before = app.get_json("/v1/categories/all/top").await;
    assert_eq!(before["policyVersion"], 1);
    assert_eq!(before["items"][0]["productId"], "sold");

    let response = app
        .client
        .put(format!("{}/v1/admin/rankers/popular", app.address))
        .json(&json!({ "weights": { "view": 10.0, "like": 0.2, "sales": 0.1 }, "carryRatio": 0.1, "carryTopN": 100 }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body,
        json!({ "ranker": "popular", "policyVersion": 2, "status": "building" })
    );
    let state = wait_for_version(&app, 2).await;
    assert_eq!(state["previousVersion"], 1);
    let after = app.get_json("/v1/categories/all/top").await;
    assert_eq!(after["policyVersion"], 2);
    assert_eq!(after["items"][0]["productId"], "viewed");
    assert_eq!(after["items"][0]["score"], 20.0);

    let rollback = app
        .client
        .post(format!("{}/v1/admin/rankers/popular/rollback", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(rollback.status(), 200);
    let rolled: Value = rollback.json().await.unwrap();
    assert_eq!(rolled["activeVersion"], 1);
    let back = app.get_json("/v1/categories/all/top").await;
    assert_eq!(back["policyVersion"], 1);
    assert_eq!(back["items"][0]["productId"], "sold");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_weights_get_400_naming_the_field_and_unknown_rankers_404() {
    let app = spawn_app().await;
    let url = format!("{}/v1/admin/rankers/popular", app.address);
    let bad = app
        .client
        .put(&url)
        .json(&json!({ "carryRatio": 2.0 }))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().starts_with("carryRatio"),
        "{body}"
    );
    let typo = app
        .client
        .put(&url)
        .json(&json!({ "wieghts": {} }))
        .send()
        .await
        .unwrap();
    assert_eq!(typo.status(), 400);
    let units = app
        .client
        .put(format!("{}/v1/admin/rankers/units", app.address))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(units.status(), 400);
    assert_eq!(app.get("/v1/admin/rankers/nope").await.status(), 404);
    let no_previous = app.client.post(format!("{url}/rollback")).send().await.unwrap();
    assert_eq!(no_previous.status(), 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_or_huge_weights_get_400_naming_the_weight() {
    let app = spawn_app().await;
    let url = format!("{}/v1/admin/rankers/popular", app.address);
    for (body, field) in [
        (r#"{"weights":{"view":-0.1}}"#, "weights.view"),
        (r#"{"weights":{"like":1e300}}"#, "weights.like"),
        (r#"{"weights":{"sales":1e400}}"#, ""),
        (r#"{"carryTopN":1000000}"#, "carryTopN"),
    ] {
        let response = app
            .client
            .put(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.unwrap();
        assert!(
            error["error"].as_str().unwrap().starts_with(field),
            "{body}: {error}"
        );
    }
    assert_eq!(
        app.get_json("/v1/admin/rankers/popular").await["activeVersion"],
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_need_the_admin_key_when_configured() {
    let app = spawn_app_with(|config| with_keys(config, &["admin-secret"], &[])).await;
    let url = format!("{}/v1/admin/rankers/popular", app.address);
    assert_eq!(app.client.get(&url).send().await.unwrap().status(), 401);
    assert_eq!(
        app.client
            .get(&url)
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        app.client
            .get(&url)
            .bearer_auth("admin-secret")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let catalog = app
        .client
        .put(format!("{}/v1/products/p1", app.address))
        .json(&json!({ "name": "x" }))
        .send()
        .await
        .unwrap();
    assert_eq!(catalog.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_policy_survives_a_restart() {
    let app = spawn_app().await;
    app.client
        .put(format!("{}/v1/admin/rankers/popular", app.address))
        .json(&json!({ "weights": { "view": 2.0 } }))
        .send()
        .await
        .unwrap();
    wait_for_version(&app, 2).await;
    let data_dir = app.data_dir.clone();
    let dir = app.stop().await;
    let restarted = spawn_app_in(data_dir, |_| {}).await;
    let state = restarted.get_json("/v1/admin/rankers/popular").await;
    assert_eq!(state["activeVersion"], 2);
    assert_eq!(state["weights"]["view"], 2.0);
    restarted.stop().await;
    drop(dir);
}
