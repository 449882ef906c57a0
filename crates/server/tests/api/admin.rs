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

/// This machine's address on its first non-loopback interface: the one a packet to a public address
/// would leave from (a UDP `connect` sends nothing).
fn non_loopback_address() -> std::net::IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
    socket
        .connect("192.0.2.200:9")
        .expect("a route off this host: the test needs a non-loopback interface");
    let address = socket.local_addr().expect("the local address").ip();
    assert!(!address.is_loopback(), "{address} is loopback");
    address
}

/// Issue 29, item 7: with no admin key, admin endpoints answer loopback peers only (403 JSON naming the
/// setting otherwise), on both products' admin routes; with a key, the key decides from anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_admin_keys_admin_answers_loopback_clients_only() {
    let app = spawn_app_with(|config| config.listen = "0.0.0.0:0".parse().unwrap()).await;
    let port = app.address.rsplit(':').next().unwrap().to_owned();
    let remote = format!("http://{}:{port}", non_loopback_address());
    let client = reqwest::Client::new();
    for path in ["/v1/admin/rankers/popular", "/v1/admin/queues", "/v1/products/p1"] {
        let refused = client.get(format!("{remote}{path}")).send().await.unwrap();
        assert_eq!(refused.status(), 403, "{path} from a non-loopback peer");
        let body: Value = refused.json().await.unwrap();
        let message = body["error"].as_str().unwrap();
        assert!(
            message.contains("admin_keys") && message.contains("loopback"),
            "{message}"
        );
        let local = client
            .get(format!("http://127.0.0.1:{port}{path}"))
            .send()
            .await
            .unwrap();
        assert_ne!(local.status(), 403, "{path} from loopback");
        assert_ne!(local.status(), 401, "{path} from loopback");
    }
    let put = client
        .put(format!("{remote}/v1/admin/queues/sale"))
        .json(&json!({ "paused": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 403);
    assert_eq!(
        app.get("/v1/admin/queues/sale").await.status(),
        404,
        "the refused PUT created nothing"
    );
    // Public and ingest routes stay open to everyone.
    let top = client
        .get(format!("{remote}/v1/categories/all/top"))
        .send()
        .await
        .unwrap();
    assert_eq!(top.status(), 200);

    let keyed = spawn_app_with(|config| {
        config.listen = "0.0.0.0:0".parse().unwrap();
        config.admin_keys = rankgate::http::auth::BearerKeys::from_plain(&["k-admin"]);
    })
    .await;
    let port = keyed.address.rsplit(':').next().unwrap().to_owned();
    for base in [
        format!("http://{}:{port}", non_loopback_address()),
        format!("http://127.0.0.1:{port}"),
    ] {
        let url = format!("{base}/v1/admin/queues");
        assert_eq!(
            client.get(&url).send().await.unwrap().status(),
            401,
            "{url} without the key"
        );
        let with_key = client.get(&url).bearer_auth("k-admin").send().await.unwrap();
        assert_eq!(with_key.status(), 200, "{url} with the key");
    }
}
