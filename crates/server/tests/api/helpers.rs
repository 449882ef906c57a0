//! Helpers of the API tests: rankings events and keys, queue polling, verification, and the shared
//! support (`spawn_app()` and the HTTP basics of `tests/support/app.rs`, the PostgreSQL schemas of
//! `rankgate-testkit`) re-exported, so each test module needs only `use crate::helpers::*`.

use std::time::Duration;

use rankgate::config::{BearerKeys, Config};
use serde_json::{json, Value};

pub use crate::app::*;
pub use rankgate_testkit::postgres_schemas::{drop_schema, postgres_url, SchemaGuard};

/// Epoch millis of "now" on the test machine.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

impl TestApp {
    pub fn rankings(&self) -> std::sync::Arc<rankgate::rankings::RankingService> {
        self.state.rankings.service.clone()
    }

    pub async fn post_events(&self, body: &Value) -> reqwest::Response {
        self.client
            .post(format!("{}/v1/events", self.address))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn post_events_ok(&self, body: &Value) -> Value {
        let response = self.post_events(body).await;
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    /// Polls `member`'s position until READY, as a client should: a 429 (the per-member poll limit, which a
    /// slow admission on a loaded machine reaches) is waited out for its `Retry-After`, not counted as a failure.
    pub async fn position_when_ready(&self, queue: &str, member: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::time::Instant::now() < deadline {
            let response = self.get(&format!("/v1/queues/{queue}/entries/{member}")).await;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
            let position: Value = response.json().await.unwrap();
            match status {
                200 if position["status"] == "READY" => return position,
                200 => tokio::time::sleep(Duration::from_millis(100)).await,
                429 => {
                    let wait = retry_after.expect("a 429 names its Retry-After");
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                }
                other => panic!("GET position of {member}: {other} {position}"),
            }
        }
        panic!("{member} was never admitted");
    }
}

pub fn with_keys(config: &mut Config, admin: &[&str], ingest: &[&str]) {
    config.admin_keys = BearerKeys::from_plain(admin);
    config.ingest_keys = BearerKeys::from_plain(ingest);
}

pub fn view(id: &str, product: &str, ts: i64, categories: &[&str]) -> Value {
    json!({ "id": id, "type": "product_viewed", "ts": ts, "product_id": product, "categories": categories })
}

pub fn sale(id: &str, product: &str, ts: i64, quantity: u32, price: u64, categories: &[&str]) -> Value {
    json!({ "id": id, "type": "payment_succeeded", "ts": ts, "product_id": product, "categories": categories,
            "quantity": quantity, "price": price })
}

/// The UTC day key (YYYYMMDD) of epoch millis.
pub fn day_key(millis: i64) -> String {
    let ts = jiff::Timestamp::from_millisecond(millis).unwrap();
    ts.strftime("%Y%m%d").to_string()
}

/// The UTC hour key (YYYYMMDDHH) of epoch millis.
pub fn hour_key(millis: i64) -> String {
    let ts = jiff::Timestamp::from_millisecond(millis).unwrap();
    ts.strftime("%Y%m%d%H").to_string()
}

/// Polls `path` until `accept` holds and returns that body; bounded (generously, for slow machines).
pub async fn read_until(app: &TestApp, path: &str, what: &str, accept: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let body = app.get_json(path).await;
        if accept(&body) {
            return body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}; last answer {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A `rankgate serve` in a process of its own, killed (SIGKILL) when dropped, passed or failed, so no
/// process outlives the test.
pub struct ServerProcess(pub std::process::Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `rankgate serve --listen 127.0.0.1:0 --data-dir <data_dir>` (logging warnings) with whatever
/// `configure` adds (a config file, variables) and returns it with its base URL, read from the line it
/// prints; `Err` says why it did not come up (its stderr is the test's).
pub fn serve_process(
    data_dir: &std::path::Path,
    configure: impl FnOnce(&mut std::process::Command),
) -> Result<(ServerProcess, String), String> {
    use std::io::BufRead as _;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rankgate"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .env("RANKGATE_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    configure(&mut command);
    let mut child = command.spawn().expect("the rankgate binary starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut server = ServerProcess(child);
    match line.trim().strip_prefix("rankgate listening on ") {
        Some(address) => Ok((server, address.to_string())),
        None => Err(format!(
            "rankgate serve did not start ({:?}); printed {line:?}",
            server.0.wait()
        )),
    }
}

/// Runs `rankgate verify <args>` and fails the test, showing its report, unless it passes.
pub fn assert_verify_passes(args: &[&str]) {
    assert_verify_passes_within(args, Duration::ZERO);
}

/// Like [`assert_verify_passes`], for a fleet whose instances publish what another instance ingested: a
/// span another instance holds in Redis is current within the freshness bound, not at once, so `verify`
/// is run again until it passes or `bound` has passed (then its last report fails the test).
pub fn assert_verify_passes_within(args: &[&str], bound: Duration) {
    let deadline = std::time::Instant::now() + bound;
    loop {
        let verify = std::process::Command::new(env!("CARGO_BIN_EXE_rankgate"))
            .arg("verify")
            .args(args)
            .output()
            .expect("the rankgate binary runs");
        if verify.status.success() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rankgate verify {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&verify.stdout),
            String::from_utf8_lossy(&verify.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
