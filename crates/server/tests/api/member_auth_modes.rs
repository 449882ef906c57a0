//! Issue 29, SPEC 2.2 "Member identity": `member_auth = "gateway"` and `"jwt"`, on real servers. Every
//! member endpoint (the poll and the entry through the fast lane and through hyper, the stream, the
//! leave, claim / consume / release, the waiting page and the gate with `X-Member-Id`), on the embedded
//! store and on Redis, refuses a request that does not prove the member with 401 JSON (403 when it
//! proves another member), shows nothing of the member, and serves the member's own request. The JWKS
//! test rewrites the key file under a running server: the new key is accepted within seconds, the old
//! one refused, no restart.

use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rankgate::waiting_room::config::{MemberAuth, MemberAuthFile};
use rankgate::waiting_room::{GateConfig, GateRoute};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::helpers::*;
use crate::redis_servers;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwt");
const GATEWAY_KEY: &str = "gw-key-0123456789";
const SHOP_SECRET: &str = "the-shops-hs256-secret-of-32-bytes-or-more";
const ISSUER: &str = "https://shop.example";
const AUDIENCE: &str = "rankgate";

/// Where the room keeps its state.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Embedded,
    Redis,
}

/// A running room and, on Redis, the cleanup of its keys.
struct Room {
    app: TestApp,
    _keys: Option<redis_servers::KeyCleanup>,
}

/// `[waiting_room]` member-auth keys (TOML) resolved as the config loader resolves them.
fn member_auth(text: &str) -> MemberAuth {
    let mut file: MemberAuthFile = toml::from_str(text).expect("valid TOML");
    MemberAuth::from_file(&mut file).expect("valid member_auth settings")
}

/// A room in `mode` on `backend`, with a `[[gate]]` on `POST /orders` for queue `queue` (its upstream is
/// never reached: every gated request here is refused before or at the claim).
async fn spawn_room(backend: Backend, mode: MemberAuth, queue: &str) -> Room {
    let queue = queue.to_owned();
    let (redis, keys) = match backend {
        Backend::Embedded => (None, None),
        Backend::Redis => {
            let prefix = redis_servers::unique_prefix();
            let urls = vec![redis_servers::standalone_url()];
            let keys = redis_servers::KeyCleanup {
                nodes: urls.clone(),
                prefix: prefix.clone(),
            };
            (Some((urls, prefix)), Some(keys))
        }
    };
    let app = spawn_app_with(move |config| {
        config.waiting_room.member_auth = mode;
        config.waiting_room.poll_burst = 1_000;
        config.waiting_room.gates = vec![GateConfig {
            queue,
            upstream: "http://127.0.0.1:9".into(),
            routes: vec![GateRoute {
                method: "POST".into(),
                path: "/orders".into(),
                prefix: false,
            }],
            timeout_millis: 1_000,
            max_body_bytes: 65_536,
        }];
        if let Some((urls, prefix)) = redis {
            config.redis = urls;
            config.redis_prefix = prefix;
            config.waiting_room.token_secret = Some("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8".into());
        }
    })
    .await;
    Room { app, _keys: keys }
}

/// How a request travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// A fresh connection's first request: the fast lane answers polls and entries.
    Lane,
    /// After a `/healthz` that handed the connection to hyper: hyper and the router answer.
    Hyper,
}

/// One request written by hand on a fresh connection `via` the lane or hyper; its status, head and body.
async fn raw(
    app: &TestApp,
    via: Via,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    body: Option<&Value>,
) -> (u16, String, String) {
    let host = app.address.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).await.unwrap();
    let mut text = String::new();
    if via == Via::Hyper {
        text.push_str("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    text.push_str(&format!("{method} {path} HTTP/1.1\r\nHost: x\r\n"));
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    let body = body.map(|body| body.to_string()).unwrap_or_default();
    if method == "POST" {
        text.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    text.push_str("\r\n");
    text.push_str(&body);
    stream.write_all(text.as_bytes()).await.unwrap();
    let answers = read_answers(&mut stream, if via == Via::Hyper { 2 } else { 1 }).await;
    let (head, body) = answers.last().unwrap().clone();
    let status = head[9..12].parse().unwrap();
    (status, head, body)
}

/// `count` answers (head, body) framed by `content-length`.
async fn read_answers(stream: &mut TcpStream, count: usize) -> Vec<(String, String)> {
    let mut raw = Vec::new();
    let mut answers = Vec::new();
    let mut buffer = [0u8; 8192];
    while answers.len() < count {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(n > 0, "the connection closed after {} answers", answers.len());
        raw.extend_from_slice(&buffer[..n]);
        while let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(raw[..end].to_vec()).unwrap();
            let length: usize = head
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .map_or(0, |value| value.trim().parse().unwrap());
            if raw.len() < end + 4 + length {
                break;
            }
            let body = String::from_utf8(raw[end + 4..end + 4 + length].to_vec()).unwrap();
            raw.drain(..end + 4 + length);
            answers.push((head, body));
        }
    }
    answers
}

/// Every member endpoint for member `victim` of `queue`: method, path, body, extra headers, the lanes
/// it takes, and what the member's own request gets.
struct Endpoint {
    name: &'static str,
    method: &'static str,
    path: String,
    body: Option<Value>,
    headers: Vec<(String, String)>,
    vias: &'static [Via],
    /// The answer to the member's own credential: a status and a check of the body.
    served: (u16, fn(&str) -> bool),
}

fn endpoints(queue: &str) -> Vec<Endpoint> {
    const BOTH: &[Via] = &[Via::Lane, Via::Hyper];
    const HYPER: &[Via] = &[Via::Hyper];
    let member_header = vec![("X-Member-Id".to_owned(), "victim".to_owned())];
    vec![
        Endpoint {
            name: "poll",
            method: "GET",
            path: format!("/v1/queues/{queue}/entries/victim"),
            body: None,
            headers: Vec::new(),
            vias: BOTH,
            served: (200, |body| body.contains(r#""rank":0"#)),
        },
        Endpoint {
            name: "entry",
            method: "POST",
            path: format!("/v1/queues/{queue}/entries"),
            body: Some(json!({ "memberId": "victim" })),
            headers: Vec::new(),
            vias: BOTH,
            served: (200, |body| {
                body.contains(r#""rank":0"#)
                    && body.contains(r#""memberId":"victim""#)
                    && body.contains("ticket")
            }),
        },
        Endpoint {
            name: "claim",
            method: "POST",
            path: format!("/v1/queues/{queue}/tokens/claim"),
            body: Some(json!({ "memberId": "victim", "token": "A".repeat(43) })),
            headers: Vec::new(),
            vias: HYPER,
            // The member is proven; its (made-up) token is what fails.
            served: (401, |body| body.contains(r#""error":"token: "#)),
        },
        Endpoint {
            name: "consume",
            method: "POST",
            path: format!("/v1/queues/{queue}/tokens/consume"),
            body: Some(json!({ "memberId": "victim", "claimId": "c-1" })),
            headers: Vec::new(),
            vias: HYPER,
            served: (404, |body| body.contains("claimId")),
        },
        Endpoint {
            name: "release",
            method: "POST",
            path: format!("/v1/queues/{queue}/tokens/release"),
            body: Some(json!({ "memberId": "victim", "claimId": "c-1" })),
            headers: Vec::new(),
            vias: HYPER,
            served: (404, |body| body.contains("claimId")),
        },
        Endpoint {
            name: "waiting page",
            method: "GET",
            path: format!("/wait/{queue}"),
            body: None,
            headers: member_header.clone(),
            vias: HYPER,
            served: (200, |body| body.contains("<html") || body.contains("<!doctype")),
        },
        Endpoint {
            name: "gate",
            method: "POST",
            path: "/orders".into(),
            body: Some(json!({ "sku": "x" })),
            headers: [member_header, vec![("X-Entry-Token".to_owned(), "A".repeat(43))]].concat(),
            vias: HYPER,
            // The member is proven; its (made-up) entry token is what fails.
            served: (401, |body| {
                !body.contains("Authorization") && !body.contains("X-Queue-Ticket")
            }),
        },
    ]
}

/// Asserts a refusal: `status`, JSON with only an `error` naming what to send, nothing of the member,
/// and none of the presented `secrets` echoed.
fn assert_refused(what: &str, (status, head, body): &(u16, String, String), expected: u16, secrets: &[&str]) {
    assert_eq!(*status, expected, "{what}: {head}\n{body}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{what}: {head}"
    );
    let value: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{what}: {body}"));
    let error = value["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: {body}"));
    assert!(
        error.starts_with("Authorization:") || error.starts_with("X-Queue-Ticket:"),
        "{what}: the error says what to send: {error}"
    );
    assert_eq!(
        value.as_object().unwrap().len(),
        1,
        "{what}: nothing but the error: {body}"
    );
    for secret in secrets.iter().filter(|secret| secret.len() > 3) {
        assert!(!body.contains(secret), "{what}: the credential is echoed: {body}");
    }
}

/// Pauses `queue` (so nobody turns READY mid-test) and enters `victim` with `entry_headers` (a credential
/// the mode believes); returns the victim's ticket.
async fn pause_and_enter_victim(app: &TestApp, queue: &str, entry_headers: &[(String, String)]) -> String {
    let put = app
        .put_json(&format!("/v1/admin/queues/{queue}"), &json!({ "paused": true }))
        .await;
    assert_eq!(put.status(), 200);
    let (status, head, body) = raw(
        app,
        Via::Lane,
        "POST",
        &format!("/v1/queues/{queue}/entries"),
        entry_headers,
        Some(&json!({ "memberId": "victim" })),
    )
    .await;
    assert_eq!(status, 200, "{head}\n{body}");
    let entered: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(entered["memberId"], "victim");
    entered["ticket"]
        .as_str()
        .expect("an entry answers its ticket")
        .to_owned()
}

/// Runs every endpoint with every refused credential, then with each credential that proves the member,
/// then checks the victim kept its place and can leave with its own credential.
async fn every_endpoint_refuses_and_serves(
    app: &TestApp,
    queue: &str,
    refused: &[Refused<'_>],
    proving: &[(&str, Vec<(String, String)>)],
) {
    for endpoint in endpoints(queue) {
        for via in endpoint.vias {
            for (what, headers, status) in refused {
                let headers = [endpoint.headers.clone(), headers.clone()].concat();
                let answer = raw(
                    app,
                    *via,
                    endpoint.method,
                    &endpoint.path,
                    &headers,
                    endpoint.body.as_ref(),
                )
                .await;
                let secrets: Vec<&str> = headers.iter().map(|(_, value)| value.as_str()).collect();
                let secrets: Vec<&str> = secrets
                    .into_iter()
                    .filter(|value| *value != "victim" && !value.starts_with("AAAA"))
                    .collect();
                assert_refused(
                    &format!("{} via {via:?} with {what}", endpoint.name),
                    &answer,
                    *status,
                    &secrets,
                );
            }
            for (what, headers) in proving {
                let headers = [endpoint.headers.clone(), headers.clone()].concat();
                let (status, head, body) = raw(
                    app,
                    *via,
                    endpoint.method,
                    &endpoint.path,
                    &headers,
                    endpoint.body.as_ref(),
                )
                .await;
                let (expected, check) = endpoint.served;
                assert_eq!(
                    status, expected,
                    "{} via {via:?} with {what}: {head}\n{body}",
                    endpoint.name
                );
                assert!(check(&body), "{} via {via:?} with {what}: {body}", endpoint.name);
            }
        }
    }
    // The stream: refused in JSON, served as events to the member.
    let events = app.url(&format!("/v1/queues/{queue}/entries/victim/events"));
    for (what, headers, status) in refused {
        let mut request = app.client.get(&events);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let answer = request.send().await.unwrap();
        assert_eq!(answer.status().as_u16(), *status, "events with {what}");
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body.as_object().unwrap().len(), 1, "events with {what}: {body}");
    }
    for (what, headers) in proving {
        let mut request = app.client.get(&events);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let mut answer = request.send().await.unwrap();
        assert_eq!(answer.status(), 200, "events with {what}");
        let first = tokio::time::timeout(Duration::from_secs(5), answer.chunk())
            .await
            .expect("a first event")
            .unwrap()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&first).contains("\"rank\":0"),
            "events with {what}: {first:?}"
        );
    }
    // Nothing refused changed anything; the leave is refused too, then the member's own leave works.
    for (what, headers, status) in refused {
        let answer = raw(
            app,
            Via::Hyper,
            "DELETE",
            &format!("/v1/queues/{queue}/entries/victim"),
            headers,
            None,
        )
        .await;
        assert_refused(&format!("leave with {what}"), &answer, *status, &[]);
    }
    let (_, headers) = &proving[0];
    let (status, _, body) = raw(
        app,
        Via::Lane,
        "GET",
        &format!("/v1/queues/{queue}/entries/victim"),
        headers,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.contains(r#""rank":0"#), "still first in line: {body}");
    let (status, head, _) = raw(
        app,
        Via::Hyper,
        "DELETE",
        &format!("/v1/queues/{queue}/entries/victim"),
        headers,
        None,
    )
    .await;
    assert_eq!(status, 204, "{head}");
}

/// Request headers, in order.
type Headers = Vec<(String, String)>;

/// A credential that must be refused: what it is, its headers, and the status (401 or 403).
type Refused<'a> = (&'a str, Headers, u16);

fn header(name: &str, value: impl Into<String>) -> Vec<(String, String)> {
    vec![(name.to_owned(), value.into())]
}

fn bearer(credential: &str) -> Vec<(String, String)> {
    header("Authorization", format!("Bearer {credential}"))
}

async fn gateway_mode_believes_a_member_id_only_with_a_gateway_key(backend: Backend) {
    let queue = format!("gw-{backend:?}").to_lowercase();
    // The test client (127.0.0.1) is not a trusted proxy here.
    let mode = member_auth(&format!(
        "member_auth = \"gateway\"\ngateway_keys = [\"{GATEWAY_KEY}\"]\ntrusted_proxies = [\"10.0.0.0/8\"]"
    ));
    let room = spawn_room(backend, mode, &queue).await;
    let app = &room.app;
    let ticket = pause_and_enter_victim(app, &queue, &bearer(GATEWAY_KEY)).await;
    // A new id without the gateway's word is refused too; `{}` still gets an id rankgate picks.
    let stranger = raw(
        app,
        Via::Lane,
        "POST",
        &format!("/v1/queues/{queue}/entries"),
        &[],
        Some(&json!({ "memberId": "stranger" })),
    )
    .await;
    assert_refused("a new member id without a gateway key", &stranger, 401, &[]);
    let (status, _, body) = raw(
        app,
        Via::Hyper,
        "POST",
        &format!("/v1/queues/{queue}/entries"),
        &[],
        Some(&json!({})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""memberId":"v-"#), "{body}");

    let others_ticket = app.ticket(&queue, "other");
    let refused = [
        ("no credential", Vec::new(), 401),
        ("a wrong gateway key", bearer("gw-key-wrong-one"), 401),
        (
            "a wrong key with the member's ticket",
            [bearer("gw-key-wrong-one"), header("X-Queue-Ticket", &ticket)].concat(),
            401,
        ),
        (
            "another member's ticket",
            header("X-Queue-Ticket", &others_ticket),
            403,
        ),
        (
            "a Basic credential",
            header("Authorization", "Basic Z3c6a2V5"),
            401,
        ),
    ];
    let proving = [
        ("the gateway key", bearer(GATEWAY_KEY)),
        ("the member's ticket", header("X-Queue-Ticket", &ticket)),
    ];
    every_endpoint_refuses_and_serves(app, &queue, &refused, &proving).await;
    room.app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_mode_believes_a_member_id_only_with_a_gateway_key_on_embedded() {
    gateway_mode_believes_a_member_id_only_with_a_gateway_key(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_mode_believes_a_member_id_only_with_a_gateway_key_on_redis() {
    gateway_mode_believes_a_member_id_only_with_a_gateway_key(Backend::Redis).await;
}

/// A peer in `trusted_proxies` (the test client, 127.0.0.1, in 127.0.0.0/8) is the shop's gateway: its
/// member ids are believed with no key, on the lane as through hyper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_mode_believes_a_trusted_proxy() {
    let mode = member_auth("member_auth = \"gateway\"\ntrusted_proxies = [\"127.0.0.0/8\", \"::1\"]");
    let room = spawn_room(Backend::Embedded, mode, "proxied").await;
    let app = &room.app;
    pause_and_enter_victim(app, "proxied", &[]).await;
    for via in [Via::Lane, Via::Hyper] {
        let (status, _, body) = raw(app, via, "GET", "/v1/queues/proxied/entries/victim", &[], None).await;
        assert_eq!(status, 200, "{via:?}: {body}");
        assert!(body.contains(r#""rank":0"#), "{via:?}: {body}");
    }
    let (status, _, body) = raw(
        app,
        Via::Hyper,
        "GET",
        "/wait/proxied",
        &header("X-Member-Id", "victim"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, _) = raw(
        app,
        Via::Hyper,
        "DELETE",
        "/v1/queues/proxied/entries/victim",
        &[],
        None,
    )
    .await;
    assert_eq!(status, 204);
    room.app.stop().await;
}

fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Claims of a token for `sub` valid for ten minutes, from the shop, for rankgate.
fn claims(sub: &str) -> Value {
    json!({ "sub": sub, "exp": now_seconds() + 600, "iss": ISSUER, "aud": AUDIENCE })
}

fn sign(key: &EncodingKey, algorithm: Algorithm, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(algorithm);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

fn hs256(secret: &str, claims: &Value) -> String {
    sign(
        &EncodingKey::from_secret(secret.as_bytes()),
        Algorithm::HS256,
        None,
        claims,
    )
}

/// An unsigned token (`alg: none`), as an attacker would send it.
fn unsigned(claims: &Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    format!("{header}.{payload}.")
}

async fn jwt_mode_proves_the_member_by_sub(backend: Backend) {
    let queue = format!("jwt-{backend:?}").to_lowercase();
    let mode = member_auth(&format!(
        "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"HS256\"]\nsecret = \"{SHOP_SECRET}\"\nissuer = \"{ISSUER}\"\n\
         audience = \"{AUDIENCE}\"\nleeway_seconds = 5"
    ));
    let room = spawn_room(backend, mode, &queue).await;
    let app = &room.app;
    let valid = hs256(SHOP_SECRET, &claims("victim"));
    let ticket = pause_and_enter_victim(app, &queue, &bearer(&valid)).await;

    // An entry is the JWT's `sub`: `{}` enters it, another body id is 403, no JWT is 401.
    let entries = format!("/v1/queues/{queue}/entries");
    for via in [Via::Lane, Via::Hyper] {
        let (status, _, body) = raw(
            app,
            via,
            "POST",
            &entries,
            &bearer(&hs256(SHOP_SECRET, &claims("by-sub"))),
            Some(&json!({})),
        )
        .await;
        assert_eq!(status, 200, "{via:?}: {body}");
        assert!(
            body.contains(r#""memberId":"by-sub""#) && body.contains(r#""rank":1"#),
            "{via:?}: {body}"
        );
        let no_jwt = raw(app, via, "POST", &entries, &[], Some(&json!({}))).await;
        assert_refused(&format!("{{}} without a JWT via {via:?}"), &no_jwt, 401, &[]);
        let stranger = raw(
            app,
            via,
            "POST",
            &entries,
            &[],
            Some(&json!({ "memberId": "stranger" })),
        )
        .await;
        assert_refused(
            &format!("a new id without a JWT via {via:?}"),
            &stranger,
            401,
            &[],
        );
    }

    let mut expired = claims("victim");
    expired["exp"] = json!(now_seconds() - 3600);
    let mut early = claims("victim");
    early["nbf"] = json!(now_seconds() + 3600);
    let mut no_exp = claims("victim");
    no_exp.as_object_mut().unwrap().remove("exp");
    let mut wrong_issuer = claims("victim");
    wrong_issuer["iss"] = json!("https://evil.example");
    let mut wrong_audience = claims("victim");
    wrong_audience["aud"] = json!("someone-else");
    let tokens = [
        ("an expired JWT", hs256(SHOP_SECRET, &expired), 401),
        ("a JWT not valid yet (nbf)", hs256(SHOP_SECRET, &early), 401),
        ("a JWT without exp", hs256(SHOP_SECRET, &no_exp), 401),
        (
            "a JWT signed with another key",
            hs256("another-shops-secret-of-32-bytes-long", &claims("victim")),
            401,
        ),
        ("a JWT of another issuer", hs256(SHOP_SECRET, &wrong_issuer), 401),
        (
            "a JWT for another audience",
            hs256(SHOP_SECRET, &wrong_audience),
            401,
        ),
        ("an alg: none JWT", unsigned(&claims("victim")), 401),
        ("garbage", "not.a.jwt".to_owned(), 401),
        ("another member's JWT", hs256(SHOP_SECRET, &claims("other")), 403),
    ];
    let mut refused: Vec<Refused<'_>> = tokens
        .iter()
        .map(|(what, token, status)| (*what, bearer(token), *status))
        .collect();
    refused.push(("no credential", Vec::new(), 401));
    refused.push((
        "another member's ticket",
        header("X-Queue-Ticket", app.ticket(&queue, "other")),
        403,
    ));
    refused.push((
        "a bad JWT with the member's ticket",
        [bearer("not.a.jwt"), header("X-Queue-Ticket", &ticket)].concat(),
        401,
    ));
    let proving = [
        ("the member's JWT", bearer(&valid)),
        ("the member's ticket", header("X-Queue-Ticket", &ticket)),
    ];
    every_endpoint_refuses_and_serves(app, &queue, &refused, &proving).await;
    room.app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_mode_proves_the_member_by_sub_on_embedded() {
    jwt_mode_proves_the_member_by_sub(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_mode_proves_the_member_by_sub_on_redis() {
    jwt_mode_proves_the_member_by_sub(Backend::Redis).await;
}

/// The JWK of an Ed25519 public key fixture: its SPKI DER ends with the 32 key bytes.
fn ed25519_jwk(name: &str, kid: &str) -> Value {
    let pem = std::fs::read_to_string(format!("{FIXTURES}/{name}.pub.pem")).unwrap();
    let body: String = pem.lines().filter(|line| !line.starts_with("-----")).collect();
    let der = STANDARD.decode(body).unwrap();
    let x = URL_SAFE_NO_PAD.encode(&der[der.len() - 32..]);
    json!({ "kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": kid, "x": x })
}

fn ed25519_key(name: &str) -> EncodingKey {
    EncodingKey::from_ed_pem(&std::fs::read(format!("{FIXTURES}/{name}.key.pem")).unwrap()).unwrap()
}

/// Key rotation without a restart: the JWKS file is rewritten with a new key while the server runs; a
/// token of the new key is accepted within a couple of seconds, the old key's refused from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_mode_with_a_jwks_rotates_keys_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(
        &jwks,
        json!({ "keys": [ed25519_jwk("ed25519-a", "a")] }).to_string(),
    )
    .unwrap();
    let mode = member_auth(&format!(
        "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"EdDSA\", \"ES256\"]\njwks_file = {:?}\nissuer = \"{ISSUER}\"\n\
         audience = \"{AUDIENCE}\"",
        jwks.display().to_string()
    ));
    let room = spawn_room(Backend::Embedded, mode, "rotating").await;
    let app = &room.app;
    let old = sign(
        &ed25519_key("ed25519-a"),
        Algorithm::EdDSA,
        Some("a"),
        &claims("victim"),
    );
    let new = sign(
        &ed25519_key("ed25519-b"),
        Algorithm::EdDSA,
        Some("b"),
        &claims("victim"),
    );
    // Key b signing under key a's kid: a forged signature, not an unknown key.
    let forged = sign(
        &ed25519_key("ed25519-b"),
        Algorithm::EdDSA,
        Some("a"),
        &claims("victim"),
    );
    pause_and_enter_victim(app, "rotating", &bearer(&old)).await;
    let poll = "/v1/queues/rotating/entries/victim";
    for via in [Via::Lane, Via::Hyper] {
        let (status, _, body) = raw(app, via, "GET", poll, &bearer(&old), None).await;
        assert_eq!(status, 200, "{via:?}: {body}");
        for (what, token) in [("the next key", &new), ("a forged signature", &forged)] {
            let refused = raw(app, via, "GET", poll, &bearer(token), None).await;
            assert_refused(
                &format!("{what} before rotation via {via:?}"),
                &refused,
                401,
                &[token.as_str()],
            );
        }
    }

    // Rotate: the file now holds key b only (written whole, as a sidecar that renames into place would).
    let staged = dir.path().join("jwks.json.new");
    std::fs::write(
        &staged,
        json!({ "keys": [ed25519_jwk("ed25519-b", "b")] }).to_string(),
    )
    .unwrap();
    std::fs::rename(&staged, &jwks).unwrap();
    let rotated = std::time::Instant::now();
    loop {
        let (status, _, body) = raw(app, Via::Lane, "GET", poll, &bearer(&new), None).await;
        if status == 200 {
            assert!(body.contains(r#""rank":0"#), "{body}");
            break;
        }
        assert!(
            rotated.elapsed() < Duration::from_secs(3),
            "the new key is still refused {:?} after the rotation: {body}",
            rotated.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for via in [Via::Lane, Via::Hyper] {
        let (status, _, body) = raw(app, via, "GET", poll, &bearer(&new), None).await;
        assert_eq!(status, 200, "{via:?}: {body}");
        let refused = raw(app, via, "GET", poll, &bearer(&old), None).await;
        assert_refused(
            &format!("the old key after rotation via {via:?}"),
            &refused,
            401,
            &[old.as_str()],
        );
    }
    // A broken rewrite keeps the keys that worked.
    std::fs::write(&jwks, "{\"keys\": [").unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (status, _, body) = raw(app, Via::Lane, "GET", poll, &bearer(&new), None).await;
    assert_eq!(status, 200, "{body}");
    room.app.stop().await;
}

/// ES256 with a PEM public key (`public_key_file`): the member's token enters and polls, a token of
/// another algorithm is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_mode_with_an_es256_public_key() {
    let mode = member_auth(&format!(
        "member_auth = \"jwt\"\n[jwt]\nalgorithms = [\"ES256\"]\npublic_key_file = \"{FIXTURES}/es256.pub.pem\""
    ));
    let room = spawn_room(Backend::Embedded, mode, "es256").await;
    let app = &room.app;
    let key = EncodingKey::from_ec_pem(&std::fs::read(format!("{FIXTURES}/es256.key.pem")).unwrap()).unwrap();
    let token = sign(&key, Algorithm::ES256, None, &claims("victim"));
    pause_and_enter_victim(app, "es256", &bearer(&token)).await;
    for via in [Via::Lane, Via::Hyper] {
        let (status, _, body) = raw(
            app,
            via,
            "GET",
            "/v1/queues/es256/entries/victim",
            &bearer(&token),
            None,
        )
        .await;
        assert_eq!(status, 200, "{via:?}: {body}");
        let hmac = hs256(SHOP_SECRET, &claims("victim"));
        let refused = raw(
            app,
            via,
            "GET",
            "/v1/queues/es256/entries/victim",
            &bearer(&hmac),
            None,
        )
        .await;
        assert_refused(
            &format!("an HS256 token via {via:?}"),
            &refused,
            401,
            &[hmac.as_str()],
        );
    }
    room.app.stop().await;
}
