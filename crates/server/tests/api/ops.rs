//! Operations endpoints.

use std::collections::BTreeSet;

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
    let dashboard = app.get("/dashboard").await.text().await.unwrap();
    assert!(dashboard.contains("id=\"queue-charts\""));
}

/// A path with its parameter names erased: the router says `{product_id}`, the document `{productId}`,
/// and both mean one segment.
fn path_shape(path: &str) -> String {
    path.split('/')
        .map(|segment| if segment.starts_with('{') { "{}" } else { segment })
        .collect::<Vec<_>>()
        .join("/")
}

/// The route table the router is built from against the served `/openapi.json`, both ways: a route
/// cannot be added without documenting it, nor a documented one removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_routed_method_and_path_is_documented_and_nothing_else_is() {
    let app = spawn_app().await;
    let openapi = app.get_json("/openapi.json").await;
    let documented: BTreeSet<(String, String)> = openapi["paths"]
        .as_object()
        .expect("paths is an object")
        .iter()
        .flat_map(|(path, operations)| {
            operations
                .as_object()
                .expect("a path item is an object")
                .keys()
                .filter(|key| !matches!(key.as_str(), "parameters" | "summary" | "description" | "servers"))
                .map(move |method| (method.to_uppercase(), path_shape(path)))
        })
        .collect();
    let routed: BTreeSet<(String, String)> = rankgate::app::endpoints()
        .into_iter()
        .map(|(method, path)| (method.to_string(), path_shape(path)))
        .collect();
    assert_eq!(
        routed.len(),
        rankgate::app::endpoints().len(),
        "one route per (method, path)"
    );
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        undocumented.is_empty(),
        "routed but not in openapi.json: {undocumented:?}"
    );
    assert!(
        unrouted.is_empty(),
        "in openapi.json but not routed: {unrouted:?}"
    );
    assert!(routed.contains(&("GET".to_string(), "/v1/admin/queues".to_string())));
}
