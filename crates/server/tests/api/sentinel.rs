//! Issue 30 item 5, SPEC part 4: `--redis redis+sentinel://…/mymaster`. A real master, its replica and
//! three `redis-server --sentinel` processes; mid-sale the master is killed with SIGKILL, the sentinels
//! promote the replica, and rankgate follows the new master without a restart: while no master answers,
//! the waiting room fails closed (503 with `Retry-After`, never a 500 or a dropped connection); after
//! the failover the same queue (same epoch: the replica had every acknowledged write, which the test
//! waits for) is served, every member keeps its place and its ticket, and entries and admission work.
//! What a failover can lose when replication lags is the README's "Redis Sentinel" section.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::*;
use crate::redis_servers::SentinelRedis;
use crate::store_loss::{enter, position, SECRET};

const MEMBERS: usize = 40;

fn sale() -> rankgate_core::queue::QueueName {
    rankgate_core::queue::QueueName::parse("sale").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rankgate_follows_a_sentinel_failover_mid_sale_without_a_restart() {
    let sentinel = SentinelRedis::start(Some("failover-pw"));
    let url = sentinel.url();
    let app = TestApp::builder()
        .admission_stepped_by_test()
        .configure({
            let url = url.clone();
            move |config| {
                config.redis = vec![url];
                config.redis_prefix = "sentinel:".into();
                config.waiting_room.token_secret = Some(SECRET.into());
            }
        })
        .spawn()
        .await;
    let put = app
        .put_json(
            "/v1/admin/queues/sale",
            &json!({ "admitPerSecond": 5, "tokenTtlSeconds": 900 }),
        )
        .await;
    assert_eq!(put.status(), 200);

    // Members enter; one tick admits the front five.
    let mut tickets: HashMap<String, String> = HashMap::new();
    let mut arrival = Vec::new();
    for i in 0..MEMBERS {
        let member = format!("m{i:02}");
        let answer: Value = enter(&app, json!({ "memberId": member }), None)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(answer["rank"], i, "{answer}");
        tickets.insert(member.clone(), answer["ticket"].as_str().unwrap().to_owned());
        arrival.push(member);
    }
    let admitted = app.state.waiting_room.admit_queue_now(&sale()).await.unwrap();
    let first_admitted = admitted.admitted.len();
    assert!((1..=6).contains(&first_admitted), "{first_admitted}");
    let epoch = app.get_json("/v1/admin/queues/sale").await["epoch"].as_u64();
    assert!(epoch.is_some());
    let mut before = Vec::new();
    for member in &arrival {
        let view = position(&app, member, &tickets[member]).await;
        before.push((view["status"].clone(), view["rank"].clone()));
    }

    // Everything acknowledged reached the replica; then the master dies without a word.
    sentinel.wait_replicated();
    let killed_at = Instant::now();
    let old = sentinel.kill_master();

    // Until the sentinels promote the replica and rankgate finds it, every call fails closed: 503 with
    // Retry-After, never anything else. Probing goes on until a fresh member gets in.
    let mut refused = 0;
    let mut probe = 0;
    let newcomer = loop {
        assert!(
            killed_at.elapsed() < Duration::from_secs(120),
            "rankgate did not follow the failover within 120 s ({refused} refusals)"
        );
        probe += 1;
        let answer = enter(&app, json!({ "memberId": format!("late{probe}") }), None).await;
        let status = answer.status();
        if status == 200 {
            let answer: Value = answer.json().await.unwrap();
            break answer;
        }
        assert_eq!(
            status,
            503,
            "a call during the failover: {:?}",
            answer.text().await
        );
        assert!(answer.headers().get("retry-after").is_some());
        refused += 1;
        let poll = app
            .client
            .get(app.url(&format!("/v1/queues/sale/entries/{}", arrival[10])))
            .header("x-queue-ticket", &tickets[&arrival[10]])
            .send()
            .await
            .unwrap();
        assert!(
            poll.status() == 200 || poll.status() == 503,
            "a poll during the failover: {}",
            poll.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let followed_after = killed_at.elapsed();
    assert!(
        refused > 0,
        "the master was down for at least down-after-milliseconds: some call must have failed"
    );
    let new = sentinel.wait_for_new_master(old, Duration::from_secs(60));
    assert_ne!(new, old, "the replica was promoted");
    eprintln!("rankgate followed the failover after {followed_after:?} ({refused} refused entries)");

    // The same queue on the new master: same epoch, everybody at the place and status they had.
    assert_eq!(
        app.get_json("/v1/admin/queues/sale").await["epoch"].as_u64(),
        epoch,
        "nothing was lost, so the queue is the same one"
    );
    for (member, (status, rank)) in arrival.iter().zip(&before) {
        let view = position(&app, member, &tickets[member]).await;
        assert_eq!(
            (&view["status"], &view["rank"]),
            (status, rank),
            "{member}: {view}"
        );
    }
    // The late arrival (whichever probe got in first) waits behind every member from before.
    assert_eq!(
        newcomer["rank"].as_u64(),
        Some((MEMBERS - first_admitted) as u64),
        "{newcomer}"
    );
    // A member returning with its ticket keeps its place.
    let returning = &arrival[MEMBERS - 1];
    let again: Value = enter(&app, json!({ "memberId": returning }), Some(&tickets[returning]))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["rank"], before[MEMBERS - 1].1, "{again}");

    // Admission goes on, FIFO: the next tick admits the members right behind the first five.
    let next = loop {
        match app.state.waiting_room.admit_queue_now(&sale()).await {
            Ok(outcome) if !outcome.admitted.is_empty() => break outcome.admitted.len(),
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(180),
            "admission never resumed"
        );
    };
    for member in &arrival[first_admitted..first_admitted + next] {
        let view = position(&app, member, &tickets[member]).await;
        assert_eq!(view["status"], "READY", "{member}: {view}");
    }
    let behind = &arrival[first_admitted + next];
    assert_eq!(
        position(&app, behind, &tickets[behind]).await["status"],
        "WAITING"
    );
    app.stop().await;
}

/// A start on a sentinel URL whose master name no sentinel monitors fails, naming the setting and
/// hiding the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_name_no_sentinel_knows_stops_the_start_clearly() {
    let sentinel = crate::redis_servers::sentinel();
    let url = sentinel.url().replace("/mymaster", "/nosuchmaster");
    let dir = tempfile::tempdir().unwrap();
    let mut config = rankgate::config::Config::for_data_dir(dir.path());
    config.redis = vec![url];
    config.waiting_room.token_secret = Some(SECRET.into());
    let error = match rankgate::app::Application::build(config).await {
        Ok(_) => panic!("a start with an unknown master name succeeded"),
        Err(error) => format!("{error:#}"),
    };
    assert!(error.contains("--redis"), "{error}");
    assert!(error.contains("nosuchmaster"), "{error}");
    assert!(!error.contains("sentinel-suite-pw"), "{error}");
}
