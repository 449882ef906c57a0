//! The sale report's page (issue 28, SPEC 2.5) in Chromium: a simulated 20-minute sale on a manual
//! clock (a rush of arrivals, admission at 30 a minute, some members leaving unseen, orders for most admitted,
//! refusals during the rush), then `report_page.mjs` opens `/admin/queues/{queue}/report` and says what
//! it drew, which must be the JSON report's numbers: every total as shown, every series minute by
//! minute. Saves `report.png` (into `docs/screenshots/` with RANKGATE_UPDATE_SCREENSHOTS=1).

use std::sync::Arc;
use std::time::Duration;

use rankgate_core::queue::{QueueName, RefusalReason};
use rankgate_store::clock::ManualClock;
use serde_json::{json, Value};

use crate::app::TestApp;
use crate::NodeScript;

const QUEUE: &str = "summer-sale";
/// Arrivals per minute of the sale: a rush, then a tail.
const ARRIVALS_PER_MINUTE: [usize; 20] = [6, 48, 90, 64, 36, 24, 18, 12, 9, 8, 6, 5, 4, 3, 2, 2, 1, 1, 0, 0];
/// Seconds of simulated time per step.
const STEP_SECONDS: i64 = 5;

/// A member who waits: polls (keeping its place) each simulated minute, and orders when admitted,
/// unless it is one of every 9, who leave without a word (abandoned), or one of every 4 admitted, who
/// do not buy.
async fn simulate_sale(app: &TestApp, clock: &ManualClock) {
    let response = app
        .client
        .put(app.url(&format!("/v1/admin/queues/{QUEUE}")))
        .json(
            &json!({ "admitPerSecond": 0.5, "tickMillis": STEP_SECONDS * 1000, "abandonAfterSeconds": 120 }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let queue = QueueName::parse(QUEUE).unwrap();
    let room = &app.state.waiting_room;
    let mut waiting: Vec<String> = Vec::new();
    let mut entered = 0usize;
    let steps_per_minute = (60 / STEP_SECONDS) as usize;
    for step in 0..ARRIVALS_PER_MINUTE.len() * steps_per_minute {
        let minute = step / steps_per_minute;
        let arrivals = ARRIVALS_PER_MINUTE[minute];
        let this_step =
            arrivals / steps_per_minute + usize::from(step % steps_per_minute < arrivals % steps_per_minute);
        for _ in 0..this_step {
            let member = format!("shopper-{entered:04}");
            entered += 1;
            let response = app
                .client
                .post(app.url(&format!("/v1/queues/{QUEUE}/entries")))
                .json(&json!({ "memberId": member }))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            if !entered.is_multiple_of(9) {
                waiting.push(member);
            }
        }
        if (1..=3).contains(&minute) {
            let reason = if step.is_multiple_of(3) {
                RefusalReason::Challenge
            } else {
                RefusalReason::Address
            };
            room.count_refusal_for_tests(&queue, reason).await;
        }
        clock.advance(STEP_SECONDS * 1000);
        for (_, outcome) in room.admit_due_queues().await.unwrap() {
            for member in outcome.admitted {
                let member = member.as_str().to_owned();
                waiting.retain(|m| *m != member);
                if member.ends_with(['1', '5', '9']) {
                    continue;
                }
                buy(app, &member).await;
            }
        }
        if step.is_multiple_of(steps_per_minute) {
            for member in &waiting {
                let response = app.get(&format!("/v1/queues/{QUEUE}/entries/{member}")).await;
                assert_eq!(response.status(), 200);
            }
        }
    }
}

async fn buy(app: &TestApp, member: &str) {
    let position: Value = app
        .get(&format!("/v1/queues/{QUEUE}/entries/{member}"))
        .await
        .json()
        .await
        .unwrap();
    let token = position["entryToken"].as_str().expect("a READY member's token");
    let response = app
        .post_json(
            &format!("/v1/queues/{QUEUE}/tokens/claim"),
            &json!({ "memberId": member, "token": token }),
        )
        .await;
    assert_eq!(response.status(), 200);
    let claim: Value = response.json().await.unwrap();
    let response = app
        .post_json(
            &format!("/v1/queues/{QUEUE}/tokens/consume"),
            &json!({ "memberId": member, "claimId": claim["claimId"] }),
        )
        .await;
    assert_eq!(response.status(), 204);
}

/// Orders over admissions up to each minute, to two decimals (`null` before the first admission).
fn running_orders_per_admission(minutes: &[Value]) -> Vec<Value> {
    let (mut orders, mut admitted) = (0, 0);
    minutes
        .iter()
        .map(|m| {
            orders += m["orders"].as_u64().unwrap();
            admitted += m["admitted"].as_u64().unwrap();
            if admitted == 0 {
                Value::Null
            } else {
                json!((orders as f64 / admitted as f64 * 100.0).round() / 100.0)
            }
        })
        .collect()
}

fn seconds(value: &Value) -> String {
    value
        .as_u64()
        .map_or_else(|| "–".to_owned(), |s| format!("{s} s"))
}

/// What the page must draw for `report`, as `report_page.mjs` reads it.
fn expected_drawing(report: &Value) -> (Value, Value) {
    let t = &report["totals"];
    let refused = ["challenge", "address", "captcha"]
        .iter()
        .map(|k| t["refused"][k].as_u64().unwrap())
        .sum::<u64>();
    let totals = json!({
        "arrivals": t["arrivals"].to_string(),
        "admitted": t["admitted"].to_string(),
        "abandoned": t["abandoned"].to_string(),
        "refused": refused.to_string(),
        "orders": t["orders"].to_string(),
        "ordersPerAdmission": format!("{:.2}", t["ordersPerAdmission"].as_f64().unwrap()),
        "wait": format!("{} / {}", seconds(&t["waitSecondsP50"]), seconds(&t["waitSecondsP90"])),
        "estimate": format!("{} / {}", seconds(&t["estimateSecondsP50"]), seconds(&t["estimateSecondsP90"])),
    });
    let minutes = report["minutes"].as_array().unwrap();
    let series = |of: &dyn Fn(&Value) -> Value| Value::Array(minutes.iter().map(of).collect());
    let charts = json!({
        "flow": {
            "arrivals": series(&|m| m["arrivals"].clone()),
            "admitted": series(&|m| m["admitted"].clone()),
            "abandoned": series(&|m| m["abandoned"].clone()),
        },
        "refusals": {
            "challenge": series(&|m| m["refused"]["challenge"].clone()),
            "address": series(&|m| m["refused"]["address"].clone()),
            "captcha": series(&|m| m["refused"]["captcha"].clone()),
        },
        "waits": {
            "waitP50": series(&|m| m["waitSecondsP50"].clone()),
            "waitP90": series(&|m| m["waitSecondsP90"].clone()),
            "estimateP50": series(&|m| m["estimateSecondsP50"].clone()),
            "estimateP90": series(&|m| m["estimateSecondsP90"].clone()),
        },
        "orders": {
            "admitted": series(&|m| m["admitted"].clone()),
            "orders": series(&|m| m["orders"].clone()),
        },
        "conversion": {
            "ordersPerAdmission": Value::Array(running_orders_per_admission(minutes)),
        },
    });
    (totals, charts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_page_draws_the_reports_numbers() {
    // A minute boundary (2027-01-15T08:00Z), so the sale's minutes are whole.
    let clock = ManualClock::new(30_000_000 * 60_000);
    let app = TestApp::builder()
        .clock(Arc::new(clock.clone()))
        .admission_stepped_by_test()
        .configure(|config| config.waiting_room.poll_burst = 100)
        .spawn()
        .await;
    simulate_sale(&app, &clock).await;
    let report: Value = app
        .get(&format!("/v1/admin/queues/{QUEUE}/report"))
        .await
        .json()
        .await
        .unwrap();
    assert!(report["minutes"].as_array().unwrap().len() >= 15, "{report}");
    assert!(report["totals"]["abandoned"].as_u64().unwrap() > 0, "{report}");

    let scratch = tempfile::tempdir().expect("a scratch dir for the screenshot");
    let shots = if std::env::var_os("RANKGATE_UPDATE_SCREENSHOTS").is_some() {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots")
    } else {
        scratch.path().to_path_buf()
    };
    std::fs::create_dir_all(&shots).expect("the screenshot dir");
    let address = std::ffi::OsString::from(&app.address);
    let mut node = NodeScript::start(
        "report_page.mjs",
        &[address.as_os_str(), QUEUE.as_ref(), shots.as_os_str()],
    );
    let mut seen = Vec::new();
    let run = async {
        while let Some(line) = node.next_line().await {
            seen.push(line);
        }
        node
    };
    let node = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the browser run finishes within 120 s");
    node.finish(&seen).await;
    assert_eq!(seen.last().map(String::as_str), Some("DONE"), "{seen:?}");
    let drawn: Value = seen
        .iter()
        .find_map(|line| line.strip_prefix("DRAWN "))
        .map(|json| serde_json::from_str(json).expect("DRAWN is JSON"))
        .expect("the script says what it drew");

    let (totals, charts) = expected_drawing(&report);
    assert_eq!(drawn["totals"], totals, "the totals as shown");
    for (chart, series) in charts.as_object().unwrap() {
        for (key, values) in series.as_object().unwrap() {
            assert_eq!(
                drawn["charts"][chart]["series"][key]["values"], *values,
                "{chart}/{key} draws the report's minutes"
            );
        }
    }
    let bytes = std::fs::metadata(shots.join("report.png"))
        .expect("report.png")
        .len();
    assert!(bytes > 10_000, "report.png is a real screenshot ({bytes} bytes)");
    app.stop().await;
}
