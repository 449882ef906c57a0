//! Issue 28, SPEC 2.2 "Entry challenges" and "Per-address budgets": bots pay, people don't wait behind
//! them. Hostile scripts open hundreds of visitors from one address; each test counts what got in
//! against the budget, checks every refusal is JSON naming its reason, and restarts the server on the
//! same data to see it answer the same.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rankgate_core::queue::challenge::solve;
use serde_json::{json, Value};

use crate::helpers::*;
use crate::redis_servers::KeyCleanup;

/// The default budget (SPEC 2.2): tests turn it on again (`support/app.rs` turns it off for the rest).
const BUDGET: u32 = 30;

fn with_budget(budget: u32) -> impl FnOnce(&mut rankgate::config::Config) {
    move |config| config.waiting_room.entries_per_address_per_minute = budget
}

async fn put_settings(app: &TestApp, queue: &str, body: Value) -> reqwest::Response {
    app.client
        .put(app.url(&format!("/v1/admin/queues/{queue}")))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn admin_view(app: &TestApp, queue: &str) -> Value {
    app.get(&format!("/v1/admin/queues/{queue}"))
        .await
        .json()
        .await
        .unwrap()
}

/// `rankgate_queue_entries_refused_total{queue,reason}` as `/metrics` shows it (0 when absent).
async fn refused_metric(app: &TestApp, queue: &str, reason: &str) -> u64 {
    let metrics = app.get("/metrics").await.text().await.unwrap();
    let series = format!("rankgate_queue_entries_refused_total{{queue=\"{queue}\",reason=\"{reason}\"}} ");
    let series_swapped =
        format!("rankgate_queue_entries_refused_total{{reason=\"{reason}\",queue=\"{queue}\"}} ");
    metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix(&series)
                .or_else(|| line.strip_prefix(&series_swapped))
        })
        .map_or(0, |value| value.trim().parse::<f64>().unwrap() as u64)
}

/// What one entry got: its status and JSON body.
async fn enter(
    app: &TestApp,
    queue: &str,
    body: Value,
    headers: &[(&str, String)],
) -> (u16, Value, Option<String>) {
    let mut request = app
        .client
        .post(app.url(&format!("/v1/queues/{queue}/entries")))
        .json(&body);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().unwrap().to_owned());
    let content_type = response
        .headers()
        .get("content-type")
        .map(|value| value.to_str().unwrap().to_owned());
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if status != 200 {
        assert_eq!(
            content_type.as_deref(),
            Some("application/json"),
            "{status} {body}"
        );
    }
    (status, body, retry_after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_opening_500_visitors_gets_the_budget_in_and_restarts_the_same() {
    let app = TestApp::builder().configure(with_budget(BUDGET)).spawn().await;
    assert_eq!(
        put_settings(&app, "drop", json!({"paused": true})).await.status(),
        200
    );
    // 500 cookieless, credential-less visitors at once, as `curl` in a loop would be.
    let outcomes = join_all((0..500).map(|_| enter(&app, "drop", json!({}), &[]))).await;
    let mut tickets = Vec::new();
    let mut refused = 0;
    for (status, body, retry_after) in &outcomes {
        match status {
            200 => tickets.push((
                body["memberId"].as_str().unwrap().to_owned(),
                body["ticket"].as_str().unwrap().to_owned(),
            )),
            429 => {
                refused += 1;
                assert_eq!(body["reason"], "address", "{body}");
                assert!(
                    body["error"]
                        .as_str()
                        .unwrap()
                        .starts_with("entries_per_address_per_minute"),
                    "{body}"
                );
                let seconds: u64 = retry_after.as_deref().expect("Retry-After").parse().unwrap();
                // The sliding window counts in twelve 5 s buckets: room returns within a minute and a bucket.
                assert!((1..=65).contains(&seconds), "{seconds}");
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(
        tickets.len(),
        BUDGET as usize,
        "exactly the budget gets in within the minute"
    );
    assert_eq!(refused, 500 - BUDGET as usize);
    assert_eq!(admin_view(&app, "drop").await["waiting"], BUDGET);
    assert_eq!(refused_metric(&app, "drop", "address").await, 470);
    // The refusals reach the admin view and the sale report, beside the arrivals that got in.
    let refused = json!({"challenge": 0, "address": 470, "captcha": 0});
    assert_eq!(admin_view(&app, "drop").await["refused"], refused);
    let report: Value = app
        .get("/v1/admin/queues/drop/report")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&report["totals"]["arrivals"], &report["totals"]["refused"]),
        (&json!(30), &refused)
    );

    // A member's own re-entry (its ticket) does not count against the spent budget.
    let (member, ticket) = &tickets[0];
    let (status, body, _) = enter(
        &app,
        "drop",
        json!({"memberId": member}),
        &[("x-queue-ticket", ticket.clone())],
    )
    .await;
    assert_eq!((status, body["rank"].as_u64().is_some()), (200, true), "{body}");

    // The waiting page's cookieless visitors spend a budget of their own queue the same way.
    let mut page_statuses = HashMap::new();
    for _ in 0..40 {
        let response = app.get("/wait/page-drop").await;
        *page_statuses.entry(response.status().as_u16()).or_insert(0) += 1;
    }
    assert_eq!(page_statuses, HashMap::from([(200, 30), (429, 10)]));

    // Restarted on the same data: the same line, the budget still spent for this minute on the embedded
    // limiter's restart (a fresh in-memory window: the members stay, new entries may come in again).
    let dir = app.stop().await.expect("the app owned its dir");
    let app = TestApp::builder()
        .configure(with_budget(BUDGET))
        .in_temp_dir(dir)
        .spawn()
        .await;
    let view = admin_view(&app, "drop").await;
    assert_eq!(
        (view["waiting"].as_u64(), view["paused"].as_bool()),
        (Some(30), Some(true))
    );
    let (status, body, _) = enter(
        &app,
        "drop",
        json!({"memberId": member}),
        &[("x-queue-ticket", ticket.clone())],
    )
    .await;
    assert_eq!((status, &body["memberId"]), (200, &json!(member)), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_proxies_name_the_client_and_ipv6_counts_by_its_64() {
    let app = TestApp::builder()
        .configure(with_budget(2))
        .configure(|config| {
            config.waiting_room.member_auth_file.trusted_proxies = vec!["127.0.0.1".into()];
            config.waiting_room.resolve_entry_guards().unwrap();
        })
        .spawn()
        .await;
    let from = |hops: &str| vec![("x-forwarded-for", hops.to_owned())];
    let status = |outcome: (u16, Value, Option<String>)| outcome.0;
    // Two addresses, two budgets of two.
    for client in ["203.0.113.1", "203.0.113.2"] {
        for expected in [200, 200, 429] {
            assert_eq!(
                status(enter(&app, "xff", json!({}), &from(client)).await),
                expected,
                "{client}"
            );
        }
    }
    // What a client writes left of the hop our proxy saw is not believed.
    assert_eq!(
        status(enter(&app, "xff", json!({}), &from("198.51.100.9, 203.0.113.1")).await),
        429
    );
    // Forwarded (RFC 7239) is read too, and wins.
    let forwarded = vec![("forwarded", "for=\"[2001:db8:1:2::a]:443\"".to_owned())];
    assert_eq!(status(enter(&app, "xff", json!({}), &forwarded).await), 200);
    // The same /64 shares the budget; the next /64 has its own.
    assert_eq!(
        status(enter(&app, "xff", json!({}), &from("2001:db8:1:2:ffff::1")).await),
        200
    );
    assert_eq!(
        status(enter(&app, "xff", json!({}), &from("2001:db8:1:2::7")).await),
        429
    );
    assert_eq!(
        status(enter(&app, "xff", json!({}), &from("2001:db8:1:3::7")).await),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_peer_cannot_pick_its_address() {
    let app = TestApp::builder().configure(with_budget(2)).spawn().await;
    for (index, expected) in [200, 200, 429, 429].into_iter().enumerate() {
        let forged = vec![("x-forwarded-for", format!("203.0.113.{index}"))];
        assert_eq!(enter(&app, "forged", json!({}), &forged).await.0, expected);
    }
}

/// Solves a fresh challenge of `queue` for this client: the solution header and the hashes it took.
async fn solved_challenge(app: &TestApp, queue: &str) -> (String, u64) {
    let challenge: Value = app
        .get(&format!("/v1/queues/{queue}/challenge"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(challenge["kind"], "pow", "{challenge}");
    assert_eq!(challenge["algorithm"], "sha256");
    let text = challenge["challenge"].as_str().unwrap();
    let difficulty = challenge["difficulty"].as_u64().unwrap() as u32;
    let nonce = solve(text, difficulty);
    (format!("{text}:{nonce}"), nonce + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proof_of_work_costs_every_place_and_refuses_replays_and_foreign_solutions() {
    let app = TestApp::builder().configure(with_budget(BUDGET)).spawn().await;
    let settings = put_settings(
        &app,
        "pow",
        json!({"paused": true, "entryChallenge": "pow", "powDifficulty": 16}),
    )
    .await;
    assert_eq!(settings.status(), 200);
    let settings: Value = settings.json().await.unwrap();
    assert_eq!(
        (&settings["entryChallenge"], &settings["powDifficulty"]),
        (&json!("pow"), &json!(16))
    );

    // The 500-visitor script without solutions: 428 with a challenge each, nobody in.
    let bare = join_all((0..500).map(|_| enter(&app, "pow", json!({}), &[]))).await;
    for (status, body, _) in &bare {
        assert_eq!(*status, 428, "{body}");
        assert_eq!(body["reason"], "challenge");
        assert!(body["error"].as_str().unwrap().starts_with("X-Queue-Challenge"));
        assert_eq!(body["challenge"]["kind"], "pow");
        assert_eq!(body["challenge"]["difficulty"], 16);
        assert!(body["challenge"]["expiresAt"].as_str().is_some());
    }
    assert_eq!(admin_view(&app, "pow").await["waiting"], 0);

    // Solving: every place costs work, and still no more than the budget gets in.
    let mut hashes = Vec::new();
    let mut admitted = 0;
    let mut spent_solution = None;
    let started = Instant::now();
    for _ in 0..(BUDGET + 5) {
        let (solution, cost) = solved_challenge(&app, "pow").await;
        hashes.push(cost);
        let (status, body, _) =
            enter(&app, "pow", json!({}), &[("x-queue-challenge", solution.clone())]).await;
        match status {
            200 => {
                admitted += 1;
                spent_solution.get_or_insert(solution);
            }
            429 => assert_eq!(body["reason"], "address", "{body}"),
            other => panic!("{other}: {body}"),
        }
    }
    let solving = started.elapsed();
    assert_eq!(admitted, BUDGET);
    let mean = hashes.iter().sum::<u64>() as f64 / hashes.len() as f64;
    // 2^16 hashes on average at difficulty 16; far fewer would mean the server checked nothing.
    assert!(mean > 4096.0, "mean hashes per place {mean}");
    println!(
        "pow 16: {} places, mean {mean:.0} hashes per place, {:.1} ms per place solving in this test's build",
        hashes.len(),
        solving.as_secs_f64() * 1000.0 / hashes.len() as f64
    );

    // A replayed solution: refused, naming why.
    let (status, body, _) = enter(
        &app,
        "pow",
        json!({}),
        &[("x-queue-challenge", spent_solution.clone().unwrap())],
    )
    .await;
    assert_eq!((status, &body["reason"]), (428, &json!("challenge")));
    assert!(body["error"].as_str().unwrap().contains("already used"), "{body}");
    // A solution of another queue's challenge.
    put_settings(
        &app,
        "other",
        json!({"entryChallenge": "pow", "powDifficulty": 4}),
    )
    .await;
    put_settings(&app, "pow", json!({"powDifficulty": 4})).await;
    let (foreign, _) = solved_challenge(&app, "other").await;
    let (status, body, _) = enter(&app, "pow", json!({}), &[("x-queue-challenge", foreign)]).await;
    assert_eq!((status, &body["reason"]), (428, &json!("challenge")));
    assert!(
        body["error"].as_str().unwrap().contains("another queue"),
        "{body}"
    );
    // The body's fields work like the header, and a wrong nonce is refused.
    let (solution, _) = solved_challenge(&app, "pow").await;
    let (challenge, nonce) = solution.rsplit_once(':').unwrap();
    let wrong = (0u64..)
        .map(|n| n.to_string())
        .find(|n| !rankgate_core::queue::challenge::solves(challenge, n, 4))
        .unwrap();
    let (status, body, _) = enter(&app, "pow", json!({"challenge": challenge, "nonce": wrong}), &[]).await;
    assert_eq!((status, &body["reason"]), (428, &json!("challenge")));
    assert!(
        body["error"].as_str().unwrap().contains("does not solve"),
        "{body}"
    );
    let (status, body, _) = enter(&app, "pow", json!({"challenge": challenge}), &[]).await;
    assert_eq!(
        (status, body["error"].as_str().unwrap().starts_with("nonce")),
        (400, true)
    );
    // The budget is spent: the right solution now gets the address refusal, after the work.
    let (status, body, _) = enter(&app, "pow", json!({"challenge": challenge, "nonce": nonce}), &[]).await;
    assert_eq!((status, &body["reason"]), (429, &json!("address")));

    let challenge_refusals = refused_metric(&app, "pow", "challenge").await;
    assert_eq!(
        challenge_refusals,
        500 + 3,
        "500 bare, one replay, one foreign, one wrong nonce"
    );
    assert_eq!(refused_metric(&app, "pow", "address").await, 5 + 1);

    // Restarted on the same data: the same settings and line, and an entry without work is still refused.
    let dir = app.stop().await.expect("the app owned its dir");
    let app = TestApp::builder()
        .configure(with_budget(BUDGET))
        .in_temp_dir(dir)
        .spawn()
        .await;
    let view = admin_view(&app, "pow").await;
    assert_eq!(
        (
            view["waiting"].as_u64(),
            &view["entryChallenge"],
            &view["powDifficulty"]
        ),
        (Some(u64::from(BUDGET)), &json!("pow"), &json!(4))
    );
    let (status, body, _) = enter(&app, "pow", json!({}), &[]).await;
    assert_eq!((status, &body["reason"]), (428, &json!("challenge")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_of_the_guards_are_checked_and_kept_on_redis_across_instances() {
    let prefix = format!("rgtest:guards:{}:", std::process::id());
    let _cleanup = KeyCleanup::standalone(prefix.clone());
    let on_redis = |prefix: String| {
        move |config: &mut rankgate::config::Config| {
            config.redis = vec![rankgate_testkit::redis_servers::standalone_url()];
            config.redis_prefix = prefix;
            config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
            config.waiting_room.entries_per_address_per_minute = 3;
        }
    };
    let a = TestApp::builder()
        .configure(on_redis(prefix.clone()))
        .spawn()
        .await;
    let b = TestApp::builder()
        .configure(on_redis(prefix.clone()))
        .spawn()
        .await;
    for (body, field) in [
        (json!({"entryChallenge": "maybe"}), "entryChallenge"),
        (json!({"entryChallenge": "captcha"}), "entryChallenge"),
        (json!({"powDifficulty": 33}), "powDifficulty"),
        (json!({"powDifficulty": -1}), "powDifficulty"),
        (json!({"powDifficulty": "18"}), "powDifficulty"),
    ] {
        let response = put_settings(&a, "shared", body.clone()).await;
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.unwrap();
        assert!(
            error["error"].as_str().unwrap().starts_with(field),
            "{body}: {error}"
        );
    }
    let put = put_settings(
        &a,
        "shared",
        json!({"paused": true, "entryChallenge": "pow", "powDifficulty": 6}),
    )
    .await;
    assert_eq!(put.status(), 200);
    // Instance b reads them from Redis within its one-second copy.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let view = admin_view(&b, "shared").await;
    assert_eq!(
        (&view["entryChallenge"], &view["powDifficulty"]),
        (&json!("pow"), &json!(6))
    );
    // A solution spent on a is spent on b too; a challenge issued by b checks on a.
    let (solution, _) = solved_challenge(&b, "shared").await;
    let header = [("x-queue-challenge", solution)];
    assert_eq!(enter(&a, "shared", json!({}), &header).await.0, 200);
    let (status, body, _) = enter(&b, "shared", json!({}), &header).await;
    assert_eq!((status, &body["reason"]), (428, &json!("challenge")), "{body}");
    // The budget of three is global: two more on b, then the fourth is refused on a.
    for app in [&b, &b] {
        let (solution, _) = solved_challenge(app, "shared").await;
        assert_eq!(
            enter(app, "shared", json!({}), &[("x-queue-challenge", solution)])
                .await
                .0,
            200
        );
    }
    let (solution, _) = solved_challenge(&a, "shared").await;
    let (status, body, _) = enter(&a, "shared", json!({}), &[("x-queue-challenge", solution)]).await;
    assert_eq!((status, &body["reason"]), (429, &json!("address")), "{body}");
    assert_eq!(admin_view(&a, "shared").await["waiting"], 3);
}

/// A local server speaking the CAPTCHA providers' siteverify protocol: `success` when the form's
/// `secret` is `site-secret` and its `response` is `human`; it records every form it got. `delay`
/// holds each answer that long (a slow provider).
async fn spawn_siteverify(delay: Duration) -> (String, Arc<Mutex<Vec<HashMap<String, String>>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&seen);
    let route = axum::routing::post(move |body: axum::body::Bytes| {
        let recorded = Arc::clone(&recorded);
        async move {
            let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
            let success = form.get("secret").map(String::as_str) == Some("site-secret")
                && form.get("response").map(String::as_str) == Some("human");
            recorded.lock().unwrap().push(form);
            tokio::time::sleep(delay).await;
            axum::Json(json!({"success": success, "error-codes": []}))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, axum::Router::new().route("/siteverify", route))
            .await
            .unwrap()
    });
    (format!("http://{address}/siteverify"), seen)
}

fn with_captcha(
    verify_url: String,
    fail_mode: Option<&'static str>,
) -> impl FnOnce(&mut rankgate::config::Config) {
    move |config| {
        let mut text = format!(
            "provider = \"turnstile\"\nsite_key = \"site-key-1\"\nsecret = \"site-secret\"\n\
             verify_url = \"{verify_url}\"\ntimeout_millis = 500\n"
        );
        if let Some(mode) = fail_mode {
            text.push_str(&format!("fail_mode = \"{mode}\"\n"));
        }
        config.waiting_room.captcha = Some(toml::from_str(&text).unwrap());
        config.waiting_room.resolve_entry_guards().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_captcha_hook_asks_the_providers_siteverify_and_follows_the_fail_mode() {
    let (verify_url, seen) = spawn_siteverify(Duration::ZERO).await;
    let app = TestApp::builder()
        .configure(with_captcha(verify_url, None))
        .spawn()
        .await;
    assert_eq!(
        put_settings(
            &app,
            "human",
            json!({"paused": true, "entryChallenge": "captcha"})
        )
        .await
        .status(),
        200
    );
    let challenge: Value = app.get("/v1/queues/human/challenge").await.json().await.unwrap();
    assert_eq!(
        challenge,
        json!({"kind": "captcha", "provider": "turnstile", "siteKey": "site-key-1"})
    );
    let (status, body, _) = enter(&app, "human", json!({}), &[]).await;
    assert_eq!(
        (status, &body["reason"], &body["challenge"]["siteKey"]),
        (428, &json!("captcha"), &json!("site-key-1"))
    );
    let (status, body, _) = enter(&app, "human", json!({"captchaToken": "bot"}), &[]).await;
    assert_eq!((status, &body["reason"]), (428, &json!("captcha")));
    assert!(
        body["error"].as_str().unwrap().contains("refused this token"),
        "{body}"
    );
    let (status, body, _) = enter(&app, "human", json!({"captchaToken": "human"}), &[]).await;
    assert_eq!((status, body["rank"].as_u64()), (200, Some(0)), "{body}");
    let (status, _, _) = enter(&app, "human", json!({"captchaToken": "x".repeat(5000)}), &[]).await;
    assert_eq!(status, 428);
    {
        let forms = seen.lock().unwrap();
        assert_eq!(
            forms.len(),
            2,
            "the missing and the oversized tokens never reach the provider"
        );
        for form in forms.iter() {
            assert_eq!(form["secret"], "site-secret");
            assert_eq!(form["remoteip"], "127.0.0.1");
        }
        assert_eq!(
            (forms[0]["response"].as_str(), forms[1]["response"].as_str()),
            ("bot", "human")
        );
    }
    assert_eq!(refused_metric(&app, "human", "captcha").await, 3);
    assert_eq!(admin_view(&app, "human").await["refused"]["captcha"], 3);

    // An unreachable verifier: the queue's fail mode (closed → 503 with Retry-After), or the hook's own.
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let down = format!("http://127.0.0.1:{closed_port}/siteverify");
    let app = TestApp::builder()
        .configure(with_captcha(down.clone(), None))
        .spawn()
        .await;
    put_settings(&app, "human", json!({"entryChallenge": "captcha"})).await;
    let (status, _, retry_after) = enter(&app, "human", json!({"captchaToken": "human"}), &[]).await;
    assert_eq!((status, retry_after.as_deref()), (503, Some("2")));
    let app = TestApp::builder()
        .configure(with_captcha(down, Some("open")))
        .spawn()
        .await;
    put_settings(&app, "human", json!({"entryChallenge": "captcha"})).await;
    assert_eq!(
        enter(&app, "human", json!({"captchaToken": "human"}), &[])
            .await
            .0,
        200
    );
    // A slow verifier is cut at timeout_millis (500 ms), not waited for.
    let (slow, _) = spawn_siteverify(Duration::from_secs(5)).await;
    let app = TestApp::builder()
        .configure(with_captcha(slow, None))
        .spawn()
        .await;
    put_settings(&app, "human", json!({"entryChallenge": "captcha"})).await;
    let started = Instant::now();
    assert_eq!(
        enter(&app, "human", json!({"captchaToken": "human"}), &[])
            .await
            .0,
        503
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_pages_form_checks_its_solution_and_answers_303() {
    let app = TestApp::builder()
        .configure(with_budget(BUDGET))
        .client(
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
        )
        .spawn()
        .await;
    put_settings(
        &app,
        "form",
        json!({"paused": true, "entryChallenge": "pow", "powDifficulty": 8}),
    )
    .await;
    let post = |form: String| {
        app.client
            .post(app.url("/wait/form"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
            .send()
    };
    // A browser's first view: the challenge page, 428, not counted as a refusal.
    let page = app
        .client
        .get(app.url("/wait/form"))
        .header("accept", "text/html")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 428);
    assert!(page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("worker-src 'self'"));
    let html = page.text().await.unwrap();
    assert!(html.contains("id=\"needs-scripts\""), "{html}");
    assert_eq!(refused_metric(&app, "form", "challenge").await, 0);
    // A field given twice, a wrong nonce, then the solution.
    let twice = post("nonce=1&nonce=2".into()).await.unwrap();
    assert_eq!(twice.status(), 400);
    assert!(twice.text().await.unwrap().contains("nonce"));
    let (solution, _) = solved_challenge(&app, "form").await;
    let (challenge, nonce) = solution.rsplit_once(':').unwrap();
    let wrong = (0u64..)
        .map(|n| n.to_string())
        .find(|n| !rankgate_core::queue::challenge::solves(challenge, n, 8))
        .unwrap();
    let refused = post(format!("challenge={challenge}&nonce={wrong}"))
        .await
        .unwrap();
    assert_eq!(refused.status(), 428);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["reason"], "challenge");
    let entered = post(format!("challenge={challenge}&nonce={nonce}"))
        .await
        .unwrap();
    assert_eq!(entered.status(), 303);
    assert_eq!(entered.headers()["location"], "/wait/form");
    let cookies: Vec<&str> = entered
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|value| value.to_str().unwrap())
        .collect();
    assert!(
        cookies.iter().any(|c| c.starts_with("rankgate_visitor=")),
        "{cookies:?}"
    );
    assert!(
        cookies.iter().any(|c| c.starts_with("rankgate_ticket_form=")),
        "{cookies:?}"
    );
    assert_eq!(admin_view(&app, "form").await["waiting"], 1);
    assert_eq!(
        refused_metric(&app, "form", "challenge").await,
        1,
        "only the wrong nonce"
    );
}
