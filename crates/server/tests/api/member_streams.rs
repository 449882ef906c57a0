//! Member position streams (`GET /v1/queues/{queue}/entries/{memberId}/events`, SSE) through the whole
//! HTTP stack: on the embedded store, and on Redis (standalone and the 3-node Cluster) through two
//! instances, where the stream is held on an instance that never admits, so what it shows comes from
//! admissions made by the other one. Plus the stream limit, and the memory and tick cost of 10,000 streams.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;
use crate::redis_servers;
use crate::top_streams::{SseClient, SseItem};

const SECRET: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";

/// The next position on a member stream, skipping heartbeats.
async fn next_position(stream: &mut SseClient, within: Duration) -> (Instant, Value) {
    let deadline = Instant::now() + within;
    loop {
        match stream
            .next(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            Some((at, SseItem::Position(position))) => return (at, position),
            Some((_, SseItem::Heartbeat)) => continue,
            Some((_, SseItem::Top(page))) => panic!("a top page on a member stream: {page}"),
            None => panic!("no position within {within:?}"),
        }
    }
}

/// A position without the jittered polling interval, which differs on every read.
fn stable(position: &Value) -> Value {
    let mut position = position.clone();
    position.as_object_mut().unwrap().remove("pollingIntervalSeconds");
    position
}

async fn put_settings(app: &TestApp, queue: &str, body: Value) {
    let response = app
        .client
        .put(format!("{}/v1/admin/queues/{queue}", app.address))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "PUT settings {body}");
}

async fn enter(app: &TestApp, queue: &str, member: &str) -> Value {
    let response = app
        .post_json(
            &format!("/v1/queues/{queue}/entries"),
            &json!({ "memberId": member }),
        )
        .await;
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// Three members enter through `entering` into a paused queue admitting one every 2 s; `m-3`'s stream is
/// opened on `streaming`. Once resumed, the stream shows rank 1, rank 0 and READY, each the poll route's
/// object, at least a polling tier (1 s) apart; then heartbeats. (Each rank lasts 2 s, longer than the
/// 1 s cadence, so none can be skipped: a faster queue may legitimately skip one between two pushes.)
async fn a_stream_follows_admissions(entering: &TestApp, streaming: &TestApp, queue: &str) {
    put_settings(entering, queue, json!({ "paused": true, "admitPerSecond": 0.5 })).await;
    for member in ["m-1", "m-2", "m-3"] {
        enter(entering, queue, member).await;
    }
    let path = format!("/v1/queues/{queue}/entries/m-3/events");
    let mut stream = SseClient::open(streaming, &path).await;
    let (_, first) = next_position(&mut stream, Duration::from_secs(5)).await;
    let polled = streaming
        .get_json(&format!("/v1/queues/{queue}/entries/m-3"))
        .await;
    assert_eq!(
        stable(&first),
        stable(&polled),
        "the first event is the poll route's object"
    );
    assert_eq!(first["status"], "WAITING");
    assert_eq!(first["rank"], 2);

    put_settings(entering, queue, json!({ "paused": false })).await;
    let mut seen = vec![first];
    let mut arrivals = Vec::new();
    while seen.last().unwrap()["status"] != "READY" {
        let (at, position) = next_position(&mut stream, Duration::from_secs(30)).await;
        arrivals.push(at);
        seen.push(position);
    }
    let ranks: Vec<Option<u64>> = seen.iter().map(|p| p["rank"].as_u64()).collect();
    assert!(
        ranks.windows(2).all(|w| w[1].unwrap_or(0) <= w[0].unwrap_or(0)),
        "ranks only fall: {ranks:?}"
    );
    assert!(
        ranks.contains(&Some(0)),
        "the head of the line was shown before READY: {ranks:?}"
    );
    for pair in arrivals.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(950),
            "two positions {:?} apart: at most one per polling tier (1 s at rank < 100)",
            pair[1] - pair[0]
        );
    }
    let ready = seen.last().unwrap();
    assert!(
        ready["entryToken"].is_string(),
        "READY carries the token: {ready}"
    );
    let polled = streaming
        .get_json(&format!("/v1/queues/{queue}/entries/m-3"))
        .await;
    assert_eq!(polled["status"], "READY");
    assert_eq!(
        polled["entryToken"], ready["entryToken"],
        "the stream's token is the poll's"
    );

    // Nothing changes any more: heartbeats only.
    let mut heartbeats = 0;
    let quiet_until = Instant::now() + Duration::from_millis(1_500);
    while let Some((_, item)) = stream
        .next(quiet_until.saturating_duration_since(Instant::now()))
        .await
    {
        match item {
            SseItem::Heartbeat => heartbeats += 1,
            SseItem::Position(position) => panic!("a position without a change: {position}"),
            SseItem::Top(page) => panic!("a top page on a member stream: {page}"),
        }
    }
    assert!(heartbeats >= 2, "{heartbeats} heartbeats in 1.5 s (every 300 ms)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stream_follows_admission_with_heartbeats_and_a_limit_on_embedded() {
    let app = spawn_app_with(|config| {
        config.waiting_room.member_stream_heartbeat_millis = 300;
        config.waiting_room.max_member_streams = 5;
    })
    .await;
    a_stream_follows_admissions(&app, &app, "push").await;

    // The limits: at most 4 streams per member, and max_member_streams (5 here) per instance, each
    // refused with a JSON error naming what it is about; a slot comes back when a stream ends.
    let open = |member: &str| {
        app.client
            .get(format!("{}/v1/queues/push/entries/{member}/events", app.address))
            .header("x-queue-ticket", app.ticket("push", member))
            .send()
    };
    let mut tabs = Vec::new();
    while app.state.waiting_room.open_member_streams() > 0 {
        // m-3's stream ends once the server notices its client left (at the next heartbeat).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..4 {
        tabs.push(SseClient::reading(open("m-1").await.unwrap(), "m-1"));
    }
    let refused = open("m-1").await.unwrap();
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().starts_with("memberId"), "{body}");
    let fifth = SseClient::reading(open("m-2").await.unwrap(), "m-2");
    let refused = open("m-4").await.unwrap();
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("max_member_streams"),
        "{body}"
    );
    tabs.pop();
    let mut reopened = None;
    for _ in 0..100 {
        let response = open("m-4").await.unwrap();
        if response.status() == 200 {
            reopened = Some(SseClient::reading(response, "m-4"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut reopened = reopened.expect("a closed stream gives its slot back");
    let (_, position) = next_position(&mut reopened, Duration::from_secs(5)).await;
    assert_eq!(
        position["status"], "NOT_ENTERED",
        "a member who never entered: {position}"
    );
    drop((tabs, fifth));

    // Hostile input: a bad member id or queue is a 400 naming the field, before any stream opens.
    let long = "x".repeat(129);
    for (path, field) in [
        (format!("/v1/queues/push/entries/{long}/events"), "memberId"),
        ("/v1/queues/bad%20queue/entries/m-1/events".to_string(), "queue"),
    ] {
        let response = app.get(&path).await;
        assert_eq!(response.status(), 400, "{path}");
        let body: Value = response.json().await.unwrap();
        assert!(body["error"].as_str().unwrap().starts_with(field), "{body}");
    }
    app.stop().await;
}

/// Two instances on `redis`; `b` never runs an admission tick, so its stream shows `a`'s admissions.
async fn a_stream_on_one_instance_follows_admissions_by_another(redis: Vec<String>) {
    let prefix = redis_servers::unique_prefix();
    let _keys = redis_servers::KeyCleanup {
        nodes: redis.clone(),
        prefix: prefix.clone(),
    };
    let spawn = |admits: bool| {
        let (redis, prefix) = (redis.clone(), prefix.clone());
        spawn_app_with(move |config| {
            config.redis = redis;
            config.redis_prefix = prefix;
            config.waiting_room.token_secret = Some(SECRET.into());
            config.waiting_room.member_stream_heartbeat_millis = 300;
            if !admits {
                // No admission round within the test (see waiting_room::scheduler).
                config.waiting_room.scheduler_poll_millis = 3_600_000;
            }
        })
    };
    let a = spawn(true).await;
    let b = spawn(false).await;
    a_stream_follows_admissions(&a, &b, "push").await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stream_on_one_instance_follows_admissions_by_another_on_redis_standalone() {
    a_stream_on_one_instance_follows_admissions_by_another(vec![redis_servers::standalone_url()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stream_on_one_instance_follows_admissions_by_another_on_redis_cluster() {
    a_stream_on_one_instance_follows_admissions_by_another(redis_servers::cluster().urls.clone()).await;
}

/// Resident set size of this process (Linux `/proc/self/status`), in bytes.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// The cost of 10,000 open member streams on one instance (embedded store): resident memory per stream
/// (the watch's record, the channel and the stream's state; the HTTP connection is hyper's and not
/// counted here), and the time of one admission tick with and without them. Prints the numbers
/// (BENCHMARKS.md); asserts only generous bounds, as the machine is shared and noisy.
/// `cargo test -p rankgate --test api -- --ignored --nocapture ten_thousand_member_streams`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (10,000 members and streams); run it with --ignored --nocapture"]
async fn ten_thousand_member_streams_cost_bounded_memory_and_the_tick_stays_flat() {
    use futures_util::StreamExt as _;
    use rankgate_core::ids::MemberId;
    use rankgate_core::queue::{QueueName, SettingsPatch};

    const STREAMS: usize = 10_000;
    let app = spawn_app_with(|config| {
        config.waiting_room.scheduler_poll_millis = 3_600_000;
        config.waiting_room.synchronous = rankgate_store::synchronous::Synchronous::Normal;
    })
    .await;
    let room = app.state.waiting_room.clone();
    let queue = QueueName::parse("bench").unwrap();
    let pause = |paused: bool| SettingsPatch {
        paused: Some(paused),
        admit_per_second: Some(100.0),
        ..SettingsPatch::default()
    };
    room.update_settings(&queue, &pause(true)).await.unwrap();
    let members: Vec<MemberId> = (0..STREAMS * 2)
        .map(|i| MemberId::parse(&format!("m-{i:05}")).unwrap())
        .collect();
    futures_util::stream::iter(members.iter())
        .map(|member| room.enter(&queue, member))
        .buffer_unordered(64)
        .for_each(|entered| async move {
            entered.unwrap();
        })
        .await;

    // A tick without streams (100 admitted out of 20,000 waiting).
    room.update_settings(&queue, &pause(false)).await.unwrap();
    let started = Instant::now();
    let outcome = room.admit_queue_now(&queue).await.unwrap();
    let tick_without = started.elapsed();
    assert_eq!(outcome.admitted.len(), 100);
    room.update_settings(&queue, &pause(true)).await.unwrap();

    let before = resident_bytes();
    let mut streams = Vec::with_capacity(STREAMS);
    // The members behind the next tick's 100, so the tick wakes some streams and re-reads are due.
    for member in &members[100..100 + STREAMS] {
        let mut stream = Box::pin(
            room.open_member_stream(queue.clone(), member.clone())
                .await
                .unwrap(),
        );
        let _first_position = stream.next().await.unwrap().unwrap();
        streams.push(stream);
    }
    let after = resident_bytes();
    assert_eq!(room.open_member_streams(), STREAMS);
    let per_stream = after.saturating_sub(before) / STREAMS as u64;

    room.update_settings(&queue, &pause(false)).await.unwrap();
    // The refill of the budget needs a second of the store's clock since the last tick.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let started = Instant::now();
    let outcome = room.admit_queue_now(&queue).await.unwrap();
    let tick_with = started.elapsed();
    assert_eq!(outcome.admitted.len(), 100);
    println!(
        "member streams: {STREAMS} open; resident {} MiB -> {} MiB = {per_stream} bytes per stream \
         (without the HTTP connection)",
        before / (1 << 20),
        after / (1 << 20)
    );
    println!(
        "admission tick (100 admitted of {} waiting): {tick_without:?} without streams, {tick_with:?} with \
         {STREAMS} streams (noisy shared machine)",
        STREAMS * 2 - 100
    );
    assert!(per_stream < 16 * 1024, "{per_stream} bytes per stream");
    assert!(
        tick_with < tick_without * 20 + Duration::from_millis(100),
        "the tick's fan-out is O(admitted): {tick_with:?} vs {tick_without:?}"
    );
    drop(streams);
    app.stop().await;
}

/// Abandonment as members live it (real clock, the service's own sweeper): a member who neither polls nor
/// holds a stream for `abandonAfterSeconds` is dropped, one holding a stream keeps its place (and sees
/// itself move up), and the drop is counted in the admin view and in `/metrics`.
async fn holding_a_stream_keeps_the_place_and_the_silent_are_dropped(app: &TestApp, queue: &str) {
    let refused = app
        .client
        .put(format!("{}/v1/admin/queues/{queue}", app.address))
        .json(&json!({ "abandonAfterSeconds": 2 }))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().starts_with("abandonAfterSeconds"),
        "{body}"
    );
    put_settings(app, queue, json!({ "paused": true, "abandonAfterSeconds": 5 })).await;
    enter(app, queue, "silent").await;
    enter(app, queue, "streaming").await;
    let mut stream = SseClient::open(app, &format!("/v1/queues/{queue}/entries/streaming/events")).await;
    let (_, first) = next_position(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(first["rank"], 1);
    // Nobody polls for 8 s; the stream is held.
    let (_, moved) = next_position(&mut stream, Duration::from_secs(15)).await;
    assert_eq!(moved["rank"], 0, "the silent head was dropped: {moved}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let view = app.get_json(&format!("/v1/admin/queues/{queue}")).await;
    assert_eq!(
        (view["abandoned"].as_u64(), view["waiting"].as_u64()),
        (Some(1), Some(1)),
        "{view}"
    );
    let silent = app.get_json(&format!("/v1/queues/{queue}/entries/silent")).await;
    assert_eq!(silent["status"], "NOT_ENTERED");
    let metrics = app.get("/metrics").await.text().await.unwrap();
    let series = format!("rankgate_queue_abandoned_total{{queue=\"{queue}\"}} 1");
    assert!(metrics.lines().any(|l| l == series), "{series} in /metrics");
    put_settings(app, queue, json!({ "paused": false })).await;
    // Resumed: the estimate appears (a change), then the member is admitted.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, position) =
            next_position(&mut stream, deadline.saturating_duration_since(Instant::now())).await;
        if position["status"] == "READY" {
            break;
        }
        assert_eq!(position["status"], "WAITING", "{position}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_a_stream_counts_as_polling_for_abandonment_on_embedded() {
    let app = spawn_app().await;
    holding_a_stream_keeps_the_place_and_the_silent_are_dropped(&app, "abandon-embedded").await;
    app.stop().await;
}

async fn abandonment_on_redis(redis: Vec<String>, queue: &str) {
    let prefix = redis_servers::unique_prefix();
    let _keys = redis_servers::KeyCleanup {
        nodes: redis.clone(),
        prefix: prefix.clone(),
    };
    let app = spawn_app_with(move |config| {
        config.redis = redis;
        config.redis_prefix = prefix;
        config.waiting_room.token_secret = Some(SECRET.into());
    })
    .await;
    holding_a_stream_keeps_the_place_and_the_silent_are_dropped(&app, queue).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_a_stream_counts_as_polling_for_abandonment_on_redis_standalone() {
    abandonment_on_redis(vec![redis_servers::standalone_url()], "abandon-standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_a_stream_counts_as_polling_for_abandonment_on_redis_cluster() {
    abandonment_on_redis(redis_servers::cluster().urls.clone(), "abandon-cluster").await;
}
