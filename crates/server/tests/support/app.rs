//! `spawn_app()`: the whole service as production starts it, for every HTTP test binary of this crate.
//!
//! [`Application::build`] (or `build_with_clock`) with a data dir of its own, its real listener on
//! 127.0.0.1:0, the edge and the fast path in front of the router, and every background worker. No HTTP
//! test serves a router on its own: that road skips the edge and the fast path, where production answers
//! entries and polls.
//!
//! Binaries include this file with `#[path = "../support/app.rs"] mod app;` (or `support/app.rs` from
//! `tests/`) and add their own helpers in further `impl TestApp` blocks. Support shared with another
//! crate's tests lives in `rankgate-testkit`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use rankgate::app::{AppState, Application};
use rankgate::config::Config;
use rankgate_store::clock::Clock;
use serde_json::Value;

/// A period longer than any test: a background loop given it never steps within the test.
pub const LONGER_THAN_ANY_TEST_MILLIS: u64 = 3_600_000;

/// A running rankgate for one test. Dropping it asks the service to stop; [`TestApp::stop`] waits.
pub struct TestApp {
    /// `http://127.0.0.1:<port>`.
    pub address: String,
    /// What the application shares with its handlers: the rankings, the waiting room, the clock.
    pub state: AppState,
    /// A client for `address`.
    pub client: reqwest::Client,
    /// The data dir it runs in.
    pub data_dir: PathBuf,
    shutdown: tokio_util::sync::CancellationToken,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// The data dir, when this app owns it.
    dir: Option<tempfile::TempDir>,
}

/// The whole service with a fresh data dir and the test config (`Config::for_data_dir`).
pub async fn spawn_app() -> TestApp {
    TestApp::builder().spawn().await
}

/// [`spawn_app`] with changes to the config.
pub async fn spawn_app_with(configure: impl FnOnce(&mut Config)) -> TestApp {
    TestApp::builder().configure(configure).spawn().await
}

/// Starts (or restarts) the service on an existing data dir, which the caller keeps.
pub async fn spawn_app_in(data_dir: PathBuf, configure: impl FnOnce(&mut Config)) -> TestApp {
    TestApp::builder()
        .in_data_dir(data_dir)
        .configure(configure)
        .spawn()
        .await
}

/// [`spawn_app_with`] on a clock the test moves (`rankgate_store::clock::ManualClock`).
pub async fn spawn_app_with_clock(clock: Arc<dyn Clock>, configure: impl FnOnce(&mut Config)) -> TestApp {
    TestApp::builder().clock(clock).configure(configure).spawn().await
}

/// Where a test app's data lives.
enum DataDir {
    /// A fresh temporary dir, deleted with the app.
    Fresh,
    /// A dir the caller owns.
    Borrowed(PathBuf),
    /// A dir the app owns from now on (one a stopped app handed back).
    Owned(tempfile::TempDir),
}

/// A change to the config before the build.
type Configure<'a> = Box<dyn FnOnce(&mut Config) + 'a>;

/// How to start a [`TestApp`]: `TestApp::builder().configure(…).clock(…).spawn().await`.
pub struct TestAppBuilder<'a> {
    configure: Vec<Configure<'a>>,
    clock: Option<Arc<dyn Clock>>,
    data_dir: DataDir,
    client: Option<reqwest::Client>,
}

impl TestApp {
    /// A builder for the less common starts; [`spawn_app`] and its siblings cover the common ones.
    pub fn builder<'a>() -> TestAppBuilder<'a> {
        TestAppBuilder {
            configure: Vec::new(),
            clock: None,
            data_dir: DataDir::Fresh,
            client: None,
        }
    }
}

impl<'a> TestAppBuilder<'a> {
    /// Changes the config before the build (in the order given, after `Config::for_data_dir`).
    pub fn configure(mut self, configure: impl FnOnce(&mut Config) + 'a) -> Self {
        self.configure.push(Box::new(configure));
        self
    }

    /// Builds with `Application::build_with_clock`: `clock` is the whole service's time, the waiting
    /// room's Redis scripts included.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The waiting room's admission and adaptive control never step on their own within the test (their
    /// loops' period is an hour): the test calls `admit_due_queues` and `run_adaptive_control` on
    /// `state.waiting_room` itself, usually after moving a manual clock. Expiry sweeps, gauges and the
    /// janitor still run: they only act on what the test's clock made due.
    pub fn admission_stepped_by_test(self) -> Self {
        self.configure(|config| {
            config.waiting_room.scheduler_poll_millis = LONGER_THAN_ANY_TEST_MILLIS;
            config.waiting_room.adaptive_round_millis = Some(LONGER_THAN_ANY_TEST_MILLIS);
        })
    }

    /// Runs in `data_dir`, which the caller keeps (a restart on the dir of a stopped app).
    pub fn in_data_dir(mut self, data_dir: impl Into<PathBuf>) -> Self {
        self.data_dir = DataDir::Borrowed(data_dir.into());
        self
    }

    /// Runs in `dir` and deletes it with the app (a restart on what [`TestApp::stop`] handed back).
    pub fn in_temp_dir(mut self, dir: tempfile::TempDir) -> Self {
        self.data_dir = DataDir::Owned(dir);
        self
    }

    /// The client the app's requests go out with (default: reqwest's, which follows redirects).
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Builds the application, starts serving, and returns once the listener is bound.
    pub async fn spawn(self) -> TestApp {
        let (dir, data_dir) = match self.data_dir {
            DataDir::Fresh => {
                let dir = tempfile::tempdir().expect("a temp data dir");
                let path = dir.path().to_path_buf();
                (Some(dir), path)
            }
            DataDir::Owned(dir) => {
                let path = dir.path().to_path_buf();
                (Some(dir), path)
            }
            DataDir::Borrowed(path) => (None, path),
        };
        let mut config = Config::for_data_dir(&data_dir);
        // Tests enter hundreds of members from 127.0.0.1: the per-address budget (issue 28) is off unless
        // a test turns it on (`tests/api/entry_guards.rs` does).
        config.waiting_room.entries_per_address_per_minute = 0;
        for configure in self.configure {
            configure(&mut config);
        }
        let app = match self.clock {
            Some(clock) => Application::build_with_clock(config, clock).await,
            None => Application::build(config).await,
        }
        .expect("the app builds");
        let address = format!("http://{}", app.local_addr());
        let state = app.state().clone();
        let shutdown = app.shutdown_token();
        let handle = tokio::spawn(app.run_until_stopped());
        TestApp {
            address,
            state,
            client: self.client.unwrap_or_default(),
            data_dir,
            shutdown,
            handle: Some(handle),
            dir,
        }
    }
}

impl TestApp {
    /// Stops the server and waits until it has (its data dir unlocked), keeping the data dir: the
    /// returned one if this app owned it.
    pub async fn stop(mut self) -> Option<tempfile::TempDir> {
        self.shutdown.cancel();
        if let Some(handle) = self.handle.take() {
            handle
                .await
                .expect("the server task")
                .expect("the server stops cleanly");
        }
        self.dir.take()
    }

    /// `address` + `path_and_query`.
    pub fn url(&self, path_and_query: &str) -> String {
        format!("{}{}", self.address, path_and_query)
    }

    /// A ticket of `member` in `queue` (SPEC 2.2), from the app's own keys: it proves the member as the
    /// one its entry answered with does, but names no place (tests of places use the entry's own).
    /// Every instance sharing the token secret accepts it.
    pub fn ticket(&self, queue: &str, member: &str) -> String {
        let queue = rankgate_core::queue::QueueName::parse(queue).expect("a queue name");
        let member = rankgate_core::ids::MemberId::parse(member).expect("a member id");
        self.state.waiting_room.ticket_for(&queue, &member)
    }

    /// `request` with the ticket of the member a member path (or a token call's body) names, as the
    /// member's own client sends it. Tests of the credential itself use `client` directly.
    pub fn with_ticket(
        &self,
        request: reqwest::RequestBuilder,
        path: &str,
        body: Option<&Value>,
    ) -> reqwest::RequestBuilder {
        let Some(rest) = path.strip_prefix("/v1/queues/") else {
            return request;
        };
        let rest = rest.split('?').next().unwrap_or(rest);
        let mut parts = rest.split('/');
        let queue = parts.next().unwrap_or_default();
        let member = match (parts.next(), parts.next()) {
            (Some("entries"), Some(member)) => Some(member.to_owned()),
            (Some("entries" | "tokens"), _) => body.and_then(|b| b["memberId"].as_str()).map(str::to_owned),
            _ => None,
        };
        let valid = |member: &str| {
            rankgate_core::queue::QueueName::parse(queue).is_ok()
                && rankgate_core::ids::MemberId::parse(member).is_ok()
        };
        match member.filter(|member| valid(member)) {
            Some(member) => request.header("x-queue-ticket", self.ticket(queue, &member)),
            None => request,
        }
    }

    /// GET (with the member's ticket on a member path).
    pub async fn get(&self, path_and_query: &str) -> reqwest::Response {
        self.with_ticket(self.client.get(self.url(path_and_query)), path_and_query, None)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path_and_query}: {e}"))
    }

    /// GET, asserting a 200 with a JSON body.
    pub async fn get_json(&self, path_and_query: &str) -> Value {
        let response = self.get(path_and_query).await;
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 200, "GET {path_and_query}: {body}");
        body
    }

    /// POST a JSON body (with the member's ticket on a member call).
    pub async fn post_json(&self, path: &str, body: &Value) -> reqwest::Response {
        self.with_ticket(self.client.post(self.url(path)).json(body), path, Some(body))
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }

    /// PUT a JSON body.
    pub async fn put_json(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .put(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("PUT {path}: {e}"))
    }

    /// DELETE (with the member's ticket on a member path).
    pub async fn delete(&self, path: &str) -> reqwest::Response {
        self.with_ticket(self.client.delete(self.url(path)), path, None)
            .send()
            .await
            .unwrap_or_else(|e| panic!("DELETE {path}: {e}"))
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
