//! The sale's report and the `refused` counts (issue 28, SPEC 2.5), over HTTP: the test enters members,
//! polls, steps admission on a manual clock, claims and consumes some, leaves two to be abandoned, and
//! records refusals as the entry guards do; then the report must equal a recount from the test's own
//! log of what it sent and received, minute by minute: arrivals (members it entered), admitted
//! (members it saw turn READY), abandoned (members it stopped polling, dropped before admission),
//! orders (consumes answered 204), refusals by reason, and the wait p50/p90 of each minute's admitted
//! members against the estimates their entries answered. On the embedded store the report survives a
//! restart on the same data dir; on Redis two instances share the queue and the numbers add up.

use std::collections::BTreeMap;
use std::sync::Arc;

use rankgate_core::queue::{QueueName, RefusalReason};
use rankgate_store::clock::{Clock, ManualClock};
use serde_json::{json, Value};

use crate::helpers::*;
use crate::redis_servers;

const QUEUE: &str = "sale-report";
/// A minute boundary (Unix minute 30,000,000) plus 5 s: the first minute holds the opening.
const START_MS: i64 = 30_000_000 * 60_000 + 5_000;
const SECRET: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";

/// What the test sent and what it was answered, by minute of the manual clock.
#[derive(Default)]
struct Log {
    /// Member → (entry ms, the `estimatedWaitSeconds` its entry answered).
    entered: BTreeMap<String, (i64, Option<u64>)>,
    /// Member → the ms at which a poll first answered READY.
    ready: BTreeMap<String, i64>,
    /// Consumes answered 204, by ms.
    orders: Vec<i64>,
    /// Refusals recorded, by ms.
    refused: Vec<(i64, RefusalReason)>,
}

fn minute(ms: i64) -> i64 {
    ms / 60_000
}

/// Nearest-rank percentile of whole seconds (the report's 1 s buckets are exact below 10 minutes).
fn percentile(mut samples: Vec<u64>, fraction: f64) -> Value {
    if samples.is_empty() {
        return Value::Null;
    }
    samples.sort_unstable();
    let rank = ((fraction * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    json!(samples[rank - 1])
}

impl Log {
    /// The report's counts for the minutes of `in_minute`, recounted from the log.
    fn recount(&self, in_minute: impl Fn(i64) -> bool, members_abandoned: u64) -> Value {
        let arrivals = self.entered.values().filter(|(at, _)| in_minute(*at)).count();
        let admitted: Vec<(&String, &i64)> = self.ready.iter().filter(|(_, at)| in_minute(**at)).collect();
        let waits: Vec<u64> = admitted
            .iter()
            .map(|(member, at)| ((**at - self.entered[*member].0) / 1000) as u64)
            .collect();
        let estimates: Vec<u64> = admitted
            .iter()
            .filter_map(|(member, _)| self.entered[*member].1)
            .collect();
        let refused = |reason| {
            self.refused
                .iter()
                .filter(|(at, r)| in_minute(*at) && *r == reason)
                .count()
        };
        json!({
            "arrivals": arrivals,
            "admitted": admitted.len(),
            "abandoned": members_abandoned,
            "orders": self.orders.iter().filter(|at| in_minute(**at)).count(),
            "refused": {
                "challenge": refused(RefusalReason::Challenge),
                "address": refused(RefusalReason::Address),
                "captcha": refused(RefusalReason::Captcha),
            },
            "waitSecondsP50": percentile(waits.clone(), 0.5),
            "waitSecondsP90": percentile(waits, 0.9),
            "estimateSecondsP50": percentile(estimates.clone(), 0.5),
            "estimateSecondsP90": percentile(estimates, 0.9),
        })
    }
}

/// The fields of a report minute (or the totals) that the recount covers.
fn counted(report_part: &Value, with_estimates: bool) -> Value {
    let mut out = json!({});
    let mut keys = vec![
        "arrivals",
        "admitted",
        "abandoned",
        "orders",
        "refused",
        "waitSecondsP50",
        "waitSecondsP90",
    ];
    if with_estimates {
        keys.extend(["estimateSecondsP50", "estimateSecondsP90"]);
    }
    for key in keys {
        out[key] = report_part[key].clone();
    }
    out
}

fn without_estimates(mut recount: Value) -> Value {
    let object = recount.as_object_mut().unwrap();
    object.remove("estimateSecondsP50");
    object.remove("estimateSecondsP90");
    recount
}

struct Sale<'a> {
    apps: &'a [TestApp],
    clock: ManualClock,
    log: Log,
}

impl Sale<'_> {
    fn app(&self, i: usize) -> &TestApp {
        &self.apps[i % self.apps.len()]
    }

    async fn enter(&mut self, i: usize, member: &str) {
        let response = self
            .app(i)
            .post_json(
                &format!("/v1/queues/{QUEUE}/entries"),
                &json!({ "memberId": member }),
            )
            .await;
        assert_eq!(response.status(), 200, "entry of {member}");
        let position: Value = response.json().await.unwrap();
        assert_eq!(position["status"], "WAITING", "{position}");
        let estimate = position["estimatedWaitSeconds"].as_u64();
        self.log
            .entered
            .insert(member.to_owned(), (self.clock.now_millis(), estimate));
    }

    /// Polls every entered member not yet READY and not in `silent`, logging the ones that are.
    async fn poll_waiting(&mut self, silent: &[&str]) {
        let members: Vec<String> = self
            .log
            .entered
            .keys()
            .filter(|m| !self.log.ready.contains_key(*m) && !silent.contains(&m.as_str()))
            .cloned()
            .collect();
        for (i, member) in members.iter().enumerate() {
            let position = self
                .app(i)
                .get_json(&format!("/v1/queues/{QUEUE}/entries/{member}"))
                .await;
            if position["status"] == "READY" {
                self.log.ready.insert(member.clone(), self.clock.now_millis());
            }
        }
    }

    /// One second later: every instance runs its admission step, then the members are polled.
    async fn tick(&mut self, silent: &[&str]) {
        self.clock.advance(1_000);
        for app in self.apps {
            app.state.waiting_room.admit_due_queues().await.unwrap();
        }
        self.poll_waiting(silent).await;
    }

    async fn claim_and_consume(&mut self, i: usize, member: &str) {
        let app = self.app(i);
        let position = app
            .get_json(&format!("/v1/queues/{QUEUE}/entries/{member}"))
            .await;
        let token = position["entryToken"].as_str().expect("a READY member's token");
        let response = app
            .post_json(
                &format!("/v1/queues/{QUEUE}/tokens/claim"),
                &json!({ "memberId": member, "token": token }),
            )
            .await;
        assert_eq!(response.status(), 200, "claim of {member}");
        let claim: Value = response.json().await.unwrap();
        let response = app
            .post_json(
                &format!("/v1/queues/{QUEUE}/tokens/consume"),
                &json!({ "memberId": member, "claimId": claim["claimId"] }),
            )
            .await;
        if response.status() == 204 {
            self.log.orders.push(self.clock.now_millis());
        }
    }

    async fn refuse(&mut self, i: usize, reason: RefusalReason) {
        let queue = QueueName::parse(QUEUE).unwrap();
        self.app(i)
            .state
            .waiting_room
            .count_refusal_for_tests(&queue, reason)
            .await;
        self.log.refused.push((self.clock.now_millis(), reason));
    }

    /// The opening minute: 10 members enter (2 of them never poll again), 3 refusals; admission at 2/s
    /// with `maxActive` 8 lets the 8 in, the 2 silent ones are dropped as abandoned; 3 orders. The next
    /// minute: 2 more enter and are admitted, 1 order, 1 refusal.
    async fn run(&mut self) {
        let response = self.apps[0]
            .put_json(
                &format!("/v1/admin/queues/{QUEUE}"),
                &json!({ "admitPerSecond": 2, "tickMillis": 1000, "maxActive": 8, "abandonAfterSeconds": 5 }),
            )
            .await;
        assert_eq!(response.status(), 200);
        let silent = ["ghost-0", "ghost-1"];
        for i in 0..8 {
            self.enter(i, &format!("m-{i}")).await;
        }
        for (i, ghost) in silent.iter().enumerate() {
            self.enter(i, ghost).await;
        }
        self.refuse(0, RefusalReason::Address).await;
        self.refuse(1, RefusalReason::Address).await;
        self.refuse(0, RefusalReason::Challenge).await;
        for _ in 0..12 {
            self.tick(&silent).await;
        }
        assert_eq!(self.log.ready.len(), 8, "the 8 polling members are in");
        for i in 0..3 {
            self.claim_and_consume(i, &format!("m-{i}")).await;
        }
        // The next minute.
        self.clock.set((minute(START_MS) + 1) * 60_000 + 2_000);
        self.enter(0, "late-0").await;
        self.enter(1, "late-1").await;
        self.refuse(1, RefusalReason::Captcha).await;
        for _ in 0..3 {
            self.tick(&silent).await;
        }
        assert_eq!(self.log.ready.len(), 10, "the late members are in");
        self.claim_and_consume(1, "late-0").await;
        assert_eq!(self.log.orders.len(), 4);
    }

    /// The report, after every instance flushed (a read flushes its own instance only).
    async fn report(&self) -> Value {
        for app in self.apps {
            app.state.waiting_room.flush_sale_reports().await.unwrap();
        }
        self.apps[0]
            .get_json(&format!("/v1/admin/queues/{QUEUE}/report"))
            .await
    }

    fn assert_report_is_the_recount(&self, report: &Value, with_estimates: bool) {
        let first = minute(START_MS);
        let recount = |in_minute: &dyn Fn(i64) -> bool, abandoned| {
            let recount = self.log.recount(in_minute, abandoned);
            if with_estimates {
                recount
            } else {
                without_estimates(recount)
            }
        };
        let minutes = report["minutes"].as_array().expect("minutes");
        assert_eq!(minutes.len(), 2, "{report}");
        assert_eq!(minutes[0]["minute"], "2027-01-15T08:00:00Z");
        assert_eq!(report["firstEntryAt"], minutes[0]["minute"]);
        assert_eq!(
            counted(&minutes[0], with_estimates),
            recount(&|at| minute(at) == first, 2),
            "the opening minute"
        );
        assert_eq!(
            counted(&minutes[1], with_estimates),
            recount(&|at| minute(at) == first + 1, 0),
            "the next minute"
        );
        assert_eq!(
            counted(&report["totals"], with_estimates),
            recount(&|_| true, 2),
            "the totals"
        );
        assert_eq!(report["totals"]["ordersPerAdmission"], json!(0.4));
        assert_eq!(report["minutesKept"], 10_080);
    }
}

fn config_for_test(config: &mut rankgate::config::Config) {
    // The test polls every waiting member each simulated second.
    config.waiting_room.poll_burst = 100;
}

/// Embedded: the report equals the recount, the admin view's `refused` its totals, the page draws it,
/// and a restart on the same data dir reads the same report; deleting the queue deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_equals_a_recount_and_survives_a_restart_on_embedded() {
    let clock = ManualClock::new(START_MS);
    let app = TestApp::builder()
        .clock(Arc::new(clock.clone()))
        .admission_stepped_by_test()
        .configure(config_for_test)
        .spawn()
        .await;
    let apps = [app];
    let mut sale = Sale {
        apps: &apps,
        clock: clock.clone(),
        log: Log::default(),
    };
    sale.run().await;
    let report = sale.report().await;
    sale.assert_report_is_the_recount(&report, true);

    let view = apps[0].get_json(&format!("/v1/admin/queues/{QUEUE}")).await;
    assert_eq!(view["refused"], report["totals"]["refused"]);
    assert_eq!(
        view["refused"],
        json!({ "challenge": 1, "address": 2, "captcha": 1 })
    );

    let page = apps[0].get(&format!("/admin/queues/{QUEUE}/report")).await;
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"<dd data-total="arrivals">12</dd>"#), "{html}");
    assert!(
        html.contains(r#"data-series="admitted" data-values="8,2""#),
        "{html}"
    );

    let [app] = apps;
    let dir = app.stop().await.expect("the app's data dir");
    let app = TestApp::builder()
        .clock(Arc::new(clock.clone()))
        .admission_stepped_by_test()
        .configure(config_for_test)
        .in_temp_dir(dir)
        .spawn()
        .await;
    let mut after = app.get_json(&format!("/v1/admin/queues/{QUEUE}/report")).await;
    after["generatedAt"] = report["generatedAt"].clone();
    assert_eq!(after, report, "the same report after a restart");

    assert_eq!(
        app.delete(&format!("/v1/admin/queues/{QUEUE}")).await.status(),
        204
    );
    assert_eq!(
        app.get(&format!("/v1/admin/queues/{QUEUE}/report"))
            .await
            .status(),
        404
    );
    app.stop().await;
}

/// Redis: two instances enter, admit and consume in turn on one queue; after each flushed, the report
/// (read through either) is the recount of both. The estimate percentiles are left out: each instance
/// knows only the estimates of the members it let in (see `sale_report`'s module doc).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_adds_up_across_two_instances_on_redis() {
    let prefix = redis_servers::unique_prefix();
    let _keys = redis_servers::KeyCleanup {
        nodes: vec![redis_servers::standalone_url()],
        prefix: prefix.clone(),
    };
    let clock = ManualClock::new(START_MS);
    let mut apps = Vec::new();
    for _ in 0..2 {
        let prefix = prefix.clone();
        apps.push(
            TestApp::builder()
                .clock(Arc::new(clock.clone()))
                .admission_stepped_by_test()
                .configure(config_for_test)
                .configure(move |config| {
                    config.redis = vec![redis_servers::standalone_url()];
                    config.redis_prefix = prefix;
                    config.waiting_room.token_secret = Some(SECRET.into());
                })
                .spawn()
                .await,
        );
    }
    let mut sale = Sale {
        apps: &apps,
        clock,
        log: Log::default(),
    };
    sale.run().await;
    let report = sale.report().await;
    sale.assert_report_is_the_recount(&report, false);
    let mut through_the_other = apps[1]
        .get_json(&format!("/v1/admin/queues/{QUEUE}/report"))
        .await;
    through_the_other["generatedAt"] = report["generatedAt"].clone();
    assert_eq!(through_the_other, report);
    let view = apps[1].get_json(&format!("/v1/admin/queues/{QUEUE}")).await;
    assert_eq!(
        view["refused"],
        json!({ "challenge": 1, "address": 2, "captcha": 1 })
    );
    assert_eq!(
        apps[0]
            .delete(&format!("/v1/admin/queues/{QUEUE}"))
            .await
            .status(),
        204
    );
    assert_eq!(
        apps[1]
            .get(&format!("/v1/admin/queues/{QUEUE}/report"))
            .await
            .status(),
        404
    );
    for app in apps {
        app.stop().await;
    }
}
