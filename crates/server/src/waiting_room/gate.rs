//! The reverse-proxy gate (SPEC 2.4, `[[gate]]`): one token, one order, without the shop changing code.
//!
//! For a protected route the gate requires `X-Entry-Token` and `X-Member-Id` — or, for browsers, the
//! waiting page's `rankgate_token_<queue>` and `rankgate_visitor` cookies (headers win) — claims the token (exactly one
//! concurrent request wins), forwards the request to the upstream, then consumes the token on a 2xx answer
//! and releases it on anything else — another status, a timeout, a refused or dropped connection — so a
//! failed order never burns the member's admission. The upstream's answer (status, headers, body) is
//! passed back unchanged; the entry token is stripped before forwarding so the upstream never sees it.
//!
//! The bookkeeping (claim → forward → consume/release) runs in a detached task, not in the request future:
//! hyper drops that future when the client hangs up, and an order the upstream committed must still
//! consume its token (issue 9, defect 2). "2xx" is decided on the upstream's status line; the body then
//! streams back to whoever is still there.
//!
//! Every forwarded order is timed and classified for adaptive admission (`adaptive.rs`): the time to the
//! upstream's status line and whether it was a 2xx, a 5xx, another status, a timeout or a transport error.
//!
//! When the store cannot be reached the gate fails closed (503) unless the queue's `fail_mode` is `open`,
//! in which case it forwards without a claim.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::{FailMode, QueueName, UpstreamOutcome};

use super::adaptive::outcome_of_status;
use super::config::GateConfig;
use super::identity::Credential;
use super::page::config::Pages;
use super::page::{self, cookies};
use super::service::WaitingRoom;
use super::telemetry::gate_outcome;
use crate::http::error::{ApiError, PassThrough};
use crate::http::peer::PeerAddress;

/// Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus the ones we set ourselves.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

/// A configured gate with its queue parsed.
#[derive(Debug, Clone)]
struct Gate {
    queue: QueueName,
    upstream: String,
    timeout: Duration,
    max_body_bytes: usize,
}

/// The gates answering one path, by method.
type MethodTable = Vec<(Method, Arc<Gate>)>;

pub(crate) fn routes(room: Arc<WaitingRoom>) -> Option<Router> {
    let gates = &room.config.gates;
    if gates.is_empty() {
        return None;
    }
    // path → (exact table, prefix table); axum allows one handler per path, so methods are merged here.
    let mut by_path: BTreeMap<String, (MethodTable, bool)> = BTreeMap::new();
    for config in gates {
        let gate = Arc::new(gate_from(config)?);
        for route in &config.routes {
            let method = Method::from_bytes(route.method.trim().to_ascii_uppercase().as_bytes()).ok()?;
            let mut path = route.path.trim().to_string();
            let prefix = route.prefix || path.ends_with("/*");
            if let Some(stripped) = path.strip_suffix("/*") {
                path = stripped.to_string();
            }
            if prefix {
                path = path.trim_end_matches('/').to_string();
            }
            if !path.starts_with('/') {
                path.insert(0, '/');
            }
            let entry = by_path.entry(path).or_insert_with(|| (Vec::new(), false));
            entry.0.push((method, Arc::clone(&gate)));
            entry.1 |= prefix;
        }
    }
    let pages = Arc::new(page::pages_of(&room));
    let mut router = Router::new();
    for (path, (table, prefix)) in by_path {
        let table = Arc::new(table);
        let handler = {
            let (room, table, pages) = (Arc::clone(&room), Arc::clone(&table), Arc::clone(&pages));
            move |request: Request| {
                let (room, table, pages) = (Arc::clone(&room), Arc::clone(&table), Arc::clone(&pages));
                async move { handle(room, table, pages, request).await }
            }
        };
        let exact_path = if path.is_empty() {
            "/".to_string()
        } else {
            path.clone()
        };
        router = router.route(&exact_path, any(handler.clone()));
        if prefix {
            router = router.route(&format!("{}/{{*rest}}", path), any(handler));
        }
    }
    Some(router)
}

fn gate_from(config: &GateConfig) -> Option<Gate> {
    Some(Gate {
        queue: QueueName::parse(&config.queue).ok()?,
        upstream: config.upstream.trim_end_matches('/').to_string(),
        timeout: Duration::from_millis(config.timeout_millis.max(1)),
        max_body_bytes: config.max_body_bytes,
    })
}

fn error_response(status: StatusCode, message: &str) -> Response {
    crate::http::error::json_error(status, message)
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// Whether the client is a browser navigating (it asks for HTML): the gate's own refusals then come as
/// a page in the waiting room's look instead of JSON. The upstream's answers pass as they are.
fn wants_html(headers: &HeaderMap) -> bool {
    header_str(headers, "accept").is_some_and(|accept| accept.contains("text/html"))
}

async fn handle(
    room: Arc<WaitingRoom>,
    table: Arc<MethodTable>,
    pages: Arc<Pages>,
    request: Request,
) -> Response {
    let html = wants_html(request.headers());
    let queue = table
        .iter()
        .find(|(method, _)| method == request.method())
        .or_else(|| table.first())
        .map(|(_, gate)| gate.queue.clone());
    let response = handle_for_json(room, table, request).await;
    match queue {
        Some(queue)
            if html
                && response.status().is_client_error() | response.status().is_server_error()
                && response.extensions().get::<PassThrough>().is_none() =>
        {
            page::gate_refusal(&pages, &queue, response).await
        }
        _ => response,
    }
}

async fn handle_for_json(room: Arc<WaitingRoom>, table: Arc<MethodTable>, request: Request) -> Response {
    let Some(gate) = table
        .iter()
        .find(|(method, _)| method == request.method())
        .map(|(_, gate)| Arc::clone(gate))
    else {
        return error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed on this gated route",
        );
    };
    let queue = gate.queue.clone();
    let (parts, body) = request.into_parts();
    // Headers first (API clients), then the cookies the waiting page sets (browsers cannot add headers
    // to a navigation); see `page::cookies`.
    let token = header_str(&parts.headers, "x-entry-token")
        .or_else(|| {
            cookies::cookie_values(&parts.headers, &cookies::token_cookie_name(&queue))
                .into_iter()
                .next()
        })
        .map(str::to_string);
    let Some(token) = token else {
        gate_outcome(&queue, "rejected_unauthorized");
        return ApiError::Unauthorized(
            "X-Entry-Token: missing entry token (no header, no waiting-page cookie)".into(),
        )
        .into_response();
    };
    let (member, member_from_cookie) = match header_str(&parts.headers, "x-member-id") {
        // A member id alone proves nothing: it comes with that member's credential (see `identity`).
        Some(raw) => match MemberId::parse(raw)
            .map_err(|e| ApiError::bad_field("X-Member-Id", e))
            .and_then(|member| {
                let peer = PeerAddress::of_extensions(&parts.extensions);
                room.authorize(&queue, &member, &Credential::of_request(&parts.headers, peer))?;
                Ok(member)
            }) {
            Ok(member) => (member, false),
            Err(error) => {
                gate_outcome(&queue, "rejected_unauthorized");
                return error.into_response();
            }
        },
        // A visitor cookie counts only when its signature verifies: a tampered one is no member at all.
        None => match room.visitor_key().visitor_of(&parts.headers) {
            Some(member) => (member, true),
            None => {
                gate_outcome(&queue, "rejected_unauthorized");
                return ApiError::Unauthorized(
                    "X-Member-Id: missing member id (no header, no valid visitor cookie)".into(),
                )
                .into_response();
            }
        },
    };
    let mut parts = parts;
    if member_from_cookie {
        // The upstream learns who ordered the same way whichever way the member was identified.
        if let Ok(value) = axum::http::HeaderValue::from_str(member.as_str()) {
            parts.headers.insert("x-member-id", value);
        }
    }
    let body = match axum::body::to_bytes(body, gate.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(error) if is_length_limit(&error) => {
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "body: larger than the {} bytes the gate forwards",
                    gate.max_body_bytes
                ),
            )
        }
        // Nothing is claimed yet: a body the client never finished (timeout, hang-up) costs no token.
        Err(error) => {
            return ApiError::BadRequest(format!("body: could not be read ({error}); send it again"))
                .into_response()
        }
    };

    // Claim → forward → consume/release runs in a task of its own: hyper drops this handler's future when
    // the client hangs up, and a bookkeeping step cut there would leave the claim to expire back to READY
    // after the upstream committed the order, so the same token could buy a second one. The task owns
    // everything it needs and finishes whatever the client does; this handler only waits for its answer.
    let order = tokio::spawn(gated_order(room, gate, parts, member, token, body));
    match order.await {
        Ok(response) => response,
        Err(error) => {
            ApiError::Internal(anyhow::anyhow!("the gate's order task failed: {error}")).into_response()
        }
    }
}

fn is_length_limit(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if current.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = current.source();
    }
    false
}

/// Claims the token, forwards the request, then consumes (upstream 2xx) or releases (anything else).
/// Runs detached from the client's connection (see [`handle`]).
async fn gated_order(
    room: Arc<WaitingRoom>,
    gate: Arc<Gate>,
    parts: axum::http::request::Parts,
    member: MemberId,
    token: String,
    body: Bytes,
) -> Response {
    let queue = gate.queue.clone();
    let claim_id = match room.claim(&queue, &member, &token).await {
        Ok(granted) => Some(granted.claim_id),
        Err(ApiError::Unavailable(message)) => match room.fail_mode_when_unreachable(&queue) {
            FailMode::Open => {
                tracing::warn!(queue = %queue, "queue store unreachable; fail_mode=open forwards without a claim");
                gate_outcome(&queue, "fail_open");
                None
            }
            FailMode::Closed => {
                gate_outcome(&queue, "unavailable");
                return ApiError::Unavailable(message).into_response();
            }
        },
        Err(error) => {
            gate_outcome(
                &queue,
                if matches!(error, ApiError::Conflict(_)) {
                    "rejected_conflict"
                } else {
                    "rejected_unauthorized"
                },
            );
            return error.into_response();
        }
    };

    let started = std::time::Instant::now();
    let forwarded = forward(&room, &gate, &parts, body).await;
    // Adaptive admission's measurement (issue 12): time to the upstream's status line, and its verdict.
    room.record_upstream(
        &queue,
        match &forwarded {
            Ok(response) => outcome_of_status(response.status()),
            Err((StatusCode::GATEWAY_TIMEOUT, _)) => UpstreamOutcome::Timeout,
            Err(_) => UpstreamOutcome::TransportError,
        },
        started.elapsed(),
    );
    let Some(claim_id) = claim_id else {
        return forwarded.unwrap_or_else(|(status, message)| error_response(status, &message));
    };
    match forwarded {
        Ok(response) if response.status().is_success() => {
            finish(&room, &queue, &member, &claim_id, Finish::Consume).await;
            gate_outcome(&queue, "consumed");
            response
        }
        Ok(response) => {
            finish(&room, &queue, &member, &claim_id, Finish::Release).await;
            gate_outcome(&queue, "released_upstream_status");
            response
        }
        Err((status, message)) => {
            finish(&room, &queue, &member, &claim_id, Finish::Release).await;
            gate_outcome(
                &queue,
                if status == StatusCode::GATEWAY_TIMEOUT {
                    "released_timeout"
                } else {
                    "released_upstream_error"
                },
            );
            error_response(status, &message)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finish {
    Consume,
    Release,
}

/// Consumes or releases, retrying briefly: after a committed order a lost consume would let the claim
/// expire back to READY and the token buy a second order, so it is worth a few attempts.
async fn finish(room: &WaitingRoom, queue: &QueueName, member: &MemberId, claim_id: &str, what: Finish) {
    for attempt in 0..5u32 {
        let result = match what {
            Finish::Consume => room.consume(queue, member, claim_id).await,
            Finish::Release => room.release(queue, member, claim_id).await,
        };
        match result {
            Ok(()) => return,
            Err(ApiError::Unavailable(_)) => tokio::time::sleep(Duration::from_millis(50 << attempt)).await,
            Err(error) => {
                tracing::warn!(queue = %queue, ?what, error = %error, "gate could not finish its claim");
                return;
            }
        }
    }
    tracing::error!(queue = %queue, ?what, "gate gave up finishing its claim; the claim will expire after claim_ttl");
}

/// Forwards the request; `Err` carries the status the gate answers with (504 timeout, 502 otherwise).
async fn forward(
    room: &WaitingRoom,
    gate: &Gate,
    parts: &axum::http::request::Parts,
    body: Bytes,
) -> Result<Response, (StatusCode, String)> {
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("{}{}", gate.upstream, path_and_query);
    let mut request = room
        .http
        .request(parts.method.clone(), &url)
        .timeout(gate.timeout)
        .body(body);
    for (name, value) in &parts.headers {
        let lower = name.as_str();
        if HOP_BY_HOP.contains(&lower) || lower == "x-entry-token" {
            continue;
        }
        // Like `X-Entry-Token`, the token cookie is the gate's business, not the upstream's.
        if lower == "cookie" {
            if let Some(kept) = value.to_str().ok().and_then(cookies::without_token_cookies) {
                request = request.header(name, kept);
            }
            continue;
        }
        request = request.header(name, value);
    }
    let fail = |error: reqwest::Error| {
        if error.is_timeout() {
            (
                StatusCode::GATEWAY_TIMEOUT,
                "the order service did not answer in time; your entry token was released".to_string(),
            )
        } else {
            (
                StatusCode::BAD_GATEWAY,
                "the order service could not be reached; your entry token was released".to_string(),
            )
        }
    };
    // The status line is the upstream's verdict: a 2xx means the order committed, whatever happens to the
    // body afterwards, so the token is consumed on it (by the caller) and the body streams back as it
    // comes. A body cut after a 2xx still consumed the token: the upstream said it took the order. Its
    // `Content-Length` is kept so that a cut body shows the client a truncated answer, not a short one.
    let upstream: axum::http::Response<reqwest::Body> = request.send().await.map_err(fail)?.into();
    let (upstream, upstream_body) = upstream.into_parts();
    let mut response = Response::new(Body::new(upstream_body));
    *response.status_mut() = upstream.status;
    response.extensions_mut().insert(PassThrough);
    for (name, value) in &upstream.headers {
        if HOP_BY_HOP.contains(&name.as_str()) && name != "content-length" {
            continue;
        }
        if let Ok(name) = HeaderName::from_bytes(name.as_str().as_bytes()) {
            response.headers_mut().append(name, value.clone());
        }
    }
    Ok(response)
}
