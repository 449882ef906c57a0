//! The waiting page's cookies: who the visitor is, and the entry token the gate reads when a browser
//! navigates (browsers cannot add `X-Entry-Token` to a navigation).
//!
//! - `rankgate_visitor` = `<memberId>.<signature>`: a member id rankgate issues to anonymous shoppers,
//!   `v-` + 16 random bytes (URL-safe base64), signed with HMAC-SHA-256 under a key derived from the token
//!   secret (so every instance sharing the store verifies every other's cookies, and the cookie key is not
//!   the token key itself). A cookie whose signature does not verify is ignored, never trusted: the page
//!   issues a new visitor id, the gate answers 401. 128 random bits make the id unguessable, which matters
//!   because the position endpoints are addressed by member id.
//! - `rankgate_token_<queue>` = the entry token, set by the page's server side when it renders the
//!   member READY, `Max-Age` the token's remaining lifetime. `:` (allowed in queue names, not in cookie
//!   names) is written `~` (not allowed in queue names), so the mapping is one-to-one.
//!
//! Both are `HttpOnly` (the page's script never needs them), `SameSite=Lax` (sent on the top-level
//! navigation to the shop, not on cross-site subrequests), `Path=/` (the gated routes are the shop's
//! paths), and `Secure` by [`CookieSecure`].

use axum::http::HeaderMap;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rand::RngCore as _;
use rankgate_core::ids::MemberId;
use rankgate_core::queue::QueueName;
use rankgate_store::queue::token::hmac_sha256;
use subtle::ConstantTimeEq as _;

use super::config::CookieSecure;

/// The visitor cookie's name.
pub const VISITOR_COOKIE: &str = "rankgate_visitor";
/// Prefix of the per-queue entry-token cookie.
pub const TOKEN_COOKIE_PREFIX: &str = "rankgate_token_";
/// Prefix of issued visitor ids, so support can tell them from a gateway's member ids.
const VISITOR_ID_PREFIX: &str = "v-";
/// What the cookie key is derived for (HMAC of the token secret with this label).
pub const VISITOR_KEY_LABEL: &[u8] = b"rankgate waiting page visitor cookie v1";
/// Cookies read from one request: a bound on the work a hostile `Cookie` header can cause.
const MAX_COOKIES_READ: usize = 64;

/// Signs and verifies visitor cookies.
#[derive(Clone)]
pub struct VisitorKey([u8; 32]);

impl std::fmt::Debug for VisitorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VisitorKey(hidden)")
    }
}

impl VisitorKey {
    /// The key derived from the token secret: instances sharing a store verify each other's cookies,
    /// and the token key itself never signs a cookie.
    #[must_use]
    pub fn derived_from(secret: &rankgate_store::queue::token::TokenSecret) -> VisitorKey {
        VisitorKey(rankgate_store::queue::token::hmac_sha256(
            &secret.to_bytes(),
            VISITOR_KEY_LABEL,
        ))
    }

    fn signature(&self, member: &str) -> String {
        URL_SAFE_NO_PAD.encode(hmac_sha256(&self.0, member.as_bytes()))
    }

    /// A fresh visitor id and its cookie value.
    #[must_use]
    pub fn issue(&self) -> (MemberId, String) {
        let id = new_visitor_id();
        let value = format!("{id}.{}", self.signature(id.as_str()));
        (id, value)
    }

    /// The member id of a cookie value, if its signature verifies (compared in constant time).
    #[must_use]
    pub fn verify(&self, value: &str) -> Option<MemberId> {
        let (id, signature) = value.rsplit_once('.')?;
        if !id.starts_with(VISITOR_ID_PREFIX) || id.len() > 64 {
            return None;
        }
        let expected = self.signature(id);
        if !bool::from(expected.as_bytes().ct_eq(signature.as_bytes())) {
            return None;
        }
        MemberId::parse(id).ok()
    }

    /// The visitor the request's `rankgate_visitor` cookie names, if one verifies.
    #[must_use]
    pub fn visitor_of(&self, headers: &HeaderMap) -> Option<MemberId> {
        cookie_values(headers, VISITOR_COOKIE)
            .into_iter()
            .find_map(|value| self.verify(value))
    }
}

/// A member id rankgate picks: `v-` and 128 random bits (a visitor of the page, or an entry that named no
/// member).
#[must_use]
pub fn new_visitor_id() -> MemberId {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    MemberId::parse(&format!("{VISITOR_ID_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes)))
        .expect("a visitor id is a valid member id")
}

/// The token cookie's name for `queue`.
#[must_use]
pub fn token_cookie_name(queue: &QueueName) -> String {
    format!("{TOKEN_COOKIE_PREFIX}{}", queue.as_str().replace(':', "~"))
}

/// Prefix of the per-queue ticket cookie (HttpOnly): the visitor's ticket, which brings it back to its
/// place should the store lose the queue (SPEC 2.2, "Places that survive the store").
pub const TICKET_COOKIE_PREFIX: &str = "rankgate_ticket_";

/// The name of `queue`'s ticket cookie (`:` as `~`, as for the token cookie).
#[must_use]
pub fn ticket_cookie_name(queue: &QueueName) -> String {
    format!("{TICKET_COOKIE_PREFIX}{}", queue.as_str().replace(':', "~"))
}

/// Values of the cookies called `name` in the request's `Cookie` headers (RFC 6265 §5.4 syntax; a
/// header that is not ASCII is skipped, at most [`MAX_COOKIES_READ`] pairs are looked at).
#[must_use]
pub fn cookie_values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    values_in(
        headers
            .get_all(axum::http::header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok()),
        name,
    )
}

/// [`cookie_values`] over `Cookie` header values however they were read (hyper's map, the fast path's
/// head).
#[must_use]
pub fn values_in<'a>(cookie_headers: impl Iterator<Item = &'a str>, name: &str) -> Vec<&'a str> {
    cookie_headers
        .flat_map(|header| header.split(';'))
        .take(MAX_COOKIES_READ)
        .filter_map(move |pair| {
            let (key, value) = pair.split_once('=')?;
            (key.trim() == name).then(|| value.trim().trim_matches('"'))
        })
        .filter(|value| !value.is_empty())
        .collect()
}

/// Whether this response's cookies get `Secure` (see [`CookieSecure`]).
#[must_use]
pub fn secure_for(mode: CookieSecure, uri: &axum::http::Uri, headers: &HeaderMap) -> bool {
    match mode {
        CookieSecure::Always => true,
        CookieSecure::Never => false,
        CookieSecure::Auto => {
            uri.scheme_str() == Some("https")
                || headers
                    .get("x-forwarded-proto")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.split(',').next())
                    .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
        }
    }
}

/// A `Set-Cookie` value with the page's attributes. `value` must be cookie-safe (ids and tokens are
/// URL-safe base64, `-`, `.` and `_`).
#[must_use]
pub fn set_cookie(name: &str, value: &str, max_age_seconds: u64, secure: bool) -> String {
    format!(
        "{name}={value}; Max-Age={max_age_seconds}; Path=/; HttpOnly; SameSite=Lax{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The `Cookie` header without the entry-token and ticket cookies, for forwarding to the upstream: like
/// `X-Entry-Token`, the token and the ticket are the gate's business. `None` when nothing is left.
#[must_use]
pub fn without_token_cookies(header: &str) -> Option<String> {
    let kept: Vec<&str> = header
        .split(';')
        .map(str::trim)
        .filter(|pair| {
            !pair.is_empty() && !pair.starts_with(TOKEN_COOKIE_PREFIX) && !pair.starts_with(TICKET_COOKIE_PREFIX)
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tampered_visitor_cookie_does_not_verify() {
        let key = VisitorKey([7; 32]);
        let (id, value) = key.issue();
        assert_eq!(key.verify(&value).as_ref(), Some(&id));
        let (raw_id, signature) = value.rsplit_once('.').unwrap();
        assert_eq!(key.verify(&format!("{raw_id}x.{signature}")), None, "changed id");
        // A changed last character (never the one it had: with 32 bytes it is one of 16 values, so a
        // fixed replacement matched one signature in 16 and the test failed as often).
        let (kept, last) = signature.split_at(signature.len() - 1);
        let other = if last == "A" { 'E' } else { 'A' };
        assert_eq!(
            key.verify(&format!("{raw_id}.{kept}{other}")),
            None,
            "changed signature"
        );
        assert_eq!(key.verify(raw_id), None, "no signature");
        assert_eq!(VisitorKey([8; 32]).verify(&value), None, "another key");
        assert_eq!(
            key.verify(&format!("m-1.{}", key.signature("m-1"))),
            None,
            "not a visitor id"
        );
    }

    #[test]
    fn cookies_are_read_by_exact_name_and_token_cookies_are_not_forwarded() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "cookie",
            "a=1; rankgate_visitorx=2; rankgate_visitor=\"3\"; rankgate_token_q=t"
                .parse()
                .unwrap(),
        );
        assert_eq!(cookie_values(&headers, VISITOR_COOKIE), ["3"]);
        assert_eq!(
            without_token_cookies("a=1; rankgate_token_q=t; b=2").as_deref(),
            Some("a=1; b=2")
        );
        assert_eq!(without_token_cookies("rankgate_token_q=t"), None);
        let queue = QueueName::parse("sale:2026.summer").unwrap();
        assert_eq!(token_cookie_name(&queue), "rankgate_token_sale~2026.summer");
    }
}
