//! The waiting page (`GET /wait/{queue}`, issue 12) end to end: in a real browser (Debian's `chromium`
//! driven by playwright-core from `waiting_page.mjs`), and over plain HTTP for the hostile cases
//! (`page_http.rs`); the sale report's page of charts (`report_page.rs`, issue 28); and the dashboard
//! (`dashboard.rs`, issue 30).
//!
//! Each test starts the whole service (`spawn_app`, as every HTTP test binary does) on 127.0.0.1:0 with its
//! own data directory and a `[[gate]]` in front of a small upstream in this process that counts the
//! orders reaching it.
//!
//! Needs (installed by `.ci/run`): `apt-get install chromium` and `npm ci` in this directory.

/// `spawn_app()`: the whole service, as every HTTP test binary of this crate starts it.
#[path = "../support/app.rs"]
mod app;
mod dashboard;
mod page_http;
mod report_page;

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use parking_lot::Mutex;
use rankgate::config::Config;
use rankgate::waiting_room::config::PageConfig;
use rankgate::waiting_room::{GateConfig, GateRoute};
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

pub(crate) use app::TestApp;

/// What reached the test upstream.
#[derive(Debug, Clone, Default)]
pub(crate) struct Orders {
    /// One entry per order: the `X-Member-Id` and `Cookie` headers the upstream saw.
    pub(crate) seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl Orders {
    pub(crate) fn count(&self) -> usize {
        self.seen.lock().len()
    }
}

/// The shop behind the gate: `GET /shop/checkout` and `POST /orders` place an order each (200).
pub(crate) async fn spawn_upstream() -> (String, Orders) {
    let orders = Orders::default();
    let record = {
        let orders = orders.clone();
        move |headers: HeaderMap| {
            let orders = orders.clone();
            async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string()
                };
                let number = {
                    let mut seen = orders.seen.lock();
                    seen.push((header("x-member-id"), header("cookie")));
                    seen.len()
                };
                axum::response::Html(format!(
                    "<!doctype html><title>Shop</title><p id=\"order\">Order placed #{number}</p>"
                ))
            }
        }
    };
    let logo = || async {
        (
            [(axum::http::header::CONTENT_TYPE, "image/svg+xml")],
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"160\" height=\"40\" viewBox=\"0 0 160 40\">\
             <rect width=\"40\" height=\"40\" rx=\"8\" fill=\"#0b57d0\"/><text x=\"50\" y=\"28\" \
             font-family=\"sans-serif\" font-size=\"22\" fill=\"#1a1a1a\">Test Shop</text></svg>",
        )
    };
    let router = axum::Router::new()
        .route("/logo.svg", axum::routing::get(logo))
        .route("/shop/checkout", axum::routing::get(record.clone()))
        .route("/orders", axum::routing::post(record));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let address = listener.local_addr().expect("upstream address");
    tokio::spawn(async move { axum::serve(listener, router).await.expect("upstream serves") });
    (format!("http://{address}"), orders)
}

/// The service with a gate for `queue` on `GET /shop/checkout` and `POST /orders`, in front of `upstream`,
/// and a waiting page; its client does not follow redirects, so tests see the page's own answers.
pub(crate) async fn spawn_gated_app(
    queue: &str,
    upstream: &str,
    configure: impl FnOnce(&mut Config),
) -> TestApp {
    let gate_and_page = |config: &mut Config| {
        config.waiting_room.poll_burst = 10_000;
        config.waiting_room.gates = vec![GateConfig {
            queue: queue.into(),
            upstream: upstream.into(),
            routes: vec![
                GateRoute {
                    method: "GET".into(),
                    path: "/shop/checkout".into(),
                    prefix: false,
                },
                GateRoute {
                    method: "POST".into(),
                    path: "/orders".into(),
                    prefix: false,
                },
            ],
            timeout_millis: 5_000,
            max_body_bytes: 64 * 1024,
        }];
        config.waiting_room.page = vec![PageConfig {
            title: Some("Test Shop".into()),
            logo_url: Some(format!("{upstream}/logo.svg")),
            continue_url: Some("/shop/checkout".into()),
            continue_delay_seconds: Some(4),
            ..PageConfig::default()
        }];
    };
    TestApp::builder()
        .configure(gate_and_page)
        .configure(configure)
        .configure(|config| config.waiting_room.validate_pages().expect("a valid page config"))
        .client(
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client"),
        )
        .spawn()
        .await
}

impl TestApp {
    pub(crate) async fn put_settings(&self, queue: &str, body: serde_json::Value) {
        let response = self
            .client
            .put(format!("{}/v1/admin/queues/{queue}", self.address))
            .json(&body)
            .send()
            .await
            .expect("put settings");
        assert_eq!(response.status(), 200, "PUT {queue}: {:?}", response.text().await);
    }

    pub(crate) async fn enter(&self, queue: &str, member: &str) {
        let response = self
            .client
            .post(format!("{}/v1/queues/{queue}/entries", self.address))
            .json(&json!({ "memberId": member }))
            .send()
            .await
            .expect("enter");
        assert_eq!(response.status(), 200, "enter {member}");
    }
}

fn browser_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

/// One of this folder's node scripts driving Chromium (headless, playwright-core), talking to the test
/// over its stdin and stdout, a line a step (each script's head comment says which).
struct NodeScript {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    stderr: tokio::process::ChildStderr,
}

impl NodeScript {
    /// Starts `script` with `args`, after checking that Chromium and playwright-core are installed.
    fn start(script: &str, args: &[&std::ffi::OsStr]) -> NodeScript {
        let chromium = std::env::var("RANKGATE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        assert!(
            std::path::Path::new(&chromium).exists(),
            "{chromium} is missing: `apt-get install -y chromium` (as .ci/run does)"
        );
        assert!(
            browser_dir().join("node_modules/playwright-core").exists(),
            "playwright-core is missing: `npm ci` in {} (as .ci/run does)",
            browser_dir().display()
        );
        let mut child = tokio::process::Command::new("node")
            .arg(script)
            .args(args)
            .current_dir(browser_dir())
            .env("RANKGATE_CHROMIUM", &chromium)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs (apt-get install nodejs)");
        NodeScript {
            stdin: child.stdin.take().expect("stdin"),
            lines: BufReader::new(child.stdout.take().expect("stdout")).lines(),
            stderr: child.stderr.take().expect("stderr"),
            child,
        }
    }

    /// The script's next line, `None` once it closed its stdout.
    async fn next_line(&mut self) -> Option<String> {
        self.lines.next_line().await.expect("read node's stdout")
    }

    /// Answers the script a line on its stdin.
    async fn tell(&mut self, line: &str) {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("tell node");
        self.stdin.flush().await.expect("flush");
    }

    /// Waits for the script to exit and fails the test, with its stderr and the lines `seen`, unless it
    /// succeeded.
    async fn finish(mut self, seen: &[String]) {
        let status = self.child.wait().await.expect("node exits");
        let mut errors = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut self.stderr, &mut errors)
            .await
            .ok();
        assert!(
            status.success(),
            "the browser script failed: {errors}\nstdout: {seen:?}"
        );
    }
}

/// The browser test of issue 12: at 320 px the page shows the position falling as admission runs, is
/// admitted, continues to the gated route by itself, and the order reaches the upstream exactly once;
/// with scripts off the position and a refresh meta tag are there; the controls are reachable by
/// keyboard; without EventSource the page polls instead. Saves `waiting.png` and `admitted.png` (into `docs/screenshots/` with
/// RANKGATE_UPDATE_SCREENSHOTS=1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_waits_is_admitted_and_orders_exactly_once() {
    let (upstream, orders) = spawn_upstream().await;
    let app = spawn_gated_app("sale", &upstream, |_| {}).await;
    // Four members ahead of the browser, admitted one per second once the browser has looked.
    app.put_settings(
        "sale",
        json!({ "admitPerSecond": 1, "tickMillis": 1000, "paused": true }),
    )
    .await;
    for member in ["m-1", "m-2", "m-3", "m-4"] {
        app.enter("sale", member).await;
    }
    // The scripts-off check's queue stays paused: its position is stable to read.
    app.put_settings("quiet", json!({ "paused": true })).await;
    for member in ["q-1", "q-2"] {
        app.enter("quiet", member).await;
    }
    // The polling check's queue: two ahead, admitted once the browser (without EventSource) has looked.
    app.put_settings(
        "polled",
        json!({ "admitPerSecond": 1, "tickMillis": 1000, "paused": true }),
    )
    .await;
    for member in ["p-1", "p-2"] {
        app.enter("polled", member).await;
    }

    // Screenshots go to a scratch directory, so a test run never modifies the tree; with
    // RANKGATE_UPDATE_SCREENSHOTS=1 they refresh the ones the README shows.
    let scratch = tempfile::tempdir().expect("a scratch dir for screenshots");
    let shots = if std::env::var_os("RANKGATE_UPDATE_SCREENSHOTS").is_some() {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots")
    } else {
        scratch.path().to_path_buf()
    };
    std::fs::create_dir_all(&shots).expect("the screenshot dir");
    let address = std::ffi::OsString::from(&app.address);
    let mut node = NodeScript::start(
        "waiting_page.mjs",
        &[
            address.as_os_str(),
            "sale".as_ref(),
            "quiet".as_ref(),
            "polled".as_ref(),
            shots.as_os_str(),
        ],
    );
    let mut seen = Vec::new();
    let run = async {
        while let Some(line) = node.next_line().await {
            if let Some(waiting) = line.strip_prefix("WAITING ") {
                let (queue, rank) = waiting.split_once(' ').expect("WAITING <queue> <rank>");
                let ahead = if queue == "sale" { "4" } else { "2" };
                assert_eq!(rank, ahead, "the browser's member is behind those entered first");
                if queue == "sale" {
                    assert_eq!(orders.count(), 0, "nothing ordered while waiting");
                }
                app.put_settings(queue, json!({ "paused": false })).await;
                node.tell("go").await;
            }
            seen.push(line);
        }
        node
    };
    let node = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the browser run finishes within 180 s");
    node.finish(&seen).await;
    assert_eq!(seen.last().map(String::as_str), Some("DONE"), "{seen:?}");
    assert!(seen.iter().any(|l| l == "SECOND_USE 401"), "{seen:?}");

    // Exactly one order, placed by the browser's visitor id (from its signed cookie), and the upstream
    // never saw the entry token.
    let orders = orders.seen.lock().clone();
    assert_eq!(
        orders.len(),
        1,
        "exactly one order reached the upstream: {orders:?}"
    );
    let (member, cookie) = &orders[0];
    assert!(
        member.starts_with("v-"),
        "the gate forwards the visitor's member id, got {member:?}"
    );
    assert!(
        cookie.contains("rankgate_visitor="),
        "other cookies pass: {cookie:?}"
    );
    assert!(
        !cookie.contains("rankgate_token_"),
        "the token cookie is stripped: {cookie:?}"
    );
    for shot in ["waiting.png", "admitted.png"] {
        let bytes = std::fs::metadata(shots.join(shot)).expect(shot).len();
        assert!(bytes > 1_000, "{shot} is a real screenshot ({bytes} bytes)");
    }
}

/// Issue 29, places that survive the store, in a real browser: a shopper waits behind three members on
/// a queue served from Redis; Redis is restarted empty; the three come back with their tickets and two
/// newcomers enter. The page, with nothing done by the shopper, notices it is no longer in line, reloads,
/// and its `HttpOnly` ticket cookie brings it back to its place: behind the three, ahead of the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_page_gets_its_place_back_after_redis_restarts_empty() {
    let mut redis = rankgate_testkit::redis_servers::RestartableRedis::start();
    let (upstream, _orders) = spawn_upstream().await;
    let url = redis.url();
    let app = spawn_gated_app("sale", &upstream, move |config| {
        config.redis = vec![url];
        config.redis_prefix = "page-loss:".into();
        config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
    })
    .await;
    app.put_settings("sale", json!({ "paused": true })).await;
    let mut tickets = Vec::new();
    for member in ["m-1", "m-2", "m-3"] {
        let answer: serde_json::Value = app
            .client
            .post(app.url("/v1/queues/sale/entries"))
            .json(&json!({ "memberId": member }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        tickets.push((member, answer["ticket"].as_str().unwrap().to_owned()));
    }
    let address = std::ffi::OsString::from(&app.address);
    let mut node = NodeScript::start("store_loss.mjs", &[address.as_os_str(), "sale".as_ref()]);
    let mut seen = Vec::new();
    let run = async {
        while let Some(line) = node.next_line().await {
            if line == "WAITING 3" {
                redis.down();
                redis.up();
                // Two newcomers first, then the three ticket holders: these go ahead of them.
                for _ in 0..2 {
                    let fresh = loop {
                        let answer = app
                            .client
                            .post(app.url("/v1/queues/sale/entries"))
                            .json(&json!({}))
                            .send()
                            .await
                            .unwrap();
                        if answer.status() != 503 {
                            break answer;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    };
                    assert_eq!(fresh.status(), 200);
                }
                for (member, ticket) in &tickets {
                    let back = app
                        .client
                        .post(app.url("/v1/queues/sale/entries"))
                        .header("x-queue-ticket", ticket)
                        .json(&json!({ "memberId": member }))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(back.status(), 200, "{member}");
                }
                node.tell("3").await;
            }
            seen.push(line);
        }
        node
    };
    let node = tokio::time::timeout(Duration::from_secs(150), run)
        .await
        .expect("the browser run finishes within 150 s");
    node.finish(&seen).await;
    assert_eq!(seen.first().map(String::as_str), Some("WAITING 3"), "{seen:?}");
    assert!(seen.iter().any(|l| l.starts_with("RECOVERED 3 ")), "{seen:?}");
    let settings: serde_json::Value = app.get("/v1/admin/queues/sale").await.json().await.unwrap();
    assert_eq!(settings["paused"], true, "the queue came back paused: {settings}");
}

/// The CAPTCHA provider's stand-in, on a spare port: `/api.js` turns each `.cf-turnstile` element into
/// two buttons, `#fake-human` and `#fake-bot`, that call the widget's `data-callback` with the token
/// `human` or `bot` (as Turnstile's implicit rendering calls it with its token); `/siteverify` speaks
/// the providers' protocol (form `secret`, `response`, `remoteip` → `{"success": …}`), saying yes to
/// `human` under the secret `site-secret`. The real providers cannot be reached from here.
async fn spawn_captcha_provider() -> String {
    const WIDGET: &str = r#"(function () {
  document.querySelectorAll('.cf-turnstile').forEach(function (el) {
    [['fake-human', 'human'], ['fake-bot', 'bot']].forEach(function (pair) {
      var button = document.createElement('button');
      button.type = 'button';
      button.id = pair[0];
      button.textContent = pair[0];
      button.onclick = function () { window[el.dataset.callback](pair[1]); };
      el.appendChild(button);
    });
  });
})();"#;
    let router = axum::Router::new()
        .route(
            "/api.js",
            axum::routing::get(|| async { ([("content-type", "text/javascript")], WIDGET) }),
        )
        .route(
            "/siteverify",
            axum::routing::post(|body: axum::body::Bytes| async move {
                let form: std::collections::HashMap<String, String> =
                    form_urlencoded::parse(&body).into_owned().collect();
                let success = form.get("secret").map(String::as_str) == Some("site-secret")
                    && form.get("response").map(String::as_str) == Some("human");
                axum::Json(json!({ "success": success }))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{address}")
}

/// Issue 28 in a real browser: the waiting page meets a proof-of-work queue (its Web Worker solves, the
/// page enters by itself; a reload asks nothing again; scripts off, it says the queue needs them) and a
/// CAPTCHA queue (the provider's widget, here a local stand-in, passes a person and refuses a bot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_page_solves_its_challenge_and_meets_the_captcha() {
    let provider = spawn_captcha_provider().await;
    let app = TestApp::builder()
        .configure(move |config: &mut Config| {
            config.waiting_room.entries_per_address_per_minute = 30;
            config.waiting_room.captcha = Some(
                toml::from_str(&format!(
                    "provider = \"turnstile\"\nsite_key = \"site-key-1\"\nsecret = \"site-secret\"\n\
                     verify_url = \"{provider}/siteverify\"\nscript_url = \"{provider}/api.js\"\n"
                ))
                .unwrap(),
            );
            config.waiting_room.resolve_entry_guards().unwrap();
        })
        .spawn()
        .await;
    for (queue, body) in [
        (
            "work",
            json!({ "paused": true, "entryChallenge": "pow", "powDifficulty": 14 }),
        ),
        ("human", json!({ "paused": true, "entryChallenge": "captcha" })),
    ] {
        let put = app
            .client
            .put(app.url(&format!("/v1/admin/queues/{queue}")))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), 200, "{queue}");
    }
    let address = std::ffi::OsString::from(&app.address);
    let mut node = NodeScript::start(
        "entry_challenge.mjs",
        &[address.as_os_str(), "work".as_ref(), "human".as_ref()],
    );
    let mut seen = Vec::new();
    let run = async {
        while let Some(line) = node.next_line().await {
            seen.push(line);
        }
        node
    };
    let node = tokio::time::timeout(Duration::from_secs(150), run)
        .await
        .expect("the browser run finishes within 150 s");
    node.finish(&seen).await;
    assert!(seen.iter().any(|l| l.starts_with("POW_ENTERED 0 ")), "{seen:?}");
    assert!(seen.iter().any(|l| l == "NOSCRIPT"), "{seen:?}");
    assert!(seen.iter().any(|l| l == "CAPTCHA_PASSED 0"), "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("DONE"), "{seen:?}");
    let view = |queue: &'static str| {
        let app = &app;
        async move {
            app.get(&format!("/v1/admin/queues/{queue}"))
                .await
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    assert_eq!(view("work").await["waiting"], 1, "one browser, one place");
    assert_eq!(
        view("human").await["waiting"],
        1,
        "the person is in, the bot is not"
    );
}
