//! Issue 29, SPEC 2.2 "Member identity": only the member acts as the member. Every member endpoint, on
//! the embedded store and on Redis (the poll and the entry through the fast path as well as through
//! hyper), answers a request without the member's credential, with another member's, or with a tampered
//! or foreign ticket with 401/403 JSON, shows nothing of the member, and changes nothing.

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::*;
use crate::redis_servers;

/// A ticket of the same shape signed under another secret: what another deployment would issue.
fn foreign_ticket(app: &TestApp, queue: &str, member: &str) -> String {
    let secret = rankgate_store::queue::token::TokenSecret::from_bytes([9; 32]);
    let key = rankgate::waiting_room::ticket::TicketKey::derived_from(&secret);
    let ticket = key.issue(
        &rankgate_core::queue::QueueName::parse(queue).unwrap(),
        &rankgate_core::ids::MemberId::parse(member).unwrap(),
        None,
    );
    assert_ne!(ticket, app.ticket(queue, member), "the app's own secret differs");
    ticket
}

/// The ticket with one character changed in the middle.
fn tampered(ticket: &str) -> String {
    let middle = ticket.len() / 2;
    let swapped = if &ticket[middle..=middle] == "A" { "B" } else { "A" };
    format!("{}{swapped}{}", &ticket[..middle], &ticket[middle + 1..])
}

async fn member_endpoints_refuse_every_other_credential(app: &TestApp, queue: &str) {
    let put = app
        .client
        .put(app.url(&format!("/v1/admin/queues/{queue}")))
        .json(&json!({ "paused": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    // The victim enters and keeps its ticket; `{}` gets an id rankgate picks.
    let entered: Value = app
        .client
        .post(app.url(&format!("/v1/queues/{queue}/entries")))
        .json(&json!({ "memberId": "victim" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (entered["memberId"].as_str(), entered["rank"].as_u64()),
        (Some("victim"), Some(0))
    );
    let ticket = entered["ticket"]
        .as_str()
        .expect("an entry answers its ticket")
        .to_owned();
    assert!(ticket.len() <= 512);
    // The entry's ticket names the victim's place; the place-less one the test can sign proves it too.
    assert_ne!(ticket, app.ticket(queue, "victim"));
    let picked: Value = app
        .client
        .post(app.url(&format!("/v1/queues/{queue}/entries")))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let other = picked["memberId"].as_str().expect("a picked id").to_owned();
    assert!(other.starts_with("v-") && other.len() == 24, "{other}");
    let others_ticket = picked["ticket"].as_str().unwrap().to_owned();

    let credentials: [(&str, Option<String>, u16); 5] = [
        ("none", None, 401),
        ("another member's ticket", Some(others_ticket.clone()), 403),
        ("a tampered ticket", Some(tampered(&ticket)), 401),
        (
            "a foreign ticket",
            Some(foreign_ticket(app, queue, "victim")),
            401,
        ),
        ("garbage", Some("not a ticket".to_owned()), 401),
    ];
    let endpoints: [(Method, String, Option<Value>); 7] = [
        (Method::GET, format!("/v1/queues/{queue}/entries/victim"), None),
        (
            Method::GET,
            format!("/v1/queues/{queue}/entries/victim/events"),
            None,
        ),
        (Method::DELETE, format!("/v1/queues/{queue}/entries/victim"), None),
        (
            Method::POST,
            format!("/v1/queues/{queue}/tokens/claim"),
            Some(json!({ "memberId": "victim", "token": "A".repeat(43) })),
        ),
        (
            Method::POST,
            format!("/v1/queues/{queue}/tokens/consume"),
            Some(json!({ "memberId": "victim", "claimId": "c-1" })),
        ),
        (
            Method::POST,
            format!("/v1/queues/{queue}/tokens/release"),
            Some(json!({ "memberId": "victim", "claimId": "c-1" })),
        ),
        // The held id entered again: no second position, no ticket.
        (
            Method::POST,
            format!("/v1/queues/{queue}/entries"),
            Some(json!({ "memberId": "victim" })),
        ),
    ];
    for (method, path, body) in &endpoints {
        for (what, credential, status) in &credentials {
            // An entry without any credential is a fresh entry attempt: 401 because the id is held.
            let mut request = app.client.request(method.clone(), app.url(path));
            if let Some(body) = body {
                request = request.json(body);
            }
            if let Some(ticket) = credential {
                request = request.header("x-queue-ticket", ticket);
            }
            let answer = request.send().await.unwrap();
            assert_eq!(answer.status(), *status, "{method} {path} with {what}");
            assert!(
                answer.headers()["content-type"]
                    .to_str()
                    .unwrap()
                    .starts_with("application/json"),
                "{method} {path} with {what}"
            );
            let body: Value = answer.json().await.unwrap();
            let error = body["error"].as_str().unwrap_or_else(|| panic!("{body}"));
            assert!(
                error.starts_with("X-Queue-Ticket"),
                "{method} {path} with {what}: {error}"
            );
            assert_eq!(
                body.as_object().unwrap().len(),
                1,
                "nothing but the error: {body}"
            );
        }
    }
    // Nothing changed: the victim is still first in line, and its own ticket shows it.
    let mine = app
        .client
        .get(app.url(&format!("/v1/queues/{queue}/entries/victim")))
        .header("x-queue-ticket", &ticket)
        .send()
        .await
        .unwrap();
    assert_eq!(mine.status(), 200);
    let mine: Value = mine.json().await.unwrap();
    assert_eq!(
        (mine["status"].as_str(), mine["rank"].as_u64()),
        (Some("WAITING"), Some(0))
    );
    assert!(mine.get("ticket").is_none(), "a poll does not hand out tickets");
    // The member's own ticket enters it again (idempotent), answering the same ticket.
    let again: Value = app
        .client
        .post(app.url(&format!("/v1/queues/{queue}/entries")))
        .header("x-queue-ticket", &ticket)
        .json(&json!({ "memberId": "victim" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (again["rank"].as_u64(), again["ticket"].as_str()),
        (Some(0), Some(ticket.as_str()))
    );
    // A ticket of this member in another queue proves nothing here.
    let elsewhere = app
        .client
        .get(app.url(&format!("/v1/queues/{queue}/entries/victim")))
        .header("x-queue-ticket", app.ticket("elsewhere", "victim"))
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_endpoints_refuse_every_other_credential_on_embedded() {
    let app = spawn_app().await;
    member_endpoints_refuse_every_other_credential(&app, "id-embedded").await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_endpoints_refuse_every_other_credential_on_redis() {
    let prefix = redis_servers::unique_prefix();
    let urls = vec![redis_servers::standalone_url()];
    let _keys = redis_servers::KeyCleanup {
        nodes: urls.clone(),
        prefix: prefix.clone(),
    };
    let app = spawn_app_with(move |config| {
        config.redis = urls;
        config.redis_prefix = prefix;
        config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
    })
    .await;
    member_endpoints_refuse_every_other_credential(&app, "id-redis").await;
    app.stop().await;
}
