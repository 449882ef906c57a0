//! Issue 29, SPEC 2.2 "Places that survive the store": three instances share a Redis that is restarted
//! empty mid-sale. While it is down the waiting room answers 503 with `Retry-After`; once it is back,
//! every member who returns with its ticket gets its original place (READY members come back WAITING at
//! the front, the others in their original order), everyone ahead of every fresh arrival; a ticket
//! restores once; the consumed member gets no place back from the instance that saw its order; the
//! paused queue stays paused at the rate the admin set; and admission after the loss keeps FIFO and the
//! budget.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;
use crate::redis_servers::RestartableRedis;

/// The token secret of these tests' Redis instances (and the Sentinel test's).
pub(crate) const SECRET: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
const MEMBERS: usize = 300;
const FRESH: usize = 40;

/// `POST /v1/queues/sale/entries` with `body`, and the ticket when given.
pub(crate) async fn enter(app: &TestApp, body: Value, ticket: Option<&str>) -> reqwest::Response {
    let mut request = app.client.post(app.url("/v1/queues/sale/entries")).json(&body);
    if let Some(ticket) = ticket {
        request = request.header("x-queue-ticket", ticket);
    }
    request.send().await.unwrap()
}

/// The member's place in `sale`, read with its ticket (200 asserted).
pub(crate) async fn position(app: &TestApp, member: &str, ticket: &str) -> Value {
    let answer = app
        .client
        .get(app.url(&format!("/v1/queues/sale/entries/{member}")))
        .header("x-queue-ticket", ticket)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "{member}");
    answer.json().await.unwrap()
}

async fn admin_view(app: &TestApp) -> Value {
    app.get("/v1/admin/queues/sale").await.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_empty_mid_sale_gives_every_ticket_holder_its_place_back() {
    let mut redis = RestartableRedis::start();
    let url = redis.url();
    let mut apps = Vec::new();
    for _ in 0..3 {
        let url = url.clone();
        apps.push(
            TestApp::builder()
                .admission_stepped_by_test()
                .configure(move |config| {
                    config.redis = vec![url];
                    config.redis_prefix = "loss:".into();
                    config.waiting_room.token_secret = Some(SECRET.into());
                })
                .spawn()
                .await,
        );
    }
    let put = apps[0]
        .client
        .put(apps[0].url("/v1/admin/queues/sale"))
        .json(&json!({ "admitPerSecond": 5, "tokenTtlSeconds": 900, "paused": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let lost_epoch = admin_view(&apps[1]).await["epoch"].as_u64().unwrap();

    // 300 members enter across the instances; the paused queue keeps them in arrival order.
    let mut tickets: HashMap<String, String> = HashMap::new();
    let mut arrival = Vec::new();
    for i in 0..MEMBERS {
        let member = format!("m{i:03}");
        let answer: Value = enter(&apps[i % 3], json!({ "memberId": member }), None)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(answer["rank"], i, "{answer}");
        tickets.insert(member.clone(), answer["ticket"].as_str().unwrap().to_owned());
        arrival.push(member);
    }
    // Five are admitted (one tick of the budget), and the first of them buys through instance 2.
    let resumed = apps[1]
        .client
        .put(apps[1].url("/v1/admin/queues/sale"))
        .json(&json!({ "paused": false }))
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    apps[1]
        .state
        .waiting_room
        .admit_queue_now(&rankgate_core::queue::QueueName::parse("sale").unwrap())
        .await
        .unwrap();
    let paused_again = apps[2]
        .client
        .put(apps[2].url("/v1/admin/queues/sale"))
        .json(&json!({ "paused": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(paused_again.status(), 200);
    let mut ready = Vec::new();
    for member in &arrival {
        if position(&apps[0], member, &tickets[member]).await["status"] == "READY" {
            ready.push(member.clone());
        }
    }
    assert!(!ready.is_empty() && ready.len() <= 5, "{ready:?}");
    assert_eq!(ready, arrival[..ready.len()], "admission is FIFO");
    let buyer = ready[0].clone();
    let token = position(&apps[2], &buyer, &tickets[&buyer]).await["entryToken"]
        .as_str()
        .unwrap()
        .to_owned();
    let claim: Value = apps[2]
        .client
        .post(apps[2].url("/v1/queues/sale/tokens/claim"))
        .header("x-queue-ticket", &tickets[&buyer])
        .json(&json!({ "memberId": buyer, "token": token }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let consumed = apps[2]
        .client
        .post(apps[2].url("/v1/queues/sale/tokens/consume"))
        .header("x-queue-ticket", &tickets[&buyer])
        .json(&json!({ "memberId": buyer, "claimId": claim["claimId"] }))
        .send()
        .await
        .unwrap();
    assert_eq!(consumed.status(), 204, "{claim}");

    // Redis goes down: 503 with Retry-After, for entries and polls alike.
    redis.down();
    let refused = enter(&apps[0], json!({ "memberId": "m005" }), Some(&tickets["m005"])).await;
    assert_eq!(refused.status(), 503);
    assert!(
        refused.headers().get("retry-after").is_some(),
        "{:?}",
        refused.headers()
    );
    let refused = apps[1]
        .client
        .get(apps[1].url("/v1/queues/sale/entries/m005"))
        .header("x-queue-ticket", &tickets["m005"])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().get("retry-after").is_some());

    // It comes back empty. Members return with their tickets, in a shuffled order, across the
    // instances, among fresh arrivals; the buyer returns through the instance that saw its order.
    redis.up();
    let mut returning: Vec<String> = arrival.clone();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..returning.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        returning.swap(i, (state % (i as u64 + 1)) as usize);
    }
    let mut fresh = Vec::new();
    let mut fresh_tickets = HashMap::new();
    let mut new_tickets = HashMap::new();
    for (i, member) in returning.iter().enumerate() {
        let app = if *member == buyer { &apps[2] } else { &apps[i % 3] };
        let answer = loop {
            let answer = enter(app, json!({ "memberId": member }), Some(&tickets[member])).await;
            if answer.status() != 503 {
                break answer;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(answer.status(), 200, "{member}");
        let answer: Value = answer.json().await.unwrap();
        assert_eq!(
            answer["status"], "WAITING",
            "READY members come back WAITING: {answer}"
        );
        assert!(answer["entryToken"].is_null());
        new_tickets.insert(member.clone(), answer["ticket"].as_str().unwrap().to_owned());
        if i % (MEMBERS / FRESH) == 0 {
            let newcomer: Value = enter(&apps[(i + 1) % 3], json!({}), None)
                .await
                .json()
                .await
                .unwrap();
            let id = newcomer["memberId"].as_str().unwrap().to_owned();
            fresh_tickets.insert(id.clone(), newcomer["ticket"].as_str().unwrap().to_owned());
            fresh.push(id);
        }
    }

    // The settings survived: still paused, at the admin's rate and TTL, in a new epoch.
    for app in &apps {
        let view = admin_view(app).await;
        assert_eq!(
            (
                view["paused"].as_bool(),
                view["admitPerSecond"].as_f64(),
                view["tokenTtlSeconds"].as_u64()
            ),
            (Some(true), Some(5.0), Some(900)),
            "{view}"
        );
        assert_ne!(view["epoch"].as_u64(), Some(lost_epoch), "{view}");
    }

    // The order: the admitted ones who had not bought first, then everyone else in arrival order,
    // then the fresh arrivals and the buyer (entered afresh) in their arrival order.
    let mut expected: Vec<String> = ready[1..].to_vec();
    expected.extend(arrival[ready.len()..].iter().cloned());
    let mut ranks = Vec::new();
    for member in expected.iter().chain(fresh.iter()).chain(std::iter::once(&buyer)) {
        let ticket = new_tickets.get(member).or(fresh_tickets.get(member)).unwrap();
        let view = position(&apps[ranks.len() % 3], member, ticket).await;
        ranks.push((member.clone(), view["rank"].as_u64().unwrap()));
    }
    for (i, (member, rank)) in ranks.iter().take(expected.len()).enumerate() {
        assert_eq!(*rank, i as u64, "{member}");
    }
    let behind: Vec<u64> = ranks[expected.len()..].iter().map(|(_, rank)| *rank).collect();
    assert!(
        behind.iter().all(|rank| *rank >= expected.len() as u64),
        "every fresh arrival (and the buyer) waits behind every ticket holder: {behind:?}"
    );
    // Fresh arrivals keep their own order.
    let fresh_ranks: Vec<u64> = ranks[expected.len()..expected.len() + fresh.len()]
        .iter()
        .map(|(_, rank)| *rank)
        .collect();
    assert!(fresh_ranks.windows(2).all(|w| w[0] < w[1]), "{fresh_ranks:?}");

    // A ticket restores once: the old ticket again changes nothing.
    let again: Value = enter(
        &apps[1],
        json!({ "memberId": arrival[10] }),
        Some(&tickets[&arrival[10]]),
    )
    .await
    .json()
    .await
    .unwrap();
    let place = expected.iter().position(|member| *member == arrival[10]).unwrap();
    assert_eq!(again["rank"], place, "{again}");

    // Admission resumes FIFO and within the budget, however many instances tick.
    let resumed = apps[0]
        .client
        .put(apps[0].url("/v1/admin/queues/sale"))
        .json(&json!({ "paused": false }))
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let mut admitted = 0;
    for app in &apps {
        admitted += app
            .state
            .waiting_room
            .admit_queue_now(&rankgate_core::queue::QueueName::parse("sale").unwrap())
            .await
            .unwrap()
            .admitted
            .len();
    }
    assert!(
        (1..=6).contains(&admitted),
        "one tick's budget (5, plus at most one refilled): {admitted}"
    );
    for (member, _) in ranks.iter().take(admitted) {
        let view = position(&apps[0], member, &new_tickets[member]).await;
        assert_eq!(view["status"], "READY", "{member}: the front is admitted first");
    }
    for app in apps {
        app.stop().await;
    }
}

/// The same ticket path on the embedded store, which never loses a queue: its epoch survives a restart
/// (a member's ticket from before still finds its place, unchanged), and a queue deleted by an admin
/// retires its epoch, so an old ticket enters at the back like anybody new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_store_tickets_keep_their_place_across_a_restart_and_a_deleted_queue_restores_nothing(
) {
    let app = TestApp::builder().admission_stepped_by_test().spawn().await;
    let put = app
        .client
        .put(app.url("/v1/admin/queues/sale"))
        .json(&json!({ "paused": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let mut tickets = HashMap::new();
    for member in ["a", "b"] {
        let answer: Value = enter(&app, json!({ "memberId": member }), None)
            .await
            .json()
            .await
            .unwrap();
        tickets.insert(member, answer["ticket"].as_str().unwrap().to_owned());
    }
    let epoch = admin_view(&app).await["epoch"].as_u64().unwrap();

    let dir = app.stop().await.expect("the app's own data dir");
    let app = TestApp::builder()
        .admission_stepped_by_test()
        .in_temp_dir(dir)
        .spawn()
        .await;
    assert_eq!(
        admin_view(&app).await["epoch"].as_u64(),
        Some(epoch),
        "the epoch survives a restart"
    );
    let again: Value = enter(&app, json!({ "memberId": "b" }), Some(&tickets["b"]))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (again["status"].as_str(), again["rank"].as_u64()),
        (Some("WAITING"), Some(1)),
        "{again}"
    );

    let deleted = app
        .client
        .delete(app.url("/v1/admin/queues/sale"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    enter(&app, json!({ "memberId": "c" }), None).await;
    assert_ne!(
        admin_view(&app).await["epoch"].as_u64(),
        Some(epoch),
        "a new queue, a new epoch"
    );
    let back: Value = enter(&app, json!({ "memberId": "a" }), Some(&tickets["a"]))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        back["rank"], 1,
        "behind the newcomer: a deleted queue's ticket names no place: {back}"
    );
    app.stop().await;
}
