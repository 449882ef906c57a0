//! The dashboard (issue 30) in Chromium: `dashboard.mjs` opens `/dashboard` where it cannot show the
//! queues (from a non-loopback address while no admin key is set; before any queue) and checks what it
//! says to do; then, after a 20-second sale (events ingested each second, members entering, admitted by
//! the second, abandoned when unseen, some entries refused), says what it drew: the queue table and
//! every chart's series with their times and legends, which must be the JSON history's and the admin
//! list's numbers. Last, on a server with admin keys, the page asks for one and keeps it for the tab.
//! Saves `dashboard.png` (into `docs/screenshots/` with RANKGATE_UPDATE_SCREENSHOTS=1).

use std::collections::BTreeMap;
use std::time::Duration;

use rankgate_core::queue::{QueueName, RefusalReason};
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::NodeScript;

const QUEUE: &str = "summer-sale";
const ADMIN_KEY: &str = "k-dashboard";
/// Events ingested in each second of the sale.
const EVENTS: [usize; 20] = [
    3, 5, 8, 12, 18, 25, 30, 28, 24, 20, 16, 14, 12, 10, 9, 8, 7, 6, 5, 4,
];
/// Members entering in each second of the sale (admitted at 3 a second; the rest wait, and those
/// unseen for 6 s are dropped as abandoned).
const ARRIVALS: [usize; 20] = [4, 6, 8, 8, 6, 5, 4, 3, 2, 2, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0];

/// This machine's address on its first non-loopback interface (as `tests/api/admin.rs` finds it).
fn non_loopback_address() -> std::net::IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
    socket
        .connect("192.0.2.200:9")
        .expect("a route off this host: the test needs a non-loopback interface");
    let address = socket.local_addr().expect("the local address").ip();
    assert!(!address.is_loopback(), "{address} is loopback");
    address
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// What the sale did, as the service answered it.
#[derive(Debug, Default)]
struct Sale {
    events: u64,
    admitted: u64,
    refused: u64,
}

fn window_count(series: &Value) -> f64 {
    series
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap_or(0.0))
        .sum()
}

/// A 20-second sale on `app`, one step a second, then admission until nobody waits.
async fn run_sale(app: &TestApp) -> Sale {
    for (queue, settings) in [
        (
            QUEUE,
            json!({ "admitPerSecond": 3, "tickMillis": 1000, "abandonAfterSeconds": 6, "tokenTtlSeconds": 3600 }),
        ),
        ("quiet", json!({ "paused": true, "abandonAfterSeconds": 3600 })),
        ("spring-sale", json!({ "paused": true })),
    ] {
        let response = app
            .client
            .put(app.url(&format!("/v1/admin/queues/{queue}")))
            .json(&settings)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "PUT {queue}");
    }
    for member in ["q-1", "q-2", "q-3"] {
        app.enter("quiet", member).await;
    }
    let room = &app.state.waiting_room;
    let queue = QueueName::parse(QUEUE).unwrap();
    let mut sale = Sale::default();
    let mut entered = 0;
    let mut second = 0;
    loop {
        if second < EVENTS.len() {
            let now = now_millis();
            let events: Vec<Value> = (0..EVENTS[second])
                .map(|i| {
                    json!({ "id": format!("o{second}-{i}"), "type": "payment_succeeded", "ts": now,
                        "product_id": format!("p{}", (i * 7 + second) % 12), "categories": ["toys"],
                        "quantity": 1 + i % 3, "price": 1999 })
                })
                .collect();
            let response = app
                .client
                .post(app.url("/v1/events"))
                .json(&events)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            sale.events += events.len() as u64;
            for _ in 0..ARRIVALS[second] {
                app.enter(QUEUE, &format!("shopper-{entered:03}")).await;
                entered += 1;
            }
            if (3..8).contains(&second) {
                room.count_refusal_for_tests(&queue, RefusalReason::Address).await;
                sale.refused += 1;
            }
        }
        for (name, outcome) in room.admit_due_queues().await.unwrap() {
            if name == queue {
                sale.admitted += outcome.admitted.len() as u64;
            }
        }
        second += 1;
        let waiting = app.get_json(&format!("/v1/admin/queues/{QUEUE}")).await["waiting"]
            .as_u64()
            .unwrap();
        if second >= EVENTS.len() && waiting == 0 {
            break;
        }
        assert!(second < 60, "the sale ends within a minute");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    sale
}

/// `value` of `series` by time.
fn by_time(times: &Value, series: &Value) -> BTreeMap<i64, Value> {
    times
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .zip(series.as_array().unwrap().iter().cloned())
        .collect()
}

/// Every point `drawn` (times and values as the page left them on its `<g>`) is the history's.
fn assert_drawn_as_in(history: &Value, drawn: &Value, series: &Value, what: &str) {
    let expected = by_time(&history["times"], series);
    let times = drawn["times"].as_array().unwrap();
    let values = drawn["values"].as_array().unwrap();
    assert!(!times.is_empty(), "{what}: something is drawn");
    assert_eq!(times.len(), values.len(), "{what}");
    for (time, value) in times.iter().zip(values) {
        let time = time.as_i64().unwrap();
        let want = expected
            .get(&time)
            .unwrap_or_else(|| panic!("{what}: the page drew a point at {time} the history has not"));
        assert_eq!(
            value.as_f64(),
            want.as_f64(),
            "{what} at {time}: drawn {value}, history {want}"
        );
    }
}

fn last_known(drawn: &Value) -> Option<f64> {
    drawn["values"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find_map(Value::as_f64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_lists_the_queues_and_draws_the_history() {
    // No admin key: the page must say what to do from a non-loopback address.
    let app = TestApp::builder()
        .configure(|config| config.listen = "0.0.0.0:0".parse().unwrap())
        .configure(|config| config.waiting_room.poll_burst = 10_000)
        .admission_stepped_by_test()
        .spawn()
        .await;
    let port = app.address.rsplit(':').next().unwrap().to_owned();
    let local = format!("http://127.0.0.1:{port}");
    let remote = format!("http://{}:{port}", non_loopback_address());
    let keyed = TestApp::builder()
        .configure(|config| {
            config.admin_keys = rankgate::http::auth::BearerKeys::from_plain(&[ADMIN_KEY]);
        })
        .spawn()
        .await;

    let scratch = tempfile::tempdir().expect("a scratch dir for the screenshot");
    let shots = if std::env::var_os("RANKGATE_UPDATE_SCREENSHOTS").is_some() {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots")
    } else {
        scratch.path().to_path_buf()
    };
    std::fs::create_dir_all(&shots).expect("the screenshot dir");
    let mut node = NodeScript::start(
        "dashboard.mjs",
        &[
            local.as_ref(),
            remote.as_ref(),
            keyed.address.as_ref(),
            ADMIN_KEY.as_ref(),
            shots.as_os_str(),
        ],
    );
    let mut seen = Vec::new();
    let mut sale = None;
    let run = async {
        while let Some(line) = node.next_line().await {
            if line == "NO_QUEUE" {
                let done = run_sale(&app).await;
                // The history has all of it once the sampler has taken its next points.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
                loop {
                    let history = app.get_json("/v1/admin/dashboard/history").await;
                    let series = &history["queues"][QUEUE];
                    if window_count(&history["eventsPerSecond"]) == done.events as f64
                        && window_count(&series["admittedPerSecond"]) == done.admitted as f64
                        && series["waiting"].as_array().unwrap().last() == Some(&json!(0))
                    {
                        break;
                    }
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "the history holds the sale: {history}"
                    );
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                sale = Some(done);
                node.tell("go").await;
            }
            seen.push(line);
        }
        node
    };
    let node = tokio::time::timeout(Duration::from_secs(240), run)
        .await
        .expect("the browser run finishes within 240 s");
    node.finish(&seen).await;
    assert_eq!(seen.last().map(String::as_str), Some("DONE"), "{seen:?}");
    let sale = sale.expect("the script asked for the sale");
    let drawn: Value = seen
        .iter()
        .find_map(|line| line.strip_prefix("DRAWN "))
        .map(|json| serde_json::from_str(json).expect("DRAWN is JSON"))
        .expect("the script says what it drew");
    let history = app.get_json("/v1/admin/dashboard/history").await;
    let list = app.get_json("/v1/admin/queues").await;

    // The queue table is the admin list (counts that stand still once the sale is over).
    let rows = drawn["rows"].as_object().unwrap();
    let listed: Vec<&str> = list["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q.as_str().unwrap())
        .collect();
    assert_eq!(rows.keys().map(String::as_str).collect::<Vec<_>>(), listed);
    assert_eq!(listed, ["quiet", "spring-sale", QUEUE]);
    for queue in &listed {
        let counts = &list["counts"][queue];
        let row = &rows[*queue];
        for (cell, key) in [(0, "waiting"), (1, "ready"), (2, "claimed"), (5, "abandoned")] {
            assert_eq!(row[cell], counts[key].to_string(), "{queue} {key}");
        }
        let paused = if counts["paused"] == true { "yes" } else { "no" };
        assert_eq!(row[6], paused, "{queue} paused");
    }

    // The ingest charts: every point as the history has it; the legend counts the sale's events.
    let ingest = &drawn["ingest"];
    let events = &ingest["events"]["series"]["eventsPerSecond"];
    assert_drawn_as_in(&history, events, &history["eventsPerSecond"], "events/s");
    assert_eq!(events["legend"], format!("{} in 10 min", sale.events));
    let lag = &ingest["lag"]["series"]["freshnessLagSeconds"];
    assert_drawn_as_in(&history, lag, &history["freshnessLagSeconds"], "freshness lag");
    let shown: f64 = lag["legend"]
        .as_str()
        .and_then(|legend| legend.strip_prefix("now ")?.strip_suffix(" s")?.parse().ok())
        .unwrap_or_else(|| panic!("the lag's legend: {lag}"));
    assert!(
        (shown - last_known(lag).unwrap()).abs() <= 0.05 + 1e-9,
        "the legend shows the last lag drawn, to a tenth: {lag}"
    );

    // The sale's charts.
    let card = &drawn["queues"][QUEUE];
    let series = &history["queues"][QUEUE];
    let waiting = &card["waiting"]["series"]["waiting"];
    assert_drawn_as_in(&history, waiting, &series["waiting"], "waiting");
    assert!(
        last_known(waiting).unwrap_or(0.0) == 0.0
            && waiting["values"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v.as_f64() > Some(3.0)),
        "the line rose and fell: {waiting}"
    );
    assert_eq!(waiting["legend"], "now 0");
    let abandoned = list["counts"][QUEUE]["abandoned"].as_u64().unwrap();
    assert!(abandoned > 0, "members unseen for 6 s were dropped");
    for (key, total) in [
        ("admittedPerSecond", sale.admitted),
        ("abandonedPerSecond", abandoned),
        ("refusedPerSecond", sale.refused),
    ] {
        let drawn = &card["flow"]["series"][key];
        assert_drawn_as_in(&history, drawn, &series[key], key);
        assert_eq!(drawn["legend"], format!("{total} in 10 min"), "{key}");
    }
    // "quiet" had people waiting throughout; "spring-sale" never did anything: it says it was idle.
    let quiet = &drawn["queues"]["quiet"]["waiting"]["series"]["waiting"];
    assert_drawn_as_in(&history, quiet, &history["queues"]["quiet"]["waiting"], "quiet");
    assert_eq!(last_known(quiet), Some(3.0));
    assert_eq!(drawn["queues"]["spring-sale"], "idle");

    let bytes = std::fs::metadata(shots.join("dashboard.png"))
        .expect("dashboard.png")
        .len();
    assert!(
        bytes > 20_000,
        "dashboard.png is a real screenshot ({bytes} bytes)"
    );
    keyed.stop().await;
    app.stop().await;
}
