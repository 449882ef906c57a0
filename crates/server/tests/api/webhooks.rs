//! `[[webhook]]` through the whole service against a real receiver (a small axum server on port 0):
//! entered / left / moved for a scripted sequence of events, the signatures, retries on 5xx with backoff,
//! the dead letter after the last attempt (admin view, /metrics, replay), and with two instances on
//! PostgreSQL + Redis (standalone and Cluster) every change delivered once, not once per instance.
//!
//! Standard Webhooks: the receiver verifies every request with the reference implementation (the
//! `standardwebhooks` crate) before it answers, and refuses (401) what does not verify, so a wrong
//! signature shows as a failed delivery, not only as a failed assertion. Then: `whsec_` and plain
//! secrets, tampering, a `410 Gone` disabling a webhook (across a restart, across instances) until an
//! admin's PUT, and `Retry-After` honoured within the backoff cap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use serde_json::{json, Value};

use rankgate::config::Config;
use rankgate::rankings::webhooks::config::{WebhookConfig, WebhookFile};
use rankgate_store::queue::token::hmac_sha256;
use standardwebhooks::{Webhook, WebhookError};

use crate::helpers::*;
use crate::redis_servers;

/// A plain secret (not `whsec_`: the dash), used as its UTF-8 bytes.
const SECRET: &str = "whsec-test-0123456789abcdef";
/// A Standard Webhooks secret: the key is base64("0123456789abcdef01234567").
const WHSEC_SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3";
/// The receiver paths whose webhooks are configured with [`WHSEC_SECRET`].
const WHSEC_PATHS: &[&str] = &["std-whsec"];

/// The reference verifier for deliveries to `path`, keyed as its webhook's secret says.
fn verifier(path: &str) -> Webhook {
    if WHSEC_PATHS.contains(&path) {
        Webhook::new(WHSEC_SECRET).expect("a valid whsec_ secret")
    } else {
        Webhook::from_bytes(SECRET.as_bytes().to_vec()).unwrap()
    }
}

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    at: Instant,
    signature: String,
    delivery: String,
    attempt: u32,
    body: Value,
    raw: Vec<u8>,
    headers: HeaderMap,
    /// What the reference verifier said, as the receiver checked it on arrival.
    verified: Result<(), String>,
}

/// The receiver. Every path first verifies the Standard Webhooks signature (401 if it fails), then:
/// `/ok` and `/std-*` answer 200, `/flaky` 500 twice then 200, `/down` always 503, `/gone` 410 while
/// `gone` is set and 200 after; the Retry-After paths answer their first request with a refusal and
/// 200 after: `/busy` 503 `Retry-After: 2`, `/throttled` 429 `Retry-After: 86400`, `/dated` 503 with
/// an HTTP-date 3 s ahead, `/garbage` 503 `Retry-After: -5`.
#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    flaky_failures: Arc<AtomicUsize>,
    gone: Arc<AtomicBool>,
}

impl Receiver {
    fn on(&self, path: &str) -> Vec<Received> {
        self.got
            .lock()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// Waits until `path` got `count` requests; returns them.
    async fn wait_for(&self, path: &str, count: usize) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = self.on(path);
            if got.len() >= count {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{path}: {} of {count} requests arrived: {got:?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn receive(
    State(receiver): State<Receiver>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let header = |name: &str| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let verified = verifier(&path)
        .verify(&body, &headers)
        .map_err(|error| error.to_string());
    let earlier = {
        let mut got = receiver.got.lock();
        let earlier = got.iter().filter(|r| r.path == path).count();
        got.push(Received {
            path: path.clone(),
            at: Instant::now(),
            signature: header("x-rankgate-signature"),
            delivery: header("x-rankgate-delivery"),
            attempt: header("x-rankgate-attempt").parse().unwrap_or(0),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            raw: body.to_vec(),
            headers: headers.clone(),
            verified: verified.clone(),
        });
        earlier
    };
    if verified.is_err() {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let refuse_first = |status: StatusCode, retry_after: String| {
        if earlier == 0 {
            (status, [("retry-after", retry_after)]).into_response()
        } else {
            StatusCode::OK.into_response()
        }
    };
    match path.as_str() {
        "ok" | "std-whsec" | "std-plain" => StatusCode::OK.into_response(),
        "flaky" if receiver.flaky_failures.fetch_add(1, Ordering::SeqCst) < 2 => {
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
        "flaky" => StatusCode::NO_CONTENT.into_response(),
        "gone" if receiver.gone.load(Ordering::SeqCst) => StatusCode::GONE.into_response(),
        "gone" => StatusCode::OK.into_response(),
        "busy" => refuse_first(StatusCode::SERVICE_UNAVAILABLE, "2".into()),
        "throttled" => refuse_first(StatusCode::TOO_MANY_REQUESTS, "86400".into()),
        "dated" => refuse_first(
            StatusCode::SERVICE_UNAVAILABLE,
            httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3)),
        ),
        "garbage" => refuse_first(StatusCode::SERVICE_UNAVAILABLE, "-5".into()),
        _ => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

async fn spawn_receiver() -> (String, Receiver) {
    let receiver = Receiver::default();
    let router = axum::Router::new()
        .route("/{path}", axum::routing::post(receive))
        .with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (address, receiver)
}

/// A `[[webhook]]` table, checked as the config file's are.
fn webhook(config: &Config, table: &str) -> WebhookConfig {
    let file: WebhookFile = toml::from_str(table).unwrap();
    WebhookConfig::from_file(
        0,
        file,
        &config.rankings.zone,
        config.rankings.metric_retention_millis,
    )
    .unwrap()
}

fn table(name: &str, url: &str, category: &str, extra: &str) -> String {
    table_with_secret(name, url, category, SECRET, extra)
}

fn table_with_secret(name: &str, url: &str, category: &str, secret: &str, extra: &str) -> String {
    // A later `retry_max_millis` in `extra` would be a duplicate key: extra may replace the default.
    let cap = if extra.contains("retry_max_millis") {
        ""
    } else {
        "retry_max_millis = 400\n"
    };
    format!(
        "name = \"{name}\"\nurl = \"{url}\"\nsecret = \"{secret}\"\nranker = \"units\"\n\
         category = \"{category}\"\nwindow = \"1d\"\nlimit = 3\nretry_base_millis = 100\n\
         {cap}{extra}"
    )
}

/// Both signatures check out: the Standard Webhooks one by the reference library (as the receiver
/// found on arrival), with the headers naming the same delivery; and rankgate's own.
fn assert_signed(received: &Received) {
    assert_eq!(
        received.verified,
        Ok(()),
        "the Standard Webhooks signature verifies: {received:?}"
    );
    let standard = |name: &str| received.headers[name].to_str().unwrap().to_string();
    assert_eq!(
        standard("webhook-id"),
        received.delivery,
        "webhook-id is the delivery id"
    );
    assert_eq!(received.body["id"], received.delivery);
    assert!(
        standard("webhook-signature").starts_with("v1,"),
        "{}",
        standard("webhook-signature")
    );
    assert_legacy_signed(received, SECRET);
}

/// `X-Rankgate-Signature` checks out for the body it came with, keyed by `secret` as written, made
/// within the last minute and at the same second as `webhook-timestamp`.
fn assert_legacy_signed(received: &Received, secret: &str) {
    let (t, v1) = received
        .signature
        .strip_prefix("t=")
        .and_then(|rest| rest.split_once(",v1="))
        .unwrap_or_else(|| panic!("signature header {:?}", received.signature));
    let seconds: i64 = t.parse().unwrap();
    assert!(
        (now_millis() / 1000 - seconds).abs() < 60,
        "t is the attempt's time"
    );
    assert_eq!(
        received.headers["webhook-timestamp"].to_str().unwrap(),
        t,
        "one attempt, one timestamp"
    );
    let mut message = format!("{t}.").into_bytes();
    message.extend_from_slice(&received.raw);
    let expected: String = hmac_sha256(secret.as_bytes(), &message)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(v1, expected, "HMAC-SHA256 over t.body with the secret");
    let mut forged = received.raw.clone();
    forged.push(b' ');
    let mut message = format!("{t}.").into_bytes();
    message.extend_from_slice(&forged);
    let forged_mac: String = hmac_sha256(secret.as_bytes(), &message)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_ne!(v1, forged_mac, "another body has another signature");
}

/// `(kind, productId, oldRank, newRank)` of one reported change.
type Reported = (String, String, Value, Value);

/// One step of the script: the sales it ingests (product, units) and the changes it must report.
type Step = (Vec<(&'static str, u32)>, Vec<Reported>);

/// `(kind, productId, oldRank, newRank)` of a delivery's events.
fn events_of(body: &Value) -> Vec<Reported> {
    body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_string(),
                e["productId"].as_str().unwrap().to_string(),
                e["oldRank"].clone(),
                e["newRank"].clone(),
            )
        })
        .collect()
}

fn ev(kind: &str, product: &str, old: Option<u64>, new: Option<u64>) -> Reported {
    (kind.into(), product.into(), json!(old), json!(new))
}

/// The scripted sequence: each step's events and the changes it must report in the top 3 of `toys`.
fn script() -> Vec<Step> {
    vec![
        (vec![("p1", 5)], vec![ev("entered", "p1", None, Some(1))]),
        (
            vec![("p2", 10)],
            vec![
                ev("entered", "p2", None, Some(1)),
                ev("moved", "p1", Some(1), Some(2)),
            ],
        ),
        (
            vec![("p3", 7)],
            vec![
                ev("entered", "p3", None, Some(2)),
                ev("moved", "p1", Some(2), Some(3)),
            ],
        ),
        (
            vec![("p4", 20)],
            vec![
                ev("left", "p1", Some(3), None),
                ev("entered", "p4", None, Some(1)),
                ev("moved", "p2", Some(1), Some(2)),
                ev("moved", "p3", Some(2), Some(3)),
            ],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_post_signed_changes_retry_on_5xx_and_dead_letter_after_the_last_attempt() {
    let (receiver_url, receiver) = spawn_receiver().await;
    let configure = |config: &mut Config| {
        config.rankings.freshness_millis = 200;
        config.rankings.webhooks = vec![
            webhook(
                config,
                &table("toys-top", &format!("{receiver_url}/ok"), "toys", ""),
            ),
            webhook(
                config,
                &table(
                    "flaky-top",
                    &format!("{receiver_url}/flaky"),
                    "flaky",
                    "max_attempts = 5",
                ),
            ),
            webhook(
                config,
                &table(
                    "down-top",
                    &format!("{receiver_url}/down"),
                    "down",
                    "max_attempts = 2\nevents = [\"entered\"]",
                ),
            ),
        ];
    };
    let app = spawn_app_with(configure).await;
    // The first reading (an empty top) is the silent baseline.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(receiver.on("ok").is_empty(), "nothing changed yet");

    // Entered / left / moved, step by step: each step waits for its delivery, so none coalesce.
    let now = now_millis();
    for (step, (sales, expected)) in script().into_iter().enumerate() {
        let events: Vec<Value> = sales
            .iter()
            .map(|(product, units)| {
                sale(
                    &format!("toys-{step}-{product}"),
                    product,
                    now,
                    *units,
                    100,
                    &["toys"],
                )
            })
            .collect();
        app.post_events_ok(&Value::Array(events)).await;
        let got = receiver.wait_for("ok", step + 1).await;
        let delivery = &got[step];
        let sequence = step as u64 + 1;
        assert_eq!(delivery.body["id"], format!("toys-top:{sequence}"));
        assert_eq!(
            delivery.delivery,
            format!("toys-top:{sequence}"),
            "the id is in a header too"
        );
        assert_eq!(delivery.body["sequence"], sequence);
        assert_eq!(delivery.body["webhook"], "toys-top");
        assert_eq!(delivery.body["ranking"]["ranker"], "units");
        assert_eq!(delivery.body["ranking"]["category"], "toys");
        assert_eq!(delivery.body["ranking"]["window"], "1d");
        assert_eq!(delivery.body["ranking"]["limit"], 3);
        assert!(delivery.body["time"].as_str().unwrap().ends_with('Z'));
        assert_eq!(events_of(&delivery.body), expected, "step {step}");
        assert_eq!(delivery.attempt, 1);
        assert_signed(delivery);
    }
    // No change, no delivery.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.on("ok").len(), 4, "an unchanged top N posts nothing");

    // Retries: 500, 500, then 2xx; the same delivery each time, with backoff in between.
    app.post_events_ok(&json!([sale("flaky-1", "f1", now, 1, 100, &["flaky"])]))
        .await;
    let attempts = receiver.wait_for("flaky", 3).await;
    assert_eq!(attempts.iter().map(|r| r.attempt).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(attempts
        .iter()
        .all(|r| r.delivery == "flaky-top:1" && r.raw == attempts[0].raw));
    for r in &attempts {
        // webhook-id is the delivery's, the same on every attempt (assert_signed), so a receiver's
        // dedupe by it holds across retries; the timestamp is each attempt's own.
        assert_signed(r);
    }
    // Backoff with equal jitter: ≥ base/2 after the first failure, ≥ base after the second.
    assert!(attempts[1].at - attempts[0].at >= Duration::from_millis(50));
    assert!(attempts[2].at - attempts[1].at >= Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        receiver.on("flaky").len(),
        3,
        "delivered once it succeeded, not again"
    );

    // Dead letter: always 503, two attempts, then the dead set.
    app.post_events_ok(&json!([sale("down-1", "d1", now, 1, 100, &["down"])]))
        .await;
    receiver.wait_for("down", 2).await;
    let admin = read_until(&app, "/v1/admin/webhooks", "the dead delivery", |body| {
        body["dead"] == 1
    })
    .await;
    assert_eq!(admin["deadDeliveries"][0]["id"], "down-top:1");
    assert_eq!(admin["deadDeliveries"][0]["reason"], "the receiver answered 503");
    assert_eq!(admin["webhooks"].as_array().unwrap().len(), 3);
    assert!(!admin.to_string().contains(SECRET), "no secret in the admin view");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.on("down").len(), 2, "no attempt past max_attempts");
    let metrics = app.get("/metrics").await.text().await.unwrap();
    let counted = |outcome: &str, hook: &str| {
        metrics.lines().any(|line| {
            line.starts_with("rankgate_webhook_deliveries_total")
                && line.contains(&format!("outcome=\"{outcome}\""))
                && line.contains(&format!("webhook=\"{hook}\""))
        })
    };
    assert!(
        counted("dead", "down-top"),
        "the dead letter is counted: {metrics}"
    );
    assert!(counted("retry", "flaky-top"));
    assert!(counted("delivered", "toys-top"));
    assert!(!metrics.contains(SECRET));
    // A replayed dead delivery is attempted again, with fresh attempts.
    let replay = app
        .client
        .post(format!(
            "{}/v1/admin/webhooks/dead/down-top:1/replay",
            app.address
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 202);
    let again = receiver.wait_for("down", 3).await;
    assert_eq!(again[2].attempt, 1);
    let unknown = app
        .client
        .post(format!("{}/v1/admin/webhooks/dead/nope:1/replay", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);

    // A restart continues the sequence from the snapshot kept in the data dir; a change made while
    // the service was down is reported at the next start.
    let data_dir = app.stop().await.unwrap();
    let restarted = spawn_app_in(data_dir.path().to_path_buf(), configure).await;
    restarted
        .post_events_ok(&json!([sale("toys-5", "p5", now, 30, 100, &["toys"])]))
        .await;
    let got = receiver.wait_for("ok", 5).await;
    assert_eq!(got[4].body["id"], "toys-top:5");
    assert_eq!(
        events_of(&got[4].body),
        vec![
            ev("left", "p3", Some(3), None),
            ev("entered", "p5", None, Some(1)),
            ev("moved", "p4", Some(1), Some(2)),
            ev("moved", "p2", Some(2), Some(3)),
        ]
    );
    restarted.stop().await;
}

/// Two instances on PostgreSQL + `redis`, one webhook: the scripted changes arrive once each.
async fn each_change_is_delivered_once_across_instances(redis: Vec<String>, label: &str) {
    let (receiver_url, receiver) = spawn_receiver().await;
    let schema = format!("rgtest_webhooks_{label}_{}", std::process::id());
    let _schema = SchemaGuard::named(schema.clone());
    let prefix = redis_servers::unique_prefix();
    let _keys = redis_servers::KeyCleanup {
        nodes: redis.clone(),
        prefix: prefix.clone(),
    };
    let spawn = || {
        let (schema, redis, prefix) = (schema.clone(), redis.clone(), prefix.clone());
        let url = receiver_url.clone();
        spawn_app_with(move |config| {
            config.rankings.database = Some(postgres_url());
            config.rankings.database_schema = schema;
            config.redis = redis;
            config.redis_prefix = prefix;
            config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
            config.rankings.freshness_millis = 200;
            config.rankings.webhooks = vec![
                webhook(config, &table("fleet-top", &format!("{url}/ok"), "toys", "")),
                webhook(
                    config,
                    &table(
                        "fleet-flaky",
                        &format!("{url}/flaky"),
                        "flaky",
                        "max_attempts = 5",
                    ),
                ),
                webhook(config, &table("fleet-gone", &format!("{url}/gone"), "gone", "")),
            ];
        })
    };
    receiver.gone.store(true, Ordering::SeqCst);
    let a = spawn().await;
    let b = spawn().await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let now = now_millis();
    for (step, (sales, expected)) in script().into_iter().enumerate() {
        // Alternate the instance the events go through.
        let app = if step % 2 == 0 { &a } else { &b };
        let events: Vec<Value> = sales
            .iter()
            .map(|(product, units)| {
                sale(
                    &format!("fleet-{step}-{product}"),
                    product,
                    now,
                    *units,
                    100,
                    &["toys"],
                )
            })
            .collect();
        app.post_events_ok(&Value::Array(events)).await;
        let got = receiver.wait_for("ok", step + 1).await;
        assert_eq!(events_of(&got[step].body), expected, "step {step}");
    }
    // Long enough for a second instance's duplicate to arrive, were there one.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for received in receiver.on("ok") {
        *per_id.entry(received.delivery.clone()).or_default() += 1;
        assert_signed(&received);
    }
    let expected: HashMap<String, usize> = (1..=4).map(|s| (format!("fleet-top:{s}"), 1)).collect();
    assert_eq!(
        per_id, expected,
        "each change once, numbered once across both instances"
    );
    // Retries through the Redis job queue, whichever instance claims each attempt: 500, 500, 2xx.
    a.post_events_ok(&json!([sale("fleet-flaky-1", "f1", now, 1, 100, &["flaky"])]))
        .await;
    let attempts = receiver.wait_for("flaky", 3).await;
    assert_eq!(attempts.iter().map(|r| r.attempt).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(attempts.iter().all(|r| r.delivery == "fleet-flaky:1"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.on("flaky").len(), 3, "acked once delivered");

    // A 410, whichever instance got it, disables the webhook for both: the pause is in Redis.
    a.post_events_ok(&json!([sale("fleet-gone-1", "g1", now, 1, 100, &["gone"])]))
        .await;
    receiver.wait_for("gone", 1).await;
    for app in [&a, &b] {
        read_until(app, "/v1/admin/webhooks", "fleet-gone disabled", |body| {
            webhook_entry(body, "fleet-gone")["disabled"] == true && body["parked"] == 1
        })
        .await;
    }
    b.post_events_ok(&json!([sale("fleet-gone-2", "g2", now, 5, 100, &["gone"])]))
        .await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(
        receiver.on("gone").len(),
        1,
        "neither instance posts after the 410"
    );
    // Enabled through one instance; both deliver again (whichever claims).
    receiver.gone.store(false, Ordering::SeqCst);
    let enabled = b
        .put_json("/v1/admin/webhooks/fleet-gone", &json!({ "enabled": true }))
        .await;
    assert_eq!(enabled.status(), 200);
    receiver.wait_for("gone", 3).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let mut ids: Vec<String> = receiver.on("gone")[1..]
        .iter()
        .map(|r| r.delivery.clone())
        .collect();
    ids.sort();
    assert_eq!(ids, ["fleet-gone:1", "fleet-gone:2"], "each once, after the PUT");
    for app in [&a, &b] {
        let admin = app.get_json("/v1/admin/webhooks").await;
        assert_eq!(webhook_entry(&admin, "fleet-gone")["disabled"], false);
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_redis_standalone_deliver_each_change_once() {
    each_change_is_delivered_once_across_instances(vec![redis_servers::standalone_url()], "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_redis_cluster_deliver_each_change_once() {
    let nodes = redis_servers::cluster().urls.clone();
    each_change_is_delivered_once_across_instances(nodes, "cluster").await;
}

/// Verifies `received` with `webhook` after `tamper` changed its body, headers or both.
fn verify_tampered(
    webhook: &Webhook,
    received: &Received,
    tamper: impl FnOnce(&mut Vec<u8>, &mut HeaderMap),
) -> Result<(), WebhookError> {
    let mut body = received.raw.clone();
    let mut headers = received.headers.clone();
    tamper(&mut body, &mut headers);
    webhook.verify(&body, &headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_verify_with_the_standard_webhooks_library_for_whsec_and_plain_secrets() {
    let (receiver_url, receiver) = spawn_receiver().await;
    let app = spawn_app_with(|config| {
        config.rankings.freshness_millis = 200;
        config.rankings.webhooks = vec![
            webhook(
                config,
                &table_with_secret(
                    "std-whsec",
                    &format!("{receiver_url}/std-whsec"),
                    "stdw",
                    WHSEC_SECRET,
                    "",
                ),
            ),
            webhook(
                config,
                &table("std-plain", &format!("{receiver_url}/std-plain"), "stdp", ""),
            ),
        ];
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let now = now_millis();
    app.post_events_ok(&json!([
        sale("stdw-1", "w1", now, 2, 100, &["stdw"]),
        sale("stdp-1", "p1", now, 2, 100, &["stdp"]),
    ]))
    .await;
    for (path, name, secret) in [
        ("std-whsec", "std-whsec", WHSEC_SECRET),
        ("std-plain", "std-plain", SECRET),
    ] {
        let received = receiver.wait_for(path, 1).await.remove(0);
        assert_eq!(received.verified, Ok(()), "{path}: {received:?}");
        assert_eq!(received.headers["webhook-id"], format!("{name}:1").as_str());
        assert_eq!(received.body["id"], format!("{name}:1"));
        // X-Rankgate-Signature keeps working, keyed by the secret as written (for whsec_ too).
        assert_legacy_signed(&received, secret);
        let webhook = verifier(path);
        assert!(
            verify_tampered(&webhook, &received, |_, _| {}).is_ok(),
            "{path}: untouched"
        );
        let refused = |what: &str, result: Result<(), WebhookError>| {
            assert!(
                matches!(result, Err(WebhookError::InvalidSignature)),
                "{path}: tampered {what} must not verify: {result:?}"
            );
        };
        refused(
            "body",
            verify_tampered(&webhook, &received, |body, _| {
                let at = body.iter().position(|&b| b == b'1').unwrap();
                body[at] = b'2';
            }),
        );
        refused(
            "id",
            verify_tampered(&webhook, &received, |_, headers| {
                headers.insert("webhook-id", format!("{name}:2").parse().unwrap());
            }),
        );
        refused(
            "timestamp",
            verify_tampered(&webhook, &received, |_, headers| {
                let t: i64 = headers["webhook-timestamp"].to_str().unwrap().parse().unwrap();
                headers.insert("webhook-timestamp", (t - 1).to_string().parse().unwrap());
            }),
        );
    }
    // Each delivery verifies only with its own webhook's key: the whsec_ one's decoded bytes are not the
    // plain one's, nor is the whsec_ string itself taken as bytes.
    let whsec = receiver.on("std-whsec").remove(0);
    assert!(verifier("std-plain").verify(&whsec.raw, &whsec.headers).is_err());
    let as_text = Webhook::from_bytes(WHSEC_SECRET.as_bytes().to_vec()).unwrap();
    assert!(as_text.verify(&whsec.raw, &whsec.headers).is_err());
    app.stop().await;
}

/// The admin view's entry for webhook `name`.
fn webhook_entry(admin: &Value, name: &str) -> Value {
    admin["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|hook| hook["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {admin}"))
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_disables_the_webhook_across_a_restart_until_an_admin_enables_it() {
    let (receiver_url, receiver) = spawn_receiver().await;
    receiver.gone.store(true, Ordering::SeqCst);
    let configure = |config: &mut Config| {
        with_keys(config, &["admin-key"], &[]);
        config.rankings.freshness_millis = 200;
        config.rankings.webhooks = vec![
            webhook(
                config,
                &table(
                    "gone-top",
                    &format!("{receiver_url}/gone"),
                    "gone",
                    "max_attempts = 1",
                ),
            ),
            webhook(
                config,
                &table("toys-top", &format!("{receiver_url}/ok"), "toys", ""),
            ),
        ];
    };
    let admin_client = || {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("authorization", "Bearer admin-key".parse().unwrap());
        reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap()
    };
    let app = TestApp::builder()
        .client(admin_client())
        .configure(configure)
        .spawn()
        .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let now = now_millis();
    app.post_events_ok(&json!([sale("gone-1", "g1", now, 1, 100, &["gone"])]))
        .await;
    let first = receiver.wait_for("gone", 1).await;
    assert_signed(&first[0]);
    let admin = read_until(&app, "/v1/admin/webhooks", "gone-top disabled", |body| {
        webhook_entry(body, "gone-top")["disabled"] == true
    })
    .await;
    let gone = webhook_entry(&admin, "gone-top");
    assert_eq!(
        gone["disabledReason"],
        "the receiver answered 410 Gone to delivery gone-top:1"
    );
    let disabled_at = gone["disabledAt"].as_str().unwrap();
    let disabled_at: jiff::Timestamp = disabled_at.parse().unwrap();
    assert!((disabled_at.as_millisecond() - now_millis()).abs() < 60_000);
    assert_eq!(
        admin["parked"], 1,
        "max_attempts = 1, yet parked, not dead: {admin}"
    );
    assert_eq!(admin["dead"], 0);
    let toys = webhook_entry(&admin, "toys-top");
    assert_eq!(toys["disabled"], false, "the other webhook is untouched");
    assert!(toys.get("disabledAt").is_none());

    // More changes while disabled: none reaches the receiver; the other webhook goes on.
    app.post_events_ok(&json!([
        sale("gone-2", "g2", now, 5, 100, &["gone"]),
        sale("toys-1", "t1", now, 1, 100, &["toys"]),
    ]))
    .await;
    receiver.wait_for("ok", 1).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(receiver.on("gone").len(), 1, "no request after the 410");
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("rankgate_webhook_deliveries_total")
                && line.contains("outcome=\"disabled\"")
                && line.contains("webhook=\"gone-top\"")),
        "the 410 is counted: {metrics}"
    );

    // The state is in the job store (the data dir's): a restart keeps it.
    let data_dir = app.stop().await.unwrap();
    let app = TestApp::builder()
        .client(admin_client())
        .configure(configure)
        .in_temp_dir(data_dir)
        .spawn()
        .await;
    let admin = app.get_json("/v1/admin/webhooks").await;
    assert_eq!(webhook_entry(&admin, "gone-top")["disabled"], true, "{admin}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.on("gone").len(), 1, "still nothing after the restart");

    // The PUT: admin-only, checked, 404 for a webhook not configured.
    let put = |client: reqwest::Client, name: &str, body: &'static str| {
        let url = app.url(&format!("/v1/admin/webhooks/{name}"));
        async move {
            let response = client
                .put(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, _) = put(reqwest::Client::new(), "gone-top", r#"{"enabled": true}"#).await;
    assert_eq!(status, 401, "admin auth, as every admin route");
    for (body, field) in [
        ("{}", "enabled:"),
        (r#"{"enabled": "yes"}"#, "enabled:"),
        (r#"{"enabled": 1}"#, "enabled:"),
        (r#"{"enabled": true, "url": "http://elsewhere"}"#, "url:"),
        ("[true]", "body:"),
        ("enabled", "body:"),
        ("", "body:"),
    ] {
        let (status, answer) = put(app.client.clone(), "gone-top", body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.starts_with(field), "{body}: {error}");
    }
    let (status, answer) = put(app.client.clone(), "nope", r#"{"enabled": true}"#).await;
    assert_eq!(status, 404, "{answer}");
    assert!(answer["error"].as_str().unwrap().starts_with("name:"));
    assert_eq!(receiver.on("gone").len(), 1, "refused PUTs changed nothing");

    // Enabled: the parked delivery goes out again with fresh attempts, then one delivery with what
    // changed while disabled (g2 entered above g1), numbered on without a gap.
    receiver.gone.store(false, Ordering::SeqCst);
    let (status, answer) = put(app.client.clone(), "gone-top", r#"{"enabled": true}"#).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["name"], "gone-top");
    assert_eq!(answer["disabled"], false);
    let got = receiver.wait_for("gone", 3).await;
    let mut resumed: Vec<&Received> = got[1..].iter().collect();
    resumed.sort_by_key(|r| r.delivery.clone());
    assert_eq!(resumed[0].delivery, "gone-top:1");
    assert_eq!(resumed[0].attempt, 1, "fresh attempts");
    assert_eq!(resumed[0].raw, got[0].raw, "the parked delivery as it was");
    assert_eq!(resumed[1].delivery, "gone-top:2");
    assert_eq!(
        events_of(&resumed[1].body),
        vec![
            ev("entered", "g2", None, Some(1)),
            ev("moved", "g1", Some(1), Some(2)),
        ]
    );
    for received in &resumed {
        assert_signed(received);
    }
    let admin = read_until(&app, "/v1/admin/webhooks", "nothing parked", |body| {
        body["parked"] == 0 && body["ready"] == 0 && body["processing"] == 0
    })
    .await;
    assert_eq!(webhook_entry(&admin, "gone-top")["disabled"], false);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(receiver.on("gone").len(), 3, "each once");

    // An admin can disable it too; enabling it again is idempotent.
    let (status, answer) = put(app.client.clone(), "gone-top", r#"{"enabled": false}"#).await;
    assert_eq!(status, 200);
    assert_eq!(answer["disabled"], true);
    assert_eq!(answer["disabledReason"], "disabled by an admin");
    for _ in 0..2 {
        let (status, answer) = put(app.client.clone(), "gone-top", r#"{"enabled": true}"#).await;
        assert_eq!((status, &answer["disabled"]), (200, &json!(false)));
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_within_the_backoff_cap() {
    let (receiver_url, receiver) = spawn_receiver().await;
    let app = spawn_app_with(|config| {
        config.rankings.freshness_millis = 200;
        let hook = |name: &str, cap: u64| {
            table(
                &format!("{name}-top"),
                &format!("{receiver_url}/{name}"),
                name,
                &format!("retry_max_millis = {cap}"),
            )
        };
        config.rankings.webhooks = vec![
            webhook(config, &hook("busy", 10_000)),
            webhook(config, &hook("throttled", 1_000)),
            webhook(config, &hook("dated", 10_000)),
            webhook(config, &hook("garbage", 10_000)),
        ];
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let now = now_millis();
    app.post_events_ok(&json!([
        sale("busy-1", "b1", now, 1, 100, &["busy"]),
        sale("throttled-1", "t1", now, 1, 100, &["throttled"]),
        sale("dated-1", "d1", now, 1, 100, &["dated"]),
        sale("garbage-1", "x1", now, 1, 100, &["garbage"]),
    ]))
    .await;
    let gap = |path: &str, got: &[Received]| {
        assert_eq!(got[0].delivery, got[1].delivery, "{path}: one delivery, retried");
        assert_eq!((got[0].attempt, got[1].attempt), (1, 2));
        got[1].at - got[0].at
    };
    // Without Retry-After the first retry would come after 50–100 ms (base 100, equal jitter).
    let busy = receiver.wait_for("busy", 2).await;
    let waited = gap("busy", &busy);
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(5),
        "Retry-After: 2 → the next attempt 2 s later: {waited:?}"
    );
    let dated = receiver.wait_for("dated", 2).await;
    let waited = gap("dated", &dated);
    // The date is 3 s ahead, at one-second resolution: at least 2 s.
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(6),
        "an HTTP-date 3 s ahead: {waited:?}"
    );
    let throttled = receiver.wait_for("throttled", 2).await;
    let waited = gap("throttled", &throttled);
    assert!(
        waited >= Duration::from_millis(1_000) && waited < Duration::from_secs(3),
        "Retry-After: 86400 is capped at retry_max_millis = 1000: {waited:?}"
    );
    let garbage = receiver.wait_for("garbage", 2).await;
    let waited = gap("garbage", &garbage);
    assert!(
        waited < Duration::from_millis(1_500),
        "Retry-After: -5 is ignored, the backoff stands: {waited:?}"
    );
    for received in busy.iter().chain(&dated).chain(&throttled).chain(&garbage) {
        assert_signed(received);
    }
    app.stop().await;
}
