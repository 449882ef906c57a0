//! `[[webhook]]` through the whole service against a real receiver (a small axum server on port 0):
//! entered / left / moved for a scripted sequence of events, the signature, retries on 5xx with backoff,
//! the dead letter after the last attempt (admin view, /metrics, replay), and with two instances on
//! PostgreSQL + Redis (standalone and Cluster) every change delivered once, not once per instance.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use serde_json::{json, Value};

use rankgate::config::Config;
use rankgate::rankings::webhooks::config::{WebhookConfig, WebhookFile};
use rankgate_store::queue::token::hmac_sha256;

use crate::helpers::*;
use crate::redis_servers;

const SECRET: &str = "whsec-test-0123456789abcdef";

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
}

/// The receiver: `/ok` answers 200, `/flaky` 500 twice then 200, `/down` always 503.
#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    flaky_failures: Arc<AtomicUsize>,
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
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    receiver.got.lock().push(Received {
        path: path.clone(),
        at: Instant::now(),
        signature: header("x-rankgate-signature"),
        delivery: header("x-rankgate-delivery"),
        attempt: header("x-rankgate-attempt").parse().unwrap_or(0),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        raw: body.to_vec(),
    });
    match path.as_str() {
        "ok" => StatusCode::OK,
        "flaky" if receiver.flaky_failures.fetch_add(1, Ordering::SeqCst) < 2 => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        "flaky" => StatusCode::NO_CONTENT,
        _ => StatusCode::SERVICE_UNAVAILABLE,
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
    format!(
        "name = \"{name}\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\nranker = \"units\"\n\
         category = \"{category}\"\nwindow = \"1d\"\nlimit = 3\nretry_base_millis = 100\n\
         retry_max_millis = 400\n{extra}"
    )
}

/// The signature header checks out for the body it came with, made within the last minute.
fn assert_signed(received: &Received) {
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
    let mut message = format!("{t}.").into_bytes();
    message.extend_from_slice(&received.raw);
    let expected: String = hmac_sha256(SECRET.as_bytes(), &message)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(v1, expected, "HMAC-SHA256 over t.body with the secret");
    let mut forged = received.raw.clone();
    forged.push(b' ');
    let mut message = format!("{t}.").into_bytes();
    message.extend_from_slice(&forged);
    let forged_mac: String = hmac_sha256(SECRET.as_bytes(), &message)
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
            ];
        })
    };
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
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_redis_standalone_deliver_each_change_once() {
    each_change_is_delivered_once_across_instances(vec![redis_servers::standalone_url()], "standalone")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_redis_cluster_deliver_each_change_once() {
    let nodes = redis_servers::cluster().urls.clone();
    each_change_is_delivered_once_across_instances(nodes, "cluster").await;
}
