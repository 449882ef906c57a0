//! The waiting page over plain HTTP: hostile queue names, parameters, headers, cookies and config strings
//! are rejected or escaped; a tampered visitor cookie is never trusted; the gate takes the page's cookie
//! token exactly once, with headers taking precedence.

use rankgate::waiting_room::config::PageConfig;
use serde_json::{json, Value};

use rankgate_testkit::redis_servers::{standalone_url, KeyCleanup};

use super::{spawn_gated_app, spawn_upstream, TestApp};

async fn get(app: &TestApp, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = app.client.get(format!("{}{path}", app.address));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("GET")
}

fn set_cookies(response: &reqwest::Response) -> Vec<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

/// `name=value` of the `Set-Cookie` called `name`.
fn cookie_pair(set_cookies: &[String], name: &str) -> Option<String> {
    set_cookies
        .iter()
        .find(|c| c.starts_with(&format!("{name}=")))
        .map(|c| c.split(';').next().unwrap().to_string())
}

fn data_member(html: &str) -> String {
    let start = html.find("data-member=\"").expect("data-member") + "data-member=\"".len();
    html[start..start + html[start..].find('"').unwrap()].to_string()
}

#[tokio::test]
async fn hostile_queue_names_parameters_and_member_ids_get_a_400_naming_the_field() {
    let (upstream, _orders) = spawn_upstream().await;
    let app = spawn_gated_app("sale", &upstream, |_| {}).await;
    let long = "q".repeat(65);
    for (path, headers, field) in [
        ("/wait/bad%20name", vec![], "queue"),
        ("/wait/%3Cscript%3E", vec![], "queue"),
        (&*format!("/wait/{long}"), vec![], "queue"),
        ("/wait/sale?first=abc", vec![], "first"),
        ("/wait/sale?first=-1", vec![], "first"),
        ("/wait/sale?first=99999999999999999999999", vec![], "first"),
        ("/wait/sale", vec![("x-member-id", "")], "X-Member-Id"),
        (
            "/wait/sale",
            vec![("x-member-id", &*"m".repeat(129))],
            "X-Member-Id",
        ),
    ] {
        let response = get(&app, path, &headers).await;
        assert_eq!(response.status(), 400, "{path} {headers:?}");
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json"),
            "{path}"
        );
        let body: Value = response.json().await.unwrap();
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(field), "{path}: {error}");
    }
    // Issue 29: a member id alone proves nothing on the page either: without the member's ticket the
    // page does not show (or enter) that member.
    for (headers, status) in [
        (vec![("x-member-id", "m-1")], 401),
        (vec![("x-member-id", "m-1"), ("x-queue-ticket", "forged")], 401),
    ] {
        let response = get(&app, "/wait/sale", &headers).await;
        assert_eq!(response.status(), status, "{headers:?}");
        let body: Value = response.json().await.unwrap();
        assert!(
            body["error"].as_str().unwrap().starts_with("X-Queue-Ticket"),
            "{body}"
        );
    }
    let others = app.ticket("sale", "m-2");
    let response = get(
        &app,
        "/wait/sale",
        &[("x-member-id", "m-1"), ("x-queue-ticket", &others)],
    )
    .await;
    assert_eq!(response.status(), 403, "another member's ticket");
    // Unknown parameters (trackers' utm_…) are ignored, not refused.
    assert_eq!(get(&app, "/wait/sale?utm_source=x", &[]).await.status(), 200);
    // The largest `first` is a rank like any other, not an overflow.
    let largest = get(&app, "/wait/sale?first=18446744073709551615", &[]).await;
    assert_eq!(largest.status(), 200);
}

#[tokio::test]
async fn request_derived_and_configured_strings_are_escaped_into_the_html() {
    let (upstream, _orders) = spawn_upstream().await;
    let hostile = "</title><script>alert(1)</script>\"'&";
    let app = spawn_gated_app("sale", &upstream, |config| {
        config.waiting_room.page = vec![PageConfig {
            title: Some(hostile.into()),
            intro: Some(hostile.into()),
            position_text: Some(format!("{hostile} {{position}}")),
            keep_open_text: Some(hostile.into()),
            ..PageConfig::default()
        }];
    })
    .await;
    let hostile_member = "\"><img src=x onerror=alert(2)>&amp;";
    let ticket = app.ticket("sale", hostile_member);
    let response = get(
        &app,
        "/wait/sale",
        &[("x-member-id", hostile_member), ("x-queue-ticket", &ticket)],
    )
    .await;
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'nonce-") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert_eq!(headers["cache-control"], "no-store");
    let html = response.text().await.unwrap();
    assert!(!html.contains("<script>alert"), "a configured string is escaped");
    assert!(
        !html.contains("<img src=x"),
        "a request-derived string is escaped"
    );
    assert!(!html.contains("</title><script>"), "{html}");
    assert_eq!(
        html.matches("<script").count(),
        1,
        "only the page's own (nonced) script"
    );
    assert!(html.contains("&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;"));
    assert_eq!(
        data_member(&html),
        "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;&amp;amp;"
    );
    assert!(
        html.contains(" 1</p>"),
        "the position is filled into the configured text: {html}"
    );
}

#[tokio::test]
async fn invalid_page_config_stops_the_start_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    for (body, key) in [
        ("background = \"#fff\"", "background"),
        ("text = \"#777777\"", "contrast"),
        ("continue_url = \"javascript:alert(1)\"", "continue_url"),
        ("logo_url = \"//evil.example/logo.png\"", "logo_url"),
    ] {
        let path = dir.path().join("rankgate.toml");
        std::fs::write(&path, format!("[[waiting_room.page]]\n{body}\n")).unwrap();
        let overrides = rankgate::config::Overrides {
            config: Some(path),
            ..rankgate::config::Overrides::default()
        };
        let error = rankgate::config::Config::load(&overrides).unwrap_err();
        assert!(format!("{error:#}").contains(key), "{body}: {error:#}");
    }
}

#[tokio::test]
async fn a_tampered_visitor_cookie_is_ignored_and_a_new_visitor_issued() {
    let (upstream, _orders) = spawn_upstream().await;
    let app = spawn_gated_app("sale", &upstream, |_| {}).await;
    // Paused, so every visit renders the waiting page (with the member id in it).
    app.put_settings("sale", json!({ "paused": true })).await;
    let first = get(&app, "/wait/sale", &[]).await;
    let issued = set_cookies(&first);
    let visitor = cookie_pair(&issued, "rankgate_visitor").expect("a visitor cookie is issued");
    let attributes = issued
        .iter()
        .find(|c| c.starts_with("rankgate_visitor="))
        .unwrap();
    for attribute in ["HttpOnly", "SameSite=Lax", "Path=/", "Max-Age="] {
        assert!(attributes.contains(attribute), "{attributes}");
    }
    assert!(
        !attributes.contains("Secure"),
        "plain HTTP, no X-Forwarded-Proto: {attributes}"
    );
    let member = data_member(&first.text().await.unwrap());
    assert!(
        member.starts_with("v-") && visitor.contains(&member),
        "{visitor} / {member}"
    );

    // The same cookie: the same member, nothing new issued, the same place.
    let again = get(&app, "/wait/sale", &[("cookie", &visitor)]).await;
    let kept = set_cookies(&again);
    assert!(
        cookie_pair(&kept, "rankgate_visitor").is_none(),
        "a valid cookie is kept: {visitor} -> {kept:?}"
    );
    assert_eq!(data_member(&again.text().await.unwrap()), member);

    // Tampered: another id under the old signature, or the signature changed: a new visitor.
    let (id, signature) = visitor.rsplit_once('.').unwrap();
    let flipped = if signature.ends_with('A') { "B" } else { "A" };
    for tampered in [
        format!("{}.{signature}", id.replace("v-", "v-x")),
        format!("{id}.{}{flipped}", &signature[..signature.len() - 1]),
        format!("{id}."),
        id.to_string(),
        "rankgate_visitor=m-1.AAAA".to_string(),
    ] {
        let response = get(&app, "/wait/sale", &[("cookie", &tampered)]).await;
        assert_eq!(response.status(), 200, "{tampered}");
        let issued = set_cookies(&response);
        let new_cookie = cookie_pair(&issued, "rankgate_visitor").expect("a new visitor cookie");
        assert_ne!(new_cookie, visitor, "{tampered}");
        let new_member = data_member(&response.text().await.unwrap());
        assert_ne!(new_member, member, "{tampered} must not be trusted");
        assert!(new_member.starts_with("v-"));
    }

    // Behind a TLS proxy the cookies are Secure.
    let tls = get(&app, "/wait/sale", &[("x-forwarded-proto", "https")]).await;
    let issued = set_cookies(&tls);
    assert!(
        issued
            .iter()
            .any(|c| c.starts_with("rankgate_visitor=") && c.ends_with("; Secure")),
        "{issued:?}"
    );
}

#[tokio::test]
async fn the_gate_accepts_the_cookie_token_exactly_once_and_headers_take_precedence() {
    let (upstream, orders) = spawn_upstream().await;
    let app = spawn_gated_app("sale", &upstream, |_| {}).await;
    app.put_settings("sale", json!({ "paused": true })).await;
    let first = get(&app, "/wait/sale", &[]).await;
    let visitor = cookie_pair(&set_cookies(&first), "rankgate_visitor").unwrap();
    let member = data_member(&first.text().await.unwrap());
    assert!(first_is_waiting(&app, &visitor).await, "WAITING before admission");

    // Before admission the page sets no token; a navigation to the gate without one is 401.
    let order = |cookie: String, extra: Vec<(&'static str, String)>| {
        let mut request = app
            .client
            .post(format!("{}/orders", app.address))
            .header("cookie", cookie);
        for (name, value) in extra {
            request = request.header(name, value);
        }
        request.send()
    };
    assert_eq!(order(visitor.clone(), vec![]).await.unwrap().status(), 401);

    app.put_settings("sale", json!({ "paused": false })).await;
    let queue = rankgate_core::queue::QueueName::parse("sale").unwrap();
    app.state
        .waiting_room
        .admit_queue_now(&queue)
        .await
        .expect("admit");
    let admitted = get(&app, "/wait/sale", &[("cookie", &visitor)]).await;
    assert_eq!(admitted.status(), 200);
    let issued = set_cookies(&admitted);
    let token_cookie = issued
        .iter()
        .find(|c| c.starts_with("rankgate_token_sale="))
        .unwrap_or_else(|| panic!("READY sets the token cookie: {issued:?}"))
        .clone();
    for attribute in ["HttpOnly", "SameSite=Lax", "Path=/", "Max-Age="] {
        assert!(token_cookie.contains(attribute), "{token_cookie}");
    }
    let html = admitted.text().await.unwrap();
    assert!(
        html.contains("id=\"continue\"") && html.contains("href=\"/shop/checkout\""),
        "{html}"
    );
    assert!(
        html.contains("http-equiv=\"refresh\" content=\"4;url=/shop/checkout\""),
        "{html}"
    );
    let token = cookie_pair(&issued, "rankgate_token_sale").unwrap();

    // A wrong header wins over the right cookie (headers take precedence), and is refused.
    let wrong = order(
        format!("{visitor}; {token}"),
        vec![("x-entry-token", "A".repeat(43))],
    )
    .await
    .unwrap();
    assert_eq!(wrong.status(), 401);
    // The right token under a tampered visitor cookie is no member at all.
    let (id, signature) = visitor.rsplit_once('.').unwrap();
    let tampered = format!("{id}x.{signature}; {token}");
    assert_eq!(order(tampered, vec![]).await.unwrap().status(), 401);
    assert_eq!(orders.count(), 0);

    // The cookies alone: one order, then 401 for the same token.
    let placed = order(format!("other=1; {visitor}; {token}"), vec![])
        .await
        .unwrap();
    assert_eq!(placed.status(), 200, "{:?}", placed.text().await);
    let second = order(format!("{visitor}; {token}"), vec![]).await.unwrap();
    assert_eq!(second.status(), 401, "a consumed token buys no second order");
    // A browser (reloading the confirmation, or submitting again) gets a page that says what happened.
    let again = order(
        format!("{visitor}; {token}"),
        vec![("accept", "text/html,application/xhtml+xml;q=0.9".into())],
    )
    .await
    .unwrap();
    assert_eq!(again.status(), 401);
    assert!(
        again.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html"),
        "{:?}",
        again.headers()
    );
    let page = again.text().await.unwrap();
    assert!(page.contains("This turn was already used"), "{page}");
    assert!(page.contains("href=\"/wait/sale\""), "{page}");
    let seen = orders.seen.lock().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, member, "the upstream is told the visitor's member id");
    assert_eq!(
        seen[0].1,
        format!("other=1; {visitor}"),
        "the token cookie is not forwarded"
    );

    // API clients keep using the headers: another member admitted over the API orders with them.
    app.enter("sale", "api-1").await;
    app.state
        .waiting_room
        .admit_queue_now(&queue)
        .await
        .expect("admit");
    let position: Value = app
        .client
        .get(format!("{}/v1/queues/sale/entries/api-1", app.address))
        .header("x-queue-ticket", app.ticket("sale", "api-1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let api_token = position["entryToken"].as_str().expect("READY").to_string();
    let by_header = app
        .client
        .post(format!("{}/orders", app.address))
        .header("x-member-id", "api-1")
        .header("x-queue-ticket", app.ticket("sale", "api-1"))
        .header("x-entry-token", api_token)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(by_header.status(), 200);
    assert_eq!(orders.count(), 2);
}

async fn first_is_waiting(app: &TestApp, visitor: &str) -> bool {
    let html = get(app, "/wait/sale", &[("cookie", visitor)])
        .await
        .text()
        .await
        .unwrap();
    html.contains("You are number 1")
        && html.contains("http-equiv=\"refresh\"")
        && html.contains("<noscript>")
}

/// Two instances on one Redis with one token secret: a visitor cookie issued by one is the same member on
/// the other (its key is derived from the shared secret, nothing is stored), a token cookie set by one
/// passes the other's gate exactly once; an instance with another secret trusts neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_work_across_instances_sharing_redis_and_the_token_secret() {
    let prefix = format!("rgtest:page:{}:", std::process::id());
    let _cleanup = KeyCleanup::standalone(prefix.clone());
    let (upstream, orders) = spawn_upstream().await;
    let on_redis = |secret: &'static str| {
        let prefix = prefix.clone();
        move |config: &mut rankgate::config::Config| {
            config.redis = vec![standalone_url()];
            config.redis_prefix = prefix;
            config.waiting_room.token_secret = Some(secret.into());
        }
    };
    const SECRET: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
    const OTHER: &str = "BBECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
    let a = spawn_gated_app("sale", &upstream, on_redis(SECRET)).await;
    let b = spawn_gated_app("sale", &upstream, on_redis(SECRET)).await;
    let stranger = spawn_gated_app("sale", &upstream, on_redis(OTHER)).await;
    a.put_settings("sale", json!({ "paused": true })).await;
    a.enter("sale", "ahead-1").await;

    let first = get(&a, "/wait/sale", &[]).await;
    let visitor = cookie_pair(&set_cookies(&first), "rankgate_visitor").unwrap();
    let member = data_member(&first.text().await.unwrap());
    let on_b = get(&b, "/wait/sale", &[("cookie", &visitor)]).await;
    assert!(
        cookie_pair(&set_cookies(&on_b), "rankgate_visitor").is_none(),
        "B trusts A's cookie"
    );
    let html = on_b.text().await.unwrap();
    assert_eq!(data_member(&html), member);
    assert!(
        html.contains("You are number 2"),
        "the same place through B: {html}"
    );
    let on_stranger = get(&stranger, "/wait/sale", &[("cookie", &visitor)]).await;
    assert!(
        cookie_pair(&set_cookies(&on_stranger), "rankgate_visitor").is_some(),
        "another secret does not verify the cookie: a new visitor"
    );

    b.put_settings("sale", json!({ "paused": false })).await;
    let queue = rankgate_core::queue::QueueName::parse("sale").unwrap();
    b.state.waiting_room.admit_queue_now(&queue).await.expect("admit");
    let admitted = get(&b, "/wait/sale", &[("cookie", &visitor)]).await;
    let token = cookie_pair(&set_cookies(&admitted), "rankgate_token_sale").expect("READY via B");
    let order = |app: &TestApp| {
        app.client
            .post(format!("{}/orders", app.address))
            .header("cookie", format!("{visitor}; {token}"))
            .send()
    };
    assert_eq!(
        order(&stranger).await.unwrap().status(),
        401,
        "another secret: no member"
    );
    assert_eq!(
        order(&a).await.unwrap().status(),
        200,
        "A's gate takes B's token cookie"
    );
    assert_eq!(order(&b).await.unwrap().status(), 401, "once, across instances");
    assert_eq!(orders.count(), 1);
    assert_eq!(orders.seen.lock()[0].0, member);
}
