//! Member endpoints (SPEC 2.2) and the token service (SPEC 2.4): thin handlers over [`WaitingRoom`].
//!
//! Bodies are read as bytes and parsed here, not with axum's `Json` extractor, because that answers 422
//! for a wrong field type and the spec wants 400 naming the field. Every call for a member checks the
//! member's credential first (`WaitingRoom::authorize`, see `identity`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::on;
use axum::{Json, Router};
use serde_json::Value;

use super::entry_guard::EntryEvidence;
use super::identity::Credential;
use super::service::WaitingRoom;
use crate::http::direct_reply::DirectReply;
use crate::http::error::{ApiError, ApiResult};
use crate::http::peer::PeerAddress;
use crate::http::route_table::{self, Endpoint};

/// A member's entry route, which the fast path answers too (and records by this template).
pub const ENTER_ROUTE: &str = "/v1/queues/{queue}/entries";
/// A member's position poll route, which the fast path answers too (and records by this template).
pub const POLL_ROUTE: &str = "/v1/queues/{queue}/entries/{member}";

pub(crate) const ENDPOINTS: &[Endpoint<Arc<WaitingRoom>>] = &[
    Endpoint::new(Method::POST, ENTER_ROUTE, |m| on(m, enter)),
    Endpoint::new(Method::GET, POLL_ROUTE, |m| on(m, poll)),
    Endpoint::new(Method::GET, "/v1/queues/{queue}/entries/{member}/events", |m| {
        on(m, events)
    }),
    Endpoint::new(Method::DELETE, "/v1/queues/{queue}/entries/{member}", |m| {
        on(m, leave)
    }),
    Endpoint::new(Method::POST, "/v1/queues/{queue}/tokens/claim", |m| on(m, claim)),
    Endpoint::new(Method::POST, "/v1/queues/{queue}/tokens/consume", |m| {
        on(m, consume)
    }),
    Endpoint::new(Method::POST, "/v1/queues/{queue}/tokens/release", |m| {
        on(m, release)
    }),
    Endpoint::new(Method::GET, "/v1/queues/{queue}/draw", |m| on(m, draw)),
    Endpoint::new(Method::GET, "/v1/queues/{queue}/challenge", |m| on(m, challenge)),
];

/// `GET /v1/queues/{queue}/challenge`: what a new member's entry must show (SPEC 2.2, "Entry
/// challenges"): a proof-of-work challenge bound to the caller's address, the CAPTCHA's site key, or
/// `{"kind": "none"}`. Never cached: each challenge is spent once.
async fn challenge(
    State(room): State<Arc<WaitingRoom>>,
    Path(queue): Path<String>,
    peer: PeerAddress,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let client = crate::http::peer::client_address(
        peer.0,
        &crate::http::fast_path::DirectHeaders::Map(&headers),
        &room.config.client_proxies,
    );
    let body = room.challenge_for(&queue, client).await?;
    let mut response = Json(body).into_response();
    response.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    Ok(response)
}

/// `GET /v1/queues/{queue}/draw?offset&limit`: a scheduled opening's commitment, and after the draw its
/// seed and the drawn order as draw keys (no member ids; see `opening`).
async fn draw(
    State(room): State<Arc<WaitingRoom>>,
    Path(queue): Path<String>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> ApiResult<Json<super::opening::DrawPage>> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let (offset, limit) = super::opening::parse_draw_page_query(query.as_deref())?;
    Ok(Json(
        room.draw_page(&queue, offset, limit, super::opening::DrawReader::Public)
            .await?,
    ))
}

pub(crate) fn routes(room: Arc<WaitingRoom>) -> Router {
    route_table::router_of(ENDPOINTS).with_state(room)
}

/// Parses a JSON object body. A key given twice is refused, naming it: which of two `memberId`s or two
/// `admitPerSecond`s was meant cannot be guessed, and serde_json would silently keep the last.
pub(crate) fn json_object(body: &Bytes) -> ApiResult<serde_json::Map<String, Value>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => {
            if let Some(key) = duplicate_top_level_key(body) {
                return Err(ApiError::bad_field(
                    &key,
                    "given twice in the body; give each field once",
                ));
            }
            Ok(map)
        }
        Ok(_) => Err(ApiError::BadRequest("body: must be a JSON object".into())),
        Err(e) => Err(ApiError::BadRequest(format!("body: invalid JSON ({e})"))),
    }
}

/// The first key that appears twice at the top level of a JSON object (the body is known to be valid
/// JSON). Reads the keys only; values are skipped with `IgnoredAny`.
fn duplicate_top_level_key(body: &[u8]) -> Option<String> {
    struct Keys(Option<String>);
    impl<'de> serde::de::Visitor<'de> for &mut Keys {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                map.next_value::<serde::de::IgnoredAny>()?;
                if !seen.insert(key.to_string()) && self.0.is_none() {
                    self.0 = Some(key.into_owned());
                }
            }
            Ok(())
        }
    }
    let mut keys = Keys(None);
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    serde::Deserializer::deserialize_map(&mut deserializer, &mut keys).ok()?;
    keys.0
}

/// A required string field; `missing` builds the error when it is absent (400 or 401 by endpoint).
fn string_field<'a>(
    map: &'a serde_json::Map<String, Value>,
    field: &str,
    missing: impl FnOnce() -> ApiError,
) -> ApiResult<&'a str> {
    match map.get(field) {
        None | Some(Value::Null) => Err(missing()),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(ApiError::bad_field(field, "must be a string")),
    }
}

fn member_field(map: &serde_json::Map<String, Value>) -> ApiResult<rankgate_core::ids::MemberId> {
    let raw = string_field(map, "memberId", || ApiError::bad_field("memberId", "is required"))?;
    WaitingRoom::parse_member("memberId", raw)
}

/// An entry's `memberId`: `None` when the body names none (`{}`), and rankgate picks one.
fn optional_member_field(
    map: &serde_json::Map<String, Value>,
) -> ApiResult<Option<rankgate_core::ids::MemberId>> {
    match map.get("memberId") {
        None | Some(Value::Null) => Ok(None),
        Some(_) => member_field(map).map(Some),
    }
}

async fn enter(
    State(room): State<Arc<WaitingRoom>>,
    Path(queue): Path<String>,
    peer: PeerAddress,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    enter_reply(&room, &queue, &body, &Credential::of_request(&headers, peer))
        .await
        .into_response()
}

/// `POST /v1/queues/{queue}/entries` answered, for the route and for the fast lane (see
/// [`DirectReply`]): `queue` as the router's `Path` extractor gives it, `body` the whole request body,
/// `credential` what the request showed (see `WaitingRoom::enter_member`).
pub async fn enter_reply(
    room: &WaitingRoom,
    queue: &str,
    body: &Bytes,
    credential: &Credential<'_>,
) -> DirectReply {
    let entered = async {
        let queue = WaitingRoom::parse_queue(queue)?;
        let mut evidence = EntryEvidence::of_headers(credential.headers());
        let object;
        let member = match plain_member(body) {
            Some(raw) => Some(WaitingRoom::parse_member("memberId", raw)?),
            None => {
                object = json_object(body)?;
                evidence_fields(&object, &mut evidence)?;
                optional_member_field(&object)?
            }
        };
        room.enter_member(&queue, member, credential, &evidence).await
    };
    match entered.await {
        Ok(position) => DirectReply::json(position.to_json(), []),
        Err(error) => DirectReply::error(error).await,
    }
}

/// The entry guards' fields of an entry body: `challenge` with `nonce` (what `X-Queue-Challenge` says,
/// which they replace), and `captchaToken`.
fn evidence_fields<'a>(
    map: &'a serde_json::Map<String, Value>,
    evidence: &mut EntryEvidence<'a>,
) -> ApiResult<()> {
    let text = |field: &str| -> ApiResult<Option<&'a str>> {
        match map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(ApiError::bad_field(field, "must be a string")),
        }
    };
    match (text("challenge")?, text("nonce")?) {
        (Some(challenge), Some(nonce)) => evidence.solution = Some((challenge, nonce)),
        (None, None) => {}
        (Some(_), None) => {
            return Err(ApiError::bad_field(
                "nonce",
                "missing; a challenge comes with its nonce",
            ))
        }
        (None, Some(_)) => {
            return Err(ApiError::bad_field(
                "challenge",
                "missing; a nonce comes with its challenge",
            ))
        }
    }
    evidence.captcha_token = text("captchaToken")?;
    Ok(())
}

/// The member id of an entry body written plainly, `{"memberId":"…"}` with nothing else and a string
/// holding no escape, quote or control character: what [`member_field`] of [`json_object`] would read,
/// without building a `serde_json::Value` (a surge's every entry is written so). `None` for any other
/// body, valid or not, which takes the full path and its errors.
fn plain_member(body: &[u8]) -> Option<&str> {
    let raw = body.strip_prefix(br#"{"memberId":""#)?.strip_suffix(br#""}"#)?;
    if raw
        .iter()
        .any(|&byte| byte == b'"' || byte == b'\\' || byte < 0x20)
    {
        return None;
    }
    std::str::from_utf8(raw).ok()
}

/// The queue of an entry the fast lane may answer without the router: `/v1/queues/{queue}/entries`
/// whose segment holds no escape, as the router's `Path` extractor would give it. `None` for every
/// other path.
pub fn direct_enter_queue(path: &str) -> Option<&str> {
    let queue = path.strip_prefix("/v1/queues/")?.strip_suffix("/entries")?;
    crate::http::direct_reply::plain_segment(queue).then_some(queue)
}

async fn poll(
    State(room): State<Arc<WaitingRoom>>,
    Path((queue, member)): Path<(String, String)>,
    peer: PeerAddress,
    headers: HeaderMap,
) -> Response {
    poll_reply(&room, &queue, &member, &Credential::of_request(&headers, peer))
        .await
        .into_response()
}

/// `GET /v1/queues/{queue}/entries/{member}` answered, for the route and for the fast lane (see
/// [`DirectReply`]): `queue` and `member` as the router's `Path` extractor gives them; only to the
/// member's own `credential`.
pub async fn poll_reply(
    room: &WaitingRoom,
    queue: &str,
    member: &str,
    credential: &Credential<'_>,
) -> DirectReply {
    let polled = async {
        let queue = WaitingRoom::parse_queue(queue)?;
        let member = WaitingRoom::parse_member("memberId", member)?;
        room.authorize(&queue, &member, credential)?;
        room.poll(&queue, &member).await
    };
    match polled.await {
        Ok((position, limit)) => {
            // From the `String`s themselves: no copy of their bytes.
            let headers = HeaderValue::try_from(limit.policy)
                .ok()
                .zip(HeaderValue::try_from(limit.limit).ok())
                .map(|(policy, limit)| {
                    [
                        // Built at compile time: `from_static` at run time checks every byte,
                        // ~230 instructions of every poll.
                        (const { HeaderName::from_static("ratelimit-policy") }, policy),
                        (const { HeaderName::from_static("ratelimit") }, limit),
                    ]
                });
            DirectReply::json(position.to_json(), headers.into_iter().flatten())
        }
        Err(error) => DirectReply::error(error).await,
    }
}

/// The queue and member of a position poll the fast lane may answer without the router:
/// `/v1/queues/{queue}/entries/{member}` whose segments hold no escape (axum would percent-decode them;
/// those go through the router), as the router's `Path` extractor would give them. `None` for every
/// other path.
pub fn direct_poll_target(path: &str) -> Option<(&str, &str)> {
    // Byte scans rather than `split_once("/entries/")` and `contains([…])`: the substring search and the
    // char patterns were ~960 instructions of every poll. The queue ends at the first `/`, which must
    // begin `/entries/`, exactly where `split_once` would have split a queue without `/`.
    let rest = path.strip_prefix("/v1/queues/")?;
    let queue_end = rest.bytes().position(|byte| byte == b'/')?;
    let (queue, after) = rest.split_at(queue_end);
    let member = after.strip_prefix("/entries/")?;
    (crate::http::direct_reply::plain_segment(queue) && crate::http::direct_reply::plain_segment(member))
        .then_some((queue, member))
}

/// `GET …/entries/{member}/events`: the position as Server-Sent Events (see `member_streams`).
async fn events(
    State(room): State<Arc<WaitingRoom>>,
    Path((queue, member)): Path<(String, String)>,
    peer: PeerAddress,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let member = WaitingRoom::parse_member("memberId", &member)?;
    room.authorize(&queue, &member, &Credential::of_request(&headers, peer))?;
    let stream = room.open_member_stream(queue, member).await?;
    Ok(axum::response::Sse::new(stream).into_response())
}

async fn leave(
    State(room): State<Arc<WaitingRoom>>,
    Path((queue, member)): Path<(String, String)>,
    peer: PeerAddress,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let member = WaitingRoom::parse_member("memberId", &member)?;
    room.authorize(&queue, &member, &Credential::of_request(&headers, peer))?;
    room.leave(&queue, &member).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn claim(
    State(room): State<Arc<WaitingRoom>>,
    Path(queue): Path<String>,
    peer: PeerAddress,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let map = json_object(&body)?;
    let member = member_field(&map)?;
    room.authorize(&queue, &member, &Credential::of_request(&headers, peer))?;
    let token = string_field(&map, "token", || {
        ApiError::Unauthorized("token: missing entry token".into())
    })?;
    let granted = room.claim(&queue, &member, token).await?;
    Ok(Json(granted).into_response())
}

fn claim_id_field(map: &serde_json::Map<String, Value>) -> ApiResult<&str> {
    let claim_id = string_field(map, "claimId", || ApiError::bad_field("claimId", "is required"))?;
    if claim_id.is_empty() || claim_id.len() > 128 {
        return Err(ApiError::bad_field("claimId", "must be 1 to 128 bytes"));
    }
    Ok(claim_id)
}

async fn consume(
    State(room): State<Arc<WaitingRoom>>,
    Path(queue): Path<String>,
    peer: PeerAddress,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let map = json_object(&body)?;
    let member = member_field(&map)?;
    let claim_id = claim_id_field(&map)?;
    room.authorize(&queue, &member, &Credential::of_request(&headers, peer))?;
    room.consume(&queue, &member, claim_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn release(
    State(room): State<Arc<WaitingRoom>>,
    Path(queue): Path<String>,
    peer: PeerAddress,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let queue = WaitingRoom::parse_queue(&queue)?;
    let map = json_object(&body)?;
    let member = member_field(&map)?;
    let claim_id = claim_id_field(&map)?;
    room.authorize(&queue, &member, &Credential::of_request(&headers, peer))?;
    room.release(&queue, &member, claim_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `direct_poll_target` as it was written first (substring search, char patterns): the byte scans
    /// must take exactly the paths it took.
    fn poll_target_by_split(path: &str) -> Option<(&str, &str)> {
        let (queue, member) = path.strip_prefix("/v1/queues/")?.split_once("/entries/")?;
        let plain = |segment: &str| !segment.is_empty() && !segment.contains(['/', '%']);
        (plain(queue) && plain(member)).then_some((queue, member))
    }

    proptest! {
        #[test]
        fn the_poll_target_scan_takes_what_the_split_took(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("/v1/queues/".to_owned()),
                    Just("/entries/".to_owned()),
                    Just("/entries".to_owned()),
                    Just("/".to_owned()),
                    Just("%2F".to_owned()),
                    Just("é".to_owned()),
                    Just("\u{1}\t\u{7f}".to_owned()),
                    Just("x".repeat(300)),
                    "[a-z0-9._-]{0,6}",
                ],
                0..7,
            ),
            prefixed in any::<bool>(),
        ) {
            let path = if prefixed { format!("/v1/queues/{}", parts.concat()) } else { parts.concat() };
            prop_assert_eq!(direct_poll_target(&path), poll_target_by_split(&path), "{}", path);
        }
    }

    #[test]
    fn a_poll_target_is_a_plain_queue_and_member() {
        assert_eq!(
            direct_poll_target("/v1/queues/sale/entries/m-1"),
            Some(("sale", "m-1"))
        );
        assert_eq!(direct_poll_target("/v1/queues/sale/entries/"), None);
        assert_eq!(direct_poll_target("/v1/queues//entries/m-1"), None);
        assert_eq!(direct_poll_target("/v1/queues/sale/entries/m-1/events"), None);
        assert_eq!(direct_poll_target("/v1/queues/s%61le/entries/m-1"), None);
        assert_eq!(direct_poll_target("/v1/queues/sale/entries/m%2D1"), None);
        assert_eq!(direct_poll_target("/v1/queues/a/b/entries/m-1"), None);
    }

    /// The plain reading of an entry body takes only bodies the full path reads, and reads the same id.
    #[test]
    fn a_plain_entry_body_reads_as_the_full_path_does() {
        let full = |body: &[u8]| {
            json_object(&Bytes::copy_from_slice(body))
                .and_then(|map| member_field(&map))
                .map(|member| member.as_str().to_owned())
                .map_err(|error| error.to_string())
        };
        let plain = |body: &[u8]| {
            plain_member(body).map(|raw| {
                WaitingRoom::parse_member("memberId", raw)
                    .map(|member| member.as_str().to_owned())
                    .map_err(|error| error.to_string())
            })
        };
        for body in [
            &br#"{"memberId":"m-1"}"#[..],
            br#"{"memberId":"caf\u00e9"}"#,
            "{\"memberId\":\"café\"}".as_bytes(),
            br#"{"memberId":""}"#,
            br#"{"memberId":"a\"b"}"#,
            br#"{"memberId":"a\\b"}"#,
            b"{\"memberId\":\"a\x01b\"}",
            b"{\"memberId\":\"a\x7fb\"}",
            br#"{"memberId":"m","memberId":"n"}"#,
            br#"{"memberId":"m","x":1}"#,
            br#"{ "memberId":"m"}"#,
            br#"{"memberId":"m"} "#,
            br#"{"memberId":"m"}}"#,
            br#"{"memberId":7}"#,
            br#"{"memberId":"m"#,
            br#"{"memberId":"""#,
            b"{\"memberId\":\"\xff\"}",
            &[b'x'; 300][..],
        ] {
            let plain = plain(body);
            if let Some(plain) = &plain {
                assert_eq!(plain, &full(body), "{:?}", String::from_utf8_lossy(body));
            }
            let plain_taken = plain.is_some();
            let expected = [
                &br#"{"memberId":"m-1"}"#[..],
                "{\"memberId\":\"café\"}".as_bytes(),
                br#"{"memberId":""}"#,
                b"{\"memberId\":\"a\x7fb\"}",
            ]
            .contains(&body);
            assert_eq!(plain_taken, expected, "{:?}", String::from_utf8_lossy(body));
        }
    }
}
