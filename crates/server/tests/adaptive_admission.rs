//! Adaptive admission (issue 12) over real HTTP, against a real test order service that slows down, fails,
//! and recovers: the controller backs off, admissions follow the rate it sets, and it climbs back.
//!
//! Each instance is the whole service (`spawn_app`: `Application::build_with_clock`, its edge, fast path
//! and gate). Time is a [`ManualClock`]: each step of a scenario is one control interval (1 s of the
//! clock), in which the test runs the control round and the admission step itself (the background loops'
//! periods are longer than the test), then sends every admitted member's order through the gate. Only the
//! upstream's latency is real (it sleeps), so the bounds checked are the controller's arithmetic on what
//! it measured, not the machine's speed: a loaded machine can only make the healthy phase look slower,
//! which the generous targets absorb.

#[path = "support/app.rs"]
mod app;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rankgate::waiting_room::{GateConfig, GateRoute, WaitingRoom, WaitingRoomConfig};
use rankgate_store::clock::ManualClock;
use rankgate_testkit::redis_servers::{standalone_url, unique_prefix, KeyCleanup};
use serde_json::{json, Value};

use app::TestApp;

/// A whole second plus 600 ms: orders land 600 ms into an interval, and one step later the interval is
/// past its grace (half an interval) and closes.
const START_MS: i64 = 1_780_000_000_600;
const QUEUE: &str = "sale";
/// Healthy answers take this long; the target is far above it, so a busy machine does not matter.
const FAST_MILLIS: u64 = 2;
/// Slow answers take this long; the target (150 ms) is far below it.
const SLOW_MILLIS: u64 = 400;
const TOKEN_SECRET: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";

/// The order service: answers after `delay_ms`, with a 500 for every `fail_one_in`-th order (0: never).
#[derive(Clone, Default)]
struct OrderService {
    delay_ms: Arc<AtomicU64>,
    fail_one_in: Arc<AtomicU64>,
    orders: Arc<AtomicUsize>,
}

impl OrderService {
    async fn spawn(&self) -> SocketAddr {
        let service = self.clone();
        let router = axum::Router::new().route(
            "/orders",
            axum::routing::post(move || {
                let service = service.clone();
                async move {
                    let n = service.orders.fetch_add(1, Ordering::SeqCst) as u64 + 1;
                    tokio::time::sleep(Duration::from_millis(service.delay_ms.load(Ordering::SeqCst))).await;
                    let fail_one_in = service.fail_one_in.load(Ordering::SeqCst);
                    if fail_one_in > 0 && n.is_multiple_of(fail_one_in) {
                        (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "overloaded")
                    } else {
                        (axum::http::StatusCode::CREATED, "order taken")
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
        address
    }

    fn behave(&self, delay_ms: u64, fail_one_in: u64) {
        self.delay_ms.store(delay_ms, Ordering::SeqCst);
        self.fail_one_in.store(fail_one_in, Ordering::SeqCst);
    }
}

fn config_with_gate(upstream: SocketAddr) -> WaitingRoomConfig {
    WaitingRoomConfig {
        poll_burst: 10_000,
        token_secret: Some(TOKEN_SECRET.into()),
        adaptive_interval_millis: 1000,
        adaptive_min_samples: 5,
        gates: vec![GateConfig {
            queue: QUEUE.into(),
            upstream: format!("http://{upstream}"),
            routes: vec![GateRoute {
                method: "POST".into(),
                path: "/orders".into(),
                prefix: false,
            }],
            timeout_millis: 5_000,
            max_body_bytes: 65_536,
        }],
        ..WaitingRoomConfig::default()
    }
}

/// One instance: the whole service on `clock` with `waiting_room` as its `[waiting_room]`, on the embedded
/// store or on `redis` (URLs, key prefix). Its admission and control rounds are the test's to run.
async fn spawn_instance(
    clock: &ManualClock,
    waiting_room: WaitingRoomConfig,
    redis: Option<(Vec<String>, String)>,
) -> TestApp {
    TestApp::builder()
        .clock(Arc::new(clock.clone()))
        .configure(move |config| {
            config.waiting_room = waiting_room;
            // Every shopper here enters from 127.0.0.1: no per-address budget (issue 28).
            config.waiting_room.entries_per_address_per_minute = 0;
            if let Some((urls, prefix)) = redis {
                config.redis = urls;
                config.redis_prefix = prefix;
            }
        })
        .admission_stepped_by_test()
        .spawn()
        .await
}

/// The instance's waiting room, whose steps the test runs.
fn room(instance: &TestApp) -> &Arc<WaitingRoom> {
    &instance.state.waiting_room
}

/// What one step (control interval) of a scenario saw.
#[derive(Debug, Clone)]
struct Step {
    phase: &'static str,
    /// The rate the controller set at the start of the step (from the previous interval's orders).
    rate: f64,
    decision: Option<String>,
    /// Orders measured in the previous interval, over every instance.
    samples: u64,
    /// Members admitted in this step, over every instance.
    admitted: usize,
    /// Orders the test sent through the gates in the previous step.
    ordered_before: usize,
}

struct Scenario {
    instances: Vec<TestApp>,
    clock: ManualClock,
    client: reqwest::Client,
    service: OrderService,
    steps: Vec<Step>,
    ordered_last_step: usize,
}

impl Scenario {
    async fn put(&self, body: Value) -> reqwest::Response {
        self.client
            .put(format!("{}/v1/admin/queues/{QUEUE}", self.instances[0].address))
            .json(&body)
            .send()
            .await
            .expect("put")
    }

    async fn admin_view(&self, instance: usize) -> Value {
        let response = self
            .client
            .get(format!(
                "{}/v1/admin/queues/{QUEUE}",
                self.instances[instance].address
            ))
            .send()
            .await
            .expect("get");
        assert_eq!(response.status(), 200);
        response.json().await.expect("json")
    }

    async fn enter(&self, members: usize) {
        for i in 0..members {
            let response = self
                .client
                .post(format!(
                    "{}/v1/queues/{QUEUE}/entries",
                    self.instances[i % self.instances.len()].address
                ))
                .json(&json!({ "memberId": format!("m-{i}") }))
                .send()
                .await
                .expect("enter");
            assert_eq!(response.status(), 200);
        }
    }

    /// One control interval: the clock moves a second; every instance runs its control round (exactly one
    /// closes the interval) and its admission step; every admitted member orders through an instance's
    /// gate (members spread over instances).
    async fn step(&mut self, phase: &'static str) {
        // Just after the interval's end every instance flushes its orders of it (a round closes nothing:
        // the interval is still in its grace) ...
        self.clock.advance(400);
        for instance in &self.instances {
            let early = room(instance)
                .run_adaptive_control()
                .await
                .expect("control round");
            // (The very first round closes the interval before the scenario began: it had no attempt yet.)
            assert!(
                early.is_empty() || self.steps.is_empty(),
                "nothing closes inside the grace: {early:?}"
            );
        }
        // ... and past the grace one of them closes it.
        self.clock.advance(600);
        let mut summaries = Vec::new();
        for instance in &self.instances {
            summaries.extend(
                room(instance)
                    .run_adaptive_control()
                    .await
                    .expect("control round"),
            );
        }
        assert_eq!(
            summaries.len(),
            1,
            "exactly one instance closes each interval: {summaries:?}"
        );
        let summary = summaries.pop().expect("one summary").1;
        let mut admitted = Vec::new();
        for instance in &self.instances {
            for (_, outcome) in room(instance).admit_due_queues().await.expect("admission step") {
                admitted.extend(outcome.admitted.into_iter().map(|m| m.to_string()));
            }
        }
        let orders = admitted.iter().enumerate().map(|(i, member)| {
            let instance = &self.instances[i % self.instances.len()];
            let base = instance.address.clone();
            let ticket = instance.ticket(QUEUE, member);
            let client = self.client.clone();
            let member = member.clone();
            async move {
                let position: Value = client
                    .get(format!("{base}/v1/queues/{QUEUE}/entries/{member}"))
                    .header("x-queue-ticket", &ticket)
                    .send()
                    .await
                    .expect("poll")
                    .json()
                    .await
                    .expect("position");
                let token = position["entryToken"]
                    .as_str()
                    .expect("READY with a token")
                    .to_string();
                let response = client
                    .post(format!("{base}/orders"))
                    .header("x-member-id", &member)
                    .header("x-queue-ticket", &ticket)
                    .header("x-entry-token", token)
                    .body("{}")
                    .send()
                    .await
                    .expect("order");
                assert!(
                    response.status() == 201 || response.status() == 500,
                    "the upstream's answer passes through: {}",
                    response.status()
                );
            }
        });
        futures_util::future::join_all(orders).await;
        self.steps.push(Step {
            phase,
            rate: summary.effective_admit_per_second,
            decision: summary.decision.map(|d| format!("{d:?}")),
            samples: summary.samples,
            admitted: admitted.len(),
            ordered_before: self.ordered_last_step,
        });
        self.ordered_last_step = admitted.len();
    }

    fn last(&self, phase: &str) -> &Step {
        self.steps
            .iter()
            .rev()
            .find(|s| s.phase == phase)
            .expect("phase ran")
    }

    fn timeline(&self) -> String {
        self.steps
            .iter()
            .map(|s| {
                format!(
                    "{:<8} rate {:>6.2} {:<16} samples {:>3} admitted {:>3}\n",
                    s.phase,
                    s.rate,
                    s.decision.as_deref().unwrap_or("-"),
                    s.samples,
                    s.admitted
                )
            })
            .collect()
    }
}

/// The scenario on any set of instances sharing one store: healthy, slow (p95 over the target), failing
/// (5xx over the threshold), healthy again.
async fn slow_then_failing_then_recovering(mut scenario: Scenario) {
    let response = scenario
        .put(json!({
            "admissionMode": "adaptive", "minAdmitPerSecond": 6, "maxAdmitPerSecond": 46,
            "targetP95Millis": 150, "maxErrorRate": 0.05, "admitPerSecond": 20, "tickMillis": 1000
        }))
        .await;
    assert_eq!(response.status(), 200);
    let settings: Value = response.json().await.expect("json");
    assert_eq!(settings["admissionMode"], "adaptive");
    assert_eq!(settings["admitPerSecond"], 20);
    scenario.enter(1_500).await;

    scenario.service.behave(FAST_MILLIS, 0);
    for _ in 0..6 {
        scenario.step("healthy").await;
    }
    scenario.service.behave(SLOW_MILLIS, 0);
    for _ in 0..4 {
        scenario.step("slow").await;
    }
    let during_slow = scenario.admin_view(scenario.instances.len() - 1).await;
    scenario.service.behave(FAST_MILLIS, 5);
    for _ in 0..3 {
        scenario.step("failing").await;
    }
    scenario.service.behave(FAST_MILLIS, 0);
    for _ in 0..8 {
        scenario.step("recover").await;
    }
    let timeline = scenario.timeline();
    println!("{timeline}");

    // Every interval with orders was measured whole, over every instance.
    for step in scenario.steps.iter().skip(1) {
        assert_eq!(
            step.samples, step.ordered_before as u64,
            "the controller saw every instance's orders of the interval\n{timeline}"
        );
    }
    // Healthy: the rate climbed by (46 − 6) / 20 = 2 per interval from 20.
    let healthy = scenario.last("healthy");
    assert!(healthy.rate >= 26.0, "healthy rate rose\n{timeline}");
    // Slow: p95 above the target, the rate fell multiplicatively.
    let slow = scenario.last("slow");
    assert!(
        scenario
            .steps
            .iter()
            .filter(|s| s.phase == "slow")
            .skip(1)
            .all(|s| s.decision.as_deref() == Some("BackOffLatency")),
        "{timeline}"
    );
    assert!(
        slow.rate <= healthy.rate * 0.7 * 0.7 + 0.01,
        "slow rate fell\n{timeline}"
    );
    assert!(
        during_slow["upstreamP95Millis"].as_f64().expect("p95 shown") >= SLOW_MILLIS as f64,
        "{during_slow}"
    );
    assert_eq!(during_slow["admissionMode"], "adaptive");
    // Failing: 20 % 5xx is above the 5 % threshold.
    assert!(
        scenario
            .steps
            .iter()
            .filter(|s| s.phase == "failing")
            .skip(1)
            .all(|s| s.decision.as_deref() == Some("BackOffErrors")),
        "{timeline}"
    );
    let failing = scenario.last("failing");
    assert!(failing.rate >= 6.0, "never below the minimum\n{timeline}");
    // Recovered: climbing again, 2 per interval.
    let recovered = scenario.last("recover");
    assert!(recovered.rate >= failing.rate + 10.0, "recovered\n{timeline}");
    assert!(recovered.rate <= 46.0);
    // Admissions follow the rate: each step admits at most one tick at the step's rate (rounded up), and
    // with 1,500 waiting, never much less.
    for step in &scenario.steps {
        assert!(
            step.admitted as f64 <= step.rate.ceil() + 1.0,
            "admitted {} at rate {}\n{timeline}",
            step.admitted,
            step.rate
        );
        assert!(
            step.admitted as f64 >= step.rate.floor() - 3.0,
            "admitted {} at rate {}\n{timeline}",
            step.admitted,
            step.rate
        );
    }
    // Every instance's admin view shows the same controller state.
    for instance in 0..scenario.instances.len() {
        let view = scenario.admin_view(instance).await;
        assert_eq!(
            view["effectiveAdmitPerSecond"].as_f64(),
            Some(recovered.rate),
            "{view}"
        );
        assert_eq!(view["admitPerSecond"].as_f64(), Some(recovered.rate), "{view}");
        assert_eq!(view["adaptiveDecision"], "increase", "{view}");
        assert_eq!(view["upstreamErrorRate"].as_f64(), Some(0.0), "{view}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adaptive_admission_backs_off_when_the_order_service_slows_or_fails_and_recovers_embedded() {
    let service = OrderService::default();
    let upstream = service.spawn().await;
    let clock = ManualClock::new(START_MS);
    let scenario = Scenario {
        instances: vec![spawn_instance(&clock, config_with_gate(upstream), None).await],
        clock,
        client: reqwest::Client::new(),
        service,
        steps: Vec::new(),
        ordered_last_step: 0,
    };
    slow_then_failing_then_recovering(scenario).await;
}

/// Two instances sharing Redis: each forwards half the orders, the controller of each interval sees both
/// halves, exactly one instance decides per interval, and the two admission steps together admit within
/// the controller's rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adaptive_admission_is_global_across_two_instances_sharing_redis() {
    let service = OrderService::default();
    let upstream = service.spawn().await;
    let clock = ManualClock::new(START_MS);
    let prefix = unique_prefix();
    let _cleanup = KeyCleanup::standalone(prefix.clone());
    let redis = (vec![standalone_url()], prefix);
    let mut instances = Vec::new();
    for _ in 0..2 {
        instances.push(spawn_instance(&clock, config_with_gate(upstream), Some(redis.clone())).await);
    }
    let scenario = Scenario {
        instances,
        clock,
        client: reqwest::Client::new(),
        service,
        steps: Vec::new(),
        ordered_last_step: 0,
    };
    slow_then_failing_then_recovering(scenario).await;
}

/// Hostile adaptive settings get a 400 naming the field and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_adaptive_settings_get_400_naming_the_field() {
    let service = OrderService::default();
    let upstream = service.spawn().await;
    let clock = ManualClock::new(START_MS);
    let app = spawn_instance(&clock, config_with_gate(upstream), None).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/admin/queues/{QUEUE}", app.address);
    let ok = client
        .put(&url)
        .json(&json!({"admitPerSecond": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let before: Value = client.get(&url).send().await.unwrap().json().await.unwrap();
    for (body, field) in [
        (json!({"admissionMode": "turbo"}), "admissionMode"),
        (json!({"admissionMode": 1}), "admissionMode"),
        (json!({"minAdmitPerSecond": 0}), "minAdmitPerSecond"),
        (json!({"minAdmitPerSecond": -5}), "minAdmitPerSecond"),
        (json!({"minAdmitPerSecond": "5"}), "minAdmitPerSecond"),
        (
            json!({"minAdmitPerSecond": 50, "maxAdmitPerSecond": 20}),
            "minAdmitPerSecond",
        ),
        (json!({"maxAdmitPerSecond": 1e300}), "maxAdmitPerSecond"),
        (json!({"maxAdmitPerSecond": null}), "maxAdmitPerSecond"),
        (
            json!({"admissionMode": "adaptive", "maxAdmitPerSecond": 150000}),
            "maxAdmitPerSecond",
        ),
        (
            json!({"admissionMode": "adaptive", "maxAdmitPerSecond": 5000, "tickMillis": 60000}),
            "maxAdmitPerSecond",
        ),
        (json!({"targetP95Millis": 0}), "targetP95Millis"),
        (json!({"targetP95Millis": 1.5}), "targetP95Millis"),
        (json!({"targetP95Millis": 600001}), "targetP95Millis"),
        (json!({"targetP95Millis": -1}), "targetP95Millis"),
        (json!({"maxErrorRate": 0}), "maxErrorRate"),
        (json!({"maxErrorRate": 2}), "maxErrorRate"),
        (json!({"maxErrorRate": true}), "maxErrorRate"),
    ] {
        let response = client.put(&url).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.unwrap();
        let text = error.to_string();
        assert!(text.contains(field), "{body} → {text}");
    }
    // A number too large for JSON's doubles is refused too (the body never parses to a settings patch).
    let huge = client
        .put(&url)
        .header("content-type", "application/json")
        .body(r#"{"maxAdmitPerSecond": 1e400}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), 400);
    let after: Value = client.get(&url).send().await.unwrap().json().await.unwrap();
    assert_eq!(after, before, "refused PUTs changed nothing");
    assert_eq!(after["admissionMode"], "fixed");
    assert_eq!(after["effectiveAdmitPerSecond"], 10.0);
    assert_eq!(after["upstreamP95Millis"], Value::Null);
}

/// The `rankgate demo` scene: the order service degrades mid-sale, admission backs off, few orders fail
/// compared with a fixed rate, and it recovers afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_adaptive_demo_backs_off_while_the_order_service_is_degraded_and_recovers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut out = Vec::new();
    let report = rankgate::demo::adaptive_admission::run_adaptive_admission_demo(dir.path(), &[], &mut out)
        .await
        .expect("demo runs");
    let printed = String::from_utf8(out).expect("utf-8");
    println!("{printed}");
    let healthy = report.last_rate("healthy").expect("healthy phase");
    let degraded = report.last_rate("degraded").expect("degraded phase");
    let recovered = report.last_rate("recovered").expect("recovered phase");
    assert!(healthy >= 38.0, "healthy climbs to the maximum\n{printed}");
    assert!(
        degraded <= rankgate::demo::adaptive_admission::DEGRADED_CAPACITY as f64 * 1.5,
        "backed off near what the service takes\n{printed}"
    );
    assert!(recovered >= 30.0, "recovered\n{printed}");
    // A fixed 40/s would fail 17.5 % of orders while degraded.
    assert!(report.error_rate("degraded") < 0.08, "errors stay low\n{printed}");
    assert_eq!(report.error_rate("healthy"), 0.0);
    assert!(printed.contains("rate/s"), "a timeline is printed");
}

/// A timeout is an upstream error (and its latency is at least the gate's timeout); a queue in fixed mode
/// is measured and shown but its rate is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_timeout_counts_as_an_error_and_fixed_queues_are_measured_not_controlled() {
    let service = OrderService::default();
    service.behave(3_000, 0);
    let upstream = service.spawn().await;
    let clock = ManualClock::new(START_MS);
    let mut config = config_with_gate(upstream);
    config.gates[0].timeout_millis = 200;
    config.adaptive_min_samples = 1;
    let app = spawn_instance(&clock, config, None).await;
    let room = room(&app);
    let client = reqwest::Client::new();
    let put = client
        .put(format!("{}/v1/admin/queues/{QUEUE}", app.address))
        .json(&json!({"admitPerSecond": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    room.run_adaptive_control().await.expect("first round");
    let entered = client
        .post(format!("{}/v1/queues/{QUEUE}/entries", app.address))
        .json(&json!({"memberId": "m-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(entered.status(), 200);
    room.admit_due_queues().await.expect("admission");
    let position: Value = client
        .get(format!("{}/v1/queues/{QUEUE}/entries/m-1", app.address))
        .header("x-queue-ticket", app.ticket(QUEUE, "m-1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let order = client
        .post(format!("{}/orders", app.address))
        .header("x-member-id", "m-1")
        .header("x-queue-ticket", app.ticket(QUEUE, "m-1"))
        .header("x-entry-token", position["entryToken"].as_str().expect("token"))
        .send()
        .await
        .unwrap();
    assert_eq!(order.status(), 504, "the gate timed out");
    clock.advance(1000);
    let decided = room.run_adaptive_control().await.expect("control round");
    let summary = &decided.first().expect("the interval closed").1;
    assert_eq!(summary.samples, 1);
    assert_eq!(summary.error_rate, Some(1.0));
    assert!(summary.p95_millis.unwrap() >= 200.0, "{summary:?}");
    assert_eq!(summary.decision, None, "fixed mode: measured, not controlled");
    let view: Value = client
        .get(format!("{}/v1/admin/queues/{QUEUE}", app.address))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["upstreamErrorRate"], 1.0, "{view}");
    assert_eq!(view["adaptiveDecision"], Value::Null, "{view}");
    assert_eq!(view["admitPerSecond"], 10, "{view}");
}
