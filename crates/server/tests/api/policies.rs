//! Policy versions are fleet state (SPEC 1.3): several instances on one PostgreSQL schema, with and
//! without Redis serving. A weight change, a rollback or concurrent weight changes through any instance
//! reach every instance: each serves the same `policyVersion` with scores recomputed under its weights
//! (hot spans from Redis when serving, cold ones from each engine), reports it in its admin view and can
//! roll it back. Also an instance started after the switch, one SIGKILLed right after a PUT (the real
//! binary) while the others and its restart converge, and a version left `building` by a dead instance
//! (made deterministically), which the others complete. `rankgate verify` passes at the end.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;

/// Events per product kind: `p{i}` gets `i + 1` views in the current hour and in the hour two hours
/// ago, nothing else, so a `popular` score under view weight `w` is exactly `(i + 1) * w` (likes and
/// `ln_1p(0)` add 0.0; an hourly period has no carry).
const PRODUCTS: usize = 6;

fn workload(now: i64) -> Value {
    let mut events = Vec::new();
    for product in 0..PRODUCTS {
        for n in 0..=product {
            for (tag, ts) in [("now", now), ("old", now - 2 * 3_600_000)] {
                events.push(view(
                    &format!("{tag}-p{product}-{n}"),
                    &format!("p{product}"),
                    ts,
                    &["toys"],
                ));
            }
        }
    }
    Value::Array(events)
}

/// A hot span (Redis when serving) and a cold one (always the engine).
fn spans(now: i64) -> [String; 2] {
    [
        format!(
            "/v1/categories/toys/top?period=hourly&at={}&limit=50",
            hour_key(now)
        ),
        format!(
            "/v1/categories/all/top?period=hourly&at={}&limit=50",
            hour_key(now - 2 * 3_600_000)
        ),
    ]
}

struct Fleet {
    schema: String,
    redis_prefix: Option<String>,
}

impl Fleet {
    fn new(name: &str, redis: bool) -> Fleet {
        let schema = format!("rgtest_policy_{name}_{}", std::process::id());
        drop_schema(&schema);
        Fleet {
            redis_prefix: redis.then(|| format!("rgtest:policy:{name}:{}:", std::process::id())),
            schema,
        }
    }

    async fn spawn(&self) -> TestApp {
        let schema = self.schema.clone();
        let prefix = self.redis_prefix.clone();
        spawn_app_with(move |config| {
            config.rankings.database = Some(postgres_url());
            config.rankings.database_schema = schema;
            config.rankings.freshness_millis = 200;
            if let Some(prefix) = prefix {
                config.redis = vec![rankgate_testkit::redis_servers::standalone_url()];
                config.redis_prefix = prefix;
                config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
            }
        })
        .await
    }

    /// With Redis serving: polls until the shared pointer in Redis reports `version` (the publisher has
    /// rebuilt Redis under it), so the publisher and every engine agree on the version; a no-op without.
    async fn redis_serves(&self, version: u64) {
        let Some(prefix) = &self.redis_prefix else {
            return;
        };
        let mut connection = redis::Client::open(rankgate_testkit::redis_servers::standalone_url())
            .and_then(|client| client.get_connection())
            .expect("the shared Redis");
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            // Every span group's entry is "generation asOf popular rebuilt"; all of them must serve it.
            let pointer: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg(format!("{prefix}{{rk}}:active"))
                .query(&mut connection)
                .expect("HGETALL of the serving pointer");
            let served: Vec<Option<u64>> = (0..rankgate_store::ranking::redis_serving::SPAN_GROUPS)
                .map(|group| {
                    pointer
                        .get(&format!("g{group}"))
                        .and_then(|entry| entry.split(' ').nth(2)?.parse().ok())
                })
                .collect();
            if served.iter().all(|popular| *popular == Some(version)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the redis serving pointer reports popular version {served:?}, not {version}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn verify(&self, app: &TestApp) {
        let data_dir = app.data_dir.display().to_string();
        assert_verify_passes(&[
            "--database",
            &postgres_url(),
            "--database-schema",
            &self.schema,
            "--data-dir",
            &data_dir,
        ]);
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        drop_schema(&self.schema);
        if let Some(prefix) = &self.redis_prefix {
            if let Ok(mut connection) = redis::Client::open(rankgate_testkit::redis_servers::standalone_url())
                .and_then(|c| c.get_connection())
            {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{prefix}*"))
                    .query(&mut connection)
                    .unwrap_or_default();
                for key in keys {
                    let _: Result<(), _> = redis::cmd("DEL").arg(key).query(&mut connection);
                }
            }
        }
    }
}

async fn admin_view(address: &str) -> Value {
    let response = reqwest::get(format!("{address}/v1/admin/rankers/popular"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

async fn put_view_weight(address: &str, view: f64) -> u64 {
    let response = reqwest::Client::new()
        .put(format!("{address}/v1/admin/rankers/popular"))
        .json(&json!({ "weights": { "view": view } }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "building");
    body["policyVersion"].as_u64().unwrap()
}

/// What is wrong with `address`'s answers if it does not serve `version` with view weight `weight`
/// everywhere yet; `None` once it does.
async fn disagreement(address: &str, now: i64, version: u64, weight: f64) -> Option<String> {
    let admin = admin_view(address).await;
    if admin["activeVersion"] != version || !admin["building"].is_null() || admin["weights"]["view"] != weight
    {
        return Some(format!("admin view {admin}"));
    }
    for span in spans(now) {
        let body: Value = reqwest::get(format!("{address}{span}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if body["policyVersion"] != version {
            return Some(format!("{span}: {body}"));
        }
        let items = body["items"].as_array().cloned().unwrap_or_default();
        if items.len() != PRODUCTS {
            return Some(format!("{span}: {body}"));
        }
        for item in items {
            let product: usize = item["productId"].as_str().unwrap()[1..].parse().unwrap();
            // The formula of SPEC 1.3 in its order: views*w + likes*w_like + ln_1p(0)*w_sales, likes 0.
            let expected = (product + 1) as f64 * weight + 0.0 * 0.2 + 0.0_f64.ln_1p() * 0.7;
            if item["score"].as_f64() != Some(expected) {
                return Some(format!("{span}: {item} (expected score {expected})"));
            }
        }
    }
    None
}

/// Polls every instance until each serves `version` under view weight `weight`; generous bound.
async fn converge(addresses: &[&str], now: i64, version: u64, weight: f64) -> Duration {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(90);
    loop {
        let mut last = None;
        for address in addresses {
            if let Some(problem) = disagreement(address, now, version, weight).await {
                last = Some(format!("{address}: {problem}"));
                break;
            }
        }
        match last {
            None => return started.elapsed(),
            Some(problem) => assert!(
                Instant::now() < deadline,
                "instances never converged on version {version} (view weight {weight}): {problem}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn put_then_rollback_through_another(instances: usize, redis: bool) {
    let fleet = Fleet::new(
        &format!("n{instances}_{}", if redis { "redis" } else { "pg" }),
        redis,
    );
    let mut apps = Vec::new();
    for _ in 0..instances {
        apps.push(fleet.spawn().await);
    }
    let addresses: Vec<&str> = apps.iter().map(|a| a.address.as_str()).collect();
    let now = now_millis();
    apps[0].post_events_ok(&workload(now)).await;
    converge(&addresses, now, 1, 0.1).await;

    let version = put_view_weight(addresses[0], 2.0).await;
    assert_eq!(version, 2);
    converge(&addresses, now, 2, 2.0).await;
    fleet.redis_serves(2).await;
    let last = addresses[instances - 1];
    assert_eq!(admin_view(last).await["previousVersion"], 1);

    // A rollback through another instance than the one that switched reaches every instance.
    let rollback = reqwest::Client::new()
        .post(format!("{last}/v1/admin/rankers/popular/rollback"))
        .send()
        .await
        .unwrap();
    assert_eq!(rollback.status(), 200);
    let rolled: Value = rollback.json().await.unwrap();
    assert_eq!(
        (rolled["activeVersion"].clone(), rolled["previousVersion"].clone()),
        (json!(1), json!(2))
    );
    converge(&addresses, now, 1, 0.1).await;
    fleet.redis_serves(1).await;
    // And a rollback of the rollback, through the first one, returns to version 2 everywhere.
    let again = reqwest::Client::new()
        .post(format!("{}/v1/admin/rankers/popular/rollback", addresses[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    converge(&addresses, now, 2, 2.0).await;

    // An instance started after the switch serves it from the start.
    let late = fleet.spawn().await;
    let mut all = addresses.clone();
    all.push(&late.address);
    converge(&all, now, 2, 2.0).await;
    fleet.verify(&apps[0]);
    late.stop().await;
    for app in apps {
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_a_switch_and_a_rollback() {
    put_then_rollback_through_another(2, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_a_switch_and_a_rollback() {
    put_then_rollback_through_another(3, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_with_redis_serving_share_a_switch_and_a_rollback() {
    put_then_rollback_through_another(2, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_with_redis_serving_share_a_switch_and_a_rollback() {
    put_then_rollback_through_another(3, true).await;
}

/// Two PUTs at once through two instances: the database orders them (each draws its version under the
/// ranker's row lock), and the newest version created wins; the other is superseded (or, if its build
/// finished before the newer one was created, served briefly and then replaced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_through_two_instances_end_on_the_newest_version() {
    for redis in [false, true] {
        let fleet = Fleet::new(if redis { "race_redis" } else { "race_pg" }, redis);
        let (a, b) = (fleet.spawn().await, fleet.spawn().await);
        let now = now_millis();
        a.post_events_ok(&workload(now)).await;
        let addresses = [a.address.as_str(), b.address.as_str()];
        converge(&addresses, now, 1, 0.1).await;
        let (va, vb) = tokio::join!(put_view_weight(&a.address, 3.0), put_view_weight(&b.address, 5.0));
        let mut drawn = [va, vb];
        drawn.sort_unstable();
        assert_eq!(drawn, [2, 3], "each PUT drew its own version");
        let (winner, weight) = if va > vb { (va, 3.0) } else { (vb, 5.0) };
        converge(&addresses, now, winner, weight).await;
        fleet.redis_serves(winner).await;
        // The other version was either superseded before its build finished (never served) or
        // switched to before the winner was created (then it is the previous one): never active after.
        let loser = va.min(vb);
        let previous = admin_view(&b.address).await["previousVersion"].as_u64();
        assert!(
            previous == Some(1) || previous == Some(loser),
            "previous version {previous:?}: 1, or {loser} if it was switched to before {winner} was created"
        );
        fleet.verify(&a);
        a.stop().await;
        b.stop().await;
    }
}

/// The real binary, SIGKILLed right after its PUT was accepted (its build under way, or its switch not
/// yet made): the surviving instance completes the build it sees in the shared state, and the killed
/// one, restarted, serves the same version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_during_a_build_leaves_the_fleet_converging() {
    let fleet = Fleet::new("killed", false);
    let survivor = fleet.spawn().await;
    let now = now_millis();
    survivor.post_events_ok(&workload(now)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rankgate.toml");
    std::fs::write(
        &config,
        format!(
            "database = \"{}\"\ndatabase_schema = \"{}\"\nfreshness_millis = 200\n",
            postgres_url(),
            fleet.schema
        ),
    )
    .unwrap();
    let mut victim = Binary::start(dir.path(), &config);
    converge(&[&survivor.address, &victim.address], now, 1, 0.1).await;
    let version = put_view_weight(&victim.address, 4.0).await;
    victim.kill();
    converge(&[&survivor.address], now, version, 4.0).await;
    victim = Binary::start(dir.path(), &config);
    converge(&[&survivor.address, &victim.address], now, version, 4.0).await;
    fleet.verify(&survivor);
    victim.kill();
    survivor.stop().await;
}

/// A builder that died after its PUT committed and before any build finished leaves exactly one trace:
/// the stored state says `building: v`. Made here deterministically (the test process creates the
/// version in the shared state and never builds it): both running instances and one started later
/// build it, the first to finish switches the fleet, and every instance serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_left_building_by_a_dead_instance_is_completed_by_the_others() {
    use rankgate_core::ranker::{PopularWeights, RankerName};
    let fleet = Fleet::new("orphan", false);
    let (a, b) = (fleet.spawn().await, fleet.spawn().await);
    let now = now_millis();
    a.post_events_ok(&workload(now)).await;
    converge(&[&a.address, &b.address], now, 1, 0.1).await;
    let schema = fleet.schema.clone();
    let orphan = tokio::task::spawn_blocking(move || {
        let mut dead =
            rankgate_store::ranking::postgres::PostgresSource::connect(&postgres_url(), &schema).unwrap();
        use rankgate_store::ranking::source::SourceOfTruth as _;
        dead.transition_policies(RankerName::Popular, &mut |state| {
            state
                .create(PopularWeights {
                    view: 7.0,
                    ..PopularWeights::default()
                })
                .map(|_| ())
        })
        .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(orphan.building.map(|p| p.version), Some(2));
    converge(&[&a.address, &b.address], now, 2, 7.0).await;
    let late = fleet.spawn().await;
    converge(&[&a.address, &b.address, &late.address], now, 2, 7.0).await;
    fleet.verify(&a);
    for app in [a, b, late] {
        app.stop().await;
    }
}

/// `rankgate serve` as a child process, so it can be SIGKILLed.
struct Binary {
    child: std::process::Child,
    address: String,
}

impl Binary {
    fn start(dir: &std::path::Path, config: &std::path::Path) -> Binary {
        use std::io::BufRead as _;
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_rankgate"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.join("data"))
            .arg("--config")
            .arg(config)
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(dir.join("serve.log")).unwrap())
            .spawn()
            .expect("rankgate serve starts");
        // Owned by a `Binary` at once, so a panic below still kills and reaps it.
        let mut binary = Binary {
            child,
            address: String::new(),
        };
        let stdout = binary.child.stdout.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(60))
                .expect("rankgate serve says where it listens");
            if let Some(address) = line.strip_prefix("rankgate listening on ") {
                binary.address = address.trim().to_string();
                return binary;
            }
        }
    }

    fn kill(&mut self) {
        // `Child::kill` is SIGKILL on Unix: no shutdown path runs.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        self.kill();
    }
}
