//! Adaptive admission through the whole service (issue 12): the real workers (admission, the control
//! round, gauges) on the real clock. An order through the gate is measured, and its interval reaches the
//! admin view and `/metrics`. The controller's arithmetic is covered on a manual clock in
//! `tests/adaptive_admission.rs`; this checks the wiring, with generous waits.

use std::time::Duration;

use rankgate::waiting_room::{GateConfig, GateRoute};
use serde_json::{json, Value};

use crate::helpers::*;

async fn spawn_upstream() -> String {
    let router = axum::Router::new().route(
        "/orders",
        axum::routing::post(|| async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            (axum::http::StatusCode::CREATED, "ok")
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{address}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_order_reaches_the_admin_view_and_metrics_of_an_adaptive_queue() {
    let upstream = spawn_upstream().await;
    let app = spawn_app_with(move |config| {
        config.waiting_room.poll_burst = 1_000;
        config.waiting_room.adaptive_min_samples = 1;
        config.waiting_room.gates = vec![GateConfig {
            queue: "sale".into(),
            upstream,
            routes: vec![GateRoute {
                method: "POST".into(),
                path: "/orders".into(),
                prefix: false,
            }],
            timeout_millis: 5_000,
            max_body_bytes: 65_536,
        }];
    })
    .await;
    let settings = format!("{}/v1/admin/queues/sale", app.address);
    let put = app
        .client
        .put(&settings)
        .json(
            &json!({"admissionMode": "adaptive", "minAdmitPerSecond": 2, "maxAdmitPerSecond": 42,
            "admitPerSecond": 10, "targetP95Millis": 1000}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let entered = app
        .client
        .post(format!("{}/v1/queues/sale/entries", app.address))
        .json(&json!({"memberId": "m-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(entered.status(), 200);
    let ready = read_until(&app, "/v1/queues/sale/entries/m-1", "READY", |p| {
        p["status"] == "READY"
    })
    .await;
    let ordered = app
        .client
        .post(format!("{}/orders", app.address))
        .header("x-member-id", "m-1")
        .header("x-queue-ticket", app.ticket("sale", "m-1"))
        .header("x-entry-token", ready["entryToken"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(ordered.status(), 201);
    // Within a few control intervals the order's interval closes: one sample, healthy, so the rate rises
    // by (42 − 2) / 20 = 2.
    let view = read_until(
        &app,
        "/v1/admin/queues/sale",
        "the interval with the order",
        |v: &Value| v["upstreamSamples"] == 1,
    )
    .await;
    assert_eq!(view["admissionMode"], "adaptive");
    assert_eq!(view["adaptiveDecision"], "increase", "{view}");
    assert_eq!(view["effectiveAdmitPerSecond"], 12.0, "{view}");
    assert_eq!(view["upstreamErrorRate"], 0.0, "{view}");
    assert!(view["upstreamP95Millis"].as_f64().unwrap() >= 30.0, "{view}");
    let mut metrics = String::new();
    for _ in 0..50 {
        metrics = app.get("/metrics").await.text().await.unwrap();
        if metrics.contains("rankgate_gate_upstream_p95_seconds{queue=\"sale\"}") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for gauge in [
        "rankgate_queue_effective_admit_per_second{queue=\"sale\"}",
        "rankgate_gate_upstream_p95_seconds{queue=\"sale\"}",
        "rankgate_gate_upstream_error_rate{queue=\"sale\"}",
        "rankgate_gate_upstream_samples{queue=\"sale\"}",
    ] {
        assert!(metrics.contains(gauge), "{gauge} in /metrics");
    }
}
