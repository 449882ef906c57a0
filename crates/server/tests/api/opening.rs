//! Scheduled openings over HTTP (issue 12, SPEC 2.1 `opensAt`): hostile `opensAt` values get 400s; the
//! pre-queue shows in positions; it survives a restart with its commitment; the draw orders it by
//! HMAC-SHA-256(seed, memberId) ahead of every later arrival; the public and admin draw reads; and
//! `rankgate queue verify-draw` passes on the real output and fails on a tampered order or seed.

use std::time::Duration;

use rankgate_core::queue::draw::{commitment_of, draw_key, from_hex_32, sort_in_draw_order};
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

    let late: Vec<String> = ["late-z", "late-a", "late-m"].map(String::from).to_vec();
    for m in &late {
        let position = enter(&app, queue, m).await;
        assert!(position.get("preQueue").is_none(), "{position}");
    }
    let mut expected = early.clone();
    sort_in_draw_order(&seed, &mut expected);
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
            .map(|m| hex::encode(draw_key(&seed, m)))
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
        "--members",
        members_arg,
    ]);
    assert_eq!(bad_order.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_order.stdout).contains("does NOT verify"));
    std::fs::write(&members_file, expected.join("\n")).unwrap();
    let other_seed = hex::encode([9u8; 32]);
    let bad_seed = verify(&[
        "--seed",
        &other_seed,
        "--commitment",
        &commitment,
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

/// Two instances on one Redis: the opening is set through one, members enter through both, both
/// schedulers tick, the draw happens once, and both answer the same drawn ranks and the same draw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_redis_draw_once_and_agree() {
    let prefix = format!("rgtest:opening:{}:", std::process::id());
    let _cleanup = KeyCleanup::standalone(prefix.clone());
    let configure = |prefix: String| {
        move |config: &mut rankgate::config::Config| {
            config.redis = vec!["redis://127.0.0.1:6379".into()];
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
        &json!({ "paused": true, "opensAt": rfc3339_in(3_000) }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
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
    let mut drawn = Value::Null;
    for _ in 0..200 {
        drawn = two.get_json(&format!("/v1/admin/queues/{queue}")).await;
        if drawn["drawPhase"] == "done" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(drawn["drawPhase"], "done", "{drawn}");
    assert_eq!(drawn["drawnCount"], 30, "drawn once: nobody twice");
    let seed = DrawSeed(from_hex_32(drawn["drawSeed"].as_str().unwrap()).unwrap());
    assert_eq!(hex::encode(commitment_of(&seed)), commitment);
    let late = enter(&two, queue, "r-late").await;
    assert_eq!(late["rank"], 30, "{late}");
    let mut expected = early.clone();
    sort_in_draw_order(&seed, &mut expected);
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
