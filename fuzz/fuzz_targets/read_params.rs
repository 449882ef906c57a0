//! The read API's parameters (SPEC 1.5): a query string (and path segment) → `GET
//! /v1/categories/{category}/top` or `GET /v1/products/{productId}/rank`, sent through the real router of an
//! in-process rankgate on a temporary data dir, seeded with a few events.
//!
//! Going through the router keeps the target independent of how the handlers parse: it checks the HTTP
//! contract. Input: `<path segment>\n<query>` (no newline: the whole input is the query of a top read of
//! `all`); the first byte's low bit picks top or rank. Properties: never a 5xx; every answer is JSON; an
//! error is `{"error": "…"}`; a 200 echoes an `at` (and `period`/`window`) that, sent back as the only span
//! parameters, reads the same span.
#![no_main]

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use rankgate::app::direct::DirectRoutesOfApp;
use rankgate::app::{router, Application};
use rankgate::config::Config;
use rankgate::http::edge::Edge;
use serde_json::{json, Value};
use tower::ServiceExt;

struct Harness {
    runtime: tokio::runtime::Runtime,
    router: Edge<DirectRoutesOfApp>,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        // Kept for the whole process: the app's workers and data dir live as long as the fuzzer.
        let dir = Box::leak(Box::new(tempfile::tempdir().expect("a temp dir")));
        let app = runtime.block_on(async {
            let mut config = Config::for_data_dir(dir.path());
            config.rankings.max_cached_members = 100_000;
            Application::build(config).await.expect("the app builds")
        });
        let app = Box::leak(Box::new(app));
        let router = router(app.state().clone());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as i64;
        let events: Vec<Value> = (0..20)
            .map(|i| {
                json!({"id": format!("seed-{i}"), "type": if i % 3 == 0 { "payment_succeeded" } else { "product_viewed" },
                       "ts": now - i * 3_600_000, "product_id": format!("p{}", i % 7),
                       "categories": [format!("c{}", i % 3)], "quantity": 1, "price": 100 + i})
            })
            .map(|mut event| {
                if event["type"] == "product_viewed" {
                    let object = event.as_object_mut().expect("an object");
                    object.remove("quantity");
                    object.remove("price");
                }
                event
            })
            .collect();
        let request = Request::post("/v1/events")
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&events).expect("JSON")))
            .expect("a request");
        let (status, _) = runtime.block_on(send(&router, request));
        assert_eq!(status, StatusCode::OK, "seeding events");
        Harness { runtime, router }
    })
}

async fn send(router: &Edge<DirectRoutesOfApp>, request: Request<Body>) -> (StatusCode, Vec<u8>) {
    let response = router
        .clone()
        .oneshot(request)
        .await
        .expect("the router is infallible");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes()
        .to_vec();
    (status, body)
}

/// Percent-encodes what may not appear raw in a URI path segment.
fn path_segment(raw: &[u8]) -> String {
    raw.iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Keeps `%`, `&`, `=`, `+` and other visible ASCII raw (so bad escapes and odd pairs reach the parser);
/// encodes the rest.
fn query(raw: &[u8]) -> String {
    raw.iter()
        .map(|&b| {
            if b.is_ascii_graphic() && b != b'#' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn get(harness: &Harness, uri: &str) -> Option<(StatusCode, Value)> {
    let request = Request::get(uri).body(Body::empty()).ok()?;
    let (status, body) = harness.runtime.block_on(send(&harness.router, request));
    assert!(
        !status.is_server_error(),
        "GET {uri} → {status}: {}",
        String::from_utf8_lossy(&body)
    );
    let value: Value = serde_json::from_slice(&body).unwrap_or_else(|_| {
        panic!(
            "GET {uri} → {status} with a non-JSON body: {}",
            String::from_utf8_lossy(&body)
        )
    });
    if !status.is_success() {
        assert!(
            value["error"].is_string(),
            "GET {uri} → {status} without an error string: {value}"
        );
    }
    Some((status, value))
}

fuzz_target!(|data: &[u8]| {
    let harness = harness();
    let (segment, raw_query) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&b"all"[..], data),
    };
    let top = data.first().is_none_or(|b| b % 2 == 0);
    let path = if top {
        format!("/v1/categories/{}/top", path_segment(segment))
    } else {
        format!("/v1/products/{}/rank", path_segment(segment))
    };
    let uri = format!("{path}?{}", query(raw_query));
    let Some((status, body)) = get(harness, &uri) else {
        return;
    };
    if status != StatusCode::OK {
        return;
    }
    // The echoed span, sent back alone (with the same category, ranker and product), names the same span.
    let (name, value) = match (&body["period"], &body["window"]) {
        (Value::String(period), _) => ("period", period),
        (_, Value::String(window)) => ("window", window),
        _ => panic!("GET {uri} → 200 without period or window: {body}"),
    };
    let at = body["at"]
        .as_str()
        .unwrap_or_else(|| panic!("GET {uri} → 200 without at: {body}"));
    let mut again = format!(
        "{path}?{name}={value}&at={at}&ranker={}",
        body["ranker"].as_str().unwrap_or("popular")
    );
    if !top {
        again.push_str(&format!(
            "&category={}",
            path_segment(body["category"].as_str().unwrap_or("all").as_bytes())
        ));
    }
    let (status, echo) = get(harness, &again).expect("a valid URI");
    assert_eq!(
        status,
        StatusCode::OK,
        "GET {uri} echoed a span that {again} refuses: {echo}"
    );
    assert_eq!(
        (&echo[name], &echo["at"]),
        (&body[name], &body["at"]),
        "GET {again} after {uri}"
    );
});
