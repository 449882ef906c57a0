//! Bearer-key checks for admin and ingest endpoints.
//!
//! When no key is configured for a scope, that scope is open (the embedded quick start needs no setup).
//! Keys are stored as SHA-256 hashes and compared in constant time ([`crate::config::BearerKeys`]); a
//! presented key is never logged.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;

use crate::app::AppState;
use crate::error::ApiError;

fn presented_key(request: &Request) -> Option<&str> {
    let value = request.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

/// Requires an admin key, when admin keys are configured.
pub async fn require_admin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let keys = &state.config.admin_keys;
    if keys.is_empty() || presented_key(&request).is_some_and(|key| keys.accepts(key)) {
        return Ok(next.run(request).await);
    }
    Err(ApiError::Unauthorized(
        "admin endpoints need `Authorization: Bearer <admin key>`".into(),
    ))
}

/// Requires an ingest (or admin) key, when ingest keys are configured.
pub async fn require_ingest(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let ingest = &state.config.ingest_keys;
    let admin = &state.config.admin_keys;
    if ingest.is_empty() && admin.is_empty() {
        return Ok(next.run(request).await);
    }
    if presented_key(&request).is_some_and(|key| ingest.accepts(key) || admin.accepts(key)) {
        return Ok(next.run(request).await);
    }
    Err(ApiError::Unauthorized(
        "ingest needs `Authorization: Bearer <ingest key>`".into(),
    ))
}
