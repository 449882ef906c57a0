//! The HTTP edge under hostile clients (issue 9): header and body deadlines, the connection limit,
//! every error answered as JSON, and no secret in `--help` or a failed connect's message.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::helpers::*;

/// The test's host:port of an app.
fn host_of(app: &TestApp) -> String {
    app.address.trim_start_matches("http://").to_string()
}

/// Reads until the server closes the connection (bounded); returns what it sent.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buffer)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(answer),
            Ok(Ok(n)) => answer.extend_from_slice(&buffer[..n]),
        }
    }
}

/// Asserts a raw HTTP answer has `status`, a JSON content type and an `error` string.
fn assert_raw_json_error(raw: &[u8], status: u16) {
    let text = String::from_utf8_lossy(raw).to_string();
    assert!(
        text.starts_with(&format!("HTTP/1.1 {status}")),
        "expected {status}: {text}"
    );
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{text}"
    );
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert!(body["error"].is_string(), "{text}");
}

/// The server answers others while a hostile client is held off.
async fn assert_still_serving(app: &TestApp) {
    assert_eq!(app.get_json("/healthz").await["status"], "ok");
}

/// Defect 6 of issue 9: a client trickling header lines used to hold its connection forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_header_lines_is_disconnected_after_the_header_timeout() {
    let app = spawn_app_with(|config| config.http.header_timeout_millis = 300).await;
    let mut slow = TcpStream::connect(host_of(&app)).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut closed = false;
    while Instant::now() < deadline {
        // A new header line every 50 ms, forever: never the blank line that ends the head.
        if slow.write_all(b"x-slow: 1\r\n").await.is_err() {
            closed = true;
            break;
        }
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(50), slow.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(_)) => panic!("the server answered a request whose head never ended"),
            Err(_) => {}
        }
        assert_still_serving(&app).await;
    }
    assert!(closed, "the trickling client was never disconnected");
    assert_still_serving(&app).await;
}

/// Defect 6 of issue 9: a client declaring a body it never sends used to hold its connection forever;
/// now it gets a JSON 408 once the body deadline passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_never_sent_gets_408_json_after_the_body_timeout() {
    let app = spawn_app_with(|config| config.http.body_timeout_millis = 300).await;
    let mut slow = TcpStream::connect(host_of(&app)).await.unwrap();
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n[",
        host_of(&app)
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    assert_still_serving(&app).await;
    let answer = read_until_closed(&mut slow, Duration::from_secs(30))
        .await
        .expect("the server gave up on the body and closed the connection");
    assert_raw_json_error(&answer, 408);
    assert_still_serving(&app).await;
}

/// Defect 6 of issue 9: connections past `max_connections` get a JSON 503, and a freed slot serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_max_connections_get_503_json_until_a_slot_frees() {
    let app = spawn_app_with(|config| config.http.max_connections = 2).await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(host_of(&app)).await.unwrap());
    }
    // Both slots are held by the idle connections once the server has accepted them.
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let response = reqwest::Client::new()
            .get(format!("{}/healthz", app.address))
            .send()
            .await
            .unwrap();
        if response.status() == 503 {
            break response;
        }
        assert!(Instant::now() < deadline, "the limit never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(refused.headers()["content-type"], "application/json");
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: serde_json::Value = refused.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("max_connections"),
        "{body}"
    );
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let response = reqwest::Client::new()
            .get(format!("{}/healthz", app.address))
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "a freed slot never served again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Defect 13 of issue 9: rejections by the framework (body limit, bad percent-escape, bad JSON, unknown
/// route, wrong method) used to be plain text or empty; every error answer is now `{"error": …}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_answer_is_json_even_framework_rejections() {
    let app = spawn_app_with(|config| config.max_body_bytes = 1024).await;
    let client = &app.client;
    let url = |path: &str| format!("{}{path}", app.address);
    let big = format!("[{}]", vec!["{}"; 600].join(","));
    let requests = vec![
        (
            "oversize ingest",
            client
                .post(url("/v1/events"))
                .header("content-type", "application/json")
                .body(big.clone()),
            413,
        ),
        (
            "oversize catalogue",
            client
                .put(url("/v1/products/p1"))
                .header("content-type", "application/json")
                .body(big.clone()),
            413,
        ),
        (
            "oversize ranker",
            client.put(url("/v1/admin/rankers/popular")).body(big.clone()),
            413,
        ),
        (
            "oversize entry",
            client.post(url("/v1/queues/sale/entries")).body(big),
            413,
        ),
        (
            "bad percent escape",
            client.get(url("/v1/categories/%FF/top")),
            400,
        ),
        (
            "bad percent escape in a product",
            client.get(url("/v1/products/%C3%28/rank")),
            400,
        ),
        (
            "bad JSON catalogue",
            client
                .put(url("/v1/products/p1"))
                .header("content-type", "application/json")
                .body("{nope"),
            400,
        ),
        (
            "wrong type catalogue",
            client
                .put(url("/v1/products/p1"))
                .header("content-type", "application/json")
                .body("[1]"),
            400,
        ),
        (
            "bad JSON ingest",
            client
                .post(url("/v1/events"))
                .header("content-type", "application/json")
                .body("{nope"),
            400,
        ),
        (
            "bad JSON ranker",
            client.put(url("/v1/admin/rankers/popular")).body("{nope"),
            400,
        ),
        (
            "bad JSON entry",
            client.post(url("/v1/queues/sale/entries")).body("{nope"),
            400,
        ),
        (
            "bad JSON claim",
            client.post(url("/v1/queues/sale/tokens/claim")).body("{nope"),
            400,
        ),
        ("unknown route", client.get(url("/v1/nope")), 404),
        ("wrong method", client.delete(url("/healthz")), 405),
        ("wrong method on ingest", client.get(url("/v1/events")), 405),
    ];
    for (what, request, status) in requests {
        let response = request.send().await.unwrap();
        let got = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string());
        let text = response.text().await.unwrap();
        assert_eq!(got, status, "{what}: {text}");
        assert_eq!(
            content_type.as_deref(),
            Some("application/json"),
            "{what}: {text}"
        );
        let body: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: not JSON: {text}"));
        let error = body["error"].as_str().unwrap_or_else(|| panic!("{what}: {text}"));
        assert!(!error.is_empty(), "{what}");
        if status == 405 {
            assert!(
                error.contains("GET"),
                "{what}: a 405 names the allowed methods: {error}"
            );
        }
    }
}

/// A URL with a password, for the secret tests.
const REDIS_WITH_PASSWORD: &str = "redis://:s3cret@127.0.0.1:1";
const POSTGRES_WITH_PASSWORD: &str = "postgres://u:s3cret@127.0.0.1:1/x";

fn rankgate() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rankgate"));
    command.env_remove("RANKGATE_LOG");
    command
}

/// Defect 9 of issue 9: `serve --help` printed `RANKGATE_REDIS=redis://:password@…`.
#[test]
fn serve_help_does_not_show_secret_env_values() {
    let output = rankgate()
        .args(["serve", "--help"])
        .env("RANKGATE_REDIS", REDIS_WITH_PASSWORD)
        .env("RANKGATE_STREAM", format!("{REDIS_WITH_PASSWORD}/events"))
        .env("RANKGATE_DATABASE", POSTGRES_WITH_PASSWORD)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("RANKGATE_REDIS"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}

/// Defect 9 of issue 9: a failed connect quoted the URL, password included, in its error.
#[test]
fn a_failed_connect_does_not_show_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let stream = format!("{REDIS_WITH_PASSWORD}/events");
    let runs: [&[&str]; 4] = [
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir,
            "--redis",
            REDIS_WITH_PASSWORD,
        ],
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir,
            "--database",
            POSTGRES_WITH_PASSWORD,
        ],
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data_dir,
            "--stream",
            &stream,
        ],
        &["migrate", "--database", POSTGRES_WITH_PASSWORD],
    ];
    for args in runs {
        let output = rankgate().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        let stdout = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(
            !output.status.success(),
            "{args:?} cannot connect: {stdout}{stderr}"
        );
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("s3cret") && !stdout.contains("s3cret"),
            "{args:?}: {stdout}{stderr}"
        );
    }
}

/// Reads `count` answers (each with a `content-length`) from `stream`: (head without `date`, body).
async fn read_answers(stream: &mut TcpStream, count: usize) -> Vec<(String, String)> {
    let mut raw = Vec::new();
    let mut answers = Vec::new();
    let mut buffer = [0u8; 4096];
    while answers.len() < count {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(n > 0, "closed after {} answers", answers.len());
        raw.extend_from_slice(&buffer[..n]);
        while let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(raw[..end].to_vec()).unwrap();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .expect("a content-length")
                .parse()
                .unwrap();
            if raw.len() < end + 4 + length {
                break;
            }
            let body = String::from_utf8(raw[end + 4..end + 4 + length].to_vec()).unwrap();
            raw.drain(..end + 4 + length);
            let head: Vec<&str> = head.lines().filter(|line| !line.starts_with("date: ")).collect();
            answers.push((head.join("\r\n"), body));
        }
    }
    answers
}

/// Issue 10: a connection's plain rank reads are answered by the fast lane ahead of hyper, in the bytes
/// hyper answers them in through the router; the first other request hands the connection to hyper,
/// which then serves everything on it, rank reads included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_lane_answers_rank_reads_as_hyper_does_and_hands_anything_else_to_hyper() {
    let app = spawn_app().await;
    let now = now_millis();
    app.post_events_ok(&serde_json::json!([
        sale("s1", "p1", now, 3, 100, &["toys"]),
        sale("s2", "p2", now, 5, 100, &["toys"]),
    ]))
    .await;
    let rank = "GET /v1/products/p1/rank?window=7d&category=toys HTTP/1.1\r\nHost: x\r\n\r\n";
    let bad = "GET /v1/products/p1/rank?window=8d HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut stream = TcpStream::connect(host_of(&app)).await.unwrap();
    // Pipelined, in one write: the lane answers all three in order.
    stream
        .write_all(format!("{rank}{bad}{rank}").as_bytes())
        .await
        .unwrap();
    let lane = read_answers(&mut stream, 3).await;
    assert!(lane[0].0.starts_with("HTTP/1.1 200 OK\r\n"), "{lane:?}");
    assert!(
        lane[0].1.contains(r#""productId":"p1""#) && lane[0].1.contains(r#""rank":2"#),
        "{lane:?}"
    );
    assert_eq!(lane[0], lane[2]);
    assert!(lane[1].0.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{lane:?}");
    assert!(lane[1].1.contains("window"), "{lane:?}");
    // `/healthz` is hyper's: from here on hyper serves this connection, and answers the same bytes.
    stream
        .write_all(format!("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n{rank}{bad}").as_bytes())
        .await
        .unwrap();
    let hyper = read_answers(&mut stream, 3).await;
    assert!(hyper[0].1.contains(r#""status":"ok""#), "{hyper:?}");
    assert_eq!(
        hyper[1], lane[0],
        "a rank read, through hyper and the router's edge"
    );
    assert_eq!(hyper[2], lane[1], "a refused rank read, through hyper");
    // A percent-escaped segment, on a fresh connection: hyper and the router decode it, same answer.
    let mut escaped = TcpStream::connect(host_of(&app)).await.unwrap();
    escaped
        .write_all(rank.replace("/p1/", "/%70%31/").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answers(&mut escaped, 1).await[0], lane[0]);
}

/// Pauses `queue` through the admin API, so no admission tick changes its members' status mid-test.
async fn pause(app: &TestApp, queue: &str) {
    let response = app
        .client
        .put(format!("{}/v1/admin/queues/{queue}", app.address))
        .json(&serde_json::json!({ "paused": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

/// A response head without its `content-length`, which a position's random polling jitter changes.
fn without_length(head: &str) -> String {
    head.lines()
        .filter(|line| !line.starts_with("content-length: "))
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// A position body without `pollingIntervalSeconds`, which carries random jitter, and without an
/// entry's `ticket`, which names its queue (the two paths' queues differ).
fn position(body: &str) -> serde_json::Value {
    let mut value: serde_json::Value = serde_json::from_str(body).unwrap();
    value.as_object_mut().unwrap().remove("pollingIntervalSeconds");
    value.as_object_mut().unwrap().remove("ticket");
    value
}

/// Issue 13: a waiting member's position polls take the fast lane too, and answer what hyper and the
/// router answer: the position with its `RateLimit` headers, the 429 once the burst is spent, a refused
/// queue name naming the field. Two queues with one member each, so the two paths see the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_lane_answers_position_polls_as_hyper_and_the_router_do() {
    let app = spawn_app_with(|config| config.waiting_room.poll_burst = 1).await;
    for queue in ["lane-a", "lane-b"] {
        // Paused, so no admission tick makes one member READY before the other is polled.
        pause(&app, queue).await;
        let response = app
            .client
            .post(format!("{}/v1/queues/{queue}/entries", app.address))
            .json(&serde_json::json!({ "memberId": "m-1" }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    // Issue 29: a poll shows the member's ticket; none gets 401, another member's 403, a tampered one
    // 401, all in JSON and never a position, on the lane as through hyper and the router.
    let polls = |queue: &str| {
        let ticket = app.ticket(queue, "m-1");
        let others = app.ticket(queue, "m-2");
        let tampered = format!("{}A", &ticket[..ticket.len() - 1]);
        format!(
            "GET /v1/queues/{queue}/entries/m-1 HTTP/1.1\r\nHost: x\r\nX-Queue-Ticket: {ticket}\r\n\r\n\
             GET /v1/queues/{queue}/entries/m-1?ignored=1 HTTP/1.1\r\nHost: x\r\nX-Queue-Ticket: {ticket}\r\n\r\n\
             GET /v1/queues/Bad!Queue/entries/m-1 HTTP/1.1\r\nHost: x\r\n\r\n\
             GET /v1/queues/{queue}/entries/m-1 HTTP/1.1\r\nHost: x\r\n\r\n\
             GET /v1/queues/{queue}/entries/m-1 HTTP/1.1\r\nHost: x\r\nX-Queue-Ticket: {others}\r\n\r\n\
             GET /v1/queues/{queue}/entries/m-1 HTTP/1.1\r\nHost: x\r\nX-Queue-Ticket: {tampered}\r\n\r\n"
        )
    };
    let mut lane_stream = TcpStream::connect(host_of(&app)).await.unwrap();
    lane_stream.write_all(polls("lane-a").as_bytes()).await.unwrap();
    let lane = read_answers(&mut lane_stream, 6).await;
    // `/healthz` hands this connection to hyper first, so the same polls go through the router.
    let mut hyper_stream = TcpStream::connect(host_of(&app)).await.unwrap();
    hyper_stream
        .write_all(format!("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n{}", polls("lane-b")).as_bytes())
        .await
        .unwrap();
    let hyper = read_answers(&mut hyper_stream, 7).await[1..].to_vec();

    assert!(lane[0].0.starts_with("HTTP/1.1 200 OK\r\n"), "{lane:?}");
    assert!(lane[0].0.contains("\r\nratelimit: \"poll\";r=0;"), "{lane:?}");
    // The polling interval carries random jitter, so its digits (and the length) may differ; the rest
    // of the head and of the position is the same.
    assert_eq!(
        without_length(&lane[0].0),
        without_length(&hyper[0].0),
        "the same status and headers, in the same order"
    );
    assert_eq!(position(&lane[0].1), position(&hyper[0].1));
    assert_eq!(position(&lane[0].1)["status"], "WAITING", "{lane:?}");
    assert_eq!(position(&lane[0].1)["rank"], 0, "{lane:?}");
    assert!(
        lane[1].0.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
        "{lane:?}"
    );
    assert!(lane[1].0.contains("\r\nretry-after: "), "{lane:?}");
    assert_eq!(lane[1], hyper[1], "the spent burst's 429");
    assert!(lane[2].0.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{lane:?}");
    assert!(lane[2].1.contains("queue"), "{lane:?}");
    assert_eq!(lane[2], hyper[2], "a refused queue name");
    for (i, status, names) in [
        (3, "401 Unauthorized", "missing"),
        (4, "403 Forbidden", "another member"),
        (5, "401 Unauthorized", "not a ticket"),
    ] {
        assert!(
            lane[i].0.starts_with(&format!("HTTP/1.1 {status}\r\n")),
            "{i}: {lane:?}"
        );
        assert!(lane[i].1.contains(names), "{i}: {lane:?}");
        assert!(!lane[i].1.contains("rank"), "no position: {lane:?}");
        let hyper_in_lane_a = (hyper[i].0.clone(), hyper[i].1.replace("lane-b", "lane-a"));
        assert_eq!(lane[i], hyper_in_lane_a, "{i}");
    }
}

/// Issue 13: entries take the fast lane too when their body came with the head, and answer what hyper
/// and the router answer: the position, the same position for a member entering twice, a refused body
/// naming the field. A body that arrives after its head, and one over `max_body_bytes`, are hyper's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_lane_answers_entries_as_hyper_and_the_router_do() {
    let app = spawn_app_with(|config| config.max_body_bytes = 256).await;
    for queue in ["lane-a", "lane-b"] {
        // Paused, so no admission tick changes a member's status between the two paths' answers.
        pause(&app, queue).await;
    }
    let post = |queue: &str, body: &str| {
        format!(
            "POST /v1/queues/{queue}/entries HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let post_with_ticket = |queue: &str, member: &str| {
        let body = format!(r#"{{"memberId":"{member}"}}"#);
        format!(
            "POST /v1/queues/{queue}/entries HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             X-Queue-Ticket: {}\r\nContent-Length: {}\r\n\r\n{body}",
            app.ticket(queue, member),
            body.len()
        )
    };
    let entries = |queue: &str| {
        [
            post(queue, r#"{"memberId":"m-1"}"#),
            post(queue, r#"{"memberId":"m-2"}"#),
            post_with_ticket(queue, "m-1"),
            post(queue, r#"{"memberId":"m-3","memberId":"m-4"}"#),
            post(queue, r#"{"memberId":7}"#),
            post(queue, "not json"),
            post("Bad!Queue", r#"{"memberId":"m-1"}"#),
            post(queue, r#"{"memberId":"m-2"}"#),
        ]
        .concat()
    };
    let mut lane_stream = TcpStream::connect(host_of(&app)).await.unwrap();
    lane_stream.write_all(entries("lane-a").as_bytes()).await.unwrap();
    let lane = read_answers(&mut lane_stream, 8).await;
    let mut hyper_stream = TcpStream::connect(host_of(&app)).await.unwrap();
    hyper_stream
        .write_all(format!("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n{}", entries("lane-b")).as_bytes())
        .await
        .unwrap();
    let hyper = read_answers(&mut hyper_stream, 9).await[1..].to_vec();

    for (i, (lane, hyper)) in lane.iter().zip(&hyper).take(3).enumerate() {
        assert!(lane.0.starts_with("HTTP/1.1 200 OK\r\n"), "{i}: {lane:?}");
        assert_eq!(without_length(&lane.0), without_length(&hyper.0), "{i}");
        assert_eq!(position(&lane.1), position(&hyper.1), "{i}");
    }
    assert_eq!(position(&lane[0].1)["rank"], 0, "{lane:?}");
    assert_eq!(position(&lane[1].1)["rank"], 1, "{lane:?}");
    // The waiting count grew with m-2; the place and status did not.
    for field in ["rank", "status"] {
        assert_eq!(
            position(&lane[2].1)[field],
            position(&lane[0].1)[field],
            "entering twice keeps the place: {lane:?}"
        );
    }
    assert_eq!(position(&lane[2].1)["currentTotalWaitingCount"], 2, "{lane:?}");
    // Issue 29: every entry answer names its member and carries its ticket; a member already in the
    // queue is answered only to its own ticket.
    assert_eq!(position(&lane[1].1)["memberId"], "m-2", "{lane:?}");
    let ticket: serde_json::Value = serde_json::from_str(&lane[1].1).unwrap();
    let polled = app
        .client
        .get(app.url("/v1/queues/lane-a/entries/m-2"))
        .header("x-queue-ticket", ticket["ticket"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(polled.status(), 200, "the entry's ticket proves its member");
    assert!(lane[7].0.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{lane:?}");
    assert!(
        lane[7].1.contains("already in this queue") && !lane[7].1.contains("rank"),
        "{lane:?}"
    );
    assert_eq!(lane[7], hyper[7], "a held id without its ticket");
    for (i, field) in [(3, "memberId"), (4, "memberId"), (5, "body"), (6, "queue")] {
        assert!(
            lane[i].0.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{i}: {lane:?}"
        );
        assert!(lane[i].1.contains(field), "{i}: {lane:?}");
        assert_eq!(lane[i], hyper[i], "{i}");
    }

    // The body in a second write: hyper reads it (and serves the connection from then on).
    let mut split = TcpStream::connect(host_of(&app)).await.unwrap();
    let whole = post("lane-a", r#"{"memberId":"m-5"}"#);
    let (head, body) = whole.split_at(whole.find("\r\n\r\n").unwrap() + 4);
    split.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    split.write_all(body.as_bytes()).await.unwrap();
    let answer = read_answers(&mut split, 1).await;
    assert!(answer[0].0.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
    assert_eq!(position(&answer[0].1)["rank"], 2, "{answer:?}");
    // Over the limit: the router's 413, in JSON.
    let mut large = TcpStream::connect(host_of(&app)).await.unwrap();
    let padding = "x".repeat(300);
    large
        .write_all(post("lane-a", &format!(r#"{{"memberId":"m-6","pad":"{padding}"}}"#)).as_bytes())
        .await
        .unwrap();
    let answer = read_answers(&mut large, 1).await;
    assert!(answer[0].0.starts_with("HTTP/1.1 413 "), "{answer:?}");
    assert!(answer[0].1.starts_with('{'), "{answer:?}");
}

/// Graceful shutdown reaches connections in the fast lane: an idle one is closed, and the server stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_connections_in_the_fast_lane() {
    let app = spawn_app().await;
    let mut stream = TcpStream::connect(host_of(&app)).await.unwrap();
    stream
        .write_all(b"GET /v1/products/p1/rank HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_answers(&mut stream, 1).await;
    assert!(answer[0].0.starts_with("HTTP/1.1 200 OK"), "{answer:?}");
    let stopped = tokio::time::timeout(Duration::from_secs(10), app.stop()).await;
    assert!(
        stopped.is_ok(),
        "shutdown waited on an idle keep-alive connection"
    );
    assert_eq!(
        read_until_closed(&mut stream, Duration::from_secs(5)).await,
        Some(Vec::new()),
        "the idle connection is closed, with nothing more sent"
    );
}

/// Issue 29 (a browser check): heads the HTTP parser refuses (a control byte in a header on any route, a
/// bad request line, a head past 64 KiB) used to get a bodiless `400`/`431`; README promises JSON for
/// every error, whatever its origin. The answer closes the connection, and the server serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_the_parser_refuses_get_json_errors_naming_what_is_wrong() {
    let app = spawn_app().await;
    let huge_cookie = format!("Cookie: c={}\r\n", "x".repeat(70 * 1024));
    let cases: [(Vec<u8>, u16, &str); 5] = [
        (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Foo: a\x01b\r\n\r\n".to_vec(),
            400,
            "header value",
        ),
        (
            b"GET /v1/queues/q1/entries/m1 HTTP/1.1\r\nHost: x\r\nX-Member-Id: m\x01x\r\n\r\n".to_vec(),
            400,
            "header value",
        ),
        (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n".to_vec(),
            400,
            "header name",
        ),
        (b"GARBAGE\r\n\r\n".to_vec(), 400, "request line"),
        (
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{huge_cookie}\r\n").into_bytes(),
            431,
            "65536 bytes",
        ),
    ];
    for (request, status, names) in cases {
        let mut stream = TcpStream::connect(host_of(&app)).await.unwrap();
        // A server that answers before reading the whole head may reset the rest of the write.
        let _ = stream.write_all(&request).await;
        let raw = read_until_closed(&mut stream, Duration::from_secs(10))
            .await
            .expect("the server answers and closes");
        assert_raw_json_error(&raw, status);
        let text = String::from_utf8_lossy(&raw);
        assert!(text.contains(names), "{status} names {names:?}: {text}");
        assert!(text.to_ascii_lowercase().contains("connection: close"), "{text}");
    }
    assert_still_serving(&app).await;
}
