//! Bearer keys for admin and ingest endpoints.
//!
//! When no ingest key is configured, ingest is open (the embedded quick start needs no setup). When no
//! admin key is configured, admin endpoints answer loopback peers only (issue 29): a server reachable
//! from the internet is not administered by whoever finds its port, and the start says so
//! ([`ADMIN_LOOPBACK_ONLY`]). The peer is the TCP peer the edge recorded as [`ConnectInfo`]: a reverse
//! proxy on the same host is a loopback peer, so a deployment behind one sets admin keys.
//! Keys are stored as SHA-256 hashes and compared in constant time ([`BearerKeys`]); a presented key is
//! never logged. The guards take their keys as their own state ([`AccessKeys`]), so a product's routes
//! are guarded without the guard knowing the product.

use std::sync::Arc;

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::http::error::ApiError;

/// Hashed bearer keys, compared in constant time.
#[derive(Clone, Default)]
pub struct BearerKeys(Vec<[u8; 32]>);

impl BearerKeys {
    /// Hashes each key; the plain keys are dropped.
    pub fn from_plain<S: AsRef<str>>(keys: &[S]) -> BearerKeys {
        BearerKeys(
            keys.iter()
                .map(|k| k.as_ref().trim())
                .filter(|k| !k.is_empty())
                .map(|k| Sha256::digest(k).into())
                .collect(),
        )
    }

    /// Number of keys configured.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when no key is configured (the endpoints are open).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `presented` is one of the keys. Compares every stored hash in constant time.
    pub fn accepts(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        self.0
            .iter()
            .fold(subtle::Choice::from(0), |found, key| found | key.ct_eq(&digest))
            .into()
    }
}

/// The keys of both guarded scopes, the state of [`require_admin`] and [`require_ingest`].
#[derive(Clone, Default)]
pub struct AccessKeys {
    /// Admin keys; empty means admin endpoints answer loopback peers only.
    pub admin: BearerKeys,
    /// Ingest keys; empty means ingest is open (when admin keys are empty too). Admin keys ingest too.
    pub ingest: BearerKeys,
}

/// The key of an `Authorization: Bearer <key>` header, if the request carries one.
pub fn presented_key(headers: &HeaderMap) -> Option<&str> {
    bearer_credential(headers.get(header::AUTHORIZATION)?.as_bytes())
}

/// The credential of an `Authorization` header value of the `Bearer` scheme (any case), trimmed; `None`
/// for another scheme or a value that is not UTF-8. Shared by the guards here and by the waiting room's
/// member identity, which reads headers from the fast path as well as from hyper.
#[must_use]
pub fn bearer_credential(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?;
    let (scheme, key) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

/// What the start logs, and a refused admin request is told, while no admin key is set.
pub const ADMIN_LOOPBACK_ONLY: &str = "no admin key is set, so admin endpoints answer loopback clients \
(127.0.0.1, ::1) only; to administer from elsewhere set admin_keys (config file), RANKGATE_ADMIN_KEYS \
or --admin-keys, and send `Authorization: Bearer <admin key>`";

/// Requires an admin key when admin keys are configured, and a loopback peer when none is.
pub async fn require_admin(
    State(keys): State<Arc<AccessKeys>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let admin = &keys.admin;
    if admin.is_empty() {
        let peer = request.extensions().get::<ConnectInfo<SocketAddr>>();
        return if peer.is_some_and(|ConnectInfo(peer)| is_loopback(peer)) {
            Ok(next.run(request).await)
        } else {
            Err(ApiError::Forbidden(ADMIN_LOOPBACK_ONLY.into()))
        };
    }
    if presented_key(request.headers()).is_some_and(|key| admin.accepts(key)) {
        return Ok(next.run(request).await);
    }
    Err(ApiError::Unauthorized(
        "admin endpoints need `Authorization: Bearer <admin key>`".into(),
    ))
}

/// A loopback peer: 127.0.0.0/8, ::1, or an IPv4-mapped loopback (a dual-stack listener's view of
/// 127.0.0.1).
fn is_loopback(peer: &SocketAddr) -> bool {
    match peer.ip() {
        std::net::IpAddr::V4(ip) => ip.is_loopback(),
        std::net::IpAddr::V6(ip) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|ip| ip.is_loopback())
        }
    }
}

/// Requires an ingest (or admin) key, when ingest keys are configured.
pub async fn require_ingest(
    State(keys): State<Arc<AccessKeys>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let (ingest, admin) = (&keys.ingest, &keys.admin);
    if ingest.is_empty() && admin.is_empty() {
        return Ok(next.run(request).await);
    }
    if presented_key(request.headers()).is_some_and(|key| ingest.accepts(key) || admin.accepts(key)) {
        return Ok(next.run(request).await);
    }
    Err(ApiError::Unauthorized(
        "ingest needs `Authorization: Bearer <ingest key>`".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_hashed_and_matched_exactly() {
        let keys = BearerKeys::from_plain(&["s3cret", " other "]);
        assert!(keys.accepts("s3cret"));
        assert!(keys.accepts("other"));
        assert!(!keys.accepts("s3cre"));
        assert!(!keys.accepts(""));
    }

    #[test]
    fn loopback_peers_are_the_local_ones_only() {
        for local in ["127.0.0.1:1", "127.8.9.10:1", "[::1]:1", "[::ffff:127.0.0.1]:1"] {
            assert!(is_loopback(&local.parse().unwrap()), "{local}");
        }
        for remote in [
            "192.0.2.2:1",
            "0.0.0.0:1",
            "[::]:1",
            "[::ffff:192.0.2.2]:1",
            "[2001:db8::1]:1",
        ] {
            assert!(!is_loopback(&remote.parse().unwrap()), "{remote}");
        }
    }

    #[test]
    fn only_a_bearer_scheme_presents_a_key() {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "Bearer  k-1 ".parse().unwrap());
        assert_eq!(presented_key(&headers), Some("k-1"));
        headers.insert(header::AUTHORIZATION, "bearer k-2".parse().unwrap());
        assert_eq!(presented_key(&headers), Some("k-2"));
        headers.insert(header::AUTHORIZATION, "Basic azE6azI=".parse().unwrap());
        assert_eq!(presented_key(&headers), None);
    }
}
