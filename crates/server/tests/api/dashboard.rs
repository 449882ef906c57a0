//! The dashboard's history (issue 30): `GET /v1/admin/dashboard/history` is an admin route, checks
//! `minutes`, and its series are what the service did: the events/s of a window times its interval sum
//! to the events accepted, a queue's admitted/s and refused/s to its admissions and refusals, and its
//! last waiting count is the admin view's. The page itself is tested in Chromium
//! (`tests/browser/dashboard.rs`).

use std::time::Duration;

use rankgate_core::queue::{QueueName, RefusalReason};
use serde_json::{json, Value};

use crate::helpers::*;

const ADMIN_KEY: &str = "k-dash";

/// A client that sends the admin key with every request.
fn admin_client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {ADMIN_KEY}").parse().unwrap(),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

/// The sum of a series' values times the interval (a rate series' count over the window).
fn count(series: &Value, interval: f64) -> f64 {
    series
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap_or(0.0) * interval)
        .sum()
}

fn last_waiting(history: &Value, queue: &str) -> Option<u64> {
    history["queues"][queue]["waiting"].as_array()?.last()?.as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_is_an_admin_route_and_checks_minutes() {
    let app = TestApp::builder()
        .configure(|config| with_keys(config, &[ADMIN_KEY], &[]))
        .spawn()
        .await;
    let url = app.url("/v1/admin/dashboard/history");
    let anonymous = reqwest::Client::new();
    assert_eq!(anonymous.get(&url).send().await.unwrap().status(), 401);
    let wrong = anonymous.get(&url).bearer_auth("k-other").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let answer = anonymous.get(&url).bearer_auth(ADMIN_KEY).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let history: Value = answer.json().await.unwrap();
    assert_eq!(history["minutes"], 10, "the default window");
    assert_eq!(history["intervalSeconds"], 1);
    assert_eq!(history["maxQueuesTracked"], 100);
    for bad in ["0", "61", "ten", "", "-1", "1.5", "99999999999999999999"] {
        let answer = anonymous
            .get(format!("{url}?minutes={bad}"))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 400, "minutes={bad}");
        let body: Value = answer.json().await.unwrap();
        assert!(
            body["error"].as_str().unwrap().starts_with("minutes:"),
            "minutes={bad}: {body}"
        );
    }
    for (minutes, interval) in [(1, 1), (10, 1), (11, 10), (60, 10)] {
        let answer = anonymous
            .get(format!("{url}?minutes={minutes}"))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .unwrap();
        let history: Value = answer.json().await.unwrap();
        assert_eq!(history["intervalSeconds"], interval, "minutes={minutes}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_counts_what_was_ingested_admitted_and_refused() {
    let app = TestApp::builder()
        .configure(|config| with_keys(config, &[ADMIN_KEY], &[]))
        .admission_stepped_by_test()
        .client(admin_client())
        .spawn()
        .await;
    let now = now_millis();
    // 30 events, then the same 30 again (duplicates, not accepted) with 12 new ones: 42 accepted.
    let first: Vec<Value> = (0..30)
        .map(|i| view(&format!("e{i}"), &format!("p{}", i % 4), now, &["toys"]))
        .collect();
    let mut second = first.clone();
    second.extend((30..42).map(|i| view(&format!("e{i}"), "p9", now, &["toys"])));
    for batch in [first, second] {
        let answer = app.post_events(&Value::Array(batch)).await;
        assert_eq!(answer.status(), 200);
    }
    let accepted = 42.0;

    // "sale": 9 enter, one admission step admits 4 a second's worth; "quiet": 2 wait, paused.
    let put = app
        .put_json(
            "/v1/admin/queues/sale",
            &json!({ "admitPerSecond": 4, "tickMillis": 1000 }),
        )
        .await;
    assert_eq!(put.status(), 200);
    let put = app
        .put_json("/v1/admin/queues/quiet", &json!({ "paused": true }))
        .await;
    assert_eq!(put.status(), 200);
    for i in 0..9 {
        let answer = app
            .post_json("/v1/queues/sale/entries", &json!({ "memberId": format!("m{i}") }))
            .await;
        assert_eq!(answer.status(), 200);
    }
    for i in 0..2 {
        let answer = app
            .post_json(
                "/v1/queues/quiet/entries",
                &json!({ "memberId": format!("q{i}") }),
            )
            .await;
        assert_eq!(answer.status(), 200);
    }
    let room = &app.state.waiting_room;
    let sale = QueueName::parse("sale").unwrap();
    let admitted: usize = room
        .admit_due_queues()
        .await
        .unwrap()
        .into_iter()
        .filter(|(queue, _)| *queue == sale)
        .map(|(_, outcome)| outcome.admitted.len())
        .sum();
    assert!(
        (1..9).contains(&admitted),
        "some admitted, some left waiting: {admitted}"
    );
    for reason in [
        RefusalReason::Address,
        RefusalReason::Challenge,
        RefusalReason::Address,
    ] {
        room.count_refusal_for_tests(&sale, reason).await;
    }
    let sale_view = app.get_json("/v1/admin/queues/sale").await;
    let sale_waiting = sale_view["waiting"].as_u64().unwrap();
    assert_eq!(sale_waiting, 9 - admitted as u64);
    let list = app.get_json("/v1/admin/queues").await;
    assert_eq!(list["counts"]["quiet"]["waiting"], 2);

    // The sampler records a point a second and the gauges worker reads the queues once a second: a few
    // seconds after the last change, the window holds all of it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let history = loop {
        let history = app.get_json("/v1/admin/dashboard/history?minutes=10").await;
        let settled = count(&history["eventsPerSecond"], 1.0) == accepted
            && count(&history["queues"]["sale"]["admittedPerSecond"], 1.0) == admitted as f64
            && count(&history["queues"]["sale"]["refusedPerSecond"], 1.0) == 3.0
            && last_waiting(&history, "sale") == Some(sale_waiting)
            && last_waiting(&history, "quiet") == Some(2);
        if settled || tokio::time::Instant::now() > deadline {
            break history;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(history["intervalSeconds"], 1);
    assert_eq!(
        count(&history["eventsPerSecond"], 1.0),
        accepted,
        "events/s × 1 s sums to the events accepted (duplicates are not): {history}"
    );
    let series = &history["queues"]["sale"];
    assert_eq!(
        count(&series["admittedPerSecond"], 1.0),
        admitted as f64,
        "{series}"
    );
    assert_eq!(count(&series["refusedPerSecond"], 1.0), 3.0, "{series}");
    assert_eq!(count(&series["abandonedPerSecond"], 1.0), 0.0, "{series}");
    assert_eq!(
        last_waiting(&history, "sale"),
        Some(sale_waiting),
        "waiting is the admin view's"
    );
    assert_eq!(last_waiting(&history, "quiet"), Some(2), "{history}");
    // The waiting count right after the admission was read by a gauges round too: it appears in the
    // series, and nothing above what ever waited does.
    let waits: Vec<Option<u64>> = series["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .map(Value::as_u64)
        .collect();
    assert!(waits.iter().flatten().all(|w| *w <= 9), "{waits:?}");

    // Every series is aligned with `times`, which rise a second apart.
    let times: Vec<i64> = history["times"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect();
    assert!(times.len() >= 2, "{history}");
    assert!(times.windows(2).all(|w| w[1] > w[0]), "{times:?}");
    for key in ["eventsPerSecond", "freshnessLagSeconds"] {
        assert_eq!(history[key].as_array().unwrap().len(), times.len(), "{key}");
    }
    for queue in ["sale", "quiet"] {
        for key in [
            "waiting",
            "admittedPerSecond",
            "abandonedPerSecond",
            "refusedPerSecond",
        ] {
            assert_eq!(
                history["queues"][queue][key].as_array().unwrap().len(),
                times.len(),
                "{queue}/{key}"
            );
        }
    }
    // The freshness lag after the ingest: the time since the newest event served, known and small.
    let lag = history["freshnessLagSeconds"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_f64()
        .expect("known after an ingest");
    assert!((0.0..120.0).contains(&lag), "{lag}");
    assert_eq!(history["queuesNotTracked"], 0);

    // The hour's window holds the same counts in ten-second points, once the ten seconds holding them
    // have closed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    let hour = loop {
        let hour = app.get_json("/v1/admin/dashboard/history?minutes=60").await;
        let done = count(&hour["eventsPerSecond"], 10.0).round() == accepted
            && count(&hour["queues"]["sale"]["admittedPerSecond"], 10.0).round() == admitted as f64;
        if done || tokio::time::Instant::now() > deadline {
            break hour;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(hour["intervalSeconds"], 10);
    assert_eq!(count(&hour["eventsPerSecond"], 10.0).round(), accepted, "{hour}");
    assert_eq!(
        count(&hour["queues"]["sale"]["admittedPerSecond"], 10.0).round(),
        admitted as f64,
        "{hour}"
    );
    assert_eq!(
        count(&hour["queues"]["sale"]["refusedPerSecond"], 10.0).round(),
        3.0,
        "{hour}"
    );
}
