//! Black-box tests of the waiting room over real HTTP (SPEC Part 2, issue 4).
//!
//! Every test starts the whole service (`spawn_app`: `Application::build_with_clock`, its edge and fast
//! path) on `127.0.0.1:0` with its own data directory and a [`ManualClock`], and drives admission by
//! calling the scheduler step directly instead of sleeping: the background admission loop's period is
//! longer than the test. The six `limitation_*` tests each pin one limitation of the seed's design and
//! say why the seed's design fails them.

#[path = "support/app.rs"]
mod app;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rankgate::waiting_room::{GateConfig, GateRoute, WaitingRoom, WaitingRoomConfig};
use rankgate_store::clock::{Clock, ManualClock};
use rankgate_store::queue::embedded::{EmbeddedOptions, EmbeddedStore};
use rankgate_store::queue::token::TokenSecret;
use serde_json::{json, Value};

use app::TestApp;

const START_MS: i64 = 1_780_000_000_000;

/// The token secret of tests that run more than one instance on one store: the bytes 0, 1, …, 31.
const TOKEN_SECRET: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";

/// The whole service on a manual clock that the test moves.
struct RoomApp {
    app: TestApp,
    clock: ManualClock,
}

impl std::ops::Deref for RoomApp {
    type Target = TestApp;

    fn deref(&self) -> &TestApp {
        &self.app
    }
}

/// A config for tests: no poll limit unless a test wants one.
fn test_config() -> WaitingRoomConfig {
    WaitingRoomConfig {
        poll_burst: 10_000,
        ..WaitingRoomConfig::default()
    }
}

/// An upstream the gate forwards to (a test's own service, not rankgate).
async fn serve_upstream(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
    address
}

/// Starts the service with `config` as its `[waiting_room]`, on `clock`, in `dir` (a fresh one if none).
async fn start(clock: ManualClock, config: WaitingRoomConfig, dir: Option<tempfile::TempDir>) -> RoomApp {
    let mut builder = TestApp::builder()
        .clock(Arc::new(clock.clone()))
        .configure(move |service| {
            service.waiting_room = config;
            // Every member here enters from 127.0.0.1: the per-address budget (issue 28, tested in
            // tests/api/entry_guards.rs) stays off, as `support/app.rs` has it.
            service.waiting_room.entries_per_address_per_minute = 0;
        })
        .admission_stepped_by_test();
    if let Some(dir) = dir {
        builder = builder.in_temp_dir(dir);
    }
    RoomApp {
        app: builder.spawn().await,
        clock,
    }
}

async fn spawn_app(config: WaitingRoomConfig) -> RoomApp {
    start(ManualClock::new(START_MS), config, None).await
}

impl RoomApp {
    fn room(&self) -> &Arc<WaitingRoom> {
        &self.app.state.waiting_room
    }

    /// Stops the service and starts it again on the same data dir and clock.
    async fn restart(self, config: WaitingRoomConfig) -> RoomApp {
        let dir = self.app.stop().await.expect("the app owns its data dir");
        start(self.clock, config, Some(dir)).await
    }
}

impl RoomApp {
    /// Enters `member` as its own client does (with its ticket once it has one).
    async fn enter(&self, queue: &str, member: &str) -> Value {
        let response = self
            .app
            .post_json(
                &format!("/v1/queues/{queue}/entries"),
                &json!({ "memberId": member }),
            )
            .await;
        assert_eq!(response.status(), 200, "enter {member}");
        response.json().await.expect("position json")
    }

    /// Polls as `member`'s client does, with its ticket.
    async fn poll(&self, queue: &str, member: &str) -> reqwest::Response {
        self.app
            .get(&format!("/v1/queues/{queue}/entries/{member}"))
            .await
    }

    async fn position(&self, queue: &str, member: &str) -> Value {
        let response = self.poll(queue, member).await;
        assert_eq!(response.status(), 200, "poll {member}");
        response.json().await.expect("position json")
    }

    async fn put_settings(&self, queue: &str, body: Value) -> reqwest::Response {
        self.client
            .put(format!("{}/v1/admin/queues/{queue}", self.address))
            .json(&body)
            .send()
            .await
            .expect("put")
    }

    async fn queue_stats(&self, queue: &str) -> Value {
        let response = self
            .client
            .get(format!("{}/v1/admin/queues/{queue}", self.address))
            .send()
            .await
            .expect("get");
        assert_eq!(response.status(), 200);
        response.json().await.expect("stats json")
    }

    /// POSTs `body` (a token call with its member's ticket).
    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.app.post_json(path, &body).await
    }

    /// Runs this instance's admission step as if `millis` had passed.
    async fn tick(&self, millis: i64) {
        self.clock.advance(millis);
        self.room().admit_due_queues().await.expect("admission step");
    }

    async fn token_of(&self, queue: &str, member: &str) -> String {
        let position = self.position(queue, member).await;
        assert_eq!(position["status"], "READY", "{member}: {position}");
        position["entryToken"]
            .as_str()
            .expect("token while READY")
            .to_string()
    }

    async fn claim(&self, queue: &str, member: &str, token: &str) -> reqwest::Response {
        self.post(
            &format!("/v1/queues/{queue}/tokens/claim"),
            json!({ "memberId": member, "token": token }),
        )
        .await
    }
}

/// Limitation 1: concurrent first entries by one member produce exactly one position.
/// The seed ran ZSCORE then ZADD: two concurrent first entries both saw "absent" and both wrote a score,
/// the later one moving the member behind everyone who entered in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limitation_1_concurrent_first_entries_get_one_position() {
    let app = Arc::new(spawn_app(test_config()).await);
    let mut tasks = Vec::new();
    for i in 0..50 {
        let first = Arc::clone(&app);
        tasks.push(tokio::spawn(async move { first.enter("sale", "dup").await }));
        let second = Arc::clone(&app);
        tasks.push(tokio::spawn(async move {
            second.enter("sale", &format!("other-{i}")).await
        }));
    }
    let mut dup_ranks = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let position = task.await.expect("task");
        if i % 2 == 0 {
            dup_ranks.push(position["rank"].as_u64().expect("rank"));
        }
    }
    let first = dup_ranks[0];
    assert!(
        dup_ranks.iter().all(|r| *r == first),
        "one position for all 50 entries: {dup_ranks:?}"
    );
    let now = app.position("sale", "dup").await;
    assert_eq!(now["rank"].as_u64(), Some(first), "the position never moved back");
    assert_eq!(app.queue_stats("sale").await["waiting"], 51);
}

/// Limitation 2: the admitting process dies mid-admission; after the restart every member is WAITING or
/// READY. The seed popped (ZPOPMIN) and then stored each token with separate commands: a death between
/// them left popped members with neither entry nor token, NOT_ENTERED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limitation_2_a_crash_during_admission_loses_nobody() {
    let app = spawn_app(test_config()).await;
    for i in 0..120 {
        app.enter("sale", &format!("m-{i}")).await;
    }
    app.tick(0).await;
    app.room()
        .embedded_store()
        .expect("embedded")
        .crash_during_next_commit();
    app.clock.advance(1_000);
    assert!(
        app.room().admit_due_queues().await.is_err(),
        "the crashed commit fails"
    );
    assert_eq!(
        app.poll("sale", "m-0").await.status(),
        503,
        "a crashed store fails closed"
    );

    let restarted = app.restart(test_config()).await;
    let mut ready = 0;
    let mut waiting = 0;
    for i in 0..120 {
        match restarted.position("sale", &format!("m-{i}")).await["status"].as_str() {
            Some("READY") => ready += 1,
            Some("WAITING") => waiting += 1,
            other => panic!("m-{i} is {other:?}: lost between pop and token"),
        }
    }
    assert_eq!(ready + waiting, 120);
    assert_eq!(
        ready, 50,
        "the committed tick survived whole; the crashed one vanished whole"
    );
}

/// Limitation 3: three instances, each running its scheduler, admit no more than `admit_per_second`
/// globally (± one tick). The seed's per-instance batch size let each instance pop its own 50 a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limitation_3_three_instances_share_one_global_rate() {
    let app = spawn_app(WaitingRoomConfig {
        token_secret: Some(TOKEN_SECRET.into()),
        ..test_config()
    })
    .await;
    // Two more instances on the service's own store, which they share in process as instances share
    // Redis in production; only their admission steps matter here, so they serve no HTTP.
    let store = app.room().embedded_store().expect("embedded").clone();
    let secret = TokenSecret::from_bytes(std::array::from_fn(|i| i as u8));
    let mut rooms = vec![Arc::clone(app.room())];
    for _ in 0..2 {
        let room = WaitingRoom::from_stores(
            store.clone(),
            store.clone(),
            store.clone(),
            Arc::new(app.clock.clone()),
            test_config(),
            secret.clone(),
        )
        .expect("room");
        rooms.push(Arc::new(room));
    }
    let clock = app.clock.clone();
    let client = app.client.clone();
    let base = app.address.clone();
    let response = client
        .put(format!("{base}/v1/admin/queues/sale"))
        .json(&json!({ "admitPerSecond": 20, "tickMillis": 1000 }))
        .send()
        .await
        .expect("put");
    assert_eq!(response.status(), 200);
    for i in 0..1_000 {
        let response = client
            .post(format!("{base}/v1/queues/sale/entries"))
            .json(&json!({ "memberId": format!("m-{i}") }))
            .send()
            .await
            .expect("enter");
        assert_eq!(response.status(), 200);
    }
    // Ten seconds; each instance checks every 100 ms and ticks when its own tick is due, out of phase.
    for step in 0..100 {
        clock.advance(100);
        let room = &rooms[step % 3];
        room.admit_due_queues().await.expect("tick");
    }
    let stats: Value = client
        .get(format!("{base}/v1/admin/queues/sale"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let admitted = stats["admittedLastMinute"].as_u64().expect("admittedLastMinute");
    assert!(
        admitted <= 20 * 10 + 20,
        "admitted {admitted} in 10 s at 20/s across 3 instances"
    );
    assert!(
        admitted >= 20 * 9,
        "admitted {admitted}: the shared budget must still be spent"
    );
    assert_eq!(stats["ready"].as_u64(), Some(admitted));
}

/// Limitation 4: one token, one order. Fifty concurrent claims give exactly one 200 (the rest 409); a
/// released claim returns to READY; an abandoned claim is released after `claim_ttl`. The seed validated
/// the token and deleted it after commit, so concurrent requests with one token all passed validation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limitation_4_fifty_concurrent_claims_exactly_one_wins() {
    let app = Arc::new(spawn_app(test_config()).await);
    app.enter("sale", "buyer").await;
    app.tick(0).await;
    let token = app.token_of("sale", "buyer").await;
    assert_eq!(token.len(), 43, "32 bytes, URL-safe base64 without padding");

    let mut tasks = Vec::new();
    for _ in 0..50 {
        let app = Arc::clone(&app);
        let token = token.clone();
        tasks.push(tokio::spawn(async move {
            let response = app.claim("sale", "buyer", &token).await;
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.ok())
        }));
    }
    let mut claim_ids = Vec::new();
    let mut conflicts = 0;
    for task in tasks {
        match task.await.expect("task") {
            (200, Some(body)) => claim_ids.push(body["claimId"].as_str().expect("claimId").to_string()),
            (409, _) => conflicts += 1,
            (status, body) => panic!("unexpected {status}: {body:?}"),
        }
    }
    assert_eq!(claim_ids.len(), 1, "exactly one claim wins");
    assert_eq!(conflicts, 49);
    assert_eq!(app.position("sale", "buyer").await["status"], "CLAIMED");

    let released = app
        .post(
            "/v1/queues/sale/tokens/release",
            json!({ "memberId": "buyer", "claimId": claim_ids[0] }),
        )
        .await;
    assert_eq!(released.status(), 204);
    assert_eq!(
        app.position("sale", "buyer").await["status"],
        "READY",
        "a released claim returns to READY"
    );

    // An abandoned claim comes back after claim_ttl (30 s by default).
    let abandoned = app.claim("sale", "buyer", &token).await;
    assert_eq!(abandoned.status(), 200);
    app.clock.advance(30_000);
    app.room().expire_due_everywhere().await.expect("expiry");
    assert_eq!(app.position("sale", "buyer").await["status"], "READY");

    let claim: Value = app
        .claim("sale", "buyer", &token)
        .await
        .json()
        .await
        .expect("json");
    let claim_id = claim["claimId"].as_str().expect("claimId");
    let consumed = app
        .post(
            "/v1/queues/sale/tokens/consume",
            json!({ "memberId": "buyer", "claimId": claim_id }),
        )
        .await;
    assert_eq!(consumed.status(), 204);
    let again = app
        .post(
            "/v1/queues/sale/tokens/consume",
            json!({ "memberId": "buyer", "claimId": claim_id }),
        )
        .await;
    assert_eq!(again.status(), 204, "consume is idempotent");
    assert_eq!(
        app.claim("sale", "buyer", &token).await.status(),
        401,
        "a consumed token buys nothing more"
    );
    let after = app.position("sale", "buyer").await;
    assert_eq!(after["status"], "NOT_ENTERED");
    assert_eq!(after["lastOutcome"], "CONSUMED");
}

/// Limitation 5: the estimate comes from measured throughput and follows a change of rate. The seed
/// computed `rank / 50` whatever the real admission rate was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limitation_5_wait_estimate_follows_a_change_of_rate() {
    let app = spawn_app(test_config()).await;
    for i in 0..3_000 {
        app.enter("sale", &format!("m-{i:05}")).await;
    }
    for _ in 0..20 {
        app.tick(1_000).await;
    }
    let fast = app.position("sale", "m-02999").await;
    let rank = fast["rank"].as_u64().expect("rank");
    let estimate = fast["estimatedWaitSeconds"].as_u64().expect("estimate");
    assert!(
        estimate.abs_diff(rank / 50) <= 2,
        "at 50/s: rank {rank}, estimate {estimate}"
    );

    assert_eq!(
        app.put_settings("sale", json!({ "admitPerSecond": 10 }))
            .await
            .status(),
        200
    );
    for _ in 0..40 {
        app.tick(1_000).await;
    }
    let slow = app.position("sale", "m-02999").await;
    let rank = slow["rank"].as_u64().expect("rank");
    let estimate = slow["estimatedWaitSeconds"].as_u64().expect("estimate");
    assert!(
        estimate >= rank / 11 && estimate <= rank / 9 + 2,
        "at 10/s: rank {rank}, estimate {estimate} (rank/50 = {})",
        rank / 50
    );
}

/// Limitation 6: arrivals in the same millisecond keep their arrival order, whatever their ids. The seed
/// scored by application milliseconds, and Redis orders equal scores by member bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limitation_6_same_millisecond_arrivals_keep_arrival_order() {
    let app = spawn_app(test_config()).await;
    // The clock never moves: every entry lands in the same millisecond. Ids descend, so byte order would
    // reverse the arrival order.
    let members: Vec<String> = (0..30).rev().map(|i| format!("member-{i:02}")).collect();
    for (arrival, member) in members.iter().enumerate() {
        let position = app.enter("sale", member).await;
        assert_eq!(position["rank"].as_u64(), Some(arrival as u64));
    }
    for (arrival, member) in members.iter().enumerate() {
        assert_eq!(
            app.position("sale", member).await["rank"].as_u64(),
            Some(arrival as u64),
            "{member}"
        );
    }
    assert_eq!(app.clock.now_millis(), START_MS);
}

/// The position body follows SPEC 2.2: 0-based rank, token only while READY, polling interval by rank.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn position_body_follows_the_spec() {
    let app = spawn_app(test_config()).await;
    let first = app.enter("sale", "m-0").await;
    assert_eq!(first["status"], "WAITING");
    assert_eq!(first["rank"], 0);
    assert_eq!(first["currentTotalWaitingCount"], 1);
    assert!(first["entryToken"].is_null() && first["tokenExpiresAt"].is_null());
    let interval = first["pollingIntervalSeconds"].as_f64().expect("interval");
    assert!((1.0..1.2).contains(&interval), "{interval}");
    for i in 1..150 {
        app.enter("sale", &format!("m-{i}")).await;
    }
    let far = app.position("sale", "m-149").await;
    let interval = far["pollingIntervalSeconds"].as_f64().expect("interval");
    assert!(
        (3.0..3.6).contains(&interval),
        "rank 149 polls every 3 s + jitter: {interval}"
    );
    assert_eq!(app.position("sale", "nobody").await["status"], "NOT_ENTERED");
    let bad = app
        .post("/v1/queues/sale/entries", json!({ "memberId": "" }))
        .await;
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.expect("body").contains("memberId"));
    let control = app
        .post("/v1/queues/sale/entries", json!({ "memberId": "a\u{7}b" }))
        .await;
    assert_eq!(control.status(), 400);

    app.tick(0).await;
    let ready = app.position("sale", "m-0").await;
    assert_eq!(ready["status"], "READY");
    assert!(ready["entryToken"].is_string() && ready["tokenExpiresAt"].is_string());
    assert!(ready["rank"].is_null());
    let again = app.enter("sale", "m-0").await;
    assert_eq!(
        again["status"], "READY",
        "a READY member who enters again stays READY"
    );
    let leave = app.app.delete("/v1/queues/sale/entries/m-60").await;
    assert_eq!(leave.status(), 204);
    assert_eq!(app.position("sale", "m-60").await["status"], "NOT_ENTERED");
}

/// SPEC 2.2: polling faster than the interval gets 429 with `Retry-After`, `RateLimit-Policy`, `RateLimit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_too_fast_is_rate_limited_with_ietf_headers() {
    let app = spawn_app(WaitingRoomConfig {
        poll_burst: 3,
        ..WaitingRoomConfig::default()
    })
    .await;
    app.enter("sale", "eager").await;
    let mut statuses = Vec::new();
    let mut limited = None;
    for _ in 0..6 {
        let response = app.poll("sale", "eager").await;
        statuses.push(response.status().as_u16());
        if response.status() == 429 {
            limited = Some(response);
        }
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    let limited = limited.expect("a 429");
    let headers = limited.headers();
    let retry_after: u64 = headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=3).contains(&retry_after));
    assert_eq!(headers["ratelimit-policy"], "\"poll\";q=3;w=3");
    assert!(headers["ratelimit"]
        .to_str()
        .expect("ascii")
        .starts_with("\"poll\";r=0;t="));
    // The window slides on the store's clock: after the interval, polling is allowed again.
    app.clock.advance(3_000);
    assert_eq!(app.poll("sale", "eager").await.status(), 200);
    assert_eq!(
        app.poll("sale", "someone-else").await.status(),
        200,
        "limits are per member"
    );
}

/// SPEC 2.1: partial PUTs, 400 naming the field, and the live counters on GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_settings_are_partial_validated_and_counted() {
    let app = spawn_app(test_config()).await;
    assert_eq!(
        app.client
            .get(format!("{}/v1/admin/queues/none", app.address))
            .send()
            .await
            .expect("get")
            .status(),
        404
    );
    let response = app
        .put_settings("sale", json!({ "maxActive": 5, "claimTtlSeconds": 10 }))
        .await;
    assert_eq!(response.status(), 200);
    let settings: Value = response.json().await.expect("json");
    assert_eq!(settings["maxActive"], 5);
    assert_eq!(settings["admitPerSecond"], 50);
    assert_eq!(settings["tokenTtlSeconds"], 300);
    for (body, field) in [
        (json!({ "admitPerSecond": 0 }), "admitPerSecond"),
        (json!({ "tokenTtlSeconds": 0 }), "tokenTtlSeconds"),
        (json!({ "tickMillis": "fast" }), "tickMillis"),
        (json!({ "failMode": "sideways" }), "failMode"),
    ] {
        let response = app.put_settings("sale", body).await;
        assert_eq!(response.status(), 400);
        assert!(response.text().await.expect("body").contains(field), "{field}");
    }
    for i in 0..20 {
        app.enter("sale", &format!("m-{i}")).await;
    }
    app.clock.advance(5_000);
    app.room().admit_due_queues().await.expect("tick");
    let stats = app.queue_stats("sale").await;
    assert_eq!(stats["waiting"], 15);
    assert_eq!(stats["ready"], 5, "max_active bounds outstanding tokens");
    assert_eq!(stats["claimed"], 0);
    assert_eq!(stats["admittedLastMinute"], 5);
    assert_eq!(stats["oldestWaitSeconds"], 5);
    assert_eq!(stats["maxActive"], 5);
    assert_eq!(stats["claimTtlSeconds"], 10);
}

/// Embedded state (entries, sequence, tokens, claims, settings) survives a restart; the token a READY
/// member is shown stays the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_state_survives_a_restart() {
    let app = spawn_app(test_config()).await;
    assert_eq!(
        app.put_settings("sale", json!({ "admitPerSecond": 2 }))
            .await
            .status(),
        200
    );
    for i in 0..6 {
        app.enter("sale", &format!("m-{i}")).await;
    }
    app.tick(0).await;
    let token = app.token_of("sale", "m-0").await;
    let claim: Value = app
        .claim("sale", "m-0", &token)
        .await
        .json()
        .await
        .expect("claim");
    let token_1 = app.token_of("sale", "m-1").await;

    let restarted = app.restart(test_config()).await;
    assert_eq!(restarted.position("sale", "m-0").await["status"], "CLAIMED");
    assert_eq!(
        restarted.token_of("sale", "m-1").await,
        token_1,
        "the same token after the restart"
    );
    assert_eq!(restarted.position("sale", "m-2").await["rank"], 0);
    assert_eq!(restarted.position("sale", "m-5").await["rank"], 3);
    assert_eq!(restarted.queue_stats("sale").await["admitPerSecond"], 2);
    let consumed = restarted
        .post(
            "/v1/queues/sale/tokens/consume",
            json!({ "memberId": "m-0", "claimId": claim["claimId"] }),
        )
        .await;
    assert_eq!(consumed.status(), 204, "the claim survived too");
    restarted.enter("sale", "late").await;
    assert_eq!(
        restarted.position("sale", "late").await["rank"],
        4,
        "the sequence continues"
    );
}

/// An upstream order service for the gate: `/orders/ok` 201, `/orders/fail` 500, `/orders/slow` answers
/// after 30 s; every request is counted.
async fn spawn_order_service(hits: Arc<AtomicUsize>) -> SocketAddr {
    use axum::routing::post;
    let count = move |hits: Arc<AtomicUsize>| {
        move || {
            let hits = Arc::clone(&hits);
            async move {
                hits.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    let ok = count(Arc::clone(&hits));
    let fail = count(Arc::clone(&hits));
    let slow = count(Arc::clone(&hits));
    let router = axum::Router::new()
        .route(
            "/orders/ok",
            post(move |headers: axum::http::HeaderMap| {
                let ok = ok.clone();
                async move {
                    ok().await;
                    assert!(
                        headers.get("x-entry-token").is_none(),
                        "the token is not forwarded"
                    );
                    let member = headers
                        .get("x-member-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    (
                        axum::http::StatusCode::CREATED,
                        [("x-order-id", "o-1")],
                        format!("order for {member}"),
                    )
                }
            }),
        )
        .route(
            "/orders/fail",
            post(move || {
                let fail = fail.clone();
                async move {
                    fail().await;
                    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "out of stock")
                }
            }),
        )
        .route(
            "/orders/slow",
            post(move || {
                let slow = slow.clone();
                async move {
                    slow().await;
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    "too late"
                }
            }),
        );
    serve_upstream(router).await
}

/// An upstream that reads the request and drops the connection without answering.
async fn spawn_dropping_upstream(hits: Arc<AtomicUsize>) -> SocketAddr {
    use tokio::io::AsyncReadExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            hits.fetch_add(1, Ordering::SeqCst);
            let mut buffer = [0u8; 4096];
            let _ = socket.read(&mut buffer).await;
            drop(socket);
        }
    });
    address
}

async fn spawn_gated_app(hits: Arc<AtomicUsize>) -> RoomApp {
    let orders = spawn_order_service(Arc::clone(&hits)).await;
    let dropper = spawn_dropping_upstream(Arc::clone(&hits)).await;
    let config = WaitingRoomConfig {
        gates: vec![
            GateConfig {
                queue: "sale".into(),
                upstream: format!("http://{orders}"),
                routes: vec![GateRoute {
                    method: "POST".into(),
                    path: "/orders".into(),
                    prefix: true,
                }],
                timeout_millis: 1_500,
                max_body_bytes: 65_536,
            },
            GateConfig {
                queue: "sale".into(),
                upstream: format!("http://{dropper}"),
                routes: vec![GateRoute {
                    method: "POST".into(),
                    path: "/checkout".into(),
                    prefix: false,
                }],
                timeout_millis: 1_500,
                max_body_bytes: 65_536,
            },
        ],
        ..test_config()
    };
    spawn_app(config).await
}

impl RoomApp {
    async fn through_gate(&self, path: &str, member: &str, token: Option<&str>) -> reqwest::Response {
        let mut request = self
            .client
            .post(format!("{}{path}", self.address))
            .header("x-member-id", member)
            .header("x-queue-ticket", self.app.ticket("sale", member))
            .body("{\"sku\":\"A\"}");
        if let Some(token) = token {
            request = request.header("x-entry-token", token);
        }
        request.send().await.expect("gate request")
    }
}

/// The gate against a real upstream: 2xx consumes, 5xx / timeout / dropped connection release; answers
/// pass through unchanged; no valid token, no forwarding.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gate_proxy_consumes_on_2xx_and_releases_on_anything_else() {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = spawn_gated_app(Arc::clone(&hits)).await;
    for member in ["ok", "fails", "slow", "dropped"] {
        app.enter("sale", member).await;
    }
    app.tick(0).await;

    assert_eq!(
        app.through_gate("/orders/ok", "ok", None).await.status(),
        401,
        "no token"
    );
    assert_eq!(
        app.through_gate("/orders/ok", "ok", Some("forged"))
            .await
            .status(),
        401,
        "wrong token"
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "nothing reaches the upstream without a claim"
    );

    let token = app.token_of("sale", "ok").await;
    let response = app.through_gate("/orders/ok", "ok", Some(&token)).await;
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["x-order-id"], "o-1");
    assert_eq!(response.text().await.expect("body"), "order for ok");
    let after = app.position("sale", "ok").await;
    assert_eq!(
        (after["status"].as_str(), after["lastOutcome"].as_str()),
        (Some("NOT_ENTERED"), Some("CONSUMED"))
    );
    assert_eq!(
        app.through_gate("/orders/ok", "ok", Some(&token)).await.status(),
        401,
        "one token, one order"
    );

    let token = app.token_of("sale", "fails").await;
    let response = app.through_gate("/orders/fail", "fails", Some(&token)).await;
    assert_eq!(response.status(), 500);
    assert_eq!(
        response.text().await.expect("body"),
        "out of stock",
        "the upstream answer passes through"
    );
    assert_eq!(
        app.position("sale", "fails").await["status"],
        "READY",
        "released after a 5xx"
    );

    let token = app.token_of("sale", "slow").await;
    let response = app.through_gate("/orders/slow", "slow", Some(&token)).await;
    assert_eq!(response.status(), 504);
    assert_eq!(
        app.position("sale", "slow").await["status"],
        "READY",
        "released after a timeout"
    );

    let token = app.token_of("sale", "dropped").await;
    let response = app.through_gate("/checkout", "dropped", Some(&token)).await;
    assert_eq!(response.status(), 502);
    assert_eq!(
        app.position("sale", "dropped").await["status"],
        "READY",
        "released after a dropped connection"
    );

    // Released tokens are good for a retry.
    let token = app.token_of("sale", "fails").await;
    assert_eq!(
        app.through_gate("/orders/ok", "fails", Some(&token))
            .await
            .status(),
        201
    );
}

/// Fail-closed by default: with the store unreachable the gate answers 503 and forwards nothing;
/// `failMode: open` forwards instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_fails_closed_when_the_store_is_unreachable_and_open_when_configured() {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = spawn_gated_app(Arc::clone(&hits)).await;
    app.enter("sale", "m-1").await;
    app.tick(0).await;
    let token = app.token_of("sale", "m-1").await;
    let store = app.room().embedded_store().expect("embedded");

    store.set_unreachable(true);
    assert_eq!(
        app.through_gate("/orders/ok", "m-1", Some(&token)).await.status(),
        503
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0, "fail-closed admits nobody");
    assert_eq!(app.poll("sale", "m-1").await.status(), 503);
    assert_eq!(
        app.post("/v1/queues/sale/entries", json!({ "memberId": "m-2" }))
            .await
            .status(),
        503
    );

    store.set_unreachable(false);
    assert_eq!(
        app.put_settings("sale", json!({ "failMode": "open" }))
            .await
            .status(),
        200
    );
    store.set_unreachable(true);
    assert_eq!(
        app.through_gate("/orders/ok", "m-1", Some(&token)).await.status(),
        201,
        "fail-open forwards"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    store.set_unreachable(false);
}

/// The flash-sale demo at a small scale: everyone is admitted at the configured rate (± one tick), failed
/// orders are released and retried, and every member ends with exactly one committed order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flash_sale_demo_admits_at_the_configured_rate_and_retries_failed_orders() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut out = Vec::new();
    let report = rankgate::demo::flash_sale::run_flash_sale_demo(dir.path(), 600, &[], &mut out)
        .await
        .expect("demo");
    assert_flash_sale_succeeded(&report, out);
}

/// The same scene with its waiting room on the Redis at 127.0.0.1:6379, on the demo's simulated clock:
/// the same outcome, and the demo deletes every key it wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flash_sale_demo_runs_on_redis_and_cleans_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut out = Vec::new();
    let redis = [rankgate_testkit::redis_servers::standalone_url()];
    let report = rankgate::demo::flash_sale::run_flash_sale_demo(dir.path(), 600, &redis, &mut out)
        .await
        .expect("demo on redis");
    let text = String::from_utf8(out.clone()).expect("utf-8");
    assert!(text.contains("on Redis"), "{text}");
    assert_flash_sale_succeeded(&report, out);
    let client = redis::Client::open(redis[0].as_str()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let pattern = format!("rankgate-demo:{}:*", std::process::id());
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(left.is_empty(), "the demo deleted its keys: {left:?}");
}

fn assert_flash_sale_succeeded(report: &rankgate::demo::flash_sale::FlashSaleReport, out: Vec<u8>) {
    let text = String::from_utf8(out).expect("utf-8");
    assert_eq!(report.admitted, 600, "{text}");
    assert_eq!(report.orders_committed, 600, "one order per member: {text}");
    assert!(
        report.orders_failed > 0,
        "some orders failed and were retried: {text}"
    );
    assert!(
        report.max_admitted_in_one_second as f64 <= report.admit_per_second,
        "{report:?}"
    );
    assert!(text.contains("admitted/s"), "{text}");
    // The estimate backtest (issue 12): every admitted member entered with an estimate; in this scene the
    // rate is steady, so the median is within a second and actual waits rarely exceed P90.
    assert!(text.contains("estimate backtest"), "{text}");
    assert_eq!(report.backtested, 600, "{report:?}");
    assert!(report.median_absolute_error_seconds <= 1.0, "{report:?}");
    assert!(report.beyond_p90_share <= 0.2, "{report:?}");
}

/// An upstream that commits the order (counts it) as soon as it reads the request, then answers 201 only
/// after `answer_after`; `answered` counts the answers it has sent.
async fn spawn_slow_committing_upstream(
    committed: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
    answer_after: Duration,
) -> SocketAddr {
    use axum::routing::post;
    let router = axum::Router::new().route(
        "/orders",
        post(move || {
            let (committed, answered) = (Arc::clone(&committed), Arc::clone(&answered));
            async move {
                committed.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(answer_after).await;
                answered.fetch_add(1, Ordering::SeqCst);
                (axum::http::StatusCode::CREATED, "order placed")
            }
        }),
    );
    serve_upstream(router).await
}

/// Waits (bounded) until `counter` reaches `at_least`.
async fn wait_for_count(counter: &AtomicUsize, at_least: usize, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while counter.load(Ordering::SeqCst) < at_least {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Defect 2 of issue 9: a client that hung up after the upstream took its order used to cancel the gate's
/// bookkeeping (it ran inside the request future hyper drops); the claim then expired back to READY after
/// `claim_ttl` and the same token bought a second order. Now the claim is consumed on the upstream's 2xx
/// whether or not anybody is left to read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_hanging_up_mid_order_still_consumes_the_token_and_buys_one_order() {
    use tokio::io::AsyncWriteExt as _;
    let committed = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let upstream = spawn_slow_committing_upstream(
        Arc::clone(&committed),
        Arc::clone(&answered),
        Duration::from_millis(800),
    )
    .await;
    let config = WaitingRoomConfig {
        claim_ttl_seconds: 1,
        gates: vec![GateConfig {
            queue: "sale".into(),
            upstream: format!("http://{upstream}"),
            routes: vec![GateRoute {
                method: "POST".into(),
                path: "/orders".into(),
                prefix: false,
            }],
            timeout_millis: 30_000,
            max_body_bytes: 65_536,
        }],
        ..test_config()
    };
    let app = spawn_app(config).await;
    app.enter("sale", "m-1").await;
    app.tick(0).await;
    let token = app.token_of("sale", "m-1").await;

    let address = app.address.trim_start_matches("http://").to_string();
    let mut client = tokio::net::TcpStream::connect(&address).await.expect("connect");
    let body = "{\"sku\":\"A\"}";
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: {address}\r\nx-member-id: m-1\r\nx-entry-token: {token}\r\n\
         x-queue-ticket: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        app.app.ticket("sale", "m-1"),
        body.len()
    );
    client.write_all(request.as_bytes()).await.expect("send");
    wait_for_count(&committed, 1, "the upstream to commit the order").await;
    drop(client);
    wait_for_count(&answered, 1, "the upstream to answer").await;

    // The consume follows the upstream's answer; nobody is there to read it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let position = app.position("sale", "m-1").await;
        if position["lastOutcome"] == "CONSUMED" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the token was never consumed after the client hung up: {position}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Past claim_ttl nothing comes back to READY, and the token buys nothing more.
    app.clock.advance(5_000);
    app.room().expire_due_everywhere().await.expect("expiry");
    app.tick(0).await;
    assert_eq!(app.position("sale", "m-1").await["status"], "NOT_ENTERED");
    let second = app
        .client
        .post(format!("{}/orders", app.address))
        .header("x-member-id", "m-1")
        .header("x-queue-ticket", app.app.ticket("sale", "m-1"))
        .header("x-entry-token", &token)
        .body(body)
        .send()
        .await
        .expect("second order");
    assert_eq!(second.status(), 401, "one token, one order");
    assert_eq!(
        committed.load(Ordering::SeqCst),
        1,
        "the upstream took exactly one order"
    );
}

/// Defect 5: `PUT {"admitPerSecond":1000000,"tickMillis":3600000}` answered 200, and the next tick tried
/// to prepare billions of tokens. Every setting is bounded, rate × tick above 100,000 members per tick is
/// refused, and absurd JSON (negative, huge, floats for integers, duplicate keys) gets 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_make_one_tick_enormous_are_refused_naming_the_field() {
    let app = spawn_app(test_config()).await;
    for (body, field) in [
        (r#"{"admitPerSecond":1000000,"tickMillis":3600000}"#, "tickMillis"),
        (
            r#"{"admitPerSecond":1000000,"tickMillis":1000}"#,
            "admitPerSecond",
        ),
        (r#"{"admitPerSecond":200000}"#, "admitPerSecond"),
        (r#"{"tickMillis":-5}"#, "tickMillis"),
        (r#"{"tickMillis":1000.5}"#, "tickMillis"),
        (r#"{"tickMillis":1e3}"#, "tickMillis"),
        (r#"{"tokenTtlSeconds":99999999999999999999}"#, "tokenTtlSeconds"),
        (r#"{"claimTtlSeconds":86401}"#, "claimTtlSeconds"),
        (r#"{"maxActive":18446744073709551615}"#, "maxActive"),
        (r#"{"paused":true,"paused":false}"#, "paused"),
    ] {
        let response = app
            .client
            .put(format!("{}/v1/admin/queues/sale", app.address))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("put");
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.expect("json error");
        let message = error["error"].as_str().expect("the one error shape");
        assert!(message.starts_with(field), "{body}: {message}");
    }
    let queues: Value = app.get_json("/v1/admin/queues").await;
    assert_eq!(queues["queues"], json!([]), "a refused PUT creates nothing");
    // A duplicate memberId is refused too, rather than one of the two being picked silently.
    let response = app
        .client
        .post(format!("{}/v1/queues/sale/entries", app.address))
        .header("content-type", "application/json")
        .body(r#"{"memberId":"a","memberId":"b"}"#)
        .send()
        .await
        .expect("enter");
    assert_eq!(response.status(), 400);
    // At the cap, a tick prepares only what it can use: min(per tick, waiting, room).
    let response = app
        .put_settings("sale", json!({ "admitPerSecond": 100000, "tickMillis": 1000 }))
        .await;
    assert_eq!(response.status(), 200);
    for i in 0..3 {
        app.enter("sale", &format!("m-{i}")).await;
    }
    let outcome = app
        .room()
        .admit_queue_now(&queue_name("sale"))
        .await
        .expect("tick");
    assert_eq!(outcome.admitted.len(), 3);
}

/// Defect 4: the 1,001st new queue gets 429 naming `max_queues`; existing queues still take entries;
/// admins list and delete queues (204, then 404), and deleting makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_after_max_queues_gets_429_and_admins_delete_queues() {
    let app = spawn_app(test_config()).await;
    for i in 0..1_000 {
        app.enter(&format!("junk-{i:04}"), "m").await;
    }
    let response = app
        .post("/v1/queues/one-too-many/entries", json!({ "memberId": "m" }))
        .await;
    assert_eq!(response.status(), 429);
    let error: Value = response.json().await.expect("json error");
    assert!(
        error["error"].as_str().expect("error").starts_with("max_queues"),
        "{error}"
    );
    app.enter("junk-0001", "someone-else").await;
    let listed = app.get_json("/v1/admin/queues").await;
    assert_eq!(listed["queues"].as_array().expect("list").len(), 1_000);
    let delete = |queue: &'static str| {
        let client = app.client.clone();
        let url = format!("{}/v1/admin/queues/{queue}", app.address);
        async move { client.delete(url).send().await.expect("delete").status() }
    };
    assert_eq!(delete("junk-0000").await, 204);
    assert_eq!(delete("junk-0000").await, 404);
    assert_eq!(delete("never-was").await, 404);
    app.enter("one-too-many", "m").await;
    assert_eq!(
        app.position("junk-0000", "m").await["status"],
        "NOT_ENTERED",
        "its members went with it"
    );
}

/// Defect 4: a thousand idle queues took idle CPU from 0.4% to 13% because every tick visited every
/// queue (preparing tokens and committing). Now the workers ask the store once per round for the active
/// queues and touch no idle one: counted through a store wrapper, not with a stopwatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_queues_cost_no_store_calls_per_tick() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = ManualClock::new(START_MS);
    let inner =
        EmbeddedStore::open(dir.path(), Arc::new(clock.clone()), options_for_many_queues()).expect("open");
    let counting = Arc::new(CountingStore {
        inner: inner.clone(),
        calls: AtomicUsize::new(0),
    });
    let room = Arc::new(
        WaitingRoom::from_stores(
            counting.clone(),
            inner.clone(),
            inner.clone(),
            Arc::new(clock.clone()),
            test_config(),
            TokenSecret::generate().expect("rng"),
        )
        .expect("room"),
    );
    use rankgate_store::queue::QueueStore as _;
    let m = rankgate_core::ids::MemberId::parse("m").unwrap();
    for i in 0..1_000 {
        let q = queue_name(&format!("idle-{i:04}"));
        inner.enter(&q, &m).await.unwrap();
        inner.leave(&q, &m).await.unwrap();
    }
    let busy = queue_name("busy");
    inner.enter(&busy, &m).await.unwrap();
    // The first round admits the one member of the one busy queue.
    room.admit_due_queues().await.expect("tick");
    for _ in 0..10 {
        clock.advance(1_000);
        counting.calls.store(0, Ordering::SeqCst);
        let ticked = room.admit_due_queues().await.expect("tick");
        room.expire_due_everywhere().await.expect("expiry");
        room.publish_queue_gauges().await.expect("gauges");
        // One active_queues() per worker, plus the busy queue's own calls (it holds a READY token).
        let calls = counting.calls.load(Ordering::SeqCst);
        assert!(
            calls <= 3 + 6,
            "{calls} store calls for one round over 1,001 queues"
        );
        assert!(ticked.iter().all(|(q, _)| *q == busy), "{ticked:?}");
    }
}

/// Room for the thousand idle queues and the busy one.
fn options_for_many_queues() -> EmbeddedOptions {
    EmbeddedOptions {
        max_queues: 2_000,
        ..EmbeddedOptions::default()
    }
}

fn queue_name(raw: &str) -> rankgate_core::queue::QueueName {
    rankgate_core::queue::QueueName::parse(raw).unwrap()
}

/// A [`QueueStore`](rankgate_store::queue::QueueStore) that counts every call before passing it on.
struct CountingStore {
    inner: Arc<EmbeddedStore>,
    calls: AtomicUsize,
}

mod counting {
    use super::*;
    use rankgate_core::ids::MemberId;
    use rankgate_core::queue::{Digest, DrawSeed, QueueName, QueueSettings, SettingsError, SettingsPatch};
    use rankgate_store::queue::draw::{
        BeaconRoundOutcome, BeginDraw, DrawRecord, DrawStep, DrawStore, FinishDraw, ScheduleOutcome,
        SealEntrants, SupplyBeacon,
    };
    use rankgate_store::queue::{
        AdmissionPreview, AdmitOutcome, ClaimOutcome, ConsumeOutcome, EnterOutcome, ExpiryOutcome,
        LeaveOutcome, MemberView, QueueStats, QueueStore, ReleaseOutcome, StoreError, TokenCandidate,
    };

    macro_rules! counted {
        ($self:ident, $call:expr) => {{
            $self.calls.fetch_add(1, Ordering::SeqCst);
            $call.await
        }};
    }

    #[async_trait::async_trait]
    impl QueueStore for CountingStore {
        async fn enter(&self, q: &QueueName, m: &MemberId) -> Result<EnterOutcome, StoreError> {
            counted!(self, self.inner.enter(q, m))
        }
        async fn position(&self, q: &QueueName, m: &MemberId) -> Result<MemberView, StoreError> {
            counted!(self, self.inner.position(q, m))
        }
        async fn leave(&self, q: &QueueName, m: &MemberId) -> Result<LeaveOutcome, StoreError> {
            counted!(self, self.inner.leave(q, m))
        }
        async fn admit(&self, q: &QueueName, t: Vec<TokenCandidate>) -> Result<AdmitOutcome, StoreError> {
            counted!(self, self.inner.admit(q, t))
        }
        async fn expire_due(&self, q: &QueueName) -> Result<ExpiryOutcome, StoreError> {
            counted!(self, self.inner.expire_due(q))
        }
        async fn claim(
            &self,
            q: &QueueName,
            m: &MemberId,
            t: &Digest,
            c: &Digest,
        ) -> Result<ClaimOutcome, StoreError> {
            counted!(self, self.inner.claim(q, m, t, c))
        }
        async fn consume(
            &self,
            q: &QueueName,
            m: &MemberId,
            c: &Digest,
        ) -> Result<ConsumeOutcome, StoreError> {
            counted!(self, self.inner.consume(q, m, c))
        }
        async fn release(
            &self,
            q: &QueueName,
            m: &MemberId,
            c: &Digest,
        ) -> Result<ReleaseOutcome, StoreError> {
            counted!(self, self.inner.release(q, m, c))
        }
        async fn settings(&self, q: &QueueName) -> Result<Option<QueueSettings>, StoreError> {
            counted!(self, self.inner.settings(q))
        }
        async fn update_settings(
            &self,
            q: &QueueName,
            p: &SettingsPatch,
        ) -> Result<Result<QueueSettings, SettingsError>, StoreError> {
            counted!(self, self.inner.update_settings(q, p))
        }
        async fn stats(&self, q: &QueueName) -> Result<Option<QueueStats>, StoreError> {
            counted!(self, self.inner.stats(q))
        }
        async fn queues(&self) -> Result<Vec<QueueName>, StoreError> {
            counted!(self, self.inner.queues())
        }
        async fn active_queues(&self) -> Result<Vec<QueueName>, StoreError> {
            counted!(self, self.inner.active_queues())
        }
        async fn admission_preview(&self, q: &QueueName) -> Result<Option<AdmissionPreview>, StoreError> {
            counted!(self, self.inner.admission_preview(q))
        }
        async fn delete_queue(&self, q: &QueueName) -> Result<bool, StoreError> {
            counted!(self, self.inner.delete_queue(q))
        }
        async fn forget_if_idle(&self, q: &QueueName, idle_ms: i64) -> Result<bool, StoreError> {
            counted!(self, self.inner.forget_if_idle(q, idle_ms))
        }
        async fn ping(&self) -> Result<(), StoreError> {
            counted!(self, self.inner.ping())
        }
        fn draws(&self) -> &dyn DrawStore {
            self
        }
    }

    /// Draw steps are store calls too.
    #[async_trait::async_trait]
    impl DrawStore for CountingStore {
        async fn schedule_opening(
            &self,
            q: &QueueName,
            opens_at_ms: Option<i64>,
            seed: DrawSeed,
        ) -> Result<ScheduleOutcome, StoreError> {
            counted!(self, self.inner.schedule_opening(q, opens_at_ms, seed))
        }
        async fn set_beacon_round(
            &self,
            q: &QueueName,
            round: Option<u64>,
        ) -> Result<BeaconRoundOutcome, StoreError> {
            counted!(self, self.inner.set_beacon_round(q, round))
        }
        async fn write_entrants_chunk(
            &self,
            q: &QueueName,
            owner: &str,
            lease_ms: i64,
            first: u64,
            members: &[String],
        ) -> Result<DrawStep, StoreError> {
            counted!(
                self,
                self.inner
                    .write_entrants_chunk(q, owner, lease_ms, first, members)
            )
        }
        async fn seal_entrants(
            &self,
            q: &QueueName,
            owner: &str,
            commitment: [u8; 32],
        ) -> Result<SealEntrants, StoreError> {
            counted!(self, self.inner.seal_entrants(q, owner, commitment))
        }
        async fn supply_beacon(
            &self,
            q: &QueueName,
            round: u64,
            value: &[u8],
        ) -> Result<SupplyBeacon, StoreError> {
            counted!(self, self.inner.supply_beacon(q, round, value))
        }
        async fn entrants(
            &self,
            q: &QueueName,
            offset: u64,
            limit: usize,
        ) -> Result<Vec<String>, StoreError> {
            counted!(self, self.inner.entrants(q, offset, limit))
        }
        async fn draw_record(&self, q: &QueueName) -> Result<Option<DrawRecord>, StoreError> {
            counted!(self, self.inner.draw_record(q))
        }
        async fn begin_draw(
            &self,
            q: &QueueName,
            owner: &str,
            lease_ms: i64,
        ) -> Result<BeginDraw, StoreError> {
            counted!(self, self.inner.begin_draw(q, owner, lease_ms))
        }
        async fn pre_queue_page(
            &self,
            q: &QueueName,
            from: u64,
            below: u64,
            limit: usize,
        ) -> Result<Vec<(String, u64)>, StoreError> {
            counted!(self, self.inner.pre_queue_page(q, from, below, limit))
        }
        async fn write_draw_chunk(
            &self,
            q: &QueueName,
            owner: &str,
            lease_ms: i64,
            first: u64,
            members: &[String],
        ) -> Result<DrawStep, StoreError> {
            counted!(
                self,
                self.inner.write_draw_chunk(q, owner, lease_ms, first, members)
            )
        }
        async fn finish_draw(&self, q: &QueueName, owner: &str) -> Result<FinishDraw, StoreError> {
            counted!(self, self.inner.finish_draw(q, owner))
        }
        async fn drawn_members(
            &self,
            q: &QueueName,
            offset: u64,
            limit: usize,
        ) -> Result<Vec<String>, StoreError> {
            counted!(self, self.inner.drawn_members(q, offset, limit))
        }
    }
}
