//! Operations endpoints.

use serde_json::json;

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_ready_metrics_openapi_and_dashboard_answer() {
    let app = spawn_app().await;
    assert_eq!(app.get_json("/healthz").await["status"], "ok");
    assert_eq!(app.get_json("/readyz").await["status"], "ready");
    app.post_events_ok(&json!([
        view("m1", "p1", now_millis(), &[]),
        view("m1", "p1", now_millis(), &[])
    ]))
    .await;
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("rankgate_events_accepted_total"), "{metrics}");
    assert!(metrics.contains("rankgate_events_duplicate_total"), "{metrics}");
    assert!(metrics.contains("rankgate_freshness_lag_seconds"), "{metrics}");
    assert!(metrics.contains("rankgate_ingest_commit_seconds"), "{metrics}");
    let openapi = app.get_json("/openapi.json").await;
    assert_eq!(openapi["openapi"], "3.1.0");
    for path in [
        "/v1/events",
        "/v1/categories/{category}/top",
        "/v1/products/{productId}/rank",
        "/v1/queues/{queue}/entries",
    ] {
        assert!(openapi["paths"].get(path).is_some(), "{path} is documented");
    }
    let dashboard = app.get("/dashboard").await.text().await.unwrap();
    assert!(dashboard.contains("<canvas"));
}
