//! Scheduled openings over HTTP (issue 12 and issue 28 item 5, SPEC 2.1 `opensAt`): hostile `opensAt`,
//! `drawBeaconRound` and beacon values get 400s naming the field; the pre-queue shows in positions; it
//! survives a restart with its commitment; the close publishes `entrantsCommitment` (checked against this
//! test's own list of who entered); the draw orders the entrants by HMAC-SHA-256(drawKey, memberId) ahead
//! of every later arrival, who is not in the draw; a beacon round holds the queue closed until the beacon
//! PUT; the public and admin draw reads; and `rankgate queue verify-draw` passes on the real output and
//! fails on a tampered order, seed, entrant list or beacon.

use std::time::Duration;

use rankgate_core::queue::draw::{
    commitment_of, draw_key, entrants_commitment, from_hex_32, member_order_key, sort_in_draw_order,
};
use rankgate_core::queue::DrawSeed;
use serde_json::{json, Value};

use crate::helpers::*;
use crate::redis_servers::KeyCleanup;

async fn put(app: &TestApp, queue: &str, body: &Value) -> (u16, Value) {
    let response = app
        .client
        .put(format!("{}/v1/admin/queues/{queue}", app.address))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn enter(app: &TestApp, queue: &str, member: &str) -> Value {
    let response = app
        .post_json(
            &format!("/v1/queues/{queue}/entries"),
            &json!({ "memberId": member }),
        )
        .await;
    assert_eq!(response.status(), 200, "entry of {member}");
    response.json().await.unwrap()
}

/// `entrants` in the order the draw gives them, recomputed from this test's own list of who entered.
fn recomputed_order(seed: &DrawSeed, entrants: &[String], beacon: &[u8]) -> Vec<String> {
    let mut order = entrants.to_vec();
    sort_in_draw_order(
        &draw_key(seed, &entrants_commitment(entrants), beacon),
        &mut order,
    );
    order
}

/// Polls the admin view until the draw reaches `phase` (10 s at most).
async fn wait_for_phase(app: &TestApp, queue: &str, phase: &str) -> Value {
    let mut shown = Value::Null;
    for _ in 0..200 {
        shown = app.get_json(&format!("/v1/admin/queues/{queue}")).await;
        if shown["drawPhase"] == phase {
            return shown;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the draw never reached {phase}: {shown}");
}

/// Runs `rankgate queue verify-draw` with `args` off the test's runtime threads (the child may call this
/// very server).
async fn verify_draw_cli(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_rankgate"))
            .args(["queue", "verify-draw"])
            .args(&args)
            .output()
            .expect("the rankgate binary runs")
    })
    .await
    .unwrap()
}

fn rfc3339_in(millis_from_now: i64) -> String {
    jiff::Timestamp::from_millisecond(now_millis() + millis_from_now)
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn hostile_opens_at_values_get_400_naming_the_field_and_change_nothing() {
    let app = spawn_app().await;
    for bad in [
        json!("tomorrow"),
        json!("2027-01-15"),
        json!(1_800_000_000_000i64),
        json!(true),
        json!({ "at": "2027-01-15T08:00:00Z" }),
        json!("2020-01-01T00:00:00Z"),
        json!("2999-01-01T00:00:00Z"),
        json!("9".repeat(10_000)),
        json!("2027-01-15T08:00:00Z\u{0000}"),
    ] {
        let (status, body) = put(&app, "hostile", &json!({ "paused": true, "opensAt": bad })).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["error"].as_str().unwrap().starts_with("opensAt:"),
            "{bad}: {body}"
        );
    }
    // Nothing changed: the queue was never created by the refused PUTs.
    assert_eq!(app.get("/v1/admin/queues/hostile").await.status(), 404);
    assert_eq!(app.get("/v1/queues/hostile/draw").await.status(), 404);
    for query in ["limit=0", "limit=10001", "offset=-1", "limit=abc"] {
        let (status, _) = put(&app, "hostile", &json!({ "opensAt": rfc3339_in(60_000) })).await;
        assert_eq!(status, 200);
        let response = app.get(&format!("/v1/queues/hostile/draw?{query}")).await;
        assert_eq!(response.status(), 400, "{query}");
    }
}

/// The whole opening through HTTP on the embedded store, with a restart during the pre-queue. Multi-thread:
/// the `verify-draw` child process calls this very server, and waiting for it must not stop the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_opening_draws_the_pre_queue_verifiably_ahead_of_later_arrivals() {
    let dir = tempfile::tempdir().unwrap();
    // The test reads every member's position in quick succession: no poll limit in the way.
    let generous = |config: &mut rankgate::config::Config| config.waiting_room.poll_burst = 10_000;
    let app = spawn_app_in(dir.path().to_path_buf(), generous).await;
    let queue = "launch";
    // Paused: the draw still runs at the opening, and ranks stay put for the checks.
    let (status, body) = put(
        &app,
        queue,
        &json!({ "paused": true, "opensAt": rfc3339_in(4_000) }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["drawPhase"], "scheduled");
    let commitment = body["drawCommitment"].as_str().unwrap().to_string();
    assert_eq!(commitment.len(), 64);
    assert_eq!(
        body["drawSeed"],
        Value::Null,
        "the seed is secret before the draw"
    );

    let early: Vec<String> = (0..20).map(|i| format!("early-{i:02}")).collect();
    for m in &early {
        let position = enter(&app, queue, m).await;
        assert_eq!(position["status"], "WAITING");
        assert_eq!(position["preQueue"], true, "{position}");
        assert_eq!(position["rank"], Value::Null);
        assert!(position["opensAt"].is_string());
    }
    // Entering twice keeps one place.
    enter(&app, queue, &early[7]).await;

    // Restart during the pre-queue: members, the opening and its commitment survive.
    app.stop().await;
    let app = spawn_app_in(dir.path().to_path_buf(), generous).await;
    let shown = app.get_json(&format!("/v1/admin/queues/{queue}")).await;
    assert_eq!(shown["drawCommitment"], commitment.as_str());
    assert_eq!(shown["waiting"], 20);
    let position = app
        .get_json(&format!("/v1/queues/{queue}/entries/{}", early[3]))
        .await;
    assert_eq!(position["preQueue"], true, "{position}");
    let public = app.get_json(&format!("/v1/queues/{queue}/draw")).await;
    assert_eq!(public["drawCommitment"], commitment.as_str());
    assert_eq!(public["drawSeed"], Value::Null);
    assert_eq!(public["drawKeys"], json!([]));
    assert!(public.get("members").is_none(), "member ids are not public");

    // The opening passes; the first tick draws.
    let mut drawn = Value::Null;
    for _ in 0..200 {
        drawn = app.get_json(&format!("/v1/admin/queues/{queue}")).await;
        if drawn["drawPhase"] == "done" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(drawn["drawPhase"], "done", "{drawn}");
    let seed = DrawSeed(from_hex_32(drawn["drawSeed"].as_str().unwrap()).unwrap());
    assert_eq!(
        hex::encode(commitment_of(&seed)),
        commitment,
        "SHA-256(seed) is the commitment"
    );
    assert_eq!(drawn["preQueueSize"], 20);
    assert_eq!(drawn["drawnCount"], 20);
    let entrants_hex = hex::encode(entrants_commitment(&early));
    assert_eq!(
        drawn["entrantsCommitment"], entrants_hex,
        "the commitment covers exactly who entered before the close"
    );
    assert_eq!(drawn["entrantCount"], 20);
    assert_eq!(drawn["beacon"], "", "no beacon round: an empty beacon");
    assert_eq!(drawn["drawBeaconRound"], Value::Null);
    let key = draw_key(&seed, &entrants_commitment(&early), &[]);
    assert_eq!(drawn["drawKey"], hex::encode(key.0));

    let late: Vec<String> = ["late-z", "late-a", "late-m"].map(String::from).to_vec();
    for m in &late {
        let position = enter(&app, queue, m).await;
        assert!(position.get("preQueue").is_none(), "{position}");
    }
    let expected = recomputed_order(&seed, &early, &[]);
    for (rank, m) in expected.iter().chain(&late).enumerate() {
        let position = app.get_json(&format!("/v1/queues/{queue}/entries/{m}")).await;
        assert_eq!(position["rank"], rank as u64, "{m}: {position}");
        assert!(position.get("preQueue").is_none(), "{position}");
    }

    // The public read: draw keys, ascending, each a member's HMAC; the admin read: the ids.
    let public = app.get_json(&format!("/v1/queues/{queue}/draw?limit=20")).await;
    let keys: Vec<String> = public["drawKeys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        keys,
        expected
            .iter()
            .map(|m| hex::encode(member_order_key(&key, m)))
            .collect::<Vec<_>>()
    );
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    let page = app
        .get_json(&format!("/v1/queues/{queue}/draw?offset=18&limit=5"))
        .await;
    assert_eq!(page["drawKeys"].as_array().unwrap().len(), 2);
    let admin = app.get_json(&format!("/v1/admin/queues/{queue}/draw")).await;
    assert_eq!(admin["members"], json!(expected));
    assert!(
        !admin["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.as_str().unwrap().starts_with("late")),
        "a member who entered after the close is not in the draw"
    );

    // verify-draw on the real output passes; a tampered order or seed fails.
    let verify = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_rankgate"))
            .args(["queue", "verify-draw"])
            .args(args)
            .output()
            .expect("the rankgate binary runs")
    };
    let (address, queue_arg) = (app.address.clone(), queue.to_string());
    let from_server = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_rankgate"))
            .args(["queue", "verify-draw", "--url", &address, "--queue", &queue_arg])
            .output()
            .expect("the rankgate binary runs")
    })
    .await
    .unwrap();
    assert!(
        from_server.status.success(),
        "{}{}",
        String::from_utf8_lossy(&from_server.stdout),
        String::from_utf8_lossy(&from_server.stderr)
    );
    let files = tempfile::tempdir().unwrap();
    let members_file = files.path().join("members.txt");
    std::fs::write(&members_file, expected.join("\n")).unwrap();
    let seed_hex = hex::encode(seed.0);
    let members_arg = members_file.to_str().unwrap();
    let ok = verify(&[
        "--seed",
        &seed_hex,
        "--commitment",
        &commitment,
        "--entrants-commitment",
        &entrants_hex,
        "--members",
        members_arg,
    ]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let mut tampered = expected.clone();
    tampered.swap(0, 1);
    std::fs::write(&members_file, tampered.join("\n")).unwrap();
    let bad_order = verify(&[
        "--seed",
        &seed_hex,
        "--commitment",
        &commitment,
        "--entrants-commitment",
        &entrants_hex,
        "--members",
        members_arg,
    ]);
    assert_eq!(bad_order.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_order.stdout).contains("does NOT verify"));
    // A late member slipped into the list, in the place the draw key gives them: the list no longer hashes
    // to the published entrants commitment.
    let mut slipped_in = expected.clone();
    slipped_in.push(late[0].clone());
    sort_in_draw_order(&key, &mut slipped_in);
    std::fs::write(&members_file, slipped_in.join("\n")).unwrap();
    let bad_list = verify(&[
        "--seed",
        &seed_hex,
        "--commitment",
        &commitment,
        "--entrants-commitment",
        &entrants_hex,
        "--members",
        members_arg,
    ]);
    assert_eq!(bad_list.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad_list.stdout).contains("entrantsCommitment"),
        "{}",
        String::from_utf8_lossy(&bad_list.stdout)
    );
    std::fs::write(&members_file, expected.join("\n")).unwrap();
    let other_seed = hex::encode([9u8; 32]);
    let bad_seed = verify(&[
        "--seed",
        &other_seed,
        "--commitment",
        &commitment,
        "--entrants-commitment",
        &entrants_hex,
        "--members",
        members_arg,
    ]);
    assert_eq!(bad_seed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_seed.stdout).contains("commitment"));

    // Unpaused, admission follows the drawn order.
    let (status, _) = put(&app, queue, &json!({ "paused": false })).await;
    assert_eq!(status, 200);
    let first = app.position_when_ready(queue, &expected[0]).await;
    assert_eq!(first["status"], "READY", "{first}");
    app.stop().await;
}

/// Two instances on one Redis: the opening (with a beacon round) is set through one, members enter through
/// both, both schedulers tick, the close happens once and both show the same entrants commitment while
/// they hold the queue closed; the beacon supplied through the other draws once, and both answer the same
/// drawn ranks and the same draw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_redis_draw_once_and_agree() {
    let prefix = format!("rgtest:opening:{}:", std::process::id());
    let _cleanup = KeyCleanup::standalone(prefix.clone());
    let configure = |prefix: String| {
        move |config: &mut rankgate::config::Config| {
            config.redis = vec![rankgate_testkit::redis_servers::standalone_url()];
            config.redis_prefix = prefix;
            config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
            config.waiting_room.poll_burst = 10_000;
        }
    };
    let one = spawn_app_with(configure(prefix.clone())).await;
    let two = spawn_app_with(configure(prefix.clone())).await;
    let queue = "redis-launch";
    let (status, body) = put(
        &one,
        queue,
        &json!({ "opensAt": rfc3339_in(3_000), "drawBeaconRound": 31_337 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["drawBeaconRound"], 31_337);
    let commitment = body["drawCommitment"].as_str().unwrap().to_string();
    let shown = two.get_json(&format!("/v1/admin/queues/{queue}")).await;
    assert_eq!(
        shown["drawCommitment"],
        commitment.as_str(),
        "one opening, seen by both"
    );
    let early: Vec<String> = (0..30).map(|i| format!("r-{i:02}")).collect();
    for (i, m) in early.iter().enumerate() {
        let app = if i % 2 == 0 { &one } else { &two };
        let position = enter(app, queue, m).await;
        assert_eq!(position["preQueue"], true, "{position}");
        assert_eq!(position["rank"], Value::Null);
    }
    let closed = wait_for_phase(&two, queue, "awaitingBeacon").await;
    assert_eq!(
        closed["entrantsCommitment"],
        hex::encode(entrants_commitment(&early))
    );
    assert_eq!(closed["drawSeed"], Value::Null);
    // Both instances hold the queue closed (not paused: only the draw holds it).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for (i, m) in early.iter().enumerate() {
        let app = if i % 2 == 0 { &two } else { &one };
        let position = app.get_json(&format!("/v1/queues/{queue}/entries/{m}")).await;
        assert_eq!(position["status"], "WAITING", "{m}: {position}");
        assert_eq!(position["preQueue"], true, "{m}: {position}");
    }
    let shown = one.get_json(&format!("/v1/admin/queues/{queue}")).await;
    assert_eq!(shown["entrantsCommitment"], closed["entrantsCommitment"]);
    let beacon = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    // Pause first, so ranks stay put for the checks below.
    let (status, _) = put(&two, queue, &json!({ "paused": true })).await;
    assert_eq!(status, 200);
    let response = two
        .put_json(
            &format!("/v1/admin/queues/{queue}/draw/beacon"),
            &json!({ "round": 31_337, "value": beacon }),
        )
        .await;
    assert_eq!(response.status(), 200);
    let drawn = wait_for_phase(&one, queue, "done").await;
    assert_eq!(drawn["drawnCount"], 30, "drawn once: nobody twice");
    assert_eq!(drawn["beacon"], beacon);
    let seed = DrawSeed(from_hex_32(drawn["drawSeed"].as_str().unwrap()).unwrap());
    assert_eq!(hex::encode(commitment_of(&seed)), commitment);
    let late = enter(&two, queue, "r-late").await;
    assert_eq!(late["rank"], 30, "{late}");
    let expected = recomputed_order(&seed, &early, &hex::decode(beacon).unwrap());
    for (rank, m) in expected.iter().enumerate() {
        for app in [&one, &two] {
            let position = app.get_json(&format!("/v1/queues/{queue}/entries/{m}")).await;
            assert_eq!(position["rank"], rank as u64, "{m}: {position}");
        }
    }
    let from_one = one.get_json(&format!("/v1/admin/queues/{queue}/draw")).await;
    let from_two = two.get_json(&format!("/v1/admin/queues/{queue}/draw")).await;
    assert_eq!(from_one["members"], json!(expected));
    assert_eq!(from_one, from_two);
    one.stop().await;
    two.stop().await;
}

async fn put_beacon(app: &TestApp, queue: &str, body: &Value) -> (u16, Value) {
    let response = app
        .client
        .put(format!("{}/v1/admin/queues/{queue}/draw/beacon", app.address))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn error_of(body: &Value) -> &str {
    body["error"].as_str().unwrap_or("")
}

/// `drawBeaconRound` and the beacon PUT refuse hostile values with a 400 naming the field, and refuse what
/// cannot apply (no opening; no draw awaiting a beacon) before anything changes.
#[tokio::test]
async fn hostile_beacon_rounds_and_values_get_400_naming_the_field() {
    let app = spawn_app().await;
    let queue = "hostile-beacon";
    for bad in [
        json!(0),
        json!(-1),
        json!(1.5),
        json!("12"),
        json!(true),
        json!([1]),
        json!(9_007_199_254_740_992u64),
    ] {
        let (status, body) = put(
            &app,
            queue,
            &json!({ "opensAt": rfc3339_in(60_000), "drawBeaconRound": bad }),
        )
        .await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(error_of(&body).starts_with("drawBeaconRound:"), "{bad}: {body}");
    }
    assert_eq!(
        app.get("/v1/admin/queues/hostile-beacon").await.status(),
        404,
        "nothing changed"
    );
    let (status, body) = put(&app, queue, &json!({ "drawBeaconRound": 5 })).await;
    assert_eq!(status, 400, "no opening: {body}");
    assert!(error_of(&body).starts_with("drawBeaconRound:"), "{body}");
    let (status, body) = put(&app, queue, &json!({ "opensAt": null, "drawBeaconRound": 5 })).await;
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).starts_with("drawBeaconRound:"), "{body}");

    let (status, body) = put(
        &app,
        queue,
        &json!({ "opensAt": rfc3339_in(60_000), "drawBeaconRound": 9_000 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["drawBeaconRound"], 9_000);
    assert_eq!(body["entrantsCommitment"], Value::Null);
    let hex64 = "ab".repeat(32);
    for (bad, field) in [
        (json!({ "value": hex64 }), "round"),
        (json!({ "round": "9000", "value": hex64 }), "round"),
        (json!({ "round": 0, "value": hex64 }), "round"),
        (json!({ "round": -9000, "value": hex64 }), "round"),
        (json!({ "round": 9000.5, "value": hex64 }), "round"),
        (json!({ "round": 9000 }), "value"),
        (json!({ "round": 9000, "value": 12 }), "value"),
        (json!({ "round": 9000, "value": "" }), "value"),
        (json!({ "round": 9000, "value": "abc" }), "value"),
        (json!({ "round": 9000, "value": "zz" }), "value"),
        (json!({ "round": 9000, "value": "0xab" }), "value"),
        (json!({ "round": 9000, "value": "a".repeat(1_026) }), "value"),
        (json!({ "round": 9000, "value": "é".repeat(10) }), "value"),
    ] {
        let (status, body) = put_beacon(&app, queue, &bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(error_of(&body).starts_with(&format!("{field}:")), "{bad}: {body}");
    }
    for raw in [
        "[]",
        "nope",
        "{\"round\": 9000, \"round\": 9000, \"value\": \"ab\"}",
    ] {
        let response = app
            .client
            .put(format!("{}/v1/admin/queues/{queue}/draw/beacon", app.address))
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{raw}");
    }
    let (status, body) = put_beacon(&app, queue, &json!({ "round": 9001, "value": hex64 })).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error_of(&body).starts_with("round:") && error_of(&body).contains("9000"),
        "{body}"
    );
    let (status, body) = put_beacon(&app, queue, &json!({ "round": 9000, "value": hex64 })).await;
    assert_eq!(status, 409, "before the close no beacon is taken: {body}");
    let (status, body) = put_beacon(&app, "no-such-queue", &json!({ "round": 9000, "value": hex64 })).await;
    assert_eq!(status, 409, "{body}");
    let shown = app.get_json(&format!("/v1/admin/queues/{queue}")).await;
    assert_eq!(
        (shown["beacon"].clone(), shown["drawPhase"].clone()),
        (Value::Null, json!("scheduled"))
    );
}

/// The insider-proof draw end to end on the embedded store (issue 28 item 5): with `drawBeaconRound` the
/// pre-queue closes at `opensAt`, `entrantsCommitment` is published (equal to a recompute from this test's
/// own list), nobody is admitted and entrants keep their pre-queue position however many ticks pass, a
/// member entering after the close queues behind and is not drawn; the beacon PUT (idempotent, a second
/// value refused) lets the next tick draw in the order drawKey = HMAC(seed, entrantsCommitment ‖ beacon)
/// gives; `verify-draw` passes on the real draw and fails on a tampered beacon, entrant list or order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_beacon_round_holds_the_closed_pre_queue_until_the_beacon_and_verify_draw_checks_it() {
    let generous = |config: &mut rankgate::config::Config| config.waiting_room.poll_burst = 10_000;
    let app = spawn_app_with(generous).await;
    let queue = "beacon-launch";
    let (status, body) = put(
        &app,
        queue,
        &json!({ "opensAt": rfc3339_in(2_500), "drawBeaconRound": 5_000_000 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let commitment = body["drawCommitment"].as_str().unwrap().to_string();
    let entrants: Vec<String> = (0..12).map(|i| format!("e-{i:02}")).collect();
    for m in &entrants {
        enter(&app, queue, m).await;
    }
    let closed = wait_for_phase(&app, queue, "awaitingBeacon").await;
    let entrants_hex = hex::encode(entrants_commitment(&entrants));
    assert_eq!(closed["entrantsCommitment"], entrants_hex);
    assert_eq!(closed["entrantCount"], 12);
    assert_eq!(closed["drawBeaconRound"], 5_000_000);
    assert_eq!(
        (closed["drawSeed"].clone(), closed["drawKey"].clone()),
        (Value::Null, Value::Null)
    );
    let public = app.get_json(&format!("/v1/queues/{queue}/draw")).await;
    assert_eq!(
        public["entrantsCommitment"], entrants_hex,
        "published publicly too"
    );
    assert_eq!(public["drawKeys"], json!([]));
    let after_close = enter(&app, queue, "after-close").await;
    assert!(after_close.get("preQueue").is_none(), "{after_close}");
    assert_eq!(after_close["rank"], 12, "{after_close}");
    // Several ticks pass, unpaused: nobody is admitted while the beacon is awaited.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for m in &entrants {
        let position = app.get_json(&format!("/v1/queues/{queue}/entries/{m}")).await;
        assert_eq!(position["status"], "WAITING", "{m}: {position}");
        assert_eq!(position["preQueue"], true, "{m}: {position}");
    }
    let shown = app.get_json(&format!("/v1/admin/queues/{queue}")).await;
    assert_eq!(
        (shown["ready"].clone(), shown["drawPhase"].clone()),
        (json!(0), json!("awaitingBeacon"))
    );

    // Pause so ranks stay put for the checks, then supply the beacon.
    let (status, _) = put(&app, queue, &json!({ "paused": true })).await;
    assert_eq!(status, 200);
    let (status, body) = put(&app, queue, &json!({ "drawBeaconRound": 5_000_001 })).await;
    assert_eq!(status, 409, "the round is fixed at the close: {body}");
    let beacon_hex = "9f1c0a3e5b7d2f4a6c8e0b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a";
    let (status, body) = put_beacon(&app, queue, &json!({ "round": 5_000_000, "value": beacon_hex })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["beacon"], beacon_hex);
    let (status, body) = put_beacon(
        &app,
        queue,
        &json!({ "round": 5_000_000, "value": beacon_hex.to_uppercase() }),
    )
    .await;
    assert_eq!(status, 200, "the same value again is a no-op: {body}");
    let (status, body) = put_beacon(&app, queue, &json!({ "round": 5_000_000, "value": "00" })).await;
    assert_eq!(status, 409, "{body}");
    assert!(error_of(&body).starts_with("value:"), "{body}");

    let drawn = wait_for_phase(&app, queue, "done").await;
    let seed = DrawSeed(from_hex_32(drawn["drawSeed"].as_str().unwrap()).unwrap());
    assert_eq!(hex::encode(commitment_of(&seed)), commitment);
    assert_eq!(drawn["beacon"], beacon_hex);
    let beacon = hex::decode(beacon_hex).unwrap();
    let expected = recomputed_order(&seed, &entrants, &beacon);
    let key = draw_key(&seed, &entrants_commitment(&entrants), &beacon);
    assert_eq!(drawn["drawKey"], hex::encode(key.0));
    let admin = app.get_json(&format!("/v1/admin/queues/{queue}/draw")).await;
    assert_eq!(admin["members"], json!(expected), "after-close is not drawn");
    for (rank, m) in expected
        .iter()
        .chain(["after-close".to_string()].iter())
        .enumerate()
    {
        let position = app.get_json(&format!("/v1/queues/{queue}/entries/{m}")).await;
        assert_eq!(position["rank"], rank as u64, "{m}: {position}");
    }

    // verify-draw: against the server (with the beacon and round fetched independently), then from files.
    let url = |extra: &[&str]| {
        let mut args: Vec<String> = ["--url", app.address.as_str(), "--queue", queue]
            .map(String::from)
            .to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let ok = verify_draw_cli(url(&["--beacon", beacon_hex, "--beacon-round", "5000000"])).await;
    assert!(
        ok.status.success(),
        "{}{}",
        String::from_utf8_lossy(&ok.stdout),
        String::from_utf8_lossy(&ok.stderr)
    );
    let other_beacon = verify_draw_cli(url(&["--beacon", "00ff"])).await;
    assert_eq!(other_beacon.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&other_beacon.stdout).contains("beacon"));
    let other_round = verify_draw_cli(url(&["--beacon-round", "4999999"])).await;
    assert_eq!(other_round.status.code(), Some(1));

    let files = tempfile::tempdir().unwrap();
    let members_file = files.path().join("members.txt");
    let from_files = |members: &[String], beacon: &str| {
        std::fs::write(&members_file, members.join("\n")).unwrap();
        vec![
            "--seed".to_string(),
            hex::encode(seed.0),
            "--commitment".into(),
            commitment.clone(),
            "--entrants-commitment".into(),
            entrants_hex.clone(),
            "--members".into(),
            members_file.to_str().unwrap().to_string(),
            "--beacon".into(),
            beacon.to_string(),
        ]
    };
    let real = verify_draw_cli(from_files(&expected, beacon_hex)).await;
    assert_eq!(
        real.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&real.stdout)
    );
    let mut tampered_beacon = beacon_hex.to_string();
    tampered_beacon.replace_range(0..2, "00");
    let bad_beacon = verify_draw_cli(from_files(&expected, &tampered_beacon)).await;
    assert_eq!(bad_beacon.status.code(), Some(1));
    let no_beacon = verify_draw_cli(from_files(&expected, "")).await;
    assert_eq!(no_beacon.status.code(), Some(1), "the beacon is part of the draw");
    // The list with a member dropped (the rest in its right order) or one added.
    let mut dropped = expected.clone();
    dropped.remove(4);
    let bad_list = verify_draw_cli(from_files(&dropped, beacon_hex)).await;
    assert_eq!(bad_list.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_list.stdout).contains("entrantsCommitment"));
    let mut swapped = expected.clone();
    swapped.swap(2, 3);
    let bad_order = verify_draw_cli(from_files(&swapped, beacon_hex)).await;
    assert_eq!(bad_order.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_order.stdout).contains("order differs"));

    // Unpaused, admission follows the drawn order.
    let (status, _) = put(&app, queue, &json!({ "paused": false })).await;
    assert_eq!(status, 200);
    let first = app.position_when_ready(queue, &expected[0]).await;
    assert_eq!(first["status"], "READY", "{first}");
    app.stop().await;
}
