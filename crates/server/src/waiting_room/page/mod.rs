//! `GET /wait/{queue}`: the waiting page shoppers' browsers get (SPEC 2.2, issue 12).
//!
//! ```text
//! GET /wait/{queue}[?first=N]
//!   ─► member: X-Member-Id (the shop's gateway) ▸ else a verified rankgate_visitor cookie ▸ else a new
//!      visitor id (Set-Cookie)
//!   ─► enter (idempotent: a member already in line keeps its place; READY/CLAIMED keep their state),
//!      claiming the place its rankgate_ticket_<queue> cookie (HttpOnly) names: after the store lost the
//!      queue, the script's reload (it sees NOT_ENTERED) brings the shopper back to its place; the answer
//!      sets the cookie to the new ticket
//!   ─► WAITING: the waiting page, rendered with the position; its script follows
//!      /v1/queues/{queue}/entries/{member}/events and falls back to polling the position route
//!   ─► READY:   Set-Cookie rankgate_token_<queue> (HttpOnly) + the admitted page, which continues to
//!      the page's continue_url by itself (a meta refresh, so scripts off works too)
//!   ─► CLAIMED: the admitted page without the automatic continue (an order is already in flight)
//! ```
//!
//! The token reaches the browser only as an HttpOnly cookie set by this server side, never through the
//! page's script: when the stream reports READY the script reloads this page, whose answer sets the
//! cookie. The gate (`gate.rs`) then reads the token and the member from the cookies on the shop's
//! navigation; headers keep precedence for API clients.

mod challenge;
pub mod config;
pub mod cookies;
mod html;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::on;
use axum::Router;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rand::RngCore as _;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::{MemberStatus, QueueName};

use self::config::{CookieSecure, Pages};
use self::cookies::VisitorKey;
use super::entry_guard::{EntryEvidence, IssuedChallenge};
use super::identity::Credential;
use super::identity::Standing;
use super::service::CountMissing;
use super::service::WaitingRoom;
use crate::http::error::{ApiError, ApiResult};
use crate::http::error::{PassThrough, Refusal};
use crate::http::fast_path::DirectHeaders;
use crate::http::peer::client_address;
use crate::http::peer::PeerAddress;
use crate::http::route_table::{self, Endpoint};

/// What the page handler needs: the room, the validated pages and the visitor cookie key.
pub(crate) struct PageState {
    room: Arc<WaitingRoom>,
    pages: Pages,
    visitor_key: VisitorKey,
    cookie_secure: CookieSecure,
    visitor_cookie_max_age_seconds: u64,
}

pub(crate) const ENDPOINTS: &[Endpoint<Arc<PageState>>] = &[
    Endpoint::new(Method::GET, "/wait/{queue}", |m| on(m, waiting_page)),
    Endpoint::new(Method::POST, "/wait/{queue}", |m| on(m, waiting_page_entry)),
    Endpoint::new(Method::GET, challenge::POW_WORKER_PATH, |m| on(m, pow_worker)),
];

/// `GET /wait-assets/pow-worker.js`: the proof-of-work solver the challenge page runs in a Web Worker.
async fn pow_worker() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/javascript; charset=utf-8"),
            ),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=3600"),
            ),
            (
                header::HeaderName::from_static("x-content-type-options"),
                HeaderValue::from_static("nosniff"),
            ),
        ],
        challenge::POW_WORKER_JS,
    )
        .into_response()
}

/// What the challenge page's form posts: `challenge` + `nonce`, or the CAPTCHA's token (as
/// `captchaToken`, or in the provider widget's own field).
#[derive(Debug, Default)]
struct EntryForm {
    challenge: Option<String>,
    nonce: Option<String>,
    captcha_token: Option<String>,
}

impl EntryForm {
    /// Most form fields read: the page posts three.
    const MAX_FIELDS: usize = 16;

    fn parse(body: &[u8]) -> ApiResult<EntryForm> {
        let mut form = EntryForm::default();
        for (key, value) in form_urlencoded::parse(body).take(Self::MAX_FIELDS) {
            let slot = match key.as_ref() {
                "challenge" => &mut form.challenge,
                "nonce" => &mut form.nonce,
                "captchaToken" | "cf-turnstile-response" | "h-captcha-response" | "g-recaptcha-response" => {
                    if value.is_empty() {
                        continue;
                    }
                    &mut form.captcha_token
                }
                _ => continue,
            };
            if slot.is_some() {
                return Err(ApiError::bad_field(
                    &key,
                    "given twice in the form; give each field once",
                ));
            }
            *slot = Some(value.into_owned());
        }
        Ok(form)
    }

    fn evidence(&self) -> EntryEvidence<'_> {
        EntryEvidence {
            solution: self.challenge.as_deref().zip(self.nonce.as_deref()),
            captcha_token: self.captcha_token.as_deref(),
        }
    }
}

/// The room's pages. `Config` validated them at load; a config built in code that skipped that gets the
/// built-in page rather than a half-valid one.
pub(crate) fn pages_of(room: &WaitingRoom) -> Pages {
    Pages::from_config(&room.config.page, &room.config.gates).unwrap_or_else(|error| {
        tracing::error!(error = %error, "waiting_room.page is invalid; serving the built-in waiting page");
        Pages::default()
    })
}

/// A refusal of the gate (`response`, JSON) as a page in the waiting room's look, for a browser.
pub(crate) async fn gate_refusal(pages: &Pages, queue: &QueueName, response: Response) -> Response {
    let status = response.status();
    let (parts, body) = response.into_parts();
    let message = axum::body::to_bytes(body, 64 * 1024)
        .await
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .and_then(|value| value["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("refused").to_owned());
    let look = pages.for_queue(queue.as_str());
    let mut page = html_response(
        html::gate_refusal_page(look, queue.as_str(), status.as_u16(), &message),
        None,
        &[],
    );
    *page.status_mut() = status;
    for name in [header::RETRY_AFTER, header::WWW_AUTHENTICATE] {
        if let Some(value) = parts.headers.get(&name) {
            page.headers_mut().insert(name, value.clone());
        }
    }
    // An HTML error on purpose: the edge must not turn it back into JSON.
    page.extensions_mut().insert(crate::http::error::PassThrough);
    page
}

pub(crate) fn routes(room: Arc<WaitingRoom>) -> Router {
    let pages = pages_of(&room);
    let state = PageState {
        visitor_key: room.visitor_key(),
        cookie_secure: room.config.page_cookie_secure,
        visitor_cookie_max_age_seconds: room.config.visitor_cookie_max_age_seconds,
        pages,
        room,
    };
    route_table::router_of(ENDPOINTS).with_state(Arc::new(state))
}

/// `?first=N`: the rank at the member's first view (the scripts-off progress bar). Other parameters are
/// ignored (trackers append their own); `first` given wrong is a 400 naming it.
fn first_rank_of(uri: &Uri) -> ApiResult<Option<u64>> {
    let Some(query) = uri.query() else {
        return Ok(None);
    };
    let mut first = None;
    for (key, value) in form_urlencoded::parse(query.as_bytes()).take(32) {
        if key == "first" {
            let parsed = value
                .parse::<u64>()
                .ok()
                .filter(|_| value.len() <= 20)
                .ok_or_else(|| ApiError::bad_field("first", "must be a whole number (a rank)"))?;
            first = Some(parsed);
        }
    }
    Ok(first)
}

/// The member: `X-Member-Id` with that member's credential (its `X-Queue-Ticket`, or as `member_auth`
/// allows the gateway's word or the shop's JWT; a member id alone proves nothing, see `identity`), else a
/// verified visitor cookie; `None` means issue one.
fn member_of(
    state: &PageState,
    queue: &QueueName,
    headers: &HeaderMap,
    peer: PeerAddress,
) -> ApiResult<Option<MemberId>> {
    if let Some(raw) = headers.get("x-member-id") {
        let raw = std::str::from_utf8(raw.as_bytes())
            .map_err(|_| ApiError::bad_field("X-Member-Id", "must be UTF-8"))?;
        let member = WaitingRoom::parse_member("X-Member-Id", raw.trim())?;
        state
            .room
            .authorize(queue, &member, &Credential::of_request(headers, peer))?;
        return Ok(Some(member));
    }
    Ok(state.visitor_key.visitor_of(headers))
}

async fn waiting_page(
    State(state): State<Arc<PageState>>,
    Path(queue): Path<String>,
    uri: Uri,
    peer: PeerAddress,
    headers: HeaderMap,
) -> ApiResult<Response> {
    serve_page(&state, &queue, &uri, peer, &headers, None).await
}

/// `POST /wait/{queue}`: the challenge page's form (a solved proof of work, a CAPTCHA token). Entered,
/// it answers 303 to the waiting page, so a reload never posts again.
async fn waiting_page_entry(
    State(state): State<Arc<PageState>>,
    Path(queue): Path<String>,
    uri: Uri,
    peer: PeerAddress,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> ApiResult<Response> {
    let form = EntryForm::parse(&body)?;
    serve_page(&state, &queue, &uri, peer, &headers, Some(&form)).await
}

async fn serve_page(
    state: &PageState,
    queue: &str,
    uri: &Uri,
    peer: PeerAddress,
    headers: &HeaderMap,
    form: Option<&EntryForm>,
) -> ApiResult<Response> {
    let queue = WaitingRoom::parse_queue(queue)?;
    let first_rank = first_rank_of(uri)?;
    let secure = cookies::secure_for(state.cookie_secure, uri, headers);
    let mut set_cookies = Vec::new();
    let (member, mut standing) = match member_of(state, &queue, headers, peer)? {
        Some(member) => (member, Standing::Unknown),
        None => {
            let (member, value) = state.visitor_key.issue();
            set_cookies.push(cookies::set_cookie(
                cookies::VISITOR_COOKIE,
                &value,
                state.visitor_cookie_max_age_seconds,
                secure,
            ));
            (member, Standing::New)
        }
    };
    let ticket_cookie_name = cookies::ticket_cookie_name(&queue);
    let sent_ticket = cookies::cookie_values(headers, &ticket_cookie_name)
        .into_iter()
        .next();
    if sent_ticket.is_some_and(|ticket| state.room.ticket_proves(&queue, &member, ticket)) {
        standing = Standing::Returning;
    }
    let client = client_address(
        peer.0,
        &DirectHeaders::Map(headers),
        &state.room.config.client_proxies,
    );
    let evidence = form.map(EntryForm::evidence).unwrap_or_default();
    let count_missing = if form.is_some() {
        CountMissing::Yes
    } else {
        CountMissing::No
    };
    let guarded = state
        .room
        .guard_entry(&queue, &member, standing, &evidence, client, count_missing)
        .await;
    match guarded {
        Ok(()) => {}
        Err(ApiError::Refused(refusal)) => {
            return Ok(refusal_answer(
                state,
                &queue,
                *refusal,
                headers,
                form.is_some(),
                &set_cookies,
            ));
        }
        Err(other) => return Err(other),
    }
    let (position, ticket) = state.room.enter_page(&queue, &member, sent_ticket).await?;
    if form.is_some() {
        if sent_ticket != Some(ticket.as_str()) {
            set_cookies.push(cookies::set_cookie(
                &ticket_cookie_name,
                &ticket,
                state.visitor_cookie_max_age_seconds,
                secure,
            ));
        }
        return Ok(see_other(&format!("/wait/{queue}"), &set_cookies));
    }
    if sent_ticket != Some(ticket.as_str()) {
        set_cookies.push(cookies::set_cookie(
            &ticket_cookie_name,
            &ticket,
            state.visitor_cookie_max_age_seconds,
            secure,
        ));
    }
    let look = state.pages.for_queue(queue.as_str());
    let body = match position.status {
        MemberStatus::Ready => {
            let held_until = position
                .token_expires_at
                .as_deref()
                .and_then(|at| at.parse::<jiff::Timestamp>().ok())
                .map(|at| (at.strftime("%H:%M:%S UTC").to_string(), at.to_string()));
            if let Some(token) = &position.entry_token {
                let now_ms = state.room.clock.now_millis();
                let remaining = position
                    .token_expires_at
                    .as_deref()
                    .and_then(|at| at.parse::<jiff::Timestamp>().ok())
                    .map_or(state.room.config.token_ttl_seconds, |at| {
                        (at.as_millisecond() - now_ms).max(1000) as u64 / 1000
                    });
                set_cookies.push(cookies::set_cookie(
                    &cookies::token_cookie_name(&queue),
                    token,
                    remaining,
                    secure,
                ));
            }
            html::admitted_page(look, &html::Admitted::Ready { held_until })
        }
        MemberStatus::Claimed => html::admitted_page(look, &html::Admitted::InProgress),
        _ => {
            let p90 = position.estimated_wait_seconds_p90;
            let rank = position.rank;
            let first = first_rank.unwrap_or(0).max(rank.unwrap_or(0));
            let now = jiff::Timestamp::now();
            let nonce = new_nonce();
            let page = html::Waiting {
                queue: queue.as_str(),
                member: member.as_str(),
                rank,
                first_rank: first,
                estimate_seconds: position.estimated_wait_seconds,
                estimate_p90_seconds: p90,
                polling_interval_seconds: position.polling_interval_seconds,
                updated: (
                    now.strftime("%H:%M:%S UTC").to_string(),
                    now.round(jiff::Unit::Second).unwrap_or(now).to_string(),
                ),
                nonce: &nonce,
            };
            let body = html::waiting_page(look, &page);
            return Ok(html_response(body, Some(&nonce), &set_cookies));
        }
    };
    Ok(html_response(body, None, &set_cookies))
}

/// A refused entry's answer: for a browser (`Accept: text/html`), the challenge page (a fresh proof of
/// work, the CAPTCHA) or the budget page, with the refusal's status; for anything else the JSON refusal.
/// The visitor cookie just issued goes along either way, so the solved try is the same visitor.
fn refusal_answer(
    state: &PageState,
    queue: &QueueName,
    refusal: Refusal,
    headers: &HeaderMap,
    tried: bool,
    set_cookies: &[String],
) -> Response {
    let wants_html = headers
        .get(header::ACCEPT)
        .and_then(|accept| accept.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"));
    let status = refusal.status;
    let retry_after = refusal.retry_after_secs;
    if !wants_html {
        let mut response = refusal.into_response();
        append_cookies(response.headers_mut(), set_cookies);
        return response;
    }
    let look = state.pages.for_queue(queue.as_str());
    let nonce = new_nonce();
    let problem = tried.then_some(refusal.message.as_str());
    let issued = refusal.extra.get("challenge").and_then(|challenge| {
        Some(IssuedChallenge {
            challenge: challenge.get("challenge")?.as_str()?.to_owned(),
            difficulty: u32::try_from(challenge.get("difficulty")?.as_u64()?).ok()?,
            expires_at_ms: 0,
        })
    });
    let captcha = state.room.guards().captcha();
    let (body, csp) = match (refusal.reason, &issued, captcha) {
        ("challenge", Some(issued), _) => (
            challenge::challenge_page(
                look,
                queue.as_str(),
                &challenge::Asked::Pow(issued),
                problem,
                &nonce,
            ),
            challenge::challenge_csp(&nonce, None),
        ),
        ("captcha", _, Some(captcha)) => (
            challenge::challenge_page(
                look,
                queue.as_str(),
                &challenge::Asked::Captcha(captcha),
                problem,
                &nonce,
            ),
            challenge::challenge_csp(&nonce, Some(captcha)),
        ),
        _ => (
            challenge::budget_page(look, queue.as_str(), retry_after.unwrap_or(60)),
            challenge::challenge_csp(&nonce, None),
        ),
    };
    let mut response = html_response_with_csp(body, csp, set_cookies);
    *response.status_mut() = status;
    // A page for the browser, not an API error: the edge must not rewrite it as JSON.
    response.extensions_mut().insert(PassThrough);
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// 303 See Other to `location`, setting `set_cookies`.
fn see_other(location: &str, set_cookies: &[String]) -> Response {
    let mut response = axum::http::StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(location) {
        headers.insert(header::LOCATION, location);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    append_cookies(headers, set_cookies);
    response
}

/// One `Set-Cookie` per cookie (a value that is no header value, which the cookie builder never makes, is
/// left out).
fn append_cookies(headers: &mut HeaderMap, set_cookies: &[String]) {
    for cookie in set_cookies {
        if let Ok(value) = HeaderValue::from_str(cookie) {
            headers.append(header::SET_COOKIE, value);
        }
    }
}

fn new_nonce() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

fn html_response(body: String, script_nonce: Option<&str>, set_cookies: &[String]) -> Response {
    let script = script_nonce.map_or("'none'".to_string(), |nonce| format!("'nonce-{nonce}'"));
    // Only the page's own script runs, it talks only to this origin, and images (the logo) may come from
    // anywhere http(s): an injected tag that slipped past the escaping could neither run nor phone home.
    let csp = format!(
        "default-src 'none'; script-src {script}; style-src 'unsafe-inline'; img-src 'self' https: http:; \
         connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    );
    html_response_with_csp(body, csp, set_cookies)
}

fn html_response_with_csp(body: String, csp: String, set_cookies: &[String]) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    if let Ok(csp) = HeaderValue::from_str(&csp) {
        headers.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    append_cookies(headers, set_cookies);
    response
}
